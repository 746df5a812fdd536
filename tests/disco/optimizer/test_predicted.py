"""``disco.optimizer.predict``: the answer for a cluster whose devices are not here, by prediction alone,
and ``optimize`` refusing to measure such a cluster on this process's devices. Real jax steps and real
XLA:CPU compiles; the deviceless XLA:GPU run is in tests/xla_hooks/test_deviceless.py."""

from __future__ import annotations

import warnings

import pytest

import trax_models
from disco.optimizer import CompiledStageWarning, measures_here, optimize, predict
from disco.plans import baselines
from disco.sim.cluster import preset
from xla_hooks import deviceless

FEW = {"budget_s": 600.0, "max_evals": 300, "measure_top_k": 2, "bucket_sweep": (2,)}


@pytest.fixture(scope="module")
def mlp2():
    return trax_models.make_train_step("mlp", preset="tiny", devices=2)


def test_a_gpu_cluster_is_not_measured_on_cpu_devices(mlp2):
    step, args = mlp2
    assert measures_here(preset("local", devices=2)) and not measures_here(preset("h100-sxm-8"))
    with pytest.raises(ValueError, match=r"optimize measures plans on this process's cpu devices, but cluster "
                                         r"'h100-1' is of h100 devices.*disco.optimizer.predict"):
        optimize(step, *args, cluster=preset("h100-1"), budget_s=1.0)


def test_without_deviceless_xla_the_emulated_tier_ranks_and_says_why(monkeypatch, tmp_path):
    step, args = trax_models.make_train_step("mlp", preset="tiny", devices=8)
    monkeypatch.setenv(deviceless.GPU_PYTHON_ENV, str(tmp_path / "none"))
    with pytest.warns(deviceless.DevicelessFallbackWarning, match="no deviceless XLA:GPU environment"):
        r = predict(step, *args, cluster=preset("h100-sxm-8"), **FEW)
    assert r.tier == "emulated" and "make install-gpu" in r.tier_note
    assert all(row.compiled_s is None for row in r.rows)
    times = [row.emulated_s for row in r.rows]
    assert times == sorted(times) and r.chosen == r.rows[0].name and r.plan.name == r.chosen
    assert r.speedup == pytest.approx(r.row("xla_default").emulated_s / times[0])
    assert not any(row.plan.groups for row in r.rows)  # a GPU cluster's candidates hold no fusion groups
    d = r.to_dict()
    assert d["measured"] is False and d["chosen"] == r.chosen and len(d["rows"]) == len(r.rows)


def test_the_compiled_tier_prices_every_candidate_and_a_failed_compile_drops_out(mlp2):
    """On a CPU cluster the real compiler here is XLA:CPU: every candidate compiled and priced from its
    module; one whose compile fails keeps its emulated price, is ranked after every compiled one, and
    says why."""
    from xla_hooks.compile_for import plan_text_for

    step, args = mlp2
    from disco.ir import extractor

    text = extractor.hlo_text(step, *args)

    def compile_fn(plan):
        if plan.name == "per_tensor":
            raise RuntimeError("refused for the test")
        return plan_text_for(text, plan, device="cpu", devices=2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = predict(step, *args, cluster=preset("local", devices=2), compile_fn=compile_fn, **FEW)
    assert any(issubclass(w.category, CompiledStageWarning) and "per_tensor" in str(w.message) for w in caught)
    assert r.tier == "compiled" and r.tier_note is None
    failed = r.row("per_tensor")
    assert failed.compiled_s is None and failed.why == "RuntimeError: refused for the test"
    assert r.rows[-1].name == "per_tensor"  # unpriced by the tier: last
    priced = [row for row in r.rows if row.compiled_s is not None]
    assert len(priced) == len(r.rows) - 1 and [p.compiled_s for p in priced] == sorted(p.compiled_s for p in priced)
    assert all(p.compiled["kernels_from"] == "compiled" and p.compiled["backend"] == "cpu" for p in priced)
    assert r.chosen == priced[0].name
    # a plan's buckets reach the compiled module: horovod's one all-reduce against even_2's two
    assert (r.row("horovod").compiled["collectives"], r.row("even_2").compiled["collectives"]) == (1, 2)


def test_compiled_top_k_compiles_the_emulated_tiers_fastest_and_xla_default(mlp2):
    step, args = mlp2
    asked = []

    def compile_fn(plan):
        asked.append(plan.name)
        raise RuntimeError("not compiled")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompiledStageWarning)
        r = predict(step, *args, cluster=preset("local", devices=2), compile_fn=compile_fn, compiled_top_k=2, **FEW)
    fastest = sorted(r.rows, key=lambda row: row.emulated_s)[:2]
    assert set(asked) == {row.name for row in fastest} | {"xla_default"}
    assert r.tier == "emulated" and "the compiled tier priced no xla_default" in r.tier_note


def test_a_step_for_another_device_count_than_the_clusters_is_refused(mlp2):
    step, args = mlp2
    with pytest.raises(ValueError, match=r"the step runs on 2 devices and cluster 'h100-sxm-8' has 8; build the step "
                                         r"for 8 devices"):
        predict(step, *args, cluster=preset("h100-sxm-8"), **FEW)


@pytest.fixture(scope="module")
def fsdp8_emulated():
    """mlp tiny in fsdp style on 8 devices, predicted for h100-sxm-8 without the deviceless environment
    (the emulated tier ranks; each row's peak is XLA:CPU's, compiled here), and its step."""
    step, args = trax_models.make_train_step("mlp", preset="tiny", devices=8, style="fsdp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(deviceless.GPU_PYTHON_ENV, "/nonexistent/python")
        with pytest.warns(deviceless.DevicelessFallbackWarning, match="no deviceless XLA:GPU environment"):
            r = predict(step, *args, cluster=preset("h100-sxm-8"), **FEW)
    return step, args, r


def test_a_gpu_clusters_prediction_has_the_maxtext_row_and_a_peak_per_row(fsdp8_emulated):
    _, _, r = fsdp8_emulated
    assert r.tier == "emulated"
    maxtext = r.row("maxtext")
    assert maxtext.kind == "baseline" and dict(maxtext.plan.compile_options) == {
        "xla_gpu_all_gather_combine_threshold_bytes": str(512 << 20),
        "xla_gpu_all_reduce_combine_threshold_bytes": str(512 << 20),
        "xla_gpu_reduce_scatter_combine_threshold_bytes": str(512 << 20),
        **baselines.MAXTEXT_LOOP_PASSES}
    assert not any(row.name.endswith("+loop_passes") for row in r.rows)  # only the compiled tier prices them
    # saturating's buckets (about 122 MiB on h100-sxm-8) hold a tiny model's gradients in one: an earlier row's plan
    assert "saturating" not in {row.name for row in r.rows} or r.row("saturating").plan.buckets
    assert all(row.peak_memory_bytes and row.memory_from == "xla-cpu" for row in r.rows)
    assert r.memory_limit == preset("h100-sxm-8").device_memory_bytes and not any(row.over_memory for row in r.rows)
    d = r.to_dict()
    assert d["memory_limit_bytes"] == r.memory_limit and d["over_memory"] == []
    row = next(x for x in d["rows"] if x["name"] == "maxtext")
    assert (row["peak_memory_bytes"], row["peak_memory_from"], row["over_memory"]) == (
        maxtext.peak_memory_bytes, "xla-cpu", None)


def test_a_row_over_the_memory_limit_is_never_the_answer(fsdp8_emulated):
    """The limit set between two rows' peaks: the answer without it is over, so another row answers,
    and the row left out says why with both numbers."""
    step, args, free = fsdp8_emulated
    first = free.row(free.chosen)
    below = [row for row in free.rows if row.peak_memory_bytes < first.peak_memory_bytes and row.name != "xla_default"]
    assert first.name != "xla_default" and below, "expected the unlimited answer above another plan's peak"
    limit = first.peak_memory_bytes - 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(deviceless.GPU_PYTHON_ENV, "/nonexistent/python")
        with pytest.warns(deviceless.DevicelessFallbackWarning):
            r = predict(step, *args, cluster=preset("h100-sxm-8"), memory_limit=limit, **FEW)
    assert r.memory_limit == limit and r.chosen != first.name
    over = r.row(first.name)
    assert over.over_memory == (f"peak device memory {first.peak_memory_bytes:,} bytes (predicted: XLA:CPU's memory "
                                f"analysis of the plan compiled here, an estimate of the cluster's) over the limit of "
                                f"{limit:,} bytes")
    answer = r.row(r.chosen)
    assert answer.name == "xla_default" or answer.peak_memory_bytes <= limit
    eligible = [row for row in r.rows if row.over_memory is None]
    assert answer == eligible[0]  # the fastest within the limit
    assert r.row("xla_default").over_memory is None  # the step as written is never left out
    assert first.name in r.to_dict()["over_memory"]

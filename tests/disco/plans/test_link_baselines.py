"""The MaxText recipe and the link-saturating buckets as baselines (issue 60's baselines)."""

from __future__ import annotations

import warnings

import pytest

import disco
import trax_models
import xla_hooks
from disco.plans import baselines
from disco.plans import options as plan_options
from disco.sim.cluster import ClusterSpec, LinkSpec, preset
from tests.disco.plans.test_baselines import graph

MIB = 1 << 20


def cluster(bandwidth, latency=20e-6, devices=8):
    link = LinkSpec(bandwidth, latency)
    return ClusterSpec("c", 1, devices, link, link)


@pytest.fixture(scope="module")
def fsdp():
    """mlp tiny in fsdp style over 8 devices (sgd): its step, arguments and graph."""
    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, style="fsdp", optimizer="sgd")
    return step, args, disco.extract(step, *args)


def test_the_baselines_validate_on_an_fsdp_zoo_graph(fsdp):
    _, _, g = fsdp
    sat = baselines.make("saturating", g, cluster=preset("local"))
    assert sat.validate(g, "cpu") is sat and sat.buckets
    assert {m for b in sat.buckets for m in b.members} == {n.name for n in g.all_reduces()}  # every gradient
    maxtext = baselines.make("maxtext", g)
    assert maxtext.validate(g, "gpu") is maxtext and maxtext.buckets is None and maxtext.gather_buckets is None
    with pytest.raises(ValueError, match=r"all_gather_combine_threshold_bytes='536870912' on cpu: XLA:CPU has no "
                                         r"all-gather or reduce-scatter combiner"):
        maxtext.validate(g, "cpu")


def test_maxtext_is_the_three_thresholds_at_512_mib_and_its_loop_passes_and_reaches_the_gpu_compile():
    plan = baselines.make("maxtext", graph([40, 40]))
    opts = plan.compiler_options("gpu")
    keys = (plan_options.THRESHOLD, plan_options.GATHER_THRESHOLD, plan_options.SCATTER_THRESHOLD)
    assert {k: int(opts[k]) for k in keys} == dict.fromkeys(keys, 512 * MIB)
    for key in keys:
        assert plan_options.spec(key, "gpu") is not None  # in the GPU table: a search may step them
    # the pipeliner on for each collective, as jax 0.11.2 takes it (the enum), and double-buffered loops
    assert {k: opts[k] for k in plan_options.LOOP_PASSES} == {
        "xla_gpu_pipeline_all_reduce": "COLLECTIVE_PIPELINING_MODE_ON",
        "xla_gpu_pipeline_all_gather": "COLLECTIVE_PIPELINING_MODE_ON",
        "xla_gpu_pipeline_reduce_scatter": "COLLECTIVE_PIPELINING_MODE_ON",
        "xla_gpu_enable_while_loop_double_buffering": "True"}
    assert not any(k.startswith("xla_gpu_enable_pipelined") for k in opts)  # the booleans 0.11.2 rejects
    assert set(plan_options.compiled_only(plan.compile_options)) == set(plan_options.LOOP_PASSES)


@pytest.mark.fast
def test_loop_passes_are_gpu_options_with_their_values_checked():
    on = plan_options.PIPELINE_ON
    plan_options.check(((plan_options.PIPELINE_ALL_GATHER, on), (plan_options.DOUBLE_BUFFERING, "False")), "gpu")
    with pytest.raises(ValueError, match=r"^compile option xla_gpu_pipeline_all_gather='COLLECTIVE_PIPELINING_MODE_ON' "
                                         r"on cpu: XLA:GPU's collective pipeliner and double-buffered loops .* XLA:CPU "
                                         r"runs neither pass; expected a GPU backend"):
        plan_options.check(((plan_options.PIPELINE_ALL_GATHER, on),), "cpu")
    with pytest.raises(ValueError, match=r"xla_gpu_pipeline_reduce_scatter: expected one of "
                                         r"COLLECTIVE_PIPELINING_MODE_DEFAULT, .*, got 'on' \(XLA_FLAGS' 'on' is "
                                         r"written COLLECTIVE_PIPELINING_MODE_ON per compile\)"):
        plan_options.check(((plan_options.PIPELINE_REDUCE_SCATTER, "on"),), "gpu")
    with pytest.raises(ValueError, match=r"COLLECTIVE_PIPELINING_MODE_ON, got 'sometimes'$"):
        plan_options.check(((plan_options.PIPELINE_ALL_REDUCE, "sometimes"),), "gpu")
    with pytest.raises(ValueError, match=r"xla_gpu_enable_while_loop_double_buffering: expected True or False, got '2'"):
        plan_options.check(((plan_options.DOUBLE_BUFFERING, "2"),), "gpu")
    assert all(plan_options.spec(k, "gpu") is None for k in plan_options.LOOP_PASSES)  # no search step: the emulated
    # tier, where the search runs, does not model them


def test_maxtext_is_refused_on_cpu_with_the_reason():
    with pytest.raises(ValueError, match=r"^baseline 'maxtext' on cpu: XLA:CPU has no all-gather or reduce-scatter "
                                         r"combiner"):
        baselines.make("maxtext", graph([40]), backend="cpu")
    plan_options.check(((plan_options.THRESHOLD, str(512 * MIB)),), "cpu")  # the all-reduce one stays inert there


def test_maxtext_applied_on_cpu_falls_back_saying_why(fsdp):
    step, args, g = fsdp
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = xla_hooks.apply(baselines.make("maxtext", g), step, *args)
    assert not applied.applied and "XLA:CPU has no all-gather" in applied.fallback_reason
    assert any(issubclass(w.category, xla_hooks.PlanFallbackWarning) for w in caught)


@pytest.mark.fast
def test_saturating_on_a_faster_link_makes_bigger_buckets():
    g = graph([40 * MIB] * 8)
    slow = baselines.make("saturating", g, cluster=cluster(5e9), min_mb=1)
    fast = baselines.make("saturating", g, cluster=cluster(50e9), min_mb=1)
    size = {n.name: n.grad_bytes for n in g.all_reduces()}

    def largest(plan):
        return max(sum(size[m] for m in b.members) for b in plan.buckets)

    assert len(fast.buckets) < len(slow.buckets) and largest(fast) > largest(slow)
    # the rule: e / (1 - e) * 2 (p - 1) * latency * bandwidth, e = 0.95, 8 devices
    assert baselines.saturating_bytes(cluster(5e9), min_mb=1) == pytest.approx(19 * 14 * 20e-6 * 5e9, abs=1)


@pytest.mark.fast
def test_saturating_is_clipped_to_50_mib_2000_mib_and_needs_a_cluster():
    assert baselines.saturating_bytes(cluster(5e9)) == 50 * MIB  # 26.6 MB by the rule
    assert baselines.saturating_bytes(cluster(1e15)) == 2000 * MIB
    fast_net = preset("h100-2x8-ib")  # two nodes: the link between them sizes it
    assert baselines.saturating_bytes(fast_net) == pytest.approx(19 * 30 * fast_net.inter.latency * fast_net.inter.bandwidth, abs=1)
    with pytest.raises(ValueError, match=r"baseline 'saturating': expected cluster=<a ClusterSpec>"):
        baselines.make("saturating", graph([40]))
    with pytest.raises(ValueError, match=r"expected 0 < min_mb <= max_mb"):
        baselines.make("saturating", graph([40]), cluster=cluster(5e9), min_mb=10, max_mb=5)

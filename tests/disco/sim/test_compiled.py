"""The compiled tier (disco.sim.compiled, xla_hooks.compile_for, disco simulate --hlo) in the main
environment: a hand-written scheduled module's schedule, a real XLA:CPU compile priced, the CLI's
errors and its fallback for a GPU cluster without the deviceless environment."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from typing import Any

import pytest

from disco.cli import main as disco_main
from disco.sim import collectives
from disco.sim import compiled as C
from disco.sim.cluster_spec import ClusterSpec, LinkSpec
from disco.sim.costs import CostModel, Kernel

SCHEDULED = """HloModule t, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_exp (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  ROOT %e = f32[1024]{0} exponential(%p)
}

%cond (c: (s32[], f32[1024])) -> pred[] {
  %c = (s32[], f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %q = (s32[], f32[1024]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%j, %one)
  %v = f32[1024]{0} get-tuple-element(%q), index=1
  %fb = f32[1024]{0} fusion(%v), kind=kLoop, calls=%fused_exp
  ROOT %tb = (s32[], f32[1024]{0}) tuple(%next, %fb)
}

ENTRY %main (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0)
  %f1 = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_exp
  %ars = f32[1024]{0} all-reduce-start(%f1), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %f2 = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_exp
  %f3 = f32[1024]{0} fusion(%f2), kind=kLoop, calls=%fused_exp
  %ard = f32[1024]{0} all-reduce-done(%ars)
  %ar = f32[1024]{0} all-reduce(%ard), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024]{0}) tuple(%zero, %ar)
  %w = (s32[], f32[1024]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[1024]{0} get-tuple-element(%w), index=1
}
"""

MS = 1e-3


class OneMs(CostModel):
    """Every kernel with work takes 1 ms."""

    name = "one-ms"

    def kernel_time(self, kernel: Kernel) -> float:
        return 0.0 if kernel.is_empty else MS

    def params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> OneMs:
        return cls()


def _cluster(bandwidth: float) -> ClusterSpec:
    link = LinkSpec(bandwidth, 1e-6)
    return ClusterSpec(name="t8", nodes=1, devices_per_node=8, intra=link, inter=link, algorithm="ring",
                       device="h100")


@pytest.mark.parametrize("bandwidth", [1e12, 1e6])  # an all-reduce far shorter, and far longer, than 2 kernels
def test_schedule_overlaps_an_async_all_reduce_and_waits_at_its_done(bandwidth):
    spec = _cluster(bandwidth)
    r = C.price(SCHEDULED, OneMs(), spec, backend="gpu")
    c = collectives.collective_time("all-reduce", 4096, spec)
    assert [(k.name, k.executions) for k, _ in r.kernels] == [("f1", 1), ("f2", 1), ("f3", 1), ("next", 3),
                                                                ("fb", 3)]
    assert [(x.name, x.kind, x.nbytes, x.group, x.is_async) for x in r.collectives] == [
        ("ars", "all-reduce", 4096, 8, True), ("ar", "all-reduce", 4096, 8, False)]
    assert math.isclose(r.compute_s, 9 * MS)  # f1, f2, f3 and the loop body's two kernels 3 times (no condition on GPU)
    # f1; the async all-reduce beside f2 and f3; its done waits; the synchronous one holds the stream; the loop
    expected = max(3 * MS, MS + c) + c + 6 * MS
    assert math.isclose(r.step_time_s, expected, rel_tol=1e-9)
    assert math.isclose(r.comm_s, 2 * c)
    s = r.summary()
    assert s["kernels_from"] == "compiled" and s["async_collectives"] == 1 and s["kernel_launches"] == 9


def test_schedule_on_cpu_runs_the_loop_condition():
    r = C.price(SCHEDULED, OneMs(), _cluster(1e12), backend="cpu")
    assert ("lt", 4) in [(k.name, k.executions) for k, _ in r.kernels]  # 3 trips + the final test


def test_read_rejects_text_that_is_not_a_compiled_module():
    with pytest.raises(ValueError, match="expected an HLO module's text, got 'hello'"):
        C.read("hello")
    with pytest.raises(ValueError, match="is_scheduled=true"):
        C.read(SCHEDULED.replace(", is_scheduled=true", ""))


def _pre_optimization_text() -> str:
    import jax
    import jax.numpy as jnp

    def f(x, w):
        return jnp.sum(jnp.tanh(x @ w) * 2.0)

    return jax.jit(jax.grad(f, argnums=(0, 1))).lower(jnp.ones((32, 64)), jnp.ones((64, 16))).as_text(dialect="hlo")


def test_xla_cpu_compile_is_priced_from_its_real_kernels():
    from disco.ir import hlo_parse
    from disco.sim.cluster_presets import preset
    from disco.sim.costs.device_costs import analytic
    from xla_hooks.compile_for import compile_for

    text = compile_for(_pre_optimization_text(), device="cpu", devices=1, use_cache=False)
    assert hlo_parse.is_scheduled(text)
    r = C.price(text, analytic("cpu"), preset("local", 1))
    names = {k.name for k, _ in r.kernels}
    assert r.backend == "cpu" and r.kernels and r.collectives == ()
    assert any("fusion" in n or "dot" in n for n in names), names
    assert r.compute_s > 0 and math.isclose(r.step_time_s, r.compute_s)
    with pytest.raises(ValueError, match="device kind 'tpu'"):
        compile_for(text, device="tpu")


def _simulate(capsys, *args: str) -> tuple[int, str, str]:
    rc = disco_main(["simulate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_hlo_errors_say_what_was_received(capsys, tmp_path):
    rc, _, err = _simulate(capsys, "--hlo", str(tmp_path / "missing.hlo"), "--cluster", "h100-1")
    assert rc == 2 and "no such file" in err and "missing.hlo" in err
    bad = tmp_path / "bad.hlo"
    bad.write_text("not a module\n")
    rc, _, err = _simulate(capsys, "--hlo", str(bad), "--cluster", "h100-1")
    assert rc == 2 and "not HLO text" in err and "'not a module" in err
    rc, _, err = _simulate(capsys, "--hlo", str(bad), "--compile-option", "novalue")
    assert rc == 2 and "expected KEY=VALUE" in err


def test_cli_prices_a_compiled_module_as_it_is(capsys, tmp_path):
    f = tmp_path / "m.hlo"
    f.write_text(SCHEDULED)
    rc, out, _ = _simulate(capsys, "--hlo", str(f), "--cluster", "h100-sxm-8", "--json")
    assert rc == 0
    row = json.loads(out)["results"][0]
    assert row["kernels_from"] == "compiled" and row["collectives"] == 2 and row["kernels"] == 5


def test_cli_gpu_cluster_without_the_environment_falls_back_with_a_warning(capsys, tmp_path, monkeypatch):
    from xla_hooks import deviceless

    monkeypatch.setenv(deviceless.GPU_PYTHON_ENV, str(tmp_path / "no-python"))
    f = tmp_path / "pre.hlo"
    f.write_text(_pre_optimization_text())
    with warnings.catch_warnings():  # the CLI prints a warning as one line on stderr
        warnings.simplefilter("always", deviceless.DevicelessFallbackWarning)
        rc, out, err = _simulate(capsys, "--hlo", str(f), "--cluster", "h100-1", "--json")
    assert rc == 0
    assert "DevicelessFallbackWarning" in err and "make install-gpu" in err
    out = json.loads(out)
    assert out["results"][0]["kernels_from"] == "emulated" and "make install-gpu" in out["warning"]


def test_cache_key_changes_with_everything_that_changes_the_compile():
    from xla_hooks.deviceless import cache_key

    base = {"target": "h100", "devices": 1, "options": {}, "jax_version": "0.12.0.1"}
    k = cache_key("m", **base)
    assert k == cache_key("m", **base)
    assert len({k, cache_key("m2", **base), cache_key("m", **{**base, "devices": 8}),
                cache_key("m", **{**base, "options": {"xla_disable_hlo_passes": "priority-fusion"}}),
                cache_key("m", **{**base, "jax_version": "0.11.2"})}) == 5


@pytest.mark.slow  # two XLA:CPU compiles of a zoo step through the CLI: ~15 s
def test_cli_tier_compiled_prices_zoo_plans_from_xla_cpus_kernels(capsys):
    rc, out, _ = _simulate(capsys, "--model", "mlp", "--preset", "tiny", "--devices", "2",
                           "--plans", "xla_default,per_tensor", "--tier", "compiled", "--json")
    assert rc == 0
    rows = {r["plan"]: r for r in json.loads(out)["results"]}
    assert {r["kernels_from"] for r in rows.values()} == {"compiled"}
    assert {r["backend"] for r in rows.values()} == {"cpu"}
    # XLA's default combines the gradients' all-reduces; per_tensor keeps one per gradient
    assert rows["per_tensor"]["collectives"] > rows["xla_default"]["collectives"] >= 1
    assert rows["per_tensor"]["all_reduce_bytes"] == rows["xla_default"]["all_reduce_bytes"]


def test_cache_key_changes_with_the_autotune_results_loaded():
    from xla_hooks.deviceless import cache_key

    base = {"target": "h100", "devices": 1, "options": {}, "jax_version": "0.12.0.1"}
    assert len({cache_key("m", **base), cache_key("m", **base, autotune_results="version: 3\n"),
                cache_key("m", **base, autotune_results="version: 3\n\n")}) == 3
    assert cache_key("m", **base) == cache_key("m", **base, autotune_results=None)


def test_cli_autotune_results_are_refused_where_nothing_loads_them(capsys, tmp_path):
    results = tmp_path / "r.textproto"
    results.write_text("version: 3\n")
    rc, _, err = _simulate(capsys, "--model", "mlp", "--preset", "tiny", "--devices", "2", "--tier", "compiled",
                           "--autotune-results", str(results))
    assert rc == 2 and "--autotune-results: XLA:GPU's autotuning results" in err and "XLA:CPU does not autotune" in err
    f = tmp_path / "m.hlo"
    f.write_text(SCHEDULED)
    rc, _, err = _simulate(capsys, "--hlo", str(f), "--cluster", "h100-1", "--autotune-results", str(results))
    assert rc == 2 and "is an optimised module already" in err
    from xla_hooks.compile_for import compile_for

    with pytest.raises(ValueError, match=r"autotune results .* for device 'cpu': XLA:CPU does not autotune"):
        compile_for(_pre_optimization_text(), device="cpu", autotune_results=str(results))


def test_cli_gpu_baselines_are_refused_with_the_reason(capsys):
    import argparse

    from disco.cli.common import CliError, resolve_plans
    from disco.cli.simulate import _gpu_compiled_rows, check_plans_for
    from disco.ir.graph import HloGraph
    from disco.plans import baselines
    from disco.sim.cluster_presets import preset

    rc, _, err = _simulate(capsys, "--model", "mlp", "--preset", "tiny", "--devices", "2", "--plans", "xla_o1")
    assert rc == 2 and "plan 'xla_o1': compile option optimization_level='O1' on cpu" in err
    assert "XLA:CPU has none of these passes" in err
    graph = HloGraph.from_hlo_text(_pre_optimization_text())
    o1 = {"xla_o1": baselines.make("xla_o1", graph)}
    check_plans_for(o1, "h100", "compiled")  # a GPU cluster's compiled tier prices it
    with pytest.raises(CliError, match="plan 'xla_o1': the emulated tier does not model optimization_level "
                                       r"\(XLA:GPU's optimization level and loop passes\)"):
        check_plans_for(o1, "h100", "emulated")
    maxtext = {"maxtext": baselines.make("maxtext", graph)}  # the recipe pipelines the loops' collectives
    check_plans_for(maxtext, "h100", "compiled")
    with pytest.raises(CliError, match=r"plan 'maxtext': the emulated tier does not model xla_gpu_enable_while_loop_double_buffering, "
                                       r"xla_gpu_pipeline_all_gather, xla_gpu_pipeline_all_reduce, "
                                       r"xla_gpu_pipeline_reduce_scatter \("):
        check_plans_for(maxtext, "h100", "emulated")
    with pytest.raises(CliError, match=r"^auto_pgle is jax's profile-guided latency estimator.*"
                                       r"check_gpu.py \(its auto_pgle row\)"):
        resolve_plans("xla_default,auto_pgle", graph)
    grouped = {"xla_default": baselines.make("xla_default", graph),
               "grouped": baselines.make("xla_default", graph).replace(groups=(("sine.3", "multiply.5"),))}
    args = argparse.Namespace(devices=8, autotune_results=None)
    with pytest.raises(CliError, match="plan 'grouped': --tier compiled on GPU cluster 'h100-sxm-8' prices buckets, "
                                       "cuts and compile options; this one has 1 fusion group, which cannot reach XLA:GPU"):
        _gpu_compiled_rows(args, _pre_optimization_text(), grouped, None, preset("h100-sxm-8"))
    with pytest.raises(CliError, match=r"compiles the step as built, for --devices 2; the cluster has 8 devices "
                                       r"\(expected --devices 8\)"):
        _gpu_compiled_rows(argparse.Namespace(devices=2, autotune_results=None), _pre_optimization_text(),
                           {"xla_default": grouped["xla_default"]}, None, preset("h100-sxm-8"))

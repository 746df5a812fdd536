"""Deviceless XLA:GPU compiles (xla_hooks.deviceless) priced by the compiled tier: real compiles for an
H100 target from this CPU machine. They need .venv-gpu (`make install-gpu`); `make test-gpu-compile`
runs them there, and they skip, saying why, where it is missing."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from disco.ir import hlo_parse
from disco.ir.graph import HloGraph
from disco.plans import baselines
from disco.plans import options as plan_options
from disco.sim import compiled as C
from disco.sim.cluster_presets import preset
from disco.sim.costs.device_costs import analytic
from xla_hooks import deviceless

pytestmark = [pytest.mark.gpu_compile,
              pytest.mark.skipif(not deviceless.available(),
                                 reason=f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")]

# exp(sin(x) * 2) + 1 and a matmul: one loop fusion by default, more with priority fusion off.
PRE = """HloModule jit_f, entry_computation_layout={(f32[256,512]{1,0}, f32[512,128]{1,0})->f32[256,128]{1,0}}

ENTRY main.1 {
  x = f32[256,512]{1,0} parameter(0)
  w = f32[512,128]{1,0} parameter(1)
  s = f32[256,512]{1,0} sine(x)
  two = f32[] constant(2)
  b2 = f32[256,512]{1,0} broadcast(two), dimensions={}
  m = f32[256,512]{1,0} multiply(s, b2)
  e = f32[256,512]{1,0} exponential(m)
  d = f32[256,128]{1,0} dot(e, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  one = f32[] constant(1)
  b1 = f32[256,128]{1,0} broadcast(one), dimensions={}
  ROOT r = f32[256,128]{1,0} add(d, b1)
}
"""


def test_deviceless_compile_of_hlo_text_is_xla_gpus_scheduled_module(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    text = deviceless.compile_hlo(PRE, target="h100", devices=1)
    assert hlo_parse.is_scheduled(text) and hlo_parse.compiled_backend(text) == "gpu"
    r = C.price(text, analytic("h100"), preset("h100-1"))
    assert r.backend == "gpu" and r.kernels and r.compute_s > 0 and r.collectives == ()
    assert len(list(tmp_path.glob("*.json"))) == 1  # cached: the second compile is a read
    assert deviceless.compile_hlo(PRE, target="h100", devices=1) == text


def test_fusion_variants_are_compile_options(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    default = C.read(deviceless.compile_hlo(PRE, target="h100", devices=1))[2]
    off = C.read(deviceless.compile_hlo(PRE, target="h100", devices=1,
                                        options={"xla_disable_hlo_passes": "priority-fusion"}))[2]
    assert len(off) > len(default)


def test_eight_device_step_has_xla_combined_async_all_reduces(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    pre, text = deviceless.compile_zoo_step("mlp", "tiny", target="h100", devices=8)
    assert "all-reduce" not in pre  # GSPMD: XLA's partitioner adds the all-reduces
    r = C.price(text, analytic("h100"), preset("h100-sxm-8"))
    ars = [c for c in r.collectives if c.kind == "all-reduce"]
    assert ars and all(c.group == 8 for c in ars) and any(c.is_async for c in ars)
    assert r.comm_s > 0 and r.step_time_s >= r.compute_s
    # XLA's combiner merged the per-gradient all-reduces: fewer than the step's parameters
    assert len(ars) < pre.count("parameter(")


def test_unknown_target_and_failed_compile_say_what_was_received():
    with pytest.raises(ValueError, match="target 'tpu'"):
        deviceless.compile_hlo(PRE, target="tpu")
    with pytest.raises(deviceless.DevicelessUnavailable, match="failed"):
        deviceless.compile_hlo("HloModule broken\n\nENTRY e { ROOT x = f32[] nonsense() }\n", use_cache=False)


AUTOTUNE = Path(__file__).resolve().parents[1] / "data" / "autotune"


def _gemm_tiling(text: str) -> tuple[list[str], str, int]:
    """(output tile, warps, stages) of the Triton GEMM fusion computing PRE's dot."""
    line = next(ln for ln in text.splitlines() if "__triton_nested_gemm_fusion" in ln and " fusion(" in ln)
    config, _ = json.JSONDecoder().raw_decode(line[line.index("backend_config=") + len("backend_config="):])
    block = config["fusion_backend_config"]["block_level_fusion_config"]
    return block["output_tiles"][0]["sizes"], block["num_warps"], block["num_stages"]


def test_loaded_autotune_results_pin_the_triton_tiling(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    default = deviceless.compile_hlo(PRE, target="h100", devices=1)
    pinned = deviceless.compile_hlo(PRE, target="h100", devices=1,
                                    autotune_results=AUTOTUNE / "h100_pre_dot_triton.textproto")
    # without results: the first tiling that compiles; with them, the file's 64x64 tile, 4 warps, 3 stages
    assert _gemm_tiling(default) == (["1", "16", "8"], "2", 1)
    assert _gemm_tiling(pinned) == (["1", "64", "64"], "4", 3)
    assert len(list(tmp_path.glob("*.json"))) == 2  # the results are part of the cache key


def test_loaded_autotune_results_choose_cublas_over_triton(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    default = deviceless.compile_hlo(PRE, target="h100", devices=1)
    cublas = deviceless.compile_hlo(PRE, target="h100", devices=1,
                                    autotune_results=AUTOTUNE / "h100_pre_dot_cublas.textproto")
    assert "__triton_nested_gemm_fusion" in default and "__cublas$lt$matmul" not in default
    assert "__cublas$lt$matmul" in cublas and "__triton_nested_gemm_fusion" not in cublas
    kernels = {k.name: k for k in C.read(cublas)[2]}
    assert any(name.startswith("custom-call") for name in kernels)  # the compiled tier prices the cuBLAS call
    assert C.price(cublas, analytic("h100"), preset("h100-1")).compute_s > 0


def test_autotune_results_are_not_a_raw_compile_option():
    with pytest.raises(ValueError, match=r"xla_gpu_load_autotune_results_from: pass the file as autotune_results="):
        deviceless.compile_hlo(PRE, options={"xla_gpu_load_autotune_results_from": "/tmp/x.textproto"})


# A 4-trip loop whose body all-reduces a dot's result: O1's double-buffered loops unroll it by two.
LOOP = """HloModule loop, entry_computation_layout={(f32[512,512]{1,0})->f32[512,512]{1,0}}

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  p = (s32[], f32[512,512]{1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[512,512]{1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[512,512]{1,0} get-tuple-element(p), index=1
  d = f32[512,512]{1,0} dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ar = f32[512,512]{1,0} all-reduce(d), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=sum
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[512,512]{1,0}) tuple(i1, ar)
}

ENTRY main {
  x = f32[512,512]{1,0} parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[512,512]{1,0}) tuple(zero, x)
  w = (s32[], f32[512,512]{1,0}) while(t), condition=cond, body=body
  ROOT r = f32[512,512]{1,0} get-tuple-element(w), index=1
}
"""


def test_xla_o1_is_priced_as_xla_gpus_o1_compile(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    o1 = baselines.make("xla_o1", HloGraph.from_hlo_text(LOOP))
    texts = {name: deviceless.compile_hlo(LOOP, target="h100", devices=8, options=options) for name, options in (
        ("default", {}), ("lhs", {"xla_gpu_enable_latency_hiding_scheduler": "True"}),
        ("xla_o1", o1.compiler_options("gpu")))}
    trips = {name: re.findall(r'known_trip_count":\{"n":"(\d+)"', t) for name, t in texts.items()}
    assert trips == {"default": ["4"], "lhs": ["4"], "xla_o1": ["2"]}  # O1 is more than the scheduler alone
    priced = {name: C.price(t, analytic("h100"), preset("h100-sxm-8")) for name, t in texts.items()}
    ars = {name: [(c.kind, c.executions) for c in r.collectives] for name, r in priced.items()}
    assert ars["default"] == [("all-reduce", 4)] and ars["xla_o1"] == [("all-reduce", 2), ("all-reduce", 2)]
    # the same work either way: 4 dots and 4 all-reduces per step
    assert sum(k.executions for k, _ in priced["xla_o1"].kernels) == sum(k.executions for k, _ in priced["default"].kernels)


# A 4-trip loop writing each iteration's all-reduced dot into a slice of its output (what a scan's
# transpose writes a layer's gradient with): the pattern XLA's collective pipeliner moves.
WRITE_LOOP = """HloModule loop2, entry_computation_layout={(f32[4,256,256]{2,1,0}, f32[256,256]{1,0})->f32[4,256,256]{2,1,0}}

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  p = (s32[], f32[4,256,256]{2,1,0}, f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[4,256,256]{2,1,0}, f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  xs = f32[4,256,256]{2,1,0} get-tuple-element(p), index=1
  w = f32[256,256]{1,0} get-tuple-element(p), index=2
  out = f32[4,256,256]{2,1,0} get-tuple-element(p), index=3
  z = s32[] constant(0)
  xi = f32[1,256,256]{2,1,0} dynamic-slice(xs, i, z, z), dynamic_slice_sizes={1,256,256}
  x = f32[256,256]{1,0} reshape(xi)
  d = f32[256,256]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ar = f32[256,256]{1,0} all-reduce(d), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=sum
  ar3 = f32[1,256,256]{2,1,0} reshape(ar)
  out2 = f32[4,256,256]{2,1,0} dynamic-update-slice(out, ar3, i, z, z)
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[4,256,256]{2,1,0}, f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) tuple(i1, xs, w, out2)
}

ENTRY main {
  xs = f32[4,256,256]{2,1,0} parameter(0)
  w = f32[256,256]{1,0} parameter(1)
  zero = s32[] constant(0)
  c0 = f32[] constant(0)
  o = f32[4,256,256]{2,1,0} broadcast(c0), dimensions={}
  t = (s32[], f32[4,256,256]{2,1,0}, f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) tuple(zero, xs, w, o)
  wl = (s32[], f32[4,256,256]{2,1,0}, f32[256,256]{1,0}, f32[4,256,256]{2,1,0}) while(t), condition=cond, body=body
  ROOT r = f32[4,256,256]{2,1,0} get-tuple-element(wl), index=3
}
"""


def test_each_loop_pass_reaches_xla_gpu_one_by_one_and_is_priced(tmp_path, monkeypatch):
    """The collective pipeliner peels one iteration (4 trips -> 3), double buffering unrolls by two
    (-> 2), and MaxText's recipe does both; the compiled tier prices each module's trips."""
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    o = plan_options
    variants = {"default": {}, "pipelined": {o.PIPELINE_ALL_REDUCE: o.PIPELINE_ON},
                "double_buffered": {o.DOUBLE_BUFFERING: "True"},
                "maxtext": baselines.make("maxtext", HloGraph.from_hlo_text(WRITE_LOOP)).compiler_options("gpu")}
    texts = {name: deviceless.compile_hlo(WRITE_LOOP, target="h100", devices=8, options=opts)
             for name, opts in variants.items()}
    trips = {name: re.findall(r'known_trip_count":\{"n":"(\d+)"', t) for name, t in texts.items()}
    assert trips["default"] == ["4"] and trips["pipelined"] == ["3"] and trips["double_buffered"] == ["2"]
    assert trips["maxtext"] != ["4"]
    priced = {name: C.price(t, analytic("h100"), preset("h100-sxm-8")) for name, t in texts.items()}
    runs = {name: sum(c.executions for c in r.collectives) for name, r in priced.items()}
    assert runs == dict.fromkeys(variants, 4)  # every variant all-reduces 4 times a step: moved, not dropped
    assert all(r.step_time_s > 0 for r in priced.values())


def test_cli_prices_xla_o1_beside_xla_default_in_the_compiled_tier(tmp_path, monkeypatch, capsys):
    from disco.cli import main as disco_main

    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    rc = disco_main(["simulate", "--model", "mlp", "--preset", "tiny", "--devices", "8", "--cluster", "h100-sxm-8",
                     "--tier", "compiled", "--plans", "xla_default,xla_o1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["tier"] == "compiled"
    rows = {r["plan"]: r for r in out["results"]}
    assert set(rows) == {"xla_default", "xla_o1"}
    assert {(r["kernels_from"], r["backend"]) for r in rows.values()} == {("compiled", "gpu")}
    assert all(r["collectives"] >= 1 and r["step_time_ms"] > 0 for r in rows.values())
    assert len(list(tmp_path.glob("*.json"))) == 2  # two deviceless compiles: the options are part of the key


def test_cli_hlo_loads_autotune_results(tmp_path, monkeypatch, capsys):
    from disco.cli import main as disco_main

    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    pre = tmp_path / "pre.hlo"
    pre.write_text(PRE)
    rows, cublas_file = {}, str(AUTOTUNE / "h100_pre_dot_cublas.textproto")
    shipped = deviceless.shipped_autotune_results("h100")  # the default: the H100's results, for this jax
    for name, extra, loaded in (("default", [], str(shipped) if shipped else None),
                                ("none", ["--autotune-results", "none"], None),
                                ("cublas", ["--autotune-results", cublas_file], cublas_file)):
        rc = disco_main(["simulate", "--hlo", str(pre), "--cluster", "h100-1", "--json", *extra])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["autotune_results"] == loaded
        rows[name] = out["results"][0]
    assert rows["default"]["kernels"] == rows["none"]["kernels"]  # the H100's results hold no entry for PRE's dot
    # the Triton GEMM fusion (its producer fused in) against a cuBLAS call with its producer a fusion of its own
    assert (rows["default"]["kernels"], rows["cublas"]["kernels"]) == (2, 3)


def test_the_shipped_h100_results_reproduce_the_module_xla_built_on_the_h100(tmp_path, monkeypatch):
    """gpt2's training step (preset paper, one H100, command buffers off), compiled deviceless from the
    pre-optimisation HLO the H100 compile started from (gnn/data's record, measured 2026-11-24): with
    the autotuning results measured on an H100 (2026-11-28), its kernels are the device module's
    (every signature but the two reductions XLA emitted with Triton's block-level emitter there);
    without them, XLA takes other GEMM kernels."""
    import gzip

    from scripts.tools.kernel_match import match

    shipped = deviceless.shipped_autotune_results("h100")
    if shipped is None:
        pytest.skip(f"the shipped results are for jax {deviceless.SHIPPED_AUTOTUNE['h100'][1]}; this environment has "
                    f"{deviceless.child_jax_version(deviceless.gpu_python())}")
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    data = Path(__file__).resolve().parents[2] / "gnn" / "data" / "h100_kernels_2026-11-24.jsonl.gz"
    with gzip.open(data, "rt") as f:
        rec = next(r for r in map(json.loads, f)
                   if (r["model"], r["preset"], r["variant"]) == ("gpt2", "paper", "default"))
    compiles = {name: deviceless.compile_hlo(rec["pre_optimization_hlo"], target="h100", devices=1,
                                             options=rec["compile_options"], autotune_results=results)
                for name, results in (("with", shipped), ("without", None))}
    m = {name: match(rec["compiled_hlo"], text) for name, text in compiles.items()}
    assert m["with"]["coarse_match"] == 1.0 and m["with"]["match"] >= 0.98
    assert m["with"]["deviceless_kernels"] == m["with"]["device_kernels"] == 207
    assert m["without"]["match"] < m["with"]["match"]


def test_cli_prices_bucket_and_cut_plans_for_eight_h100s_from_the_step_as_built(tmp_path, monkeypatch, capsys):
    """A GPU cluster's compiled tier takes the plans a GPU search makes: the step's own text with each
    plan's buckets (and cuts: opt-barriers) written in, compiled deviceless for 8 H100s."""
    from disco.cli import main as disco_main
    from disco.cli.common import make_step
    from disco.ir import extractor
    from disco.plans.plan import FusionPlan

    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))

    step, example = make_step(argparse.Namespace(model="mlp", preset="tiny", devices=8, optimizer="adamw",
                                                 style="shard_map", trax_model=None))
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    # a cut between a dot and the elementwise op that reads it: XLA:GPU fuses that pair (an epilogue) otherwise
    dots = {n.name for n in graph.nodes if n.opcode == "dot"}
    user = next(n for n in graph.nodes if n.opcode == "add" and set(n.operands) & dots)
    dot = next(o for o in user.operands if o in dots)
    cut = FusionPlan(cuts=((dot, user.name),), name="cut").validate(graph, "gpu")
    (tmp_path / "cut.json").write_text(cut.to_json())
    rc = disco_main(["simulate", "--model", "mlp", "--preset", "tiny", "--devices", "8", "--cluster", "h100-sxm-8",
                     "--tier", "compiled", "--plans", f"xla_default,horovod,even:4,per_tensor,{tmp_path / 'cut.json'}",
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    rows = {r["plan"]: r for r in out["results"]}
    assert {(r["kernels_from"], r["backend"]) for r in rows.values()} == {("compiled", "gpu")}
    n_grads = len(baselines.make("per_tensor", graph).buckets)
    # XLA's combiner makes xla_default's one all-reduce; a plan's buckets are kept as planned (combiner off)
    assert {name: r["collectives"] for name, r in rows.items()} == {
        "xla_default": 1, "horovod": 1, "even_4": 4, "per_tensor": n_grads, "cut": 1}
    assert len({r["all_reduce_bytes"] for r in rows.values()}) == 1  # the same gradients in every plan
    # the cut reaches XLA:GPU (its barrier changes the fusions XLA forms, then goes): another module
    from xla_hooks.compile_for import plan_text_for

    text = extractor.hlo_text(step, *example)
    assert plan_text_for(text, cut, device="h100", devices=8) != plan_text_for(text, FusionPlan(), device="h100", devices=8)
    assert rows["cut"]["kernels"] != rows["xla_default"]["kernels"]


@pytest.mark.parametrize("style", ["shard_map", "gspmd"])
def test_predict_ranks_a_gpu_clusters_candidates_by_their_deviceless_modules(tmp_path, monkeypatch, style):
    """``disco optimize`` for 8 H100s from this CPU machine: every candidate compiled deviceless and the
    answer the fastest compiled module, nothing measured; a ``jax.jit`` step over sharded arguments
    (gspmd: its partitioned program carries the all-reduces the buckets name) as a shard_map one."""
    import trax_models
    from disco.optimizer import predict

    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    step, args = trax_models.make_train_step("mlp", preset="tiny", devices=8, style=style)
    r = predict(step, *args, cluster=preset("h100-sxm-8"), budget_s=600.0, max_evals=300, measure_top_k=2,
                bucket_sweep=(2,))
    assert r.tier == "compiled" and r.tier_note is None
    assert all(row.compiled_s is not None and row.compiled["backend"] == "gpu" for row in r.rows)
    assert [row.compiled_s for row in r.rows] == sorted(row.compiled_s for row in r.rows)
    assert r.chosen == r.rows[0].name and not r.plan.groups
    assert (r.row("xla_default").compiled["collectives"], r.row("horovod").compiled["collectives"],
            r.row("even_2").compiled["collectives"]) == (1, 1, 2)

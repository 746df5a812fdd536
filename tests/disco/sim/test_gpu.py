"""The simulator on GPU clusters: device kinds, H100 presets, XLA:GPU fusion emulation, H100 costs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from disco.ir.graph import HloGraph
from disco.plans import baselines
from disco.sim import cluster, gpu_fusion
from disco.sim.costs import device_costs, registry
from disco.sim.costs import AnalyticCosts
from disco.sim.simulator import Simulator
from tests.support.paths import REPO

# A layer norm, a dense layer with bias and relu, and a softmax-like tail: enough for XLA:GPU's
# rules (bitcast reshapes, broadcasts, sibling reductions, a matrix epilogue, a step output).
HLO = """HloModule m, entry_computation_layout={(f32[64,128]{1,0}, f32[128,256]{1,0}, f32[256]{0})->(f32[64,256]{1,0}, f32[64]{0})}

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[64,128]{1,0} parameter(0)
  w = f32[128,256]{1,0} parameter(1)
  bias = f32[256]{0} parameter(2)
  zero = f32[] constant(0)
  sum = f32[64]{0} reduce(x, zero), dimensions={1}, to_apply=add_f32
  sq = f32[64,128]{1,0} multiply(x, x)
  sumsq = f32[64]{0} reduce(sq, zero), dimensions={1}, to_apply=add_f32
  mean = f32[64]{0} divide(sum, sumsq)
  meanb = f32[64,128]{1,0} broadcast(mean), dimensions={0}
  xc = f32[64,128]{1,0} subtract(x, meanb)
  h = f32[64,256]{1,0} dot(xc, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[64,256]{1,0} broadcast(bias), dimensions={1}
  hb = f32[64,256]{1,0} add(h, bb)
  zb = f32[64,256]{1,0} broadcast(zero), dimensions={}
  r = f32[64,256]{1,0} maximum(hb, zb)
  e = f32[64,256]{1,0} exponential(r)
  es = f32[64]{0} reduce(e, zero), dimensions={1}, to_apply=add_f32
  esr = f32[64,1]{1,0} reshape(es)
  ROOT out = (f32[64,256]{1,0}, f32[64,1]{1,0}) tuple(r, esr)
}
"""


@pytest.fixture(scope="module")
def graph() -> HloGraph:
    return HloGraph.from_hlo_text(HLO)


def _kernels(graph: HloGraph, spec: cluster.ClusterSpec, costs=None) -> list[tuple[str, ...]]:
    sim = Simulator(graph, costs or AnalyticCosts(), spec)
    return sim.fusions(baselines.make("xla_default", graph))


@pytest.mark.fast
def test_device_kind_defaults_to_cpu_and_round_trips():
    spec = cluster.preset("dgx-a100-8")
    assert spec.device == "cpu" and not spec.is_gpu
    assert "device" not in spec.to_dict()  # the YAML of existing specs is unchanged
    for name in ("h100-1", "h100-sxm-8", "h100-2x8-ib"):
        s = cluster.preset(name)
        assert s.device == "h100" and s.is_gpu
        back = cluster.ClusterSpec.from_yaml(s.to_yaml())
        assert back == s and back.device == "h100"


@pytest.mark.fast
def test_h100_presets_shapes():
    assert cluster.preset("h100-1").num_devices == 1
    s8 = cluster.preset("h100-sxm-8")
    assert (s8.nodes, s8.devices_per_node, s8.intra.bandwidth) == (1, 8, 480e9)
    ib = cluster.preset("h100-2x8-ib")
    assert (ib.nodes, ib.devices_per_node, ib.algorithm) == (2, 8, "hierarchical")
    assert ib.inter.bandwidth == pytest.approx(8 * 400e9 / 8)
    assert cluster.resolve("h100-sxm-8") == s8


@pytest.mark.fast
def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match=re.escape("cluster.device: expected one of cpu, h100, got 'tpu'")):
        cluster.ClusterSpec.from_dict({"nodes": 1, "devices_per_node": 1,
                                       "intra": {"bandwidth": 1e9, "latency": 0}, "device": "tpu"})
    with pytest.raises(ValueError, match="ClusterSpec.device"):
        cluster.preset("h100-1").replace(device="a100")


@pytest.mark.fast
def test_gpu_emulation_differs_from_cpu_as_xla_gpu_does(graph):
    cpu = _kernels(graph, cluster.preset("local", devices=1))
    gpu = _kernels(graph, cluster.preset("h100-1"))
    assert cpu != gpu
    flat = [n for k in gpu for n in k]
    assert len(flat) == len(set(flat))  # a partition
    by_member = {n: k for k in gpu for n in k}
    # The dot takes its bias add and relu as an epilogue (cuBLASLt / Triton), claimed before
    # fusion, although the relu's value also leaves the step (the epilogue writes it).
    assert set(by_member["h"]) == {"h", "hb", "r"}
    # The two reductions over x share one kernel (sibling multi-output fusion).
    assert by_member["sum"] == by_member["sumsq"]
    # The reshape is a bitcast on GPU: never a kernel.
    assert "esr" not in by_member
    # exp and its reduce fuse, apart from the matrix kernel.
    assert by_member["es"] == by_member["e"] != by_member["h"]


@pytest.mark.fast
def test_gpu_emulation_with_a_planned_group_keeps_it_whole(graph):
    sim = Simulator(graph, AnalyticCosts(), cluster.preset("h100-1"))
    plan = baselines.make("xla_default", graph).replace(groups=(("e", "es"),))
    kernels = sim.fusions(plan)
    owner = [k for k in kernels if "e" in k]
    assert len(owner) == 1 and "es" in owner[0]




@pytest.mark.fast
def test_gpu_cluster_prices_with_the_h100_model(graph):
    costs = registry.make("analytic", device="h100")
    assert isinstance(costs, device_costs.SummedCosts) and costs == device_costs.analytic("h100")
    sim = Simulator(graph, costs, cluster.preset("h100-1"))
    res = sim.result(baselines.make("xla_default", graph))
    n_kernels = len(sim.fusions(baselines.make("xla_default", graph)))
    # Launch terms alone bound it from below; a CPU roofline would be orders of magnitude slower.
    assert n_kernels * costs.config.launch <= res.step_time < 1e-3
    cpu = Simulator(graph, AnalyticCosts(), cluster.preset("local", devices=1)).result(
        baselines.make("xla_default", graph))
    assert cpu.step_time > 10 * res.step_time


@pytest.mark.fast
def test_h100_analytic_model_sums_its_terms(graph):
    from disco.sim.costs import GraphKernels

    cfg = device_costs.SUMMED["h100"]
    costs = device_costs.SummedCosts(cfg)
    gk = GraphKernels(graph)
    index = graph.index()
    dot = gk.kernel((index["h"],))  # the dense layer's dot alone
    t = costs.terms(dot)
    assert (t.launches, t.copy_launches, t.conv_flops) == (1.0, 0.0, 0.0)
    assert t.dot_flops == 2 * 64 * 128 * 256 < cfg.dot_knee and t.nbytes > 0
    want = cfg.launch + t.dot_flops / cfg.dot_rate + t.nbytes / cfg.bandwidth
    assert costs.kernel_time(dot) == pytest.approx(want, rel=1e-12)
    # Summed, not maxed: more than the larger of its matrix and memory terms.
    assert costs.kernel_time(dot) > cfg.launch + max(t.dot_flops / cfg.dot_rate, t.nbytes / cfg.bandwidth)
    assert costs.kernel_time(gk.kernel((index["x"], index["zero"]))) == 0.0  # no compute node: no kernel


def _node(name: str, opcode: str, elements: int, flops: float = 0.0, operands: tuple[str, ...] = ()):
    from disco.ir.graph import Node

    return Node(name=name, opcode=opcode, computation="main", shape=f"f32[{elements}]", dtype="f32",
                out_bytes=4 * elements, out_elements=elements, flops=flops, operands=operands)


def _dot_kernel(flops: float, nbytes: int = 4096):
    from disco.sim.costs import Kernel

    return Kernel(nodes=(_node("d", "dot", 256, flops, ("a", "b")),), in_bytes=nbytes, out_bytes=1024)


_CFG = dict(launch=2e-6, copy_launch=5e-7, dot_rate=1e14, dot_knee=1e10, dot_rate_large=4e14, conv_rate=2e14,
            bandwidth=3e12)


@pytest.mark.fast
def test_h100_dot_rate_rises_beyond_the_knee():
    m = device_costs.SummedCosts(device_costs.SummedConfig(**_CFG))
    flat = device_costs.SummedCosts(device_costs.SummedConfig(**{**_CFG, "dot_rate_large": _CFG["dot_rate"]}))
    base = _CFG["launch"] + (4096 + 1024) / _CFG["bandwidth"]
    # Below the knee: the small rate, as the form without a knee (dot_rate_large == dot_rate).
    assert m.kernel_time(_dot_kernel(1e9)) == pytest.approx(base + 1e9 / 1e14, rel=1e-12)
    assert m.kernel_time(_dot_kernel(1e9)) == flat.kernel_time(_dot_kernel(1e9))
    # Beyond it: the knee's flops at the small rate, the rest at the large one.
    assert m.kernel_time(_dot_kernel(5e10)) == pytest.approx(base + 1e10 / 1e14 + 4e10 / 4e14, rel=1e-12)
    assert m.kernel_time(_dot_kernel(5e10)) < flat.kernel_time(_dot_kernel(5e10))
    # Positive, monotone in flops and bytes, continuous at the knee, subadditive (Simulator.lower_bound).
    fs = [0.0, 1e6, 1e9, 1e10 - 1, 1e10, 1e10 + 1, 3e10, 1e12]
    ts = [m.kernel_time(_dot_kernel(f)) for f in fs]
    assert all(t > 0 for t in ts) and ts == sorted(ts) and len(set(ts)) == len(ts)
    assert m.kernel_time(_dot_kernel(1e10 + 1)) - m.kernel_time(_dot_kernel(1e10)) < 1e-13
    assert m.kernel_time(_dot_kernel(1e6, 8192)) > m.kernel_time(_dot_kernel(1e6, 4096))
    dot_s = [m.kernel_time(_dot_kernel(f)) - base for f in (6e9, 8e9, 1.4e10)]
    assert dot_s[2] <= dot_s[0] + dot_s[1] + 1e-15
    # A knee of 0: every flop at the large rate.
    zero = device_costs.SummedCosts(device_costs.SummedConfig(**{**_CFG, "dot_knee": 0.0}))
    assert zero.kernel_time(_dot_kernel(1e9)) == pytest.approx(base + 1e9 / 4e14, rel=1e-12)


@pytest.mark.fast
def test_h100_data_movement_kernels_pay_their_own_launch():
    from disco.sim.costs import Kernel

    m = device_costs.SummedCosts(device_costs.SummedConfig(**_CFG))
    slice_ = Kernel(nodes=(_node("s", "slice", 1024, operands=("p",)),), in_bytes=8192, out_bytes=4096)
    t = m.terms(slice_)
    assert (t.launches, t.copy_launches, t.nbytes) == (0.0, 1.0, 8192 + 4096)
    assert m.kernel_time(slice_) == pytest.approx(_CFG["copy_launch"] + 12288 / _CFG["bandwidth"], rel=1e-12)
    # The same traffic with a computing op (add) fused in pays the kernel launch instead.
    computing = Kernel(nodes=slice_.nodes + (_node("a", "add", 1024, 1024.0, ("s", "s")),), in_bytes=8192,
                       out_bytes=4096)
    assert m.terms(computing)[:2] == (1.0, 0.0)
    assert m.kernel_time(computing) - m.kernel_time(slice_) == pytest.approx(_CFG["launch"] - _CFG["copy_launch"])
    # Positive and monotone in bytes even at a copy launch of 0 (the shipped fit's value).
    free = device_costs.SummedCosts(device_costs.SummedConfig(**{**_CFG, "copy_launch": 0.0}))
    small, big = (Kernel(nodes=slice_.nodes, in_bytes=n, out_bytes=n) for n in (4096, 8192))
    assert 0 < free.kernel_time(small) < free.kernel_time(big)
    assert device_costs.SUMMED["h100"].copy_launch <= device_costs.SUMMED["h100"].launch


@pytest.mark.fast
def test_h100_costs_round_trip_and_errors(tmp_path):
    m = device_costs.SummedCosts(device_costs.SummedConfig(**_CFG))
    back = device_costs.SummedCosts.from_params(m.params())
    assert back == m and back.digest() == m.digest()
    path = tmp_path / "h100.json"
    m.save(path)
    assert json.loads(path.read_text())["version"] == "2"
    assert registry.make(str(path), device="h100") == m  # a saved file is read by the registry's entry
    with pytest.raises(ValueError, match=r"expected keys \['bandwidth', 'conv_rate', 'copy_launch', 'dot_knee', "
                                         r"'dot_rate', 'dot_rate_large', 'launch'\], got \['peak'\]"):
        device_costs.SummedCosts.from_params({"peak": 1})
    with pytest.raises(ValueError, match="SummedConfig.bandwidth: expected a positive number, got 0"):
        device_costs.SummedConfig(**{**_CFG, "bandwidth": 0})
    with pytest.raises(ValueError, match="SummedConfig.copy_launch: expected a non-negative number, got -1e-06"):
        device_costs.SummedConfig(**{**_CFG, "copy_launch": -1e-6})
    with pytest.raises(ValueError, match=r"SummedConfig.dot_rate_large: expected at least dot_rate "
                                         r"\(100000000000000.0\), got 50000000000000.0"):
        device_costs.SummedConfig(**{**_CFG, "dot_rate_large": 5e13})
    # A file of the 4-parameter form (version 1) is refused with a clear error.
    old = tmp_path / "v1.json"
    data = json.loads(path.read_text())
    old.write_text(json.dumps({**data, "version": "1", "params": {"launch": 1e-6, "dot_rate": 1e14,
                                                                    "conv_rate": 2e14, "bandwidth": 2e12}}))
    with pytest.raises(ValueError, match=r"v1.json: field 'version': expected '2', got '1' \(a model of an older "
                                         r"form: refit it with scripts/tools/gpu_sim_tables.py --fit\)"):
        device_costs.SummedCosts.load(old)
    other = tmp_path / "cpu.json"
    registry.make("analytic", device="cpu").save(other)
    with pytest.raises(ValueError, match="expected a saved 'analytic-summed' cost model .* got 'analytic'"):
        device_costs.SummedCosts.load(other)
    assert registry.make(str(other)) == AnalyticCosts()
    with pytest.raises(ValueError, match=r"device 'tpu': expected one of \['cpu', 'h100'\]"):
        device_costs.analytic("tpu")
    assert device_costs.analytic("cpu") == AnalyticCosts(device_costs.roofline_config("cpu"))


def _simulate(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "disco", "simulate", "--model", "mlp", "--preset", "tiny",
                        "--plans", "xla_default", "--json", *args], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_simulate_prices_a_gpu_cluster_through_the_registry():
    runs = {cm: _simulate("--devices", "1", "--cluster", "h100-1", "--cost-model", cm) for cm in ("analytic", "gnn")}
    times = {cm: out["results"][0]["step_time_ms"] for cm, out in runs.items()}
    assert runs["analytic"]["cost_model"] == "analytic-summed" and runs["gnn"]["cost_model"] == "gnn"
    assert all(out["cluster"] == "h100-1" and out["cost_model_info"]["device"] == "h100" for out in runs.values())
    assert runs["gnn"]["cost_model_info"]["source"].endswith("kernel_h100.msgpack")
    assert all(t > 0 for t in times.values()) and times["analytic"] != times["gnn"], times
    # The CPU cluster keeps the CPU roofline (slower than the H100 even on this launch-bound tiny step).
    cpu = _simulate("--devices", "1")
    assert cpu["cost_model"] == "analytic" and cpu["cost_model_info"]["device"] == "cpu"
    assert cpu["results"][0]["step_time_ms"] > 1.5 * times["analytic"]


@pytest.mark.fast
def test_duplicated_rules():
    # 0: param-like kernel, 1: reshape (bitcast, always), 2: broadcast used by an output (kept),
    # 3: convert with fusible users (duplicated), 4: add, 5: a sharding custom-call (free).
    opcodes = ["exponential", "reshape", "broadcast", "convert", "add", "custom-call"]
    is_kernel = [True] * 6
    succs = [(1, 3), (), (), (4,), (5,), ()]
    preds = [(), (0,), (), (0,), (3,), (4,)]
    elems = [8, 8, 8, 8, 8, 8]
    dup = gpu_fusion.duplicated(opcodes, is_kernel, succs, preds, elems)
    assert dup == {1, 3, 5}


# -- the lower bound bounds every plan (GPU: fused epilogues move fewer bytes than a dot alone) --
_BOUND_CLUSTERS = {"h100-1": (lambda: device_costs.analytic("h100")),
                   "h100-roofline": (lambda: AnalyticCosts(device_costs.roofline_config("h100"))),
                   "local": AnalyticCosts}


@pytest.mark.fast
@pytest.mark.parametrize("which", sorted(_BOUND_CLUSTERS))
@pytest.mark.parametrize("seed", range(12))
def test_lower_bound_is_below_every_random_plan(graph, which, seed):
    from disco.plans.random_plans import random_plan

    spec = cluster.preset("local" if which == "local" else "h100-1")
    sim = Simulator(graph, _BOUND_CLUSTERS[which](), spec)
    bound = sim.lower_bound()
    assert bound > 0
    for plan in (random_plan(graph, seed), baselines.make("xla_default", graph), baselines.make("no_fusion", graph)):
        assert bound <= sim.step_time(plan) * (1 + 1e-12), (which, plan.name)


# A dot reading a broadcast: XLA:GPU (and the emulation) recomputes the broadcast inside the GEMM
# kernel, which then reads 512 bytes where the dot alone reads the 2 MiB broadcast.
BROADCAST_DOT = """HloModule b, entry_computation_layout={(f32[128]{0}, f32[128,256]{1,0})->f32[4096,256]{1,0}}

ENTRY main {
  v = f32[128]{0} parameter(0)
  w = f32[128,256]{1,0} parameter(1)
  x = f32[4096,128]{1,0} broadcast(v), dimensions={1}
  ROOT h = f32[4096,256]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.mark.fast
def test_lower_bound_is_below_a_gemm_that_reads_a_duplicated_broadcast():
    g = HloGraph.from_hlo_text(BROADCAST_DOT)
    sim = Simulator(g, device_costs.analytic("h100"), cluster.preset("h100-1"))
    plan = baselines.make("xla_default", g)
    assert sim.fusions(plan) == [("h",)]  # the broadcast is no kernel of its own
    assert 0 < sim.lower_bound() <= sim.step_time(plan)


def test_a_bucket_of_an_fsdp_steps_gradients_simulates_on_a_gpu_cluster():
    """partition-id is duplicated into each consumer as XLA:GPU recomputes it: fused into one consumer
    (the first shard's Adam update), it made every later shard's slice wait on that gradient's
    all-reduce, and a bucket holding a later gradient too formed a cycle (transformer_lm in fsdp style)."""
    import jax

    import trax_models
    from disco.ir import extractor

    step, args = trax_models.make_train_step("transformer_lm", "tiny", devices=8, style="fsdp")
    assert len(jax.devices()) >= 8
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *args))
    sim = Simulator(graph, device_costs.analytic("h100"), cluster.preset("h100-sxm-8"))
    assert sim.step_time(baselines.make("horovod", graph)) > 0


# A softmax over logits sharded along the class dimension: the row maximum is all-reduced before
# the exponentials are summed. Both reductions read the logits over one iteration space, but the
# sum depends on the first through the all-reduce.
SHARDED_SOFTMAX = """HloModule s, entry_computation_layout={(f32[8,64]{1,0}, f32[64,128]{1,0})->f32[8]{0}}

max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[8,64]{1,0} parameter(0)
  w = f32[64,128]{1,0} parameter(1)
  logits = f32[8,128]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ninf = f32[] constant(-inf)
  localmax = f32[8]{0} reduce(logits, ninf), dimensions={1}, to_apply=max_f32
  rowmax = f32[8]{0} all-reduce(localmax), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=max_f32
  rowmaxb = f32[8,128]{1,0} broadcast(rowmax), dimensions={0}
  shifted = f32[8,128]{1,0} subtract(logits, rowmaxb)
  e = f32[8,128]{1,0} exponential(shifted)
  zero = f32[] constant(0)
  ROOT sum = f32[8]{0} reduce(e, zero), dimensions={1}, to_apply=add_f32
}
"""


@pytest.mark.fast
def test_sibling_reductions_joined_through_a_collective_stay_apart():
    """XLA's sibling fusion refuses siblings a path joins, through a collective too: fused, the
    softmax's two reductions would both feed and read the all-reduce (a cycle)."""
    g = HloGraph.from_hlo_text(SHARDED_SOFTMAX)
    sim = Simulator(g, device_costs.analytic("h100"), cluster.preset("h100-sxm-8"))
    plan = baselines.make("xla_default", g)
    by_member = {n: k for k in sim.fusions(plan) for n in k}
    assert by_member["localmax"] == ("localmax",)
    assert set(by_member["sum"]) == {"shifted", "e", "sum"}
    assert sim.step_time(plan) > 0


# Two reductions of one dot: ``r1`` feeds ``c1``, whose fusion takes ``q`` as an extra output,
# and ``q`` feeds the second reduction's fusion. No path of nodes joins the reductions, one
# through the fusion of ``q`` and ``c1`` does.
THROUGH_A_FUSION = """HloModule v, entry_computation_layout={(f32[8,64]{1,0}, f32[64,128]{1,0}, f32[8,64]{1,0})->(f32[8,64]{1,0}, f32[8]{0})}

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[8,64]{1,0} parameter(0)
  w = f32[64,128]{1,0} parameter(1)
  y = f32[8,64]{1,0} parameter(2)
  p = f32[8,128]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  zero = f32[] constant(0)
  r1 = f32[8]{0} reduce(p, zero), dimensions={1}, to_apply=add_f32
  q = f32[8,64]{1,0} exponential(y)
  rb = f32[8,64]{1,0} broadcast(r1), dimensions={0}
  c1 = f32[8,64]{1,0} add(rb, q)
  cc = f32[8,128]{1,0} concatenate(q, q), dimensions={1}
  s = f32[8,128]{1,0} multiply(p, cc)
  r2 = f32[8]{0} reduce(s, zero), dimensions={1}, to_apply=add_f32
  ROOT out = (f32[8,64]{1,0}, f32[8]{0}) tuple(c1, r2)
}
"""


@pytest.mark.fast
def test_sibling_reductions_joined_through_another_fusion_stay_apart():
    """XLA's reachability runs over the fused graph: merged, the reductions would feed and read the
    fusion of ``q`` and ``c1`` (a cycle)."""
    g = HloGraph.from_hlo_text(THROUGH_A_FUSION)
    sim = Simulator(g, device_costs.analytic("h100"), cluster.preset("h100-1"))
    plan = baselines.make("xla_default", g)
    assert sorted(sim.fusions(plan)) == [("cc", "s", "r2"), ("p",), ("q", "c1"), ("r1",)]
    assert sim.step_time(plan) > 0


# A value read by two kernels and an all-reduce, whose result the first kernel's fusion reads too.
COLLECTIVE_BETWEEN = """HloModule u, entry_computation_layout={(f32[8,128]{1,0})->(f32[8]{0}, f32[8,128]{1,0})}

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[8,128]{1,0} parameter(0)
  p = f32[8,128]{1,0} exponential(x)
  c = f32[8,128]{1,0} all-reduce(p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add_f32
  a = f32[8,128]{1,0} add(p, c)
  zero = f32[] constant(0)
  r = f32[8]{0} reduce(a, zero), dimensions={1}, to_apply=add_f32
  m = f32[8,128]{1,0} multiply(p, p)
  ROOT out = (f32[8]{0}, f32[8,128]{1,0}) tuple(r, m)
}
"""


@pytest.mark.fast
def test_a_producer_read_by_a_collective_inside_its_fusion_stays_out():
    """Multi-output fusion takes a producer into its earliest consumer's fusion only when every
    other reader, a collective too, comes after that fusion: taken in, ``p`` would feed the
    all-reduce that fusion reads (a cycle), although its last reader ``m`` comes after it."""
    g = HloGraph.from_hlo_text(COLLECTIVE_BETWEEN)
    sim = Simulator(g, device_costs.analytic("h100"), cluster.preset("h100-sxm-8"))
    plan = baselines.make("xla_default", g)
    assert sorted(sim.fusions(plan)) == [("a", "r"), ("m",), ("p",)]
    assert sim.step_time(plan) > 0


# Two reductions of one row block each, both at this device's offset (an s32[1] read by
# partition-id): one reads a gathered value's all-reduce, the other feeds the loss's. The
# all-reduces are independent, and XLA's combiner merges them.
SCALAR_SIBLINGS = """HloModule t, entry_computation_layout={(f32[16,128]{1,0}, f32[16,128]{1,0})->(f32[8]{0}, f32[8]{0})}

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[16,128]{1,0} parameter(0)
  y = f32[16,128]{1,0} parameter(1)
  x2 = f32[16,128]{1,0} multiply(x, x)
  ax = f32[16,128]{1,0} all-reduce(x2), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add_f32
  ey = f32[16,128]{1,0} exponential(y)
  table = s32[2]{0} constant({0, 8})
  pid = u32[] partition-id()
  pick = s32[1]{0} dynamic-slice(table, pid), dynamic_slice_sizes={1}
  off = s32[] reshape(pick)
  izero = s32[] constant(0)
  sx = f32[8,128]{1,0} dynamic-slice(ax, off, izero), dynamic_slice_sizes={8,128}
  sy = f32[8,128]{1,0} dynamic-slice(ey, off, izero), dynamic_slice_sizes={8,128}
  zero = f32[] constant(0)
  rx = f32[8]{0} reduce(sx, zero), dimensions={1}, to_apply=add_f32
  ry = f32[8]{0} reduce(sy, zero), dimensions={1}, to_apply=add_f32
  ary = f32[8]{0} all-reduce(ry), channel_id=2, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add_f32
  ROOT out = (f32[8]{0}, f32[8]{0}) tuple(rx, ary)
}
"""


@pytest.mark.fast
def test_reductions_sharing_an_effective_scalar_are_no_siblings():
    """XLA's sibling fusion skips a shared operand of one element (``IsProfitableOperand``): fused
    for their shared offset, the two reductions would read one all-reduce and feed the other, which
    the combiner merges with it (a cycle; transformer_lm at preset paper in fsdp style)."""
    g = HloGraph.from_hlo_text(SCALAR_SIBLINGS)
    sim = Simulator(g, device_costs.analytic("h100"), cluster.preset("h100-sxm-8"))
    plan = baselines.make("xla_default", g)
    by_member = {n: k for k in sim.fusions(plan) for n in k}
    assert by_member["rx"] != by_member["ry"]
    assert sim.step_time(plan) > 0

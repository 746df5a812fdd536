"""Tests for disco.sim.simulator: hand-computed timelines (exact), traces, and properties."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from disco.sim.cluster import ClusterSpec, preset
from disco.sim.costs import AnalyticCosts, CostModel, Kernel, is_kernel_node
from disco.ir.graph import HloGraph, Node
from disco.ir.opcodes import FUSIBLE_OPCODES
from disco.plans.plan import Bucket, FusionPlan, make_plan
from disco.plans.check import validate
from disco.sim.simulator import Event, SimResult, Simulator, lower_bound, simulate


class FixedCosts(CostModel):
    """Kernel time = sum of per-node times (or a fixed time per fused member set); comm = 1 + bytes."""

    name = "fixed"

    def __init__(self, times: Mapping[str, float], fused: Mapping[frozenset[str], float] | None = None):
        self.times = dict(times)
        self.fused = dict(fused or {})

    def kernel_time(self, kernel: Kernel) -> float:
        names = frozenset(n.name for n in kernel.nodes)
        if names in self.fused:
            return self.fused[names]
        return float(sum(self.times.get(n.name, 0.0) for n in kernel.nodes if is_kernel_node(n)))

    def collective_time(self, kind: str, nbytes: int, cluster: ClusterSpec) -> float:
        return 1.0 + nbytes

    def params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> FixedCosts:
        return cls({})


CLUSTER = preset("local").replace(overlap=True)  # two streams, as on GPUs (tests below set False)
OFF = FusionPlan(xla_fusion="off")  # only planned fusions: every other op is a kernel of one


def graph_of(spec: list[tuple]) -> HloGraph:
    """(name, opcode, operands[, out_bytes]) rows -> HloGraph; edges from operands."""
    nodes, idx = [], {}
    for name, op, ops, *b in spec:
        idx[name] = len(nodes)
        is_ar = op == "all-reduce"
        nodes.append(Node(name=name, opcode=op, computation="main", shape="f32[1]", dtype="f32",
                          out_bytes=b[0] if b else 4, out_elements=1, flops=0.0, operands=tuple(ops),
                          grad_bytes=(b[0] if b else 4) if is_ar else 0,
                          replica_groups="{}" if is_ar else None, reduction="add" if is_ar else None))
    edges = tuple(sorted({(idx[o], idx[n.name]) for n in nodes for o in n.operands}))
    return HloGraph("t", tuple(nodes), edges, "x")


def run_both(graph: HloGraph, plan: FusionPlan, costs: CostModel, order: str = "program") -> SimResult:
    """run() and the fast step_time() must agree exactly."""
    sim = Simulator(graph, costs, CLUSTER)
    result = sim.run(plan, order)
    assert sim.step_time(plan, order) == result.step_time
    assert sim.result(plan, order).compute_time == result.compute_time
    return result


def spans(result: SimResult) -> dict[str, tuple[str, float, float]]:
    return {e.name: (e.stream, e.start, e.end) for e in result.timeline}


# -- hand-computed timelines ----------------------------------------------------------------------
@pytest.mark.fast
def test_chain():
    g = graph_of([("p", "parameter", []), ("a", "dot", ["p"]), ("b", "add", ["a"]), ("c", "exponential", ["b"])])
    r = run_both(g, OFF, FixedCosts({"a": 1, "b": 2, "c": 3}))
    assert spans(r) == {"a": ("compute", 0, 1), "b": ("compute", 1, 3), "c": ("compute", 3, 6)}
    assert (r.step_time, r.compute_time, r.comm_time, r.exposed_comm) == (6, 6, 0, 0)
    assert r.critical_path == ("a", "b", "c")


@pytest.mark.fast
def test_chain_fused_group_replaces_its_members():
    g = graph_of([("p", "parameter", []), ("a", "dot", ["p"]), ("b", "add", ["a"]), ("c", "exponential", ["b"])])
    costs = FixedCosts({"a": 1, "b": 2, "c": 3}, {frozenset({"b", "c"}): 2.5})
    r = run_both(g, make_plan([["b", "c"]]), costs)
    assert spans(r) == {"a": ("compute", 0, 1), "fusion.0": ("compute", 1, 3.5)}
    assert r.timeline[1].members == ("b", "c")
    assert (r.step_time, r.compute_time) == (3.5, 3.5)


@pytest.mark.fast
def test_diamond():
    g = graph_of([("p", "parameter", []), ("a", "dot", ["p"]), ("b", "add", ["a"]), ("c", "multiply", ["a"]),
                  ("d", "add", ["b", "c"])])
    r = run_both(g, OFF, FixedCosts({"a": 1, "b": 2, "c": 3, "d": 4}))
    assert spans(r) == {"a": ("compute", 0, 1), "b": ("compute", 1, 3), "c": ("compute", 3, 6),
                        "d": ("compute", 6, 10)}
    assert r.step_time == 10
    assert r.critical_path == ("a", "b", "c", "d")


@pytest.mark.fast
def test_comm_overlaps_later_compute():
    # k1 -> ar1 (comm 1..4) overlaps k2, k3; u1 waits for the compute stream, not the all-reduce.
    g = graph_of([("p", "parameter", []), ("k1", "dot", ["p"]), ("ar1", "all-reduce", ["k1"], 2),
                  ("k2", "dot", ["p"]), ("k3", "tanh", ["k2"]), ("u1", "add", ["ar1"])])
    r = run_both(g, FusionPlan(), FixedCosts({"k1": 1, "k2": 2, "k3": 3, "u1": 1}))
    assert spans(r) == {"k1": ("compute", 0, 1), "combined.0": ("comm", 1, 4), "k2": ("compute", 1, 3),
                        "k3": ("compute", 3, 6), "u1": ("compute", 6, 7)}
    assert (r.step_time, r.compute_time, r.comm_time, r.exposed_comm) == (7, 7, 3, 0)


@pytest.mark.fast
def test_kernel_waiting_on_collective_does_not_block_the_stream():
    # u1 needs ar1 (ends 4); k2, after u1 in program order but ready, runs while u1 waits.
    g = graph_of([("p", "parameter", []), ("k1", "dot", ["p"]), ("ar1", "all-reduce", ["k1"], 2),
                  ("u1", "add", ["ar1"]), ("k2", "dot", ["p"])])
    r = run_both(g, make_plan(buckets=[["ar1"]]), FixedCosts({"k1": 1, "u1": 1, "k2": 2}))
    assert spans(r) == {"k1": ("compute", 0, 1), "bucket.0": ("comm", 1, 4), "k2": ("compute", 1, 3),
                        "u1": ("compute", 4, 5)}
    assert (r.step_time, r.exposed_comm) == (5, 1)
    assert r.critical_path == ("k1", "bucket.0", "u1")


@pytest.mark.fast
def test_ready_kernels_run_in_program_order_when_several_are_ready():
    # At t=4 both u1 (position 3, ready at 4) and k3 (position 5, ready since 3) are ready: u1 first.
    g = graph_of([("p", "parameter", []), ("k1", "dot", ["p"]), ("ar1", "all-reduce", ["k1"], 2),
                  ("u1", "add", ["ar1"]), ("k2", "dot", ["p"]), ("k3", "dot", ["p"])])
    r = run_both(g, make_plan(buckets=[["ar1"]]), FixedCosts({"k1": 1, "u1": 1, "k2": 3, "k3": 1}))
    assert spans(r) == {"k1": ("compute", 0, 1), "bucket.0": ("comm", 1, 4), "k2": ("compute", 1, 4),
                        "u1": ("compute", 4, 5), "k3": ("compute", 5, 6)}


GRADS = [("p", "parameter", []), ("k1", "multiply", ["p"]), ("ar1", "all-reduce", ["k1"], 1),
         ("k2", "multiply", ["p"]), ("ar2", "all-reduce", ["k2"], 1), ("k3", "dot", ["p"]),
         ("u1", "add", ["ar1"]), ("u2", "add", ["ar2"])]
GRAD_TIMES = {"k1": 1, "k2": 2, "k3": 1, "u1": 1, "u2": 1}


@pytest.mark.fast
def test_separate_buckets_overlap():
    r = run_both(graph_of(GRADS), make_plan(buckets=[["ar1"], ["ar2"]]), FixedCosts(GRAD_TIMES))
    assert spans(r) == {"k1": ("compute", 0, 1), "bucket.0": ("comm", 1, 3), "k2": ("compute", 1, 3),
                        "bucket.1": ("comm", 3, 5), "k3": ("compute", 3, 4), "u1": ("compute", 4, 5),
                        "u2": ("compute", 5, 6)}
    assert (r.step_time, r.compute_time, r.comm_time, r.exposed_comm) == (6, 6, 4, 0)


@pytest.mark.fast
def test_without_overlap_collectives_hold_the_one_stream():
    """In-process CPU devices reduce with the threads that compute: with ``overlap=False`` a
    collective waits for the running kernel and nothing computes beside it."""
    g = graph_of(GRADS)
    sim = Simulator(g, FixedCosts(GRAD_TIMES), CLUSTER.replace(overlap=False))
    plan = make_plan(buckets=[["ar1"], ["ar2"]])
    r = sim.run(plan)
    assert sim.step_time(plan) == r.step_time
    assert spans(r) == {"k1": ("compute", 0, 1), "bucket.0": ("comm", 1, 3), "k2": ("compute", 3, 5),
                        "bucket.1": ("comm", 5, 7), "k3": ("compute", 7, 8), "u1": ("compute", 8, 9),
                        "u2": ("compute", 9, 10)}
    assert (r.step_time, r.compute_time, r.comm_time, r.exposed_comm) == (10, 6, 4, 4)
    # k2 waited for bucket.0 on the one stream: the collectives are on the path (their times sum to 10)
    assert r.critical_path == ("k1", "bucket.0", "k2", "bucket.1", "k3", "u1", "u2")


@pytest.mark.fast
def test_bucket_waits_for_its_last_gradient():
    r = run_both(graph_of(GRADS), make_plan(buckets=[["ar2", "ar1"]]), FixedCosts(GRAD_TIMES))
    assert spans(r)["bucket.0"] == ("comm", 3, 6)  # ready when k2 ends; 1 + (1 + 1) bytes
    assert spans(r)["u1"] == ("compute", 6, 7)
    assert (r.step_time, r.compute_time, r.comm_time, r.exposed_comm) == (8, 6, 3, 2)


@pytest.mark.fast
def test_buckets_none_is_one_combined_bucket():
    g = graph_of(GRADS)
    costs = FixedCosts(GRAD_TIMES)
    none = run_both(g, FusionPlan(), costs)
    one = run_both(g, make_plan(buckets=[["ar1", "ar2"]]), costs)
    assert [(e.stream, e.start, e.end, e.members) for e in none.timeline] == \
        [(e.stream, e.start, e.end, e.members) for e in one.timeline]
    assert spans(none)["combined.0"] == ("comm", 3, 6)


@pytest.mark.fast
def test_variadic_all_reduces_pay_the_operand_latency_and_concat_buckets_do_not():
    """XLA's combined all-reduce and "tuple" buckets are variadic: each operand after the first
    adds ``operand_latency`` (measured on XLA:CPU); a concat bucket of the same bytes does not."""
    g = graph_of(GRADS)
    costs = FixedCosts(GRAD_TIMES)
    cluster = CLUSTER.replace(operand_latency=0.5)
    none = Simulator(g, costs, cluster).run(FusionPlan())
    assert spans(none)["combined.0"] == ("comm", 3, 6.5)  # 1 + (1 + 1) bytes + 0.5 for ar1
    concat = Simulator(g, costs, cluster).run(make_plan(buckets=[["ar1", "ar2"]]))
    assert spans(concat)["bucket.0"] == ("comm", 3, 6)
    tuple_plan = FusionPlan(buckets=(Bucket(("ar1", "ar2"), "tuple"),))
    assert spans(Simulator(g, costs, cluster).run(tuple_plan))["bucket.0"] == ("comm", 3, 6.5)
    single = Simulator(g, costs, cluster).run(make_plan(buckets=[["ar1"], ["ar2"]]))
    assert single.comm_time == 4  # one operand each: nothing added


@pytest.mark.fast
def test_one_device_all_reduces_are_free_without_operand_latency():
    """With one device every collective is free (disco.sim.collectives), a variadic one too."""
    g = graph_of(GRADS)
    one = preset("local", devices=1, calibration={"operand_latency": 1e-3})
    sim = Simulator(g, AnalyticCosts(), one)
    for plan in (FusionPlan(), FusionPlan(buckets=(Bucket(("ar1", "ar2"), "tuple"),))):
        r = sim.run(plan)
        assert r.comm_time == 0.0 and r.step_time == r.compute_time


@pytest.mark.fast
def test_lower_bound_holds_for_rs_ag_buckets_on_a_tree():
    """A tree's reduce-scatter plus all-gather moves fewer bytes than its all-reduce: the bound
    takes the cheaper of the two, so an "rs_ag" plan never beats it."""
    from disco.sim.cluster import LinkSpec

    g = graph_of([("p", "parameter", []), ("a", "dot", ["p"]), ("ar1", "all-reduce", ["a"], 40_000_000),
                  ("u", "add", ["ar1"])])
    slow = LinkSpec(1e8, 5e-6)
    sim = Simulator(g, AnalyticCosts(), preset("dgx-a100-8").replace(algorithm="tree", intra=slow, inter=slow))
    rs_ag = sim.step_time(make_plan(buckets=[["ar1"]], build="rs_ag"))
    assert rs_ag < sim.step_time(FusionPlan())
    assert rs_ag >= sim.lower_bound()


@pytest.mark.fast
def test_rs_ag_buckets_are_a_reduce_scatter_then_an_all_gather():
    """An "rs_ag" bucket costs reduce-scatter + all-gather of its bytes (each 1 + 2 here), also
    when it holds one gradient: the rewrite replaces that all-reduce too."""
    g = graph_of(GRADS)
    costs = FixedCosts(GRAD_TIMES)
    both = run_both(g, FusionPlan(buckets=(Bucket(("ar1", "ar2"), "rs_ag"),)), costs)
    assert spans(both)["bucket.0"] == ("comm", 3, 9)
    assert both.comm_time == 6
    single = run_both(g, FusionPlan(buckets=(Bucket(("ar1",), "rs_ag"), Bucket(("ar2",), "concat"))), costs)
    assert spans(single)["bucket.0"] == ("comm", 1, 5) and spans(single)["bucket.1"] == ("comm", 5, 7)
    assert single.comm_time == 4 + 2


@pytest.mark.fast
def test_a_calibrated_rs_ag_scale_prices_rs_ag_buckets_and_nothing_else():
    g = graph_of(GRADS)
    costs = FixedCosts(GRAD_TIMES)
    plan = FusionPlan(buckets=(Bucket(("ar1",), "rs_ag"), Bucket(("ar2",), "concat")))
    base = Simulator(g, costs, CLUSTER).result(plan)
    scaled = Simulator(g, costs, CLUSTER.replace(rs_ag_scale=2.0)).result(plan)
    # the rs_ag bucket's reduce-scatter and all-gather (2 + 2) twice, ar2's all-reduce (2) once
    assert (base.comm_time, scaled.comm_time) == (4 + 2, 8 + 2)


@pytest.mark.fast
def test_buckets_none_splits_dependent_all_reduces_by_level():
    # ar2 depends on ar1 (through k2): one bucket would deadlock, the combiner makes two.
    g = graph_of([("p", "parameter", []), ("k1", "dot", ["p"]), ("ar1", "all-reduce", ["k1"], 1),
                  ("k2", "add", ["ar1"]), ("ar2", "all-reduce", ["k2"], 1)])
    r = run_both(g, FusionPlan(), FixedCosts({"k1": 1, "k2": 1}))
    assert spans(r) == {"k1": ("compute", 0, 1), "combined.0": ("comm", 1, 3), "k2": ("compute", 3, 4),
                        "combined.1": ("comm", 4, 6)}


@pytest.mark.fast
def test_group_out_of_program_order_waits_for_its_inputs():
    # Group {x, c}: first member x comes before b, but c reads b; the fusion runs after b.
    g = graph_of([("p", "parameter", []), ("x", "negate", ["p"]), ("b", "dot", ["p"]), ("c", "add", ["b", "x"]),
                  ("d", "dot", ["c"])])
    plan = make_plan([["x", "c"]])
    validate(plan, g)
    r = run_both(g, plan, FixedCosts({"x": 1, "b": 2, "c": 3, "d": 1}, {frozenset({"x", "c"}): 4}))
    assert spans(r) == {"b": ("compute", 0, 2), "fusion.0": ("compute", 2, 6), "d": ("compute", 6, 7)}


@pytest.mark.fast
def test_zero_cost_ops_take_no_time_and_pass_dependencies():
    g = graph_of([("p", "parameter", []), ("k", "dot", ["p"]), ("ar", "all-reduce", ["k"], 2),
                  ("t", "tuple", ["ar"]), ("gte", "get-tuple-element", ["t"]), ("u", "add", ["gte"]),
                  ("c", "constant", []), ("v", "multiply", ["c", "p"])])
    r = run_both(g, FusionPlan(), FixedCosts({"k": 1, "u": 1, "v": 1}))
    # u waits for the all-reduce through the tuple; v, later in program order, runs meanwhile.
    assert spans(r) == {"k": ("compute", 0, 1), "combined.0": ("comm", 1, 4), "v": ("compute", 1, 2),
                        "u": ("compute", 4, 5)}


# -- XLA's fusion (xla_fusion="extend") ------------------------------------------------------------
@pytest.mark.fast
def test_extend_fuses_elementwise_chains_into_their_consumers():
    # b -> c -> d (single users) fuse into d's fusion; the dot stays a kernel of its own.
    g = graph_of([("p", "parameter", []), ("a", "dot", ["p"]), ("b", "add", ["a"]), ("c", "exponential", ["b"]),
                  ("d", "multiply", ["c", "p"])])
    costs = FixedCosts({"a": 1, "b": 2, "c": 3, "d": 1}, {frozenset({"b", "c", "d"}): 2.5})
    r = run_both(g, FusionPlan(), costs)
    assert spans(r) == {"a": ("compute", 0, 1), "xla_fusion(d)": ("compute", 1, 3.5)}
    assert r.timeline[1].members == ("b", "c", "d")
    assert Simulator(g, costs, CLUSTER).fusions(FusionPlan()) == [("a",), ("b", "c", "d")]
    assert run_both(g, OFF, costs).step_time == 7


@pytest.mark.fast
def test_extend_keeps_producers_with_users_in_different_fusions_and_outputs():
    # b feeds a dot and c: it roots its own kernel; c is a step output (tuple): not fused into anything.
    g = graph_of([("p", "parameter", []), ("a", "negate", ["p"]), ("b", "add", ["a"]), ("c", "tanh", ["b"]),
                  ("d", "dot", ["b"]), ("t", "tuple", ["c", "d"])])
    sim = Simulator(g, FixedCosts({}), CLUSTER)
    assert sim.fusions(FusionPlan()) == [("a", "b"), ("c",), ("d",)]


@pytest.mark.fast
def test_extend_duplicates_broadcasts_into_every_consumer():
    # The broadcast's users are both elementwise: it is inlined into both (no kernel of its own);
    # each consumer reads the broadcast's input (4 bytes), never the broadcast's 64 bytes.
    g = graph_of([("p", "parameter", [], 64), ("s", "parameter", [], 4), ("bc", "broadcast", ["s"], 64),
                  ("x", "add", ["p", "bc"], 64), ("y", "dot", ["x"], 64), ("z", "multiply", ["y", "bc"], 64)])
    costs = AnalyticCosts()
    sim = Simulator(g, costs, CLUSTER)
    assert sim.fusions(FusionPlan()) == [("x",), ("y",), ("z",)]
    r = sim.run(FusionPlan())
    x_time = costs.kernel_time(Kernel(nodes=(g.nodes[2], g.nodes[3]), in_bytes=64 + 4, out_bytes=64))
    assert spans(r)["x"] == ("compute", 0, x_time)
    assert len(Simulator(g, costs, CLUSTER).fusions(OFF)) == 4  # "off": the broadcast is a kernel


@pytest.mark.fast
def test_extend_grows_planned_groups():
    # Plan {b, c}; XLA fuses a into it (a's only user is in the group) and the group into d.
    g = graph_of([("p", "parameter", []), ("a", "negate", ["p"]), ("b", "add", ["a"]), ("c", "exponential", ["b"]),
                  ("d", "multiply", ["c"]), ("e", "dot", ["d"])])
    costs = FixedCosts({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, {frozenset({"a", "b", "c", "d"}): 1.5})
    sim = Simulator(g, costs, CLUSTER)
    plan = make_plan([["b", "c"]])
    assert sim.fusions(plan) == [("a", "b", "c", "d"), ("e",)]
    r = run_both(g, plan, costs)
    assert spans(r) == {"fusion.0": ("compute", 0, 1.5), "e": ("compute", 1.5, 2.5)}
    off = run_both(g, make_plan([["b", "c"]], xla_fusion="off"), costs)
    assert [e.name for e in off.timeline] == ["a", "fusion.0", "d", "e"]


@pytest.mark.fast
def test_topological_order_runs_the_critical_path_first():
    # Program order runs the long independent kernel first; critical-path order starts the gradient.
    g = graph_of([("p", "parameter", []), ("a", "dot", ["p"]), ("g", "multiply", ["p"]),
                  ("ar", "all-reduce", ["g"], 4), ("u", "add", ["ar"])])
    costs = FixedCosts({"a": 5, "g": 1, "u": 1})
    prog = run_both(g, FusionPlan(), costs, "program")
    topo = run_both(g, FusionPlan(), costs, "topological")
    assert prog.step_time == 12
    assert spans(topo) == {"g": ("compute", 0, 1), "combined.0": ("comm", 1, 6), "a": ("compute", 1, 6),
                           "u": ("compute", 6, 7)}


@pytest.mark.fast
def test_compute_speed_scales_kernels_not_comm():
    g = graph_of([("p", "parameter", []), ("k1", "dot", ["p"]), ("ar1", "all-reduce", ["k1"], 2)])
    fast = preset("local", calibration={"compute_speed": 2.0})
    r = Simulator(g, FixedCosts({"k1": 4}), fast).run(FusionPlan())
    assert spans(r) == {"k1": ("compute", 0, 2), "combined.0": ("comm", 2, 5)}


@pytest.mark.fast
def test_chrome_trace_structure():
    r = run_both(graph_of(GRADS), make_plan(buckets=[["ar1"], ["ar2"]]), FixedCosts(GRAD_TIMES))
    trace = json.loads(r.to_chrome_trace_json())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(r.timeline) == 7
    names = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"compute": 0, "comm": 1}
    bucket = next(e for e in xs if e["name"] == "bucket.1")
    assert (bucket["tid"], bucket["ts"], bucket["dur"], bucket["args"]["members"]) == (1, 3e6, 2e6, ["ar2"])
    assert all({"name", "ph", "pid", "tid", "ts", "dur"} <= set(e) for e in xs)
    assert trace["otherData"]["step_time_s"] == r.step_time


@pytest.mark.fast
def test_simulate_wrapper_and_lower_bound_with_analytic_costs():
    g = graph_of(GRADS)
    r = simulate(g, FusionPlan(), AnalyticCosts(), preset("dgx-a100-8"))
    assert isinstance(r.timeline[0], Event)
    assert r.step_time >= lower_bound(g, AnalyticCosts(), preset("dgx-a100-8")) > 0


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("plan, message", [
    (make_plan([["nope"]]), r"group 0: instruction 'nope' is not in the graph 't'"),
    (make_plan([["k1"], ["k1", "k2"]]), r"group 1: instruction 'k1' is already in group 0"),
    (make_plan(buckets=[["k1"]]), r"bucket 0: expected all-reduce instruction names, got \['k1'\]"),
    (make_plan(buckets=[["ar1"], ["ar1", "ar2"]]), r"bucket 1: instruction 'ar1' is already in bucket 0"),
    (make_plan([["ar1"]]), r"group 0: 'ar1' is a collective"),
])
def test_bad_plans_raise(plan, message):
    sim = Simulator(graph_of(GRADS), FixedCosts(GRAD_TIMES), CLUSTER)
    with pytest.raises(ValueError, match=message):
        sim.step_time(plan)


@pytest.mark.fast
def test_cycle_raises_and_unknown_order():
    g = graph_of([("p", "parameter", []), ("a", "negate", ["p"]), ("b", "dot", ["a"]), ("c", "add", ["b"])])
    sim = Simulator(g, FixedCosts({}), CLUSTER)
    with pytest.raises(ValueError, match=r"cycle through \['a', 'b', 'c'\]"):
        sim.step_time(make_plan([["a", "c"]]))
    with pytest.raises(ValueError, match=r"order: expected one of program, topological, got 'random'"):
        sim.run(FusionPlan(), "random")


# -- properties ---------------------------------------------------------------------------------
_OPS = ("add", "multiply", "tanh", "negate", "add", "tanh", "dot", "all-reduce", "all-reduce", "get-tuple-element")


@st.composite
def dags(draw):
    n = draw(st.integers(2, 14))
    spec = [("p0", "parameter", [], 4)]
    times = {}
    for i in range(1, n):
        op = draw(st.sampled_from(_OPS))
        k = 1 if op in ("all-reduce", "get-tuple-element", "tanh", "negate") else draw(st.integers(1, 2))
        ops = draw(st.lists(st.integers(0, i - 1), min_size=k, max_size=k))
        if draw(st.booleans()):  # bias towards chains, where fusion candidates are
            ops[0] = i - 1
        ops = sorted(set(ops))
        spec.append((f"n{i}", op, [spec[j][0] for j in ops], draw(st.integers(0, 8))))
        times[f"n{i}"] = draw(st.integers(0, 6))
    g = graph_of(spec)
    # Random pairs s -> d where d is s's only user (one output per fusion); d's other inputs may
    # come after s (the fusion then waits past its program position); cyclic plans are skipped.
    succs = {i: {d for s, d in g.edges if s == i} for i in range(n)}
    used: set[int] = set()
    groups = []
    for s, d in g.edges:
        ok = {g.nodes[s].opcode, g.nodes[d].opcode} <= FUSIBLE_OPCODES and succs[s] == {d}
        if ok and s not in used and d not in used and draw(st.booleans()):
            used |= {s, d}
            groups.append((g.nodes[s].name, g.nodes[d].name))
    ars = [nd.name for nd in g.nodes if nd.is_all_reduce]
    split = draw(st.integers(0, len(ars)))
    buckets = draw(st.sampled_from([None, [ars[:split], ars[split:]], [[a] for a in ars]]))
    buckets = None if buckets is None else [b for b in buckets if b]
    fused = {frozenset(gr): draw(st.integers(0, 8)) for gr in groups}
    return g, make_plan(groups, buckets), FixedCosts(times, fused)


def longest_chain(result: SimResult, graph: HloGraph) -> float:
    """Longest path of event durations through the contracted data dependencies."""
    index = graph.index()
    event_of = {}
    for k, e in enumerate(result.timeline):
        for m in e.members:
            event_of[m] = k
    preds: dict[int, set[int]] = {k: set() for k in range(len(result.timeline))}

    def real_sources(i: int, seen: set[int]) -> set[int]:
        out = set()
        for s, d in graph.edges:
            if d == i and s not in seen:
                seen.add(s)
                if graph.nodes[s].name in event_of:
                    out.add(event_of[graph.nodes[s].name])
                else:
                    out |= real_sources(s, seen)
        return out

    for k, e in enumerate(result.timeline):
        for m in e.members:
            preds[k] |= real_sources(index[m], set()) - {k}
    best: dict[int, float] = {}
    for k in sorted(preds, key=lambda k: result.timeline[k].start):
        e = result.timeline[k]
        best[k] = e.duration + max((best.get(p, 0.0) for p in preds[k]), default=0.0)
    return max(best.values(), default=0.0)


@pytest.mark.fast
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.sampled_from(["program", "topological"]), st.booleans())
def test_step_time_bounds_hold_on_random_dags(case, order, overlap):
    g, plan, costs = case
    try:
        validate(plan, g)
    except ValueError:  # buckets of dependent all-reduces
        assume(False)
    sim = Simulator(g, costs, CLUSTER.replace(overlap=overlap))
    r = sim.run(plan, order)
    assert sim.step_time(plan, order) == r.step_time
    assert math.isclose(sum(e.duration for e in r.timeline if e.stream == "compute"), r.compute_time)
    assert math.isclose(sum(e.duration for e in r.timeline if e.stream == "comm"), r.comm_time)
    assert r.step_time >= max(r.compute_time, r.comm_time) - 1e-9
    assert r.step_time >= longest_chain(r, g) - 1e-9
    assert r.step_time >= sim.lower_bound() - 1e-9
    for stream in ("compute", "comm"):  # each stream runs one thing at a time
        evs = sorted((e for e in r.timeline if e.stream == stream), key=lambda e: e.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(evs, evs[1:]))
    if not overlap:  # one stream: nothing computes while a collective runs
        assert r.step_time >= r.compute_time + r.comm_time - 1e-9
        evs = sorted(r.timeline, key=lambda e: e.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(evs, evs[1:]))
    if order == "program":  # the compute stream is in program (first compute member) order
        assert not r.critical_path or r.critical_path[-1] in {e.name for e in r.timeline}
    if r.timeline:  # the critical path runs from 0 to the step time without gaps
        by_name = {e.name: e for e in r.timeline}
        path = [by_name[name] for name in r.critical_path]
        assert path[0].start == 0 and path[-1].end == r.step_time
        assert all(math.isclose(a.end, b.start, abs_tol=1e-12) for a, b in zip(path, path[1:]))


def test_simulate_refuses_arguments_of_the_wrong_type():
    import disco
    import trax_models
    from disco.plans import baselines

    step, args = trax_models.make_train_step("mlp", "tiny", devices=2)
    graph = disco.extract(step, *args)
    plan, costs, cluster = baselines.make("ddp", graph), AnalyticCosts(), preset("local", devices=2)
    assert simulate(graph, plan, costs, cluster).step_time > 0
    with pytest.raises(TypeError, match=r"^plan: expected a disco FusionPlan, got dict"):
        simulate(graph, plan.to_dict(), costs, cluster)
    with pytest.raises(TypeError, match=r"^Simulator: cluster: expected a ClusterSpec, got str 'local' \(disco\.sim\.cluster\.preset"):
        simulate(graph, plan, costs, "local")
    with pytest.raises(TypeError, match=r"^Simulator: costs: expected a disco\.sim\.costs\.CostModel, got NoneType"):
        Simulator(graph, None, cluster)
    with pytest.raises(TypeError, match=r"^Simulator: graph: expected a disco HloGraph \(disco\.extract\(step, \*args\)\), got str"):
        lower_bound(graph.name, costs, cluster)

"""The simulator prices a plan's gather buckets: one all-gather of the members' summed gathered bytes."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disco.ir.graph import HloGraph, Node
from disco.plans import baselines, moves
from disco.plans.plan import FusionPlan, make_plan
from disco.sim import collectives
from disco.sim.cluster import preset
from disco.sim.costs import AnalyticCosts
from disco.sim.simulator import Simulator

CLUSTER = preset("2x8-100gbe")  # 16 devices over two nodes: both link kinds in the alpha-beta terms
FSDP = "{{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}}"


def graph_of(spec: list[tuple[str, str, tuple[str, ...], int]]) -> HloGraph:
    """(name, opcode, operands, out_bytes) rows -> HloGraph; edges from operands."""
    nodes, index = [], {}
    for name, op, operands, nbytes in spec:
        index[name] = len(nodes)
        coll = op in ("all-gather", "all-reduce")
        nodes.append(Node(name=name, opcode=op, computation="main", shape=f"f32[{nbytes // 4}]", dtype="f32",
                          out_bytes=nbytes, out_elements=nbytes // 4, flops=1e6 if op == "dot" else 0.0,
                          operands=operands, replica_groups=FSDP if coll else None,
                          reduction="add" if op == "all-reduce" else None))
    edges = tuple((index[o], i) for i, n in enumerate(nodes) for o in n.operands)
    return HloGraph(name="g", nodes=tuple(nodes), edges=edges, fingerprint="g")


def tiny() -> HloGraph:
    """Two parameter shards, each gathered (1 KiB and 4 KiB gathered), a dot of both, its output."""
    return graph_of([("p1", "parameter", (), 64), ("p2", "parameter", (), 256),
                     ("g1", "all-gather", ("p1",), 1024), ("g2", "all-gather", ("p2",), 4096),
                     ("d", "dot", ("g1", "g2"), 1024), ("out", "tuple", ("d",), 0)])


@functools.lru_cache(maxsize=None)
def fsdp_mlp() -> HloGraph:
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, style="fsdp", optimizer="sgd")
    return disco.extract(step, *args)


@pytest.mark.fast
def test_a_gather_bucket_is_one_all_gather_of_the_summed_bytes():
    g = tiny()
    sim = Simulator(g, AnalyticCosts(), CLUSTER)
    alone = sim.run(FusionPlan())
    bucket = sim.run(make_plan(gather_buckets=[["g1", "g2"]]))
    ag = functools.partial(collectives.collective_time, "all-gather", cluster=CLUSTER)
    assert alone.comm_time == pytest.approx(ag(1024) + ag(4096), rel=1e-12)
    assert bucket.comm_time == pytest.approx(ag(1024 + 4096), rel=1e-12)
    comm = [e for e in bucket.timeline if e.stream == "comm"]
    assert [(e.name, e.members) for e in comm] == [("gather_bucket.0", ("g1", "g2"))]
    # ready at 0 (its inputs are parameters), the dot after it: the step is the gather then the dot
    dot = next(e for e in bucket.timeline if e.members == ("d",))
    assert comm[0].start == 0.0 and dot.start == comm[0].end
    assert bucket.step_time == pytest.approx(ag(5120) + dot.duration, rel=1e-12)
    assert bucket.step_time < alone.step_time  # one latency term fewer
    # a bucket of one is the all-gather itself; so are the all-gathers in no bucket
    for plan in (make_plan(gather_buckets=[["g1"]]), make_plan(gather_buckets=[])):
        assert sim.step_time(plan) == alone.step_time
    assert sim.lower_bound() <= bucket.step_time


@pytest.mark.fast
@pytest.mark.parametrize(("buckets", "match"), [
    ([["d", "g1"]], r"gather bucket 0: expected all-gather instruction names, got \['d'\]"),
    ([["g1", "nope"]], r"gather bucket 0: instruction 'nope' is not in the graph"),
    ([["g1", "g2"], ["g2"]], r"gather bucket 1: all-gather 'g2' is already in gather bucket 0"),
])
def test_a_gather_bucket_the_simulator_cannot_price_is_named(buckets, match):
    with pytest.raises(ValueError, match=match):
        Simulator(tiny(), AnalyticCosts(), CLUSTER).step_time(make_plan(gather_buckets=buckets))


@pytest.mark.fast
def test_a_gather_bucket_below_an_all_reduce_splits_xla_s_combined_all_reduce_by_level():
    """g1 gathers r1's result and shares a bucket with g2, whose reader feeds r2: one combined
    all-reduce of r1 and r2 would wait on the bucket that waits on it, so (as with groups) the
    combiner is priced one bucket per level of the contracted graph."""
    g = graph_of([("x", "parameter", (), 1024), ("p", "parameter", (), 256),
                  ("r1", "all-reduce", ("x",), 1024), ("g1", "all-gather", ("r1",), 4096),
                  ("g2", "all-gather", ("p",), 4096), ("y", "dot", ("g2",), 1024),
                  ("r2", "all-reduce", ("y",), 1024), ("out", "tuple", ("g1", "r2"), 0)])
    plan = make_plan(gather_buckets=[["g1", "g2"]]).validate(g)
    sim = Simulator(g, AnalyticCosts(), CLUSTER)
    levels = plan.replace(buckets=make_plan(buckets=[["r1"], ["r2"]]).buckets)
    assert sim.step_time(plan) == sim.step_time(levels)
    comm = [e.name for e in sim.run(plan).timeline if e.stream == "comm"]
    assert comm == ["combined.0", "gather_bucket.0", "combined.1"]


@pytest.mark.parametrize("cluster", ["local", "2x8-100gbe"])
def test_one_gather_bucket_prices_below_xla_default_on_an_fsdp_step_by_the_summed_bytes(cluster):
    """mlp tiny in fsdp style (1 x 8): every parameter all-gather in one bucket saves all but one
    all-gather's latency; the comm time falls by exactly the singles' time less the bucket's."""
    g = fsdp_mlp()
    spec = preset(cluster)
    sim = Simulator(g, AnalyticCosts(), spec)
    default, one = baselines.make("xla_default", g), baselines.make("one_gather_bucket", g)
    (members,) = one.gather_buckets
    assert len(members) == 17  # every parameter's
    sizes = [n.out_bytes for n in g.nodes if n.name in set(members)]
    ag = functools.partial(collectives.collective_time, "all-gather", cluster=spec)  # one group: all the devices
    r_default, r_one = sim.result(default), sim.result(one)
    assert r_default.comm_time - r_one.comm_time == pytest.approx(sum(map(ag, sizes)) - ag(sum(sizes)), rel=1e-9)
    assert r_one.step_time < r_default.step_time
    per_layer = sim.result(baselines.make("per_layer_gathers", g))
    assert r_one.step_time <= per_layer.step_time < r_default.step_time
    assert sim.lower_bound() <= r_one.step_time


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds=st.lists(st.integers(0, 2**31), min_size=1, max_size=30))
def test_gather_bucket_plans_stay_above_the_lower_bound_and_price_as_their_timeline(seeds):
    g = fsdp_mlp()
    sim = Simulator(g, AnalyticCosts(), preset("local"))
    ctx = moves.context(g)
    plan = moves.canonical(baselines.make("xla_default", g), ctx)
    bound = sim.lower_bound()
    for s in seeds:
        rng = random.Random(s)
        move = rng.choice(["merge_gather_buckets", "split_gather_bucket", "merge_buckets", "fuse"])
        plan = moves.MOVES[move](plan, ctx, rng) or plan
    run = sim.run(plan)
    assert bound <= run.step_time == sim.step_time(plan)
    buckets = [e for e in run.timeline if e.name.startswith("gather_bucket.")]
    assert len(buckets) == sum(len(b) > 1 for b in plan.gather_buckets or ())
    assert sorted(m for e in buckets for m in e.members) == sorted(m for b in plan.gather_buckets or () for m in b)

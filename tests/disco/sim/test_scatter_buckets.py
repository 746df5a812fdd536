"""The simulator prices a "scatter" bucket as one reduce-scatter of its members' summed (whole) bytes over
their replica group: below the "concat" bucket's all-reduce on more than one device; the incremental
simulator re-patches a switch to and from it exactly; the lower bound stays below it."""

from __future__ import annotations

import functools
import random

import pytest

from disco.ir.graph import HloGraph
from disco.ir.replica_groups import replica_group_lists
from disco.plans import baselines, moves
from disco.plans.plan import Bucket, FusionPlan
from disco.sim import collectives
from disco.sim.cluster import preset
from disco.sim.costs import AnalyticCosts
from disco.sim.delta import DeltaSimulator
from disco.sim.simulator import Simulator
from tests.support.fsdp_hlo import fsdp_text

CLUSTERS = {"2x8-100gbe": preset("2x8-100gbe"), "h100-sxm-8": preset("h100-sxm-8")}


@functools.cache
def graph(n_groups: int = 2) -> HloGraph:
    return HloGraph.from_hlo_text(fsdp_text(n_groups=n_groups, shard=(256, 64)))


@functools.cache
def data_x_fsdp(fsdp: int = 4, data: int = 2) -> HloGraph:
    """A data x fsdp mesh's gradient scatter: reduced over all devices, sliced by the fsdp position."""
    return HloGraph.from_hlo_text(fsdp_text(p=fsdp * data, blocks=fsdp, positions=list(range(fsdp)) * data,
                                            shard=(256, 64)))


@pytest.mark.fast
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize("n_groups", [1, 2])
def test_a_scatter_bucket_is_one_reduce_scatter_cheaper_than_the_concat_buckets_all_reduce(cluster, n_groups):
    g = graph(n_groups)
    c = CLUSTERS[cluster]
    sim = Simulator(g, AnalyticCosts(), c)
    ar = next(n for n in g.nodes if n.name == "ar")
    over = collectives.over_group(c, replica_group_lists(ar.replica_groups))
    results = {}
    for build in ("concat", "scatter"):
        plan = FusionPlan(buckets=(Bucket(("ar",), build), Bucket(("loss",), "concat")))
        res = sim.run(plan)
        (event,) = [e for e in res.timeline if e.stream == "comm" and "ar" in e.members]
        results[build] = (event.duration, res.step_time)
    rs = collectives.collective_time("reduce-scatter", ar.out_bytes, over)
    assert results["scatter"][0] == pytest.approx(rs, rel=1e-12)
    assert results["concat"][0] == pytest.approx(collectives.collective_time("all-reduce", ar.out_bytes, over),
                                                 rel=1e-12)
    assert results["scatter"][0] < results["concat"][0] and results["scatter"][1] < results["concat"][1]
    assert sim.lower_bound() <= results["scatter"][1]


@pytest.mark.fast
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize(("fsdp", "data"), [(4, 2), (8, 2), (2, 4)])
def test_a_data_x_fsdp_scatter_bucket_is_a_reduce_scatter_over_fsdp_then_an_all_reduce_of_the_shard_over_data(
        cluster, fsdp, data):
    g = data_x_fsdp(fsdp, data)
    c = CLUSTERS[cluster]
    sim = Simulator(g, AnalyticCosts(), c)
    ar = next(n for n in g.nodes if n.name == "ar")
    (blk,) = [b for b in g.scatter_blocks if b.all_reduce == "ar"]
    res = sim.run(FusionPlan(buckets=(Bucket(("ar",), "scatter"), Bucket(("loss",), "concat"))))
    (event,) = [e for e in res.timeline if e.stream == "comm" and "ar" in e.members]
    fsdp_group = collectives.over_group(c, blk.scatter_groups)
    data_group = collectives.over_group(c, blk.across_groups)
    assert (fsdp_group.num_devices, data_group.num_devices) == (fsdp, data)
    expected = (collectives.collective_time("reduce-scatter", ar.out_bytes, fsdp_group)
                + collectives.collective_time("all-reduce", ar.out_bytes / fsdp, data_group))
    assert event.duration == pytest.approx(expected, rel=1e-12)
    assert sim.lower_bound() <= res.step_time


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize("data_x_fsdp_mesh", [False, True])
def test_switching_to_and_from_scatter_is_repatched_exactly(cluster, data_x_fsdp_mesh):
    g = data_x_fsdp() if data_x_fsdp_mesh else graph()
    sim = Simulator(g, AnalyticCosts(), CLUSTERS[cluster])
    ref = Simulator(g, AnalyticCosts(), CLUSTERS[cluster])
    ctx = moves.context(g, sim.backend)
    delta = DeltaSimulator(sim)
    cur = moves.canonical(baselines.make("scatter_buckets", g), ctx)
    assert delta.step_time(cur) == ref.step_time(cur)
    rng = random.Random(0)
    seen = set()
    for _ in range(12):
        child = moves.switch_build(cur, ctx, rng)
        assert delta.step_time(child, parent=cur) == ref.step_time(child)
        seen.add(child.buckets[0].build)
        cur = child
    assert seen == {"concat", "scatter", "rs_ag"}

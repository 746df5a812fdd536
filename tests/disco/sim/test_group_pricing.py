"""A collective over a part of the devices (one axis of a 2-D mesh) is priced over its replica group."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disco.plans.plan import FusionPlan
from disco.sim import collectives
from disco.sim.cluster import preset
from disco.sim.costs import AnalyticCosts
from disco.sim.simulator import Simulator
from tests.disco.sim.test_gather_buckets import graph_of

CLUSTER = preset("2x8-100gbe")  # 2 nodes x 8: groups within a node and across the nodes price differently


FOUR = [tuple(range(i, i + 4)) for i in range(0, 16, 4)]  # 4 groups of 4, two on each node
PAIRS = [(i, i + 8) for i in range(8)]  # 8 groups of 2, each across the nodes


@pytest.mark.fast
def test_a_group_within_a_node_is_priced_on_its_devices_over_the_intra_link():
    within = collectives.over_group(CLUSTER, FOUR)
    assert (within.nodes, within.devices_per_node) == (1, 4)
    assert within.intra == CLUSTER.intra
    across = collectives.over_group(CLUSTER, PAIRS)
    assert (across.nodes, across.devices_per_node) == (2, 1)
    # no groups, or one (a replicated step's: all its devices, maybe fewer than the cluster's): the cluster
    assert collectives.over_group(CLUSTER, None) is CLUSTER
    assert collectives.over_group(CLUSTER, [tuple(range(16))]) is CLUSTER
    assert collectives.over_group(CLUSTER, [(0, 1)]) is CLUSTER
    n = 1 << 20
    # a ring over 4 devices of one node against the 16-device cluster's ring over the bottleneck link
    assert collectives.all_gather_time(n, within) == pytest.approx(
        3 * CLUSTER.intra.latency + 3 / 4 * n / CLUSTER.intra.bandwidth, rel=1e-12)
    assert collectives.all_gather_time(n, within) < collectives.all_gather_time(n, CLUSTER)


@given(st.integers(1, 16).filter(lambda k: 16 % k == 0), st.permutations(range(16)))
def test_a_groups_cluster_holds_the_group(size, order):
    groups = [tuple(order[i:i + size]) for i in range(0, 16, size)]
    c = collectives.over_group(CLUSTER, groups)
    assert c.num_devices >= size
    assert c.nodes == (CLUSTER.nodes if len(groups) == 1 else len({d // 8 for d in groups[0]}))
    assert c.num_devices <= CLUSTER.num_devices


def _one_gather(groups: str | None):
    """A parameter shard gathered (4 KiB) over ``groups`` (None: graph_of's 16 devices), then a dot."""
    g = graph_of([("p1", "parameter", (), 256), ("g1", "all-gather", ("p1",), 4096),
                  ("d", "dot", ("g1",), 1024), ("out", "tuple", ("d",), 0)])
    if groups is None:
        return g
    return dataclasses.replace(g, nodes=tuple(dataclasses.replace(n, replica_groups=groups)
                                              if n.opcode == "all-gather" else n for n in g.nodes))


@pytest.mark.fast
def test_the_simulator_prices_an_all_gather_over_its_replica_group():
    fsdp4 = _one_gather("{{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}")
    whole = Simulator(_one_gather(None), AnalyticCosts(), CLUSTER).run(FusionPlan())
    part = Simulator(fsdp4, AnalyticCosts(), CLUSTER).run(FusionPlan())
    ag = functools.partial(collectives.all_gather_time, 4096)
    assert whole.comm_time == pytest.approx(ag(CLUSTER), rel=1e-12)
    assert part.comm_time == pytest.approx(ag(collectives.over_group(CLUSTER, FOUR)), rel=1e-12)
    assert part.comm_time < whole.comm_time
    sim = Simulator(fsdp4, AnalyticCosts(), CLUSTER)
    assert sim.lower_bound() <= sim.step_time(FusionPlan()) * (1 + 1e-12)


@functools.lru_cache(maxsize=None)
def _fsdp_2x4():
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, style="fsdp", mesh_shape=(2, 4),
                                             optimizer="sgd")
    return disco.extract(step, *args)


def test_a_2x4_fsdp_steps_gathers_are_priced_over_four_devices_and_the_bound_holds():
    """mlp tiny on a 2 x 4 mesh: its parameter gathers span "fsdp" (4 of the 8 devices)."""
    graph = _fsdp_2x4()
    cluster = preset("h100-sxm-8")
    sim = Simulator(graph, AnalyticCosts(), cluster)
    gathers = [c for c in graph.collective_roles() if c.role == "param_gather"]
    assert gathers and all(c.group_size == 4 for c in gathers)
    builder = sim._patcher.builder
    index = graph.index()
    assert {builder.group_cluster(index[c.name]).num_devices for c in gathers} == {4}
    from disco.plans import baselines

    for name in ("xla_default", "one_gather_bucket", "per_tensor", "one_bucket"):
        assert sim.lower_bound() <= sim.step_time(baselines.make(name, graph)) * (1 + 1e-12), name

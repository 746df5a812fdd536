"""Tests for disco.sim.costs (kernel cost models) and disco.sim.collectives (alpha-beta formulas)."""

from __future__ import annotations

import json
import math

import pytest

from disco.sim import collectives
from disco.sim.cluster import ClusterSpec, LinkSpec
from disco.sim.costs import (AnalyticConfig, AnalyticCosts, CostModel, GraphKernels, TableCosts, kernel_key,
                         kernel_of, load_costs)
from disco.ir.graph import HloGraph, Node

pytestmark = pytest.mark.fast


def _graph() -> HloGraph:
    # p (400 B) -> a = exp(p) -> b = add(a, c) -> d = dot(b)   with c a 4-byte constant
    rows = [("p", "parameter", (), 0), ("c", "constant", (), 0), ("a", "exponential", ("p",), 100),
            ("b", "add", ("a", "c"), 100), ("d", "dot", ("b",), 10_000)]
    nodes, idx = [], {}
    for name, op, ops, flops in rows:
        idx[name] = len(nodes)
        nodes.append(Node(name=name, opcode=op, computation="main", shape="f32[100]" if name != "c" else "f32[]",
                          dtype="f32", out_bytes=400 if name != "c" else 4, out_elements=100, flops=flops,
                          operands=ops))
    edges = tuple(sorted((idx[o], idx[n.name]) for n in nodes for o in n.operands))
    return HloGraph("g", tuple(nodes), edges, "x")


COSTS = AnalyticCosts(AnalyticConfig(peak_flops=100.0, mem_bandwidth=400.0, launch_overhead=0.5))


def test_kernel_bytes_count_outside_inputs_and_outputs():
    gk = GraphKernels(_graph())
    a, ab = gk.kernel([2]), gk.kernel([2, 3])
    assert (a.in_bytes, a.out_bytes) == (400, 400)
    assert (ab.in_bytes, ab.out_bytes) == (404, 400)  # p and the constant in; b out; a stays inside
    assert gk.kernel([4]).out_bytes == 400  # d has no users: a graph output, still written
    assert kernel_key(ab.nodes) == ab.key() == "add:f32[100]|exponential:f32[100]"


def test_inlined_producers_are_read_through_and_never_written():
    gk = GraphKernels(_graph())
    # b with a inlined (a duplicated into b's kernel): reads p and c, writes only b.
    k = gk.kernel([3], inlined=[2])
    assert [n.name for n in k.nodes] == ["a", "b"]
    assert (k.in_bytes, k.out_bytes) == (404, 400)
    # a with b inlined: b feeds the dot outside, so b's value leaks and a's result is needed.
    k = gk.kernel([2], inlined=[3])
    assert (k.in_bytes, k.out_bytes) == (404, 400)
    with pytest.raises(ValueError, match=r"kernel: node indices \[7\] are outside the graph of 5 nodes"):
        gk.kernel([2], inlined=[7])


def test_analytic_roofline_and_fusion_saves():
    gk = GraphKernels(_graph())
    # a: max(100/100, 800/400) + 0.5 = 2.5 ; b: max(1, 804/400) + 0.5 = 2.51 ; a+b: max(2, 804/400) + 0.5
    assert COSTS.kernel_time(gk.kernel([2])) == pytest.approx(2.5)
    assert COSTS.kernel_time(gk.kernel([3])) == pytest.approx(2.51)
    assert COSTS.kernel_time(gk.kernel([2, 3])) == pytest.approx(2.51)
    assert COSTS.kernel_time(gk.kernel([4])) == pytest.approx(100 + 0.5)  # compute bound
    assert COSTS.kernel_time(gk.kernel([0, 1])) == 0.0  # parameter and constant are not kernels


def test_kernel_of_rejects_bad_indices():
    with pytest.raises(ValueError, match=r"kernel: node indices \[9\] are outside the graph of 5 nodes"):
        kernel_of(_graph(), [9])
    with pytest.raises(ValueError, match=r"kernel: expected at least one node index, got none"):
        kernel_of(_graph(), [])


def test_analytic_config_rejects_bad_values():
    with pytest.raises(ValueError, match=r"AnalyticConfig.peak_flops: expected a positive number, got 0"):
        AnalyticConfig(peak_flops=0)


def test_table_costs_hits_and_falls_back():
    gk = GraphKernels(_graph())
    table = TableCosts.from_records([(gk.kernel([2]), 1.0), (gk.kernel([2]), 3.0), (gk.kernel([2]), 2.0)],
                                    fallback=COSTS)
    assert table.kernel_time(gk.kernel([2])) == 2.0  # median of repeats
    assert table.kernel_time(gk.kernel([3])) == pytest.approx(2.51)  # miss -> analytic
    assert (table.hits, table.misses) == (1, 1)
    updated = table.update([("add:f32[100]", 0.25)])
    assert updated.kernel_time(gk.kernel([3])) == 0.25
    assert "add:f32[100]" not in table.table  # update returns a new table


@pytest.mark.parametrize("model", [COSTS, TableCosts({"exponential:f32[100]": 1e-3}, COSTS), AnalyticCosts()])
def test_save_load_round_trip(tmp_path, model):
    path = tmp_path / "costs.json"
    model.save(path)
    again = load_costs(path)
    assert again == model and type(again) is type(model)
    assert again.digest() == model.digest()
    assert type(model).load(path) == model
    assert CostModel.load(path) == model


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"schema": "disco.costs/1", "name": "magic", "version": "1", "params": {}}))
    with pytest.raises(ValueError, match=r"c.json: field 'name': expected one of \['analytic', 'table'\], got 'magic'"):
        load_costs(bad)
    COSTS.save(bad)
    with pytest.raises(ValueError, match=r"c.json: expected a 'table' cost model, got 'analytic'"):
        TableCosts.load(bad)
    bad.write_text("{nope")
    with pytest.raises(ValueError, match=r"c.json: not valid JSON"):
        load_costs(bad)


def test_table_rejects_negative_times():
    with pytest.raises(ValueError, match=r"TableCosts\['k'\]: expected a non-negative number of seconds, got -1"):
        TableCosts({"k": -1})


# -- collectives ---------------------------------------------------------------------------------
def _cluster(nodes: int, dpn: int, algorithm: str, intra=(100.0, 1.0), inter=(10.0, 3.0)) -> ClusterSpec:
    return ClusterSpec(name="t", nodes=nodes, devices_per_node=dpn, intra=LinkSpec(*intra),
                       inter=LinkSpec(*inter), algorithm=algorithm)


def test_ring_on_one_node():
    c = _cluster(1, 4, "ring")  # alpha 1 s, beta 0.01 s/B, p = 4, n = 400 B
    assert collectives.allreduce_time(400, c) == pytest.approx(2 * 3 * 1 + 2 * 0.75 * 400 * 0.01)  # 12
    assert collectives.reduce_scatter_time(400, c) == pytest.approx(3 + 3)
    assert collectives.all_gather_time(400, c) == pytest.approx(6)


def test_ring_across_nodes_uses_the_bottleneck_link():
    c = _cluster(2, 2, "ring")  # alpha = max(1, 3) = 3, beta = 1/min(100, 10) = 0.1
    assert collectives.allreduce_time(400, c) == pytest.approx(2 * 3 * 3 + 2 * 0.75 * 400 * 0.1)  # 78


def test_tree():
    c = _cluster(1, 8, "tree")  # L = 3
    assert collectives.allreduce_time(100, c) == pytest.approx(2 * 3 * 1 + 2 * 100 * 0.01)  # 8
    assert collectives.reduce_scatter_time(800, c) == pytest.approx(3 + 7 / 8 * 800 * 0.01)  # 10
    assert collectives.allreduce_time(100, _cluster(1, 5, "tree")) == pytest.approx(2 * 3 + 2)  # ceil(log2 5)


def test_hierarchical():
    c = _cluster(2, 4, "hierarchical")  # d = 4, N = 2, n = 400
    intra_half = 3 * 1 + 0.75 * 400 * 0.01  # 6
    inter_half = 1 * 3 + 0.5 * 400 / 10  # 23
    assert collectives.allreduce_time(400, c) == pytest.approx(2 * intra_half + 2 * inter_half)  # 58
    assert collectives.reduce_scatter_time(400, c) == pytest.approx(intra_half + inter_half)
    assert collectives.allreduce_time(400, _cluster(1, 4, "hierarchical")) == pytest.approx(
        collectives.allreduce_time(400, _cluster(1, 4, "ring")))


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical"])
@pytest.mark.parametrize("kind", collectives.COLLECTIVE_KINDS)
def test_one_device_is_free_and_costs_grow_with_bytes(algorithm, kind):
    assert collectives.collective_time(kind, 10**6, _cluster(1, 1, algorithm)) == 0.0
    c = _cluster(2, 4, algorithm)
    small, big = (collectives.collective_time(kind, n, c) for n in (10, 10**6))
    assert 0 < small < big and math.isfinite(big)


def test_collective_errors():
    c = _cluster(1, 4, "ring")
    with pytest.raises(ValueError, match=r"unknown collective kind 'broadcast'; expected one of all-reduce"):
        collectives.collective_time("broadcast", 4, c)
    with pytest.raises(ValueError, match=r"nbytes: expected a non-negative number of bytes, got -4"):
        collectives.allreduce_time(-4, c)


def test_cost_model_collective_time_delegates():
    c = _cluster(1, 4, "ring")
    assert COSTS.collective_time("all-reduce", 400, c) == collectives.allreduce_time(400, c)

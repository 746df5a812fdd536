"""gnn.graph: the one container of both GNN families, its batching and padding."""

from __future__ import annotations

import numpy as np
import pytest

from gnn import graph as G


def _graph(n: int, e: int, seed: int, *, edge_features: int = 2, globals_: int = 3) -> G.GraphsTuple:
    rng = np.random.default_rng(seed)
    return G.single(nodes=rng.normal(size=(n, 4)).astype(np.float32),
                    opcodes=rng.integers(0, 9, n).astype(np.int32),
                    edges=rng.normal(size=(e, edge_features)).astype(np.float32),
                    senders=rng.integers(0, n, e).astype(np.int32), receivers=rng.integers(0, n, e).astype(np.int32),
                    globals=rng.normal(size=globals_).astype(np.float32))


@pytest.mark.fast
def test_batch_offsets_indices_and_pad_adds_one_padding_graph() -> None:
    a, b = _graph(3, 2, 0), _graph(5, 4, 1)
    g = G.pad(G.batch([a, b]))
    assert g.nodes.shape == (16, 4) and g.senders.shape == (16,) and g.n_node.shape == (8,)
    np.testing.assert_array_equal(g.senders[2:6], b.senders + 3)
    np.testing.assert_array_equal(g.node_graph[:8], [0] * 3 + [1] * 5)
    assert (g.node_graph[8:] == 2).all() and (g.senders[6:] == 8).all() and (g.receivers[6:] == 8).all()
    assert g.n_node.tolist() == [3, 5, 8, 0, 0, 0, 0, 0] and g.n_edge.tolist() == [2, 4, 10, 0, 0, 0, 0, 0]
    assert g.node_mask.sum() == 8 and g.graph_mask.tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert g.n_node.sum() == g.nodes.shape[0] and g.n_edge.sum() == g.senders.shape[0]


@pytest.mark.fast
def test_a_family_without_edge_features_uses_zero_columns() -> None:
    g = G.pad(G.batch([_graph(3, 2, 0, edge_features=0), _graph(2, 1, 1, edge_features=0)]), n_edge=4)
    assert g.edges.shape == (4, 0) and g.senders.shape == (4,)


@pytest.mark.fast
def test_pad_and_batch_name_what_they_got() -> None:
    with pytest.raises(ValueError, match=r"too small: cannot hold 3 nodes, 2 edges and 1 graphs.*>= \(4, 2, 2\)"):
        G.pad(_graph(3, 2, 0), n_node=3)
    with pytest.raises(ValueError, match="at least one graph, got none"):
        G.batch([])


@pytest.mark.fast
def test_bucket_is_the_next_power_of_two() -> None:
    assert [G.bucket(n) for n in (0, 1, 16, 17, 33)] == [16, 16, 16, 32, 64]
    assert G.bucket(3, 8) == 8 and G.bucket(9, 8) == 16


@pytest.mark.fast
def test_both_families_build_the_one_container(record) -> None:
    from disco.plans.plan import FusionPlan
    from gnn import features as F, kernel_features as KF
    from tests.gnn.test_step_level import _graph as step_graph

    k = KF.batch(list(record.graphs[:3]))
    assert type(k) is G.GraphsTuple and k.edges.shape[1] == 0
    np.testing.assert_array_equal(k.globals[:3], np.stack([g.totals for g in record.graphs[:3]]))
    s = F.fused_graph(F.GraphContext(step_graph()), FusionPlan())
    assert type(s) is G.GraphsTuple and F.GraphsTuple is G.GraphsTuple

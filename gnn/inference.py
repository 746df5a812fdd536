"""Running the step-level cost GNN on fused graphs: batching, padding and the jitted forward pass.

Used by training (validation), evaluation and :class:`gnn.cost_model.GnnCosts` alike, so none
of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gnn import features as F, graph as G


def make_batch(graphs: Sequence[F.GraphsTuple], n_graph: int, node_budget: int | None = None) -> F.GraphsTuple:
    """Batches and pads to ``node_budget`` nodes and twice that many edges (or the next power of two
    above the batch when it does not fit) and ``n_graph`` graph slots."""
    b = G.batch(graphs)
    n_node = n_edge = None
    if node_budget is not None:
        n_node = max(node_budget, G.bucket(b.nodes.shape[0] + 1))
        n_edge = max(2 * node_budget, G.bucket(b.edges.shape[0]))
    return G.pad(b, n_node=n_node, n_edge=n_edge, n_graph=n_graph)


def predict(model: Any, graphs: Sequence[F.GraphsTuple], *, batch: int = 16,
            node_budget: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    """(log seconds from the kernel head, predicted log(time / xla_default)) per graph.

    Graphs are packed into batches of at most ``batch`` graphs and ``node_budget`` nodes
    (one padded shape, so one compile, unless a single graph is bigger).
    """
    fwd = _forward_fn()
    abs_out, rel_out = [], []
    k = 0
    while k < len(graphs):
        chunk, nodes, edges = [], 0, 0
        while k < len(graphs) and len(chunk) < batch:
            n, e = graphs[k].nodes.shape[0], graphs[k].edges.shape[0]
            if chunk and (nodes + n + 1 > node_budget or edges + e > 2 * node_budget):
                break
            chunk.append(graphs[k])
            nodes, edges, k = nodes + n, edges + e, k + 1
        g = make_batch(chunk, batch + 1, node_budget)
        a, r = fwd(model, g)
        abs_out.append(np.asarray(a)[:len(chunk)])
        rel_out.append(np.asarray(r)[:len(chunk)])
    return np.concatenate(abs_out), np.concatenate(rel_out)


_FWD: list[Callable[..., Any]] = []


def _forward_fn() -> Callable[..., Any]:
    if not _FWD:
        from flax import nnx

        from gnn.model import graph_log_time

        @nnx.jit
        def fwd(model: Any, g: F.GraphsTuple) -> Any:
            k_log, rel = model(g)
            return graph_log_time(k_log, g), rel

        _FWD.append(fwd)
    return _FWD[0]

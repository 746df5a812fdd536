"""The one graph container of both GNN families, its batching and its padding (jraph's ``GraphsTuple``).

:class:`GraphsTuple` holds one graph or a batch of graphs: the jraph fields (nodes, edges, senders,
receivers, n_node, n_edge, globals) plus per-node opcode ids, the graph of each node and masks. The
step-level family (:mod:`gnn.features`: one fused graph per (graph, plan), edge features and step
globals) and the kernel-level family (:mod:`gnn.kernel_features`: one graph per kernel, its totals as
globals, no edge features: ``edges`` has zero columns) build it and their models consume it.

:func:`batch` concatenates graphs; :func:`pad` pads a batch to power-of-two size buckets
(:func:`bucket`) with one padding graph, right after the real ones, that holds every padding node and
edge (padding edges join the first padding node to itself), so jit compiles once per size bucket and
padding never reaches a real graph's sums (models mask pooling with ``node_mask``/``graph_mask``).

Example:
  >>> g = pad(batch([a, b]))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class GraphsTuple(NamedTuple):
    """A graph or a batch of graphs (jraph layout, plus opcodes, per-node graph ids and masks).

    Attributes:
      nodes: float32 [N, node features].
      opcodes: int32 [N] opcode ids (``disco.ir.opcodes.opcode_id``).
      edges: float32 [E, edge features] (zero columns where a family has no edge features).
      senders: int32 [E].
      receivers: int32 [E].
      n_node: int32 [G].
      n_edge: int32 [G].
      globals: float32 [G, global features] (the kernel family's totals).
      node_graph: int32 [N], the graph each node belongs to.
      node_mask: float32 [N], 1 for real nodes.
      graph_mask: float32 [G], 1 for real graphs.
    """

    nodes: np.ndarray
    opcodes: np.ndarray
    edges: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    n_node: np.ndarray
    n_edge: np.ndarray
    globals: np.ndarray
    node_graph: np.ndarray
    node_mask: np.ndarray
    graph_mask: np.ndarray


def single(*, nodes: np.ndarray, opcodes: np.ndarray, edges: np.ndarray, senders: np.ndarray,
           receivers: np.ndarray, globals: np.ndarray) -> GraphsTuple:
    """One unpadded graph: its counts, graph ids and masks filled in (``globals`` [1, F] or [F])."""
    n = nodes.shape[0]
    return GraphsTuple(
        nodes=nodes, opcodes=opcodes, edges=edges, senders=senders, receivers=receivers,
        n_node=np.array([n], dtype=np.int32), n_edge=np.array([senders.shape[0]], dtype=np.int32),
        globals=np.asarray(globals).reshape(1, -1), node_graph=np.zeros(n, dtype=np.int32),
        node_mask=np.ones(n, dtype=np.float32), graph_mask=np.ones(1, dtype=np.float32))


def batch(graphs: Sequence[GraphsTuple]) -> GraphsTuple:
    """Concatenates graphs into one GraphsTuple (node and graph indices offset; masks kept).

    Raises:
      ValueError: for an empty sequence.
    """
    if not graphs:
        raise ValueError("batch: expected at least one graph, got none")
    if len(graphs) == 1:
        return graphs[0]
    cat = np.concatenate
    nodes = np.array([g.nodes.shape[0] for g in graphs])
    edges = np.array([g.senders.shape[0] for g in graphs])
    n_graphs = np.array([g.n_node.shape[0] for g in graphs])
    edge_offset = np.repeat(np.cumsum(nodes) - nodes, edges)  # each edge's input's first node
    node_offset = np.repeat(np.cumsum(n_graphs) - n_graphs, nodes)  # each node's input's first graph
    return GraphsTuple(
        nodes=cat([g.nodes for g in graphs]), opcodes=cat([g.opcodes for g in graphs]),
        edges=cat([g.edges for g in graphs]),
        senders=(cat([g.senders for g in graphs]) + edge_offset).astype(np.int32),
        receivers=(cat([g.receivers for g in graphs]) + edge_offset).astype(np.int32),
        n_node=cat([g.n_node for g in graphs]), n_edge=cat([g.n_edge for g in graphs]),
        globals=cat([g.globals for g in graphs]),
        node_graph=(cat([g.node_graph for g in graphs]) + node_offset).astype(np.int32),
        node_mask=cat([g.node_mask for g in graphs]), graph_mask=cat([g.graph_mask for g in graphs]))


def bucket(n: int, minimum: int = 16) -> int:
    """The padded size for ``n`` entries: the next power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def pad(g: GraphsTuple, *, n_node: int | None = None, n_edge: int | None = None,
        n_graph: int | None = None) -> GraphsTuple:
    """Pads ``g`` with one padding graph (index = its graph count) holding all padding nodes and edges.

    Sizes default to :func:`bucket` of (nodes + 1, minimum 16), (edges + 1, minimum 16) and
    (graphs + 1, minimum 8).

    Raises:
      ValueError: if a requested size is too small (nodes and graphs need one spare slot).
    """
    N, E, G = g.nodes.shape[0], g.senders.shape[0], g.n_node.shape[0]
    n_node = bucket(N + 1) if n_node is None else n_node
    n_edge = bucket(E + 1) if n_edge is None else n_edge
    n_graph = bucket(G + 1, 8) if n_graph is None else n_graph
    if n_node < N + 1 or n_edge < E or n_graph < G + 1:
        raise ValueError(f"pad: sizes (nodes {n_node}, edges {n_edge}, graphs {n_graph}) too small: cannot hold "
                         f"{N} nodes, {E} edges and {G} graphs plus one padding node and graph; expected "
                         f">= ({N + 1}, {E}, {G + 1})")
    pn, pe, pg = n_node - N, n_edge - E, n_graph - G

    def z(a: np.ndarray, k: int, value: float = 0) -> np.ndarray:
        return np.concatenate([a, np.full((k,) + a.shape[1:], value, dtype=a.dtype)])

    n_node_arr = z(g.n_node, pg)
    n_node_arr[G] = pn
    n_edge_arr = z(g.n_edge, pg)
    n_edge_arr[G] = pe
    return GraphsTuple(
        nodes=z(g.nodes, pn), opcodes=z(g.opcodes, pn), edges=z(g.edges, pe),
        senders=z(g.senders, pe, N), receivers=z(g.receivers, pe, N),
        n_node=n_node_arr, n_edge=n_edge_arr, globals=z(g.globals, pg),
        node_graph=z(g.node_graph, pn, G), node_mask=z(g.node_mask, pn), graph_mask=z(g.graph_mask, pg))

"""From (graph, plan) to a padded "fused graph": one node per kernel or collective of the plan.

The plan is contracted like the simulator does: each plan group becomes one node, each
bucket one node (``buckets=None``: XLA's combiner, all all-reduces in one node), every
other compute op and collective a node of its own. Zero-cost ops (parameters, constants,
tuple plumbing, bitcasts; :data:`disco.ir.opcodes.ZERO_COST_OPCODES`) are not nodes: message
passing edges are folded through them, and the bytes they hand over still count as a
kernel's input bytes, exactly as :class:`disco.sim.costs.Kernel` counts them.

The container is :class:`gnn.graph.GraphsTuple` (jraph's layout plus masks), the one both GNN
families use; :func:`gnn.graph.batch` and :func:`gnn.graph.pad` (re-exported here) batch it and pad
it to power-of-two size buckets with one padding graph, so jit compiles once per size bucket.

Node features (:data:`NODE_FEATURES`; the first :data:`N_KERNEL_FEATURES` depend only on the
kernel itself, so the per-kernel head can price a :class:`disco.sim.costs.Kernel` out of context):
log flops, log input bytes, log output bytes, log output elements, log member count, is a
fused group, is a collective, log collective bytes, position in the schedule (first member's
program position / graph size). Edge features: log bytes, log number of value edges.
Globals: fusion pass off, combiner buckets, log #groups, log #buckets, log devices, log #nodes.

Example:
  >>> ctx = GraphContext(graph)
  >>> g = pad(batch([fused_graph(ctx, plan, devices=4)]))  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from disco.ir.opcodes import ALL_REDUCE_OPCODES, COLLECTIVE_KIND, OPCODES, ZERO_COST_OPCODES, opcode_id
from disco.sim.costs import Kernel, is_kernel_node
from disco.ir.graph import HloGraph
from disco.plans.plan import FusionPlan
from gnn.graph import GraphsTuple, batch, bucket, pad  # noqa: F401 (re-exported)

FEATURE_VERSION = 1
NODE_FEATURES = ("log_flops", "log_in_bytes", "log_out_bytes", "log_out_elements", "log_members",
                 "is_group", "is_collective", "log_collective_bytes", "position")
N_KERNEL_FEATURES = 8
EDGE_FEATURES = ("log_bytes", "log_values")
GLOBAL_FEATURES = ("fusion_off", "combiner", "log_groups", "log_buckets", "log_devices", "log_nodes")
N_OPCODES = len(OPCODES) + 1  # + the unknown opcode
FUSION_ID = opcode_id("fusion")
ALL_REDUCE_ID = opcode_id("all-reduce")

CLIP = 8.0  # the model clips normalised inputs to +-CLIP (features far outside the training range)

_VIRTUAL, _KERNEL, _COLL = 0, 1, 2


class GraphContext:
    """Plan-independent arrays of one graph, computed once and reused for every plan.

    Args:
      graph: the step's HLO graph (nodes in topological order).

    Raises:
      ValueError: if an edge goes backwards (nodes not in topological order).
    """

    def __init__(self, graph: HloGraph):
        self.graph = graph
        nodes = graph.nodes
        n = len(nodes)
        self.n = n
        self.index = graph.index()
        kind = np.array([_COLL if nd.opcode in COLLECTIVE_KIND else _VIRTUAL if nd.opcode in ZERO_COST_OPCODES
                         else _KERNEL for nd in nodes], dtype=np.int8)
        self.kind = kind
        self.real = kind != _VIRTUAL
        self.out_bytes = np.array([nd.out_bytes for nd in nodes], dtype=np.float64)
        self.out_elements = np.array([nd.out_elements for nd in nodes], dtype=np.float64)
        self.flops = np.array([nd.flops if kind[i] == _KERNEL else 0.0 for i, nd in enumerate(nodes)])
        self.opcode = np.array([opcode_id(nd.opcode) for nd in nodes], dtype=np.int32)
        raw = np.array(graph.edges, dtype=np.int64).reshape(-1, 2)
        self.raw_src, self.raw_dst = raw[:, 0].copy(), raw[:, 1].copy()
        self.has_succ = np.zeros(n, dtype=bool)
        self.has_succ[self.raw_src] = True
        # Message-passing topology: real -> real edges, folded through zero-cost nodes.
        preds: list[list[int]] = [[] for _ in range(n)]
        for s, d in graph.edges:
            if s >= d:
                raise ValueError(f"graph {graph.name!r}: edge {nodes[s].name!r} -> {nodes[d].name!r} goes "
                                 "backwards; expected nodes in topological order")
            preds[d].append(s)
        through: list[frozenset[int]] = [frozenset()] * n
        src, dst = [], []
        for i in range(n):
            acc: set[int] = set()
            for p in preds[i]:
                if kind[p] == _VIRTUAL:
                    acc |= through[p]
                else:
                    acc.add(p)
            if kind[i] == _VIRTUAL:
                through[i] = frozenset(acc)
            else:
                for p in sorted(acc):
                    src.append(p)
                    dst.append(i)
        self.src = np.array(src, dtype=np.int64)
        self.dst = np.array(dst, dtype=np.int64)
        self.all_reduces = np.array([i for i, nd in enumerate(nodes) if nd.opcode in ALL_REDUCE_OPCODES],
                                    dtype=np.int64)
        self._resolve_cache: dict[tuple[str, ...], np.ndarray] = {}

    def resolve(self, names: Sequence[str], what: str) -> np.ndarray:
        """Indices of ``names`` (cached per tuple).

        Raises:
          ValueError: naming an instruction that is not in the graph.
        """
        key = tuple(names)
        out = self._resolve_cache.get(key)
        if out is None:
            try:
                out = np.array(sorted({self.index[nm] for nm in key}), dtype=np.int64)
            except KeyError as e:
                raise ValueError(f"{what}: instruction {e.args[0]!r} is not in the graph "
                                 f"{self.graph.name!r}") from None
            self._resolve_cache[key] = out
        return out


def _log(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.maximum(x, 0.0)).astype(np.float32)


def fused_graph(ctx: GraphContext, plan: FusionPlan, *, devices: int = 1) -> GraphsTuple:
    """The fused graph of ``plan`` on ``ctx.graph`` (one graph, unpadded, deterministic).

    Args:
      ctx: the graph's :class:`GraphContext`.
      plan: the plan to contract.
      devices: data-parallel devices of the step (a global feature).

    Returns:
      A :class:`GraphsTuple` holding one graph.

    Raises:
      ValueError: for names not in the graph or overlapping groups/buckets.
    """
    n = ctx.n
    unit = np.full(n, -1, dtype=np.int64)
    kind = ctx.kind
    n_units = 0
    group_units: list[int] = []
    coll_units: list[int] = []
    for gi, names in enumerate(plan.groups):
        idx = ctx.resolve(names, f"group {gi}")
        idx = idx[kind[idx] == _KERNEL]
        if idx.size == 0:
            continue
        if (unit[idx] >= 0).any():
            raise ValueError(f"group {gi}: overlaps an earlier group; groups must be disjoint")
        unit[idx] = n_units
        group_units.append(n_units)
        n_units += 1
    if plan.buckets is None:
        buckets = [ctx.all_reduces] if ctx.all_reduces.size else []
    else:
        buckets = [ctx.resolve(b.members, f"bucket {bi}") for bi, b in enumerate(plan.buckets)]
    for bi, idx in enumerate(buckets):
        if (unit[idx] >= 0).any():
            raise ValueError(f"bucket {bi}: overlaps a group or an earlier bucket")
        if idx.size == 0:
            continue
        unit[idx] = n_units
        coll_units.append(n_units)
        n_units += 1
    rest = np.flatnonzero(ctx.real & (unit < 0))
    unit[rest] = np.arange(n_units, n_units + rest.size)
    n_units += rest.size
    # Canonical order: by first member's program position.
    real = np.flatnonzero(ctx.real)
    first = np.full(n_units, n, dtype=np.int64)
    np.minimum.at(first, unit[real], real)
    order = np.argsort(first, kind="stable")
    relabel = np.empty(n_units, dtype=np.int64)
    relabel[order] = np.arange(n_units)
    unit = np.where(unit >= 0, relabel[np.maximum(unit, 0)], -1)
    first = first[order]
    U = n_units
    ru = unit[real]
    is_group = np.zeros(U, dtype=np.float32)
    is_group[relabel[np.array(group_units, dtype=np.int64)]] = 1.0
    is_coll = np.zeros(U, dtype=np.float32)
    is_coll[relabel[np.array(coll_units, dtype=np.int64)]] = 1.0
    single_coll = np.zeros(U, dtype=bool)
    single_coll[ru[kind[real] == _COLL]] = True
    is_coll = np.maximum(is_coll, single_coll.astype(np.float32))
    members = np.bincount(ru, minlength=U).astype(np.float64)
    flops = np.bincount(ru, weights=ctx.flops[real], minlength=U)
    elements = np.bincount(ru, weights=ctx.out_elements[real], minlength=U)
    coll_bytes = np.bincount(ru, weights=ctx.out_bytes[real] * (kind[real] == _COLL), minlength=U)
    # Kernel traffic on raw edges (what disco.sim.costs.Kernel counts).
    us, ud = unit[ctx.raw_src], unit[ctx.raw_dst]
    ext = (us != ud) & (ud >= 0)
    key = np.unique(ctx.raw_src[ext] * U + ud[ext])
    in_bytes = np.bincount(key % U, weights=ctx.out_bytes[key // U], minlength=U)
    out_flag = ~ctx.has_succ.copy()
    out_flag[ctx.raw_src[us != ud]] = True
    out_bytes = np.bincount(ru, weights=(ctx.out_bytes * out_flag)[real], minlength=U)
    opc = np.empty(U, dtype=np.int32)
    opc[ru] = ctx.opcode[real]
    opc[is_group == 1] = FUSION_ID
    grp_coll = np.zeros(U, dtype=bool)
    grp_coll[relabel[np.array(coll_units, dtype=np.int64)]] = True
    opc[grp_coll] = ALL_REDUCE_ID
    nodes = np.stack([_log(flops), _log(in_bytes), _log(out_bytes), _log(elements), _log(members),
                      is_group, is_coll, _log(coll_bytes), (first / max(n, 1)).astype(np.float32)], axis=1)
    # Message-passing edges between units.
    es, ed = unit[ctx.src], unit[ctx.dst]
    keep = es != ed
    pair_node = np.unique(ctx.src[keep] * U + ed[keep])  # distinct (producer node, consumer unit)
    p_src, p_dst = pair_node // U, pair_node % U
    ekey = unit[p_src] * U + p_dst
    uk, inv = np.unique(ekey, return_inverse=True)
    ebytes = np.bincount(inv, weights=ctx.out_bytes[p_src], minlength=uk.size)
    evals = np.bincount(inv, minlength=uk.size).astype(np.float64)
    edges = np.stack([_log(ebytes), _log(evals)], axis=1).reshape(-1, len(EDGE_FEATURES))
    n_buckets = len(buckets)
    glob = np.array([[float(plan.xla_fusion == "off"), float(plan.buckets is None), math.log1p(len(plan.groups)),
                      math.log1p(n_buckets), math.log(max(devices, 1)), math.log1p(U)]], dtype=np.float32)
    return GraphsTuple(
        nodes=nodes.astype(np.float32), opcodes=opc, edges=edges.astype(np.float32),
        senders=(uk // U).astype(np.int32), receivers=(uk % U).astype(np.int32),
        n_node=np.array([U], dtype=np.int32), n_edge=np.array([uk.size], dtype=np.int32), globals=glob,
        node_graph=np.zeros(U, dtype=np.int32), node_mask=np.ones(U, dtype=np.float32),
        graph_mask=np.ones(1, dtype=np.float32))


def kernel_features(kernel: Kernel) -> tuple[int, np.ndarray]:
    """(opcode id, the first :data:`N_KERNEL_FEATURES` node features) of one kernel, out of context.

    Matches what :func:`fused_graph` computes for the same kernel's node.
    """
    work = [nd for nd in kernel.nodes if is_kernel_node(nd)]
    opc = FUSION_ID if len(work) > 1 else opcode_id(work[0].opcode) if work else FUSION_ID
    feats = np.array([kernel.flops, kernel.in_bytes, kernel.out_bytes, sum(nd.out_elements for nd in work),
                      len(work)], dtype=np.float64)
    out = np.concatenate([_log(feats), np.array([float(len(work) > 1), 0.0, 0.0], dtype=np.float32)])
    return opc, out

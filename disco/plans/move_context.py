"""What moves know about one graph: :class:`MoveContext`, precomputed once by :func:`context`.

The facts here do not depend on a plan: who feeds whom, which ops may share a group (fusible,
same computation, plan_check's layout rules; none on GPU, where XLA cannot take groups), which
all-reduces may share a bucket (one class: computation, reduction, replica groups, dtype), the
reachability between all-reduces as bitsets (for the cycle check of bucket moves), the operand
edges a cut may go on, the parameter all-gathers a gather bucket may hold (one class each:
computation, replica groups, dtype), and the backend's compile-option table.
:mod:`disco.plans.moves` reads them for every move.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from disco.ir.replica_groups import replica_group_size
from disco.ir.opcodes import COLLECTIVE_KIND, FUSIBLE_OPCODES
from disco.plans import check as plan_check
from disco.plans import options as plan_options

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph


@dataclasses.dataclass(frozen=True, eq=False)
class MoveContext:
    """Plan-independent facts about one graph, precomputed once for many moves.

    Attributes:
      graph: the graph.
      index: instruction name -> node index.
      names: node index -> instruction name.
      succ: per node, its consumers (node indices, no duplicates).
      pred: per node, its operands' producers.
      fusible_nbrs: per node, neighbours (either direction) it may share a group
        with: both fusible, same computation; empty for non-fusible nodes.
      fusible_nodes: nodes with at least one fusible neighbour.
      ar_class: all-reduce node -> class id; buckets merge only within a class
        (a tuple-shaped all-reduce is a class of its own).
      ar_level: all-reduce node -> the number of all-reduces on the longest chain above it.
      ar_bit: all-reduce node -> its bit (its position in program order).
      ar_reach: all-reduce node -> bitset of the all-reduces downstream of it in the graph.
      ar_splittable: all-reduce nodes whose bucket may use build "rs_ag" (replica groups of one
        known size, not tuple-shaped).
      ar_scatterable: all-reduce node -> its dynamic-slice nodes, for the all-reduces a "scatter"
        bucket may hold (gradient scatters whose every user is a dynamic-slice keeping this device's
        block, :func:`disco.plans.check.scatterable`). Those dynamic-slices are in no fusible pair, so
        no move puts one in a group (a "scatter" bucket replaces them; a start plan's group may hold
        one, and then ``switch_build`` leaves that bucket "concat").
      ar_scatter_way: ``ar_scatterable`` node -> the id of its way of scattering (its scatter and across
        groups, :func:`disco.plans.check.scatter_groups`); a "scatter" bucket's members share one.
      backend: "cpu" or "gpu"; on "gpu" ``fusible_nbrs``/``fusible_nodes`` are empty.
      cut_edges: (producer, consumer) node pairs a cut may go on (see :func:`add_cut`).
      options: the backend's compile-option table.
      gather_class: parameter all-gather node -> class id (computation, replica groups, dtype); gather
        bucket moves merge only within a class, and only these all-gathers: one array each, its
        operand an entry parameter's shard (``disco.ir.sharded``'s ``param_gather``) and no
        collective above it, so that no gather bucket of them can wait on its own result. Empty for a
        graph without such all-gathers (its moves are those of a step without sharded parameters).
      anchors: the ops a gather anchor moves between (``shift_anchor``): each parameter all-gather's
        first use (:func:`disco.ir.sharded.first_uses`), unique, in program order; empty without
        ``gather_class``.
      first_read: parameter all-gather node -> the program position of its first reader; an anchor
        before every member's first reader cannot be downstream of its gather bucket.
      anchors_below_reduce: some anchor is downstream of an all-reduce (an all-reduce bucket could
        then close a cycle through an anchor: moves check such plans whole).
      memo: what moves keep between calls on this context (the index views of the last few plans,
        the node indices of group and bucket tuples); not compared, not shown.
    """

    graph: HloGraph
    index: Mapping[str, int]
    names: tuple[str, ...]
    succ: tuple[tuple[int, ...], ...]
    pred: tuple[tuple[int, ...], ...]
    fusible_nbrs: tuple[tuple[int, ...], ...]
    fusible_nodes: tuple[int, ...]
    ar_class: Mapping[int, int]
    ar_level: Mapping[int, int]
    ar_bit: Mapping[int, int]
    ar_reach: Mapping[int, int]
    ar_splittable: frozenset[int] = frozenset()
    ar_scatterable: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    ar_scatter_way: Mapping[int, int] = dataclasses.field(default_factory=dict)
    backend: str = "cpu"
    cut_edges: tuple[tuple[int, int], ...] = ()
    options: tuple[plan_options.CompileOption, ...] = ()
    gather_class: Mapping[int, int] = dataclasses.field(default_factory=dict)
    anchors: tuple[int, ...] = ()
    first_read: Mapping[int, int] = dataclasses.field(default_factory=dict)
    anchors_below_reduce: bool = False
    memo: dict = dataclasses.field(default_factory=dict, repr=False)


# Ops a cut may stand between: both fusible, the producer something XLA would compute in a kernel.
_CUT_OPCODES = FUSIBLE_OPCODES - {"constant", "iota"}


def _cut_edges(graph: HloGraph, succ: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    nodes = graph.nodes
    out = []
    for i, nd in enumerate(nodes):
        if (nd.opcode not in _CUT_OPCODES or nd.shape.startswith("(") or "[" not in nd.shape
                or not plan_check.group_computation_ok(graph, nd.computation)):
            continue
        for j in succ[i]:
            if nodes[j].opcode in _CUT_OPCODES and nd.name in nodes[j].operands:
                out.append((i, j))
    return tuple(out)


def _gather_classes(graph: HloGraph, pred: Sequence[Sequence[int]]) -> dict[int, int]:
    """Per parameter all-gather a gather bucket may hold (see :attr:`MoveContext.gather_class`), its class."""
    nodes = graph.nodes
    if not any(nd.opcode == "all-gather" for nd in nodes):
        return {}  # no all-gather: the labels' dataflow walk is not needed
    index = graph.index()
    params = {index[c.name] for c in graph.collective_roles() if c.role == "param_gather" and c.opcode == "all-gather"}
    collective_above = [False] * len(nodes)
    for i in range(len(nodes)):  # program order is topological
        collective_above[i] = any(collective_above[p] or nodes[p].opcode in COLLECTIVE_KIND for p in pred[i])
    classes: dict[tuple, int] = {}
    out: dict[int, int] = {}
    for i in sorted(params):
        nd = nodes[i]
        if nd.shape.startswith("(") or collective_above[i]:
            continue
        out[i] = classes.setdefault(plan_check.gather_class(nd), len(classes))
    return out


def context(graph: HloGraph, backend: str = "cpu") -> MoveContext:
    """Precomputes what moves need for ``graph`` on ``backend`` (linear in the graph's size).

    Raises:
      ValueError: for a backend that is neither CPU nor GPU.
    """
    backend = plan_options.normalize(backend)
    nodes = graph.nodes
    n = len(nodes)
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for s, d in dict.fromkeys(graph.edges):
        succ[s].append(d)
        pred[d].append(s)
    # plan_check's per-node rules (opcode, computation, layouts; inputs with a layout can never
    # be members, so they are outside every group); constants are left to XLA.
    allowed = plan_check.groupable(graph, {i: pred[i] for i in range(n)})
    index = graph.index()
    scatter = plan_check.scatterable(graph)
    how = plan_check.scatter_groups(graph) if scatter else {}
    ways: dict[tuple, int] = {}
    replaced = {index[s] for slices in scatter.values() for s in slices}  # what a "scatter" bucket replaces
    ok = [allowed[i] and nd.opcode != "constant" and backend != "gpu" and i not in replaced
          for i, nd in enumerate(nodes)]
    nbrs = []
    for i in range(n):
        if not ok[i]:
            nbrs.append(())
            continue
        comp = nodes[i].computation
        nbrs.append(tuple(dict.fromkeys(j for j in (*pred[i], *succ[i])
                                        if ok[j] and nodes[j].computation == comp)))
    classes: dict[tuple, int] = {}
    ar_class: dict[int, int] = {}
    for i, nd in enumerate(nodes):
        if nd.is_all_reduce:
            ar_class[i] = classes.setdefault(plan_check.bucket_class(nd), len(classes))
    # all-reduces above each node: along edges in topological (program) order
    above = [0] * n
    for i in range(n):
        best = 0
        for p in pred[i]:
            v = above[p] + (1 if p in ar_class else 0)
            if v > best:
                best = v
        above[i] = best
    bit = {a: b for b, a in enumerate(sorted(ar_class))}
    down = [0] * n  # per node: bitset of all-reduces at or below it
    for i in range(n - 1, -1, -1):
        r = 1 << bit[i] if i in bit else 0
        for s in succ[i]:
            r |= down[s]
        down[i] = r
    reach = {a: down[a] & ~(1 << bit[a]) for a in bit}
    gather_class = _gather_classes(graph, pred)
    anchors: tuple[int, ...] = ()
    if gather_class:
        from disco.ir.sharded import first_uses

        anchors = tuple(plan_check.anchorable(graph, sorted(set(first_uses(graph).values()))))
    return MoveContext(
        graph=graph, index=index, names=tuple(nd.name for nd in nodes),
        succ=tuple(map(tuple, succ)), pred=tuple(map(tuple, pred)), fusible_nbrs=tuple(nbrs),
        fusible_nodes=tuple(i for i in range(n) if nbrs[i]),
        ar_class=ar_class, ar_level={i: above[i] for i in ar_class}, ar_bit=bit, ar_reach=reach,
        ar_splittable=frozenset(i for i in ar_class if not nodes[i].shape.startswith("(")
                                and replica_group_size(nodes[i].replica_groups) is not None),
        ar_scatterable={index[a]: tuple(index[s] for s in slices) for a, slices in scatter.items()},
        ar_scatter_way={index[a]: ways.setdefault(how[a], len(ways)) for a in scatter},
        backend=backend, cut_edges=_cut_edges(graph, succ), options=plan_options.table(backend),
        gather_class=gather_class, anchors=anchors,
        first_read={g: min(succ[g], default=n) for g in gather_class},
        anchors_below_reduce=any(above[a] for a in anchors))

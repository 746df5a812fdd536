"""The collectives of a step with sharded parameters (FSDP / ZeRO), labelled by dataflow.

XLA's SPMD partitioner turns a ``jax.jit`` step whose parameters are sharded over a mesh axis
into a per-device program with three kinds of collective around each sharded parameter: an
all-gather of its shard before each use (``"param_gather"``), and, for its gradient, a
reduce-scatter, which XLA:CPU writes as an all-reduce of the whole gradient followed by a
dynamic-slice that keeps this device's shard (``"grad_scatter"``); a replicated parameter's
gradient (or a shard's gradient over the other, data-parallel axis of a 2-D mesh) is an
all-reduce whose result feeds the update (``"grad_reduce"``). Everything else (the loss's
all-reduce, collectives of other axes) is ``"other"``, left where XLA puts it.

Each is found by dataflow, never by name:

- an all-gather is a parameter's when its operand comes from an entry parameter of its element
  count through ops that only move the values (reshape, broadcast, copy, transpose, convert,
  reverse), and
  that parameter is one the step updates (it reaches a step output of its dtype and count through
  elementwise ops, ``p - lr * g``): a gathered batch is no parameter;
- an all-reduce is a gradient's scatter when a slice (``dynamic-slice`` or ``slice``) of its result,
  read through such ops, feeds a step output of the slice's element count that a parameter of
  that dtype and count also feeds (the updated shard, or its optimizer state); a reduce-scatter
  is one when its own result does;
- an all-reduce is a gradient's reduction when the graph marks it a gradient
  (:func:`disco.ir.gradients.dataflow_gradients`, or a ``disco_grad`` scope) and it is no scatter.

A step written with ``jax.shard_map`` (the jax docs' FSDP: ``all_gather`` of each shard before its use,
``psum_scatter`` of its gradient) has its gathers and scatters inside the shard_map's body, whose
parameters are the local shards of the step's (global) parameters: jax's text passes them through
``xla.sdy.GlobalToLocalShape`` and back through ``LocalToGlobalShape``, tuples of them into and out of
the body's ``call``, and the rematerialised backward pass's through an ``opt-barrier``. Given each
``get-tuple-element``'s index (the graph's build passes them), the gather's operand is followed
element by element through those to the step's parameter, whose count is then the gathered
(whole) count, and a reduce-scatter's result likewise out to the global gradient the update reads.
A built graph's labels keep what its build found (``Node.param_path`` of a gather or reduce-scatter).

:func:`parameter_paths` runs when a graph is built and names the parameter of each gather and
scatter (``Node.param_path``); :func:`label_collectives` labels a built graph's collectives, with
the mesh axes each one's replica groups span (``HloGraph.mesh``).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from disco.ir.gradients import PASS_THROUGH as _PASS_THROUGH
from disco.ir.gradients import predecessors, reaching, results
from disco.ir.replica_groups import replica_group_lists, replica_group_size

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph, Node

ROLES: tuple[str, ...] = ("param_gather", "grad_scatter", "grad_reduce", "other")

# ops that pass a value's elements on (maybe relaid, reordered, repeated or retyped) without computing on
# them; a convolution's backward pass gathers its kernel reversed
_MOVES = frozenset({"reshape", "bitcast", "copy", "transpose", "convert", "broadcast", "reverse"})
_SLICES = frozenset({"dynamic-slice", "slice"})
_GATHERS = frozenset({"all-gather", "all-gather-start"})
_SCATTERS = frozenset({"reduce-scatter", "reduce-scatter-start"})
_ALL_REDUCES = frozenset({"all-reduce", "all-reduce-start"})


class Collective(NamedTuple):
    """One collective of a step, labelled.

    Attributes:
      name: its node's name.
      opcode: as XLA prints it (an async pair's ``-start``).
      role: one of :data:`ROLES`.
      axes: the mesh axes its replica groups span (axes of size 1 left out; ``()`` for a group
        of one device); None when the graph has no mesh or the groups match no set of its axes.
      group_size: devices per replica group; None when not known.
      bytes: the bytes of the whole tensor it moves: an all-gather's gathered result, an
        all-reduce's or a reduce-scatter's operand.
      param: the parameter it gathers or whose gradient it reduces (jax's path, or the
        parameter's instruction name); None for ``"other"``.
      slice: for an all-reduce that scatters a gradient, the slice that keeps the shard.
    """

    name: str
    opcode: str
    role: str
    axes: tuple[str, ...] | None
    group_size: int | None
    bytes: int
    param: str | None
    slice: str | None = None


class _Found(NamedTuple):
    gathers: dict[int, int]  # all-gather index -> the parameter node it gathers
    scatters: dict[int, tuple[int | None, tuple[int, ...]]]  # all-reduce / reduce-scatter -> (its slice, the updated outputs)


def _successors(n: int, edges: Sequence[tuple[int, int]]) -> list[list[int]]:
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges:
        succ[s].append(d)
    return succ


class _Flow(NamedTuple):
    """What following one value through a shard_map's boundaries needs: node indices by name, and
    each ``get-tuple-element``'s index (empty: the boundaries are not followed)."""

    by_name: dict[str, int]
    tuple_index: Mapping[int, int]


_NO_FLOW = _Flow({}, {})


def _flow(nodes: Sequence[Node], tuple_index: Mapping[int, int] | None) -> _Flow:
    return _Flow({n.name: i for i, n in enumerate(nodes)} if tuple_index else {}, tuple_index or {})


def _element_source(nodes: Sequence[Node], preds: list[list[int]], flow: _Flow, i: int, k: int) -> int | None:
    """The node that makes element ``k`` of tuple-valued node ``i``: a tuple's (or a shard_map
    boundary's, ``xla.sdy.GlobalToLocalShape``: one operand per element) ``k``-th operand; through
    an ``opt-barrier``, an inlined call (its body's root), a nested tuple element. None elsewhere."""
    for _ in range(64):
        node = nodes[i]
        if node.opcode in ("tuple", "custom-call"):
            if k >= len(node.operands) or node.operands[k] not in flow.by_name:
                return None
            return flow.by_name[node.operands[k]]
        if node.opcode in ("opt-barrier", "call") and preds[i]:
            i = preds[i][-1] if node.opcode == "call" else preds[i][0]  # a call's body root comes last
        elif node.opcode == "get-tuple-element" and i in flow.tuple_index and preds[i]:
            outer = _element_source(nodes, preds, flow, preds[i][0], flow.tuple_index[i])
            if outer is None:
                return None
            i = outer
        else:
            return None
    return None


def _gathered_parameter(nodes: Sequence[Node], preds: list[list[int]], gather: int, flow: _Flow) -> int | None:
    """The parameter node an all-gather's operand comes from through :data:`_MOVES` of its count;
    with ``flow``, also through a shard_map's boundaries to the step's parameter, of the gathered count."""
    if not preds[gather]:
        return None
    i = preds[gather][0]
    size = nodes[i].out_elements
    crossed = False  # through a shard_map boundary: the step's parameter is whole, not the shard
    for _ in range(len(nodes)):
        node = nodes[i]
        if node.opcode == "parameter" and preds[i] and flow.tuple_index:
            i, crossed = preds[i][0], True  # an inlined call's parameter: the call's operand
            continue
        if node.opcode == "get-tuple-element" and i in flow.tuple_index and preds[i]:
            src = _element_source(nodes, preds, flow, preds[i][0], flow.tuple_index[i])
            if src is None:
                return None
            i, crossed = src, True
            continue
        if crossed:
            if node.opcode == "parameter":
                return i if node.out_elements == nodes[gather].out_elements else None
            if node.opcode not in _MOVES or not preds[i]:
                return None
            i = preds[i][0]
            continue
        if node.out_elements != size:
            return None
        if node.opcode == "parameter":
            return i
        if node.opcode not in _MOVES or not preds[i]:
            return None
        i = preds[i][0]
    return None


def _global_values(nodes: Sequence[Node], succ: list[list[int]], flow: _Flow, start: int) -> list[int]:
    """The nodes that hold ``start``'s value (a reduce-scatter's shard in a shard_map's body) past the
    body's boundary (``xla.sdy.LocalToGlobalShape``): followed through :data:`_MOVES` of its count, into
    tuples (the body's root, a boundary's operands) and out of their ``get-tuple-element`` of its
    position, an inlined call's parameters. Only values past a boundary: inside, the graph's tuples
    join every element's successors, and a shard's count may be another parameter's."""
    out: list[int] = []
    seen = {(start, -1, False)}
    # (node, -1, crossed) for a value; (node, k, crossed) for element k of a tuple-valued node
    stack = [(start, -1, False)]
    while stack:
        i, k, crossed = stack.pop()
        node = nodes[i]
        nexts = []
        if k < 0:
            if crossed:
                out.append(i)
            for s in succ[i]:
                sn = nodes[s]
                if sn.opcode in ("tuple", "custom-call") and len(sn.operands) > 1:
                    nexts += [(s, p, crossed or sn.opcode == "custom-call")
                              for p, o in enumerate(sn.operands) if o == node.name]
                elif sn.opcode == "custom-call" and len(sn.operands) == 1:
                    nexts.append((s, -1, True))  # a one-operand boundary
                elif sn.opcode in _MOVES and sn.out_elements == node.out_elements or sn.opcode == "parameter":
                    nexts.append((s, -1, crossed))  # a move; an inlined call's parameter
        else:
            for s in succ[i]:
                sn = nodes[s]
                if sn.opcode == "get-tuple-element" and flow.tuple_index.get(s) == k:
                    nexts.append((s, -1, crossed))
                elif sn.opcode in ("call", "opt-barrier"):
                    nexts.append((s, k, crossed))
        for nxt in nexts:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return out


def _slices_of(nodes: Sequence[Node], succ: list[list[int]], start: int) -> list[int]:
    """The slices of ``start``'s result (read through :data:`_MOVES` of its element count) that
    keep fewer elements."""
    size = nodes[start].out_elements
    stack, seen, out = [start], {start}, []
    while stack:
        i = stack.pop()
        for s in succ[i]:
            if s in seen:
                continue
            seen.add(s)
            node = nodes[s]
            if node.opcode in _SLICES and node.out_elements < size:
                out.append(s)
            elif node.opcode in _MOVES and node.out_elements == size:
                stack.append(s)
    return out


def _find(nodes: Sequence[Node], edges: Sequence[tuple[int, int]],
          tuple_index: Mapping[int, int] | None = None) -> _Found:
    n = len(nodes)
    preds, succ = predecessors(n, edges), _successors(n, edges)
    flow = _flow(nodes, tuple_index)
    outputs = results(nodes, preds, [i for i in range(len(nodes)) if not succ[i]])
    updated: set[int] | None = None  # the parameters the step updates (not its batch), on first need
    gathers = {}
    for i, node in enumerate(nodes):
        if node.opcode not in _GATHERS:
            continue
        # the parameter of the shard's own count first (a partitioned program's: the shard_map body's
        # parameter, which jax's path names); then, across a shard_map's boundary, the whole one
        for way in (_NO_FLOW, flow) if flow.tuple_index else (flow,):
            p = _gathered_parameter(nodes, preds, i, way)
            if p is not None and updated is None:
                updated = {q for o in outputs for q in _parameters_updating(nodes, preds, o, flow)}
            if p is not None and p in updated:
                gathers[i] = p
                break
    # a candidate shard: a slice of an all-reduce's result, or a reduce-scatter's result
    shard_of: dict[int, tuple[int, int | None]] = {}  # shard node -> (collective, slice)
    for i, node in enumerate(nodes):
        if node.opcode in _ALL_REDUCES:
            for s in _slices_of(nodes, succ, i):
                shard_of.setdefault(s, (i, s))
        elif node.opcode in _SCATTERS:
            # in a shard_map's body, the shard as the step's update reads it past the boundary
            outside = _global_values(nodes, succ, flow, i) if flow.tuple_index else []
            for g in outside or [i]:
                shard_of.setdefault(g, (i, None))
    if not shard_of:
        return _Found(gathers, {})
    shard_bit = {s: 1 << k for k, s in enumerate(shard_of)}
    params = [i for i, nd in enumerate(nodes) if nd.opcode == "parameter"]
    param_bit = {i: 1 << k for k, i in enumerate(params)}
    params_of_shape: dict[tuple[str, int], int] = collections.defaultdict(int)
    shards_of_size: dict[int, int] = collections.defaultdict(int)
    for i, bit in param_bit.items():
        params_of_shape[(nodes[i].dtype, nodes[i].out_elements)] |= bit
    for s, bit in shard_bit.items():
        shards_of_size[nodes[s].out_elements] |= bit
    reach_shard = reaching(preds, shard_bit)
    reach_param = reaching(preds, param_bit)
    by_bit = {bit: s for s, bit in shard_bit.items()}
    scatters: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for o in sorted(outputs):
        shards = reach_shard[o] & shards_of_size.get(nodes[o].out_elements, 0)
        if not shards or not reach_param[o] & params_of_shape.get((nodes[o].dtype, nodes[o].out_elements), 0):
            continue
        while shards:
            bit = shards & -shards
            shards ^= bit
            collective, slice_ = shard_of[by_bit[bit]]
            first, outs = scatters.get(collective, (slice_, ()))
            scatters[collective] = (first, (*outs, o))
    return _Found(gathers, scatters)


def _updated_parameter(nodes: Sequence[Node], preds: list[list[int]], outputs: Sequence[int],
                       numbers: Mapping[int, int], flow: _Flow | None = None, shard: int | None = None,
                       gathered: frozenset[int] = frozenset()) -> int | None:
    """The parameter an all-reduce's (or reduce-scatter's) shard updates: of an output's dtype and
    count upstream of one of ``outputs`` through elementwise and pass-through ops (``p - lr * g``).

    Of the outputs, those that read ``shard`` itself through such ops (the shard's own update and
    optimizer state; not every parameter's, which a clipped global norm makes read every shard); of
    their parameters, one the step gathers (the parameter, not its optimizer state), else the
    lowest-numbered (the parameter before its optimizer state, as a TrainState orders them)."""
    reads = [o for o in outputs if shard is not None and shard in _elementwise_upstream(nodes, preds, o, flow)]
    found = [p for o in reads or outputs for p in _parameters_updating(nodes, preds, o, flow)]
    found = [p for p in found if p in gathered] or found
    return min(found, key=lambda p: (numbers.get(p, 1 << 30), p)) if found else None


def _elementwise_upstream(nodes: Sequence[Node], preds: list[list[int]], output: int,
                          flow: _Flow | None = None) -> set[int]:
    """The nodes upstream of ``output`` through elementwise, pass-through ops and moves, the first
    non-elementwise one on each path included; with ``flow``, a ``get-tuple-element`` is followed to
    its element alone (a shard_map's boundary joins every parameter's gradient in one tuple)."""
    from disco.ir import opcodes as _opcodes

    stack, seen = [output], {output}
    while stack:
        i = stack.pop()
        node = nodes[i]
        if node.opcode == "parameter":
            continue
        if flow is not None and node.opcode == "get-tuple-element" and i in flow.tuple_index and preds[i]:
            src = _element_source(nodes, preds, flow, preds[i][0], flow.tuple_index[i])
            if src is not None:
                if src not in seen:
                    seen.add(src)
                    stack.append(src)
                continue
        if node.opcode in _PASS_THROUGH or node.opcode in _opcodes.ELEMENTWISE or node.opcode in _MOVES:
            for p in preds[i]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
    return seen


def _parameters_updating(nodes: Sequence[Node], preds: list[list[int]], output: int,
                         flow: _Flow | None = None) -> list[int]:
    """The parameters of ``output``'s dtype and count in :func:`_elementwise_upstream`."""
    size = (nodes[output].dtype, nodes[output].out_elements)
    return sorted(i for i in _elementwise_upstream(nodes, preds, output, flow)
                  if nodes[i].opcode == "parameter" and (nodes[i].dtype, nodes[i].out_elements) == size)


def parameter_paths(nodes: Sequence[Node], edges: Sequence[tuple[int, int]],
                    op_names: Mapping[int, str | None], numbers: Mapping[int, int],
                    tuple_index: Mapping[int, int] | None = None) -> dict[int, str]:
    """Node index -> parameter path, for each all-gather of a parameter shard and each
    collective that scatters a gradient back to its shard (what :func:`label_collectives` calls
    ``"param_gather"`` and ``"grad_scatter"``).

    Args:
      nodes, edges: a graph's nodes (in a topological order) and edges.
      op_names: parameter node index -> the op_name jax gave it (None without); a parameter
        without one is named by its instruction name.
      numbers: parameter node index -> its parameter number (a gradient is named for the
        lowest-numbered parameter it updates: the parameter, not its optimizer state).
      tuple_index: ``get-tuple-element`` node index -> its index: with it, gathers and scatters
        inside a shard_map's body are followed to the step's parameters (module docstring).
    """
    found = _find(nodes, edges, tuple_index)
    preds = predecessors(len(nodes), edges)
    flow = _flow(nodes, tuple_index)

    def name(p: int | None, fallback: int) -> str:
        if p is None:
            return nodes[fallback].name
        return op_names.get(p) or nodes[p].name

    out = {g: name(p, g) for g, p in found.gathers.items()}
    gathered = frozenset(found.gathers.values())
    for c, (slice_, updated) in found.scatters.items():
        shard = slice_ if slice_ is not None else c
        out[c] = name(_updated_parameter(nodes, preds, updated, numbers, flow, shard, gathered), c)
    return out


def mesh_axes_of(groups: list[tuple[int, ...]] | None, mesh: Sequence[tuple[str, int]]) -> tuple[str, ...] | None:
    """The mesh axes (of size > 1, in mesh order) whose devices make up ``groups``; None when no
    set of axes does. Devices are laid out row-major over the mesh (device ``i`` at position
    ``i`` of ``jax.make_mesh``'s order), as jax's default mesh of the first devices is."""
    if groups is None or not mesh:
        return None
    sizes = [s for _, s in mesh]
    total = 1
    for s in sizes:
        total *= s
    want = sorted(tuple(sorted(g)) for g in groups)
    if sorted(d for g in want for d in g) != list(range(total)):
        return None
    names = [a for a, s in mesh if s > 1]
    for r in range(len(names) + 1):
        for axes in itertools.combinations(names, r):
            if _groups_over(mesh, axes) == want:
                return axes
    return None


def _groups_over(mesh: Sequence[tuple[str, int]], axes: tuple[str, ...]) -> list[tuple[int, ...]]:
    strides, stride = {}, 1
    for name, size in reversed(mesh):
        strides[name] = stride
        stride *= size
    sizes = dict(mesh)
    others = [a for a, _ in mesh if a not in axes]
    groups = []
    for outer in itertools.product(*(range(sizes[a]) for a in others)):
        base = sum(i * strides[a] for a, i in zip(others, outer))
        groups.append(tuple(sorted(base + sum(i * strides[a] for a, i in zip(axes, inner))
                                   for inner in itertools.product(*(range(sizes[a]) for a in axes)))))
    return sorted(groups)


def label_collectives(graph: HloGraph) -> list[Collective]:
    """Every collective of ``graph`` (an async pair once, at its start), in program order, labelled
    ``param_gather``, ``grad_scatter``, ``grad_reduce`` or ``other`` (see the module's docstring),
    with the mesh axes it spans over ``graph.mesh``.

    Example::

      step, args = trax_models.make_train_step("mlp", devices=8, style="fsdp")
      graph = disco.extract(step, *args)
      collections.Counter(c.role for c in label_collectives(graph))
    """
    nodes, found = graph.nodes, _find(graph.nodes, graph.edges)
    index = graph.index()
    out = []
    for i, node in enumerate(nodes):
        if not node.is_collective:
            continue
        slice_ = None
        # a gather or reduce-scatter its build named (across a shard_map's boundary, which only the
        # build's tuple indices follow) keeps that label
        named = node.param_path is not None and not node.is_all_reduce
        if i in found.gathers or (named and node.opcode in _GATHERS):
            role = "param_gather"
        elif i in found.scatters or (named and node.opcode in _SCATTERS):
            role = "grad_scatter"
            s = found.scatters[i][0] if i in found.scatters else None
            slice_ = nodes[s].name if s is not None else None
        elif node.is_gradient:
            role = "grad_reduce"
        else:
            role = "other"
        if node.opcode in _GATHERS:
            size = node.out_bytes
        elif node.is_all_reduce:
            size = node.grad_bytes or node.out_bytes
        else:
            ops = [nodes[index[o]] for o in node.operands if o in index]
            size = sum(o.out_bytes for o in ops) if ops else node.out_bytes
        groups = replica_group_lists(node.replica_groups)
        out.append(Collective(
            name=node.name, opcode=node.opcode, role=role, axes=mesh_axes_of(groups, graph.mesh),
            group_size=replica_group_size(node.replica_groups), bytes=size,
            param=node.param_path if role != "other" else None, slice=slice_))
    return out


_COMPUTES_LIKE_A_LIBRARY = frozenset({"dot", "convolution"})  # never loop-fused on XLA:CPU: their value is kept


def first_uses(graph: HloGraph) -> dict[str, int]:
    """Per parameter all-gather (``param_gather``, by name), the node index of its first use: the
    first op in program order that computes with the gathered value (read through :data:`_MOVES`),
    a dot or convolution when one reads it (XLA keeps their values: an anchor there keeps its barrier;
    an elementwise one XLA may fold away, see docs/guides/sharded-plans.md), else any. A gather no op
    computes with is left out."""
    from disco.ir.opcodes import ZERO_COST_OPCODES

    nodes = graph.nodes
    succ = _successors(len(nodes), graph.edges)
    index = graph.index()
    out: dict[str, int] = {}
    for c in label_collectives(graph):
        if c.role != "param_gather" or c.opcode != "all-gather":
            continue
        stack, seen, uses = [index[c.name]], {index[c.name]}, []
        while stack:
            for s in succ[stack.pop()]:
                if s in seen:
                    continue
                seen.add(s)
                if nodes[s].opcode in _MOVES or nodes[s].opcode in ZERO_COST_OPCODES:
                    stack.append(s)
                else:
                    uses.append(s)
        if uses:
            library = [u for u in uses if nodes[u].opcode in _COMPUTES_LIKE_A_LIBRARY]
            out[c.name] = min(library or uses)
    return out


def role_counts(collectives: Sequence[Collective]) -> dict[str, dict[str, int]]:
    """``{role: {axes: count}}`` (axes joined by ``x``; ``"?"`` when unknown), roles with none left out."""
    out: dict[str, dict[str, int]] = {}
    for c in collectives:
        axes = "?" if c.axes is None else "x".join(c.axes) or "-"
        by_axes = out.setdefault(c.role, {})
        by_axes[axes] = by_axes.get(axes, 0) + 1
    return {r: out[r] for r in ROLES if r in out}

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


def _gathered_parameter(nodes: Sequence[Node], preds: list[list[int]], gather: int) -> int | None:
    """The parameter node an all-gather's operand comes from through :data:`_MOVES` of its count."""
    if not preds[gather]:
        return None
    i = preds[gather][0]
    size = nodes[i].out_elements
    while True:
        node = nodes[i]
        if node.out_elements != size:
            return None
        if node.opcode == "parameter":
            return i
        if node.opcode not in _MOVES or not preds[i]:
            return None
        i = preds[i][0]


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


def _find(nodes: Sequence[Node], edges: Sequence[tuple[int, int]]) -> _Found:
    n = len(nodes)
    preds, succ = predecessors(n, edges), _successors(n, edges)
    outputs = results(nodes, preds, [i for i in range(len(nodes)) if not succ[i]])
    updated: set[int] | None = None  # the parameters the step updates (not its batch), on first need
    gathers = {}
    for i, node in enumerate(nodes):
        if node.opcode in _GATHERS:
            p = _gathered_parameter(nodes, preds, i)
            if p is not None and updated is None:
                updated = {q for o in outputs for q in _parameters_updating(nodes, preds, o)}
            if p is not None and p in updated:
                gathers[i] = p
    # a candidate shard: a slice of an all-reduce's result, or a reduce-scatter's result
    shard_of: dict[int, tuple[int, int | None]] = {}  # shard node -> (collective, slice)
    for i, node in enumerate(nodes):
        if node.opcode in _ALL_REDUCES:
            for s in _slices_of(nodes, succ, i):
                shard_of.setdefault(s, (i, s))
        elif node.opcode in _SCATTERS:
            shard_of.setdefault(i, (i, None))
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
                       numbers: Mapping[int, int]) -> int | None:
    """The lowest-numbered parameter (the parameter before its optimizer state) of an output's
    dtype and count upstream of one of ``outputs`` through elementwise and pass-through ops
    (``p - lr * g``)."""
    found = [p for o in outputs for p in _parameters_updating(nodes, preds, o)]
    return min(found, key=lambda p: (numbers.get(p, 1 << 30), p)) if found else None


def _parameters_updating(nodes: Sequence[Node], preds: list[list[int]], output: int) -> list[int]:
    from disco.ir import opcodes as _opcodes

    size = (nodes[output].dtype, nodes[output].out_elements)
    stack, seen, found = [output], {output}, []
    while stack:
        i = stack.pop()
        node = nodes[i]
        if node.opcode == "parameter":
            if (node.dtype, node.out_elements) == size:
                found.append(i)
            continue
        if node.opcode in _PASS_THROUGH or node.opcode in _opcodes.ELEMENTWISE:
            for p in preds[i]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
    return found


def parameter_paths(nodes: Sequence[Node], edges: Sequence[tuple[int, int]],
                    op_names: Mapping[int, str | None], numbers: Mapping[int, int]) -> dict[int, str]:
    """Node index -> parameter path, for each all-gather of a parameter shard and each
    collective that scatters a gradient back to its shard (what :func:`label_collectives` calls
    ``"param_gather"`` and ``"grad_scatter"``).

    Args:
      nodes, edges: a graph's nodes (in a topological order) and edges.
      op_names: parameter node index -> the op_name jax gave it (None without); a parameter
        without one is named by its instruction name.
      numbers: parameter node index -> its parameter number (a gradient is named for the
        lowest-numbered parameter it updates: the parameter, not its optimizer state).
    """
    found = _find(nodes, edges)
    preds = predecessors(len(nodes), edges)

    def name(p: int | None, fallback: int) -> str:
        if p is None:
            return nodes[fallback].name
        return op_names.get(p) or nodes[p].name

    out = {g: name(p, g) for g, p in found.gathers.items()}
    for c, (_, updated) in found.scatters.items():
        out[c] = name(_updated_parameter(nodes, preds, updated, numbers), c)
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
        if i in found.gathers:
            role = "param_gather"
        elif i in found.scatters:
            role = "grad_scatter"
            s = found.scatters[i][0]
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


def role_counts(collectives: Sequence[Collective]) -> dict[str, dict[str, int]]:
    """``{role: {axes: count}}`` (axes joined by ``x``; ``"?"`` when unknown), roles with none left out."""
    out: dict[str, dict[str, int]] = {}
    for c in collectives:
        axes = "?" if c.axes is None else "x".join(c.axes) or "-"
        by_axes = out.setdefault(c.role, {})
        by_axes[axes] = by_axes.get(axes, 0) + 1
    return {r: out[r] for r in ROLES if r in out}

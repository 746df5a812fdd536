"""What a step's graph needs before disco can plan it: all-reduces, each gradient reduced once,
gradients disco recognises.

A data-parallel step written with ``jax.shard_map`` (or ``jax.pmap``) reduces its gradients
with explicit all-reduces in the pre-optimisation HLO; a ``jax.jit`` step with shardings
(GSPMD) gets them from XLA's SPMD partitioner, and disco reads its partitioned program
(:mod:`disco.ir.gspmd`). A step on one device has none, and a step that reduces a gradient
twice (a ``pmean`` of a gradient jax already summed) has an all-reduce feeding another, which
no bucketing can merge. Gradients are found by dataflow (an all-reduce whose result feeds the
parameter update, :func:`disco.ir.gradients.dataflow_gradients`), or named by a
``jax.named_scope("disco_grad[...]")`` around their all-reduce, which wins where present; when
neither finds one every all-reduce (the loss's too) is bucketed alike. The guide "Bring your own step"
(docs/guides/your-own-step.md) shows steps that pass these checks.
"""

from __future__ import annotations

import warnings
from collections import Counter

from disco.ir import opcodes as _opcodes
from disco.ir.opcodes import COLLECTIVES
from disco.ir.gradients import predecessors, reaching
from disco.ir.graph import HloGraph

GUIDE_POINTER = "see docs/guides/your-own-step.md (Bring your own step)"


class NoGradientWarning(UserWarning):
    """The step has all-reduces but none feeds a parameter update and none is inside
    ``jax.named_scope("disco_grad[...]")``: disco cannot tell gradients from the loss, so the
    loss's all-reduce is bucketed with them."""


def all_reduce_dependencies(graph: HloGraph) -> dict[str, frozenset[str]]:
    """Each all-reduce's name -> the all-reduces whose results it depends on (through any path).

    Linear passes in program order (a topological order), with the upstream sets as bitsets.
    """
    ars = [i for i, n in enumerate(graph.nodes) if n.is_all_reduce]
    bit = {i: 1 << k for k, i in enumerate(ars)}
    reach = reaching(predecessors(len(graph.nodes), graph.edges), bit)  # itself included
    names = [graph.nodes[i].name for i in ars]
    out: dict[str, frozenset[str]] = {}
    for k, i in enumerate(ars):
        ups = []
        rest = reach[i] & ~bit[i]
        while rest:  # its set bits, lowest first: O(upstream all-reduces), not O(all-reduces)
            low = rest & -rest
            ups.append(names[low.bit_length() - 1])
            rest ^= low
        out[names[k]] = frozenset(ups)
    return out


# what a gradient reduced twice passes through between its two all-reduces: elementwise ops
# (jax's pmean divides; a clip multiplies) and ops that only move or relabel the values
_SAME_VALUES = _opcodes.ELEMENTWISE | {"copy", "bitcast", "reshape", "transpose"}


def double_reductions(graph: HloGraph) -> list[tuple[str, str]]:
    """(upstream, downstream) all-reduce pairs where the first one's result reaches the second through
    elementwise ops alone (and copies, reshapes, transposes), both reduce as many elements of one
    dtype, and the second reduces a gradient (any all-reduce, when the graph has no gradient disco
    recognises): a gradient reduced twice.

    One pair per downstream all-reduce (the first such upstream one, in program order). Other
    all-reduces feeding one are no double reduction: the token count a GSPMD step's masked mean
    divides by, which its gradients depend on, the expert dispatch XLA's partitioner reduces in a
    mixture-of-experts forward pass, feeding the next layer's, or a batch norm's statistics, reduced
    in the forward pass and broadcast over the batch before its parameters' gradients are summed
    over it again. No bucket may hold both (plan validation refuses the cycle), but nothing in the
    step is wrong.
    """
    deps = all_reduce_dependencies(graph)
    nodes = {n.name: n for n in graph.all_reduces()}
    order = {n.name: i for i, n in enumerate(graph.all_reduces())}
    any_gradient = any(n.is_gradient for n in nodes.values())
    preds = predecessors(len(graph.nodes), graph.edges)
    index = graph.index()
    pairs = []
    for name, ups in deps.items():
        node = nodes[name]
        if any_gradient and not node.is_gradient:
            continue
        same = {u for u in ups if (nodes[u].dtype, nodes[u].out_elements) == (node.dtype, node.out_elements)}
        found = _reached_through_same_values(graph, preds, index[name], {index[u] for u in same})
        if found:
            pairs.append((min((graph.nodes[i].name for i in found), key=order.__getitem__), name))
    return sorted(pairs, key=lambda p: order[p[1]])


def _reached_through_same_values(graph: HloGraph, preds: list[list[int]], start: int, targets: set[int]) -> set[int]:
    """The ``targets`` reached from ``start``'s operands back through :data:`_SAME_VALUES` ops of
    ``start``'s element count, and through the bodies of inlined calls (each target itself may be
    reached, not passed)."""
    if not targets:
        return set()
    size = graph.nodes[start].out_elements
    found: set[int] = set()
    stack, seen = list(preds[start]), set(preds[start])
    while stack:
        i = stack.pop()
        if i in targets:
            found.add(i)
            continue
        node = graph.nodes[i]
        if node.out_elements != size:
            continue
        if node.opcode == "call":  # an inlined call (jnp.clip's nested jit): through its body, from its root
            through = [p for p in preds[i] if graph.nodes[p].computation != node.computation]
        elif node.opcode == "parameter" or node.opcode in _SAME_VALUES:  # an inlined body's parameter: its operand
            through = preds[i]
        else:
            continue
        for p in through:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return found


def check_data_parallel(graph: HloGraph) -> None:
    """Checks that disco can plan ``graph``'s all-reduces; warns when no gradient is recognised.

    A step with sharded parameters (FSDP) passes: its all-gathers of parameter shards and its
    gradients' scatters to them are what :mod:`disco.ir.sharded` labels, its all-reduces (a gradient
    returned to its shard as an all-reduce and a slice, XLA:CPU's form) checked as any others; one
    with reduce-scatters and no all-reduce (XLA:GPU's form) passes on its gathers and scatters.

    Raises:
      ValueError: when the step's program has no all-reduce (a step on one device) and no gather
        or scatter of a parameter shard, or an all-reduce feeds another (a gradient reduced
        twice), naming them.

    Warns:
      NoGradientWarning: all-reduces but no gradient found (by dataflow or scope), and no gradient
        scattered by a reduce-scatter either (a shard_map FSDP step's ``psum_scatter``, whose one
        all-reduce is its loss's).
    """
    ars = graph.all_reduces()
    others = Counter(n.opcode.removesuffix("-start") for n in graph.nodes if n.opcode in COLLECTIVES
                     and not n.opcode.endswith("-done") and not n.opcode.startswith("all-reduce"))
    # a step with sharded parameters (FSDP): its gathers and gradient scatters are planned too
    sharded = not ars and others and any(c.role in ("param_gather", "grad_scatter") for c in graph.collective_roles())
    if not ars and others and not sharded:
        shown = ", ".join(f"{k} {name}{'s' if k > 1 else ''}" for name, k in sorted(others.items()))
        raise ValueError(
            f"no all-reduce in the program of {graph.name!r}, but {shown}, none of which gathers a parameter "
            f"shard or scatters a gradient to one: its parameters or batch are sharded in another way than data "
            f"parallelism or FSDP (tensor parallelism), whose collectives disco does not plan yet; expected "
            f"replicated or FSDP-sharded parameters and a sharded batch; {GUIDE_POINTER}")
    if sharded:
        return  # gathers and reduce-scatters, no all-reduce: nothing below applies
    if not ars:
        raise ValueError(
            f"no all-reduce in the program of {graph.name!r}: a data-parallel step is expected (jax.jit with "
            f"the batch sharded over several devices, shard_map or pmap); this one runs on one device or "
            f"reduces nothing; {GUIDE_POINTER}")
    pairs = double_reductions(graph)
    if pairs:
        shown = ", ".join(f"{a} -> {b}" for a, b in pairs[:3]) + (", ..." if len(pairs) > 3 else "")
        raise ValueError(
            f"an all-reduce feeds another all-reduce ({shown}): reduce each gradient once (in shard_map, "
            f"jax already sums the gradient of a parameter that is not pcast to varying; pmean it only "
            f"after jax.lax.pcast(params, axis, to='varying')); {GUIDE_POINTER}")
    # a shard_map FSDP step scatters every gradient (psum_scatter) and all-reduces only its loss
    if not any(n.is_gradient for n in ars) and not any(
            c.role == "grad_scatter" and c.opcode.startswith("reduce-scatter") for c in graph.collective_roles()):
        warnings.warn(
            f"{graph.name}: {len(ars)} all-reduces but no gradient recognised (none feeds a parameter "
            "update, none inside jax.named_scope('disco_grad[<parameter path>]')); the loss's all-reduce is "
            f"bucketed with the gradients; {GUIDE_POINTER}", NoGradientWarning, stacklevel=2)

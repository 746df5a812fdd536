"""Which all-reduces reduce gradients, found by dataflow, where no ``disco_grad`` scope names them.

A step whose gradients no ``jax.named_scope("disco_grad[...]")`` names (most jax programs) still
has gradient all-reduces: those whose result feeds the parameter update (:func:`dataflow_gradients`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from disco.ir import opcodes as _opcodes

if TYPE_CHECKING:
    from disco.ir.graph import Node

# Ops that pass a value on to the step's outputs unchanged (the wrappers around a step's results).
# What sits between the step's results and its root.
PASS_THROUGH = frozenset({"tuple", "get-tuple-element", "custom-call", "copy", "bitcast", "reshape", "call"})


def results(nodes: Sequence[Node], preds: Sequence[Sequence[int]], starts: Iterable[int]) -> set[int]:
    """The step's results: the nodes ``starts`` (its root, or its sinks) read through pass-through
    ops (:data:`PASS_THROUGH`: tuples, copies, reshapes, inlined calls)."""
    stack = list(dict.fromkeys(starts))
    seen, out = set(stack), set()
    while stack:
        i = stack.pop()
        if nodes[i].opcode in PASS_THROUGH:
            for p in preds[i]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        else:
            out.add(i)
    return out


def predecessors(n_nodes: int, edges: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Each node's producers, from (producer, consumer) edges."""
    preds: list[list[int]] = [[] for _ in range(n_nodes)]
    for s, d in edges:
        preds[d].append(s)
    return preds


def reaching(preds: Sequence[Sequence[int]], seeds: dict[int, int]) -> list[int]:
    """Per node (in a topological order), the OR of the seed bits of itself and every node upstream.

    ``seeds`` maps node indices to bits (one per node of interest); one linear pass.
    """
    out = [0] * len(preds)
    for i, ps in enumerate(preds):
        bits = seeds.get(i, 0)
        for p in ps:
            bits |= out[p]
        out[i] = bits
    return out


def dataflow_gradients(nodes: Sequence[Node], edges: Sequence[tuple[int, int]], root: int,
                       op_names: dict[int, str | None], numbers: dict[int, int]) -> dict[int, str]:
    """The all-reduces that reduce gradients, found by dataflow: node index -> parameter path.

    An all-reduce reduces a gradient when its result feeds the parameter update: it reaches a
    step output of its element count (the updated parameter, or an optimizer state of the
    parameter's shape: XLA's partitioner may reduce a transposed gradient, and under mixed
    precision it reduces the gradient in the compute dtype, bf16, before the convert to the
    parameter's), and a parameter of the output's dtype and element count reaches the same output.
    The loss's all-reduce reaches only the loss, which no parameter of its size reaches (unless
    the model has a scalar parameter of the loss's dtype), and an all-reduce that jax's metadata places in
    a forward pass (``jvp(`` without ``transpose(``) is never one. The path is the matching
    parameter's name as jax wrote it (``params['dense']['kernel']``), or its instruction name.

    Args:
      nodes, edges: the graph's nodes (in a topological order) and edges.
      root: the index of the step's root node.
      op_names: parameter and all-reduce node index -> the op_name jax gave it (None without).
      numbers: parameter node index -> its parameter number.
    """
    preds = predecessors(len(nodes), edges)
    outputs = results(nodes, preds, [root])
    ar_bit = {i: 1 << k for k, i in enumerate(i for i, n in enumerate(nodes) if n.is_all_reduce)}
    params = [i for i, n in enumerate(nodes) if n.opcode == "parameter"]
    param_bit = {i: 1 << k for k, i in enumerate(params)}
    ars_of_size: dict[int, int] = collections.defaultdict(int)  # by element count, whatever the dtype
    params_of_shape: dict[tuple[str, int], int] = collections.defaultdict(int)
    for i, bit in ar_bit.items():
        ars_of_size[nodes[i].out_elements] |= bit
    for i, bit in param_bit.items():
        params_of_shape[(nodes[i].dtype, nodes[i].out_elements)] |= bit
    reach_ar = reaching(preds, ar_bit)  # all-reduces upstream of a node, itself included
    reach_param = reaching(preds, param_bit)
    by_bit = {bit: i for i, bit in ar_bit.items()}
    candidates = []
    for o in outputs:
        size = (nodes[o].dtype, nodes[o].out_elements)
        grads = reach_ar[o] & ars_of_size.get(nodes[o].out_elements, 0)
        if grads and reach_param[o] & params_of_shape.get(size, 0):
            candidates.append((bin(grads).count("1"), o, grads))
    best: dict[int, tuple[int, int, str]] = {}
    for count, o, grads in candidates:  # the output fed by the fewest all-reduces, then the first parameter
        rank = (count, *_updated_parameter(nodes, preds, o, op_names, numbers))
        while grads:
            bit = grads & -grads
            grads ^= bit
            i = by_bit[bit]
            if i not in best or rank < best[i]:
                best[i] = rank
    found = {i: rank[2] for i, rank in best.items()}
    return {i: path for i, path in found.items() if not _in_forward_pass(op_names.get(i))}


def _updated_parameter(nodes: Sequence[Node], preds: list[list[int]], output: int,
                       op_names: dict[int, str | None], numbers: dict[int, int]) -> tuple[int, str]:
    """The parameter an output updates, as (parameter number, name): of the output's size,
    reached back through elementwise ops (``p - lr * g``); the lowest-numbered one jax named."""
    size = (nodes[output].dtype, nodes[output].out_elements)
    stack, seen, found = [output], {output}, []
    while stack:
        i = stack.pop()
        node = nodes[i]
        if node.opcode == "parameter" and (node.dtype, node.out_elements) == size:
            found.append(i)
        if node.opcode in PASS_THROUGH or node.opcode in _opcodes.ELEMENTWISE or node.opcode == "parameter":
            for p in preds[i]:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
    named = sorted((numbers.get(i, 1 << 30), str(op_names[i])) for i in found if op_names.get(i))
    if named:
        return named[0]
    return (1 << 30, nodes[min(found)].name if found else nodes[output].name)


def _in_forward_pass(op_name: str | None) -> bool:
    """jax's op_name places an instruction in a forward (linearised, not transposed) pass."""
    return op_name is not None and "jvp(" in op_name and "transpose(" not in op_name

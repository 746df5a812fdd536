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
    return {graph.nodes[i].name: frozenset(graph.nodes[j].name for j in ars if j != i and reach[i] & bit[j])
            for i in ars}


def double_reductions(graph: HloGraph) -> list[tuple[str, str]]:
    """(upstream, downstream) all-reduce pairs where the first one's result reaches the second, both
    reduce as many elements of one dtype, and the second reduces a gradient (any all-reduce, when
    the graph has no gradient disco recognises): a gradient reduced twice.

    One pair per downstream all-reduce (the first such upstream one, in program order). Other
    all-reduces feeding one are no double reduction: the token count a GSPMD step's masked mean
    divides by, which its gradients depend on, or the expert dispatch XLA's partitioner reduces in
    a mixture-of-experts forward pass, feeding the next layer's. No bucket may hold both (plan
    validation refuses the cycle), but nothing in the step is wrong.
    """
    deps = all_reduce_dependencies(graph)
    nodes = {n.name: n for n in graph.all_reduces()}
    order = {n.name: i for i, n in enumerate(graph.all_reduces())}
    any_gradient = any(n.is_gradient for n in nodes.values())
    pairs = []
    for name, ups in deps.items():
        node = nodes[name]
        if any_gradient and not node.is_gradient:
            continue
        same = sorted((u for u in ups if (nodes[u].dtype, nodes[u].out_elements) == (node.dtype, node.out_elements)),
                      key=order.__getitem__)
        if same:
            pairs.append((same[0], name))
    return sorted(pairs, key=lambda p: order[p[1]])


def check_data_parallel(graph: HloGraph) -> None:
    """Checks that disco can plan ``graph``'s all-reduces; warns when no gradient is recognised.

    Raises:
      ValueError: when the step's program has no all-reduce (a step on one device), or an
        all-reduce feeds another (a gradient reduced twice), naming them.

    Warns:
      NoGradientWarning: all-reduces but no gradient found (by dataflow or scope).
    """
    ars = graph.all_reduces()
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
    if not any(n.is_gradient for n in ars):
        warnings.warn(
            f"{graph.name}: {len(ars)} all-reduces but no gradient recognised (none feeds a parameter "
            "update, none inside jax.named_scope('disco_grad[<parameter path>]')); the loss's all-reduce is "
            f"bucketed with the gradients; {GUIDE_POINTER}", NoGradientWarning, stacklevel=2)

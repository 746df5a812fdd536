"""What a step's graph needs before disco can plan it: all-reduces, each gradient reduced once,
gradients disco recognises.

A data-parallel step written with ``jax.shard_map`` (or ``jax.pmap``) reduces its gradients
with explicit all-reduces in the pre-optimisation HLO; a ``jax.jit`` step with shardings
(GSPMD) gets them from XLA's SPMD partitioner, and disco reads its partitioned program
(:mod:`disco.ir.gspmd`). A step on one device has none, and a step that reduces a gradient
twice (a ``pmean`` of a gradient jax already summed) has an all-reduce feeding another, which
no bucketing can merge. Gradients are found by dataflow (an all-reduce whose result feeds the
parameter update, :func:`disco.ir.graph.dataflow_gradients`), or named by a
``jax.named_scope("disco_grad[...]")`` around their all-reduce, which wins where present; when
neither finds one every all-reduce (the loss's too) is bucketed alike. The guide "Bring your own step"
(docs/guides/your-own-step.md) shows steps that pass these checks.
"""

from __future__ import annotations

import warnings

from disco.ir.graph import HloGraph

GUIDE_POINTER = "see docs/guides/your-own-step.md (Bring your own step)"


class NoGradientWarning(UserWarning):
    """The step has all-reduces but none feeds a parameter update and none is inside
    ``jax.named_scope("disco_grad[...]")``: disco cannot tell gradients from the loss, so the
    loss's all-reduce is bucketed with them."""


def double_reductions(graph: HloGraph) -> list[tuple[str, str]]:
    """(upstream, downstream) all-reduce pairs where the first one's result reaches the second.

    One pair per downstream all-reduce (the first upstream one found). Linear in the graph's
    size: one pass in program order, which is a topological order.
    """
    preds: list[list[int]] = [[] for _ in graph.nodes]
    for s, d in graph.edges:
        preds[d].append(s)
    upstream: list[int | None] = [None] * len(graph.nodes)  # an all-reduce this node depends on
    pairs = []
    for i, node in enumerate(graph.nodes):
        up = next((p if graph.nodes[p].is_all_reduce else upstream[p] for p in preds[i]
                   if graph.nodes[p].is_all_reduce or upstream[p] is not None), None)
        if node.is_all_reduce and up is not None:
            pairs.append((graph.nodes[up].name, node.name))
        upstream[i] = up
    return pairs


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

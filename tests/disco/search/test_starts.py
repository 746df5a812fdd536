"""The search's CPU start points for reductions: grouped with their elementwise neighbours, or kept
out of YNNPACK by compile option (disco.search._starts, issue 21)."""

from __future__ import annotations

import functools

import jax

import trax_models
import xla_hooks
from disco import search
from disco.ir.extractor import extract
from disco.ir.opcodes import FUSIBLE_OPCODES
from disco.plans import moves
from disco.plans import options as plan_options
from tests.support.equivalence import assert_close, three_steps
from tests.support.ynn import default_ynn_fusions, ynn_fusions

DEVICES = 2


@functools.cache
def setup(name):
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES, optimizer="sgd")
    return step, args, extract(step, *args)


def test_reduce_fusion_groups_one_reduce_each_with_elementwise_neighbours():
    graph = setup("unet")[2]
    plan = search.reduce_fusion(graph)
    assert plan.name == "reduce_fusion" and plan.buckets is None and len(plan.groups) >= 5
    plan.validate(graph)
    index = graph.index()
    n_reduces = sum(n.opcode == "reduce" for n in graph.nodes)
    for group in plan.groups:
        ops = [graph.nodes[index[m]].opcode for m in group]
        assert ops.count("reduce") == 1 and set(ops) <= FUSIBLE_OPCODES and 2 <= len(group) <= 16, ops
    assert len(plan.groups) <= n_reduces
    assert search.reduce_fusion(graph) == plan  # deterministic


def test_default_starts_add_both_forms_on_cpu_only():
    graph = setup("unet")[2]
    cpu = {p.name: p for p in search.default_starts(graph, None, moves.context(graph))}
    assert "reduce_fusion" in cpu
    assert dict(cpu["xla_default+ynn_no_reduce"].compile_options) == {
        plan_options.YNN_FUSION_TYPE: plan_options.YNN_NO_REDUCE}
    gpu = {p.name for p in search.default_starts(graph, None, moves.context(graph, "gpu"))}
    assert not {"reduce_fusion", "xla_default+ynn_no_reduce"} & gpu


def test_reduce_fusion_applies_with_fewer_ynn_fusions_and_same_numbers():
    """The start compiles on CPU, hands fewer reductions to YNNPACK than XLA's default, and three
    steps agree with jax.jit's within the tests' tolerance."""
    step, args, graph = setup("unet")
    before = default_ynn_fusions(step, args)
    applied = xla_hooks.apply(search.reduce_fusion(graph), step, *args, strict=True)
    assert applied.applied, applied.fallback_reason
    after = ynn_fusions(applied.compiled_text())
    assert after < before, f"YNN fusions {before} -> {after}"
    assert_close(three_steps(applied, args), three_steps(jax.jit(step), args))

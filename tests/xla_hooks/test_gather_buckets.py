"""Gather buckets applied to the real compile: a sharded (FSDP) zoo step's parameter all-gathers merged
into the plan's buckets, the compiled module holding that many all-gathers, the numbers unchanged."""

from __future__ import annotations

import functools
import re

import jax
import pytest

import disco
import trax_models
from disco.plans import baselines
from disco.plans.plan import make_plan
from tests.support.equivalence import apply_strictly, assert_close, compiled_count, three_steps

DEVICES = 8


@functools.cache
def setup(name, mesh_shape, optimizer="sgd"):
    # SGD, as tests/xla_hooks/test_apply_plan.py: Adam amplifies the rounding noise of parameters whose
    # true gradient is zero (attention key biases) to the learning rate's scale
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES, style="fsdp", mesh_shape=mesh_shape,
                                             optimizer=optimizer)
    graph = disco.extract(step, *args)
    return step, args, graph, three_steps(jax.jit(step), args)


def _gathers(graph):
    return [c.name for c in graph.collective_roles() if c.role == "param_gather"]




@pytest.mark.parametrize(("name", "mesh_shape"), [
    ("mlp", None), ("mlp", (2, 4)), ("transformer_lm", None),
    pytest.param("transformer_lm", (2, 4), marks=pytest.mark.slow),
    pytest.param("resnet50", None, marks=pytest.mark.slow),  # kernels gathered again reversed, in the buckets too
])
@pytest.mark.parametrize("n_buckets", [1, 2])
def test_gather_buckets_apply_as_that_many_all_gathers_and_keep_the_numbers(name, mesh_shape, n_buckets):
    step, args, graph, reference = setup(name, mesh_shape)
    gathers = _gathers(graph)
    if name != "resnet50":  # which also gathers an activation
        assert len(gathers) == sum(n.opcode == "all-gather" for n in graph.nodes)  # the zoo gathers parameters only
    others = sum(n.opcode == "all-gather" for n in graph.nodes) - len(gathers)
    half = -(-len(gathers) // n_buckets)
    plan = make_plan(gather_buckets=[gathers[i:i + half] for i in range(0, len(gathers), half)]).validate(graph)
    applied = apply_strictly(plan, step, args)
    default = jax.jit(step).lower(*args).compile().as_text()
    assert len(re.findall(r"\sall-gather\(", default)) == len(gathers) + others  # XLA:CPU merges none itself
    assert compiled_count(applied, "all-gather") == n_buckets + others
    assert_close(three_steps(applied, args), reference)


@pytest.mark.parametrize("name", ["mlp", "transformer_lm"])
def test_the_gather_baselinesapply_strictly(name):
    step, args, graph, reference = setup(name, None)
    for baseline in baselines.GATHER_NAMES:
        plan = baselines.make(baseline, graph)
        applied = apply_strictly(plan, step, args)
        assert compiled_count(applied, "all-gather") == len(plan.gather_buckets), baseline
        assert_close(three_steps(applied, args), reference)
    layers = {baselines.layer_of(p) for p in _counts(graph)}
    per_layer = baselines.make("per_layer_gathers", graph)
    # one bucket per layer, and one more per layer whose parameters the backward pass gathers again
    again = {baselines.layer_of(p) for p, k in _counts(graph).items() if k > 1}
    assert len(per_layer.gather_buckets) == len(layers) + len(again)
    assert baselines.make("one_gather_bucket", graph).gather_buckets == (tuple(_gathers(graph)),)


def _counts(graph):
    import collections

    return collections.Counter(c.param for c in graph.collective_roles() if c.role == "param_gather")


def test_gather_buckets_keep_adamws_numbers_too():
    step, args, graph, reference = setup("mlp", None, "adamw")
    applied = apply_strictly(make_plan(gather_buckets=[_gathers(graph)]), step, args)
    assert compiled_count(applied, "all-gather") == 1
    assert_close(three_steps(applied, args), reference)


def test_gather_and_all_reduce_buckets_apply_together():
    step, args, graph, reference = setup("mlp", (2, 4))
    plan = baselines.make("one_bucket", graph).replace(gather_buckets=(tuple(_gathers(graph)),)).validate(graph)
    applied = apply_strictly(plan, step, args)
    assert compiled_count(applied, "all-gather") == 1
    text = applied.compiled_text()
    assert len(re.findall(r"\sall-reduce(?:-start)?\(", text)) == len(plan.buckets)
    assert_close(three_steps(applied, args), reference)

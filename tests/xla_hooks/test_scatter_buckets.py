"""Scatter buckets applied to the real compile: a sharded (FSDP) zoo step's gradient scatters (an all-reduce
and a dynamic-slice of this device's block each) merged into reduce-scatters, the compiled module holding
that many reduce-scatters and no all-reduce of theirs, the numbers XLA's default's after 3 SGD steps."""

from __future__ import annotations

import functools

import jax
import pytest

import disco
import trax_models
from disco.plans import baselines
from disco.plans.check import scatterable
from disco.plans.plan import Bucket, FusionPlan
from tests.support.equivalence import apply_strictly, assert_close, compiled_count, three_steps

DEVICES = 8


@functools.cache
def setup(name, mesh_shape):
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES, style="fsdp", mesh_shape=mesh_shape,
                                             optimizer="sgd")
    graph = disco.extract(step, *args)
    return step, args, graph, three_steps(jax.jit(step), args)




@pytest.mark.parametrize(("name", "mesh_shape", "n_buckets"), [
    ("mlp", None, 1), ("mlp", (2, 4), 2),
    pytest.param("transformer_lm", None, 2, marks=pytest.mark.slow),  # 28 s; scattered along dims 0, 1 and 2
    pytest.param("transformer_lm", (2, 4), 1, marks=pytest.mark.slow),
    pytest.param("mlp", None, 3, marks=pytest.mark.slow),
])
def test_scatter_buckets_compile_to_that_many_reduce_scatters_and_keep_the_numbers(name, mesh_shape, n_buckets):
    step, args, graph, reference = setup(name, mesh_shape)
    ok = scatterable(graph)
    ars = [n.name for n in graph.all_reduces()]
    scatters = [a for a in ars if a in ok]
    grad_scatters = [c.name for c in graph.collective_roles() if c.role == "grad_scatter"]
    # on 1 x 8 every gradient scatter is one; on 2 x 4 those over fsdp (the data x fsdp ones slice by fsdp only)
    assert scatters == (grad_scatters if mesh_shape is None else [c.name for c in graph.collective_roles()
                                                                   if c.role == "grad_scatter" and c.axes == ("fsdp",)])
    rest = [a for a in ars if a not in ok]
    size = -(-len(scatters) // n_buckets)
    plan = FusionPlan(buckets=tuple(Bucket(tuple(scatters[i:i + size]), "scatter")
                                    for i in range(0, len(scatters), size))
                      + tuple(Bucket((a,)) for a in rest)).validate(graph)
    applied = apply_strictly(plan, step, args)
    assert compiled_count(applied, "reduce-scatter") == n_buckets
    assert compiled_count(applied, "all-reduce") == len(rest)  # one per other all-reduce; none of the scattered members'
    assert_close(three_steps(applied, args), reference)


def test_the_scatter_buckets_baseline_applies_with_gather_buckets():
    step, args, graph, reference = setup("mlp", None)
    plan = baselines.make("scatter_buckets", graph)
    assert [b.build for b in plan.buckets] == ["scatter", "concat"]  # the gradient scatters; the loss and bias
    plan = plan.replace(gather_buckets=baselines.make("one_gather_bucket", graph).gather_buckets).validate(graph)
    applied = apply_strictly(plan, step, args)
    assert (compiled_count(applied, "reduce-scatter"), compiled_count(applied, "all-reduce"), compiled_count(applied, "all-gather")) == (1, 1, 1)
    assert_close(three_steps(applied, args), reference)

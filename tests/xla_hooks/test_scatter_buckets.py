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
from disco.plans.check import scatter_groups, scatterable
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
    ("mlp", None, 1), ("mlp", (2, 4), 1),
    pytest.param("transformer_lm", None, 2, marks=pytest.mark.slow),  # 28 s; scattered along dims 0, 1 and 2
    pytest.param("transformer_lm", (2, 4), 1, marks=pytest.mark.slow),
    pytest.param("mlp", None, 3, marks=pytest.mark.slow),
    pytest.param("mlp", (2, 4), 2, marks=pytest.mark.slow),
])
def test_scatter_buckets_compile_to_that_many_reduce_scatters_and_keep_the_numbers(name, mesh_shape, n_buckets):
    """``n_buckets`` scatter buckets per way of scattering (on 2 x 4: over "fsdp" only, and over "data" x
    "fsdp", which adds an all-reduce over "data" of each bucket's shard), strictly applied."""
    step, args, graph, reference = setup(name, mesh_shape)
    ok, how = scatterable(graph), scatter_groups(graph)
    ars = [n.name for n in graph.all_reduces()]
    scatters = [a for a in ars if a in ok]
    # every gradient scatter is one, on 2 x 4 also those XLA reduces over data x fsdp and slices by fsdp only
    assert scatters == [c.name for c in graph.collective_roles() if c.role == "grad_scatter"]
    classes: dict[tuple, list[str]] = {}
    for a in scatters:
        classes.setdefault(how[a], []).append(a)
    assert len(classes) == (1 if mesh_shape is None else 2)
    rest = [a for a in ars if a not in ok]
    buckets = []
    for members in classes.values():
        size = -(-len(members) // n_buckets)
        buckets += [Bucket(tuple(members[i:i + size]), "scatter") for i in range(0, len(members), size)]
    plan = FusionPlan(buckets=tuple(buckets) + tuple(Bucket((a,)) for a in rest)).validate(graph)
    across = sum(1 for b in buckets if how[b.members[0]][1])  # buckets whose blocks two devices keep
    assert across == (0 if mesh_shape is None else len(buckets) - n_buckets)
    applied = apply_strictly(plan, step, args)
    assert compiled_count(applied, "reduce-scatter") == len(buckets)
    # one per other all-reduce and one per data x fsdp bucket; none of the scattered members'
    assert compiled_count(applied, "all-reduce") == len(rest) + across
    assert_close(three_steps(applied, args), reference)


def test_a_data_x_fsdp_steps_scatter_blocks_record_the_reduce_scatter_over_fsdp_and_the_all_reduce_over_data():
    """mlp on 2 x 4: the biases' gradients are reduced over all 8 devices and sliced by the fsdp position
    (4 blocks, each kept by the 2 devices of one fsdp index); the weights' over fsdp only."""
    graph = setup("mlp", (2, 4))[2]
    roles = {c.name: c.axes for c in graph.collective_roles() if c.role == "grad_scatter"}
    blocks = {b.all_reduce: b for b in graph.scatter_blocks if b.all_reduce in roles}
    both = [b for name, b in blocks.items() if roles[name] == ("data", "fsdp")]
    fsdp = [b for name, b in blocks.items() if roles[name] == ("fsdp",)]
    assert len(both) + len(fsdp) == len(roles) and both and fsdp
    for b in both:
        assert (b.blocks, b.scatter_groups, b.across_groups, b.why) == (
            4, ((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 4), (1, 5), (2, 6), (3, 7)), "")
    for b in fsdp:
        assert (b.blocks, b.scatter_groups, b.across_groups) == (4, ((0, 1, 2, 3), (4, 5, 6, 7)), ())


@pytest.mark.parametrize("mesh_shape", [None, (2, 4)])
def test_the_scatter_buckets_baseline_applies_with_gather_buckets(mesh_shape):
    step, args, graph, reference = setup("mlp", mesh_shape)
    plan = baselines.make("scatter_buckets", graph)
    builds = [b.build for b in plan.buckets]
    across = sum(1 for b in plan.buckets if b.build == "scatter" and scatter_groups(graph)[b.members[0]][1])
    if mesh_shape is None:
        assert builds == ["scatter", "concat"]  # the gradient scatters; the loss and bias
    else:  # the scatters over fsdp and over data x fsdp; the rest over data and over both
        assert sorted(builds) == ["concat", "concat", "scatter", "scatter"] and across == 1
    plan = plan.replace(gather_buckets=baselines.make("one_gather_bucket", graph).gather_buckets).validate(graph)
    applied = apply_strictly(plan, step, args)
    assert (compiled_count(applied, "reduce-scatter"), compiled_count(applied, "all-reduce"),
            compiled_count(applied, "all-gather")) == (builds.count("scatter"), builds.count("concat") + across, 1)
    assert_close(three_steps(applied, args), reference)

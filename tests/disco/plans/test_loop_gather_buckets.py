"""Gather buckets in a loop's body: a scanned step (maxtext's ``scan_layers``, ``lax.scan`` over stacked
sharded weights) gathers each layer's weights once per iteration inside the loop, where a bucket of
the body's all-gathers merges them into one all-gather per iteration.

Real compiles on the 8 virtual CPU devices: maxtext's scanned decoder (tests/support/sharded_user_steps.py,
mesh (2, 4, 1)) read, planned, priced (full and incremental pricing agree), applied strictly with
XLA's default's numbers after 3 steps, and a ``lax.scan`` step as the jax docs write one, whose
backward body's gathers depend on each other, for the refusals.
"""

from __future__ import annotations

import functools
import random
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import disco
import xla_hooks
from disco.ir.replica_groups import replica_group_lists
from disco.plans import baselines, moves
from disco.plans.plan import FusionPlan
from disco.sim.cluster import preset
from disco.sim.collectives import over_group
from disco.sim.costs import AnalyticCosts
from disco.sim.delta import DeltaSimulator
from disco.sim.simulator import Simulator
from tests.support import sharded_user_steps
from tests.support.equivalence import assert_close, compiled_count

NAME = "maxtext_scanned_fsdp"


@functools.cache
def _graph():
    entry = sharded_user_steps.SCANNED[NAME]()
    with sharded_user_steps.context(entry), warnings.catch_warnings():
        warnings.simplefilter("error")  # no GspmdWarning, no NoGradientWarning
        return disco.extract(entry.step, *entry.args, kwargs=entry.kwargs)


def _body_gathers(graph):
    return [[n.name for n in lp.body.nodes if n.opcode == "all-gather"] for lp in graph.loops]


def test_a_scanned_steps_gathers_run_in_its_loops_bodies_and_the_baselines_bucket_each_body():
    graph = _graph()
    bodies = [b for b in _body_gathers(graph) if b]
    # the forward loop gathers wi and wo each iteration; the backward loop gathers both again
    assert [len(b) for b in bodies] == [2, 2]
    assert all(lp.trip_count == 3 for lp in graph.loops if any(n.opcode == "all-gather" for n in lp.body.nodes))
    assert baselines.loop_gather_buckets(graph) == tuple(tuple(b) for b in bodies)
    for name in baselines.GATHER_NAMES:
        plan = baselines.make(name, graph)
        plan.validate(graph)
        assert set(baselines.loop_gather_buckets(graph)) <= set(plan.gather_buckets)


def test_a_loop_bodys_gather_bucket_is_priced_once_per_trip_and_incremental_pricing_agrees():
    graph = _graph()
    cluster = preset("local")
    costs = AnalyticCosts()
    sim = Simulator(graph, costs, cluster)
    fwd, bwd = (tuple(b) for b in _body_gathers(graph) if b)
    default, both = FusionPlan(), FusionPlan(gather_buckets=(fwd, bwd))
    plans = [default, FusionPlan(gather_buckets=(fwd,)), FusionPlan(gather_buckets=(bwd,)), both,
             FusionPlan(gather_buckets=(fwd[:1], fwd[1:]))]  # buckets of one: the loop as it was
    nodes = {n.name: n for lp in graph.loops for n in lp.body.nodes}

    def saving(bucket):  # one all-gather of the summed bytes instead of each alone, per iteration
        over = over_group(cluster, replica_group_lists(nodes[bucket[0]].replica_groups))
        alone = sum(costs.collective_time("all-gather", nodes[m].out_bytes, over) for m in bucket)
        return alone - costs.collective_time("all-gather", sum(nodes[m].out_bytes for m in bucket), over)

    base = sim.run(default)
    merged = sim.run(both)
    expected = 3 * (saving(fwd) + saving(bwd))
    assert expected > 0
    assert base.compute_time - merged.compute_time == pytest.approx(expected, rel=1e-9)
    assert merged.step_time < base.step_time
    assert sim.lower_bound() <= merged.step_time  # the bound prices each body's gathers bucketed
    assert sim.step_time(plans[-1]) == base.step_time
    delta = DeltaSimulator(sim)
    for parent in plans:
        for child in plans:
            assert delta.step_time(child, parent) == sim.step_time(child)


def test_loop_gather_buckets_apply_to_the_scanned_step_and_keep_the_numbers():
    graph = _graph()
    plan = FusionPlan(gather_buckets=baselines.loop_gather_buckets(graph))
    entry = sharded_user_steps.SCANNED[NAME]()
    with sharded_user_steps.context(entry), warnings.catch_warnings():
        warnings.simplefilter("error")  # no PlanFallbackWarning
        default = xla_hooks.apply(FusionPlan(), entry.step, *entry.args, kwargs=entry.kwargs)
        applied = xla_hooks.apply(plan, entry.step, *entry.args, kwargs=entry.kwargs, strict=True)
    assert applied.applied, applied.fallback_reason
    # one all-gather per body where XLA's compile kept two
    assert compiled_count(applied, "all-gather") == compiled_count(default, "all-gather") - 2
    reference = sharded_user_steps.SCANNED[NAME]()
    assert_close(sharded_user_steps.three_steps(entry, applied), sharded_user_steps.three_steps(reference, reference.step))


def test_moves_from_a_plan_with_loop_gather_buckets_stay_valid():
    graph = _graph()
    ctx = moves.context(graph)
    plan = baselines.make("per_layer_gathers", graph)
    same = moves.canonical(plan, ctx)  # (the search's form: the loops' buckets kept, after the graph's own)
    assert same.digest() == moves.canonical(same, ctx).digest()
    assert set(same.gather_buckets) == {b for b in plan.gather_buckets if len(b) > 1}  # (none of one)
    assert same.gather_buckets[-2:] == baselines.loop_gather_buckets(graph)
    for seed in range(60):
        child = moves.random_move(plan, ctx, random.Random(seed))
        if child is not None:
            child.validate(graph)
            plan = child
    assert set(baselines.loop_gather_buckets(graph)) <= set(plan.gather_buckets or ()) or plan.gather_buckets is None


def _docs_scan_step(layers=3, width=64, batch=32):
    """``lax.scan`` over stacked weights sharded over fsdp (the jax docs' scan-over-layers idiom)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    ws, bs = NamedSharding(mesh, P(None, "fsdp", None)), NamedSharding(mesh, P("fsdp", None))

    def block(h, p):
        return h + jnp.tanh(h @ p["up"]) @ p["down"], None

    def loss(params, x, y):
        h, _ = jax.lax.scan(block, x, params)
        return jnp.mean((h - y) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = jax.device_put({"up": jax.random.normal(k[0], (layers, width, 2 * width)) / width ** 0.5,
                             "down": jax.random.normal(k[1], (layers, 2 * width, width)) / width ** 0.5}, ws)
    x, y = (jax.device_put(jax.random.normal(kk, (batch, width)), bs) for kk in k[2:])
    return jax.jit(step, in_shardings=(ws, bs, bs), out_shardings=(ws, NamedSharding(mesh, P()))), (params, x, y)


def test_a_loop_gather_bucket_that_would_wait_on_itself_or_spans_two_bodies_is_refused():
    step, args = _docs_scan_step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loss's all-reduce alone outside the loops
        graph = disco.extract(step, *args)
    fwd, bwd = (b for b in _body_gathers(graph) if b)
    assert len(bwd) == 3
    with pytest.raises(ValueError, match=r"gather bucket 0: contracting it in the body of loop .* forms a cycle"):
        FusionPlan(gather_buckets=(tuple(bwd),)).validate(graph)
    with pytest.raises(ValueError, match="in different computations"):
        FusionPlan(gather_buckets=((fwd[0], bwd[0]),)).validate(graph)
    with pytest.raises(ValueError, match="nor an all-gather of one of its loops' bodies"):
        FusionPlan(gather_buckets=((fwd[0], "all-gather.999"),)).validate(graph)
    # the baseline buckets the backward body by level: no bucket waits on another's result
    plan = baselines.make("one_gather_bucket", graph)
    plan.validate(graph)
    assert tuple(fwd) in plan.gather_buckets and not any(set(b) == set(bwd) for b in plan.gather_buckets)


def test_every_bucket_baseline_plans_the_scanned_step_without_a_cycle():
    """On its (2, 4, 1) mesh a gradient's reduction over fsdp feeds its reduction over data (hoisted
    after the loop), which feeds the norm reduced over fsdp again: buckets filled per class would wait on
    each other; the baselines split such buckets by all-reduce level."""
    from disco.ir.step_checks import all_reduce_dependencies

    graph = _graph()
    deps = all_reduce_dependencies(graph)
    for name in baselines.NAMES:
        plan = baselines.make(name, graph)  # validated: no cycle
        for b in plan.buckets or ():
            assert not any(deps[m].intersection(b.members) for m in b.members), (name, b.members)
    one = baselines.make("one_bucket", graph)
    assert len(one.buckets) > len({baselines.bucket_class(n) for n in graph.all_reduces()})


def _body_gather_operands(module_text):
    """Per loop-body computation of a compiled module with all-gathers, each all-gather's operand count."""
    import re

    out = []
    for comp in re.split(r"\n(?=\S)", module_text):
        if comp.startswith("ENTRY"):
            continue
        ops = re.findall(r"\sall-gather(?:-start)?\(([^)]*)\)", comp)
        if ops:
            out.append(sorted(len(o.split(",")) for o in ops))
    return sorted(out)


@pytest.mark.gpu_compile
def test_loop_bodys_gather_buckets_compile_for_an_h100_as_one_all_gather_of_the_concatenated_shards():
    """Deviceless XLA:GPU (``.venv-gpu``, jax 0.11.2, the H100 target) takes the body's rewritten bucket
    through the plugin's path: one all-gather of one concatenated operand per body. XLA:GPU's own
    combiner already merges each body's two all-gathers into one by default, as one all-gather of two
    operands (measured 2026-12-02): on a GPU the loop bucket saves no message, which only the compiled
    tier prices (the emulated tier prices XLA's default as each all-gather alone)."""
    from disco.ir.extractor import plan_text
    from disco.ir.graph import HloGraph
    from xla_hooks import compile_for, deviceless

    if not deviceless.available():
        pytest.skip(f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")
    entry = sharded_user_steps.SCANNED[NAME]()
    with sharded_user_steps.context(entry):
        step = entry.step if hasattr(entry.step, "lower") else jax.jit(entry.step)
        text = plan_text(step.lower(*entry.args, **entry.kwargs), debug_info=False)
    graph = HloGraph.from_hlo_text(text)
    plan = FusionPlan(gather_buckets=baselines.loop_gather_buckets(graph)).validate(graph, "gpu")
    assert len(plan.gather_buckets) == 2
    default = compile_for.plan_module_for(text, FusionPlan(), device="h100", devices=8).text
    bucketed = compile_for.plan_module_for(text, plan, device="h100", devices=8).text
    assert _body_gather_operands(default) == [[2], [2]]
    assert _body_gather_operands(bucketed) == [[1], [1]]

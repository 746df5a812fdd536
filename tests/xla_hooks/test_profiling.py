"""xla_hooks.profile (xla_hooks/profiling.py): per-op times from jax's profiler, mapped back to a plan."""

import pytest

from disco.ir import extractor
from disco.plans import random_plans
from disco.sim.costs import TableCosts
from disco.ir.graph import HloGraph


@pytest.fixture(scope="module")
def mlp():
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4)
    return step, args, HloGraph.from_hlo_text(extractor.hlo_text(step, *args))


def test_profile_maps_groups_and_buckets(mlp):
    from xla_hooks.profiling import profile

    step, args, graph = mlp
    plan = random_plans.random_plan(graph, 0)
    assert plan.groups and plan.buckets
    res = profile(step, args, steps=2, plan=plan, graph=graph, rounds=3)
    assert res.devices == 4 and res.ops
    assert all(o.seconds > 0 for o in res.ops)
    # Ops on one device run one after another inside the traced steps, so their per-step sum
    # cannot exceed the traced step (slack for the trace's own clock). No lower bound against the
    # untraced wall time: that compares two timings and failed once on a loaded machine.
    assert 0 < res.total_op_s < 3 * res.traced_step_s
    assert res.step_s > 0 and len(res.step_samples_s) == 3
    assert res.by_group(), "expected at least one planned group in the trace"
    assert set(res.by_group()) <= set(range(len(plan.groups)))
    assert set(res.by_bucket()) == set(range(len(plan.buckets)))
    assert any(o.nodes for o in res.ops if o.group is None and o.bucket is None)
    records = res.kernel_records()
    assert records and all(k and s > 0 for k, s in records)
    assert TableCosts.from_records(records).table
    d = res.to_dict()
    assert d["steps"] == 2 and len(d["ops"]) == len(res.ops)


def test_profile_rejects_zero_steps(mlp):
    from xla_hooks.profiling import profile

    step, args, _ = mlp
    with pytest.raises(ValueError, match=r"steps and rounds must be >= 1, got steps=0"):
        profile(step, args, steps=0)


def test_only_all_reduces_are_a_buckets_all_reduce(mlp):
    """XLA names the unpacking after a bucket's all-reduce (a bitcast fused into the next kLoop
    fusion) after the all-reduce itself: that fusion is the bucket's pack work, not its all-reduce,
    or by_bucket() counts it as communication and kernel_records() drops its compute."""
    from disco.ir.opcodes import ALL_REDUCE_OPCODES
    from xla_hooks.profiling import profile

    step, args, graph = mlp
    plan = random_plans.random_plan(graph, 0)
    assert any(len(b.members) == 1 for b in plan.buckets)  # the case that showed it
    res = profile(step, args, steps=1, plan=plan, graph=graph, rounds=1)
    labelled = [(o.name, o.opcode) for o in res.ops if o.bucket_part == "all-reduce"]
    assert all(op in ALL_REDUCE_OPCODES for _, op in labelled), labelled
    assert sorted(o.bucket for o in res.ops if o.bucket_part == "all-reduce") == list(range(len(plan.buckets)))


def test_total_op_s_counts_loop_bodies():
    """gpt2 runs its layers in a while loop (nn.scan). On XLA:CPU the while's own trace event
    does not reliably span its body's ops (measured on a gpt2 tiny step: 39 of the body's 140 events
    inside it in one run, left out of the sum of top-level ops; more than the body's time in
    another), so the total is the leaf ops' sum: each op counted once, none left out."""
    import trax_models
    from xla_hooks.profiling import profile

    step, args = trax_models.make_train_step("gpt2", "tiny", devices=2)
    res = profile(step, args, steps=2, rounds=1)
    control = {"while", "conditional", "call"}
    assert any(o.opcode == "while" for o in res.ops) and any(not o.top_level for o in res.ops)
    leaves = sum(o.seconds for o in res.ops if o.opcode not in control)
    assert res.total_op_s == pytest.approx(leaves)


def test_profile_refuses_a_plan_other_than_the_applied_steps(mlp):
    """Ops of a step compiled with one plan were mapped to another, silently (no group, no bucket);
    a plan's dict raised an AttributeError."""
    import xla_hooks
    from disco.plans import baselines
    from xla_hooks.profiling import profile

    step, args, graph = mlp
    applied = xla_hooks.apply(baselines.make("ddp", graph), step, *args)
    other = random_plans.random_plan(graph, 0)
    with pytest.raises(ValueError, match=r"plan 'random_0' is not the plan 'ddp' the AppliedStep was compiled "
                                         r"with; expected plan=None \(or that plan\)"):
        profile(applied, args, plan=other, graph=graph)
    with pytest.raises(TypeError, match=r"plan: expected a disco FusionPlan or None, got dict"):
        profile(applied, args, plan=other.to_dict(), graph=graph)  # was an AttributeError
    res = profile(applied, args, plan=baselines.make("ddp", graph), graph=graph, steps=1, rounds=1)
    assert set(res.by_bucket()) == {0}


def test_profile_refuses_the_graph_of_another_step(mlp):
    """A graph of another step mapped this step's ops to the wrong nodes (or none), silently."""
    import dataclasses

    import trax_models
    import xla_hooks
    from disco.plans import baselines
    from xla_hooks.profiling import profile

    step, args, graph = mlp
    other_step, other_args = trax_models.make_train_step("mlp", "tiny", devices=2)
    other = HloGraph.from_hlo_text(extractor.hlo_text(other_step, *other_args))
    assert other.fingerprint != graph.fingerprint
    with pytest.raises(ValueError, match=rf"^graph: {other.fingerprint} is not the graph of this step and these "
                                         rf"arguments \({graph.fingerprint}: another model"):
        profile(step, args, graph=other)
    plan = dataclasses.replace(baselines.make("ddp", graph), graph_fingerprint=graph.fingerprint)
    applied = xla_hooks.apply(plan, step, *args)
    assert applied.applied
    with pytest.raises(ValueError, match=rf"^graph: {other.fingerprint} is not the graph of the AppliedStep's step"):
        profile(applied, args, graph=other)
    assert profile(step, args, graph=graph, steps=1, rounds=1).ops  # its own graph is taken


@pytest.mark.parametrize("kwargs", [{"steps": 1.5}, {"steps": "2"}, {"rounds": True}])
def test_profile_refuses_counts_that_are_not_ints(mlp, kwargs):
    """steps=1.5 raised "'float' object cannot be interpreted as an integer", steps='2' a comparison error."""
    from xla_hooks.profiling import profile

    step, args, _ = mlp
    with pytest.raises(TypeError, match=r"steps and rounds: expected ints >= 1, got steps=.*, rounds="):
        profile(step, args, **kwargs)


def test_profile_says_when_the_plan_fell_back(mlp):
    """The result of a plan that fell back looked like the plan's, only empty (no group, no bucket)."""
    import trax_models
    from disco.plans import baselines
    from xla_hooks import PlanFallbackWarning
    from xla_hooks.profiling import profile

    step, args, graph = mlp
    other_step, other_args = trax_models.make_train_step("rnnlm", "tiny", devices=2)
    other = baselines.make("ddp", HloGraph.from_hlo_text(extractor.hlo_text(other_step, *other_args)))
    with pytest.warns(PlanFallbackWarning, match=r"plan 'ddp' could not be applied"):
        res = profile(step, args, plan=other, graph=graph, steps=1, rounds=1)
    assert res.fallback_reason and "is not in the graph" in res.fallback_reason
    assert res.to_dict()["fallback_reason"] == res.fallback_reason and not res.by_bucket()
    assert profile(step, args, plan=baselines.make("ddp", graph), graph=graph, steps=1, rounds=1).fallback_reason is None


def test_a_fusion_of_pack_work_and_compute_is_compute(mlp):
    """XLA fuses a bucket's slices into the optimizer's updates: those fusions were the bucket's pack
    work and, through their nodes, kernel records too, so by_bucket(None) and kernel_records() counted
    them twice (mlp tiny ddp on 2 devices: 37 of its 38 pack ops)."""
    from disco.plans import baselines
    from xla_hooks.profiling import profile

    step, args, graph = mlp
    res = profile(step, args, plan=baselines.make("ddp", graph), graph=graph, steps=1, rounds=1)
    both = [o.name for o in res.ops if o.bucket is not None and o.kernel_key]
    assert not both
    assert set(res.by_bucket(None)) == {0} and any(o.bucket_part == "pack" for o in res.ops)


def test_profile_while_jax_profiler_runs_elsewhere(mlp, tmp_path):
    """One jax trace at a time per process: profile raises jax's RuntimeError, and works again
    once the other trace stops."""
    import jax

    from xla_hooks.profiling import profile

    step, args, _ = mlp
    jax.profiler.start_trace(str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match=r"already been started"):
            profile(step, args, steps=1, rounds=1)
    finally:
        jax.profiler.stop_trace()
    assert profile(step, args, steps=1, rounds=1).ops

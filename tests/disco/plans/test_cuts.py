"""Cuts (optimization barriers between a producer and a consumer), backend-aware validation and
compile options as a plan axis: schema, validation, rewrite, the real CPU compile, moves, simulator."""

from __future__ import annotations

import dataclasses
import functools
import random
import re

import jax
import pytest

import disco
import trax_models
import xla_hooks
from disco.bench import compiled_counts
from disco.plans import baselines, moves
from disco.plans import options as plan_options
from disco.plans.check import GPU_GROUPS_REASON
from disco.plans.plan import FusionPlan, make_plan
from disco.sim.cluster import preset
from disco.sim.costs import AnalyticCosts
from disco.sim.simulator import Simulator
from tests.support.equivalence import assert_close, three_steps
from xla_hooks.apply_plan import compile_plan
from xla_hooks.rewrite import apply_plan_to_text

DEVICES = 4
# Cut ends the tests pick: elementwise ops, which XLA fuses producer-into-consumer on every
# backend (the CPU emulation also fuses a reduce into its consumer; real XLA:CPU does not).
ELEMENTWISE = frozenset({"add", "subtract", "multiply", "divide", "exponential", "tanh", "negate", "maximum",
                         "minimum", "sqrt", "rsqrt", "log", "select", "compare", "convert", "abs", "power"})
FAST_MODELS = ("mlp",)
MODELS = [pytest.param(m, marks=() if m in FAST_MODELS else pytest.mark.slow) for m in trax_models.names()]


@functools.cache
def setup(name):
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES, optimizer="sgd")
    return step, args, disco.extract(step, *args)


@functools.cache
def simulator(name):
    return Simulator(setup(name)[2], AnalyticCosts(), preset("local", devices=DEVICES))


def effective_cuts(name, k):
    """``k`` cuts that split an emulated XLA:CPU fusion each (in ``k`` different fusions), each
    between an elementwise producer and its only user."""
    graph = setup(name)[2]
    sim = simulator(name)
    ctx = moves.context(graph)
    kernel_of = {m: ki for ki, kern in enumerate(sim.fusions(FusionPlan())) for m in kern}
    users = {}
    for s, d in graph.edges:
        users.setdefault(s, set()).add(d)
    out, used = [], set()
    for p, c in ctx.cut_edges:
        pn, cn = graph.nodes[p].name, graph.nodes[c].name
        kp = kernel_of.get(pn)
        if (kp is None or kp != kernel_of.get(cn) or kp in used or users.get(p) != {c}
                or graph.nodes[p].opcode not in ELEMENTWISE or graph.nodes[c].opcode not in ELEMENTWISE):
            continue
        used.add(kp)
        out.append((pn, cn))
        if len(out) == k:
            break
    assert len(out) == k, f"{name}: only {len(out)} effective cut candidates"
    return out


# -- schema and validation ---------------------------------------------------------------------
@pytest.mark.fast
def test_cuts_round_trip_and_old_plans_load():
    plan = make_plan(buckets=[["a"]], cuts=[("x", "y")], compile_options={plan_options.SCHEDULER: "True"})
    assert FusionPlan.from_json(plan.to_json()) == plan
    old = '{"schema_version": 1, "groups": [], "buckets": null, "compile_options": {}, "name": "old"}'
    assert FusionPlan.from_json(old).cuts == ()
    # a plan without cuts keeps the JSON (and digest) it had before cuts existed
    assert "cuts" not in FusionPlan(name="d").to_dict()
    with pytest.raises(ValueError, match=r"plan field 'cuts.0': .*at least 2"):
        FusionPlan.from_json('{"schema_version": 1, "cuts": [["x"]]}')


def test_cut_validation_names_what_is_wrong():
    graph = setup("mlp")[2]
    (cut,) = effective_cuts("mlp", 1)
    make_plan(cuts=[cut]).validate(graph)
    with pytest.raises(ValueError, match=r"cut 0: producer 'nope' is not in the graph"):
        make_plan(cuts=[("nope", cut[1])]).validate(graph)
    other = next(n.name for n in graph.nodes if n.opcode == "parameter")
    with pytest.raises(ValueError, match=rf"cut 0: '{other}' does not feed '{cut[1]}'"):
        make_plan(cuts=[(other, cut[1])]).validate(graph)
    with pytest.raises(ValueError, match=r"cut 1: .* is listed twice"):
        make_plan(cuts=[cut, cut]).validate(graph)
    with pytest.raises(ValueError, match=r"cut 0: .* are both in group 0; a cut cannot split a planned group"):
        make_plan(groups=[list(cut)], cuts=[cut]).validate(graph)


def test_gpu_refuses_groups_up_front_and_takes_cuts_buckets_options():
    graph = setup("mlp")[2]
    (cut,) = effective_cuts("mlp", 1)
    grouped = make_plan(groups=[list(cut)])
    grouped.validate(graph, "cpu")
    with pytest.raises(ValueError, match=re.escape(GPU_GROUPS_REASON)):
        grouped.validate(graph, "cuda")
    tuned = baselines.make("xla_tuned", graph)
    plan = baselines.make("ddp", graph).replace(cuts=(cut,), compile_options=tuned.compile_options)
    assert plan.validate(graph, "gpu") is plan
    with pytest.raises(ValueError, match=r"compile option xla_gpu_enable_latency_hiding_scheduler: expected True or"):
        plan.replace(compile_options=((plan_options.SCHEDULER, "maybe"),)).validate(graph, "gpu")
    with pytest.raises(ValueError, match=r"backend: expected 'cpu' or 'gpu'"):
        plan.validate(graph, "tpu")


@pytest.mark.fast
def test_compiler_options_per_backend():
    plan = make_plan(cuts=[("a", "b")], buckets=[["r"]])
    assert plan.compiler_options("cpu")["xla_disable_hlo_passes"] == "cpu-all-reduce-combiner,cse_barrier_expander"
    assert plan.compiler_options("gpu")["xla_disable_hlo_passes"] == "gpu-all-reduce-combiner"


def test_rewrite_puts_one_barrier_per_producer():
    step, args, graph = setup("mlp")
    text = jax.jit(step).lower(*args).as_text(dialect="hlo")
    a, b = effective_cuts("mlp", 2)
    out = apply_plan_to_text(text, make_plan(cuts=[a, b]))
    assert len(re.findall(r"= \S+ opt-barrier\(", out)) == len(re.findall(r"= \S+ opt-barrier\(", text)) + 2
    assert re.search(rf"%{re.escape(b[1])} = .*%disco\.cut\.{re.escape(b[0])}\b", out)


# -- the real compile --------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_cuts_apply_on_cpu_one_more_fusion_each(name):
    """Two cuts, each inside a different fusion of the simulator's emulation, compiled alone and
    together. A cut is effective when it alone adds a fusion to XLA's default of the same module
    (the HLO-text round trip, which alone can change the count); together they add exactly one
    fusion per effective cut, at least one is, and the numbers stay within the tests' tolerance."""
    step, args, graph = setup(name)
    cuts = effective_cuts(name, 2)
    base = compiled_counts(compile_plan(FusionPlan(name="xla_default"), step, *args, roundtrip=True)
                           .compiled_text())[0]
    alone = []
    for cut in cuts:
        one = xla_hooks.apply(make_plan(cuts=[cut]), step, *args)
        assert one.applied, one.fallback_reason
        alone.append(compiled_counts(one.compiled_text())[0] - base)
    assert all(d in (0, 1) for d in alone) and sum(alone) >= 1, f"{name}: fusions added per cut {alone}"
    applied = xla_hooks.apply(make_plan(cuts=cuts, name="cuts"), step, *args)
    assert applied.applied, applied.fallback_reason
    assert compiled_counts(applied.compiled_text())[0] == base + sum(alone)
    assert_close(three_steps(applied, args), three_steps(jax.jit(step), args))


# -- moves --------------------------------------------------------------------------------------
def test_cut_and_option_moves():
    graph = setup("mlp")[2]
    ctx = moves.context(graph)
    rng = random.Random(0)
    plan = moves.add_cut(FusionPlan(), ctx, rng)
    plan = moves.add_cut(plan, ctx, rng)
    assert len(plan.cuts) == 2 and moves.canonical(plan, ctx) == plan
    plan.validate(graph)
    assert len(moves.remove_cut(plan, ctx, rng).cuts) == 1
    assert moves.step_option(plan, ctx, rng) is None  # CPU: no size option (flip_option: tests/disco/plans/test_options.py)
    gpu = moves.context(graph, "gpu")
    assert gpu.fusible_nodes == () and moves.fuse(FusionPlan(), gpu, rng) is None
    flipped = moves.flip_option(FusionPlan(), gpu, random.Random(1))
    assert len(flipped.compile_options) == 1 and flipped.compile_options[0][1] == "True"
    assert moves.flip_option(flipped, gpu, random.Random(1)) == FusionPlan()  # back to XLA's default: left out
    stepped = {moves.step_option(FusionPlan(), gpu, random.Random(s)).compile_options for s in range(40)}
    # one step from XLA's default of each size option (the all-reduce, all-gather and reduce-scatter
    # combine thresholds), to the next value of its table either way
    expected = set()
    for o in (o for o in gpu.options if o.kind == "bytes"):
        default, vals = int(plan_options.value((), o.key, "gpu")), sorted(int(v) for v in o.values)
        expected |= {((o.key, str(v)),) for v in (max((v for v in vals if v < default), default=None),
                                                   min((v for v in vals if v > default), default=None)) if v is not None}
    assert ((plan_options.THRESHOLD, str(16 << 20)),) in stepped and ((plan_options.THRESHOLD, str(32 << 20)),) in stepped
    assert stepped == expected
    plan = FusionPlan(buckets=baselines.make("ddp", graph).buckets)
    for s in range(200):
        child = moves.random_move(plan, gpu, random.Random(s))
        if child is not None:
            plan = child.validate(graph, "gpu")
    assert not plan.groups


# -- simulator ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster", ["local", "h100-sxm-8"])
def test_simulator_cut_splits_a_fusion_and_ignores_cuts_outside_one(cluster):
    """In XLA:CPU's fusion emulation and in XLA:GPU's."""
    graph = setup("mlp")[2]
    sim = Simulator(graph, AnalyticCosts(), preset(cluster, devices=DEVICES if cluster == "local" else None))
    base = sim.fusions(FusionPlan())
    kernel_of = {m: ki for ki, kern in enumerate(base) for m in kern}
    ctx = moves.context(graph)
    names = [(graph.nodes[p].name, graph.nodes[c].name) for p, c in ctx.cut_edges]
    inside = [(p, c) for p, c in names if kernel_of.get(p) is not None and kernel_of.get(p) == kernel_of.get(c)]
    apart = next((p, c) for p, c in names if kernel_of.get(p) != kernel_of.get(c))
    assert len(inside) >= 10
    for cut in inside[:10]:
        split = sim.fusions(make_plan(cuts=[cut]))
        assert not any(cut[0] in k and cut[1] in k for k in split)
        assert len(split) > len(base)  # the producer's part roots a fusion of its own (or more)
    assert sim.fusions(make_plan(cuts=[apart])) == base


def test_simulator_prices_gpu_options():
    graph = setup("mlp")[2]
    sim = Simulator(graph, AnalyticCosts(), preset("h100-sxm-8"))
    spec = preset("dgx-a100-8")
    assert sim.backend == "gpu" and Simulator(graph, AnalyticCosts(), spec).backend == "cpu"
    default = sim.result(FusionPlan())
    per_tensor = baselines.make("per_tensor", graph)
    alone = sim.result(per_tensor)
    sched = sim.result(per_tensor.replace(compile_options=((plan_options.SCHEDULER, "True"),)))
    assert sched.step_time < alone.step_time  # collectives overlap compute only with the scheduler
    assert sched.comm_time == alone.comm_time
    tiny = sim.result(make_plan(compile_options={plan_options.THRESHOLD: "1"}))  # one all-reduce each
    n_ars = len(graph.all_reduces())
    assert tiny.comm_time > default.comm_time
    assert len([e for e in sim.run(make_plan(compile_options={plan_options.THRESHOLD: "1"})).timeline
                if e.stream == "comm"]) == n_ars
    # on a CPU cluster the GPU options change nothing
    cpu = Simulator(graph, AnalyticCosts(), spec)
    assert cpu.step_time(make_plan(compile_options={plan_options.THRESHOLD: "1",
                                                    plan_options.SCHEDULER: "True"})) == cpu.step_time(FusionPlan())


def test_xla_tuned_sweep():
    graph = setup("mlp")[2]
    sweep = baselines.xla_tuned_sweep(graph)
    assert list(sweep) == ["xla_tuned_16mb"]  # mlp tiny's gradients are far below 16 MiB
    (plan,) = sweep.values()
    assert dict(plan.compile_options) == {plan_options.SCHEDULER: "True", plan_options.THRESHOLD: str(16 << 20)}
    assert baselines.tuned_thresholds(dataclasses.replace(graph, nodes=tuple(
        dataclasses.replace(n, grad_bytes=40 << 20) if n.is_all_reduce else n for n in graph.nodes)))[:3] == [
        16 << 20, 32 << 20, 64 << 20]


def test_cuts_hold_with_the_barrier_expander_off_on_cpu():
    """With cse_barrier_expander off (what a plan with cuts asks for on CPU) the cut module
    compiles to one more fusion per cut. With it on, jax 0.10.2's XLA:CPU strips the barriers
    before fusion (XLA's default fusions; measured), as do 0.8.3's and 0.9.2's; jax 0.11.2's and
    0.12.0.1's keep them (measured: one more fusion per cut there too), so switching it off matters
    on jax <= 0.10 only."""
    from disco.ir.extractor import lower
    from xla_hooks import _jax_private

    step, args, graph = setup("mlp")
    plan = make_plan(cuts=effective_cuts("mlp", 2))
    lowered = lower(step, *args)
    mlir = _jax_private.hlo_text_to_mlir_bytes(apply_plan_to_text(lowered.as_text(dialect="hlo"), plan))
    rewritten = _jax_private.with_module(lowered, mlir)
    base = compiled_counts(compile_plan(FusionPlan(), step, *args, roundtrip=True).compiled_text())[0]
    kept = rewritten.compile(compiler_options=plan.compiler_options("cpu"))
    stripped = rewritten.compile()
    assert "cse_barrier_expander" in plan.compiler_options("cpu")["xla_disable_hlo_passes"]
    assert compiled_counts(kept.as_text())[0] == base + 2
    stripped_count = compiled_counts(stripped.as_text())[0]
    strips = _jax_private.major_minor(jax.__version__) <= (0, 10)
    assert stripped_count == (base if strips else base + 2)


def test_a_cut_on_a_shard_map_boundary_is_refused():
    """An optimization barrier between shardy's GlobalToLocalShape and the shard_map body's call validated,
    and XLA:CPU then aborted the whole process (SIGABRT, 'Check failed: op.use_empty()'; a cuts-only plan is
    not probed in a child first); cuts on the other custom-calls around a shard_map failed to compile.
    Validation now refuses them; applying such a plan falls back, and the process lives on (the apply runs
    in a child here, so that a regression fails the test instead of killing pytest)."""
    import subprocess
    import sys
    import textwrap

    graph = setup("mlp")[2]
    call = next(n for n in graph.nodes if n.opcode == "call" and n.computation == graph.nodes[0].computation
                and len(n.operands) > 1)
    with pytest.raises(ValueError, match=rf"cut 0: producer '{call.operands[0]}' is a get-tuple-element of the "
                                         "custom-call .*; cuts cannot go on"):
        make_plan(cuts=[(call.operands[0], call.name)]).validate(graph)
    result = next(n for n in graph.nodes if n.opcode == "get-tuple-element" and n.operands == (call.name,))
    for cut in ((result.name, next(d.name for d in graph.nodes if result.name in d.operands)),):
        with pytest.raises(ValueError, match=r"cut 0: producer .* is a get-tuple-element of the call of a "
                                             "shard_map body"):
            make_plan(cuts=[cut]).validate(graph)
    child = textwrap.dedent(f"""
        import jax, warnings
        jax.config.update("jax_num_cpu_devices", {DEVICES})
        import trax_models, xla_hooks
        from disco.plans.plan import make_plan
        step, args = trax_models.make_train_step("mlp", "tiny", devices={DEVICES}, optimizer="sgd")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            applied = xla_hooks.apply(make_plan(cuts=[{(call.operands[0], call.name)!r}]), step, *args)
        print("fell back:", applied.fallback_reason.split(";")[0])
        """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "fell back: ValueError: cut 0: producer" in r.stdout


def test_a_cut_that_aborts_xla_falls_back_through_the_probe():
    """The safety net behind validation: with validation bypassed, the shard_map-boundary cut that made
    XLA:CPU abort the process (jax 0.10.2 and 0.8.3, measured) is compiled in the probe child first, so the step
    falls back with the child's abort as the reason and the process lives on (run in a child here, so
    that a regression fails the test instead of killing pytest)."""
    import subprocess
    import sys
    import textwrap

    graph = setup("mlp")[2]
    call = next(n for n in graph.nodes if n.opcode == "call" and n.computation == graph.nodes[0].computation
                and len(n.operands) > 1)
    child = textwrap.dedent(f"""
        import jax, warnings
        jax.config.update("jax_num_cpu_devices", {DEVICES})
        import trax_models, xla_hooks
        from disco.plans import check
        from disco.plans.plan import make_plan
        from xla_hooks import probe
        check.validate = lambda plan, graph, backend="cpu": None  # let the aborting cut through
        probed = []
        real = probe.probe
        probe.probe = lambda *a, **k: (probed.append(1), real(*a, **k))[1]
        step, args = trax_models.make_train_step("mlp", "tiny", devices={DEVICES}, optimizer="sgd")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            applied = xla_hooks.apply(make_plan(cuts=[{(call.operands[0], call.name)!r}]), step, *args)
        print("probed:", len(probed))
        print("applied:", applied.applied, "|", (applied.fallback_reason or "-").splitlines()[0][:300])
        """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "probed: 1" in r.stdout, r.stdout
    from xla_hooks import _jax_private

    if _jax_private.major_minor(jax.__version__) <= (0, 10):  # where the abort was measured (0.8.3, 0.10.2)
        assert "applied: False | ProbeFailure: XLA aborted the probe compile" in r.stdout, r.stdout

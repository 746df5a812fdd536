"""Bring your own step: the guide's and the README's examples run as written, and steps disco cannot plan are
refused early with a message that says what to change (real jax steps, written from scratch)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import disco
import xla_hooks
from disco import optimizer as opt
from disco.ir.step_checks import NoGradientWarning, check_data_parallel, double_reductions
from disco.plans import baselines
from disco.plans.plan import Bucket, FusionPlan
from xla_hooks.apply_plan import PlanFallbackWarning
from tests.support.paths import REPO

ROOT = str(REPO)
N = 4


GUIDE = os.path.join("docs", "guides", "your-own-step.md")


def guide_example(index: int = 0) -> str:
    """The ``index``-th python block of the guide "Bring your own step" (docs/guides/your-own-step.md)."""
    with open(os.path.join(ROOT, GUIDE), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)[index]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("XLA_FLAGS", None)  # the example sets its own device count
    p = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_the_guide_gspmd_example_runs_as_written():
    code = guide_example(0)
    assert "@jax.jit" in code and "NamedSharding" in code and "shard_map" not in code and "psum" not in code
    assert _run(code) == "2 gradients, 3 all-reduces; per_tensor applied: True"


def test_the_guide_nnx_example_runs_as_written():
    code = guide_example(1)
    assert "@nnx.jit" in code and "optimizer.update(model, grads)" in code and "nnx.split" not in code
    assert _run(code) == "5 all-reduces; applied: True ; optimizer step 3"


def test_the_guide_static_and_donated_train_state_example_runs_as_written():
    code = guide_example(2)
    assert "static_argnums=(2, 3, 4), donate_argnums=0" in code and "in_shardings=(rep, data, None)" in code
    assert "functools.partial" not in code
    assert _run(code) == "5 all-reduces; applied: True ; donated: True"


def test_the_guide_shard_map_example_runs_as_written():
    code = guide_example(3)
    assert "jax.named_scope(f\"disco_grad[" in code and "jax.lax.pcast" in code and "jax.shard_map" in code
    assert _run(code) == "2 gradients, 3 all-reduces; ddp applied: True"


# -- steps written from scratch ------------------------------------------------------------------
def loss_fn(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def arrays():
    mesh = jax.make_mesh((N,), ("dp",), devices=jax.devices()[:N], axis_types=(jax.sharding.AxisType.Explicit,))
    w = jax.device_put(jnp.ones((8, 8)) / 8, NamedSharding(mesh, P()))
    x = jax.device_put(jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8) / 100, NamedSharding(mesh, P("dp")))
    return mesh, w, x


def shard_map_step(mesh, *, pcast: bool, scope: bool, clip: bool = False):
    def local(w, x):
        wv = jax.lax.pcast(w, "dp", to="varying") if pcast else w
        loss, g = jax.value_and_grad(loss_fn)(wv, x)
        g = jnp.clip(g, -1.0, 1.0) if clip else g
        if scope:
            with jax.named_scope("disco_grad[w]"):
                g = jax.lax.pmean(g, "dp")
        else:
            g = jax.lax.pmean(g, "dp")
        return w - 0.1 * g, jax.lax.pmean(loss, "dp")

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp")), out_specs=(P(), P()))


def test_a_correct_shard_map_step_passes_the_checks_silently():
    mesh, w, x = arrays()
    graph = disco.extract(shard_map_step(mesh, pcast=True, scope=True), w, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_data_parallel(graph)
    assert double_reductions(graph) == []


@pytest.mark.parametrize("clip", [False, True])
def test_a_gradient_reduced_twice_is_named_not_a_cycle(clip):
    mesh, w, x = arrays()
    step = shard_map_step(mesh, pcast=False, scope=True, clip=clip)  # jax sums the gradient, then pmean again
    graph = disco.extract(step, w, x)
    pairs = double_reductions(graph)
    assert len(pairs) == 1 and all(graph.nodes[graph.index()[n]].is_all_reduce for n in pairs[0])
    with pytest.raises(ValueError, match=r"^an all-reduce feeds another all-reduce \(.+ -> .+\): reduce each "
                                         r"gradient once .*docs/guides/your-own-step.md"):
        opt.prepare(step, (w, x))
    if clip:  # a plan bucketing both forms a cycle (clip between them): the message names the cause first
        plan = FusionPlan(buckets=(Bucket(tuple(n.name for n in graph.all_reduces())),))
        with pytest.raises(ValueError, match=r"^bucket 0: an all-reduce feeds another all-reduce .*reduce each "
                                             r"gradient once; .*forms a cycle along "):
            plan.validate(graph)


def test_a_plain_jit_step_is_planned_through_its_partitioned_program():
    _, w, x = arrays()

    @jax.jit
    def gspmd_step(w, x):  # shardings on the inputs; XLA's partitioner adds the all-reduces
        loss, g = jax.value_and_grad(loss_fn)(w, x)
        return w - 0.1 * g, loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = disco.extract(gspmd_step, w, x)
        check_data_parallel(graph)
    (grad,) = [n for n in graph.all_reduces() if n.is_gradient]  # found by dataflow, no scope
    assert grad.shape == "f32[8,8]" and len(graph.all_reduces()) == 2
    plan = baselines.make("per_tensor", graph)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanFallbackWarning)
        applied = xla_hooks.apply(plan, gspmd_step, w, x)
    assert applied.applied and applied.fallback_reason is None
    new_w, _ = applied(w, x)
    ref_w, _ = gspmd_step(w, x)
    assert jnp.allclose(new_w, ref_w, rtol=1e-6)


def test_a_single_device_jit_step_is_refused_before_any_search():
    w, x = jnp.ones((8, 8)) / 8, jnp.ones((16, 8))

    @jax.jit
    def local_step(w, x):
        loss, g = jax.value_and_grad(loss_fn)(w, x)
        return w - 0.1 * g, loss

    phases = []
    with pytest.raises(ValueError, match=r"^no all-reduce in the program of .*: a data-parallel step "):
        disco.optimize(local_step, w, x, budget_s=30, progress=lambda phase, *_: phases.append(phase))
    assert set(phases) == {"extract"}  # refused before the search, let alone measuring


def test_a_step_without_the_gradient_scope_finds_its_gradient_by_dataflow():
    mesh, w, x = arrays()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = opt.prepare(shard_map_step(mesh, pcast=True, scope=False), (w, x)).graph
    assert [n.shape for n in graph.all_reduces() if n.is_gradient] == ["f32[8,8]"]


def test_a_step_whose_all_reduces_feed_no_update_warns():
    mesh, w, x = arrays()

    def local(w, x):  # reduces its loss only: nothing disco recognises as a gradient
        return w * 1.0, jax.lax.pmean(loss_fn(w, x), "dp")

    step = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("dp")), out_specs=(P(), P()))
    with pytest.warns(NoGradientWarning, match=r"1 all-reduces but no gradient recognised"):
        opt.prepare(step, (w, x))


def test_a_pmap_step_with_the_scope_is_accepted():
    def local(w, x):
        loss, g = jax.value_and_grad(loss_fn)(w, x)
        with jax.named_scope("disco_grad[w]"):
            g = jax.lax.pmean(g, "dp")
        return w - 0.1 * g, jax.lax.pmean(loss, "dp")

    step = jax.pmap(local, axis_name="dp", devices=jax.devices()[:N])
    w = jnp.ones((N, 8, 8)) / 8
    x = jnp.ones((N, 4, 8))
    target = opt.prepare(step, (w, x))
    grads = [n for n in target.graph.all_reduces() if n.is_gradient]
    assert len(grads) == 1 and grads[0].param_path == "w"
    # priced over the N devices its all-reduces span, though its host arrays are sharded over none
    # (on one device the simulator priced every all-reduce at 0: per_tensor as cheap as one bucket)
    assert target.cluster.num_devices == N
    sim = target.simulator
    assert sim.step_time(baselines.make("per_tensor", target.graph)) > sim.step_time(
        baselines.make("one_bucket", target.graph))


# -- plans record the graph they were made for -------------------------------------------------------
OLD_PLAN_JSON = ('{"buckets": [{"build": "concat", "members": ["a", "b"]}], "compile_options": {}, "groups": [], '
                 '"name": "ddp", "schema_version": 1, "xla_fusion": "extend"}')  # as written before the field


@pytest.mark.fast
def test_a_plan_written_before_the_fingerprint_still_loads_and_the_field_round_trips():
    old = FusionPlan.from_json(OLD_PLAN_JSON)
    assert old.graph_fingerprint is None and "graph_fingerprint" not in old.to_dict()
    new = old.replace(graph_fingerprint="0123abcd")
    assert FusionPlan.from_json(new.to_json()) == new and new.to_dict()["graph_fingerprint"] == "0123abcd"
    assert new.digest() == old.digest()  # what the plan asks for is unchanged


def test_a_plan_for_another_graph_falls_back_with_a_warning_or_raises_when_strict():
    mesh, w, x = arrays()
    step = shard_map_step(mesh, pcast=True, scope=True)
    graph = disco.extract(step, w, x)
    plan = baselines.make("one_bucket", graph)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = xla_hooks.apply(plan.replace(graph_fingerprint=graph.fingerprint), step, w, x, strict=True)
    assert ok.applied  # the fingerprint of the step's HLO as apply reads it is extract's
    other = plan.replace(graph_fingerprint="f" * 32)  # made for another graph; its names happen to fit
    with pytest.warns(PlanFallbackWarning, match=r"was made for graph f{32}, but this step's graph is "):
        fell = xla_hooks.apply(other, step, w, x)
    assert not fell.applied and fell.plan.name == "xla_default"
    with pytest.raises(ValueError, match=r"was made for graph f{32}, but this step's graph is " + graph.fingerprint):
        xla_hooks.apply(other, step, w, x, strict=True)


def test_optimize_writes_the_fingerprint_into_the_answer():
    from tests.support.optimize_results import contradicting_result

    result = contradicting_result()
    assert result.plan.graph_fingerprint is None  # built by hand; make_result adds it (below)
    mesh, w, x = arrays()
    target = opt.prepare(shard_map_step(mesh, pcast=True, scope=True), (w, x))
    config = opt.OptimizeConfig(budget_s=0.5, measure_top_k=0, rounds=1, steps=1, bucket_sweep=(), confirm=False,
                                measure_bound=False)
    cands = opt.candidates(target, config)
    measured = opt.measure(target, cands, config)
    made = opt.make_result(target, config, cands, measured, None, None)
    assert made.plan.graph_fingerprint == target.graph.fingerprint
    assert made.to_dict()["plan"]["graph_fingerprint"] == target.graph.fingerprint


def test_the_readme_first_example_runs_as_written():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        section = f.read().split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert 'style="gspmd"' in code
    out = _run(code)
    assert re.fullmatch(r"\d+ all-reduces; ddp applied: True", out), out

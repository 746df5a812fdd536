"""Steps as JAX users write them: ``jax.jit`` over NamedShardings (GSPMD), flax linen + optax and
flax NNX, with no explicit collective and no named scope. disco plans their partitioned program
(``disco.ir.gspmd``), finds their gradients by dataflow, and the plan reaches XLA."""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import disco
import trax_models
import xla_hooks
from disco.ir import gspmd
from disco.ir.graph import HloGraph
from disco.ir.replica_groups import explicit_replica_groups
from disco.ir.step_checks import all_reduce_dependencies, check_data_parallel, double_reductions
from disco.plans import baselines
from tests.support.equivalence import (
    assert_buckets_apply_and_keep_the_numbers,
    assert_close,
    compiled_all_reduces,
    three_steps,
)
from tests.support.paths import REPO

DEVICES = 4


def _mesh():
    return jax.make_mesh((DEVICES,), ("dp",), devices=jax.devices()[:DEVICES], axis_types=(jax.sharding.AxisType.Auto,))


@functools.cache
def linen_step(compute_dtype=None):
    """A data-parallel step as flax's examples write one: linen MLP, optax adam, jax.jit.

    With ``compute_dtype`` (e.g. ``jnp.bfloat16``) the same step under mixed precision, as GPU users
    train: float32 parameters, each layer computing in that dtype (``nn.Dense(..., dtype=...)``).
    """
    import flax.linen as nn
    import jax.numpy as jnp

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for width in (64, 64):
                x = nn.relu(nn.Dense(width, dtype=compute_dtype)(x))
            out = nn.Dense(10, dtype=compute_dtype)(x)
            return out if compute_dtype is None else out.astype(jnp.float32)

    model, tx, mesh = MLP(), optax.adam(1e-2), _mesh()
    x = jax.random.normal(jax.random.key(1), (32, 16))
    y = jax.random.randint(jax.random.key(2), (32,), 0, 10)
    params = model.init(jax.random.key(0), x)

    @jax.jit
    def step(state, batch):
        params, opt_state = state
        inputs, labels = batch

        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, inputs), labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    state = jax.device_put((params, tx.init(params)), NamedSharding(mesh, P()))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("dp")))
    return step, (state, batch)


@functools.cache
def nnx_step():
    """The same with flax NNX: an nnx.Module, nnx.value_and_grad and an nnx.Optimizer, split
    into a state pytree for jax.jit (flax's functional NNX pattern)."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, *, rngs):
            self.hidden = nnx.Linear(16, 32, rngs=rngs)
            self.out = nnx.Linear(32, 10, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.hidden(x)))

    model = MLP(rngs=nnx.Rngs(0))
    graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)))
    mesh = _mesh()

    @jax.jit
    def step(state, batch):
        model, optimizer = nnx.merge(graphdef, state)
        inputs, labels = batch

        def loss_fn(m):
            return optax.softmax_cross_entropy_with_integer_labels(m(inputs), labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    x = jax.random.normal(jax.random.key(1), (32, 16))
    y = jax.random.randint(jax.random.key(2), (32,), 0, 10)
    state = jax.device_put(state, NamedSharding(mesh, P()))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("dp")))
    return step, (state, batch)


STEPS = {"linen": (linen_step, 6), "nnx": (nnx_step, 4)}  # builder, parameter tensors


@pytest.mark.parametrize("style", sorted(STEPS))
def test_the_graph_holds_one_all_reduce_per_gradient_found_by_dataflow(style):
    build, n_params = STEPS[style]
    step, args = build()
    assert "all-reduce" not in step.lower(*args).as_text(dialect="hlo")  # GSPMD: none before partitioning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = disco.extract(step, *args)
    grads = [n for n in graph.all_reduces() if n.is_gradient]
    assert len(grads) == n_params and len(graph.all_reduces()) == n_params + 1  # + the loss's
    # each gradient named after the parameter it updates (kernel and bias of every layer), the loss not
    assert len({n.param_path for n in grads}) == n_params
    assert all(("kernel" in n.param_path) or ("bias" in n.param_path) for n in grads)
    (loss,) = [n for n in graph.all_reduces() if not n.is_gradient]
    assert loss.shape == "f32[]"
    assert graph.name == step.lower(*args).as_text(dialect="hlo").split()[1].rstrip(",")


def test_gradients_reduced_in_bfloat16_under_mixed_precision_are_found_and_bucketed():
    # XLA's partitioner reduces each gradient in bfloat16, before its convert to the parameter's float32
    import jax.numpy as jnp

    step, args = linen_step(jnp.bfloat16)
    graph = disco.extract(step, *args)
    grads = [n for n in graph.all_reduces() if n.is_gradient]
    # before: the all-reduce's dtype had to equal the updated parameter's, so none of them was found
    assert any(n.dtype == "bf16" for n in grads), [(n.name, n.dtype) for n in graph.all_reduces()]
    assert len(grads) == 6 and len({n.param_path for n in grads}) == 6
    assert [n.shape for n in graph.all_reduces() if not n.is_gradient] == ["f32[]"]  # the loss alone
    reference = three_steps(step, args)
    for name in ("one_bucket", "ddp"):
        plan = baselines.make(name, graph)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            applied = xla_hooks.apply(plan, step, *args)
        assert applied.applied, applied.fallback_reason
        assert compiled_all_reduces(applied) == len(plan.buckets)
        # the same program to bfloat16 rounding, not bitwise: XLA:CPU sums the all-reduces in float32 in
        # both compiles, but rounds the bfloat16 values around them differently once they are
        # concatenated (measured: up to 5.5e-3 of a leaf's scale after three steps, 1.4 bfloat16 epsilons)
        assert_close(three_steps(applied, args), reference, rtol=1e-2)


@functools.cache
def batch_norm_step():
    """A linen step with batch norm (its statistics a mutable collection, as flax's ResNet example
    keeps them): XLA's partitioner reduces the batch's mean and variance in the forward pass, and
    the backward pass sums over the batch again."""
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.BatchNorm(use_running_average=False)(nn.Dense(32)(x)))
            return nn.Dense(10)(x)

    model, tx, mesh = Net(), optax.sgd(0.1), _mesh()
    x = jax.random.normal(jax.random.key(1), (32, 16))
    y = jax.random.randint(jax.random.key(2), (32,), 0, 10)
    variables = model.init(jax.random.key(0), x)

    @jax.jit
    def step(state, batch):
        params, stats, opt_state = state
        inputs, labels = batch

        def loss_fn(p):
            logits, new = model.apply({"params": p, "batch_stats": stats}, inputs, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new["batch_stats"]

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), stats, opt_state), loss

    state = (variables["params"], variables["batch_stats"], tx.init(variables["params"]))
    state = jax.device_put(state, NamedSharding(mesh, P()))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("dp")))
    return step, (state, batch)


def test_a_batch_norm_step_is_no_double_reduction_and_takes_bucket_plans():
    # the statistics' all-reduces feed the gradients' (through a broadcast over the batch and its sum):
    # that was taken for a gradient reduced twice, and disco.optimize refused the step
    step, args = batch_norm_step()
    graph = disco.extract(step, *args)
    deps = all_reduce_dependencies(graph)
    assert any(deps[n.name] for n in graph.all_reduces() if n.is_gradient)
    assert double_reductions(graph) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_data_parallel(graph)
    paths = {n.param_path for n in graph.all_reduces() if n.is_gradient}
    assert {p.split("]", 1)[1] for p in paths} >= {f"['{layer}']['{leaf}']" for layer, leaf in (
        ("Dense_0", "kernel"), ("Dense_0", "bias"), ("BatchNorm_0", "scale"), ("BatchNorm_0", "bias"),
        ("Dense_1", "kernel"), ("Dense_1", "bias"))}, paths
    for name in ("one_bucket", "ddp"):
        assert_buckets_apply_and_keep_the_numbers(baselines.make(name, graph), step, args, step)


@pytest.mark.parametrize("style", sorted(STEPS))
@pytest.mark.parametrize("plan_name", ["per_tensor", "one_bucket", "ddp"])
def test_bucket_plans_reach_a_gspmd_step_and_train_as_xla_default(style, plan_name):
    build, _ = STEPS[style]
    step, args = build()
    graph = disco.extract(step, *args)
    assert_buckets_apply_and_keep_the_numbers(baselines.make(plan_name, graph), step, args, step)


def test_xla_default_merges_the_gspmd_all_reduces_so_per_tensor_is_a_real_change():
    step, args = linen_step()
    default = xla_hooks.apply(None, step, *args)
    assert compiled_all_reduces(default) == 1


def test_fusion_groups_and_cuts_reach_a_gspmd_step():
    from disco.plans import random_plans

    step, args = linen_step()
    graph = disco.extract(step, *args)
    plan = next(p for p in (random_plans.random_plan(graph, seed=s) for s in range(20)) if p.groups)
    applied = xla_hooks.apply(plan, step, *args, strict=True)
    assert applied.applied
    assert_close(three_steps(applied, args), three_steps(step, args))


# nnx's optimize in the slow tier: its step is read and its plans applied in the default one (above, and
# tests/disco/test_user_steps.py's nnx steps)
@pytest.mark.parametrize("style", [pytest.param(s, marks=pytest.mark.slow) if s == "nnx" else s for s in sorted(STEPS)])
def test_optimize_takes_a_gspmd_step_and_answers_a_plan_that_applies(style):
    step, args = STEPS[style][0]()
    result = disco.optimize(step, *args, budget_s=1.0, rounds=2, steps=2, confirm=False, measure_top_k=1,
                            bucket_sweep=(2,))
    rows = {row.name: row for row in result.rows}
    assert "xla_default" in rows and "per_tensor" in rows and result.chosen in rows
    assert all(row.applied for row in rows.values())  # every measured plan reached XLA, none fell back


@pytest.mark.parametrize("style", sorted(STEPS))
def test_xla_hooks_jit_plans_a_gspmd_step_in_process(style):
    step, args = STEPS[style][0]()
    fast = xla_hooks.jit(step, service=None, timeout_s=60, options={"strategy": "baselines"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = three_steps(fast, args)
    (applied,) = fast.applied.values()
    assert applied.applied, applied.fallback_reason
    assert compiled_all_reduces(applied) >= 1
    assert_close(out, three_steps(step, args))


@pytest.mark.parametrize("style", sorted(STEPS))
def test_xla_hooks_jit_plans_a_gspmd_step_through_a_real_service(tmp_path, style):
    pytest.importorskip("flask")
    from service.testing import ServerProcess

    build, n_params = STEPS[style]
    step, args = build()
    srv = ServerProcess(tmp_path / "plans.sqlite", workers=1, token="tok")
    srv.start()
    try:
        fast = xla_hooks.jit(step, service=srv.url, cluster="local", timeout_s=60, token="tok",
                             options={"strategy": "baselines", "seed": 0})
        out = three_steps(fast, args)
    finally:
        srv.stop()
    (applied,) = fast.applied.values()
    assert applied.applied, applied.fallback_reason
    (report,) = fast.reports.values()
    assert report["graph"]["all_reduces"] == n_params + 1
    assert_close(out, three_steps(step, args))


def test_gradients_by_dataflow_match_the_named_scopes_on_a_shard_map_step():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, optimizer="adam")
    text = disco.hlo_text(step, *args)
    scoped = HloGraph.from_hlo_text(text)
    unscoped = HloGraph.from_hlo_text(text.replace("disco_grad[", "plain["))
    by_scope = {n.name for n in scoped.all_reduces() if n.is_gradient}
    by_dataflow = {n.name for n in unscoped.all_reduces() if n.is_gradient}
    assert by_scope and by_dataflow == by_scope


@pytest.mark.fast
def test_mesh_replica_groups_expand_as_xla_lays_out_the_mesh():
    assert explicit_replica_groups("mesh['axis_0'=4,'axis_1'=1] {'axis_0'}") == "{{0,1,2,3}}"
    assert explicit_replica_groups("mesh['x'=2,'y'=2] {'y'}") == "{{0,1},{2,3}}"
    assert explicit_replica_groups("mesh['x'=2,'y'=2] {'x'}") == "{{0,2},{1,3}}"
    assert explicit_replica_groups("mesh['a'=2,'b'=2], device_ids=[3,2,1,0] {'a'}") == "{{3,1},{2,0}}"
    assert explicit_replica_groups("mesh['x'=2] {'z'}") is None
    assert explicit_replica_groups("{{0,1}}") is None


def test_a_shard_map_step_is_left_as_jax_lowered_it():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=DEVICES)
    text = step.lower(*args).as_text(dialect="hlo") if hasattr(step, "lower") else jax.jit(step).lower(*args).as_text(dialect="hlo")
    assert not gspmd.is_unpartitioned(text)


@pytest.mark.fast
def test_a_wrapper_whose_body_does_not_match_the_partitioned_program_is_refused():
    wrapper = (
        "HloModule w, entry_computation_layout={(f32[4]{0})->f32[4]{0}}\n\n"
        "xla.sdy.manual_computation_body.1 {\n  p = f32[2]{0} parameter(0)\n  ROOT c = f32[2]{0} copy(p)\n}\n\n"
        "ENTRY main {\n  a = f32[4]{0} parameter(0)\n"
        "  b = f32[4]{0} call(a), to_apply=xla.sdy.manual_computation_body.1\n  ROOT r = f32[4]{0} copy(b)\n}\n")
    partitioned = "HloModule s\n\nENTRY %m (q: f32[3]) -> f32[3] {\n  %q = f32[3]{0} parameter(0)\n  ROOT %r = f32[3]{0} copy(%q)\n}\n"
    with pytest.raises(gspmd.GspmdError, match="parameters do not match"):
        gspmd.manual_module(wrapper, partitioned)
    with pytest.raises(gspmd.GspmdError, match="no manual computation"):
        gspmd.manual_module("HloModule w\n\nENTRY main {\n  ROOT a = f32[] parameter(0)\n}\n", partitioned)
    ok = partitioned.replace("f32[3]", "f32[2]")
    text = gspmd.manual_module(wrapper, ok, name="jit_step")
    assert text.startswith("HloModule jit_step") and "%xla.sdy.manual_computation_body.1 (q: f32[2])" in text
    np.testing.assert_equal(len(HloGraph.from_hlo_text(text).nodes), 5)


def _zoo_gspmd_plans_apply(model):
    # sgd: adam would scale the rounding noise of zero gradients (attention key biases) to its step size
    step, args = trax_models.make_train_step(model, "tiny", devices=DEVICES, style="gspmd", optimizer="sgd")
    graph = disco.extract(step, *args)
    check_data_parallel(graph)  # XLA's own all-reduces feeding others are no double reduction
    reference = three_steps(jax.jit(step), args)
    for name in ("per_tensor", "one_bucket"):
        plan = baselines.make(name, graph)  # a bucket never holds an all-reduce and one it feeds
        applied = xla_hooks.apply(plan, step, *args, strict=True)
        # plus the all-reduces XLA's partitioner put inside loop bodies (gpt2 and rnnlm scan over
        # layers): out of the buckets' reach, compiled as they are
        in_loops = sum(len(lp.body.all_reduces()) for lp in graph.loops)
        assert compiled_all_reduces(applied) == len(plan.buckets) + in_loops
        assert_close(three_steps(applied, args), reference, rtol=1e-4, floor=1e-6)
    return graph


def test_a_masked_mean_s_token_count_feeding_the_gradients_is_bucketed_apart():
    graph = _zoo_gspmd_plans_apply("bert")  # its loss divides by the global token count
    deps = all_reduce_dependencies(graph)
    assert any(deps[n.name] for n in graph.all_reduces() if n.is_gradient)
    assert len(baselines.make("one_bucket", graph).buckets) == 2


def test_expert_dispatch_all_reduces_are_not_double_reductions():
    """The graph alone (moe's plans apply with its numbers in the slow tier's every-zoo-model test)."""
    step, args = trax_models.make_train_step("moe", "tiny", devices=DEVICES, style="gspmd", optimizer="sgd")
    graph = disco.extract(step, *args)
    check_data_parallel(graph)
    assert double_reductions(graph) == []
    assert any(not n.is_gradient and n.shape != "f32[]" for n in graph.all_reduces())


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(set(trax_models.names()) - {"bert"}))
def test_every_zoo_model_in_gspmd_style_takes_bucket_plans(model):
    _zoo_gspmd_plans_apply(model)


_CACHE_RUN = """
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 4)
import jax.monitoring, disco, trax_models, xla_hooks
from disco.plans import baselines
events = {}
jax.monitoring.register_event_listener(lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
step, args = trax_models.make_train_step("mlp", "tiny", devices=4, style=sys.argv[1], optimizer="sgd")
plan = baselines.make("per_tensor", disco.extract(step, *args))
applied = xla_hooks.apply(plan, step, *args, strict=True)
state, loss = applied(*args)
print(json.dumps({"plan": applied.plan.name, "digest": applied.plan.digest(), "loss": float(loss),
                  "hits": events.get("/jax/compilation_cache/cache_hits", 0),
                  "misses": events.get("/jax/compilation_cache/cache_misses", 0)}))
"""


@pytest.mark.parametrize("style", ["gspmd", "shard_map"])
def test_a_second_run_with_jax_s_persistent_compilation_cache_compiles_nothing(tmp_path, style):
    import json
    import os
    import subprocess
    import sys

    root = str(REPO)
    env = {**os.environ, "PYTHONPATH": root, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    env.pop("XLA_FLAGS", None)
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", _CACHE_RUN, style],
                           capture_output=True, text=True, timeout=300, env=env, cwd=root)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["plan"] != "xla_default" and first["misses"] > 0
    # the same plan, from the cache: no compile missed it (the partitioned program is kept beside it)
    assert second["digest"] == first["digest"] and second["loss"] == first["loss"]
    assert second["misses"] == 0 and second["hits"] >= 1
    kept = list((tmp_path / "cache" / "disco-partitioned").glob("*.hlo"))
    assert len(kept) == (1 if style == "gspmd" else 0)  # only a GSPMD step needs its partitioned program


_COMPILED_FIRST = """
import json
import jax
jax.config.update("jax_num_cpu_devices", 4)
import disco, trax_models
step, args = trax_models.make_train_step("mlp", "tiny", devices=4, style="gspmd", optimizer="sgd")
jax.jit(step).lower(*args).compile()  # the program's own compile fills jax's cache first
graph = disco.extract(step, *args)
print(json.dumps({"all_reduces": len(graph.all_reduces()), "gradients": sum(n.is_gradient for n in graph.all_reduces())}))
"""


def test_a_step_the_program_compiled_into_jaxs_cache_first_is_still_read_partitioned(tmp_path):
    """With jax's persistent compilation cache on and the step compiled by the program before disco reads
    it, the cache holds the step but no copy of its partitioned module: disco compiles it once more under
    another cache key and reads the module XLA dumps (disco.ir.extractor), in a fresh process."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", _COMPILED_FIRST], capture_output=True,
                       text=True, timeout=300, env=env, cwd=str(REPO))
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["all_reduces"] >= 1 and got["gradients"] >= 1
    assert len(list((tmp_path / "cache" / "disco-partitioned").glob("*.hlo"))) == 1  # kept for the next run

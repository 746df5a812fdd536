"""Steps read as their authors wrote them: jax.jit with static arguments, donation and open shardings,
and flax NNX's nnx.jit, through extract, apply, jit and measurement (8 CPU devices, real compiles)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import disco
import xla_hooks
from xla_hooks import measure
from disco.ir import gspmd
from disco.ir.step_form import StaticArgumentsMismatch, StepFormError, read
from disco.plans import baselines
from tests.support.equivalence import assert_close, compiled_all_reduces

DEVICES = 8


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))


def _params(mesh):
    key = jax.random.PRNGKey(0)
    params = {f"w{i}": jax.random.normal(jax.random.fold_in(key, i), (16, 16)) * 0.3 for i in range(3)}
    return jax.device_put(params, NamedSharding(mesh, P()))


TX = optax.adam(1e-2)


def _train_step(params, opt_state, batch, config, lr_scale, key):
    """A step with a static config and learning-rate scale and an rng key, as flax's lm1b example calls it."""
    def loss_fn(p):
        h = batch
        for i in range(3):
            h = jnp.tanh(h @ p[f"w{i}"])
        h = h + 0.01 * jax.random.normal(key, h.shape)
        return jnp.mean(h ** 2) * config[0]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, jax.tree.map(lambda u: u * lr_scale, updates)), opt_state, loss


def _static_step(mesh):
    rs, ds = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    return jax.jit(_train_step, in_shardings=(rs, rs, ds, None), out_shardings=(rs, rs, None),
                   static_argnums=(3, 4), donate_argnums=(0, 1))


def _state(mesh):
    params = _params(mesh)
    return params, jax.device_put(TX.init(params), NamedSharding(mesh, P()))


def _batch(mesh):
    x = jax.random.normal(jax.random.PRNGKey(7), (32, 16))
    return jax.device_put(x, NamedSharding(mesh, P("data")))


def test_a_jit_with_statics_donation_and_an_open_sharding_is_planned_and_keeps_all_three(mesh):
    step, batch, key = _static_step(mesh), _batch(mesh), jax.random.key(1)
    form = read(step)
    assert (form.kind, form.static_argnums, form.donates) == ("jax.jit", (3, 4), True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GspmdWarning for the key's None in_sharding
        graph = disco.extract(step, *_state(mesh), batch, (2.0,), 0.5, key)
        assert len(graph.all_reduces()) == 4  # three gradients and the loss, after partitioning
        plan = baselines.make("per_tensor", graph)
        params, opt_state = _state(mesh)
        applied = xla_hooks.apply(plan, step, params, opt_state, batch, (2.0,), 0.5, key, strict=True)
    assert compiled_all_reduces(applied) == len(plan.buckets) == 4
    assert gspmd.donated_parameters(applied.hlo)  # the planned module donates what jax's does
    ref_params, ref_opt = _state(mesh)
    for _ in range(3):
        params, opt_state, _ = applied(params, opt_state, batch, (2.0,), 0.5, key)
        ref_params, ref_opt, _ = step(ref_params, ref_opt, batch, (2.0,), 0.5, key)
    assert_close(params, ref_params)
    donated = _state(mesh)
    applied(*donated, batch, (2.0,), 0.5, key)
    assert all(x.is_deleted() for x in jax.tree.leaves(donated))  # invalid after the call, as with jax.jit
    with pytest.raises(StaticArgumentsMismatch, match=r"compiled for the static arguments \(argument 3 = \(2.0,\)"):
        applied(params, opt_state, batch, (3.0,), 0.5, key)


def test_measuring_a_donating_step_never_reuses_a_consumed_argument(mesh):
    step, batch, key = _static_step(mesh), _batch(mesh), jax.random.key(1)
    args = (*_state(mesh), batch, (2.0,), 0.5, key)
    applied = xla_hooks.apply(None, step, *args)
    assert applied.consumes_arguments
    times = measure.measure_interleaved({"a": applied, "b": applied}, args, rounds=2, steps=2)
    assert len(times["a"].samples) == 2
    assert not any(x.is_deleted() for x in jax.tree.leaves(args[:2]))  # the caller's arguments untouched


def test_an_unhashable_static_argument_is_refused_naming_it(mesh):
    step = _static_step(mesh)
    with pytest.raises(StepFormError, match=r"static argument \(argument 3: list\) is not hashable.*frozen dataclass"):
        xla_hooks.apply(None, step, *_state(mesh), _batch(mesh), [2.0], 0.5, jax.random.key(1))


class _MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(16, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


@nnx.jit
def _nnx_step(model, optimizer, x, y):
    """flax's NNX data-parallel idiom: value_and_grad, optimizer.update in place, the loss returned."""
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def _nnx_state(mesh):
    model = _MLP(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    state = jax.device_put(nnx.state((model, optimizer)), NamedSharding(mesh, P()))
    nnx.update((model, optimizer), state)
    return model, optimizer


def test_an_nnx_jit_step_is_planned_applied_and_updates_the_modules_in_place(mesh):
    x, y = _batch(mesh), jax.device_put(jnp.ones((32, 1)), NamedSharding(mesh, P("data")))
    model, optimizer = _nnx_state(mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = disco.extract(_nnx_step, model, optimizer, x, y)
        plan = baselines.make("per_tensor", graph)
        applied = xla_hooks.apply(plan, _nnx_step, model, optimizer, x, y, strict=True)
    assert len(graph.all_reduces()) == 5  # four parameters' gradients and the loss
    assert compiled_all_reduces(applied) == 5
    ref_model, ref_optimizer = _nnx_state(mesh)
    for _ in range(3):
        loss = applied(model, optimizer, x, y)
        ref_loss = _nnx_step(ref_model, ref_optimizer, x, y)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    assert_close(nnx.state(model), nnx.state(ref_model))
    assert int(optimizer.step[...]) == 3  # the user's own optimizer object was updated


def test_measuring_an_nnx_step_leaves_the_users_modules_as_they_were(mesh):
    x, y = _batch(mesh), jax.device_put(jnp.ones((32, 1)), NamedSharding(mesh, P("data")))
    model, optimizer = _nnx_state(mesh)
    before = jax.tree.map(np.asarray, nnx.state(model))
    applied = xla_hooks.apply(None, _nnx_step, model, optimizer, x, y)
    measure.measure(applied, (model, optimizer, x, y), rounds=2, steps=2)
    assert_close(nnx.state(model), before, rtol=0, floor=0)
    assert int(optimizer.step[...]) == 0


def test_a_flax_nnx_transform_without_an_nnx_jit_is_refused_naming_the_form_to_use():
    class NotAJit:  # stands in for a flax NNX wrapper object that has no inner jax.jit
        __module__ = "flax.nnx.transforms.transforms"

        def __call__(self, *args):
            return args

    with pytest.raises(StepFormError, match=r"a flax NNX NotAJit disco cannot lower.*nnx.jit\(step\)"):
        disco.extract(NotAJit(), jnp.ones(2))


def test_nnx_modules_passed_to_a_step_that_is_not_an_nnx_jit_are_refused_naming_the_argument(mesh):
    """jax.jit would take the modules as pytrees and drop what the step updates in place."""
    model, optimizer = _nnx_state(mesh)

    def plain(model, optimizer, x, y):  # nnx.jit's body, without nnx.jit
        return _nnx_step.fun(model, optimizer, x, y)

    with pytest.raises(StepFormError, match=r"argument 0 is a flax NNX _MLP, but 'plain' is a function, not an "
                                            r"nnx.jit.*expected an nnx.jit step"):
        disco.extract(plain, model, optimizer, _batch(mesh), jnp.ones((32, 1)))


def test_non_array_leaves_and_keyword_arguments_reach_the_planned_step(mesh):
    """None and Python-number leaves in the state (jax traces a number as a weak-typed scalar), a
    keyword argument traced and another static by name."""
    def step(state, batch, *, key, scale):
        def loss_fn(p):
            h = jnp.tanh(batch @ p["w0"]) @ p["w1"] + 0.0 * jax.random.uniform(key, (32, 16))
            return jnp.mean(h ** 2) * scale
        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        params = jax.tree.map(lambda p, g: p - state["lr"] * g, state["params"], grads)
        return {"params": params, "lr": state["lr"], "unused": None}, loss

    jitted = jax.jit(step, static_argnames="scale")
    state = {"params": {k: v for k, v in _params(mesh).items() if k in ("w0", "w1")}, "lr": 0.1, "unused": None}
    kwargs = {"key": jax.random.key(3), "scale": 2.0}
    batch = _batch(mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph = disco.extract(jitted, state, batch, kwargs=kwargs)
        plan = baselines.make("per_tensor", graph)
        applied = xla_hooks.apply(plan, jitted, state, batch, kwargs=kwargs, strict=True)
    assert compiled_all_reduces(applied) == len(plan.buckets) == 3
    got, want = state, state
    for _ in range(3):
        got, _ = applied(got, batch, **kwargs)
        want, _ = jitted(want, batch, **kwargs)
    np.testing.assert_allclose(got["lr"], 0.1, rtol=1e-7)
    assert got["unused"] is None
    assert_close(got["params"], want["params"])

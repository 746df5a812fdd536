"""Tests of the trax_models zoo: training, all-reduce structure, errors."""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import trax_models
from tests.support.paths import REPO

DEVICES = 4

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([\w\-]+)\(")


def all_reduces_by_computation(hlo: str) -> dict[str, list[str]]:
    """Maps each HLO computation name to its all-reduce instruction lines."""
    found: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header and "=" not in line.split("{")[0]:
            current = "ENTRY" if header.group(1) else header.group(2)
            continue
        op = _INSTRUCTION.match(line)
        if current and op and op.group(2) == "all-reduce":
            found.setdefault(current, []).append(line)
    return found


def reduction_computations(hlo: str) -> set[str]:
    """Names of computations used as ``to_apply`` reducers (not ``call`` targets)."""
    found = set()
    for line in hlo.splitlines():
        op = _INSTRUCTION.match(line)
        target = re.search(r"to_apply=%?([\w.\-]+)", line)
        if op and target and op.group(2) != "call":
            found.add(target.group(1))
    return found


@pytest.fixture(scope="module", params=trax_models.names())
def trained(request):
    """Lowers, compiles and runs 3 steps of one tiny model on 4 devices."""
    name = request.param
    step, (state, batch) = trax_models.make_train_step(name, "tiny", devices=DEVICES)
    lowered = jax.jit(step).lower(state, batch)
    compiled = lowered.compile()
    losses = []
    for _ in range(3):
        state, loss = compiled(state, batch)
        losses.append(float(loss))
    return {
        "name": name,
        "losses": losses,
        "leaves": jax.tree_util.tree_leaves_with_path(state.params),
        "hlo": lowered.as_text(dialect="hlo", debug_info=True),
        "state": state,
    }


def test_tiny_model_trains(trained):
    losses = trained["losses"]
    assert all(np.isfinite(losses)), losses
    assert losses[2] < losses[0], losses


def test_one_all_reduce_per_gradient_leaf_plus_loss(trained):
    hlo = trained["hlo"]
    by_computation = all_reduces_by_computation(hlo)
    # jax 0.10.2 outlines the shard_map body into its own computation
    # (``xla.sdy.manual_computation_body``) that ENTRY calls once, so the
    # all-reduces are counted over every computation except reducers.
    assert not set(by_computation) & reduction_computations(hlo)
    lines = [line for group in by_computation.values() for line in group]
    assert len(lines) == len(trained["leaves"]) + 1


def test_all_reduce_op_names_carry_parameter_paths(trained):
    lines = [
        line for group in all_reduces_by_computation(trained["hlo"]).values()
        for line in group
    ]
    op_names = [
        re.search(r'op_name="([^"]*)"', line).group(1).replace("\\'", "'")
        for line in lines
    ]
    grad_scopes = sorted(
        re.search(r"disco_grad\[(.*)\]/", n).group(1)
        for n in op_names if "disco_grad[" in n
    )
    expected = sorted(jax.tree_util.keystr(path) for path, _ in trained["leaves"])
    assert grad_scopes == expected
    assert sum("disco_loss" in n for n in op_names) == 1


def test_state_stays_replicated(trained):
    for leaf in jax.tree.leaves(trained["state"]):
        assert leaf.sharding.is_fully_replicated


def test_seed_determinism():
    _, (state_a, batch_a) = trax_models.make_train_step("mlp", devices=2, seed=3)
    _, (state_b, batch_b) = trax_models.make_train_step("mlp", devices=2, seed=3)
    _, (state_c, _) = trax_models.make_train_step("mlp", devices=2, seed=4)
    for a, b in zip(jax.tree.leaves((state_a, batch_a)), jax.tree.leaves((state_b, batch_b))):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(
        jax.tree.leaves(state_a.params)[1], jax.tree.leaves(state_c.params)[1]
    )


def test_abstract_args_lower_without_materialising():
    step, args = trax_models.make_train_step("bert", "tiny", devices=2, abstract=True)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    jax.jit(step).lower(*args)


@pytest.mark.fast
def test_names_and_presets():
    assert trax_models.names() == sorted(
        ["bert", "gpt2", "mlp", "moe", "resnet50", "rnnlm", "transformer", "transformer_lm",
         "unet", "vgg19", "vit"]
    )
    assert trax_models.presets() == ("tiny", "small", "paper")


def test_model_info_matches_state():
    info = trax_models.model_info("mlp", "small", devices=8)
    assert info.global_batch == 64
    assert info.grad_leaves == 2 * (info.config.n_layers + 1)
    assert info.param_count > 0


@pytest.mark.fast
def test_unknown_model():
    with pytest.raises(ValueError, match=r"unknown model 'nosuch'; expected one of: bert, gpt2, mlp, moe, resnet50, "):
        trax_models.make_train_step("nosuch")


@pytest.mark.fast
def test_unknown_preset():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'; expected one of: tiny, small, paper"):
        trax_models.make_train_step("mlp", "huge")


@pytest.mark.fast
def test_unknown_optimizer():
    with pytest.raises(ValueError, match=r"unknown optimizer 'lamb'; expected one of: adam, adamw, sgd"):
        trax_models.make_train_step("mlp", optimizer="lamb")


@pytest.mark.fast
def test_too_many_devices():
    n = len(jax.devices()) + 1
    with pytest.raises(
        ValueError,
        match=rf"requested {n} devices but only {n - 1} are available.*"
        r"xla_force_host_platform_device_count.*jax_num_cpu_devices",
    ):
        trax_models.make_train_step("mlp", devices=n)


@pytest.mark.fast
def test_indivisible_global_batch():
    with pytest.raises(ValueError, match=r"global batch 16 is not divisible by the devices count 3"):
        trax_models.make_train_step("transformer_lm", "small", devices=3)


def test_import_does_not_import_jax():
    code = "import sys, trax_models; trax_models.names(); assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, error, message", [
    ({"name": ["mlp"]}, ValueError, r"unknown model \['mlp'\]; expected one of: bert, "),
    ({"name": "mlp", "preset": {"tiny": 1}}, ValueError, r"unknown preset \{'tiny': 1\}; expected one of: tiny, "),
    ({"name": "mlp", "optimizer": ["sgd"]}, ValueError, r"unknown optimizer \['sgd'\]; expected one of: adam, "),
    ({"name": "mlp", "devices": 2.0}, TypeError, r"devices: expected an int >= 1 \(or None: all\), got float 2\.0"),
    ({"name": "mlp", "devices": "2"}, TypeError, r"devices: expected an int >= 1 \(or None: all\), got str '2'"),
    ({"name": "mlp", "devices": True}, TypeError, r"devices: expected an int >= 1 \(or None: all\), got bool True"),
])
def test_bad_arguments_are_refused_with_one_line(kwargs, error, message):
    """Each refused before anything is built, in one line naming the argument and what it takes
    (a list as the name raised `unhashable type: 'list'`, a float as devices `slice indices must
    be integers`, True was taken as 1 device)."""
    kwargs = dict(kwargs)
    with pytest.raises(error, match=message) as info:
        trax_models.make_train_step(kwargs.pop("name"), kwargs.pop("preset", "tiny"), **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.fast
@pytest.mark.parametrize("devices, error", [(2.5, TypeError), (0, ValueError), (None, TypeError)])
def test_model_info_checks_devices(devices, error):
    with pytest.raises(error, match=r"devices: expected an int >= 1, got"):
        trax_models.model_info("mlp", "tiny", devices=devices)


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, error, message", [
    ({"seed": "x"}, TypeError, r"seed: expected an int in \[0, 2\*\*63\), got str 'x'"),
    ({"seed": -1}, ValueError, r"seed: expected an int in \[0, 2\*\*63\), got -1"),
    ({"seed": 2**63}, ValueError, r"seed: expected an int in \[0, 2\*\*63\), got 9223372036854775808"),
    ({"learning_rate": "x"}, TypeError, r"learning_rate: expected a finite number >= 0 or an optax schedule "
                                       r"\(or None: the optimizer's default\), got str 'x'"),
    ({"learning_rate": -0.1}, ValueError, r"learning_rate: expected a finite number >= 0 .*got -0\.1"),
    ({"learning_rate": float("nan")}, ValueError, r"learning_rate: expected a finite number >= 0 .*got nan"),
])
def test_bad_seed_or_learning_rate_is_refused(kwargs, error, message):
    """A str seed raised jax's 'not a valid JAX array type', -1 numpy's 'expected non-negative integer'
    (naming no argument), 2**63 an OverflowError; a str, NaN or negative learning rate built a step."""
    with pytest.raises(error, match=message) as info:
        trax_models.make_train_step("mlp", "tiny", devices=1, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("learning_rate", [0, lambda count: 0.0])
def test_zero_learning_rate_and_schedules_are_learning_rates(learning_rate):
    step, (state, batch) = trax_models.make_train_step("mlp", devices=1, optimizer="sgd",
                                                       learning_rate=learning_rate)
    new_state, _ = jax.jit(step)(state, batch)
    np.testing.assert_array_equal(jax.tree.leaves(new_state.params)[0], jax.tree.leaves(state.params)[0])


@pytest.mark.fast
@pytest.mark.parametrize("global_batch", [4.0, "4", None, True])
def test_build_train_step_refuses_a_global_batch_that_is_not_an_int(global_batch):
    """4.0 raised numpy's "'float' object cannot be interpreted as an integer", "4" and None a bare
    "'<' not supported", naming no argument; True was taken as a batch of 1."""
    from trax_models import _registry

    task = _registry.model_module("mlp").task(_registry.config("mlp", "tiny"))
    with pytest.raises(TypeError, match=r"global_batch: expected an int that is a positive multiple of "
                                        r"devices \(1\), got \w+ "):
        trax_models.build_train_step(task, global_batch, devices=1)

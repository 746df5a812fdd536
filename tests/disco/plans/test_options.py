"""XLA:CPU's YNNPACK fusion types as a plan compile option (disco.plans.options, issue 21)."""

from __future__ import annotations

import functools
import random
import re

import jax
import pytest

import trax_models
import xla_hooks
from disco.ir.extractor import extract
from disco.plans import moves
from disco.plans import options as plan_options
from disco.plans.plan import FusionPlan, make_plan
from tests.support.equivalence import assert_close, three_steps
from tests.support.ynn import default_ynn_fusions, ynn_fusions

DEVICES = 2
NO_REDUCE = {plan_options.YNN_FUSION_TYPE: plan_options.YNN_NO_REDUCE}


@functools.cache
def setup(name):
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES, optimizer="sgd")
    return step, args


@pytest.mark.fast
def test_cpu_table_lists_the_ynn_option_and_checks_its_values():
    opt = plan_options.spec(plan_options.YNN_FUSION_TYPE, "cpu")
    assert opt is not None and opt.kind == "choice" and opt.default in opt.values
    assert plan_options.YNN_NO_REDUCE in opt.values and "REDUCE" not in plan_options.YNN_NO_REDUCE
    assert plan_options.spec(plan_options.YNN_FUSION_TYPE, "gpu") is None
    plan_options.check(tuple(NO_REDUCE.items()), "cpu")
    plan_options.check(((plan_options.YNN_FUSION_TYPE, ""),), "cpu")  # nothing to YNNPACK: XLA takes it
    for bad in ("-reduce", "LIBRARY_FUSION_TYPE_REDUCE, LIBRARY_FUSION_TYPE_DOT", "reduce"):
        with pytest.raises(ValueError, match=r"xla_cpu_experimental_ynn_fusion_type: expected a comma-separated "
                                             r"list .*got '" + re.escape(bad)):
            plan_options.check(((plan_options.YNN_FUSION_TYPE, bad),), "cpu")
    assert make_plan(compile_options=NO_REDUCE).compiler_options("cpu") == NO_REDUCE


def test_flip_option_switches_the_ynn_choice_on_cpu_and_back():
    step, args = setup("mlp")
    ctx = moves.context(extract(step, *args))
    switched = moves.flip_option(FusionPlan(), ctx, random.Random(0))
    assert switched.compile_options == tuple(NO_REDUCE.items())
    assert moves.flip_option(switched, ctx, random.Random(0)) == FusionPlan()  # XLA's default: left out
    assert moves.step_option(FusionPlan(), ctx, random.Random(0)) is None  # no size option on CPU


def test_explicit_default_compiles_as_xla_default():
    """The table's default is jaxlib's own: spelling it out changes nothing in the module."""
    step, args = setup("unet")
    before = default_ynn_fusions(step, args)
    spelled = xla_hooks.apply(make_plan(compile_options={plan_options.YNN_FUSION_TYPE: plan_options.YNN_DEFAULT}),
                              step, *args)
    assert spelled.applied, spelled.fallback_reason
    assert ynn_fusions(spelled.compiled_text()) == before


def test_no_reduce_applies_with_fewer_ynn_fusions_and_same_numbers():
    """A plan carrying the option applies on CPU, its module hands fewer fusions to YNNPACK
    (GroupNorm's reductions go to XLA's loop fusions), and three steps agree with jax.jit's.
    (unet: mlp's YNN fusions are all dots, which the option leaves in YNNPACK.)"""
    name = "unet"
    step, args = setup(name)
    before = default_ynn_fusions(step, args)
    plan = make_plan(compile_options=NO_REDUCE, name="no_reduce_ynn")
    applied = xla_hooks.apply(plan, step, *args, strict=True)
    assert applied.applied, applied.fallback_reason
    after = ynn_fusions(applied.compiled_text())
    assert after < before, f"{name}: YNN fusions {before} -> {after}"
    assert_close(three_steps(applied, args), three_steps(jax.jit(step), args))

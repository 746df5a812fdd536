"""A zoo step written with jax.pmap (style="pmap") through disco: extract, apply, jit, optimize.

jax 0.8.3 to 0.12 lower ``jax.pmap`` under ``jax.jit`` through shard_map, so its pmeans reach
the HLO as all-reduces over replica groups, like a shard_map step's."""

from __future__ import annotations

import functools
import warnings

import jax
import pytest

import disco
import trax_models
import xla_hooks
from disco.ir.replica_groups import replica_group_size
from disco.plans import baselines
from tests.support.equivalence import (
    assert_buckets_apply_and_keep_the_numbers,
    assert_close,
    three_steps,
)

DEVICES = 4


@functools.cache
def setup():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, optimizer="sgd", style="pmap")
    return step, args, disco.extract(step, *args)


def test_the_pmeans_are_all_reduces_over_replica_groups_one_per_gradient():
    step, args, graph = setup()
    n_params = len(jax.tree.leaves(args[0].params))
    grads = [n for n in graph.all_reduces() if n.is_gradient]
    assert len(grads) == n_params and len(graph.all_reduces()) == n_params + 1  # + the loss's
    assert len({n.param_path for n in grads}) == n_params
    # over all the step's devices: {{0,1,2,3}} (jax <= 0.10) or mesh['dp'=4] {'dp'} (jax 0.12)
    assert all(replica_group_size(n.replica_groups) == DEVICES for n in graph.all_reduces())


@pytest.mark.parametrize("plan_name", ["per_tensor", "one_bucket"])
def test_bucket_plans_reach_a_pmap_step_and_train_as_xla_default(plan_name):
    step, args, graph = setup()
    assert_buckets_apply_and_keep_the_numbers(baselines.make(plan_name, graph), step, args, jax.jit(step))


def test_xla_hooks_jit_plans_a_pmap_step_in_process():
    step, args, _ = setup()
    fast = xla_hooks.jit(step, service=None, timeout_s=60, options={"strategy": "baselines"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = three_steps(fast, args)
    (applied,) = fast.applied.values()
    assert applied.applied, applied.fallback_reason
    assert_close(out, three_steps(jax.jit(step), args))


@pytest.mark.slow
def test_optimize_takes_a_pmap_step_and_answers_a_plan_that_applies():
    step, args, _ = setup()
    result = disco.optimize(step, *args, budget_s=1.0, rounds=2, steps=2, confirm=False, measure_top_k=1,
                            bucket_sweep=(2,))
    rows = {row.name: row for row in result.rows}
    assert "xla_default" in rows and "per_tensor" in rows and result.chosen in rows
    assert all(row.applied for row in rows.values())


class _Attr:
    def __init__(self, value):
        self.value = value


class _Lowered:
    """What check_not_replicated reads of a jax Lowered: its module's attributes."""

    def __init__(self, attributes):
        self.operation = self
        self.attributes = attributes

    def compiler_ir(self, dialect):
        assert dialect == "stablehlo"
        return self


@pytest.mark.fast
def test_a_module_lowered_as_replicas_is_refused_for_the_fallback():
    # jax 0.8.x with jax_pmap_shmap_merge off lowers a pmap step as replicas (mhlo.num_replicas = N)
    from xla_hooks.apply_plan import check_not_replicated

    check_not_replicated(_Lowered({"mhlo.num_replicas": _Attr(1), "mhlo.num_partitions": _Attr(4)}))
    check_not_replicated(_Lowered({}))
    with pytest.raises(ValueError, match=r"lowered as 4 replicas .*jax_pmap_shmap_merge"):
        check_not_replicated(_Lowered({"mhlo.num_replicas": _Attr(4)}))

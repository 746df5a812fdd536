"""disco.optimize on a step with sharded parameters (FSDP): the answer applies and keeps the numbers."""

from __future__ import annotations

import warnings

import jax
import pytest

import disco
import trax_models
import xla_hooks
from disco import optimizer as opt
from disco import planner
from disco.plans import baselines
from tests.support.equivalence import assert_allclose_leaves, three_steps

CONFIG = opt.OptimizeConfig(budget_s=2, measure_top_k=2, measure_rounds=1, rounds=2, steps=1, bucket_sweep=(2,),
                            measure_bound=False, finalists=2, confirm_rounds=2)


@pytest.mark.parametrize("mesh_shape", [(1, 8), (2, 4)])
def test_optimize_accepts_an_fsdp_zoo_step_and_its_answer_keeps_xla_defaults_numbers(mesh_shape, monkeypatch):
    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, style="fsdp", mesh_shape=mesh_shape,
                                             optimizer="sgd")
    searched = []  # every plan the search priced
    search_plans = planner.search_plans

    def recording(graph, sim, strategy, *, cost=None, **kw):
        return search_plans(graph, sim, strategy, cost=lambda p: searched.append(p) or cost(p), **kw)

    monkeypatch.setattr(planner, "search_plans", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = disco.optimize(step, *args, config=CONFIG)
    roles = {c.role for c in result.simulator.graph.collective_roles()}
    assert {"param_gather", "grad_scatter"} <= roles  # the sharded step's collectives, read as such
    # the search considered gather buckets: its start plans, and plans its moves made from them
    gathered = {p.digest(): p.name for p in searched if p.gather_buckets}
    assert set(baselines.GATHER_NAMES) <= set(gathered.values()) and len(gathered) > len(baselines.GATHER_NAMES)
    measured = [r for r in result.rows if r.median_s is not None and r.applied]
    assert len(measured) >= 3 and all(r.peak_memory_bytes > 0 for r in measured)
    reference = three_steps(jax.jit(step), args)
    # the answer, and the fastest other plan measured (so that an answer of xla_default still applies a plan)
    base = result.row("xla_default")
    others = sorted((r for r in measured if r.name != "xla_default"), key=lambda r: -r.gain(base))
    for plan in dict.fromkeys([result.plan, others[0].plan]):
        applied = xla_hooks.apply(plan, step, *args, strict=True)
        assert applied.applied and (plan.is_default or not applied.plan.is_default)
        assert_allclose_leaves(three_steps(applied, args), reference, rtol=1e-5)

"""Peak device memory per measured plan, and the memory limit: a plan over it is measured, never chosen."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

import disco
import trax_models
import xla_hooks
from disco import optimizer as opt
from disco.plans import baselines
from disco.plans.plan import FusionPlan
from disco.sim.memory import peak_memory
from tests.support.optimize_results import row

CONFIG = opt.OptimizeConfig(budget_s=2, measure_top_k=1, measure_rounds=1, rounds=2, steps=1, bucket_sweep=(),
                            measure_bound=False, finalists=2, confirm_rounds=2)


@pytest.fixture(scope="module")
def fsdp():
    """mlp tiny in fsdp style over 8 devices (1 x 8), sgd, and the peaks of two baselines' compiled steps:
    per_tensor's is below horovod's (one bucket of every gradient: its concatenation adds temporaries)."""
    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, style="fsdp", optimizer="sgd")
    graph = disco.extract(step, *args)
    peaks = {}
    for name in ("xla_default", "per_tensor", "horovod"):
        applied = xla_hooks.apply(baselines.make(name, graph), step, *args, strict=True)
        peaks[name] = peak_memory(applied).peak
    return step, args, peaks


@pytest.fixture(scope="module")
def limited(fsdp):
    """One optimize run with the limit halfway between per_tensor's and horovod's measured peaks."""
    step, args, peaks = fsdp
    assert peaks["per_tensor"] < peaks["horovod"], peaks  # the test's premise, measured
    limit = (peaks["per_tensor"] + peaks["horovod"]) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = disco.optimize(step, *args, config=CONFIG, memory_limit=limit)
    return result, limit, peaks


def test_every_measured_row_carries_its_compiled_peak_memory(limited):
    result, _, peaks = limited
    measured = [r for r in result.rows if r.median_s is not None]
    assert measured and all(r.peak_memory_bytes is not None and r.peak_memory_bytes > 0 for r in measured)
    by = {r.name: r.peak_memory_bytes for r in result.rows}
    assert by["per_tensor"] == peaks["per_tensor"] and by["horovod"] == peaks["horovod"]  # the same compile's analysis


def test_a_plan_over_the_limit_is_measured_but_never_chosen(limited):
    result, limit, _ = limited
    assert result.memory_limit == limit
    over = {r.name for r in result.rows if r.over_memory is not None}
    assert "horovod" in over and "per_tensor" not in over and "xla_default" not in over
    for r in result.rows:
        if r.name != "xla_default" and r.peak_memory_bytes is not None:
            assert (r.over_memory is not None) == (r.peak_memory_bytes > limit), r
    assert result.chosen not in over and result.best_baseline not in over
    assert f"{limit:,}" in result.row("horovod").over_memory
    assert result.row("horovod").median_s is not None  # measured all the same
    assert "peak" in result.details() and "not chosen" in result.details()


def test_the_json_keeps_each_rows_peak_memory_and_the_limit(limited):
    result, limit, _ = limited
    data = json.loads(json.dumps(result.to_dict()))
    assert data["memory_limit_bytes"] == limit
    assert {r["name"]: r["peak_memory_bytes"] for r in data["rows"]} == {r.name: r.peak_memory_bytes
                                                                       for r in result.rows}
    assert {r["name"] for r in data["rows"] if r["over_memory"]} == {r.name for r in result.rows if r.over_memory}


def test_the_verdict_skips_a_faster_plan_over_the_memory_limit():
    base = row("xla_default", 10e-3, speedup=1.0)
    fast = row("ddp", 5e-3, speedup=2.0)
    fast = dataclasses.replace(fast, over_memory="peak device memory 3 bytes over the limit of 2 bytes")
    slower = row("per_tensor", 8e-3, speedup=1.25)
    chosen, why = opt._choice.verdict((base, fast, slower))
    assert chosen == "per_tensor" and "over the memory limit not chosen: ddp" in why
    assert opt._choice.finalists((base, fast, slower), 3) == ["per_tensor"]
    assert opt._choice.best_baseline((base, fast, slower)) == "per_tensor"


def test_the_limit_is_the_lesser_of_the_config_and_the_devices_memory():
    assert opt.OptimizeConfig(memory_limit="2GB").memory_limit == 2 * 10**9
    assert opt.OptimizeConfig(memory_limit="512MiB").limit_for(None) == 512 * 2**20
    assert opt.OptimizeConfig(memory_limit="512MiB").limit_for(2**20) == 2**20
    assert opt.OptimizeConfig().limit_for(None) is None and opt.OptimizeConfig().limit_for(5) == 5
    with pytest.raises(ValueError, match="memory_limit: .*size"):
        opt.OptimizeConfig(memory_limit="lots")
    with pytest.raises(ValueError, match="memory_limit"):
        opt.OptimizeConfig(memory_limit=0)


def test_apply_falls_back_when_the_plan_is_over_the_limit_and_xla_default_is_not(fsdp):
    step, args, peaks = fsdp
    assert peaks["xla_default"] < peaks["horovod"], peaks
    graph = disco.extract(step, *args)
    limit = (peaks["xla_default"] + peaks["horovod"]) // 2
    with pytest.warns(xla_hooks.PlanFallbackWarning, match=rf"{peaks['horovod']:,}.*{limit:,}.*{peaks['xla_default']:,}"):
        fell = xla_hooks.apply(baselines.make("horovod", graph), step, *args, memory_limit=limit)
    assert not fell.applied and fell.plan.is_default and fell.requested.name == "horovod"
    assert peak_memory(fell).peak == peaks["xla_default"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = xla_hooks.apply(baselines.make("per_tensor", graph), step, *args, memory_limit=limit)
    assert kept.applied
    with pytest.raises(ValueError, match="over the limit"):
        xla_hooks.apply(baselines.make("horovod", graph), step, *args, memory_limit=limit, strict=True)
    with pytest.warns(UserWarning, match="over it too; keeping the plan"):
        both = xla_hooks.apply(baselines.make("horovod", graph), step, *args, memory_limit=peaks["per_tensor"])
    assert both.applied
    assert xla_hooks.apply(FusionPlan(), step, *args, memory_limit=1).plan.is_default  # the default is never refused

"""disco optimize: search, then measure; the answer keeps the step's numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

import disco
import trax_models
import xla_hooks
from disco.plans import baselines
from disco import optimizer as opt
from disco.plans.plan import FusionPlan
from tests.equivalence import assert_allclose_leaves, three_steps
from xla_hooks.measure import Measurement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_optimize_mlp_tiny_keeps_the_numbers():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    result = opt.optimize(step, *args, budget_s=3, measure_top_k=2, rounds=2, steps=1)
    names = {r.name for r in result.rows}
    assert {"xla_default", "per_tensor", "horovod", "ddp", "disco_1"} <= names
    assert all(r.median_s is not None and r.min_s <= r.median_s <= r.max_s for r in result.rows)
    assert result.evals > 0 and result.evals_per_s > 0 and 0 < result.lower_bound_s <= result.row("disco_1").predicted_s
    if result.chosen == "xla_default":
        assert (result.verdict.startswith("no plan beat xla_default when measured")
                or "did not hold in a second run" in result.verdict)
        assert result.speedup == 1.0
    else:  # faster, round by round, in the selection run and again in the confirmation run
        assert result.row(result.chosen).speedup > 1
        assert result.row("xla_default").speedup == 1.0
        again = result.confirmation
        assert set(again) == {"xla_default", result.chosen}
        if result.runoff is not None:  # two or more plans beat xla_default in the selection run
            assert "xla_default" in result.runoff and result.chosen in result.runoff
            assert 3 <= len(result.runoff) <= 4 and "run-off of" in result.verdict
        assert result.speedup == result.confirmed_speedup > 1
        assert "confirmed in a second run" in result.verdict
    json.dumps(result.to_dict())
    assert result.chrome_trace["traceEvents"]
    med, lo, hi = result.comm_free_bound_s  # measured by default, in the same rounds
    assert 0 < lo <= med <= hi
    assert "comm_free_bound" not in names and result.chosen != "comm_free_bound"
    digests = {r.plan.digest() for r in result.rows}
    graph = disco.extract(step, *args)
    for k in (2, 3, 4):  # the measured bucket sweep (one row each, unless another row is the same plan)
        even = baselines.make("even", graph, k=k)
        assert even.name in names or even.digest() in digests
    assert result.row("even_2").median_s is not None and len(result.row("even_2").plan.buckets) == 2
    searched = result.row("disco_1").plan
    if searched.groups:  # its bucket-only projection is measured too (maybe as an equal baseline)
        projected = searched.replace(groups=(), xla_fusion="extend").digest()
        assert projected in {r.plan.digest() for r in result.rows}
    reference = three_steps(jax.jit(step), args)
    for plan in (result.plan, result.row("disco_1").plan):
        applied = xla_hooks.apply(plan, step, *args)
        assert applied.applied, applied.fallback_reason
        assert_allclose_leaves(three_steps(applied, args), reference)


def row(name, median, lo=None, hi=None, applied=True, speedup=None):
    return opt.PlanRow(name, "baseline", name, FusionPlan(name=name), 1e-3, median,
                       median if lo is None else lo, median if hi is None else hi, applied, speedup=speedup)


def test_verdict_keeps_xla_default_when_nothing_beats_it():
    chosen, verdict = opt._verdict([row("xla_default", 1.0), row("ddp", 1.25), row("disco_1", 0.5, applied=False)])
    assert chosen == "xla_default"
    assert verdict == ("no plan beat xla_default when measured; the best other plan, ddp, measured 0.800x "
                       "(1250.000 vs 1000.000 ms median); keeping XLA's default compile")


def test_verdict_names_the_winner_and_noise():
    chosen, verdict = opt._verdict([row("xla_default", 1.0, 0.9, 1.1), row("disco_1", 0.95, 0.9, 1.0)])
    assert chosen == "disco_1"
    assert verdict.startswith("disco_1 measured 1.053x faster than xla_default (950.000 vs 1000.000 ms median)")
    assert "within run-to-run noise" in verdict


def test_verdict_ranks_by_the_paired_speedup_not_the_medians():
    # ddp's median is lower, but round by round even_2 beat xla_default by more
    rows = [row("xla_default", 1.0, speedup=1.0), row("ddp", 0.8, speedup=1.05), row("even_2", 0.9, speedup=1.2)]
    chosen, verdict = opt._verdict(rows)
    assert chosen == "even_2" and verdict.startswith("even_2 measured 1.200x faster than xla_default")
    assert opt._finalists(rows, 3) == ["even_2", "ddp"]
    rows = [row("xla_default", 1.0, speedup=1.0), row("ddp", 0.8, speedup=0.97)]
    assert opt._verdict(rows)[0] == "xla_default" and opt._finalists(rows, 3) == []


def m(*samples):
    return Measurement(tuple(samples))


def test_confirmation_keeps_a_gain_that_holds_and_drops_one_that_does_not():
    again = {"xla_default": m(1.0, 2.0, 1.0), "ddp": m(0.8, 1.6, 1.0)}  # paired ratios 1.25, 1.25, 1.0
    chosen, verdict, gain = opt._confirmed("ddp", "ddp measured 1.2x", again)
    assert chosen == "ddp" and gain == 1.25
    assert verdict == ("ddp measured 1.2x; confirmed in a second run: 1.250x paired over 3 rounds; 1000.000 vs "
                       "1000.000 ms median")
    again = {"xla_default": m(1.0, 1.0, 1.0), "ddp": m(1.0, 0.5, 1.1)}  # a lower median, not a paired gain
    chosen, verdict, gain = opt._confirmed("ddp", "ddp measured 1.2x", again)
    assert chosen == "xla_default" and gain == 1.0
    assert verdict == ("ddp measured fastest, but the gain did not hold in a second run (1.000x paired over 3 "
                       "rounds; 1000.000 vs 1000.000 ms median); keeping XLA's default compile")


def test_finalists_are_the_fastest_applied_plans_that_beat_xla_default():
    rows = [row("xla_default", 1.0), row("ddp", 0.8), row("horovod", 0.7), row("even_2", 0.9),
            row("disco_1", 0.5, applied=False), row("per_tensor", 1.3)]
    assert opt._finalists(rows, 3) == ["horovod", "ddp", "even_2"]
    assert opt._finalists(rows, 1) == ["horovod"]
    assert opt._finalists([row("xla_default", 1.0), row("ddp", 1.1)], 3) == []


def test_runoff_picks_the_largest_paired_speedup_there():
    again = {"xla_default": m(1.0, 1.0, 1.0), "horovod": m(0.85, 0.8, 0.9), "ddp": m(0.8, 0.75, 0.9)}
    chosen, verdict = opt._runoff("horovod", "horovod measured 1.4x", again)
    assert chosen == "ddp"
    assert verdict == "horovod measured 1.4x; but ddp was the best in a run-off of 2 (ddp 1.250x, horovod 1.176x)"
    chosen, verdict = opt._runoff("ddp", "ddp measured 1.4x", again)
    assert chosen == "ddp" and verdict.startswith("ddp measured 1.4x; the best again in a run-off of 2")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"unknown search strategy 'tabu'; expected one of"):
        opt.optimize(lambda x: x, 1.0, strategy="tabu")
    with pytest.raises(ValueError, match=r"measure_top_k: expected an integer >= 0, got -1"):
        opt.optimize(lambda x: x, 1.0, measure_top_k=-1)
    with pytest.raises(ValueError, match=r"finalists: expected an integer >= 1, got 0"):
        opt.optimize(lambda x: x, 1.0, finalists=0)
    with pytest.raises(ValueError, match=r"bucket_sweep: expected bucket counts \(integers >= 1\), got \(2, 0\)"):
        opt.optimize(lambda x: x, 1.0, bucket_sweep=(2, 0))


def test_cli_optimize_json_in_a_subprocess(tmp_path):
    out = tmp_path / "plan.json"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, "-m", "disco", "optimize", "--model", "mlp", "--preset", "tiny", "--devices", "4",
         "--budget", "3", "--json", "--rounds", "2", "--steps", "1", "--measure-top-k", "1",
         "--bucket-sweep", "3", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["model"] == "mlp" and data["verdict"] and data["chosen"] in {r["name"] for r in data["rows"]}
    assert data["search"]["evals"] > 0 and "chrome_trace" not in data
    assert "even_3" in {r["name"] for r in data["rows"]} and "even_2" not in {r["name"] for r in data["rows"]}
    assert data["comm_free_bound_ms"]["min"] <= data["comm_free_bound_ms"]["median"]
    assert FusionPlan.from_json(out.read_text()).name == data["chosen"]


def test_cli_rejects_an_unknown_cluster():
    from disco import cli

    assert cli.main(["optimize", "--model", "mlp", "--cluster", "moon-base"]) == 2


@pytest.mark.parametrize("sweep", ["2,x", "0", "3,-1"])
def test_cli_rejects_a_bad_bucket_sweep(sweep, capsys):
    from disco import cli

    assert cli.main(["optimize", "--model", "mlp", "--bucket-sweep", sweep]) == 2
    assert "--bucket-sweep" in capsys.readouterr().err


def test_public_api_names_the_function():
    import disco

    assert disco.optimize is opt.optimize  # disco.optimize(step, *args, ...) as the issue specifies
    assert disco.OptimizeResult is opt.OptimizeResult


def test_the_table_shows_paired_speedups_and_the_confirmation(capsys):
    from disco.cli import optimize as optimize_cli

    rows = (row("xla_default", 0.100, 0.090, 0.120, speedup=1.0), row("ddp", 0.080, 0.070, 0.090, speedup=1.30),
            row("horovod", 0.079, 0.070, 0.095, speedup=1.20))
    result = opt.OptimizeResult(
        plan=rows[1].plan, chosen="ddp", verdict="ddp measured 1.300x faster", rows=rows, lower_bound_s=5e-4,
        trace=(), evals=10, evals_per_s=5.0, strategy="best_first", search_s=2.0, chrome_trace={},
        baseline_trace={}, cost_model="analytic", cluster="local", graph={}, rounds=9, steps=3,
        comm_free_bound_s=(0.06, 0.05, 0.07), confirmation={"xla_default": (0.1, 0.09, 0.11), "ddp": (0.08, 0.07, 0.09)},
        confirmed_speedup=1.25, comm_free_bound_speedup=1.6)
    assert result.speedup == 1.25 and result.to_dict()["confirmed_speedup"] == 1.25
    optimize_cli._print_table(result, {"model": "mlp", "preset": "tiny", "devices": 4, "device_kind": "cpu",
                                       "cost_model_info": {"name": "analytic"}})
    out = capsys.readouterr().out
    assert "vs xla_default (paired)" in out and "verdict: ddp measured 1.300x faster" in out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith(("│ ddp", "│ horovod"))]
    # sorted by the paired speedup (ddp first, though horovod's median is lower); vs best baseline = 1.30/1.30
    assert [ln.split()[1] for ln in lines] == ["ddp", "horovod"]
    assert "1.300x" in lines[0] and "1.000x" in lines[0] and "1.200x" in lines[1] and "0.923x" in lines[1]
    assert "confirmation run (ms, median (min-max)): xla_default 100.000" in out
    assert "ddp's paired speedup there 1.250x" in out and "can gain here is 1.600x" in out

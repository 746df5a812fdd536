"""The funnel's compiled stage: the model's top plans compiled by XLA, priced by the compiled tier, and that
price picking the plans measured. The pure parts (ranking, the per-digest cache, a failed compile) on
hand-built priced modules; the funnel with real XLA:CPU compiles on a machine of known behaviour (the
formula runner of test_funnel)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from disco import optimizer as opt
from disco.calibrate import correction as corr
from disco.optimizer import _compiled
from disco.optimizer._learn import Predictor
from disco.plans.plan import FusionPlan
from disco.sim.compiled import Collective, CompiledStep
from tests.disco.optimizer.test_funnel import FormulaRunner
from tests.support.optimize_results import built_result


def _step(ms: float, compute_ms: float | None = None, all_reduces: int = 1) -> CompiledStep:
    compute = (ms if compute_ms is None else compute_ms) * 1e-3
    colls = tuple(Collective(f"ar{i}", "all-reduce", 1024, 8, False, 1) for i in range(all_reduces))
    return CompiledStep("cpu", (), colls, compute, 0.1e-3, ms * 1e-3)


def _plan(i: int) -> FusionPlan:
    return FusionPlan(name=f"p{i}", compile_options=(("xla_cpu_enable_fast_math", "true" if i % 2 else "false"),
                                                     ("xla_cpu_parallel_codegen_split_count", str(i + 1))))


def _predictor(state: corr.Correction | None = None) -> SimpleNamespace:
    """What :func:`_compiled.predict` reads of a Predictor: the simulator's time, the key, the state."""
    return SimpleNamespace(simulator=SimpleNamespace(step_time=lambda plan: 9e-3), state=state or corr.init(),
                           key=lambda plan: ("graph", plan.digest()))


@pytest.mark.fast
def test_the_compiled_price_ranks_the_plans_that_compiled():
    plans = {p.digest(): p for p in map(_plan, range(4))}
    digests = list(plans)
    steps = {digests[0]: _step(3.0), digests[1]: _step(1.0), digests[2]: _step(2.0)}  # the 4th never compiled
    prices = _compiled.init()._replace(steps=steps)
    order = _compiled.ranked(prices, plans, _predictor())
    assert [d for d, _ in order] == [digests[1], digests[2], digests[0]]
    assert [pred for _, pred in order] == [(1e-3, "compiled", 9e-3), (2e-3, "compiled", 9e-3), (3e-3, "compiled", 9e-3)]


@pytest.mark.fast
def test_the_compiled_price_goes_through_its_own_correction_else_the_emulated_one():
    plan, other = _plan(0), _plan(1)
    step = _step(2.0, compute_ms=1.5, all_reduces=2)
    feats = _compiled.features(step)
    assert feats == pytest.approx((1.5e-3, 0.5e-3, 0.1e-3, 2e-3))
    emulated = corr.init([corr.Point("graph", other.digest(), (1e-3, 0, 0, 1e-3), 4e-3)])
    by_emulated = _compiled.predict(_predictor(emulated), _compiled.init(), plan, step)
    assert by_emulated == (pytest.approx(emulated.predict(feats)), "compiled-corrected", 9e-3)
    own = _compiled.init()._replace(correction=corr.init([corr.Point("graph", other.digest(), feats, 6e-3)]))
    value, by, _ = _compiled.predict(_predictor(emulated), own, plan, step)
    assert by == "compiled-corrected" and value == pytest.approx(own.correction.predict(feats))
    # the plan's own point (an earlier run's) is left out: with no other point, the compiled tier's time
    alone = _compiled.init()._replace(correction=corr.init([corr.Point("graph", plan.digest(), feats, 6e-3)]))
    assert _compiled.predict(_predictor(), alone, plan, step) == (2e-3, "compiled", 9e-3)


@pytest.mark.fast
def test_a_batch_is_priced_without_the_points_of_any_of_its_plans():
    """A later run measures again plans an earlier run kept: each of the batch's compiled predictions
    leaves out every one of the batch's points, not only its own (one state for the batch)."""
    plan, mate, other = _plan(0), _plan(1), _plan(2)
    step = _step(2.0, compute_ms=1.5, all_reduces=2)
    feats = _compiled.features(step)
    points = [corr.Point("graph", mate.digest(), feats, 9e-3), corr.Point("graph", other.digest(), feats, 3e-3)]
    prices = _compiled.init()._replace(correction=corr.init(points))
    alone = _compiled.predict(_predictor(), prices, plan, step)
    together = _compiled.predict(_predictor(), prices, plan, step, batch=[plan, mate])
    assert alone[0] == pytest.approx(prices.correction.predict(feats))  # the mate's point counts alone
    assert together == (pytest.approx(corr.init(points[1:]).predict(feats)), "compiled-corrected", 9e-3)
    assert together[0] != pytest.approx(alone[0])
    # the whole correction is the batch's: the emulated tier's, then the compiled tier's own time
    assert _compiled.predict(_predictor(), prices, plan, step, batch=[mate, other]) == (2e-3, "compiled", 9e-3)


@pytest.mark.fast
def test_each_plan_is_compiled_once_per_digest():
    calls = []

    def price(plan):
        calls.append(plan.digest())
        return _step(1.0 + len(calls))

    plans = [_plan(i) for i in range(3)]
    prices = _compiled.price_plans(_compiled.init(), plans[:2], price)
    again = _compiled.price_plans(prices, [plans[1].replace(name="renamed"), plans[2], plans[0]], price)
    assert calls == [p.digest() for p in plans] and again.compiles == 3
    assert again.steps[plans[0].digest()] is prices.steps[plans[0].digest()]  # the first price kept
    assert prices.compiles == 2  # the state is immutable: the first is what it was


@pytest.mark.fast
def test_a_plan_that_does_not_compile_drops_out_with_a_warning():
    calls = []

    def price(plan):
        calls.append(plan.name)
        if plan.name == "p1":
            raise RuntimeError("INTERNAL: the rewritten module did not compile\nmore detail")
        return _step(1.0)

    plans = [_plan(i) for i in range(3)]
    with pytest.warns(opt.CompiledStageWarning,
                      match=r"plan 'p1' did not compile \(RuntimeError: INTERNAL: the rewritten module did not "
                            r"compile\); left out of the compiled ranking"):
        prices = _compiled.price_plans(_compiled.init(), plans, price)
    assert set(prices.failed) == {plans[1].digest()} and prices.compiles == 3
    _compiled.price_plans(prices, plans, price)  # not tried again: no second warning (warnings are errors)
    assert calls == ["p0", "p1", "p2"]
    ranked = _compiled.ranked(prices, {p.digest(): p for p in plans}, _predictor())
    assert plans[1].digest() not in dict(ranked) and len(ranked) == 2


@pytest.mark.fast
def test_the_stage_runs_on_cpu_devices_only(monkeypatch):
    import jax

    assert _compiled.available() is None
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert "CPU devices only, not on 'gpu'" in _compiled.available()


@pytest.mark.fast
def test_compiled_origins_are_reported(capsys):
    """The table's "(by)" says cmp and cmp+cor; the accuracy line counts them and puts the simulator
    alone beside them."""
    from disco.cli import _optimize_report as optimize_report

    base = built_result()
    by = {"xla_default": "emulated", "ddp": "compiled", "horovod": "compiled-corrected"}
    rows = tuple(dataclasses.replace(r, predicted_by=by[r.name], predicted_s=r.median_s * 1.1, simulated_s=1e-3)
                 for r in base.rows)
    res = dataclasses.replace(base, rows=rows)
    info = {"model": "mlp", "preset": "tiny", "devices": 8, "device_kind": "cpu",
            "cost_model_info": {"name": "analytic"}, "cluster_spec": {}}
    optimize_report.print_table(res, info)
    out = capsys.readouterr().out
    assert max(len(ln) for ln in out.splitlines()) <= 120  # the table's width (tests/disco/cli/test_cli.py)
    cells = {ln.split("│")[1].strip().rstrip(" *"): ln.split("│")[3].split()[-1] for ln in out.splitlines()
             if ln.startswith("│") and ln.split("│")[1].strip().rstrip(" *") in by}
    assert cells == {"xla_default": "emu", "ddp": "cmp", "horovod": "cmp+cor"}
    text = " ".join(out.split())
    assert "cmp the compiled tier" in text and "cmp+cor the compiled tier through the correction" in text
    acc = opt.accuracy(rows)
    assert acc.sources == {"emulated": 1, "compiled": 1, "compiled-corrected": 1}
    assert "predicted by: compiled 1, compiled-corrected 1, emulated 1); the simulator alone:" in acc.line()


@pytest.mark.fast
def test_the_compiled_stage_flag_makes_the_config():
    from disco import cli
    from disco.cli.common import CliError
    from disco.cli.optimize import config_from_args

    parse = cli.build_parser().parse_args
    assert config_from_args(parse(["optimize", "--model", "mlp"])).compiled_top_k == opt.OptimizeConfig().compiled_top_k
    assert config_from_args(parse(["optimize", "--model", "mlp", "--compiled-top-k", "6"])).compiled_top_k == 6
    with pytest.raises(CliError, match="--compiled-top-k: expected an integer >= 0, got -1"):
        config_from_args(parse(["optimize", "--model", "mlp", "--compiled-top-k", "-1"]))


# -- the funnel with the stage on, real XLA:CPU compiles -------------------------------------------
CONFIG = opt.OptimizeConfig(budget_s=5, max_evals=60, measure_top_k=2, measure_rounds=3, rounds=3, steps=1,
                            compiled_top_k=4)


@pytest.fixture(scope="module")
def staged(target):
    """One funnel with the stage on: every compile recorded; the first plan asked for fails."""
    real = _compiled.compiler(target)
    calls: list[str] = []

    def price(plan):
        calls.append(plan.digest())
        if len(calls) == 1:
            raise ValueError("the first plan does not compile (a test's failure)")
        return real(plan)

    with pytest.warns(opt.CompiledStageWarning, match="did not compile .ValueError: the first plan"):
        _, measured = opt.funnel(target, CONFIG, runner=FormulaRunner(), price_fn=price)
    return calls, measured


def test_each_plan_is_compiled_once_in_a_run(staged):
    calls, measured = staged
    assert len(calls) == len(set(calls)) == measured.prices.compiles
    ranked = [d for r in measured.rounds for d in r.compiled]
    assert set(ranked) <= set(measured.prices.steps) and set(calls) - set(ranked) <= set(measured.prices.failed)


def test_a_plan_that_does_not_compile_is_never_measured(staged):
    calls, measured = staged
    assert list(measured.prices.failed) == [calls[0]]
    assert calls[0] not in {r.plan.digest() for r in measured.rows}
    assert measured.rounds[0].compile_failed == 1 and calls[0] not in measured.rounds[0].compiled


def test_the_measured_plans_are_those_the_compiled_price_ranks_first(staged):
    _, measured = staged
    rows = {r.plan.digest(): r for r in measured.rows}
    forced = {"xla_default", *opt.REPORTED_BASELINES, "reduce_fusion"}
    for rnd in measured.rounds:
        picked = [rows[d].name for d in rnd.compiled[:CONFIG.measure_top_k]]
        assert set(rnd.measured) - forced == set(picked) and picked
        assert all(rows[d].predicted_by.startswith("compiled") for d in rnd.compiled[:CONFIG.measure_top_k])
    by = [r.predicted_by for r in measured.rows if r.name not in forced]
    assert by[:2] == ["compiled", "compiled"] and set(by[2:]) == {"compiled-corrected"}  # no point in round 1


def test_every_prediction_was_made_before_its_plan_was_measured_with_the_compiled_stage(target, staged):
    """Replaying the rounds: an emulated row's prediction is the emulated correction fitted to the rounds
    before its own; a compiled row's is its compiled price through the compiled correction fitted to them
    (in the first round, none: the compiled tier's own time); the rounds' compiled order is that price's."""
    _, measured = staged
    prices = measured.prices
    rows = {r.name: r for r in measured.rows}
    predictor = Predictor.of(target.simulator)
    replay = _compiled.init()._replace(steps=prices.steps)
    for rnd in measured.rounds:
        order = [_price(predictor, replay, d) for d in rnd.compiled]
        assert order == sorted(order) and len(order) >= CONFIG.measure_top_k
        for name in rnd.measured:
            row = rows[name]
            digest = row.plan.digest()
            if digest in rnd.compiled:
                expected = _compiled.predict(predictor, replay, row.plan, prices.steps[digest])
            else:
                expected = predictor.predict(row.plan)
            assert (row.predicted_s, row.predicted_by) == (pytest.approx(expected[0], rel=1e-9), expected[1])
            assert row.simulator_s == pytest.approx(target.simulator.step_time(row.plan))
        scale = rows["xla_default"].median_s
        learned = [(rows[n].plan, scale / rows[n].speedup, None) for n in rnd.measured]
        replay = _compiled.learn(replay, predictor, learned, target)
        predictor = predictor.with_state(corr.update(predictor.state,
                                                     [predictor.point(p, s) for p, s, _ in learned]))
    assert replay.correction.weights == prices.correction.weights
    assert predictor.state.weights == measured.correction.weights


def test_a_second_run_prices_its_compiled_rows_without_any_of_the_rounds_kept_points(target, staged):
    """A second run from the first's correction measures again some of the plans the first kept: each
    compiled row of a round is priced from the kept points less every point of that round's plans."""
    _, first = staged
    start = first.correction
    _, again = opt.funnel(target, CONFIG, runner=FormulaRunner(), price_fn=_compiled.compiler(target), state=start)
    predictor = Predictor.of(target.simulator, start)
    rows = {r.name: r for r in again.rows}
    rnd = again.rounds[0]
    batch = [rows[n].plan for n in rnd.measured]
    keys = {predictor.key(p) for p in batch}
    assert keys & {p.key for p in start.points}  # the round measures again plans the first run kept
    others = start.without(keys)
    compiled = [rows[n] for n in rnd.measured if rows[n].plan.digest() in rnd.compiled]
    assert compiled and all(r.predicted_by == "compiled-corrected" for r in compiled)
    alone = []  # what leaving out each plan's own point alone would have said
    for row in compiled:
        feats = _compiled.features(again.prices.steps[row.plan.digest()])
        assert row.predicted_s == pytest.approx(others.predict(feats), rel=1e-9)
        alone.append(start.without([predictor.key(row.plan)]).predict(feats))
    assert [r.predicted_s for r in compiled] != pytest.approx(alone, rel=1e-6)


def _price(predictor, prices, digest):
    """:func:`_compiled.predict`'s value for a plan known by its digest alone (the window's unmeasured
    plans): the prediction reads the plan only through the predictor's key and the simulator."""
    shim = SimpleNamespace(simulator=SimpleNamespace(step_time=lambda plan: 0.0), state=predictor.state,
                           key=lambda plan: (predictor.simulator.graph.fingerprint, digest))
    return _compiled.predict(shim, prices, None, prices.steps[digest])[0]

"""The fourth step of ``optimize``: the finalists measured again, with the regrouped plan (the
fastest fusing plan's decisions on the fastest baseline's buckets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from disco.ir.graph import HloGraph
from disco.optimizer._accuracy import source_of
from disco.optimizer._candidates import Predict, predicted_row
from disco.optimizer._choice import (PlanRow, Span, finalists, measured_gains, over_memory, regroup_sources,
                                     runoff_choice)
from disco.optimizer._learn import Predictor
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._measure import Measured, measured_row
from disco.optimizer._prepare import Target
from disco.optimizer._runners import InProcessRunner, Runner, Trials
from disco.plans.naming import content_name
from disco.plans.plan import FusionPlan, decisions
from xla_hooks.measure import paired_speedup


@dataclasses.dataclass(frozen=True)
class RunOff:
    """The finalists measured again with xla_default in fresh interleaved rounds.

    Picking the fastest of a dozen noisy medians favours whichever plan got lucky rounds (the
    winner's curse); the run-off measures the ``finalists`` fastest plans that beat
    xla_default again, and the fastest there is chosen. With them, when
    :func:`~disco.optimizer._choice.regroup_sources` finds a pair, the fastest fusing plan's
    fusion decisions on the fastest baseline's buckets (:func:`regrouped_row`), measured here only.

    Attributes:
      chosen: the finalist with the largest paired speedup there.
      verdict: the first verdict, with what the run-off found.
      times: each finalist's and xla_default's times there.
      speedups: each finalist's paired speedup over xla_default there.
      rows: the plans measured in the run-off only (the regrouped plan), with its times there.
      executables: their compiled steps by row name (the confirmation reuses them).
      trials: what the runner measured there.
    """

    chosen: str
    verdict: str
    times: dict[str, Span]
    speedups: dict[str, float]
    rows: tuple[PlanRow, ...] = ()
    executables: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict, repr=False,
                                                                      compare=False)
    trials: Trials | None = dataclasses.field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        gain = self.speedups.get(self.chosen)
        gain_text = "" if gain is None else f" {gain:.3f}x"
        return (f"RunOff(chosen={self.chosen[:60]!r}{gain_text}, {len(self.speedups)} finalists, "
                f"{len(self.rows)} rows of its own; .verdict for why)")


def regrouped(fusing: FusionPlan, bucketing: FusionPlan, graph: HloGraph, name: str) -> FusionPlan | None:
    """``fusing``'s fusion decisions (groups, cuts, XLA's fusion, compile options) on ``bucketing``'s
    buckets, named ``name``; None when the two do not validate together."""
    try:
        return fusing.replace(buckets=bucketing.buckets, name=name).validate(graph)
    except ValueError:
        return None


def regrouped_plan(gains: Mapping[str, float], kinds: Mapping[str, str], plans: Mapping[str, FusionPlan],
                   graph: HloGraph) -> FusionPlan | None:
    """The measured rows' regrouped plan, named by content (:func:`disco.plans.naming.content_name`;
    :func:`~disco.optimizer._choice.regroup_sources`'s pair, :func:`regrouped`); None when there
    is no pair, the two do not validate together, or the plan is one of ``plans`` already. The
    arguments are :func:`~disco.optimizer._choice.regroup_sources`'s, and the step's graph."""
    found = _regroup(gains, kinds, plans, graph)
    return None if found is None else found[0]


def _regroup(gains: Mapping[str, float], kinds: Mapping[str, str], plans: Mapping[str, FusionPlan],
             graph: HloGraph) -> tuple[FusionPlan, str, str] | None:
    """:func:`regrouped_plan`'s plan with the names of its fusing plan and its baseline."""
    pair = regroup_sources(gains, kinds, plans)
    if pair is None:
        return None
    fusing, bucketing = pair
    plan = regrouped(plans[fusing], plans[bucketing], graph, "")
    if plan is None or plan.digest() in {p.digest() for p in plans.values()}:
        return None
    return plan.replace(name=content_name(plan)), fusing, bucketing


def regrouped_row(target: Target, rows: tuple[PlanRow, ...], predict: Predict | None = None) -> PlanRow | None:
    """The measured rows' regrouped plan (:func:`regrouped_plan`) as an unmeasured row, or None;
    predicted by ``predict`` (the funnel's last model; default: the simulator)."""
    found = _regroup(measured_gains(rows), {r.name: r.kind for r in rows}, {r.name: r.plan for r in rows},
                     target.graph)
    if found is None:
        return None
    plan, fusing, bucketing = found
    found_as = {r.name: r.found_as or r.name for r in rows}
    by = source_of(getattr(target.costs, "name", type(target.costs).__name__))
    predict = predict or (lambda p: (target.simulator.step_time(p), by, target.simulator.step_time(p)))
    return predicted_row(plan.name, "search",
                         f"{fusing}'s {fusion_decisions(plan)} on {bucketing}'s buckets (measured in the run-off)",
                         plan, predict, f"{found_as[fusing]}_on_{found_as[bucketing]}")


def fusion_decisions(plan: FusionPlan) -> str:
    """What of ``plan`` is not its buckets, in words (:func:`disco.plans.plan.decisions`): "3 fusion
    groups and compile options (xla_gpu_enable_latency_hiding_scheduler=True)", or "XLA's defaults"."""
    return " and ".join(decisions(plan)) or "XLA's defaults"


def run_off(target: Target, measured: Measured, config: OptimizeConfig, progress: Progress = no_progress,
            runner: Runner | None = None) -> RunOff | None:
    """The run-off, or None when it does not run (``config.confirm`` off, or too few contenders).
    With ``config.measure_regrouped``, the regrouped plan (:func:`regrouped_row`) is compiled and
    measured there too. Reports phase "run-off".

    On a runner that reuses its compiles (this process), the ``config.finalists`` fastest plans
    that beat xla_default are the contenders, and the run-off runs when there are two or more.
    On one that compiles every plan afresh on every run (fresh processes), a run-off costs a
    whole launch: only the first choice is a contender, and the run-off runs only against the
    regrouped plan.
    """
    runner = runner or InProcessRunner()
    if not config.confirm:
        return None
    finals = finalists(measured.rows, config.finalists if runner.reuses_compiles else 1)
    if runner.reuses_compiles and len(finals) < 2:
        return None
    if not finals:
        return None
    predict = None if measured.correction is None else Predictor.of(target.simulator, measured.correction).predict
    extra = regrouped_row(target, measured.rows, predict) if config.measure_regrouped else None
    if not runner.reuses_compiles and extra is None:
        return None
    rows_by_name = {r.name: r for r in measured.rows}
    plans = {n: rows_by_name[n].plan for n in ("xla_default", *finals)}
    if extra is not None:
        progress("run-off", 0.0, f"compiling {extra.name}")
        plans[extra.name] = extra.plan
    rounds = config.rounds
    trials = runner.run(target, plans, rounds=rounds, steps=config.steps, measure_fallbacks=False,
                        compiled=measured.executables,
                        on_round=lambda r: progress("run-off", (r + 1) / rounds, f"run-off round {r + 1}/{rounds}"))
    if extra is not None and extra.name in trials.info.get("unmeasured", {}):
        extra = dataclasses.replace(extra, applied=False, fallback_reason=trials.info["unmeasured"][extra.name])
    limit = config.limit_for(target.cluster.device_memory_bytes)
    # a plan that fell back is no contender (it is XLA's default compile again), nor one over the memory limit
    again = {n: t.times for n, t in trials.by_name.items()
             if n == "xla_default" or (t.applied and over_memory(t.peak_memory_bytes, limit) is None)}
    chosen, why = runoff_choice(measured.chosen, measured.verdict, again)
    speedups = {n: paired_speedup(again["xla_default"], m) for n, m in again.items() if n != "xla_default"}
    rows: tuple[PlanRow, ...] = ()
    if extra is not None:
        t = trials.by_name.get(extra.name)
        row = extra if t is None else measured_row(extra, t, trials.by_name["xla_default"].times, limit)
        rows = (dataclasses.replace(row, measured_in="run-off"),)
    return RunOff(chosen, why, {n: trials.by_name[n].span() for n in again}, speedups, rows,
                  {r.name: trials.compiled[r.name] for r in rows if r.name in trials.compiled}, trials)

"""The funnel: search on the model, measure what it ranks on top, correct the model, search again.

TVM Ansor's loop (its cost model's update/predict) for ``optimize``. Each of
``config.measure_rounds`` rounds:

1. the search (:func:`disco.planner.search_plans`, ``budget_s / measure_rounds``
   seconds) runs on the current model (:class:`~disco.optimizer._learn.Predictor`: the simulator
   through this machine's correction) and its best plans join the pool, each with its bucket-only
   projection (``config.measure_buckets_only``); the first round also pools the best baseline by
   prediction and the ``even_<k>`` sweep (``config.bucket_sweep``): candidates the model ranks
   like any other, not measurements made regardless;
2. with the compiled stage on (``config.compiled_top_k`` > 0, CPU devices:
   :mod:`disco.optimizer._compiled`), the ``compiled_top_k`` unmeasured plans of the pool that the
   model ranks fastest are compiled by XLA (once per plan in a run) and priced by the compiled tier
   through the correction, and that price ranks them; a plan that does not compile drops out;
3. the ``config.measure_top_k`` unmeasured plans ranked fastest (by the compiled price where the
   stage ran, then by the model) are predicted (that prediction is the one the report judges: made
   before the plan is measured, from one state of the correction for the whole round, without any
   point a plan of the round left in the kept correction; a compiled plan's is its compiled price) and measured with
   xla_default in interleaved rounds (the first round also measures the references:
   :data:`~disco.optimizer.REPORTED_BASELINES` and, on CPU devices, ``reduce_fusion``, whose
   YNNPACK calls the simulator does not model; and the communication-free bound);
4. every newly measured, applied plan becomes a point of the correction, which is refit
   (:func:`disco.calibrate.correction.update`) before the next round searches. A point's time is
   xla_default's first-round median over the plan's paired speedup in its own rounds: under load
   a machine's speed drifts between rounds, and the pairing with xla_default cancels the drift
   (the rows and the report keep each plan's own median). With the compiled stage on, the compiled
   tier's own correction is refit too, from the measured plans' compiled modules.

A row's paired speedup is over xla_default in the rounds it was measured in; the first choice is
the largest (:func:`~disco.optimizer._choice.verdict`), and the run-off and the confirmation follow.
"""

from __future__ import annotations

import dataclasses
import warnings
from functools import partial
from typing import Any, NamedTuple

from disco import planner
from disco.calibrate import correction as corr
from disco.optimizer import _compiled
from disco.optimizer._accuracy import accuracy
from disco.optimizer._candidates import (
    REPORTED_BASELINES,
    Candidates,
    SearchSummary,
    bucket_projection,
    predicted_row,
    references,
)
from disco.optimizer._choice import PlanRow, verdict
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._learn import Predictor
from disco.optimizer._measure import Bound, Measured, measured_row
from disco.optimizer._prepare import Target
from disco.optimizer._runners import InProcessRunner, Runner
from disco.plans.naming import content_name
from disco.plans.plan import FusionPlan
from xla_hooks.measure import paired_speedup


class FunnelRound(NamedTuple):
    """One round of the funnel.

    Attributes:
      index: 0 for the first.
      evals: plans the round's search evaluated.
      measured: the rows measured in the round (xla_default aside, after the first).
      pooled: the plans in the pool after the round's search (measured or not).
      points: the points the correction held after the round's refit.
      tau, median_error: the round's plans' predictions (made before they were measured) against
        their measurements (:func:`~disco.optimizer._accuracy.accuracy`); None when undefined.
      compiled: the digests of the plans the compiled stage ranked in the round, fastest first by
        their compiled price (the first ``measure_top_k`` of them were measured); () when it did not run.
      compile_failed: how many plans of the round's window it left out because they did not compile.
    """

    index: int
    evals: int
    measured: tuple[str, ...]
    pooled: int
    points: int
    tau: float | None
    median_error: float | None
    compiled: tuple[str, ...] = ()
    compile_failed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.index + 1, "evals": self.evals, "measured": list(self.measured),
                "pooled": self.pooled, "points": self.points,
                "kendall_tau": self.tau, "median_relative_error": self.median_error,
                "compiled": len(self.compiled), "compile_failed": self.compile_failed}


@dataclasses.dataclass
class _Pool:
    """The plans found so far (mutable, local to :func:`funnel`): by digest, their kind, origin,
    plan and, for a bucket-only projection, its searched plan's digest."""

    entries: dict[str, tuple[str, str, FusionPlan, str | None]] = dataclasses.field(default_factory=dict)
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # digest -> row name, once named
    found: dict[str, str] = dataclasses.field(default_factory=dict)  # digest -> the search-order name
    searched: int = 0

    def add(self, kind: str, origin: str, plan: FusionPlan, parent: str | None = None) -> None:
        self.entries.setdefault(plan.digest(), (kind, origin, plan, parent))

    def name(self, digest: str) -> str:
        """The row name of a pooled plan: a baseline's own; for a searched plan and a projection,
        its name by content (:func:`disco.plans.naming.content_name`: the same plan, the same name
        in every run)."""
        if digest in self.names:
            return self.names[digest]
        kind, origin, plan, parent = self.entries[digest]
        name = (content_name(plan) if parent is not None or origin.startswith("searched")
                else plan.name or digest[:12])
        while name in self.names.values():  # two plans of one name (e.g. a start plan found twice)
            name += "'"
        self.names[digest] = name
        return name

    def found_as(self, digest: str) -> str:
        """The name a plan had in the search's order: ``disco_<n>`` for the n-th searched plan
        measured, ``<its searched plan>_buckets`` for a projection, a baseline's own name
        (:attr:`~disco.optimizer.PlanRow.found_as`)."""
        if digest in self.found:
            return self.found[digest]
        kind, origin, plan, parent = self.entries[digest]
        if parent is not None:
            found = f"{self.found_as(parent)}_buckets"
        elif origin.startswith("searched"):
            self.searched += 1
            found = f"disco_{self.searched}"
        else:
            found = self.name(digest)
        self.found[digest] = found
        return found

    def origin(self, digest: str) -> str:
        kind, origin, plan, parent = self.entries[digest]
        return f"{self.name(parent)} without its fusion groups" if parent is not None else origin


def funnel(target: Target, config: OptimizeConfig, progress: Progress = no_progress,
           runner: Runner | None = None, state: corr.Correction | None = None,
           price_fn: _compiled.PriceFn | None = None) -> tuple[Candidates, Measured]:
    """The module doc's rounds on ``runner`` (default :class:`~disco.optimizer.InProcessRunner`),
    starting from correction ``state`` (default: none, the simulator as it is; with
    ``config.learn`` off it is never refit). Reports phases "search", "compile" (the compiled
    stage, when on) and "measure".

    Args:
      price_fn: what compiles and prices a plan for the compiled stage (default
        :func:`~disco.optimizer._compiled.compiler` of ``target``).

    Warns:
      CompiledStageWarning: for each plan the compiled stage could not compile, and once when the
        stage is asked for on a backend other than the CPU (it does not run there).

    Returns:
      The candidates measured (with the search summary of all rounds together) and what was measured: the rows in measuring order, the first choice, the
      bound, the compiled steps, the rounds, the final correction and the compiled stage's prices.
    """
    runner = runner or InProcessRunner()
    stage = config.compiled_top_k > 0
    if stage and price_fn is None and (why := _compiled.available()) is not None:
        warnings.warn(f"compiled_top_k={config.compiled_top_k}: {why}; the emulated ranking picks",
                      _compiled.CompiledStageWarning, stacklevel=2)
        stage = False
    price_fn = price_fn or (_compiled.compiler(target) if stage else None)
    prices = _compiled.init()
    predictor = Predictor.of(target.simulator, state)
    rounds = config.measure_rounds
    budget = config.budget_s / rounds
    limit = config.limit_for(target.cluster.device_memory_bytes)
    pool = _Pool()
    forced: list[str] = []  # digests the first round measures whatever the model says
    xla = None
    for name, kind, origin, plan in references(target, config, predictor.predict):
        if name == "xla_default":
            xla = plan.replace(name=name)
            continue
        pool.add(kind, origin, plan.replace(name=name))
        if name in REPORTED_BASELINES or name == "reduce_fusion":
            forced.append(plan.digest())
    assert xla is not None
    rows: dict[str, PlanRow] = {}  # measured, in measuring order
    measured = {xla.digest()}
    compiled: dict[str, Any] = {}
    first_trials = bound = None
    done: list[FunnelRound] = []
    evals, elapsed, trace, strategy = 0, 0.0, [], config.strategy
    for r in range(rounds):
        def on_step(n: int, t: float, best: float, r: int = r) -> None:
            progress("search", min(1.0, (r + min(1.0, t / budget)) / rounds),
                     f"round {r + 1}/{rounds}: {n} plans, best {best * 1e3:.3f} ms (predicted)")

        found = planner.search_plans(target.graph, target.simulator, config.strategy, budget_s=budget,
                                     max_evals=config.max_evals, seed=config.seed + r, on_step=on_step,
                                     cost=predictor.cost)
        strategy = found.strategy
        trace += [(evals + e, elapsed + t, c) for e, t, c in found.trace]
        evals += found.evals
        elapsed += found.elapsed_s
        for _, p in found.top:
            pool.add("search", f"searched from {p.name}", p)
            projected = bucket_projection(p) if config.measure_buckets_only else None
            if projected is not None:
                pool.add("search", "", projected, parent=p.digest())
        picks = [d for d in dict.fromkeys(forced) if d not in measured] if r == 0 else []
        ranked = sorted((d for d in pool.entries if d not in measured and d not in picks),
                        key=lambda d: predictor.cost(pool.entries[d][2]))
        by_compiled: dict[str, tuple[float, str, float]] = {}  # digest -> compiled prediction, fastest first
        failed = 0
        if stage:
            window = {d: pool.entries[d][2] for d in ranked[:config.compiled_top_k]}
            progress("compile", r / rounds, f"round {r + 1}/{rounds}: compiling and pricing {len(window)} plans")
            prices = _compiled.price_plans(prices, window.values(), price_fn)
            by_compiled = dict(_compiled.ranked(prices, window, predictor))
            failed = sum(d in prices.failed for d in window)
            ranked = [*by_compiled, *(d for d in ranked if d not in window)]  # a failed compile drops out
            progress("compile", (r + 1) / rounds, f"round {r + 1}/{rounds}: {len(by_compiled)} priced"
                     + (f", {failed} did not compile" if failed else ""))
        picks += ranked[:config.measure_top_k]
        if not picks:
            break
        batch = {}
        # the round's predictions from one state without any of its plans' kept points (a second run's)
        together = [*(pool.entries[d][2] for d in picks), *([xla] if r == 0 else [])]
        judge = predictor.for_batch(together)
        for d in picks:
            kind, _, plan, _ = pool.entries[d]
            name = pool.name(d)
            found_as = pool.found_as(d)
            # a compiled plan is priced from its compiled module, through the same batch's state
            predict = (partial(_compiled.predict, predictor, prices, step=prices.steps[d], batch=together)
                       if d in by_compiled else judge.predict)
            batch[name] = predicted_row(name, kind, pool.origin(d), plan.replace(name=name), predict, found_as)
        if r == 0:  # xla_default's row: predicted before its first measurement like every other
            batch = {"xla_default": predicted_row("xla_default", "baseline", "xla_default", xla,
                                                  judge.predict), **batch}
        plans = {"xla_default": xla, **{n: row.plan for n, row in batch.items()}}
        asked_bound = r == 0 and config.measure_bound and runner.measures_bound
        progress("measure", r / rounds, f"round {r + 1}/{rounds}: measuring {len(plans)} plans")
        trials = runner.run(
            target, plans, rounds=config.rounds, steps=config.steps, bound=asked_bound, compiled=compiled,
            on_compile=lambda n, r=r: progress("measure", r / rounds, f"round {r + 1}/{rounds}: compiled {n}"),
            on_round=lambda i, r=r: progress("measure", (r + (i + 1) / config.rounds) / rounds,
                                             f"round {r + 1}/{rounds}: {i + 1}/{config.rounds}"))
        compiled.update(trials.compiled)
        base = trials.by_name["xla_default"].times
        if r == 0:
            first_trials = trials
            if trials.bound is not None:
                bound = Bound(trials.bound.span(), paired_speedup(base, trials.bound.times))
        new = {n: measured_row(row, trials.by_name[n], base, limit) for n, row in batch.items()
               if n in trials.by_name}
        rows.update(new)
        measured |= {d for d in picks}
        if config.learn:  # each time on the first round's scale (module doc)
            scale = rows["xla_default"].median_s
            learned = [row for row in new.values() if row.applied and row.speedup]
            if stage:  # the compiled tier's correction, from the same measurements
                prices = _compiled.learn(prices, predictor, [(row.plan, scale / row.speedup,
                                                              trials.compiled.get(row.name)) for row in learned],
                                         target)
            points = [predictor.point(row.plan, scale / row.speedup) for row in learned]
            predictor = predictor.with_state(corr.update(predictor.state, points))
        acc = accuracy(tuple(new.values()))
        done.append(FunnelRound(r, found.evals, tuple(new), len(pool.entries), len(predictor.state.points), acc.tau,
                                acc.median_error, tuple(by_compiled), failed))
    measured_rows = tuple(rows.values())
    chosen, why = verdict(measured_rows)
    summary = SearchSummary(strategy, evals, evals / elapsed if elapsed > 0 else 0.0, elapsed, tuple(trace))
    return (Candidates(measured_rows, summary),
            Measured(measured_rows, chosen, why, bound, compiled, first_trials, tuple(done), predictor.state,
                     prices if stage else None))



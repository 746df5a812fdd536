"""The steps of ``optimize``, each a function with its own small result.

``prepare`` (extract the graph) -> ``candidates`` (search, baselines, bucket sweep) ->
``measure`` (compile and time them, interleaved; the first choice) -> ``run_off`` (the
finalists again) -> ``confirm`` (the choice against xla_default and the best baseline). Each step takes what
the earlier ones returned and the :class:`~disco.optimizer.OptimizeConfig`; none keeps state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from disco import planner, search
from disco.ir.extractor import extract
from disco.ir.graph import HloGraph
from disco.ir.replica_groups import replica_group_size
from disco.ir.step_checks import check_data_parallel
from disco.optimizer._choice import (
    PlanRow,
    Span,
    best_baseline,
    confirmed_choice,
    finalists,
    measured_gains,
    regroup_sources,
    runoff_choice,
    verdict,
)
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._runners import InProcessRunner, Runner, Trial, Trials
from disco.plans import baselines
from disco.plans.plan import FusionPlan, decisions
from disco.sim.cluster import ClusterSpec, preset, require_cluster
from disco.sim.costs import device_costs
from disco.sim.costs import CostModel, require_cost_model
from disco.sim.simulator import Simulator
from xla_hooks.measure import paired_interval, paired_speedup

REPORTED_BASELINES = ("xla_default", "per_tensor", "horovod", "ddp")


def devices_of(args: Any) -> int:
    """The number of devices the arrays in ``args`` are sharded over (at least 1)."""
    n = 1
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            n = max(n, len(sharding.device_set))
    return n


# -- prepare -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    """What is optimised: the step, its example arguments, its graph and the simulator pricing it."""

    step_fn: Callable[..., Any]
    args: tuple[Any, ...] = dataclasses.field(repr=False)
    graph: HloGraph = dataclasses.field(repr=False)
    simulator: Simulator = dataclasses.field(repr=False)

    @property
    def cluster(self) -> ClusterSpec:
        return self.simulator.cluster

    @property
    def costs(self) -> CostModel:
        return self.simulator.costs


def prepare(step_fn: Callable[..., Any], args: tuple[Any, ...], *, cluster: ClusterSpec | None = None,
            costs: CostModel | None = None, progress: Progress = no_progress) -> Target:
    """Extracts the step's graph and sets up its simulator.

    Args:
      step_fn: the training step (plain or jitted).
      args: its example arguments (real arrays: the plans are measured).
      cluster: the cluster the simulator prices collectives with (default:
        ``preset("local", devices=<devices args are sharded over>)``, or over the devices the
        all-reduces' replica groups span when more: a pmap step's host arrays are on none).
      costs: the cost model (default: the analytic model of the cluster's device kind,
        :func:`disco.sim.costs.device_costs.analytic`).
      progress: reports phase "extract".

    Raises:
      TypeError: for a ``cluster`` or ``costs`` of the wrong type (before extracting).
      ValueError: for a step disco cannot plan (no all-reduce in its pre-optimisation HLO, or a
        gradient reduced twice; :func:`disco.ir.step_checks.check_data_parallel`).

    Warns:
      NoGradientWarning: when no all-reduce is in a ``disco_grad[...]`` scope.
    """
    require_cluster(cluster, or_none=True)
    require_cost_model(costs, or_none=True)
    progress("extract", 0.0, "extracting the HLO graph")
    graph = extract(step_fn, *args)
    check_data_parallel(graph)
    if cluster is None:  # a pmap step takes host arrays: its all-reduces' groups say how many devices
        spans = [replica_group_size(n.replica_groups) or 1 for n in graph.all_reduces()]
        cluster = preset("local", devices=max([devices_of(args), *spans]))
    sim = Simulator(graph, costs or device_costs.analytic(cluster.device), cluster)
    progress("extract", 1.0, f"{len(graph.nodes)} nodes, {len(graph.all_reduces())} all-reduces")
    return Target(step_fn, tuple(args), graph, sim)


# -- candidates ----------------------------------------------------------------------------------
class SearchSummary(NamedTuple):
    """What the simulated search did: its strategy, plans evaluated, time, and its
    (evaluations, elapsed seconds, best estimate) trace."""

    strategy: str
    evals: int
    evals_per_s: float
    seconds: float
    trace: tuple[tuple[int, float, float], ...]

    def __repr__(self) -> str:
        return (f"SearchSummary({self.strategy!r}, {self.evals} evals in {self.seconds:.1f} s, "
                f"{self.evals_per_s:.0f}/s, trace of {len(self.trace)} points)")


class Candidates(NamedTuple):
    """The plans to measure, predicted but not measured yet, in measuring order.

    Attributes:
      rows: xla_default, per_tensor, horovod, ddp, the best baseline by estimate, the
        ``even_<k>`` sweep, then the ``measure_top_k`` best searched plans (``disco_<rank>``)
        each followed by its bucket-only projection (``disco_<rank>_buckets``); a plan equal
        to an earlier row is left out.
      search: the search's summary.
    """

    rows: tuple[PlanRow, ...]
    search: SearchSummary

    def __repr__(self) -> str:
        return f"Candidates({len(self.rows)} rows, {self.search!r})"


def candidates(target: Target, config: OptimizeConfig, progress: Progress = no_progress) -> Candidates:
    """Searches plans against the simulator within ``config.budget_s`` and picks what to measure.

    The bucket sweep is measured rather than simulated because the bucket count that wins on
    in-process CPU devices differs by model and is not what the simulator predicts
    (docs/archive/lab-notebook.md, "disco optimize across the zoo"). Reports phase "search".
    """
    graph, sim = target.graph, target.simulator

    def on_step(evals: int, elapsed: float, best: float) -> None:
        progress("search", search.done_fraction(elapsed, config.budget_s, evals, config.max_evals),
                 f"{evals} plans, best {best * 1e3:.3f} ms (simulated)")

    # the planner's search and baselines (the service's pipeline, which keeps the best predicted)
    result = planner.search_plans(graph, sim, config.strategy, budget_s=config.budget_s,
                                  max_evals=config.max_evals, seed=config.seed, on_step=on_step)
    base_plans, predicted = planner.simulate_baselines(graph, sim)
    rows: dict[str, PlanRow] = {}
    seen: dict[str, str] = {}  # plan digest -> the row that measures it
    for name in (*REPORTED_BASELINES, planner.best_baseline_name(predicted)):
        p = base_plans[name]
        if name not in rows:
            rows[name] = PlanRow(name, "baseline", name, p.replace(name=name), predicted[name])
            seen.setdefault(p.digest(), name)
    if config.measure_reduce_fusion and jax.default_backend() == "cpu":
        p = reduce_fusion_row(graph, base_plans[planner.best_baseline_name(predicted)])
        if p is not None and p.digest() not in seen:
            seen[p.digest()] = p.name
            rows[p.name] = PlanRow(p.name, "search", "each reduce fused with its elementwise producers",
                                   p, sim.step_time(p))
    for k in dict.fromkeys(config.bucket_sweep):
        p = baselines.make("even", graph, k=k)
        if p.digest() not in seen:
            seen[p.digest()] = p.name
            rows[p.name] = PlanRow(p.name, "baseline", f"{k} buckets of equal bytes", p, sim.step_time(p))
    rank = 0
    for cost, p in result.top:
        if rank >= config.measure_top_k:
            break
        if p.digest() in seen:
            continue
        rank += 1
        name = f"disco_{rank}"
        seen[p.digest()] = name
        rows[name] = PlanRow(name, "search", f"searched from {p.name}", p.replace(name=name), cost)
        projected = p.replace(groups=(), xla_fusion="extend")
        if config.measure_buckets_only and p.groups and projected.digest() not in seen:
            pname = f"{name}_buckets"
            seen[projected.digest()] = pname
            rows[pname] = PlanRow(pname, "search", f"{name} without its fusion groups",
                                  projected.replace(name=pname), sim.step_time(projected))
    summary = SearchSummary(result.strategy, result.evals, result.evals_per_s, result.elapsed_s,
                            tuple(result.trace))
    return Candidates(tuple(rows.values()), summary)


def reduce_fusion_row(graph: HloGraph, buckets_of: FusionPlan) -> FusionPlan | None:
    """:func:`disco.search.reduce_fusion`'s groups on ``buckets_of``'s buckets, named
    ``reduce_fusion`` (its groups with XLA's combiner where the two do not validate together);
    None for a graph without such groups."""
    groups = search.reduce_fusion(graph).groups
    if not groups:
        return None
    plan = buckets_of.replace(groups=groups, name="reduce_fusion")
    try:
        plan.validate(graph)
    except ValueError:
        plan = FusionPlan(groups=groups, name="reduce_fusion").validate(graph)
    return plan


# -- measure -------------------------------------------------------------------------------------
class Bound(NamedTuple):
    """The measured communication-free bound (the step with its all-reduces replaced by copies; not
    a plan) and its paired speedup over xla_default: an optimistic ceiling on what bucketing can gain."""

    times: Span
    speedup: float


@dataclasses.dataclass(frozen=True)
class Measured:
    """The candidates measured in one interleaved run, and the first choice.

    Attributes:
      rows: the candidates with their measured times and paired speedups.
      chosen: the row with the largest paired speedup, or xla_default when none beats it.
      verdict: one sentence saying what was chosen and why.
      bound: the communication-free bound measured in the same rounds, or None.
      executables: the compiled steps by row name (run-off and confirmation reuse them, on a
        runner that keeps them).
      trials: what the runner measured (its own rows, what it says about the run).
    """

    rows: tuple[PlanRow, ...]
    chosen: str
    verdict: str
    bound: Bound | None = None
    executables: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict, repr=False,
                                                                      compare=False)
    trials: Trials | None = dataclasses.field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        bound = "" if self.bound is None else f", bound {self.bound.speedup:.3f}x"
        gain = next((f" {r.speedup:.3f}x" for r in self.rows if r.name == self.chosen and r.speedup is not None), "")
        return f"Measured({len(self.rows)} rows, chosen={self.chosen[:60]!r}{gain}{bound}; .verdict for why)"


def measure(target: Target, cands: Candidates, config: OptimizeConfig, progress: Progress = no_progress,
            runner: Runner | None = None) -> Measured:
    """Measures every candidate, with the bound when ``config.measure_bound`` (and the runner
    measures it), in ``config.rounds`` interleaved rounds on ``runner`` (default: this process's
    devices, :class:`~disco.optimizer.InProcessRunner`). Reports phase "measure"."""
    runner = runner or InProcessRunner()
    bound_asked = config.measure_bound and runner.measures_bound
    total = len(cands.rows) + int(bound_asked) + config.rounds
    done = [0]

    def bump(msg: str) -> None:
        done[0] += 1
        progress("measure", min(1.0, done[0] / total), msg)

    trials = runner.run(target, {r.name: r.plan for r in cands.rows}, rounds=config.rounds, steps=config.steps,
                        bound=bound_asked, on_compile=lambda n: bump(f"compiled {n}"),
                        on_round=lambda r: bump(f"round {r + 1}/{config.rounds}"))
    base = trials.by_name["xla_default"].times
    bound = None if trials.bound is None else Bound(trials.bound.span(), paired_speedup(base, trials.bound.times))
    by_name = {r.name: r for r in cands.rows}
    rows = tuple(_measured_row(by_name[name], t, base) for name, t in trials.by_name.items())
    chosen, why = verdict(rows)
    return Measured(rows, chosen, why, bound, trials.compiled, trials)


def _measured_row(row: PlanRow, trial: Trial, base: Any) -> PlanRow:
    """``row`` with ``trial``'s times and its paired speedup over ``base`` (xla_default's times there)."""
    s = trial.span()
    return dataclasses.replace(row, median_s=s.median, min_s=s.min, max_s=s.max, applied=trial.applied,
                               fallback_reason=trial.fallback_reason, speedup=paired_speedup(base, trial.times),
                               all_reduces=trial.all_reduces)


# -- run-off ---------------------------------------------------------------------------------------
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
    """The measured rows' regrouped plan, named ``<fusing>_on_<baseline>``
    (:func:`~disco.optimizer._choice.regroup_sources`'s pair, :func:`regrouped`); None when there
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
    plan = regrouped(plans[fusing], plans[bucketing], graph, f"{fusing}_on_{bucketing}")
    if plan is None or plan.digest() in {p.digest() for p in plans.values()}:
        return None
    return plan, fusing, bucketing


def regrouped_row(target: Target, rows: tuple[PlanRow, ...]) -> PlanRow | None:
    """The measured rows' regrouped plan (:func:`regrouped_plan`) as an unmeasured row, or None."""
    found = _regroup(measured_gains(rows), {r.name: r.kind for r in rows}, {r.name: r.plan for r in rows},
                     target.graph)
    if found is None:
        return None
    plan, fusing, bucketing = found
    return PlanRow(plan.name, "search",
                   f"{fusing}'s {fusion_decisions(plan)} on {bucketing}'s buckets (measured in the run-off)",
                   plan, target.simulator.step_time(plan))


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
    extra = regrouped_row(target, measured.rows) if config.measure_regrouped else None
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
    # a plan that fell back is no contender (it is XLA's default compile again)
    again = {n: t.times for n, t in trials.by_name.items() if t.applied or n == "xla_default"}
    chosen, why = runoff_choice(measured.chosen, measured.verdict, again)
    speedups = {n: paired_speedup(again["xla_default"], m) for n, m in again.items() if n != "xla_default"}
    rows: tuple[PlanRow, ...] = ()
    if extra is not None:
        t = trials.by_name.get(extra.name)
        row = extra if t is None else _measured_row(extra, t, trials.by_name["xla_default"].times)
        rows = (dataclasses.replace(row, measured_in="run-off"),)
    return RunOff(chosen, why, {n: trials.by_name[n].span() for n in again}, speedups, rows,
                  {r.name: trials.compiled[r.name] for r in rows if r.name in trials.compiled}, trials)


# -- confirm ---------------------------------------------------------------------------------------
class Confirmation(NamedTuple):
    """The choice measured once more against xla_default and the first run's best baseline, in
    fresh rounds.

    Attributes:
      candidate: the plan confirmed (the choice so far).
      chosen: ``candidate`` if its gain held there and the baseline did not beat it; the baseline
        if that was faster there and beat xla_default; else xla_default.
      verdict: the verdict so far, with the confirmation's numbers.
      times: each measured plan's times there.
      speedup: the candidate's paired speedup over xla_default there.
      baseline: the first run's best baseline measured beside the candidate, or None (the
        candidate is that baseline, or no baseline beat xla_default in the first run).
      baseline_speedup: the baseline's paired speedup over xla_default there, or None.
      vs_baseline: the candidate's paired speedup over the baseline there, or None.
      vs_baseline_interval: its 90% bootstrap interval (:func:`xla_hooks.measure.paired_interval`),
        or None.
      trials: what the runner measured there (not compared).
    """

    candidate: str
    chosen: str
    verdict: str
    times: dict[str, Span]
    speedup: float
    baseline: str | None = None
    baseline_speedup: float | None = None
    vs_baseline: float | None = None
    vs_baseline_interval: tuple[float, float] | None = None
    trials: Trials | None = None

    def __repr__(self) -> str:
        base = "" if self.baseline is None else f", baseline {self.baseline[:40]!r}"
        if self.baseline is not None and self.baseline_speedup is not None:
            base += f" {self.baseline_speedup:.3f}x"
        return (f"Confirmation(candidate={self.candidate[:60]!r} {self.speedup:.3f}x{base}, "
                f"chosen={self.chosen[:60]!r}; .verdict for why)")


def confirm(target: Target, measured: Measured, config: OptimizeConfig, runoff: RunOff | None = None,
            progress: Progress = no_progress, runner: Runner | None = None) -> Confirmation | None:
    """Confirms the choice so far (the run-off's, else the first) against xla_default and, when
    the choice is not that baseline, the first run's best baseline; None when there is nothing to
    confirm (``config.confirm`` off, or xla_default chosen). Reports phase "confirm"."""
    runner = runner or InProcessRunner()
    chosen, why = (runoff.chosen, runoff.verdict) if runoff is not None else (measured.chosen, measured.verdict)
    if not config.confirm or chosen == "xla_default":
        return None
    execs = {**measured.executables, **(runoff.executables if runoff is not None else {})}
    plans = {r.name: r.plan for r in measured.rows + (runoff.rows if runoff is not None else ())}
    # beside every other choice, a baseline one too: a baseline that won the first run and the
    # run-off by noise is otherwise kept against the first run's faster one
    baseline = best_baseline(measured.rows)
    baseline = baseline if baseline != chosen else None
    rounds = config.confirmation_rounds
    names = ("xla_default", chosen) + ((baseline,) if baseline is not None else ())
    trials = runner.run(target, {n: plans[n] for n in names}, rounds=rounds, steps=config.steps, compiled=execs,
                        on_round=lambda r: progress("confirm", (r + 1) / rounds,
                                                    f"confirmation round {r + 1}/{rounds}"))
    again = {n: t.times for n, t in trials.by_name.items()}
    c = confirmed_choice(chosen, why, again, baseline)
    return Confirmation(chosen, c.answer, c.verdict, {n: t.span() for n, t in trials.by_name.items()}, c.gain,
                        baseline, c.baseline_gain, c.vs_baseline, c.vs_baseline_interval, trials)


# -- validate (not part of optimize) ----------------------------------------------------------
def validate(result: Any, runner: Runner, *, rounds: int = 21, steps: int = 3,
             target: Target | None = None) -> dict[str, Any]:
    """Measures a decided answer once more, in a run of its own after the decision: xla_default,
    the first run's best baseline and the answer in ``rounds`` interleaved rounds.

    The confirmation decides the answer (the faster of the choice and the best baseline there), so
    its ratio over the best baseline is never below 1.0 by construction; this run's ratio is the
    unbiased estimate of what the answer gains.

    Args:
      result: an :class:`~disco.optimizer.OptimizeResult`.
      runner: the runner to measure on (a :class:`~disco.optimizer.ProcessRunner`: fresh processes).
      target: the step measured; needed by runners that run the step in this process.

    Returns:
      ``{"rounds", "vs_default"`` (the answer's paired speedup over xla_default; 1.0 when it is
      xla_default), ``"vs_best_baseline"`` (over the best baseline; 1.0 when it is that
      baseline), ``"vs_best_baseline_interval"`` (its 90% bootstrap interval, None then),
      ``"rows"`` (the run's rows: the runner's own where it has them)}.

    Raises:
      ValueError: ``rounds`` or ``steps`` below 1.
      RuntimeError: when the runner fails (e.g. the workers' messages).
    """
    if isinstance(rounds, bool) or isinstance(steps, bool) or rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps >= 1 expected, got {rounds}, {steps}")
    best = result.best_baseline
    names = dict.fromkeys(("xla_default", best, result.chosen))
    plans = {n: (result.plan.replace(name=n) if n == result.chosen else result.row(n).plan) for n in names}
    if target is None:
        target = Target(None, (), result.simulator.graph, result.simulator)
    trials = runner.run(target, plans, rounds=rounds, steps=steps)
    times = {n: t.times for n, t in trials.by_name.items()}
    vs_default = paired_speedup(times["xla_default"], times[result.chosen])
    vs_best = 1.0 if best == result.chosen else paired_speedup(times[best], times[result.chosen])
    interval = (None if result.chosen in (best, "xla_default")
                else list(paired_interval(times[best], times[result.chosen])))
    rows = [dict(t.record) if t.record is not None else {"plan": n, **t.span().to_ms_dict(), "applied": t.applied}
            for n, t in trials.by_name.items()]
    return {"rounds": rounds, "vs_default": vs_default, "vs_best_baseline": vs_best,
            "vs_best_baseline_interval": interval, "rows": rows}

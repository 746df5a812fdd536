"""``optimize``: search a step's joint fusion/bucketing space, then keep only what measures faster.

1. Extract the step's graph (:func:`disco.extract`).
2. Simulate the baselines and search plans against the simulator within a time budget
   (:mod:`disco.search`).
3. Validate by measurement: apply and time, in interleaved rounds
   (:func:`disco.bench.run_bench`), the ``measure_top_k`` best plans by estimate together
   with ``xla_default``, the best baseline by estimate, ``per_tensor``, ``horovod`` and
   ``ddp``, and a short sweep of bucket counts (``even_<k>``: the gradients cut into ``k``
   buckets of equal bytes). The sweep is measured rather than simulated because the bucket
   count that wins on in-process CPU devices differs by model and is not what the simulator
   predicts: at preset small, mlp measured about 10% faster with three buckets than with one,
   while bert and vgg19 were fastest with one or two (docs/benchmarks.md).
4. The answer is the fastest *measured* plan; when nothing beats ``xla_default`` the answer
   is ``xla_default`` and the verdict says so. "Faster" is the paired speedup
   (:func:`xla_hooks.measure.paired_speedup`): per round, xla_default's time over the plan's,
   the median over rounds. A round measures every plan back to back, so the pairing cancels
   the drift between rounds that a ratio of medians keeps (on 2 shared CPU cores one
   executable's median moved by over 40% within one optimize run).
5. Run-off: picking the fastest of a dozen noisy medians favours whichever plan got lucky
   rounds (the winner's curse), so the ``finalists`` fastest plans that beat ``xla_default``
   are measured again, with it, in fresh interleaved rounds, and the fastest there is chosen.
6. Confirmation: the chosen plan is measured once more against ``xla_default`` alone, in fresh
   rounds (three times as many by default). The answer and its reported speedup come from
   that run; if the gain does not hold there, the answer is ``xla_default``.

Example::

    step, args = trax_models.make_train_step("mlp", "small", devices=8)
    result = disco.optimize(step, *args, budget_s=30)
    print(result.verdict)
    fast_step = xla_hooks.apply(result.plan, step, *args)
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from disco.plans.plan import FusionPlan
from xla_hooks.measure import Measurement, paired_speedup

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.sim.costs import CostModel

# progress(phase, fraction done in [0, 1], message); phases: "extract", "search", "measure"
Progress = Callable[[str, float, str], None]
REPORTED_BASELINES = ("xla_default", "per_tensor", "horovod", "ddp")


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One plan of the report: predicted (simulated) and measured step times in seconds.

    Attributes:
      name: "xla_default", a baseline's name, or "disco_<rank>" for a searched plan.
      kind: "baseline" or "search".
      origin: the start plan a searched plan grew from (its name before renaming).
      plan: the plan.
      predicted_s: the simulator's step time.
      measured: median, min and max over the rounds, or None when not measured.
      speedup: the paired speedup over xla_default in the same rounds
        (:func:`xla_hooks.measure.paired_speedup`); None when not measured.
      applied: whether the plan was applied (False: it fell back to XLA's default compile).
      fallback_reason: why it fell back, or None.
    """

    name: str
    kind: str
    origin: str
    plan: FusionPlan
    predicted_s: float
    median_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    applied: bool = True
    fallback_reason: str | None = None
    speedup: float | None = None

    def gain(self, base: PlanRow) -> float:
        """Speedup over ``base`` (xla_default): the paired one when measured, else the ratio of medians."""
        if self.speedup is not None:
            return self.speedup
        return base.median_s / self.median_s

    def to_dict(self) -> dict[str, Any]:
        ms = (lambda v: None if v is None else v * 1e3)  # noqa: E731
        return {"name": self.name, "kind": self.kind, "origin": self.origin,
                "predicted_ms": ms(self.predicted_s), "measured_median_ms": ms(self.median_s),
                "measured_min_ms": ms(self.min_s), "measured_max_ms": ms(self.max_s),
                "measured_speedup": self.speedup,
                "applied": self.applied, "fallback_reason": self.fallback_reason,
                "plan_digest": self.plan.digest(), "plan_summary": self.plan.summary()}


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` found and measured.

    Attributes:
      plan: the answer: the fastest measured plan, or xla_default when nothing beat it.
      chosen: the answer's row name.
      verdict: one sentence saying what was chosen and why.
      rows: every measured plan (baselines and searched), with predicted and measured times.
      lower_bound_s: the simulated lower bound of the step time.
      trace: the search's (evaluations, elapsed seconds, best estimate) trace.
      evals: plans the search evaluated.
      evals_per_s: evaluations per second of the search.
      strategy: the search strategy's name.
      search_s: seconds the search ran.
      chrome_trace: the chosen plan's simulated timeline (Chrome trace format).
      baseline_trace: xla_default's simulated timeline (Chrome trace format).
      cost_model: the cost model's name.
      cluster: the cluster's name.
      graph: the graph's name, fingerprint and size.
      rounds, steps: the measurement's interleaved rounds and steps per round.
      confirmation: (median, min, max) seconds of the chosen plan and xla_default in the
        confirmation run, by name; None when there was none (xla_default chosen, or confirm off).
      confirmed_speedup: the chosen plan's paired speedup over xla_default in the confirmation
        run (:func:`xla_hooks.measure.paired_speedup`); None when there was none.
      runoff: (median, min, max) seconds of each finalist and xla_default in the run-off, by
        name; None when there was none (fewer than two finalists, or confirm off).
      comm_free_bound_s: the measured (median, min, max) of the step with its all-reduces replaced
        by copies (:mod:`xla_hooks.bound`), in the same rounds; None when not measured. Not a
        plan: ``xla_default / bound`` is an (optimistic) ceiling on what bucketing can gain here.
      comm_free_bound_speedup: that ceiling as a paired speedup over xla_default in the same
        rounds; None when the bound was not measured.
    """

    plan: FusionPlan
    chosen: str
    verdict: str
    rows: tuple[PlanRow, ...]
    lower_bound_s: float
    trace: tuple[tuple[int, float, float], ...]
    evals: int
    evals_per_s: float
    strategy: str
    search_s: float
    chrome_trace: dict[str, Any]
    baseline_trace: dict[str, Any]
    cost_model: str
    cluster: str
    graph: dict[str, Any]
    rounds: int
    steps: int
    comm_free_bound_s: tuple[float, float, float] | None = None
    confirmation: dict[str, tuple[float, float, float]] | None = None
    runoff: dict[str, tuple[float, float, float]] | None = None
    confirmed_speedup: float | None = None
    comm_free_bound_speedup: float | None = None

    @property
    def speedup(self) -> float:
        """The answer's measured speedup over xla_default: from the confirmation run when there was
        one; 1.0 when the answer is xla_default."""
        if self.chosen == "xla_default":
            return 1.0
        if self.confirmed_speedup is not None:
            return self.confirmed_speedup
        return self.row(self.chosen).gain(self.row("xla_default"))

    def row(self, name: str) -> PlanRow:
        """The row called ``name``.

        Raises:
          KeyError: naming the rows there are.
        """
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the Chrome traces included)."""
        return {
            "chosen": self.chosen, "verdict": self.verdict, "plan": self.plan.to_dict(),
            "rows": [r.to_dict() for r in self.rows], "lower_bound_ms": self.lower_bound_s * 1e3,
            "search": {"strategy": self.strategy, "evals": self.evals, "evals_per_s": self.evals_per_s,
                       "seconds": self.search_s, "trace": [list(t) for t in self.trace]},
            "cost_model": self.cost_model, "cluster": self.cluster, "graph": dict(self.graph),
            "measurement": {"rounds": self.rounds, "steps_per_round": self.steps},
            "speedup": self.speedup, "confirmed_speedup": self.confirmed_speedup,
            "confirmation_ms": (None if self.confirmation is None else
                                {k: dict(zip(("median", "min", "max"), (x * 1e3 for x in v)))
                                 for k, v in self.confirmation.items()}),
            "runoff_ms": (None if self.runoff is None else
                          {k: dict(zip(("median", "min", "max"), (x * 1e3 for x in v)))
                           for k, v in self.runoff.items()}),
            "comm_free_bound_ms": (None if self.comm_free_bound_s is None else
                                   dict(zip(("median", "min", "max"), (v * 1e3 for v in self.comm_free_bound_s)))),
            "comm_free_bound_speedup": self.comm_free_bound_speedup,
            "chrome_trace": self.chrome_trace, "baseline_trace": self.baseline_trace,
        }


def devices_of(args: Any) -> int:
    """The number of devices the arrays in ``args`` are sharded over (at least 1)."""
    import jax

    n = 1
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            n = max(n, len(sharding.device_set))
    return n


def _verdict(rows: list[PlanRow]) -> tuple[str, str]:
    """(chosen row name, verdict) from the measured rows: the largest paired speedup wins."""
    base = next(r for r in rows if r.name == "xla_default")
    others = [r for r in rows if r.name != "xla_default" and r.median_s is not None and r.applied]
    fastest = max(others, key=lambda r: r.gain(base), default=None)
    if fastest is None or fastest.gain(base) <= 1.0:
        detail = (f"; the best other plan, {fastest.name}, measured {fastest.gain(base):.3f}x "
                  f"({fastest.median_s * 1e3:.3f} vs {base.median_s * 1e3:.3f} ms median)" if fastest else "")
        return "xla_default", f"no plan beat xla_default when measured{detail}; keeping XLA's default compile"
    overlap = fastest.max_s is not None and base.min_s is not None and fastest.max_s >= base.min_s
    note = " (the min-max ranges overlap: the gain is within run-to-run noise)" if overlap else ""
    return fastest.name, (f"{fastest.name} measured {fastest.gain(base):.3f}x faster than xla_default "
                          f"({fastest.median_s * 1e3:.3f} vs {base.median_s * 1e3:.3f} ms median){note}")


def _finalists(rows: list[PlanRow], n: int) -> list[str]:
    """The ``n`` applied plans with the largest speedups over xla_default above 1, largest first."""
    base = next(r for r in rows if r.name == "xla_default")
    better = [r for r in rows if r.name != "xla_default" and r.applied and r.median_s is not None
              and r.gain(base) > 1.0]
    return [r.name for r in sorted(better, key=lambda r: -r.gain(base))[:n]]


def _runoff(chosen: str, verdict: str, again: dict[str, Measurement]) -> tuple[str, str]:
    """(chosen, verdict) after the run-off ``again`` (one interleaved run, xla_default included):
    the largest paired speedup over xla_default wins."""
    gains = {n: paired_speedup(again["xla_default"], m) for n, m in again.items() if n != "xla_default"}
    best = max(gains, key=gains.__getitem__)
    line = ", ".join(f"{n} {gains[n]:.3f}x" for n in sorted(gains, key=lambda n: -gains[n]))
    if best == chosen:
        return chosen, f"{verdict}; the best again in a run-off of {len(gains)} ({line})"
    return best, f"{verdict}; but {best} was the best in a run-off of {len(gains)} ({line})"


def _confirmed(chosen: str, verdict: str, again: dict[str, Measurement]) -> tuple[str, str, float]:
    """(chosen, verdict, the chosen plan's paired speedup) after the confirmation run ``again``
    (one interleaved run of the chosen plan and xla_default)."""
    gain = paired_speedup(again["xla_default"], again[chosen])
    numbers = (f"{gain:.3f}x paired over {len(again[chosen].samples)} rounds; {again[chosen].median * 1e3:.3f} "
               f"vs {again['xla_default'].median * 1e3:.3f} ms median")
    if gain > 1.0:
        return chosen, f"{verdict}; confirmed in a second run: {numbers}", gain
    return "xla_default", (f"{chosen} measured fastest, but the gain did not hold in a second run "
                           f"({numbers}); keeping XLA's default compile"), gain


def optimize(
    step_fn: Callable[..., Any],
    *args: Any,
    cluster: ClusterSpec | None = None,
    costs: CostModel | None = None,
    budget_s: float = 60,
    strategy: str = "best_first",
    measure_top_k: int = 3,
    seed: int = 0,
    rounds: int = 9,
    steps: int = 3,
    measure_buckets_only: bool = True,
    measure_bound: bool = True,
    bucket_sweep: tuple[int, ...] = (2, 3, 4),
    finalists: int = 3,
    confirm: bool = True,
    confirm_rounds: int | None = None,
    progress: Progress | None = None,
) -> OptimizeResult:
    """Finds the fastest measured plan for ``step_fn`` on ``args``.

    Args:
      step_fn: the training step (plain or jitted).
      *args: its example arguments (real arrays: the plans are measured).
      cluster: the cluster the simulator prices collectives with (default:
        ``cluster.preset("local", devices=<devices args are sharded over>)``).
      costs: the cost model (default :class:`disco.sim.costs.AnalyticCosts`).
      budget_s: seconds for the search (extraction and measurement come on top).
      strategy: "best_first", "annealing" or "greedy".
      measure_top_k: how many of the best searched plans (by estimate) to measure.
      measure_buckets_only: also measure each measured searched plan with its fusion groups
        removed (``disco_<k>_buckets``: XLA fuses, the plan's buckets stay), so a plan whose
        groups were mispriced still contributes its bucketing.
      finalists: how many of the fastest measured plans go to the run-off (module doc, step 5);
        1 skips it. Only with ``confirm``.
      confirm: measure the chosen plan again against xla_default in fresh rounds and keep it
        only if it is faster there too (module doc, step 6).
      confirm_rounds: the confirmation's rounds (default ``3 * rounds``: two executables
        already compiled, so rounds cost only their steps).
      measure_bound: also measure the communication-free bound in the same rounds
        (``OptimizeResult.comm_free_bound_s``).
      bucket_sweep: bucket counts ``k`` whose ``even_<k>`` plans (module doc, step 3) are
        measured too; ``()`` measures none.
      seed: the search's seed.
      rounds: interleaved measurement rounds. Compiles dominate the measuring time, so rounds
        are cheap (9 instead of 5 added 10-15 s per zoo model at preset small on 2 CPU cores)
        and steady the medians the choice is made on.
      steps: steps per round.
      progress: called as ``progress(phase, fraction, message)``.

    Returns:
      The OptimizeResult.

    Raises:
      ValueError: for an unknown strategy, a budget that is not positive, ``measure_top_k``
        below 0, a bucket count below 1, or rounds/steps below 1.
    """
    from disco import bench, search
    from disco.plans import baselines
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts
    from disco.ir.extractor import extract
    from disco.sim.simulator import Simulator
    from xla_hooks import measure
    from xla_hooks.apply_plan import PlanFallbackWarning

    if strategy not in search.STRATEGIES:
        raise ValueError(f"unknown search strategy {strategy!r}; expected one of: {', '.join(search.STRATEGIES)}")
    if not budget_s > 0:
        raise ValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    if not isinstance(measure_top_k, int) or measure_top_k < 0:
        raise ValueError(f"measure_top_k: expected an integer >= 0, got {measure_top_k!r}")
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in bucket_sweep):
        raise ValueError(f"bucket_sweep: expected bucket counts (integers >= 1), got {bucket_sweep!r}")
    if not isinstance(finalists, int) or isinstance(finalists, bool) or finalists < 1:
        raise ValueError(f"finalists: expected an integer >= 1, got {finalists!r}")
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps: expected integers >= 1, got rounds={rounds!r}, steps={steps!r}")
    confirm_rounds = 3 * rounds if confirm_rounds is None else confirm_rounds
    if not isinstance(confirm_rounds, int) or isinstance(confirm_rounds, bool) or confirm_rounds < 1:
        raise ValueError(f"confirm_rounds: expected an integer >= 1, got {confirm_rounds!r}")
    report = progress or (lambda phase, frac, msg: None)

    report("extract", 0.0, "extracting the HLO graph")
    graph = extract(step_fn, *args)
    cluster = cluster or preset("local", devices=devices_of(args))
    costs = costs or AnalyticCosts()
    sim = Simulator(graph, costs, cluster)
    report("extract", 1.0, f"{len(graph.nodes)} nodes, {len(graph.all_reduces())} all-reduces")

    def on_step(evals: int, elapsed: float, best: float) -> None:
        report("search", min(1.0, elapsed / budget_s), f"{evals} plans, best {best * 1e3:.3f} ms (simulated)")

    result = search.run(search.make(strategy), graph, sim.step_time, budget_s=budget_s, seed=seed,
                        progress=on_step)

    # -- what to measure ---------------------------------------------------------------------
    base_plans = {name: baselines.make(name, graph) for name in baselines.NAMES}
    predicted = {name: sim.step_time(p) for name, p in base_plans.items()}
    best_base = min(predicted, key=lambda n: (predicted[n], n != "xla_default"))
    rows: dict[str, PlanRow] = {}
    seen: dict[str, str] = {}
    for name in (*REPORTED_BASELINES, best_base):
        p = base_plans[name]
        if name not in rows:
            rows[name] = PlanRow(name, "baseline", name, p.replace(name=name), predicted[name])
            seen.setdefault(p.digest(), name)
    for k in dict.fromkeys(bucket_sweep):
        p = baselines.make("even", graph, k=k)
        if p.digest() not in seen:
            seen[p.digest()] = p.name
            rows[p.name] = PlanRow(p.name, "baseline", f"{k} buckets of equal bytes", p, sim.step_time(p))
    rank = 0
    for cost, p in result.top:
        if rank >= measure_top_k:
            break
        if p.digest() in seen:
            continue
        rank += 1
        name = f"disco_{rank}"
        seen[p.digest()] = name
        rows[name] = PlanRow(name, "search", p.name, p.replace(name=name), cost)
        projected = p.replace(groups=(), xla_fusion="extend")
        if measure_buckets_only and p.groups and projected.digest() not in seen:
            pname = f"{name}_buckets"
            seen[projected.digest()] = pname
            rows[pname] = PlanRow(pname, "search", f"{name} without its fusion groups",
                                  projected.replace(name=pname), sim.step_time(projected))

    # -- measure -------------------------------------------------------------------------------
    total = len(rows) + int(measure_bound) + rounds + (rounds + confirm_rounds if confirm else 0)
    done = [0]

    def on_bench(msg: str) -> None:
        done[0] += 1
        report("measure", min(1.0, done[0] / total), msg)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanFallbackWarning)  # reported in the rows instead
        measured = bench.run_bench(step_fn, args, {n: r.plan for n, r in rows.items()}, rounds=rounds,
                                   steps=steps, progress=on_bench, comm_free_bound=measure_bound)
    bound = next(((m.measurement.median, m.measurement.min, m.measurement.max)
                  for m in measured if m.is_bound), None)
    base_m = next(m.measurement for m in measured if m.name == "xla_default")
    bound_speedup = next((paired_speedup(base_m, m.measurement) for m in measured if m.is_bound), None)
    final = []
    for m in (m for m in measured if not m.is_bound):
        r = rows[m.name]
        final.append(dataclasses.replace(
            r, median_s=m.measurement.median, min_s=m.measurement.min, max_s=m.measurement.max,
            applied=m.applied, fallback_reason=m.fallback_reason,
            speedup=paired_speedup(base_m, m.measurement)))
    chosen, verdict = _verdict(final)
    confirmation = runoff = confirmed_speedup = None
    compiled = {m.name: m.step for m in measured}
    finals = _finalists(final, finalists)
    if confirm and len(finals) > 1:  # the same executables, fresh rounds
        again = measure.measure_interleaved(
            {n: compiled[n] for n in ("xla_default", *finals)}, args, rounds=rounds, steps=steps,
            on_round=lambda r: on_bench(f"run-off round {r + 1}/{rounds}"))
        runoff = {n: (m.median, m.min, m.max) for n, m in again.items()}
        chosen, verdict = _runoff(chosen, verdict, again)
    if confirm and chosen != "xla_default":  # the same executables, fresh rounds
        again = measure.measure_interleaved(
            {n: compiled[n] for n in ("xla_default", chosen)}, args, rounds=confirm_rounds, steps=steps,
            on_round=lambda r: on_bench(f"confirmation round {r + 1}/{confirm_rounds}"))
        confirmation = {n: (m.median, m.min, m.max) for n, m in again.items()}
        chosen, verdict, confirmed_speedup = _confirmed(chosen, verdict, again)
    plan = next(r.plan for r in final if r.name == chosen)
    return OptimizeResult(
        plan=plan, chosen=chosen, verdict=verdict, rows=tuple(final), lower_bound_s=sim.lower_bound(),
        trace=tuple(result.trace), evals=result.evals, evals_per_s=result.evals_per_s,
        strategy=result.strategy, search_s=result.elapsed_s,
        chrome_trace=sim.run(plan).to_chrome_trace(), baseline_trace=sim.run(base_plans["xla_default"]).to_chrome_trace(),
        cost_model=getattr(costs, "name", type(costs).__name__), cluster=cluster.name,
        graph={"name": graph.name, "fingerprint": graph.fingerprint, "nodes": len(graph.nodes),
               "all_reduces": len(graph.all_reduces())},
        rounds=rounds, steps=steps, comm_free_bound_s=bound, confirmation=confirmation, runoff=runoff,
        confirmed_speedup=confirmed_speedup, comm_free_bound_speedup=bound_speedup)

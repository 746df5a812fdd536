"""``optimize`` across processes: search priced on a calibrated cluster, candidates measured on it.

The in-process :func:`disco.optimizer.optimize` measures on this process's virtual devices;
here every measurement runs on ``P`` worker processes (:func:`disco.multiprocess.launch`),
behind an emulated link when one is given (:mod:`disco.testbed`):

1. Extract the step's graph in this process (``P * D`` virtual devices: the same program the
   workers compile; the workers' graph fingerprints are checked against it).
2. Search plans against the simulator on ``cluster`` (e.g. :func:`disco.mp_calibrate.cluster_spec`
   of a calibration on the same link) with its compute scaled to the step's measured compute
   floor (:func:`disco.mp_calibrate.with_compute_floor`; the floor is measured in a launch of its
   own unless given): the analytic costs price a CPU step's compute several times too low.
3. Measure, in one launch of interleaved rounds, xla_default, per_tensor, horovod, ddp, the
   best baseline by estimate, the ``even_<k>`` sweep, ``reduce_fusion`` (each reduce fused with
   its elementwise producers on the best baseline's buckets, as the in-process optimize measures
   on CPU: :func:`disco.optimizer.reduce_fusion_row`) and the ``measure_top_k`` best searched
   plans (written as plan files the workers read). A round's time is the slowest worker's;
   plans are compared by the paired speedup over xla_default
   (:func:`xla_hooks.measure.paired_speedup`).
4. Confirm the fastest in a fresh launch (fresh processes, ``confirm_rounds`` interleaved
   rounds) against xla_default *and* the best baseline of the measuring launch (the baseline
   or even_k plan with the highest paired speedup there): the answer's paired speedups over
   both (:func:`confirmed_answer`). The best baseline is the answer when it was faster there;
   xla_default when neither beats xla_default there. (No run-off
   between finalists, unlike the in-process optimize: every extra launch recompiles every plan.
   One run-off only, before the confirmation, when the fastest fusing plan and the fastest
   baseline have different buckets: the first choice against the fusing plan's fusion decisions on
   that baseline's buckets, :func:`disco.optimizer.regrouped_plan`, in a launch of their own.)
   Picking the fastest of a dozen noisy measurements favours a lucky one, so only the
   confirmation's ratio over the best baseline is evidence of a gain over the baselines.
   The result also says how the answer relates to the baselines
   (:func:`relation_to_baselines`): a baseline itself, a baseline's bucketing plus fusion
   groups or options, or a bucketing of its own.
5. Optionally (:func:`validate`, not part of :func:`optimize`), measure the decided answer against
   the best baseline once more in a launch of its own: the confirmation picks the faster of the
   two, so only a later launch's ratio is an unbiased estimate of the answer's gain.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from disco import mp_calibrate, multiprocess
from disco.optimizer import (
    REPORTED_BASELINES,
    OptimizeConfig,
    confirmed_winner,
    fastest_baseline,
    reduce_fusion_row,
    regrouped_plan,
    runoff_choice,
)
from disco.plans.plan import FusionPlan, decisions

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.sim.costs import CostModel
    from disco.testbed import LinkSpec

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class CrossOptimizeResult:
    """What :func:`optimize` found and measured across processes.

    Attributes:
      chosen: the answer's row name (xla_default when nothing beat it in both launches).
      plan_json: the answer as plan JSON.
      verdict: one sentence.
      rows: per measured plan: name, kind (baseline/search), predicted_ms, measured median/min/max
        ms (slowest worker per round), paired speedup over xla_default (``paired_speedup``, also
        as ``speedup_vs_xla_default``, the key every ``--json`` uses), applied.
      confirmed_speedup: the chosen plan's paired speedup over xla_default in the confirmation
        launch (None: none ran).
      confirmation: that launch's rows.
      best_baseline: the baseline (or even_k plan) with the highest paired speedup in the measuring
        launch; xla_default when none beat it.
      confirmed_vs_best_baseline: the chosen plan's paired speedup over ``best_baseline`` in the
        confirmation launch (1.0 when the answer is that baseline; None: no confirmation ran).
      confirmed_vs_best_baseline_interval: its 90% bootstrap interval (:func:`over_best_interval`);
        None when the answer is that baseline or xla_default, or no confirmation ran.
      relation: how the answer relates to the baselines, one phrase (:func:`relation_to_baselines`).
      link: the link info (:meth:`disco.multiprocess.LaunchResult.link_info`) of the measuring launch.
      search: strategy, evaluations, seconds.
      cluster: the simulator's cluster name.
      compute_floor: the measured compute floor the search's spec was scaled to ({"median_ms", ...}
        of :func:`disco.mp_calibrate.measure_compute_floor`, or {"median_ms"} when given), and the
        simulator's compute of the step before scaling ("predicted_ms"); None: not scaled.
      compute_speed: the ``compute_speed`` of the spec the search priced plans on.
      runoff: the run-off launch's rows (xla_default, the first choice and the regrouped plan),
        or None when none ran.
      fingerprints_match: whether every worker compiled the graph the search saw.
    """

    chosen: str
    plan_json: str
    verdict: str
    rows: tuple[dict[str, Any], ...]
    confirmed_speedup: float | None
    confirmation: tuple[dict[str, Any], ...] | None
    link: dict[str, Any]
    search: dict[str, Any]
    cluster: str
    fingerprints_match: bool
    best_baseline: str = "xla_default"
    confirmed_vs_best_baseline: float | None = None
    confirmed_vs_best_baseline_interval: tuple[float, float] | None = None
    relation: str = ""
    compute_floor: dict[str, Any] | None = None
    compute_speed: float | None = None
    runoff: tuple[dict[str, Any], ...] | None = None

    @property
    def speedup(self) -> float:
        """The answer's speedup over xla_default: the confirmed one; 1.0 for xla_default."""
        if self.chosen == "xla_default":
            return 1.0
        return self.confirmed_speedup if self.confirmed_speedup is not None else self.row(self.chosen)["paired_speedup"]

    def __repr__(self) -> str:
        odd = "" if self.fingerprints_match else ", the workers' graphs differ"
        return (f"CrossOptimizeResult(chosen={self.chosen[:60]!r}, speedup={self.speedup:.3f}, {len(self.rows)} rows, "
                f"cluster {self.cluster[:40]!r}{odd}; .verdict for why)")

    def row(self, name: str) -> dict[str, Any]:
        for r in self.rows:
            if r["plan"] == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r['plan'] for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["speedup"] = d["speedup_vs_xla_default"] = self.speedup
        return d


def optimize(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None, *,
             cluster: ClusterSpec, costs: CostModel | None = None, budget_s: float = 30, strategy: str = "best_first",
             max_evals: int | None = None, measure_top_k: int = 3, seed: int = 0, rounds: int = 7, steps: int = 3,
             bucket_sweep: Sequence[int] = (2, 3, 4), confirm: bool = True, confirm_rounds: int | None = None,
             optimizer: str = "adamw", style: str = "shard_map", timeout_s: float = 1800, scale_compute: bool = True,
             compute_floor_ms: float | None = None, measure_reduce_fusion: bool = True,
             measure_regrouped: bool = True, progress: Progress | None = None) -> CrossOptimizeResult:
    """Searches plans for a zoo model priced on ``cluster`` and measures them across processes.

    This process's jax must have at least ``processes * devices_per_process`` devices.

    Args:
      scale_compute: price the search on ``cluster`` with its compute scaled to the step's compute
        floor (:func:`disco.mp_calibrate.with_compute_floor`); False: ``cluster`` as given.
      compute_floor_ms: that floor, when measured already; None: measured here, in a launch of
        its own before the search (``rounds`` rounds).
      measure_reduce_fusion: also measure the ``reduce_fusion`` row (module doc, step 3).
      measure_regrouped: with ``confirm``, also measure the regrouped plan in a run-off (module
        doc, step 4).
      max_evals: also stop the search after this many plan evaluations (a seed then always
        searches the same plans); None: ``budget_s`` only.

    The options it shares with the in-process optimizer mean what :class:`disco.optimizer.OptimizeConfig`
    says, and are validated there.

    Raises:
      ValueError: bad budgets, counts or names (:class:`disco.optimizer.OptimizeConfig`'s messages).
      RuntimeError: when the workers fail (their messages).
      PermissionError: a link where network namespaces are not permitted.
    """
    import trax_models

    from disco import planner, search
    from disco.ir import extractor
    from disco.ir.graph import HloGraph
    from disco.plans import baselines
    from disco.sim import device_costs
    from disco.sim.simulator import Simulator

    # the in-process optimizer's options where the two share them: one validation, before anything runs
    confirm_rounds = OptimizeConfig(
        budget_s=budget_s, max_evals=max_evals, strategy=strategy, measure_top_k=measure_top_k, seed=seed,
        rounds=rounds, steps=steps, bucket_sweep=tuple(bucket_sweep), confirm=confirm, confirm_rounds=confirm_rounds,
        measure_reduce_fusion=measure_reduce_fusion, measure_regrouped=measure_regrouped).confirmation_rounds
    say = progress or (lambda msg: None)
    n = processes * devices_per_process
    step, example = trax_models.make_train_step(model, preset, devices=n, optimizer=optimizer, style=style)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    costs = costs if costs is not None else device_costs.analytic(cluster.device)
    floor = None
    if scale_compute:
        if compute_floor_ms is None:
            say(f"measuring the compute floor across {processes} processes")
            floor = mp_calibrate.measure_compute_floor(processes, devices_per_process, link, model=model,
                                                       preset=preset, rounds=rounds, steps=steps,
                                                       optimizer=optimizer, style=style, timeout_s=timeout_s)
        else:
            floor = {"median_ms": compute_floor_ms}
        floor["predicted_ms"] = mp_calibrate.predicted_compute_s(graph, cluster, costs) * 1e3
        cluster = mp_calibrate.with_compute_floor(cluster, graph, floor["median_ms"] / 1e3, costs,
                                                  what=f"{model}/{preset}")
    sim = Simulator(graph, costs, cluster)
    say(f"searching ({strategy}, {budget_s:g} s) on cluster {cluster.name}")
    found = search.run(search.make(strategy), graph, sim.step_time, budget_s=budget_s, max_evals=max_evals,
                       seed=seed)

    # -- candidates: (row name, worker plan argument, kind, predicted seconds) ------------------
    base_plans = {name: baselines.make(name, graph) for name in baselines.NAMES if name != "even"}
    predicted = {name: sim.step_time(p) for name, p in base_plans.items()}
    best_base = planner.best_baseline_name(predicted)
    cands: dict[str, tuple[str, str, float]] = {}
    seen: set[str] = set()
    for name in dict.fromkeys((*REPORTED_BASELINES, best_base)):
        cands[name] = (name, "baseline", predicted[name])
        seen.add(base_plans[name].digest())
    for k in dict.fromkeys(bucket_sweep):
        p = baselines.make("even", graph, k=k)
        if p.digest() not in seen:
            seen.add(p.digest())
            cands[p.name] = (f"even:{k}", "baseline", sim.step_time(p))
    tmp = tempfile.mkdtemp(prefix="disco-mpopt-")
    plans_json: dict[str, str] = {}

    def add_plan_file(name: str, p: FusionPlan, kind: str, cost: float) -> None:
        path = os.path.join(tmp, f"{name}.json")
        plans_json[name] = p.replace(name=name).to_json()
        with open(path, "w", encoding="utf-8") as f:
            f.write(plans_json[name])
        cands[name] = (path, kind, cost)

    rf = reduce_fusion_row(graph, base_plans[best_base]) if measure_reduce_fusion else None
    if rf is not None and rf.digest() not in seen:
        seen.add(rf.digest())
        add_plan_file("reduce_fusion", rf, "search", sim.step_time(rf))
    rank = 0
    for cost, p in found.top:
        if rank >= measure_top_k:
            break
        if p.digest() in seen:
            continue
        seen.add(p.digest())
        rank += 1
        add_plan_file(f"disco_{rank}", p, "search", cost)

    def regroup(rows: Sequence[dict[str, Any]]) -> str | None:
        """Adds the measured rows' regrouped plan to the candidates; its row name, or None."""
        plans = {n: FusionPlan.from_json(plans_json[n]) if n in plans_json else _baseline_plan(n, graph)
                 for n in cands}
        gains = {r["plan"]: r["paired_speedup"] for r in rows if r["applied"]}
        p = regrouped_plan(gains, {n: kind for n, (_, kind, _) in cands.items()}, plans, graph)
        if p is None:
            return None
        add_plan_file(p.name, p, "search", sim.step_time(p))
        return p.name

    # -- measure ----------------------------------------------------------------------------
    say(f"measuring {len(cands)} plans across {processes} processes")
    try:
        res = _measure(model, preset, processes, devices_per_process, link, cands, plans_json, graph, found,
                       cluster, rounds, steps, confirm, confirm_rounds, optimizer, style, timeout_s, say,
                       regroup if measure_regrouped else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dataclasses.replace(res, compute_floor=floor, compute_speed=cluster.compute_speed)


def _measure(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None,
             cands: dict[str, tuple[str, str, float]], plans_json: dict[str, str], graph: Any, found: Any,
             cluster: ClusterSpec, rounds: int, steps: int, confirm: bool, confirm_rounds: int, optimizer: str,
             style: str, timeout_s: float, say: Progress,
             regroup: Callable[[Sequence[dict[str, Any]]], str | None] | None = None) -> CrossOptimizeResult:
    """Steps 3 and 4 of the module doc; ``regroup`` adds the regrouped plan to ``cands``."""
    res = _launch(model, preset, processes, devices_per_process, link, [a for a, _, _ in cands.values()],
                  rounds, steps, optimizer, style, timeout_s)
    by_plan = {r["plan"]: r for r in multiprocess.combine(res)}
    rows = [_row(name, kind, pred, by_plan[name]) for name, (_, kind, pred) in cands.items()]
    best_base = best_baseline(rows)
    others = [r for r in rows if r["plan"] != "xla_default" and r["applied"]]
    best = max(others, key=lambda r: r["paired_speedup"], default=None)
    chosen, verdict, confirmed, confirmation, vs_best = "xla_default", "no plan beat xla_default when measured", None, None, None
    interval = None
    runoff = None
    if best is not None and best["paired_speedup"] > 1.0:
        chosen = best["plan"]
        verdict = f"{chosen} measured {best['paired_speedup']:.3f}x faster than xla_default (paired)"
        extra = regroup(rows) if confirm and regroup is not None else None
        if extra is not None:
            chosen, verdict, runoff = _run_off(model, preset, processes, devices_per_process, link, cands, rows,
                                               chosen, extra, verdict, rounds, steps, optimizer, style, timeout_s, say)
        if confirm:
            against = [n for n in dict.fromkeys(("xla_default", best_base)) if n != chosen]
            say(f"confirming {chosen} against {' and '.join(against)} ({confirm_rounds} rounds, fresh processes)")
            again = _launch(model, preset, processes, devices_per_process, link,
                            [cands[n][0] for n in (*against, chosen)], confirm_rounds, steps, optimizer, style, timeout_s)
            confirmation = tuple(multiprocess.combine(again))
            chosen, verdict, confirmed, vs_best, interval = confirmed_answer(confirmation, chosen, best_base,
                                                                             verdict, confirm_rounds)
    plan_json = plans_json.get(chosen) or _baseline_plan(chosen, graph).to_json()
    # the chosen row first: one_bucket and horovod can be the same plan, and the answer is named as chosen
    base_names = sorted((n for n, (_, kind, _) in cands.items() if kind == "baseline"), key=lambda n: n != chosen)
    relation = relation_to_baselines(FusionPlan.from_json(plan_json), {n: _baseline_plan(n, graph) for n in base_names})
    verdict += f"; the answer is {relation}"
    return CrossOptimizeResult(
        chosen=chosen, plan_json=plan_json, verdict=verdict, rows=tuple(rows), confirmed_speedup=confirmed,
        confirmation=confirmation, link=res.link_info(), cluster=cluster.name,
        search={"strategy": found.strategy, "evals": found.evals, "seconds": found.elapsed_s},
        fingerprints_match={r["fingerprint"] for r in res.results} == {graph.fingerprint},
        best_baseline=best_base, confirmed_vs_best_baseline=vs_best, confirmed_vs_best_baseline_interval=interval,
        relation=relation, runoff=runoff)


def _run_off(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None,
             cands: dict[str, tuple[str, str, float]], rows: list[dict[str, Any]], chosen: str, extra: str,
             verdict: str, rounds: int, steps: int, optimizer: str, style: str, timeout_s: float, say: Progress
             ) -> tuple[str, str, tuple[dict[str, Any], ...]]:
    """The choice against the regrouped plan ``extra`` (and xla_default) in a launch of their own:
    (the faster, the verdict, that launch's rows). ``extra``'s row, with its times there, is
    appended to ``rows``; a fallback is not chosen."""
    from xla_hooks.measure import Measurement

    say(f"run-off: {chosen} against {extra} ({rounds} rounds, fresh processes)")
    launched = _launch(model, preset, processes, devices_per_process, link,
                       [cands[n][0] for n in ("xla_default", chosen, extra)], rounds, steps, optimizer, style, timeout_s)
    again = {r["plan"]: r for r in multiprocess.combine(launched)}
    rows.append({**_row(extra, "search", cands[extra][2], again[extra]), "measured_in": "run-off"})
    times = {n: Measurement(tuple(again[n]["samples_ms"])) for n in ("xla_default", chosen, extra)
             if again[n]["applied"] or n == "xla_default"}
    chosen, verdict = runoff_choice(chosen, verdict, times)
    return chosen, verdict, tuple(again.values())


def _row(name: str, kind: str, predicted_s: float, measured: dict[str, Any]) -> dict[str, Any]:
    """A result row: plan ``name`` of ``kind``, predicted and as ``measured`` (a launch's combined row)."""
    return {"plan": name, "kind": kind, "predicted_ms": predicted_s * 1e3, "median_ms": measured["median_ms"],
            "min_ms": measured["min_ms"], "max_ms": measured["max_ms"], "paired_speedup": measured["paired_speedup"],
            "speedup_vs_xla_default": measured["paired_speedup"],  # the key of every --json (paired here)
            "applied": measured["applied"], "all_reduces": measured["all_reduces"]}


def best_baseline(rows: Sequence[dict[str, Any]]) -> str:
    """:func:`disco.optimizer.fastest_baseline` of a launch's result rows (even_k included);
    xla_default when no baseline is above 1.0."""
    gains = {r["plan"]: r["paired_speedup"] for r in rows if r["applied"]}
    return fastest_baseline(gains, {r["plan"]: r["kind"] for r in rows}) or "xla_default"


def over_best_interval(rows: Sequence[dict[str, Any]], chosen: str, best_base: str) -> tuple[float, float] | None:
    """The 90% bootstrap interval (:func:`xla_hooks.measure.paired_interval`) of ``chosen``'s
    paired speedup over ``best_base`` in one launch's rows (:func:`disco.multiprocess.combine`);
    None when the two are the same plan or ``chosen`` is xla_default (``best_base`` is
    xla_default when no baseline beat it).

    Raises:
      KeyError: a plan missing from the rows.
    """
    from xla_hooks.measure import Measurement, paired_interval

    if chosen in (best_base, "xla_default"):
        return None
    by_plan = {r["plan"]: r for r in rows}
    for name in (chosen, best_base):
        if name not in by_plan:
            raise KeyError(f"no row {name!r} in the launch; rows: {', '.join(by_plan)}")
    return paired_interval(Measurement(tuple(by_plan[best_base]["samples_ms"])),
                           Measurement(tuple(by_plan[chosen]["samples_ms"])))


def confirmed_ratios(confirmation: Sequence[dict[str, Any]], chosen: str, best_base: str
                     ) -> tuple[float, float, float]:
    """From one interleaved launch's rows (:func:`disco.multiprocess.combine`), by their per-round
    times and unrounded (the rule compares them with 1.0 as the in-process optimizer does):
    ``chosen``'s paired speedup over xla_default, over ``best_base`` (1.0 when they are the same
    plan), and ``best_base``'s over xla_default.

    Raises:
      KeyError: a plan missing from the rows.
    """
    from xla_hooks.measure import Measurement, paired_speedup

    rows = {r["plan"]: r for r in confirmation}
    for name in {"xla_default", chosen, best_base}:
        if name not in rows:
            raise KeyError(f"no row {name!r} in the confirmation; rows: {', '.join(rows)}")
    times = {name: Measurement(tuple(rows[name]["samples_ms"])) for name in {"xla_default", chosen, best_base}}
    over_default = paired_speedup(times["xla_default"], times[chosen])
    base_gain = paired_speedup(times["xla_default"], times[best_base])
    over_best = 1.0 if best_base == chosen else paired_speedup(times[best_base], times[chosen])
    return over_default, over_best, base_gain


class ConfirmedAnswer(NamedTuple):
    """What :func:`confirmed_answer` decided: the answer, the verdict, the answer's paired speedup
    over xla_default in the confirmation launch, over the best baseline there (None for
    xla_default), and the latter's 90% bootstrap interval (:func:`over_best_interval`; None when
    the answer is the best baseline or xla_default)."""

    answer: str
    verdict: str
    gain: float
    vs_best: float | None
    interval: tuple[float, float] | None = None


def confirmed_answer(confirmation: Sequence[dict[str, Any]], chosen: str, best_base: str, verdict: str,
                     rounds: int) -> ConfirmedAnswer:
    """The answer after the confirmation launch's rows (:class:`ConfirmedAnswer`).

    The rule is the in-process optimize's (:func:`disco.optimizer.confirmed_winner`).
    """
    confirmed, vs_best, base_gain = confirmed_ratios(confirmation, chosen, best_base)
    winner = confirmed_winner(chosen, confirmed, best_base, base_gain, vs_best)
    if winner not in (chosen, "xla_default"):
        why = (f"{chosen} measured fastest, but in the confirmation in fresh processes ({rounds} rounds) the best "
               f"baseline {best_base} was faster ({base_gain:.3f}x over xla_default against {confirmed:.3f}x; "
               f"{chosen} {vs_best:.3f}x of it); keeping {best_base}")
        return ConfirmedAnswer(best_base, why, base_gain, 1.0)
    if winner != "xla_default":
        interval = over_best_interval(confirmation, chosen, best_base)
        versus = ("and it is the best baseline" if interval is None else
                  f"{vs_best:.3f}x over the best baseline {best_base} (90% interval {interval[0]:.3f}-{interval[1]:.3f})")
        why = f"{verdict}; confirmed in fresh processes ({rounds} rounds): {confirmed:.3f}x over xla_default, {versus}"
        return ConfirmedAnswer(chosen, why, confirmed, vs_best, interval)
    why = f"{chosen} measured fastest but not in the confirmation ({confirmed:.3f}x); keeping XLA's default compile"
    return ConfirmedAnswer("xla_default", why, confirmed, None)


def validate(res: CrossOptimizeResult, model: str, preset: str, processes: int, devices_per_process: int,
             link: LinkSpec | None, *, rounds: int = 21, steps: int = 3, optimizer: str = "adamw",
             style: str = "shard_map", timeout_s: float = 1800) -> dict[str, Any]:
    """Measures a decided answer once more, in a launch of its own after the decision: xla_default,
    ``res.best_baseline`` and ``res.chosen`` in ``rounds`` interleaved rounds in fresh processes.

    The confirmation launch decides the answer (the faster of the choice and the best baseline
    there), so its ratio over the best baseline is never below 1.0 by construction; this launch's
    ratio is the unbiased estimate of what the answer gains. Returns {"rounds", "vs_default" (the
    answer's paired speedup over xla_default; 1.0 when it is xla_default), "vs_best_baseline"
    (over the best baseline; 1.0 when it is that baseline), "vs_best_baseline_interval" (its 90%
    bootstrap interval, :func:`over_best_interval`), "rows" (the launch's rows)}.

    Raises:
      ValueError: ``rounds`` or ``steps`` below 1.
      RuntimeError: when the workers fail (their messages).
    """
    from disco.plans import baselines

    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps >= 1 expected, got {rounds}, {steps}")
    tmp = tempfile.mkdtemp(prefix="disco-mpval-")
    try:
        args = {"xla_default": "xla_default"}
        if res.best_baseline not in args:
            args[res.best_baseline] = baselines.item_of_row(res.best_baseline)
        if res.chosen not in args:  # plan_json is named as the row (optimize names it so)
            path = os.path.join(tmp, "answer.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(res.plan_json)
            args[res.chosen] = path
        launched = _launch(model, preset, processes, devices_per_process, link, list(args.values()), rounds, steps,
                           optimizer, style, timeout_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = multiprocess.combine(launched)
    vs_default, vs_best, _ = confirmed_ratios(rows, res.chosen, res.best_baseline)
    interval = over_best_interval(rows, res.chosen, res.best_baseline)
    return {"rounds": rounds, "vs_default": vs_default, "vs_best_baseline": vs_best,
            "vs_best_baseline_interval": None if interval is None else list(interval), "rows": rows}


def relation_to_baselines(plan: FusionPlan, baselines: dict[str, FusionPlan]) -> str:
    """How ``plan`` relates to ``baselines`` (name -> plan), one phrase: "the baseline B" (the
    same plan), "B's bucketing plus <what>" (the same buckets plus fusion groups, cuts, options),
    or "its own bucketing (<n> buckets)"."""
    for name, base in baselines.items():
        if plan.digest() == base.digest():
            return f"the baseline {name}"
    for name, base in baselines.items():
        if plan.buckets == base.buckets:
            return f"{name}'s bucketing plus " + (" and ".join(decisions(plan, relative_to=base)) or "nothing")
    n = "XLA's" if plan.buckets is None else f"{len(plan.buckets)} buckets"
    return f"its own bucketing ({n})"


def _baseline_plan(name: str, graph: Any) -> FusionPlan:
    """The baseline (or ``even_<k>``) plan of row ``name``, named so."""
    from disco.plans import baselines

    return baselines.parse_item(baselines.item_of_row(name)).make(graph).replace(name=name)


def _launch(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None,
            plans: list[str], rounds: int, steps: int, optimizer: str, style: str, timeout_s: float) -> multiprocess.LaunchResult:
    spec = multiprocess.WorkerSpec(model=model, preset=preset, plans=tuple(plans), rounds=rounds, steps=steps,
                                   optimizer=optimizer, style=style)
    res = multiprocess.launch(processes, devices_per_process, spec, link=link, timeout_s=timeout_s)
    res.raise_if_failed("measuring across processes")
    return res

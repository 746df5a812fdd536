"""What ``optimize`` returns: the answer, the rows, and the small results of its steps."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from disco.optimizer._accuracy import Accuracy, accuracy
from disco.optimizer._answer import answer, answer_lines
from disco.optimizer._choice import PlanRow, Span, best_baseline, relation_to_baselines
from disco.optimizer._config import OptimizeConfig
from disco.optimizer._runners import InProcessRunner
from disco.optimizer._candidates import Candidates, SearchSummary
from disco.optimizer._confirm import Confirmation
from disco.optimizer._measure import Bound, Measured
from disco.optimizer._prepare import Target
from disco.optimizer._runoff import RunOff
from disco.plans.plan import FusionPlan
from disco.sim.simulator import Simulator
from xla_hooks.measure import paired_interval, paired_speedup


class Setting(NamedTuple):
    """Where the plans were predicted: the step's graph, the cluster and cost model, and the
    simulated lower bound of the step time.

    Attributes:
      graph: the graph's name, fingerprint, nodes and all-reduces.
      cluster: the cluster's name.
      cost_model: the cost model's name.
      lower_bound_s: the simulated lower bound.
      device_memory_bytes: the cluster's device memory (None: unknown).
    """

    graph: dict[str, Any]
    cluster: str
    cost_model: str
    lower_bound_s: float
    device_memory_bytes: int | None = None

    def __repr__(self) -> str:
        g = self.graph
        return (f"Setting(graph {str(g.get('name', '?'))[:60]!r}, {g.get('nodes', '?')} nodes, "
                f"{g.get('all_reduces', '?')} all-reduces; cluster {self.cluster[:40]!r}, {self.cost_model[:20]} "
                f"costs, lower bound {self.lower_bound_s * 1e3:.3f} ms)")


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` found and measured.

    ``print(result.summary())`` for a readable report; ``chrome_trace(result)`` draws the chosen
    plan's simulated timeline on request.

    Attributes:
      plan: the answer: the fastest measured plan, or xla_default when nothing beat it.
      chosen: the answer's row name.
      verdict: one sentence saying what was chosen and why.
      rows: every measured plan (baselines and searched), with predicted and measured times; a
        plan measured in the run-off only (the regrouped plan) has its times there.
      setting: the graph, cluster, cost model and simulated lower bound.
      search: what the simulated search did.
      config: the options it ran with.
      bound: the measured communication-free bound, or None when not measured.
      runoff: the run-off, or None when there was none.
      confirmation: the confirmation run, or None when there was none (xla_default chosen
        before it, or confirm off).
      simulator: the simulator the plans were priced with (for :func:`chrome_trace`; not
        compared, not printed).
      runner: what measured the plans (:meth:`Runner.describe`: ``runner``, and for worker
        processes ``processes`` and ``devices_per_process``) and what it said about the runs: the
        first run's link and whether the workers compiled the graph the search saw
        (``fingerprints_match``), the compute floor the cluster was scaled to (``compute_floor``,
        ``compute_speed``).
      learning: what the funnel learned (``optimize``; empty for a result built otherwise): the
        kept-corrections ``file`` and this ``machine``'s key in it, ``kept_points_used`` (the
        points of a kept correction the first round started from; 0: it started from the
        simulator), ``points`` and ``weights`` at the end, whether they were ``kept``, the
        funnel's ``rounds`` and its ``compiled_stage`` (compiles, failures, the compiled tier's
        correction; None when the stage did not run).
    """

    plan: FusionPlan
    chosen: str
    verdict: str
    rows: tuple[PlanRow, ...]
    setting: Setting
    search: SearchSummary
    config: OptimizeConfig
    bound: Bound | None = None
    runoff: RunOff | None = None
    confirmation: Confirmation | None = None
    simulator: Simulator | None = dataclasses.field(default=None, repr=False, compare=False)
    runner: dict[str, Any] = dataclasses.field(default_factory=dict)
    learning: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def best_baseline(self) -> str:
        """The baseline (``even_<k>`` included) with the largest paired speedup over xla_default in
        the first run (:func:`~disco.optimizer.fastest_baseline`); xla_default when none beat it."""
        return best_baseline(self.rows) or "xla_default"

    @property
    def accuracy(self) -> Accuracy:
        """The predictions against the measurements over the measured plans (Kendall tau, median
        error; :func:`~disco.optimizer._accuracy.accuracy`), each prediction made before its plan
        was measured."""
        return accuracy(self.rows, self.config.measure_top_k)

    @property
    def relation(self) -> str:
        """How the answer relates to the baselines measured, one phrase
        (:func:`~disco.optimizer.relation_to_baselines`): a baseline itself, a baseline's
        bucketing plus fusion groups or options, or a bucketing of its own."""
        # the chosen row first: one_bucket and horovod can be the same plan, and the answer is named as chosen
        bases = sorted((r for r in self.rows if r.kind == "baseline"), key=lambda r: r.name != self.chosen)
        return relation_to_baselines(self.plan, {r.name: r.plan for r in bases})

    @property
    def speedup(self) -> float:
        """The answer's measured speedup over xla_default: from the confirmation run when there was
        one; 1.0 when the answer is xla_default."""
        if self.chosen == "xla_default":
            return 1.0
        if self.confirmation is not None:
            return self.confirmed_speedup
        return self.row(self.chosen).gain(self.row("xla_default"))

    @property
    def confirmed_speedup(self) -> float | None:
        """The paired speedup over xla_default, in the confirmation, of the plan it kept (of the
        candidate when it kept xla_default); None without a confirmation."""
        c = self.confirmation
        if c is None:
            return None
        return c.baseline_speedup if self.chosen == c.baseline and c.baseline_speedup is not None else c.speedup

    @property
    def confirmed_interval(self) -> tuple[float, float] | None:
        """The 90% bootstrap interval (:func:`xla_hooks.measure.paired_interval`) of the answer's
        paired speedup over xla_default in the confirmation run; None without one, for xla_default,
        or when the runner kept no per-round times there."""
        c = self.confirmation
        if c is None or self.chosen == "xla_default" or c.trials is None:
            return None
        by = c.trials.by_name
        if self.chosen not in by or "xla_default" not in by:
            return None
        return paired_interval(by["xla_default"].times, by[self.chosen].times)

    @property
    def confirmed_vs_best_baseline(self) -> float | None:
        """The answer's paired speedup, in the confirmation, over the first run's best baseline
        measured there: 1.0 when the answer is that baseline; None without a confirmation, when no
        baseline beat xla_default in the first run, or when the answer is xla_default."""
        c = self.confirmation
        if c is None or self.chosen == "xla_default":
            return None
        if c.baseline is None:  # the candidate was the first run's best baseline, or there was none
            return 1.0 if self.chosen == best_baseline(self.rows) else None
        return 1.0 if self.chosen == c.baseline else c.vs_baseline

    @property
    def confirmed_vs_best_baseline_interval(self) -> tuple[float, float] | None:
        """The 90% bootstrap interval of :attr:`confirmed_vs_best_baseline` when the answer is the
        confirmed candidate (an interval that holds 1.0: not told apart from the baseline in that
        run); None otherwise."""
        c = self.confirmation
        if c is None or self.chosen != c.candidate or c.vs_baseline_interval is None:
            return None
        return c.vs_baseline_interval

    def headroom_closed(self, name: str | None = None) -> float | None:
        """The share of the headroom from xla_default to the measured communication-free bound
        that a plan closed: ``(1 - 1/s) / (1 - 1/b)``, with ``b`` the bound's paired speedup over
        xla_default in the first run and ``s`` the plan's: by default (and for the answer's own name)
        the answer's (confirmed when confirmed), else ``name``'s in the confirmation when it measured
        that plan beside the answer (the best baseline), so the two compare in one run, and in the
        first run otherwise.
        0 for xla_default, 1 at the bound, above 1 for a plan that also gains from compute. None
        without the bound, or when it measured no faster than xla_default.

        Raises:
          KeyError: for a ``name`` that is not a row.
        """
        if self.bound is None or self.bound.speedup <= 1.0:
            return None
        c = self.confirmation
        if name is None or name == self.chosen:  # the answer's one figure, also when it is the best baseline
            s = self.speedup
        elif c is not None and name == c.baseline and c.baseline_speedup is not None:
            s = c.baseline_speedup
        else:
            s = self.row(name).gain(self.row("xla_default"))
        return (1.0 - 1.0 / s) / (1.0 - 1.0 / self.bound.speedup)

    @property
    def memory_limit(self) -> int | None:
        """The memory limit the plans were held to, bytes per device: the lesser of the config's
        ``memory_limit`` and the cluster's ``device_memory_bytes`` (None: neither known)."""
        return self.config.limit_for(self.setting.device_memory_bytes)

    def row(self, name: str) -> PlanRow:
        """The row called ``name``, else the row found as ``name`` in the search's order
        (:attr:`PlanRow.found_as`: ``disco_1``, ``disco_1_buckets``, ``disco_1_on_ddp``).

        Raises:
          KeyError: naming the rows there are.
        """
        for r in self.rows:
            if r.name == name:
                return r
        for r in self.rows:
            if r.found_as == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r.name for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``disco optimize --json``)."""
        def spans_ms(spans: dict[str, Span] | None) -> dict[str, dict[str, float]] | None:
            return None if spans is None else {k: Span(*v).to_ms_dict() for k, v in spans.items()}

        s = self.search
        return {
            "chosen": self.chosen, "verdict": self.verdict, "plan": self.plan.to_dict(),
            "rows": [r.to_dict() for r in self.rows], "lower_bound_ms": self.setting.lower_bound_s * 1e3,
            "search": {"strategy": s.strategy, "evals": s.evals, "evals_per_s": s.evals_per_s,
                       "seconds": s.seconds, "trace": [list(t) for t in s.trace]},
            "cost_model": self.setting.cost_model, "cluster": self.setting.cluster,
            "graph": dict(self.setting.graph),
            "measurement": {"rounds": self.config.rounds, "steps_per_round": self.config.steps},
            "memory_limit_bytes": self.memory_limit,
            "peak_memory": "per device, measured: XLA's memory analysis of each plan's compiled step",
            "accuracy": self.accuracy.to_dict(), "learning": dict(self.learning),
            "speedup_vs_xla_default": self.speedup,  # the answer's (confirmed when confirmed)
            "confirmed_speedup": self.confirmed_speedup,
            "confirmed_speedup_interval": (None if self.confirmed_interval is None
                                           else list(self.confirmed_interval)),
            "answer": answer(self).to_dict(),
            "confirmation_baseline": None if self.confirmation is None else self.confirmation.baseline,
            "confirmed_baseline_speedup": None if self.confirmation is None else self.confirmation.baseline_speedup,
            "confirmed_vs_best_baseline": self.confirmed_vs_best_baseline,
            "confirmed_vs_best_baseline_interval": (None if self.confirmed_vs_best_baseline_interval is None
                                                    else list(self.confirmed_vs_best_baseline_interval)),
            "confirmation_ms": spans_ms(None if self.confirmation is None else self.confirmation.times),
            "runoff_ms": spans_ms(None if self.runoff is None else self.runoff.times),
            "comm_free_bound_ms": None if self.bound is None else self.bound.times.to_ms_dict(),
            "comm_free_bound_speedup": None if self.bound is None else self.bound.speedup,
            "headroom_closed": {"answer": self.headroom_closed(),
                                "best_baseline": self.headroom_closed(self.best_baseline)},
            # the keys the optimizer across processes wrote (scripts/tools/zoo_links.py reads them)
            "plan_json": self.plan.replace(name=self.chosen).to_json(), "speedup": self.speedup,
            "best_baseline": self.best_baseline, "relation": self.relation,
            "confirmation": _records(self.confirmation), "runoff": _records(self.runoff),
            **self.runner,
        }

    def ordered_rows(self) -> list[PlanRow]:
        """The rows in the order the answer was found: the run-off's finalists first, by their
        speedup there (so the answer, chosen there, comes first); then the first run's rows by
        their paired speedup; unmeasured rows last."""
        base = self.row("xla_default")
        again = self.runoff.speedups if self.runoff is not None else {}

        def key(r: PlanRow) -> tuple[bool, bool, float]:
            first = -r.gain(base) if r.median_s is not None else 0.0
            return (r.median_s is None, r.name not in again, -again[r.name] if r.name in again else first)

        return sorted(self.rows, key=key)

    def how_chosen(self) -> str:
        """How the answer (the row marked ``*``) was chosen, in a few words."""
        if self.chosen == "xla_default":
            if self.confirmation is not None:
                return (f"xla_default, because {self.confirmation.candidate}'s gain did not hold in the "
                        "confirmation run")
            return "xla_default, because no plan measured faster than it"
        c = self.confirmation
        if c is not None and c.chosen != c.candidate:
            return (f"{self.chosen}: the best baseline, faster than {c.candidate} (the fastest before) and than "
                    "xla_default in the confirmation's fresh rounds")
        found = "the fastest in the run-off" if self.runoff is not None else "the fastest in the first run"
        against = (f"xla_default and the best baseline ({c.baseline})" if c is not None and c.baseline
                   else "xla_default")
        held = f", confirmed against {against} in fresh rounds" if c is not None else ""
        return f"{self.chosen}: {found}{held}"

    def learning_note(self) -> str | None:
        """One line on the funnel and the machine's correction, or None for a result without them."""
        info = self.learning
        if not info:
            return None
        rounds = info.get("rounds") or []
        per = "; ".join(f"round {r['round']}: {len(r['measured'])} measured, tau "
                        f"{'-' if r['kendall_tau'] is None else format(r['kendall_tau'], '.2f')}" for r in rounds)
        if not info.get("learn"):
            return f"funnel: {per}; no correction learned (learn off)"
        used = info.get("kept_points_used") or 0
        start = (f"started from a kept correction of {used} points" if used else
                 "started from the simulator (no kept correction)")
        where = (f"kept in {info['file']}" if info.get("kept") else
                 f"not kept ({info['not_kept']})" if info.get("not_kept") else "not kept (no file)")
        stage = info.get("compiled_stage")
        compiled = (f"; compiled stage: {stage['compiles']} plans compiled, {len(stage['failed'])} did not compile"
                    if stage else "")
        floor = (self.runner or {}).get("compute_floor") or {}
        scale = (f"; the simulator's compute scaled to the floor kept with it ({floor['median_ms']:.3f} ms), "
                 "not measured again" if floor.get("kept") else
                 f"; the simulator's compute scaled to the step's compute floor measured for this run "
                 f"({floor['median_ms']:.3f} ms; the cost model priced {floor['predicted_ms']:.3f} ms)"
                 if floor.get("median_ms") and floor.get("predicted_ms") else "")
        return f"funnel: {per}; correction {start}{scale}, {info.get('points')} points at the end, {where}{compiled}"

    def bound_note(self) -> str | None:
        """What the measured communication-free bound says and what it does not, or None."""
        if self.bound is None:
            return None
        b = self.bound
        text = (f"communication-free bound (not a plan): {b.times.median * 1e3:.3f} ms "
                f"({b.times.min * 1e3:.3f}-{b.times.max * 1e3:.3f}), {b.speedup:.3f}x over xla_default in the "
                "first run: the step with its all-reduces replaced by copies and XLA's default fusion, what "
                "removing communication alone would gain here")
        closed = self.headroom_closed()
        if closed is not None:
            text += "; of the headroom from xla_default to it, the answer"
            if self.best_baseline == self.chosen:
                text += f" (the best baseline) closed {closed * 100:.0f}%"
            else:
                text += (f" closed {closed * 100:.0f}%, the best baseline ({self.best_baseline}) "
                         f"{self.headroom_closed(self.best_baseline) * 100:.0f}%")
        if self.chosen != "xla_default" and self.speedup > b.speedup:
            text += (f"; the answer's {self.speedup:.3f}x exceeds it, so its gain is not from communication "
                     "alone: a plan also changes XLA's compile around the all-reduces (the combiner off, "
                     "concatenations that fuse differently), and its speedup comes from other rounds")
        return text

    def legend(self) -> list[str]:
        """The lines that explain the marks and columns of :meth:`summary` and ``disco optimize``."""
        runoff = "; rows: the run-off's finalists first, then the first run's order" if self.runoff else ""
        return [
            f"* the answer: {self.how_chosen()}{runoff}",
            "speedup vs xla_default: per round, xla_default's time over the plan's, the median over rounds "
            "(paired; higher is faster)",
            "predicted / lower bound: the simulator's step time over its lower bound for this graph (compute "
            "and communication each at their fastest, fully overlapped); 1.00x: no plan can be predicted faster",
        ]

    def summary(self, details: bool = False, plan_file: str | None = None) -> str:
        """The answer in at most 15 lines of 100 columns (:func:`~disco.optimizer._answer.answer_lines`):
        what was chosen, its measured speedups with their 90% intervals, where it came from, how
        well the model ranked; with ``plan_file`` (where the plan was written, e.g.
        ``open(f, "w").write(result.plan.to_json())``) the lines that apply it.

        Args:
          details: the setting, the search, every measured row, the run-off, the confirmation, the
            bound, what the marks mean and the verdict before the answer.
          plan_file: the file the snippet reads the plan from.
        """
        import jax

        g = self.setting.graph
        lines = answer_lines(self, title=f"{str(g.get('name', '?'))[:40]} on cluster {self.setting.cluster[:30]!r}",
                             measured_on=jax.default_backend().upper(), plan_file=plan_file,
                             more="summary(details=True) for every plan and the diagnostics, to_dict() for all",
                             command="disco.optimize")
        if not details:
            return "\n".join(lines)
        return self.details() + "\n" + "\n".join(lines)

    def details(self) -> str:
        """The setting, the search, every measured row, the run-off, the confirmation, the bound,
        what the marks mean, the accuracy figures and the verdict."""
        g, s = self.setting.graph, self.search
        base = self.row("xla_default")
        peaks = any(r.peak_memory_bytes is not None for r in self.rows)
        lines = [
            f"disco.optimize {g.get('name', '?')} (fingerprint {str(g.get('fingerprint', '?'))[:8]}, "
            f"{g.get('nodes', '?')} nodes, {g.get('all_reduces', '?')} all-reduces) on cluster "
            f"{self.setting.cluster!r}, {self.setting.cost_model} cost model",
            f"search: {s.strategy}, {s.evals} plans in {s.seconds:.1f} s; simulated lower bound "
            f"{self.setting.lower_bound_s * 1e3:.3f} ms",
            f"measured {len(self.rows)} plans, {self.config.rounds} rounds x {self.config.steps} steps "
            "(speedup vs xla_default, ms median (min-max)"
            + (", peak: bytes per device by XLA's memory analysis of the compiled step" if peaks else "")
            + (f"; memory limit {self.memory_limit:,} bytes" if self.memory_limit else "") + "):",
        ]
        width = max(len(r.name) for r in self.rows) + 2
        for r in self.ordered_rows():
            name = r.name + (" *" if r.name == self.chosen else "")
            meas = ("-" if r.median_s is None else
                    f"{r.median_s * 1e3:.3f} ({r.min_s * 1e3:.3f}-{r.max_s * 1e3:.3f})")
            gain = f"{r.gain(base):.3f}x" if r.median_s else "-"
            fell = "" if r.applied else f"  fell back: {r.fallback_reason}"
            fell += "" if r.over_memory is None else f"  not chosen: {r.over_memory}"
            peak = "" if r.peak_memory_bytes is None else f"  peak {r.peak_memory_bytes:,}"
            lines.append(f"  {name:<{width}} {gain:>8}  {meas}{peak}  predicted {r.predicted_s * 1e3:.3f} ms "
                         f"({r.predicted_by}){fell}")
        lines.append(self.accuracy.decision_line())
        lines += ["  " + line for line in self.accuracy.detail_lines()]
        note = self.learning_note()
        if note:
            lines.append(note)
        if self.runoff is not None:
            lines.append("run-off: " + ", ".join(f"{n} {v:.3f}x" for n, v in
                                                 sorted(self.runoff.speedups.items(), key=lambda kv: -kv[1])))
        if self.confirmation is not None:
            c = self.confirmation
            vs_base = "" if c.baseline is None else f", the best baseline {c.baseline} {c.baseline_speedup:.3f}x"
            if c.vs_baseline is not None and c.vs_baseline_interval is not None:
                lo, hi = c.vs_baseline_interval
                vs_base += f", {c.candidate} {c.vs_baseline:.3f}x of it (90% interval {lo:.3f}-{hi:.3f})"
            lines.append(f"confirmation: {c.candidate} {c.speedup:.3f}x{vs_base} "
                         f"paired over {self.config.confirmation_rounds} rounds")
        note = self.bound_note()
        if note:
            lines.append(note)
        lines.append(f"chosen: {self.chosen} ({self.speedup:.3f}x)")
        lines.append(self.legend()[0])
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        confirmed = "" if self.confirmation is None else ", confirmed"
        return (f"OptimizeResult(chosen={self.chosen!r}, speedup={self.speedup:.3f}{confirmed}, "
                f"graph={self.setting.graph.get('name')!r}, rows={len(self.rows)}; .summary() for more)")


def _records(step: RunOff | Confirmation | None) -> list[dict[str, Any]] | None:
    """A run-off's or confirmation's rows, one per plan measured there: the runner's own row where it
    has one (worker processes: the launch's combined row), else the plan's times in ms (``samples_ms``
    per round), whether it applied and its paired speedup over xla_default there; None without it."""
    trials = None if step is None else step.trials
    if trials is None:
        return None
    base = trials.by_name["xla_default"].times

    def record(name: str, t: Any) -> dict[str, Any]:
        if t.record is not None:
            return dict(t.record)
        ms = t.span().to_ms_dict()
        return {"plan": name, "median_ms": ms["median"], "min_ms": ms["min"], "max_ms": ms["max"],
                "samples_ms": [v * 1e3 for v in t.times.samples], "applied": t.applied,
                "fallback_reason": t.fallback_reason, "paired_speedup": paired_speedup(base, t.times)}

    return [record(n, t) for n, t in trials.by_name.items()]


def make_result(target: Target, config: OptimizeConfig, cands: Candidates, measured: Measured,
                runoff: RunOff | None, confirmation: Confirmation | None,
                runner: dict[str, Any] | None = None, learning: dict[str, Any] | None = None) -> OptimizeResult:
    """The :class:`OptimizeResult` of the steps' results: the last decision made stands
    (confirmation, else run-off, else the first). ``runner``: what measured them
    (:attr:`OptimizeResult.runner`; default: the steps' default runner, this process's devices)."""
    last = confirmation or runoff or measured
    graph, sim = target.graph, target.simulator
    setting = Setting(
        graph={"name": graph.name, "fingerprint": graph.fingerprint, "nodes": len(graph.nodes),
               "all_reduces": len(graph.all_reduces())},
        cluster=target.cluster.name, cost_model=getattr(target.costs, "name", type(target.costs).__name__),
        lower_bound_s=sim.lower_bound(), device_memory_bytes=target.cluster.device_memory_bytes)
    rows = measured.rows + (runoff.rows if runoff is not None else ())
    plan = next(r.plan for r in rows if r.name == last.chosen).replace(graph_fingerprint=graph.fingerprint)
    return OptimizeResult(plan=plan, chosen=last.chosen, verdict=last.verdict, rows=rows,
                          setting=setting, search=cands.search, config=config, bound=measured.bound,
                          runoff=runoff, confirmation=confirmation, simulator=sim,
                          runner=dict(InProcessRunner().describe() if runner is None else runner),
                          learning=dict(learning or {}))


def chrome_trace(result: OptimizeResult, name: str | None = None) -> dict[str, Any]:
    """The simulated timeline of row ``name`` (default: the chosen plan) in Chrome trace format.

    Made on request from the result's simulator (a result carries no traces).

    Raises:
      ValueError: when the result has no simulator (built by hand, not by ``optimize``).
      KeyError: for a row that is not there.
    """
    if result.simulator is None:
        raise ValueError("chrome_trace: expected a result of optimize(), which carries its simulator; "
                         "got one without (built by hand?)")
    return result.simulator.run(result.row(name or result.chosen).plan).to_chrome_trace()

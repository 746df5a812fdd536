"""The last step of ``optimize``: the choice against xla_default and the best baseline in fresh
rounds; and :func:`validate`, a decided answer measured once more in a run of its own."""

from __future__ import annotations

from typing import Any, NamedTuple

from disco.optimizer._choice import Span, best_baseline, confirmed_choice
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._measure import Measured
from disco.optimizer._prepare import Target
from disco.optimizer._runners import InProcessRunner, Runner, Trials
from disco.optimizer._runoff import RunOff
from xla_hooks.measure import paired_interval, paired_speedup


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
    again = {n: t.times for n, t in trials.by_name.items()}  # seconds, from every runner
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

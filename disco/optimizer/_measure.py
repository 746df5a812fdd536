"""The third step of ``optimize``: every candidate measured in one interleaved run, and the first choice."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from disco.calibrate.correction import Correction
from disco.optimizer._candidates import Candidates
from disco.optimizer._choice import PlanRow, Span, over_memory, verdict
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._prepare import Target
from disco.optimizer._runners import InProcessRunner, Runner, Trial, Trials
from xla_hooks.measure import paired_halves, paired_speedup

if TYPE_CHECKING:
    from disco.optimizer._compiled import Prices


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
      trials: what the runner measured (its own rows, what it says about the run; the funnel's
        first round).
      rounds: the funnel's rounds (:class:`~disco.optimizer._funnel.FunnelRound`); () when measured in one run.
      correction: the machine's correction after the last round's refit, or None.
      prices: the funnel's compiled stage (:class:`~disco.optimizer._compiled.Prices`: the plans
        compiled and priced, by digest), or None when it did not run.
    """

    rows: tuple[PlanRow, ...]
    chosen: str
    verdict: str
    bound: Bound | None = None
    executables: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict, repr=False,
                                                                      compare=False)
    trials: Trials | None = dataclasses.field(default=None, repr=False, compare=False)
    rounds: tuple[Any, ...] = ()
    correction: Correction | None = None
    prices: Prices | None = dataclasses.field(default=None, repr=False, compare=False)

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
    limit = config.limit_for(target.cluster.device_memory_bytes)
    rows = tuple(measured_row(by_name[name], t, base, limit) for name, t in trials.by_name.items())
    chosen, why = verdict(rows)
    return Measured(rows, chosen, why, bound, trials.compiled, trials)


def measured_row(row: PlanRow, trial: Trial, base: Any, limit: int | None = None) -> PlanRow:
    """``row`` with ``trial``'s times and its paired speedup over ``base`` (xla_default's times there),
    over all rounds and over each half of them, and its compiled peak memory; marked
    ``over_memory`` when that is above ``limit`` (bytes per device; None: no limit). xla_default is
    never marked: it is the step as written, what every other choice falls back to."""
    s = trial.span()
    over = None if row.name == "xla_default" else over_memory(trial.peak_memory_bytes, limit)
    return dataclasses.replace(row, median_s=s.median, min_s=s.min, max_s=s.max, applied=trial.applied,
                               fallback_reason=trial.fallback_reason, speedup=paired_speedup(base, trial.times),
                               halves=paired_halves(base, trial.times), all_reduces=trial.all_reduces,
                               base_median_s=base.median, peak_memory_bytes=trial.peak_memory_bytes,
                               over_memory=over)

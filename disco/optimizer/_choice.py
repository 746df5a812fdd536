"""The rows of the report and the pure rules that choose among them.

"Faster" is the paired speedup (:func:`xla_hooks.measure.paired_speedup`): per round,
xla_default's time over the plan's, the median over rounds. A round measures every plan
back to back, so the pairing cancels the drift between rounds that a ratio of medians keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from disco.plans.plan import FusionPlan, decisions
from xla_hooks.measure import Measurement, paired_interval, paired_speedup


class Span(NamedTuple):
    """A measured time in seconds: the median and the range over the rounds."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, m: Measurement) -> Span:
        return cls(m.median, m.min, m.max)

    def to_ms_dict(self) -> dict[str, float]:
        return {"median": self.median * 1e3, "min": self.min * 1e3, "max": self.max * 1e3}


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One plan of the report: predicted (simulated) and measured step times in seconds.

    Attributes:
      name: "xla_default", a baseline's name, or for a searched plan its name by content
        (:func:`disco.plans.naming.content_name`, e.g. ``b3_g2_ynn-noreduce_5f3a9c``: the same
        plan has the same name in every run).
      kind: "baseline" or "search".
      origin: where the row came from, one phrase: "searched from <start plan>" for a searched
        plan, what the candidate is for the others ("each reduce fused with its elementwise
        producers", "disco_1 without its fusion groups", the baseline's name).
      plan: the plan.
      predicted_s: the predicted step time, made before the plan was measured (its own
        measurement never counts in it): the simulator's, or the simulator's through the machine's
        correction fitted from other plans' measurements.
      median_s, min_s, max_s: the measured median and range over the rounds, or None when
        not measured.
      applied: whether the plan was applied (False: it fell back to XLA's default compile).
      fallback_reason: why it fell back, or None.
      speedup: the paired speedup over xla_default in the same rounds; None when not measured.
      halves: the paired speedups over xla_default in the even-numbered and in the odd-numbered
        rounds (:func:`xla_hooks.measure.paired_halves`); None when not measured or below 2 rounds.
      all_reduces: the all-reduces in the compiled step, where the runner counted them.
      measured_in: "run-off" for a plan measured in the run-off only; None otherwise.
      predicted_by: where ``predicted_s`` came from (:data:`disco.optimizer._accuracy.SOURCES`:
        "emulated" for the fast tier priced by the roofline, "gnn", "profiled", "corrected",
        "compiled" for the compiled tier, "compiled-corrected").
      simulated_s: the simulator's own (fast tier's) step time when ``predicted_s`` is corrected or
        compiled; None: the same.
      found_as: the name in the search's order that the row had before plans were named by
        content: ``disco_<n>`` for the n-th searched plan measured, ``disco_<n>_buckets`` for its
        projection, ``<fusing>_on_<baseline>`` for the run-off's regrouped plan; a baseline's own
        name; "" for a row built without it.
      base_median_s: xla_default's measured median in the rounds this plan was measured in (the
        funnel measures each round's plans with xla_default afresh), or None when not measured.
      peak_memory_bytes: the compiled step's peak device memory per device, measured: XLA's memory
        analysis of the executable measured (:func:`disco.sim.memory.peak_memory`); None where the
        runner did not read it.
      over_memory: why the plan is never chosen for memory (its peak above the limit, both numbers),
        or None: it fits, or no limit is known (:func:`over_memory`).
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
    halves: tuple[float, float] | None = None
    all_reduces: int | None = None
    measured_in: str | None = None
    predicted_by: str = "emulated"
    simulated_s: float | None = None
    found_as: str = ""
    base_median_s: float | None = None
    peak_memory_bytes: int | None = None
    over_memory: str | None = None

    @property
    def eligible(self) -> bool:
        """Whether the row may be chosen: measured, applied and within the memory limit."""
        return self.median_s is not None and self.applied and self.over_memory is None

    @property
    def simulator_s(self) -> float:
        """The simulator's own step time (before any correction)."""
        return self.predicted_s if self.simulated_s is None else self.simulated_s

    def gain(self, base: PlanRow) -> float:
        """Speedup over ``base`` (xla_default): the paired one when measured, else the ratio of medians."""
        if self.speedup is not None:
            return self.speedup
        return base.median_s / self.median_s

    def to_dict(self) -> dict[str, Any]:
        ms = (lambda v: None if v is None else v * 1e3)  # noqa: E731
        return {"name": self.name, "kind": self.kind, "origin": self.origin,
                "predicted_ms": ms(self.predicted_s), "predicted_by": self.predicted_by,
                "simulated_ms": ms(self.simulator_s), "measured_median_ms": ms(self.median_s),
                "measured_min_ms": ms(self.min_s), "measured_max_ms": ms(self.max_s),
                "speedup_vs_xla_default": self.speedup,
                "speedup_halves": None if self.halves is None else list(self.halves),
                "applied": self.applied, "fallback_reason": self.fallback_reason,
                "plan_digest": self.plan.digest(), "plan_summary": self.plan.summary(),
                "found_as": self.found_as or self.name,
                "xla_default_median_ms_same_rounds": ms(self.base_median_s),
                # the keys the optimizer across processes wrote (scripts/tools/zoo_links.py reads them)
                "plan": self.name, "median_ms": ms(self.median_s), "min_ms": ms(self.min_s), "max_ms": ms(self.max_s),
                "paired_speedup": self.speedup, "all_reduces": self.all_reduces,
                "peak_memory_bytes": self.peak_memory_bytes, "over_memory": self.over_memory,
                **({"measured_in": self.measured_in} if self.measured_in else {})}

    def __repr__(self) -> str:
        ms = (lambda v: "-" if v is None else f"{v * 1e3:.3f}")  # noqa: E731
        speed = "-" if self.speedup is None else f"{self.speedup:.3f}x"
        fell = "" if self.applied else ", fell back"
        fell += "" if self.over_memory is None else ", over memory"
        return (f"PlanRow({self.name!r}, {self.kind}, predicted {ms(self.predicted_s)} ms, measured "
                f"{ms(self.median_s)} ms, {speed}{fell})")


def over_memory(peak: int | None, limit: int | None) -> str | None:
    """Why a plan of compiled peak memory ``peak`` (bytes per device) is over ``limit`` (bytes), or
    None: it fits, or either number is unknown."""
    if peak is None or limit is None or peak <= limit:
        return None
    return (f"peak device memory {peak:,} bytes (XLA's memory analysis of its compiled step) over the "
            f"limit of {limit:,} bytes")


def verdict(rows: Sequence[PlanRow]) -> tuple[str, str]:
    """(chosen row name, verdict) from the measured rows: the largest paired speedup wins."""
    base = next(r for r in rows if r.name == "xla_default")
    others = [r for r in rows if r.name != "xla_default" and r.eligible]
    fastest = max(others, key=lambda r: r.gain(base), default=None)
    if fastest is None or fastest.gain(base) <= 1.0:
        same = fastest is not None and fastest.base_median_s is not None
        ref = fastest.base_median_s if same else base.median_s
        detail = (f"; the best other plan, {fastest.name}, measured {fastest.gain(base):.3f}x "
                  f"({fastest.median_s * 1e3:.3f} vs {ref * 1e3:.3f} ms median{' in the same rounds' if same else ''})"
                  if fastest else "")
        return "xla_default", (f"no plan beat xla_default when measured{detail}{_over_note(rows)}; keeping "
                               "XLA's default compile")
    overlap = fastest.max_s is not None and base.min_s is not None and fastest.max_s >= base.min_s
    note = (" (in this run the min-max ranges overlap, so this run alone cannot tell the gain from noise)"
            if overlap else "")
    # xla_default's median in the plan's own rounds: a funnel round measures it afresh, and its
    # first-round median beside a later round's plan made a ratio of medians of two runs
    same = fastest.base_median_s is not None
    ref = fastest.base_median_s if same else base.median_s
    return fastest.name, (f"{fastest.name} measured {fastest.gain(base):.3f}x faster than xla_default "
                          f"({fastest.median_s * 1e3:.3f} vs {ref * 1e3:.3f} ms median"
                          f"{' in the same rounds' if same else ''}){note}{_over_note(rows)}")


def _over_note(rows: Sequence[PlanRow]) -> str:
    """The verdict's note on the measured rows left out for memory ("" when none was)."""
    over = [r.name for r in rows if r.over_memory is not None and r.median_s is not None]
    if not over:
        return ""
    return f" ({len(over)} plan{'s' if len(over) > 1 else ''} over the memory limit not chosen: {', '.join(over)})"


def finalists(rows: Sequence[PlanRow], n: int) -> list[str]:
    """The ``n`` applied plans with the largest speedups over xla_default above 1, largest first."""
    base = next(r for r in rows if r.name == "xla_default")
    better = [r for r in rows if r.name != "xla_default" and r.eligible and r.gain(base) > 1.0]
    return [r.name for r in sorted(better, key=lambda r: -r.gain(base))[:n]]


def runoff_choice(chosen: str, verdict: str, again: Mapping[str, Measurement]) -> tuple[str, str]:
    """(chosen, verdict) after the run-off ``again`` (one interleaved run, xla_default included):
    the largest paired speedup over xla_default wins."""
    gains = {n: paired_speedup(again["xla_default"], m) for n, m in again.items() if n != "xla_default"}
    best = max(gains, key=gains.__getitem__)
    line = ", ".join(f"{n} {gains[n]:.3f}x" for n in sorted(gains, key=lambda n: -gains[n]))
    if best == chosen:
        return chosen, f"{verdict}; the best again in a run-off of {len(gains)} ({line})"
    return best, f"{verdict}; but {best} was the best in a run-off of {len(gains)} ({line})"


def fastest_above_one(gains: Mapping[str, float], names: Iterable[str]) -> str | None:
    """Of ``names``, the one with the largest paired speedup over xla_default in ``gains`` when
    that is above 1; None when none is (the first named wins a tie)."""
    above = [n for n in names if gains[n] > 1.0]
    return max(above, key=gains.__getitem__) if above else None


def fastest_baseline(gains: Mapping[str, float], kinds: Mapping[str, str]) -> str | None:
    """The rule for "the best baseline" as measured, the one place both optimizers and the zoo
    scripts take it from: the baseline (kind "baseline", ``even_<k>`` included, xla_default
    aside) with the largest paired speedup over xla_default above 1, or None.

    Args:
      gains: paired speedups over xla_default of the applied, measured rows, by name.
      kinds: each row's kind ("baseline" or "search").
    """
    return fastest_above_one(gains, [n for n in gains if n != "xla_default" and kinds[n] == "baseline"])


def measured_gains(rows: Sequence[PlanRow]) -> dict[str, float]:
    """The paired speedups over xla_default of the applied, measured ``rows`` within the memory
    limit (:attr:`PlanRow.eligible`), by name."""
    base = next(r for r in rows if r.name == "xla_default")
    return {r.name: r.gain(base) for r in rows if r.eligible}


def best_baseline(rows: Sequence[PlanRow]) -> str | None:
    """:func:`fastest_baseline` of measured ``rows``."""
    return fastest_baseline(measured_gains(rows), {r.name: r.kind for r in rows})


def fuses(plan: FusionPlan) -> bool:
    """Whether ``plan`` asks for more than a bucketing: fusion groups, cuts, XLA's fusion off or
    compile options (what :func:`regroup_sources` can move onto another plan's buckets)."""
    return not plan.replace(buckets=None).is_default


def regroup_sources(gains: Mapping[str, float], kinds: Mapping[str, str],
                    plans: Mapping[str, FusionPlan]) -> tuple[str, str] | None:
    """(fusing plan, baseline) whose combination is worth measuring, or None.

    The simulator picks the buckets a searched plan (or ``reduce_fusion``) carries, and the
    measurement can then find another bucketing faster (the ``even_<k>`` sweep, ddp): the fusion
    decisions and the bucketing are each best as measured, so the fusing plan's groups on the
    best measured buckets are worth a measurement of their own. The fusing plan is the one with
    the largest paired speedup above 1 among those that :func:`fuses`; the baseline the one
    (xla_default aside) with the largest above 1. None when either is missing or the fusing plan
    has the baseline's buckets already.

    Args:
      gains: paired speedups over xla_default of the applied, measured rows, by name.
      kinds: each row's kind ("baseline" or "search").
      plans: each row's plan.
    """
    fusing = fastest_above_one(gains, [n for n in gains if n != "xla_default" and fuses(plans[n])])
    base = fastest_baseline(gains, kinds)
    if fusing is None or base is None or plans[fusing].buckets == plans[base].buckets:
        return None
    return fusing, base


def confirmed_winner(chosen: str, gain: float, baseline: str | None = None, baseline_gain: float | None = None,
                     vs_baseline: float | None = None) -> str:
    """The confirmation rule, the one place both optimizers (in-process and across processes)
    take it from. In the confirmation's fresh rounds: ``gain`` and ``baseline_gain`` are the
    ``chosen`` plan's and the first run's best ``baseline``'s paired speedups over xla_default,
    ``vs_baseline`` the chosen plan's paired speedup over the baseline (per round, the baseline's
    time over the chosen's, the median). The faster of the chosen plan and the baseline, by that
    direct pairing, is the answer if it beats xla_default, else ``xla_default``; so the answer is
    never a searched plan that the best baseline beat in the same rounds. (The direct pairing,
    not the two gains: medians of per-round ratios are not transitive, and the two gains can
    order a pair the other way round from their direct comparison.)"""
    if baseline not in (None, chosen, "xla_default"):
        if baseline_gain is None or vs_baseline is None:
            raise ValueError(f"baseline {baseline!r} given without its gain and the chosen plan's ratio over it")
        if vs_baseline < 1.0:
            return baseline if baseline_gain > 1.0 else "xla_default"
    return chosen if gain > 1.0 else "xla_default"


class ConfirmedChoice(NamedTuple):
    """What :func:`confirmed_choice` decided: the answer, the verdict, the candidate's paired
    speedup over xla_default in the confirmation, the best baseline's, the candidate's paired
    speedup over the baseline and its 90% bootstrap interval
    (:func:`xla_hooks.measure.paired_interval`); the last three None without a baseline."""

    answer: str
    verdict: str
    gain: float
    baseline_gain: float | None
    vs_baseline: float | None = None
    vs_baseline_interval: tuple[float, float] | None = None


def confirmed_choice(chosen: str, verdict: str, again: Mapping[str, Measurement],
                     baseline: str | None = None) -> ConfirmedChoice:
    """The answer after the confirmation run ``again`` (one interleaved run of the chosen plan,
    xla_default and, when given, the first run's best ``baseline``), by :func:`confirmed_winner`."""
    gain = paired_speedup(again["xla_default"], again[chosen])
    numbers = (f"{gain:.3f}x paired over {len(again[chosen].samples)} rounds; {again[chosen].median * 1e3:.3f} "
               f"vs {again['xla_default'].median * 1e3:.3f} ms median")
    b_gain = vs = interval = None
    if baseline is not None and baseline != chosen:
        b_gain = paired_speedup(again["xla_default"], again[baseline])
        vs = paired_speedup(again[baseline], again[chosen])
        interval = paired_interval(again[baseline], again[chosen])
        numbers += (f"; the best baseline, {baseline}, {b_gain:.3f}x; {chosen} {vs:.3f}x of it "
                    f"(90% interval {interval[0]:.3f}-{interval[1]:.3f})")
    winner = confirmed_winner(chosen, gain, baseline, b_gain, vs)
    if winner not in (chosen, "xla_default"):
        return ConfirmedChoice(winner, (f"{verdict}; but in a second run the best baseline was faster ({numbers}); "
                                        f"keeping {winner}"), gain, b_gain, vs, interval)
    if winner != "xla_default":
        return ConfirmedChoice(chosen, f"{verdict}; confirmed in a second run: {numbers}", gain, b_gain, vs,
                               interval)
    return ConfirmedChoice("xla_default", (f"{chosen} measured fastest, but the gain did not hold in a second run "
                                           f"({numbers}); keeping XLA's default compile"), gain, b_gain, vs,
                           interval)


def relation_to_baselines(plan: FusionPlan, baselines: Mapping[str, FusionPlan]) -> str:
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

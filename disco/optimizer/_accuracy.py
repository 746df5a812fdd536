"""How well the predictions ranked and priced the plans that were measured.

Over the measured plans (applied: a plan that fell back ran XLA's default compile, not itself), the
Kendall tau between predicted and measured step time (:func:`kendall_tau`: 1 when the predictions
order the plans as the measurements do, -1 when reversed) and the median relative error
(:func:`median_relative_error`). Each row's prediction is the one made *before* that plan was
measured (:attr:`~disco.optimizer.PlanRow.predicted_s`), so a plan's own measurement never counts
in it; :attr:`~disco.optimizer.PlanRow.predicted_by` says where it came from.

TVM's meta-schedule judges its cost models by ranking quality as well as error: a model that is
off by a constant factor still picks the right plan; one that ranks badly does not.

A ranking can only be judged as far as the measurements rank the plans reliably: where plans lie
within the measurement's noise of each other, a perfect prediction scores a low tau too. So the
measurements are also judged against themselves (:attr:`Accuracy.repeat_tau`): the plans' drift-free
times from the even-numbered rounds against those from the odd-numbered rounds of the same run. And
the predictions are judged over the pairs of plans the measurements do tell apart
(:func:`resolved_tau`): the pairs whose measured difference exceeds what the two halves of the
rounds disagree by.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from disco.optimizer._choice import PlanRow

# where a prediction came from: the fast tier's emulated fusion priced by the cost model
# (roofline: "emulated"; the GNN: "gnn"; profiled kernel times: "profiled"), the compiled tier (the
# module XLA built for the plan, the funnel's compiled stage: "compiled"), the fast tier through the
# machine's correction fitted from measurements ("corrected"), or the compiled tier through it
# ("compiled-corrected")
SOURCES = ("emulated", "gnn", "compiled", "profiled", "corrected", "compiled-corrected")
# the sources of the simulator's fast tier alone (no correction, no compile)
_FAST_TIER = ("emulated", "gnn", "profiled")
_BY_COST_MODEL = {"analytic": "emulated", "analytic-summed": "emulated", "gnn": "gnn", "table": "profiled"}


def source_of(cost_model: str) -> str:
    """The :data:`SOURCES` entry of a prediction by the simulator with cost model ``cost_model``
    (its ``name``); an unknown cost model's own name."""
    return _BY_COST_MODEL.get(cost_model, cost_model)


def _check_positive(values: Sequence[float], what: str) -> None:
    bad = [v for v in values if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(f"{what}: expected positive finite step times, got {bad[0]!r}")


def _check_pairs(predicted: Sequence[float], measured: Sequence[float], what: str) -> None:
    if len(predicted) != len(measured):
        raise ValueError(f"{what}: expected as many predictions as measurements, got {len(predicted)} "
                         f"and {len(measured)}")
    _check_positive((*predicted, *measured), what)


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Kendall's tau-b between ``predicted`` and ``measured`` (:func:`scipy.stats.kendalltau`);
    None for fewer than 2 pairs or when either side is all ties (undefined).

    Raises:
      ValueError: for sequences of different lengths or a time that is not positive and finite.
    """
    _check_pairs(predicted, measured, "kendall_tau")
    if len(predicted) < 2 or len(set(predicted)) < 2 or len(set(measured)) < 2:
        return None
    from scipy.stats import kendalltau

    tau = float(kendalltau(predicted, measured).statistic)
    return None if math.isnan(tau) else tau


def median_relative_error(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """The median over pairs of ``|predicted - measured| / measured``; None for no pairs.

    Raises:
      ValueError: as :func:`kendall_tau`.
    """
    _check_pairs(predicted, measured, "median_relative_error")
    if not predicted:
        return None
    return statistics.median(abs(p - m) / m for p, m in zip(predicted, measured))


RESOLVED_Z = 1.645  # a pair's difference beyond this many standard errors is told apart (two-sided 90%)


def half_noise(halves: Sequence[tuple[float, float]]) -> float | None:
    """The pooled standard deviation of one half's log speedup, from plans measured in both halves.

    Each plan's paired speedup from the even-numbered rounds and from the odd-numbered ones
    estimate one speedup twice: the variance of their log difference is twice a half's. Pass the
    plans other than the reference (xla_default's halves are 1 by construction). None without any.
    """
    diffs = [math.log(a) - math.log(b) for a, b in halves]
    return math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs))) if diffs else None


def resolved_tau(predicted: Sequence[float], halves: Sequence[tuple[float, float]],
                 noise: float) -> tuple[float | None, int]:
    """Kendall's tau over the pairs of plans the measurements tell apart, and how many pairs that is.

    A pair is told apart where the mean over the two halves (``halves``: each plan's paired speedups
    over xla_default in the even- and in the odd-numbered rounds, higher is faster) of the log of
    the two plans' speedup ratio exceeds :data:`RESOLVED_Z` times ``noise`` (:func:`half_noise`:
    that mean's standard error for two plans of that noise each), so a pair of equal plans counts
    one time in ten. Over those pairs: (concordant - discordant) / pairs, concordant where
    ``predicted`` (step times) orders the pair as the measurements do, discordant where it orders
    it the other way; a pair the predictions tie counts in neither, as in tau-a.

    Returns:
      (tau, pairs): tau is None where no pair is told apart.

    Raises:
      ValueError: for sequences of different lengths, a prediction or half that is not positive and
        finite, or a negative or non-finite ``noise``.

    Example:
      >>> resolved_tau([1.0, 2.0, 3.0], [(3.0, 3.1), (2.0, 1.9), (1.95, 2.05)], noise=0.03)  # b, c too close
      (1.0, 2)
    """
    if len(predicted) != len(halves):
        raise ValueError(f"resolved_tau: expected as many predictions as halves, got {len(predicted)} "
                         f"and {len(halves)}")
    _check_positive((*predicted, *(h for pair in halves for h in pair)), "resolved_tau")
    if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise >= 0):
        raise ValueError(f"resolved_tau: expected the halves' noise as a finite number >= 0, got {noise!r}")
    logs = [(math.log(a) + math.log(b)) / 2 for a, b in halves]  # each plan's mean log speedup
    score = pairs = 0
    for i in range(len(predicted)):
        for j in range(i + 1, len(predicted)):
            apart = logs[i] - logs[j]  # > 0: i measured faster
            if abs(apart) <= RESOLVED_Z * noise:
                continue
            pairs += 1
            measured = 1 if apart > 0 else -1
            score += measured * ((predicted[i] < predicted[j]) - (predicted[i] > predicted[j]))
    return (score / pairs if pairs else None), pairs


class Accuracy(NamedTuple):
    """The predictions against the measurements over the measured, applied plans.

    Attributes:
      plans: how many plans were compared.
      tau: Kendall tau between the predictions made before each plan was measured and the
        measured medians; None below 2 plans.
      median_error: the median relative error of those predictions; None without plans.
      sources: how many of the predictions came from each source (:data:`SOURCES`).
      simulated_tau, simulated_median_error: the same for the simulator's own times (its fast tier,
        before any correction or compile; equal to the above when nothing was corrected or compiled).
      paired_tau, paired_median_error: the predictions against drift-free times: xla_default's
        median over each plan's paired speedup in its own rounds (plans measured in different rounds,
        under a load that changes, compare on one scale); None without xla_default's row.
      repeat_tau, repeat_median_error: the measurements against themselves: each plan's drift-free
        time from its even-numbered rounds against that from its odd-numbered rounds (its
        :attr:`~disco.optimizer.PlanRow.halves`); a tau well below 1 says the measured ranking is
        mostly noise, and no prediction can be judged to rank better; None below 2 rounds.
      resolved_tau, resolved_pairs: the predictions over the pairs of plans the measurements tell
        apart (:func:`resolved_tau`, with the noise of the halves of the plans other than
        xla_default), and how many of the plans' pairs those are; None and 0 where a row has no
        halves or no pair is told apart.
      best, best_rank: the plan measured fastest (the largest paired speedup over xla_default: the
        drift-free order) and its rank in the predictions (1: the model's own pick); None without
        measured plans.
      top_k: the k of :attr:`in_top_k` (how many plans the run measured of the model's ranking in a
        round, ``measure_top_k``); None when not given.
      pick, regret: the model's own top pick among the measured plans and how much slower it
        measured than the best (best's paired speedup over the pick's, minus 1; 0: the model
        picked the best); None without measured plans.
      best_ties: how many other plans the model predicted exactly as fast as the best (a tie
        counts against the model: :func:`top_pick`).

    What decides is :attr:`in_top_k` and :attr:`regret` (TVM's meta-schedule judges a cost model
    by its top-k the same way): a model that ranks the rest badly still serves if the best plan
    is among the few it sends to measurement.
    """

    plans: int
    tau: float | None
    median_error: float | None
    sources: dict[str, int]
    simulated_tau: float | None = None
    simulated_median_error: float | None = None
    paired_tau: float | None = None
    paired_median_error: float | None = None
    repeat_tau: float | None = None
    repeat_median_error: float | None = None
    resolved_tau: float | None = None
    resolved_pairs: int = 0
    best: str | None = None
    best_rank: int | None = None
    top_k: int | None = None
    pick: str | None = None
    regret: float | None = None
    best_ties: int = 0

    @property
    def in_top_k(self) -> bool | None:
        """Whether the plan measured fastest was among the model's first :attr:`top_k` (by its
        predictions over the measured plans); None without a k or measured plans."""
        if self.top_k is None or self.best_rank is None:
            return None
        return self.best_rank <= self.top_k

    def decision_line(self) -> str:
        """The one line that says whether the model served: ``model (simulated): the measured best
        ranked 2nd of 15 (in its top 3); its pick measured 4.1% slower (regret)``."""
        if self.best_rank is None or self.regret is None:
            return "model (simulated): no measured plans to judge it by"
        top = "" if self.in_top_k is None else (f", in its top {self.top_k}" if self.in_top_k
                                                else f", not in its top {self.top_k}")
        ties = f" ({self.best_ties} tied)" if self.best_ties else ""
        pick = ("its pick was the best (regret 0)" if self.regret == 0 else
                f"its pick {self.regret * 100:.1f}% slower (regret)")
        return f"model (simulated): the measured best ranked {_ordinal(self.best_rank)} of {self.plans}{ties}{top}; {pick}"

    def detail_lines(self) -> list[str]:
        """The other figures, one line each with what it means (``--details``)."""
        def f(v: float | None, pct: bool = False) -> str:
            return "-" if v is None else f"{v * 100:.1f}%" if pct else f"{v:.3f}"

        by = ", ".join(f"{k} {v}" for k, v in sorted(self.sources.items())) or "none"
        lines = [
            f"Kendall tau {f(self.tau)}: predictions vs measured medians, 1 the same order, -1 reversed "
            f"(over {self.plans} plans; predicted by: {by})",
            f"median error {f(self.median_error, True)}: the typical |predicted - measured| / measured",
            f"simulator alone: tau {f(self.simulated_tau)}, error {f(self.simulated_median_error, True)}: "
            "the same before any correction or compile",
            f"drift-free: tau {f(self.paired_tau)}, error {f(self.paired_median_error, True)}: against "
            "xla_default's median over each plan's paired speedup (one scale for every round)",
            f"repeat: tau {f(self.repeat_tau)}, error {f(self.repeat_median_error, True)}: the measurements "
            "against themselves (even vs odd rounds), the most any model could score",
        ]
        every = self.plans * (self.plans - 1) // 2
        lines.append(f"resolved: tau {f(self.resolved_tau)} over the {self.resolved_pairs} of {every} pairs "
                     f"the measurements tell apart (beyond {RESOLVED_Z} x the halves' noise)")
        return lines

    def line(self) -> str:
        """One line: ``predicted vs measured over 13 plans: Kendall tau 0.070, median error 58.1% ...``."""
        def fmt(tau: float | None, err: float | None) -> str:
            t = "-" if tau is None else f"{tau:.3f}"
            e = "-" if err is None else f"{err * 100:.1f}%"
            return f"Kendall tau {t}, median error {e}"

        by = ", ".join(f"{k} {v}" for k, v in sorted(self.sources.items()))
        text = (f"predicted vs measured over {self.plans} measured plans: {fmt(self.tau, self.median_error)} "
                f"(each plan's prediction made before it was measured; predicted by: {by or 'none'})")
        if set(self.sources) - set(_FAST_TIER):  # corrected or compiled: the fast tier alone beside it
            text += f"; the simulator alone: {fmt(self.simulated_tau, self.simulated_median_error)}"
        paired = fmt(self.paired_tau, self.paired_median_error)
        if paired != fmt(self.tau, self.median_error):  # said only where it says something else
            text += f"; against drift-free times (xla_default's median over each plan's paired speedup): {paired}"
        if self.repeat_tau is not None or self.repeat_median_error is not None:
            text += (f"; the measurements against themselves (even against odd rounds): "
                     f"{fmt(self.repeat_tau, self.repeat_median_error)}")
        if self.resolved_pairs:
            every = self.plans * (self.plans - 1) // 2
            text += (f"; over the {self.resolved_pairs} of {every} pairs of plans the measurements tell apart "
                     f"(their difference beyond {RESOLVED_Z} times the halves' noise): Kendall tau "
                     f"{self.resolved_tau:.3f}")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"plans": self.plans, "kendall_tau": self.tau, "median_relative_error": self.median_error,
                "predicted_by": dict(self.sources), "simulated_kendall_tau": self.simulated_tau,
                "simulated_median_relative_error": self.simulated_median_error,
                "paired_kendall_tau": self.paired_tau, "paired_median_relative_error": self.paired_median_error,
                "repeat_kendall_tau": self.repeat_tau, "repeat_median_relative_error": self.repeat_median_error,
                "resolved_kendall_tau": self.resolved_tau, "resolved_pairs": self.resolved_pairs,
                "measured_best": self.best, "measured_best_rank": self.best_rank, "top_k": self.top_k,
                "measured_best_in_top_k": self.in_top_k, "model_pick": self.pick, "regret": self.regret,
                "measured_best_ties": self.best_ties}


def compared(rows: Sequence[PlanRow]) -> list[PlanRow]:
    """The rows whose prediction is judged: measured and applied (a fallback ran XLA's default compile)."""
    return [r for r in rows if r.median_s is not None and r.applied]


def _judged(pairs: Sequence[tuple[float, float]], whole: int) -> tuple[float | None, float | None]:
    """(:func:`kendall_tau`, :func:`median_relative_error`) of ``(predicted, measured)`` pairs; (None,
    None) unless there is one pair for each of the ``whole`` rows."""
    if not pairs or len(pairs) != whole:
        return None, None
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    return kendall_tau(xs, ys), median_relative_error(xs, ys)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def top_pick(rows: Sequence[PlanRow]) -> tuple[str | None, int | None, str | None, float | None, int]:
    """(the plan measured fastest, its rank in the predictions, the model's pick, the regret, the
    plans tied with the best's prediction) over :func:`compared`'s rows.

    Fastest by paired speedup over xla_default (drift-free; a row without one by its median), ranked
    by ``predicted_s``. A tie goes against the model: the best ranks after the plans predicted as
    fast as it, and the pick is the slowest measured of those predicted fastest. The regret is the
    best's speedup over the pick's, minus 1. All None (and 0) without rows.

    Example:
      >>> from disco.optimizer._choice import PlanRow
      >>> from disco.plans.plan import FusionPlan
      >>> rows = [PlanRow(n, "search", "", FusionPlan(), p, median_s=m, speedup=1 / m)
      ...         for n, p, m in (("a", 1.0, 2.0), ("b", 2.0, 1.0), ("c", 3.0, 1.5))]
      >>> top_pick(rows)
      ('b', 2, 'a', 1.0, 0)
    """
    judged = compared(rows)
    if not judged:
        return None, None, None, None, 0
    base = next((r for r in judged if r.name == "xla_default"), None)

    def speed(r: PlanRow) -> float:
        if r.speedup is not None:
            return r.speedup
        return (base.median_s / r.median_s) if base is not None else 1.0 / r.median_s

    best = max(judged, key=speed)
    rank = sum(r.predicted_s <= best.predicted_s for r in judged)
    ties = sum(r.predicted_s == best.predicted_s for r in judged) - 1
    low = min(r.predicted_s for r in judged)
    pick = min((r for r in judged if r.predicted_s == low), key=speed)
    return best.name, rank, pick.name, speed(best) / speed(pick) - 1.0, ties


def accuracy(rows: Sequence[PlanRow], top_k: int | None = None) -> Accuracy:
    """:class:`Accuracy` of ``rows`` (:func:`compared`'s: measured and applied), each judged by its
    ``predicted_s`` (made before it was measured) against its ``median_s``; ``top_k``: the k of
    :attr:`Accuracy.in_top_k`."""
    judged = compared(rows)
    base = next((r.median_s for r in judged if r.name == "xla_default"), None)
    n = len(judged)
    halved = [r for r in judged if r.halves is not None and min(r.halves) > 0 and all(map(math.isfinite, r.halves))]
    noise = half_noise([r.halves for r in halved if r.name != "xla_default"])
    resolved = (resolved_tau([r.predicted_s for r in halved], [r.halves for r in halved], noise)
                if len(halved) == n and noise is not None else (None, 0))
    return Accuracy(n, *_judged([(r.predicted_s, r.median_s) for r in judged], n),
                    dict(Counter(r.predicted_by for r in judged)),
                    *_judged([(r.simulator_s, r.median_s) for r in judged], n),
                    *_judged([(r.predicted_s, base / r.speedup) for r in judged if base is not None and r.speedup], n),
                    *_judged([(1 / r.halves[0], 1 / r.halves[1]) for r in halved], n), *resolved,
                    *_best_and_pick(rows, top_k))


def _best_and_pick(rows: Sequence[PlanRow], top_k: int | None) -> tuple[Any, ...]:
    best, rank, pick, regret, ties = top_pick(rows)
    return best, rank, top_k, pick, regret, ties

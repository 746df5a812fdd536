"""The report's accuracy: Kendall tau and median error between predicted and measured, from the rows."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disco import optimizer as opt
from tests.support.optimize_results import built_result, row


def _rows(predicted, measured, **kw):
    return tuple(dataclasses.replace(row(f"p{i}", m), predicted_s=p, **kw)
                 for i, (p, m) in enumerate(zip(predicted, measured)))


@pytest.mark.fast
@pytest.mark.parametrize("order, tau", [
    ((0, 1, 2, 3), 1.0),        # the same order
    ((3, 2, 1, 0), -1.0),       # reversed
    ((1, 0, 2, 3), 4 / 6),      # one discordant pair of 6: (5 - 1) / 6
    ((1, 0, 3, 2), 2 / 6),      # two: (4 - 2) / 6
])
def test_a_known_permutation_gives_the_known_tau(order, tau):
    measured = [0.010, 0.020, 0.030, 0.040]
    predicted = [0.001 * (k + 1) for k in order]  # a constant factor off: only the order counts for tau
    assert opt.kendall_tau(predicted, measured) == pytest.approx(tau)
    acc = opt.accuracy(_rows(predicted, measured))
    assert acc.plans == 4 and acc.tau == pytest.approx(tau) and acc.sources == {"emulated": 4}


@pytest.mark.fast
def test_tau_agrees_with_counting_pairs():
    measured = [0.3, 0.1, 0.4, 0.15, 0.5, 0.9]
    predicted = [0.2, 0.25, 0.3, 0.1, 0.6, 0.5]
    pairs = list(itertools.combinations(range(6), 2))
    sign = [((predicted[i] - predicted[j]) * (measured[i] - measured[j]) > 0) * 2 - 1 for i, j in pairs]
    assert opt.kendall_tau(predicted, measured) == pytest.approx(sum(sign) / len(pairs))


@pytest.mark.fast
def test_median_error_is_relative_to_the_measurement():
    # errors 10%, 50%, 20%: the median is 20%
    assert opt.median_relative_error([0.11, 0.15, 0.024], [0.1, 0.1, 0.02]) == pytest.approx(0.2)
    assert opt.median_relative_error([], []) is None


@pytest.mark.fast
def test_unmeasured_and_fallen_back_rows_are_not_judged():
    rows = _rows([0.01, 0.02, 0.03], [0.010, 0.020, 0.030])
    rows += (dataclasses.replace(rows[0], name="fell", applied=False, median_s=0.5, predicted_s=0.001),
             dataclasses.replace(rows[0], name="unmeasured", median_s=None, predicted_s=0.5))
    acc = opt.accuracy(rows)
    assert acc.plans == 3 and acc.tau == pytest.approx(1.0) and acc.median_error == pytest.approx(0.0)


@pytest.mark.fast
def test_the_corrected_predictions_are_judged_and_the_simulator_beside_them():
    # the simulator ranks the three plans backwards; the corrections (made before each was measured) right
    rows = _rows([0.011, 0.019, 0.033], [0.010, 0.020, 0.030], predicted_by="corrected")
    rows = tuple(dataclasses.replace(r, simulated_s=s) for r, s in zip(rows, (0.003, 0.002, 0.001)))
    acc = opt.accuracy(rows)
    assert acc.tau == pytest.approx(1.0) and acc.median_error == pytest.approx(0.1)
    assert acc.simulated_tau == pytest.approx(-1.0) and acc.simulated_median_error == pytest.approx(0.9)
    assert acc.sources == {"corrected": 3}
    line = acc.line()
    assert "Kendall tau 1.000, median error 10.0%" in line and "the simulator alone: Kendall tau -1.000" in line
    assert acc.to_dict()["kendall_tau"] == acc.tau and acc.to_dict()["predicted_by"] == {"corrected": 3}


@pytest.mark.fast
def test_too_few_plans_or_all_ties_leave_tau_undefined():
    assert opt.kendall_tau([0.1], [0.2]) is None
    assert opt.kendall_tau([0.1, 0.1], [0.2, 0.3]) is None
    assert "Kendall tau -" in opt.accuracy(_rows([0.1], [0.2])).line()


@pytest.mark.fast
@pytest.mark.parametrize("pred, meas, match", [
    ([0.1, 0.2], [0.1], "as many predictions as measurements, got 2 and 1"),
    ([0.1, -1.0], [0.1, 0.2], "positive finite step times, got -1.0"),
    ([0.1, float("nan")], [0.1, 0.2], "positive finite step times, got nan"),
])
def test_bad_pairs_are_named(pred, meas, match):
    with pytest.raises(ValueError, match=match):
        opt.kendall_tau(pred, meas)


@pytest.mark.fast
def test_the_summary_and_the_json_carry_the_accuracy_of_the_rows():
    result = built_result()
    acc = result.accuracy
    assert acc == opt.accuracy(result.rows, result.config.measure_top_k) and acc.plans == 3
    assert acc.decision_line() in result.details().splitlines()
    assert all("  " + line in result.details().splitlines() for line in acc.detail_lines())
    assert acc.decision_line() in " ".join(result.summary().split())
    assert result.to_dict()["accuracy"] == acc.to_dict()
    assert all(r["predicted_by"] == "emulated" for r in result.to_dict()["rows"])


@pytest.mark.fast
def test_drift_free_times_put_every_round_on_xla_defaults_scale():
    # p1 was measured in slower rounds (the machine under more load): 2x xla_default's first median raw,
    # but 1.25x faster than xla_default paired in its own rounds
    rows = (dataclasses.replace(row("xla_default", 0.10, speedup=1.0), predicted_s=0.10),
            dataclasses.replace(row("p1", 0.20, speedup=1.25), predicted_s=0.08),
            dataclasses.replace(row("p2", 0.09, speedup=0.5), predicted_s=0.2))
    acc = opt.accuracy(rows)
    assert acc.tau == pytest.approx(-1.0)  # raw: every pair reversed by the drift
    assert acc.paired_tau == pytest.approx(1.0) and acc.paired_median_error == pytest.approx(0.0)
    assert "against drift-free times" in acc.line() and acc.to_dict()["paired_kendall_tau"] == acc.paired_tau
    assert opt.accuracy(rows[1:]).paired_tau is None  # no xla_default row: no scale


@pytest.mark.fast
def test_the_measurements_are_judged_against_themselves_from_their_halves():
    # even rounds rank p1 < p2 < p3 (faster first), odd rounds p2 < p1 < p3: one pair of 6 swapped
    rows = (dataclasses.replace(row("xla_default", 0.10, speedup=1.0), halves=(1.0, 1.0)),
            dataclasses.replace(row("p1", 0.05, speedup=2.0), halves=(2.2, 1.8)),
            dataclasses.replace(row("p2", 0.05, speedup=2.0), halves=(1.9, 2.0)),
            dataclasses.replace(row("p3", 0.08, speedup=1.25), halves=(1.2, 1.3)))
    acc = opt.accuracy(rows)
    assert acc.repeat_tau == pytest.approx(4 / 6)
    # the even rounds' drift-free times against the odd rounds': 0, 1/2.2 vs 1/1.8, 1/1.9 vs 1/2.0, ...
    errs = sorted([0.0, abs(1 / 2.2 - 1 / 1.8) * 1.8, abs(1 / 1.9 - 1 / 2.0) * 2.0, abs(1 / 1.2 - 1 / 1.3) * 1.3])
    assert acc.repeat_median_error == pytest.approx((errs[1] + errs[2]) / 2)
    assert "the measurements against themselves (even against odd rounds): Kendall tau 0.667" in acc.line()
    assert acc.to_dict()["repeat_kendall_tau"] == acc.repeat_tau
    # a row without halves (one round): the measurements cannot be judged against themselves
    single = opt.accuracy((*rows[:3], dataclasses.replace(rows[3], halves=None)))
    assert single.repeat_tau is None and "against themselves" not in single.line()


@pytest.mark.fast
def test_the_predictions_are_judged_over_the_pairs_the_measurements_tell_apart():
    # p1 and p2 measure 2.0x and 1.95x over the halves, which disagree by about 10% on each: too close
    # to tell apart, so a prediction is judged on the other 5 of the 6 pairs only
    rows = (dataclasses.replace(row("xla_default", 0.10, speedup=1.0), halves=(1.0, 1.0), predicted_s=0.10),
            dataclasses.replace(row("p1", 0.05, speedup=2.0), halves=(2.1, 1.9), predicted_s=0.040),
            dataclasses.replace(row("p2", 0.05, speedup=2.0), halves=(1.85, 2.05), predicted_s=0.045),
            dataclasses.replace(row("p3", 0.08, speedup=1.25), halves=(1.3, 1.2), predicted_s=0.030))
    noise = opt.half_noise([r.halves for r in rows[1:]])  # xla_default's halves are 1 by construction
    assert noise == pytest.approx(math.sqrt(sum(math.log(a / b) ** 2 for a, b in
                                                 ((2.1, 1.9), (1.85, 2.05), (1.3, 1.2))) / 6))
    acc = opt.accuracy(rows)
    # p3 is predicted fastest but measured slower than p1 and p2: 2 discordant, 3 concordant of 5
    assert acc.resolved_pairs == 5 and acc.resolved_tau == pytest.approx((3 - 2) / 5)
    assert "over the 5 of 6 pairs of plans the measurements tell apart" in acc.line()
    assert "Kendall tau 0.200" in acc.line().split("tell apart")[1]
    assert acc.to_dict()["resolved_kendall_tau"] == acc.resolved_tau and acc.to_dict()["resolved_pairs"] == 5
    # without halves on every row nothing is judged this way, and the line does not say it
    single = opt.accuracy((*rows[:3], dataclasses.replace(rows[3], halves=None)))
    assert single.resolved_tau is None and single.resolved_pairs == 0 and "tell apart" not in single.line()


def _ranks(values):
    """Each value's rank among the distinct values, from 1 (equal values, equal ranks): positive times
    in the values' order, exactly."""
    distinct = sorted(set(values))
    return [distinct.index(v) + 1 for v in values]


def _log_speedups(halves):
    return [(math.log(a) + math.log(b)) / 2 for a, b in halves]


@pytest.mark.fast
@given(st.lists(st.tuples(st.floats(0.5, 2.0), st.floats(0.5, 2.0), st.floats(0.5, 2.0)), min_size=2, max_size=9),
       st.floats(0.0, 0.5))
def test_resolved_tau_judges_exactly_the_pairs_beyond_the_noise(plans, noise):
    predicted = [p for p, _, _ in plans]
    halves = [(e, o) for _, e, o in plans]
    logs = _log_speedups(halves)
    tau, pairs = opt.resolved_tau(predicted, halves, noise)
    apart = [(i, j) for i, j in itertools.combinations(range(len(plans)), 2)
             if abs(logs[i] - logs[j]) > opt.RESOLVED_Z * noise]
    assert pairs == len(apart)
    if not apart:
        assert tau is None
        return
    assert -1.0 <= tau <= 1.0
    # predictions made from the measurements (faster, the higher its mean log speedup) agree on every
    # pair told apart; as ranks, so that no two distinct values round to one time
    exact, _ = opt.resolved_tau(_ranks([-v for v in logs]), halves, noise)
    assert exact == 1.0
    # reversing the predictions' order (ties kept) reverses the verdict on every pair
    flipped, _ = opt.resolved_tau(_ranks([-p for p in predicted]), halves, noise)
    assert flipped == pytest.approx(-tau)
    # more noise never tells more pairs apart
    assert opt.resolved_tau(predicted, halves, noise * 2 + 0.01)[1] <= pairs


@pytest.mark.fast
@pytest.mark.parametrize("predicted, halves, noise, match", [
    ([1.0], [(1.0, 1.0), (2.0, 2.0)], 0.1, "as many predictions as halves"),
    ([1.0, -1.0], [(1.0, 1.0), (2.0, 2.0)], 0.1, "positive finite"),
    ([1.0, 2.0], [(1.0, float("nan")), (2.0, 2.0)], 0.1, "positive finite"),
    ([1.0, 2.0], [(1.0, 1.0), (2.0, 2.0)], -0.1, "noise as a finite number >= 0"),
])
def test_resolved_tau_names_bad_input(predicted, halves, noise, match):
    with pytest.raises(ValueError, match=match):
        opt.resolved_tau(predicted, halves, noise)

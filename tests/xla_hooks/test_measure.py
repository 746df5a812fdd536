"""xla_hooks.measure: interleaved rounds, a warm-up round, a Williams design's orders, per-step blocking."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xla_hooks import measure

pytestmark = pytest.mark.fast


def recorder():
    calls = []

    def make(name):
        def fn(*args):
            calls.append(name)
            return args[0]
        return fn
    return calls, make


def test_interleaved_rounds_warm_up_then_follow_the_williams_rows():
    calls, make = recorder()
    fns = {n: make(n) for n in "abc"}
    out = measure.measure_interleaved(fns, (1.0,), rounds=7, steps=2)
    assert {k: len(m.samples) for k, m in out.items()} == {"a": 7, "b": 7, "c": 7}
    rounds = ["".join(calls[i:i + 6:2]) for i in range(0, len(calls), 6)]  # one entry per plan per round
    # the untimed warm-up round, then the 6 rows of the design and its first row again
    assert rounds == ["abc", "abc", "bca", "cab", "cba", "acb", "bac", "abc"]
    assert calls[:2] == ["a", "a"]  # steps of one plan run back to back


def test_no_plan_always_follows_the_same_one():
    # the confirmation's order: xla_default, the candidate, the baseline. A rotation put the
    # candidate right after xla_default in 2 of every 3 rounds and the baseline in none.
    calls, make = recorder()
    fns = {n: make(n) for n in ("xla_default", "candidate", "baseline")}
    measure.measure_interleaved(fns, (1.0,), rounds=6, steps=1)
    rounds = [calls[i:i + 3] for i in range(3, len(calls), 3)]
    after = collections.Counter(b for r in rounds for a, b in zip(r, r[1:]) if a == "xla_default")
    assert after["candidate"] == after["baseline"] > 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 24))
def test_round_orders_are_a_williams_design(n):
    rows = measure.round_orders(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n)
    assert rows[0][:3] == (0, 1, n - 1)[:n]
    per_place = len(rows) // n
    for place in range(n):  # a Latin square: every item at every place equally often
        assert collections.Counter(row[place] for row in rows) == {i: per_place for i in range(n)}
    adjacent = collections.Counter((row[j], row[j + 1]) for row in rows for j in range(n - 1))
    assert set(adjacent) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert set(adjacent.values()) <= {per_place}  # each ordered pair adjacent equally often


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_round_orders_refuse_what_is_not_a_count(n):
    with pytest.raises(ValueError, match="expected an item count >= 1"):
        measure.round_orders(n)


def test_every_step_is_waited_for(monkeypatch):
    import jax

    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or x)
    measure.measure_interleaved({"a": lambda x: x}, (3,), rounds=2, steps=3)
    assert len(waited) == (1 + 2) * 3  # warm-up round and timed rounds, each step


def test_bad_counts_are_named():
    with pytest.raises(ValueError, match="rounds and steps must be >= 1"):
        measure.measure_interleaved({"a": lambda: 0}, (), rounds=0)
    with pytest.raises(ValueError, match="expected at least one callable to measure, got none"):
        measure.measure_interleaved({}, ())


def test_paired_speedup_is_the_median_of_per_round_ratios():
    base = measure.Measurement((1.0, 2.0, 4.0))
    other = measure.Measurement((0.5, 2.5, 3.0))  # ratios 2.0, 0.8, 1.333
    assert measure.paired_speedup(base, other) == pytest.approx(4.0 / 3.0)
    assert base.median / other.median == pytest.approx(0.8)  # the ratio of medians says the opposite
    # drift between rounds cancels: other is 10% faster in every round, however slow the round
    drift = (1.0, 3.0, 1.2, 2.5, 1.1)
    assert measure.paired_speedup(measure.Measurement(drift), measure.Measurement(tuple(0.9 * d for d in drift))) \
        == pytest.approx(1 / 0.9)
    with pytest.raises(ValueError, match="one interleaved run, got 3 and 2 rounds"):
        measure.paired_speedup(base, measure.Measurement((1.0, 1.0)))


def test_paired_halves_pair_the_even_rounds_and_the_odd_rounds():
    base = measure.Measurement((4.0, 6.0, 4.0, 6.0, 4.0))
    other = measure.Measurement((2.0, 3.0, 1.0, 6.0, 2.0))  # even rounds 2x, 4x, 2x; odd 2x, 1x
    assert measure.paired_halves(base, other) == pytest.approx((2.0, 1.5))
    assert measure.paired_halves(measure.Measurement((1.0,)), measure.Measurement((1.0,))) is None
    with pytest.raises(ValueError, match="one interleaved run"):
        measure.paired_halves(base, measure.Measurement((1.0, 1.0)))


def test_paired_interval_brackets_the_paired_speedup_and_repeats():
    base = measure.Measurement((1.0, 1.1, 0.9, 1.2, 1.0, 1.05, 0.95))
    other = measure.Measurement((0.8, 1.0, 0.85, 1.0, 0.9, 1.0, 0.9))
    lo, hi = measure.paired_interval(base, other)
    assert lo < measure.paired_speedup(base, other) < hi
    assert measure.paired_interval(base, other) == (lo, hi)  # seeded: the same samples, the same interval
    narrow = measure.paired_interval(base, other, level=0.5)
    assert lo <= narrow[0] <= narrow[1] <= hi
    # a plan 10% faster in every round, whatever the round's drift: no spread to resample
    drift = (1.0, 3.0, 1.2, 2.5, 1.1)
    point = measure.paired_interval(measure.Measurement(drift), measure.Measurement(tuple(0.9 * d for d in drift)))
    assert point == pytest.approx((1 / 0.9, 1 / 0.9))


def test_paired_interval_bad_input_is_named():
    one = measure.Measurement((1.0, 2.0))
    with pytest.raises(ValueError, match="one interleaved run with rounds, got 2 and 1 rounds"):
        measure.paired_interval(one, measure.Measurement((1.0,)))
    with pytest.raises(ValueError, match="0 < level < 1 and draws >= 1, got level=1.5"):
        measure.paired_interval(one, one, level=1.5)
    with pytest.raises(ValueError, match="draws=0"):
        measure.paired_interval(one, one, draws=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-3, 10.0), st.floats(1e-3, 10.0)), min_size=1, max_size=25))
def test_paired_interval_holds_the_median_within_the_ratios(rounds):
    base = measure.Measurement(tuple(b for b, _ in rounds))
    other = measure.Measurement(tuple(o for _, o in rounds))
    ratios = [b / o for b, o in rounds]
    lo, hi = measure.paired_interval(base, other, draws=400)
    assert min(ratios) <= lo <= measure.paired_speedup(base, other) <= hi <= max(ratios)

"""Measuring compiled steps: interleaved rounds, medians, spread."""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Per-step wall times in seconds, one sample per round."""

    samples: tuple[float, ...]

    def __repr__(self) -> str:
        if not self.samples:
            return "Measurement(no rounds)"
        return (f"Measurement({len(self.samples)} rounds, median {self.median * 1e3:.3f} ms "
                f"({self.min * 1e3:.3f}-{self.max * 1e3:.3f}))")

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def to_dict(self) -> dict[str, float]:
        return {"median_ms": self.median * 1e3, "min_ms": self.min * 1e3, "max_ms": self.max * 1e3,
                "rounds": len(self.samples)}


def _run(fn: Callable[..., Any], args: Sequence[Any], steps: int, kwargs: Mapping[str, Any] | None = None) -> float:
    """Mean seconds per call over ``steps`` calls, each waited for (as a training loop's steps,
    which depend on each other, would be).

    A step that donates or updates its arguments (``fn.consumes_arguments``: a donating ``jax.jit``,
    an ``nnx.jit``) gets fresh ones for every call (``fn.fresh_arguments``), made before the clock
    starts: no call reuses a consumed buffer, and the caller's arguments stay as they were.
    """
    import jax

    if getattr(fn, "consumes_arguments", False):
        calls = [fn.fresh_arguments(tuple(args), kwargs) for _ in range(steps)]
        jax.block_until_ready(calls)
    else:
        calls = [(tuple(args), dict(kwargs or {}))] * steps
    t0 = time.perf_counter()
    for a, kw in calls:
        jax.block_until_ready(fn(*a, **kw))
    return (time.perf_counter() - t0) / steps


def measure(fn: Callable[..., Any], args: Sequence[Any], rounds: int = 5, steps: int = 3,
            kwargs: Mapping[str, Any] | None = None) -> Measurement:
    """Times ``fn(*args, **kwargs)``: ``rounds`` samples, each the mean of ``steps`` calls after one warm call."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got rounds={rounds}, steps={steps}")
    _run(fn, args, 1, kwargs)  # warm-up, not timed
    return Measurement(tuple(_run(fn, args, steps, kwargs) for _ in range(rounds)))


def round_orders(n: int) -> tuple[tuple[int, ...], ...]:
    """The rows of a Williams design over ``n`` items: a Latin square (each item once at each place
    over the rows) in which each ordered pair of items is adjacent equally often (once over ``n``
    rows for an even ``n``; twice over ``2 n`` rows, the rows and their reverses, for an odd one).
    Row 0 is ``0, 1, n-1, 2, n-2, ...``; row ``i`` adds ``i`` to it, modulo ``n``.

    Raises:
      ValueError: for ``n`` below 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"round_orders: expected an item count >= 1, got {n!r}")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [tuple((x + i) % n for x in first) for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return tuple(rows)


def measure_interleaved(
    fns: Mapping[str, Callable[..., Any]],
    args: Sequence[Any],
    rounds: int = 5,
    steps: int = 3,
    on_round: Callable[[int], None] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Measurement]:
    """Times several callables round by round, so drift hits all alike.

    One untimed warm-up round in the given order first; then round ``r`` runs them in the order
    of row ``r`` of a Williams design (:func:`round_orders`): every callable comes at every place
    of a round, and right after every other callable, equally often over the design's rows. Every
    step is waited for before the next is dispatched. Both matter on CPU: with a fixed order and
    the steps of a round dispatched asynchronously, copies of one executable measured up to 20%
    apart in one run, the one right after xla_default slower (docs/archive/lab-notebook.md, its
    opening note "Measurement method"). The rotation used before (A B C, B C A, ...) put B right
    after A in every round but one, so any carry-over from a neighbour fell on one plan; two
    handles of one executable measured 0.973-1.028x of each other under either order, with no
    sign of it at that noise ("Which plan follows which", 2026-11-29). The order depends only on
    the names' order, so processes measuring the same names run their collectives in step.
    """
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got rounds={rounds}, steps={steps}")
    if not fns:
        raise ValueError("measure_interleaved: expected at least one callable to measure, got none")
    names = list(fns)
    for name in names:  # warm-up: one untimed round
        _run(fns[name], args, steps, kwargs)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    orders = round_orders(len(names))
    for r in range(rounds):
        for i in orders[r % len(orders)]:
            samples[names[i]].append(_run(fns[names[i]], args, steps, kwargs))
        if on_round:
            on_round(r)
    return {k: Measurement(tuple(v)) for k, v in samples.items()}


def paired_speedup(base: Measurement, other: Measurement) -> float:
    """How many times faster ``other`` ran than ``base``: the median over rounds of
    ``base``'s round time / ``other``'s in the same round.

    Both must come from one :func:`measure_interleaved` run, where a round measures every
    callable back to back. Pairing by round cancels the drift between rounds that a ratio of
    the two medians keeps (on shared CPU cores a median moves by tens of percent between runs;
    docs/archive/lab-notebook.md,
    "disco optimize across the zoo").

    Raises:
      ValueError: when the two have different numbers of rounds (not one run).
    """
    if len(base.samples) != len(other.samples):
        raise ValueError(f"paired_speedup needs two measurements of one interleaved run, got {len(base.samples)} "
                         f"and {len(other.samples)} rounds")
    return statistics.median(b / o for b, o in zip(base.samples, other.samples))


def paired_halves(base: Measurement, other: Measurement) -> tuple[float, float] | None:
    """:func:`paired_speedup` over the even-numbered rounds and over the odd-numbered ones
    (rounds 0, 2, 4, ... and 1, 3, 5, ...); None below 2 rounds.

    Two measurements of the same plans from one run: how far the measured ranking agrees with
    itself says how far any prediction's ranking against it can be judged.

    Raises:
      ValueError: as :func:`paired_speedup`.
    """
    if len(base.samples) != len(other.samples):
        raise ValueError(f"paired_halves needs two measurements of one interleaved run, got {len(base.samples)} "
                         f"and {len(other.samples)} rounds")
    if len(base.samples) < 2:
        return None
    return (paired_speedup(Measurement(base.samples[0::2]), Measurement(other.samples[0::2])),
            paired_speedup(Measurement(base.samples[1::2]), Measurement(other.samples[1::2])))


def paired_interval(base: Measurement, other: Measurement, level: float = 0.9,
                    draws: int = 2000) -> tuple[float, float]:
    """A percentile bootstrap interval, at confidence ``level``, of :func:`paired_speedup`
    (the median per-round ratio ``base`` / ``other``): the rounds are resampled with
    replacement ``draws`` times from a fixed seed, so the same samples give the same interval.

    How far a paired speedup can be trusted: an interval that contains 1.0 does not tell
    the two apart in that run.

    Raises:
      ValueError: different numbers of rounds (not one run), no rounds, ``level`` outside
        (0, 1) or ``draws`` below 1.
    """
    if len(base.samples) != len(other.samples) or not base.samples:
        raise ValueError(f"paired_interval needs two measurements of one interleaved run with rounds, got "
                         f"{len(base.samples)} and {len(other.samples)} rounds")
    ratios = [b / o for b, o in zip(base.samples, other.samples)]
    return bootstrap_interval(lambda rng: statistics.median(rng.choices(ratios, k=len(ratios))), level, draws)


def bootstrap_interval(draw: Callable[[random.Random], float], level: float = 0.9,
                       draws: int = 2000) -> tuple[float, float]:
    """The percentile interval, at confidence ``level``, of ``draws`` values of ``draw(rng)``,
    one resample each, from one generator seeded 0 (the same draws give the same interval).

    Raises:
      ValueError: ``level`` outside (0, 1) or ``draws`` below 1.
    """
    if not 0.0 < level < 1.0 or draws < 1:
        raise ValueError(f"bootstrap interval: expected 0 < level < 1 and draws >= 1, got level={level!r}, "
                         f"draws={draws!r}")
    rng = random.Random(0)
    values = sorted(draw(rng) for _ in range(draws))
    return values[int((1 - level) / 2 * draws)], values[min(draws - 1, int((1 + level) / 2 * draws))]

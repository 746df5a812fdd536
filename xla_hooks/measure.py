"""Measuring compiled steps: interleaved rounds, medians, spread."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Per-step wall times in seconds, one sample per round."""

    samples: tuple[float, ...]

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


def _run(fn: Callable[..., Any], args: Sequence[Any], steps: int) -> float:
    import jax

    t0 = time.perf_counter()
    out = None
    for _ in range(steps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


def measure(fn: Callable[..., Any], args: Sequence[Any], rounds: int = 5, steps: int = 3) -> Measurement:
    """Times ``fn(*args)``: ``rounds`` samples, each the mean of ``steps`` calls after one warm call."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got rounds={rounds}, steps={steps}")
    import jax

    jax.block_until_ready(fn(*args))  # warm-up, not timed
    return Measurement(tuple(_run(fn, args, steps) for _ in range(rounds)))


def measure_interleaved(
    fns: Mapping[str, Callable[..., Any]],
    args: Sequence[Any],
    rounds: int = 5,
    steps: int = 3,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Measurement]:
    """Times several callables round by round (A B C, A B C, ...), so drift hits all alike."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got rounds={rounds}, steps={steps}")
    import jax

    for fn in fns.values():
        jax.block_until_ready(fn(*args))  # warm-up, not timed
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_run(fn, args, steps))
        if on_round:
            on_round(r)
    return {k: Measurement(tuple(v)) for k, v in samples.items()}

"""Trials inside the job: the first steps of a run measure candidate plans, the fastest is kept.

``xla_hooks.jit(step, service=..., trials=n)`` asks the plan service for its ``n`` best plans
(predicted by simulation, best first), adds XLA's default, compiles every candidate ahead and
runs the job's first ``trial_steps * len(candidates)`` steps on them in ``trial_steps`` rounds,
each round one step of every candidate in turn, timing every step (waited for). Rounds, as
:func:`xla_hooks.measure.measure_interleaved` does, so that a slow moment of a shared machine and
the job's first collectives (the first round, not timed) do not fall on one candidate. A plan
never changes what the step computes, so these are real training steps. Then the candidate with the lowest median step time (each step timed on
the slowest process: :func:`xla_hooks.agreement.choose`) is kept for the rest of the run, and
the times are reported to the service (``POST /v1/trials``), which answers the next job of the
same plan key with the measured winner.

This module holds the pieces that need no service and no key-value store: the candidates, the
callable that runs the trial steps, and the report's body.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from xla_hooks.measure import round_orders

DEFAULT_TRIAL_STEPS = 5
XLA_DEFAULT = "xla_default"


class TrialReportWarning(UserWarning):
    """The step times the job measured could not be reported to the plan service (the job keeps its
    winner; the next job of the same program runs trials again)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan a job measures.

    Attributes:
      name: the planner's or the baseline's name (``xla_default`` for XLA's default compile).
      predicted_ms: the step time the planner predicted (None when it named none).
      plan: the plan (None: XLA's default compile).
    """

    name: str
    predicted_ms: float | None
    plan: Any

    def to_dict(self) -> dict[str, Any]:
        from xla_hooks.apply_plan import DEFAULT_PLAN

        return {"name": self.name, "predicted_ms": self.predicted_ms,
                "plan": (self.plan or DEFAULT_PLAN).to_dict()}

    @classmethod
    def from_dict(cls, d: Any) -> Candidate:
        """Raises ValueError or TypeError for anything but ``{"name", "predicted_ms", "plan"}``."""
        from disco.plans.plan import FusionPlan

        if not isinstance(d, dict) or not isinstance(d.get("plan"), dict):
            raise TypeError(f"a candidate: expected {{name, predicted_ms, plan}}, got {str(d)[:80]}")
        predicted = d.get("predicted_ms")
        if predicted is not None and (isinstance(predicted, bool) or not isinstance(predicted, (int, float))):
            raise TypeError(f"a candidate's predicted_ms: expected a number or null, got {predicted!r}")
        plan = FusionPlan.from_dict(d["plan"])
        name = d.get("name") if isinstance(d.get("name"), str) and d.get("name") else (plan.name or plan.digest())
        return cls(name, None if predicted is None else float(predicted), None if name == XLA_DEFAULT else plan)


def with_default(candidates: Sequence[Candidate], report: dict[str, Any] | None) -> list[Candidate]:
    """``candidates`` and XLA's default compile (last, its predicted time from the report's baselines)
    unless one of them is XLA's default already: the plan every job can fall back to is measured too."""
    out = list(candidates)
    if any(c.plan is None or c.name == XLA_DEFAULT for c in out):
        return out
    predicted = ((report or {}).get("baselines_ms") or {}).get(XLA_DEFAULT)
    return out + [Candidate(XLA_DEFAULT, None if predicted is None else float(predicted), None)]


class TrialRun:
    """The step of one signature while trials run: round ``i // len(candidates)`` runs every
    candidate once, the first in the given order and each later one in the order of a row of
    :func:`xla_hooks.measure.round_orders` (every candidate after every other equally often), each
    call waited for and timed; after the last, ``finish(samples)`` is
    called once (``samples[c]``: candidate ``c``'s step times in ms, the first round left out when
    there are more: it also paid for each executable's first run and the job's first collectives).

    Args:
      candidates: the candidates that compiled on every process, in the order they run.
      compiled: their compiled steps (``xla_hooks.AppliedStep``), one each.
      steps: steps per candidate (rounds).
      finish: called with the samples after the last trial step; it installs the winner.
    """

    def __init__(self, candidates: Sequence[Candidate], compiled: Sequence[Any], steps: int,
                 finish: Callable[[list[list[float]]], None]):
        if len(candidates) != len(compiled) or not candidates:
            raise ValueError(f"TrialRun: expected one compiled step per candidate, got {len(candidates)} "
                             f"candidates and {len(compiled)} compiled steps")
        if steps < 1:
            raise ValueError(f"TrialRun: expected steps >= 1, got {steps}")
        self.candidates = tuple(candidates)
        self.compiled = tuple(compiled)
        self.steps = steps
        self.finish = finish
        self.samples: list[list[float]] = [[] for _ in candidates]
        self.orders = round_orders(len(candidates))
        self.calls = 0

    def __repr__(self) -> str:
        return (f"TrialRun({len(self.candidates)} candidates, {self.steps} steps each, "
                f"{self.calls} of {self.total} steps run)")

    @property
    def total(self) -> int:
        return len(self.candidates) * self.steps

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        rnd, place = divmod(self.calls, len(self.candidates))
        i = place if rnd == 0 else self.orders[(rnd - 1) % len(self.orders)][place]
        t0 = time.perf_counter()
        out = self.compiled[i](*args, **kwargs)
        jax.block_until_ready(out)
        self.samples[i].append((time.perf_counter() - t0) * 1e3)
        self.calls += 1
        if self.calls == self.total:
            self.finish(self.timed())
        return out

    def timed(self) -> list[list[float]]:
        return [s[1:] if len(s) > 1 else list(s) for s in self.samples]


def summary(candidates: Sequence[Candidate], samples: Sequence[Sequence[Sequence[float]]], winner: int
            ) -> list[dict[str, Any]]:
    """Per candidate: name, plan digest, predicted and measured ms (median over steps of the slowest
    process's time), and whether it won; ``samples[p][c]``: process ``p``'s times of candidate ``c``."""
    from xla_hooks.apply_plan import DEFAULT_PLAN

    out = []
    for c, cand in enumerate(candidates):
        per_step = [max(step) for step in zip(*(per[c] for per in samples))]
        out.append({"name": cand.name, "plan_digest": (cand.plan or DEFAULT_PLAN).digest(),
                    "predicted_ms": cand.predicted_ms, "measured_ms": statistics.median(per_step),
                    "winner": c == winner})
    return out


def report_body(key: str, candidates: Sequence[Candidate], samples: Sequence[Sequence[Sequence[float]]],
                winner: int, run_id: str | None = None) -> dict[str, Any]:
    """The body of ``POST /v1/trials`` (``service.schemas.TrialReport``)."""
    return {"key": key, "run_id": run_id or uuid.uuid4().hex, "winner": winner,
            "trials": [{**cand.to_dict(), "samples_ms": [list(per[c]) for per in samples]}
                       for c, cand in enumerate(candidates)]}

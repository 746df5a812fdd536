"""``disco bench``: compile plans for one step and measure them interleaved."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from disco.plan import FusionPlan


@dataclasses.dataclass(frozen=True)
class PlanResult:
    name: str
    plan: FusionPlan
    applied: bool
    fallback_reason: str | None
    compile_s: float
    fusions: int
    all_reduces: int
    measurement: Any  # xla_hooks.measure.Measurement

    def to_dict(self, base_median: float | None) -> dict[str, Any]:
        m = self.measurement.to_dict()
        return {
            "plan": self.name, "applied": self.applied, "fallback_reason": self.fallback_reason,
            "compile_s": round(self.compile_s, 3), "fusions": self.fusions,
            "all_reduces": self.all_reduces, **{k: round(v, 3) for k, v in m.items()},
            "ratio_to_xla_default": (round(self.measurement.median / base_median, 4)
                                     if base_median else None),
            "plan_digest": self.plan.digest(),
        }


def compiled_counts(text: str) -> tuple[int, int]:
    """(fusions, all-reduces) in a compiled module text, over all computations."""
    from disco.hlo_parse import parse_module

    fusions = all_reduces = 0
    for comp in parse_module(text).computations:
        for ins in comp.instructions:
            fusions += ins.opcode == "fusion"
            all_reduces += ins.opcode in ("all-reduce", "all-reduce-start")
    return fusions, all_reduces


def run_bench(
    step_fn: Callable[..., Any],
    args: Sequence[Any],
    plans: dict[str, FusionPlan],
    *,
    rounds: int = 5,
    steps: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[PlanResult]:
    """Applies every plan, then measures them all round by round."""
    from xla_hooks import apply_plan, measure

    applied: dict[str, Any] = {}
    meta: dict[str, tuple] = {}
    for name, plan in plans.items():
        t0 = time.perf_counter()
        step = apply_plan.apply(plan, step_fn, *args)
        compile_s = time.perf_counter() - t0
        fus, ars = compiled_counts(step.compiled_text())
        applied[name] = step
        meta[name] = (step.applied, step.fallback_reason, compile_s, fus, ars)
        if progress:
            progress(f"compiled {name}")
    ms = measure.measure_interleaved(applied, args, rounds=rounds, steps=steps,
                                     on_round=(lambda r: progress(f"round {r + 1}/{rounds}")) if progress else None)
    return [PlanResult(name, plans[name], *meta[name], ms[name]) for name in plans]

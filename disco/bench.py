"""``disco bench``: compile plans for one step and measure them interleaved."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from disco.ir.opcodes import ALL_REDUCE_OPCODES
from disco.plans.plan import FusionPlan
from disco.sim.memory import peak_bytes


COMM_FREE_BOUND = "comm_free_bound"


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """One measured row. ``plan`` is None for the communication-free bound (not a plan).
    ``peak_memory_bytes``: the compiled step's peak device memory as XLA's memory analysis reports
    it (:func:`disco.sim.memory.peak_memory`), None where the executable reports none."""

    name: str
    plan: FusionPlan | None
    applied: bool
    fallback_reason: str | None
    compile_s: float
    fusions: int
    all_reduces: int
    measurement: Any  # xla_hooks.measure.Measurement
    step: Any = dataclasses.field(default=None, repr=False, compare=False)  # the measured callable
    peak_memory_bytes: int | None = None

    def __repr__(self) -> str:
        status = "applied" if self.applied else "fell back"
        return (f"PlanResult({self.name[:40]!r}, {status}, {self.fusions} fusions, {self.all_reduces} all-reduces, "
                f"compiled in {self.compile_s:.2f} s, {self.measurement!r})")

    def to_dict(self, base: Any | None) -> dict[str, Any]:
        """The row as JSON, next to ``base``, xla_default's Measurement in the same rounds (None:
        no speedups): ``speedup_vs_xla_default`` (the ratio of the two medians), ``paired_speedup``
        (:func:`xla_hooks.measure.paired_speedup`, the median of per-round ratios, as ``disco
        optimize`` reports it) and ``paired_interval`` (its 90% bootstrap interval)."""
        from xla_hooks.measure import paired_interval, paired_speedup

        m = self.measurement
        paired = None if base is None else paired_speedup(base, m)
        interval = None if base is None else paired_interval(base, m)
        return {
            "plan": self.name, "applied": self.applied, "fallback_reason": self.fallback_reason,
            "compile_s": round(self.compile_s, 3), "fusions": self.fusions,
            "all_reduces": self.all_reduces, **{k: round(v, 3) for k, v in m.to_dict().items()},
            # one convention everywhere: xla_default's time over this one's, higher is faster
            "speedup_vs_xla_default": (round(base.median / m.median, 4) if base is not None and m.median else None),
            "paired_speedup": None if paired is None else round(paired, 4),
            "paired_interval": None if interval is None else [round(v, 4) for v in interval],
            "plan_digest": self.plan.digest() if self.plan is not None else None,
            "peak_memory_bytes": self.peak_memory_bytes,
        }

    @property
    def is_bound(self) -> bool:
        return self.plan is None


def compiled_counts(text: str) -> tuple[int, int]:
    """(fusions, all-reduces) in a compiled module text, over all computations."""
    from disco.ir.hlo_parse import parse_module

    fusions = all_reduces = 0
    for comp in parse_module(text).computations:
        for ins in comp.instructions:
            fusions += ins.opcode == "fusion"
            all_reduces += ins.opcode in ALL_REDUCE_OPCODES
    return fusions, all_reduces


def run_bench(
    step_fn: Callable[..., Any],
    args: Sequence[Any],
    plans: dict[str, FusionPlan],
    *,
    rounds: int = 5,
    steps: int = 3,
    progress: Callable[[str], None] | None = None,
    comm_free_bound: bool = False,
    kwargs: Mapping[str, Any] | None = None,
) -> list[PlanResult]:
    """Applies every plan, then measures them all round by round.

    Args:
      kwargs: the step's keyword arguments, if it is called with some.
      comm_free_bound: also measure, in the same rounds, the step with its all-reduces replaced
        by copies (:mod:`xla_hooks.bound`); it comes last, named ``COMM_FREE_BOUND``, with
        ``plan=None``. When it cannot be compiled it is left out (a ``RuntimeWarning`` says why).
    """
    import warnings

    from xla_hooks import apply_plan, bound, measure

    applied: dict[str, Any] = {}
    meta: dict[str, tuple] = {}
    for name, plan in plans.items():
        t0 = time.perf_counter()
        step = apply_plan.apply(plan, step_fn, *args, kwargs=kwargs)
        compile_s = time.perf_counter() - t0
        fus, ars = compiled_counts(step.compiled_text())
        applied[name] = step
        meta[name] = (step.applied, step.fallback_reason, compile_s, fus, ars)
        if progress:
            progress(f"compiled {name}")
    names: dict[str, FusionPlan | None] = dict(plans)
    if comm_free_bound:
        t0 = time.perf_counter()
        try:
            fn = bound.compile_comm_free(step_fn, *args, kwargs=kwargs)
        except Exception as e:  # noqa: BLE001 - the bound is optional; the plans are measured anyway
            warnings.warn(f"disco: the communication-free bound was not measured ({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=2)
        else:
            applied[COMM_FREE_BOUND] = fn
            meta[COMM_FREE_BOUND] = (False, "a bound, not a plan: all-reduces replaced by copies",
                                     time.perf_counter() - t0, *compiled_counts(fn.as_text()))
            names[COMM_FREE_BOUND] = None
            if progress:
                progress(f"compiled {COMM_FREE_BOUND}")
    ms = measure.measure_interleaved(applied, args, rounds=rounds, steps=steps, kwargs=kwargs,
                                     on_round=(lambda r: progress(f"round {r + 1}/{rounds}")) if progress else None)
    return [PlanResult(name, plan, *meta[name], ms[name], applied[name], peak_memory_bytes=peak_bytes(applied[name]))
            for name, plan in names.items()]

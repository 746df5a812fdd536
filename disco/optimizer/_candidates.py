"""The search on the model and the plans it hands to measurement (the reported baselines, the
bucket-count sweep, the best searched plans): what each round of the funnel
(:mod:`disco.optimizer._funnel`) draws on, and :func:`candidates`, one search's whole list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from disco import planner, search
from disco.ir.graph import HloGraph
from disco.optimizer._accuracy import source_of
from disco.optimizer._choice import PlanRow
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._prepare import Target
from disco.plans import baselines
from disco.plans.naming import content_name
from disco.plans.plan import FusionPlan

REPORTED_BASELINES = ("xla_default", "per_tensor", "horovod", "ddp")


class SearchSummary(NamedTuple):
    """What the simulated search did: its strategy, plans evaluated, time, and its
    (evaluations, elapsed seconds, best estimate) trace."""

    strategy: str
    evals: int
    evals_per_s: float
    seconds: float
    trace: tuple[tuple[int, float, float], ...]

    def __repr__(self) -> str:
        return (f"SearchSummary({self.strategy!r}, {self.evals} evals in {self.seconds:.1f} s, "
                f"{self.evals_per_s:.0f}/s, trace of {len(self.trace)} points)")


class Candidates(NamedTuple):
    """The plans to measure, predicted but not measured yet, in measuring order.

    Attributes:
      rows: xla_default, per_tensor, horovod, ddp, the best baseline by estimate, the
        ``even_<k>`` sweep, then the ``measure_top_k`` best searched plans (``disco_<rank>``)
        each followed by its bucket-only projection (``disco_<rank>_buckets``); a plan equal
        to an earlier row is left out.
      search: the search's summary.
    """

    rows: tuple[PlanRow, ...]
    search: SearchSummary

    def __repr__(self) -> str:
        return f"Candidates({len(self.rows)} rows, {self.search!r})"


def summary_of(result: Any) -> SearchSummary:
    """The :class:`SearchSummary` of one search's result."""
    return SearchSummary(result.strategy, result.evals, result.evals_per_s, result.elapsed_s, tuple(result.trace))


def candidates(target: Target, config: OptimizeConfig, progress: Progress = no_progress,
               predict: Predict | None = None) -> Candidates:
    """One search within ``config.budget_s`` and the plans it hands to measurement, in one list:
    the reported baselines, the best baseline by estimate, ``reduce_fusion`` (on CPU), the
    ``even_<k>`` sweep, the ``measure_top_k`` best searched plans, each with its bucket-only projection.

    :func:`disco.optimizer.funnel` measures only what its model ranks near the top of such a
    list, round after round; this is the list itself, every row predicted and none measured.

    Args:
      predict: plan -> (prediction, where it came from, the simulator's own time); default: the
        simulator's step time (the search then runs on it too).

    Reports phase "search".
    """
    sim = target.simulator
    by = source_of(getattr(target.costs, "name", type(target.costs).__name__))
    predict = predict or (lambda p: (sim.step_time(p), by, sim.step_time(p)))

    def on_step(evals: int, elapsed: float, best: float) -> None:
        progress("search", search.done_fraction(elapsed, config.budget_s, evals, config.max_evals),
                 f"{evals} plans, best {best * 1e3:.3f} ms (predicted)")

    result = planner.search_plans(target.graph, sim, config.strategy, budget_s=config.budget_s,
                                  max_evals=config.max_evals, seed=config.seed, on_step=on_step,
                                  cost=lambda p: predict(p)[0])
    rows: dict[str, PlanRow] = {}
    seen: set[str] = set()

    def add(name: str, kind: str, origin: str, plan: FusionPlan, found_as: str = "") -> None:
        if plan.digest() in seen or name in rows:
            return
        seen.add(plan.digest())
        rows[name] = predicted_row(name, kind, origin, plan.replace(name=name), predict, found_as)

    for name, kind, origin, plan in references(target, config, predict):
        add(name, kind, origin, plan)
    rank = 0
    for _, p in result.top:
        if rank >= config.measure_top_k:
            break
        if p.digest() in seen:
            continue
        rank += 1
        add(content_name(p), "search", f"searched from {p.name}", p, f"disco_{rank}")
        projected = bucket_projection(p) if config.measure_buckets_only else None
        if projected is not None:
            add(content_name(projected), "search", f"{content_name(p)} without its fusion groups", projected,
                f"disco_{rank}_buckets")
    return Candidates(tuple(rows.values()), summary_of(result))


# plan -> (prediction, where it came from, the simulator's own step time)
Predict = Callable[[FusionPlan], tuple[float, str, float]]


def predicted_row(name: str, kind: str, origin: str, plan: FusionPlan, predict: Predict,
                  found_as: str = "") -> PlanRow:
    """An unmeasured row of ``plan``, predicted now (before it is measured); ``found_as``: its name
    in the search's order (default: ``name``)."""
    value, by, simulated = predict(plan)
    return PlanRow(name, kind, origin, plan, value, predicted_by=by,
                   simulated_s=None if simulated == value else simulated, found_as=found_as or name)


def bucket_projection(plan: FusionPlan) -> FusionPlan | None:
    """``plan`` without its fusion groups (XLA fuses, its buckets stay), or None when it has none."""
    return plan.replace(groups=(), xla_fusion="extend") if plan.groups else None


def references(target: Target, config: OptimizeConfig, predict: Predict
               ) -> list[tuple[str, str, str, FusionPlan]]:
    """The plans every run considers besides the searched ones, as (name, kind, origin, plan):
    :data:`REPORTED_BASELINES`, the best baseline by prediction, ``reduce_fusion`` on CPU devices
    (``config.measure_reduce_fusion``), the ``even_<k>`` sweep (``config.bucket_sweep``)."""
    graph = target.graph
    base_plans = baselines.make_all(graph)
    predicted = {n: predict(p)[0] for n, p in base_plans.items()}
    best = planner.best_baseline_name(predicted)
    out = [(n, "baseline", n, base_plans[n]) for n in dict.fromkeys((*REPORTED_BASELINES, best))]
    if config.measure_reduce_fusion and jax.default_backend() == "cpu":
        p = reduce_fusion_row(graph, base_plans[best])
        if p is not None:
            out.append((p.name, "search", "each reduce fused with its elementwise producers", p))
    for k in dict.fromkeys(config.bucket_sweep):
        p = baselines.make("even", graph, k=k)
        out.append((p.name, "baseline", f"{k} buckets of equal bytes", p))
    return out


def reduce_fusion_row(graph: HloGraph, buckets_of: FusionPlan) -> FusionPlan | None:
    """:func:`disco.search.reduce_fusion`'s groups on ``buckets_of``'s buckets, named
    ``reduce_fusion`` (its groups with XLA's combiner where the two do not validate together);
    None for a graph without such groups."""
    groups = search.reduce_fusion(graph).groups
    if not groups:
        return None
    plan = buckets_of.replace(groups=groups, name="reduce_fusion")
    try:
        plan.validate(graph)
    except ValueError:
        plan = FusionPlan(groups=groups, name="reduce_fusion").validate(graph)
    return plan

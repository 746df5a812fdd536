"""The second step of ``optimize``: the simulated search, and the plans it hands to measurement
(the reported baselines, the bucket-count sweep, the best searched plans)."""

from __future__ import annotations

from typing import NamedTuple

import jax

from disco import planner, search
from disco.ir.graph import HloGraph
from disco.optimizer._accuracy import source_of
from disco.optimizer._choice import PlanRow
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._prepare import Target
from disco.plans import baselines
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


def candidates(target: Target, config: OptimizeConfig, progress: Progress = no_progress) -> Candidates:
    """Searches plans against the simulator within ``config.budget_s`` and picks what to measure.

    The bucket sweep is measured rather than simulated because the bucket count that wins on
    in-process CPU devices differs by model and is not what the simulator predicts
    (docs/archive/lab-notebook.md, "disco optimize across the zoo"). Reports phase "search".
    """
    graph, sim = target.graph, target.simulator

    def on_step(evals: int, elapsed: float, best: float) -> None:
        progress("search", search.done_fraction(elapsed, config.budget_s, evals, config.max_evals),
                 f"{evals} plans, best {best * 1e3:.3f} ms (simulated)")

    # the planner's search and baselines (the service's pipeline, which keeps the best predicted)
    result = planner.search_plans(graph, sim, config.strategy, budget_s=config.budget_s,
                                  max_evals=config.max_evals, seed=config.seed, on_step=on_step)
    base_plans, predicted = planner.simulate_baselines(graph, sim)
    by = source_of(getattr(target.costs, "name", type(target.costs).__name__))
    rows: dict[str, PlanRow] = {}
    seen: dict[str, str] = {}  # plan digest -> the row that measures it
    for name in (*REPORTED_BASELINES, planner.best_baseline_name(predicted)):
        p = base_plans[name]
        if name not in rows:
            rows[name] = PlanRow(name, "baseline", name, p.replace(name=name), predicted[name], predicted_by=by)
            seen.setdefault(p.digest(), name)
    if config.measure_reduce_fusion and jax.default_backend() == "cpu":
        p = reduce_fusion_row(graph, base_plans[planner.best_baseline_name(predicted)])
        if p is not None and p.digest() not in seen:
            seen[p.digest()] = p.name
            rows[p.name] = PlanRow(p.name, "search", "each reduce fused with its elementwise producers",
                                   p, sim.step_time(p), predicted_by=by)
    for k in dict.fromkeys(config.bucket_sweep):
        p = baselines.make("even", graph, k=k)
        if p.digest() not in seen:
            seen[p.digest()] = p.name
            rows[p.name] = PlanRow(p.name, "baseline", f"{k} buckets of equal bytes", p, sim.step_time(p),
                                    predicted_by=by)
    rank = 0
    for cost, p in result.top:
        if rank >= config.measure_top_k:
            break
        if p.digest() in seen:
            continue
        rank += 1
        name = f"disco_{rank}"
        seen[p.digest()] = name
        rows[name] = PlanRow(name, "search", f"searched from {p.name}", p.replace(name=name), cost,
                             predicted_by=by)
        projected = p.replace(groups=(), xla_fusion="extend")
        if config.measure_buckets_only and p.groups and projected.digest() not in seen:
            pname = f"{name}_buckets"
            seen[projected.digest()] = pname
            rows[pname] = PlanRow(pname, "search", f"{name} without its fusion groups",
                                  projected.replace(name=pname), sim.step_time(projected),
                                  predicted_by=by)
    summary = SearchSummary(result.strategy, result.evals, result.evals_per_s, result.elapsed_s,
                            tuple(result.trace))
    return Candidates(tuple(rows.values()), summary)


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

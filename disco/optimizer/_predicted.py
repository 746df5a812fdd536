"""``predict``: the answer for a cluster whose devices are not here, chosen by prediction alone.

``optimize`` measures plans on the devices of this process (or its worker processes). For a GPU
cluster planned from a machine without those GPUs (a CPU host, this project's CI) those
measurements are the CPU's: they say nothing about the cluster, and a correction fitted to them
would teach an H100 model CPU times. So for such a cluster the funnel stops before measurement:

1. :func:`~disco.optimizer.candidates`: one search on the emulated tier (the simulator over the
   cluster spec) and the plans it hands on: the reported baselines, the best baseline by prediction,
   the ``even_<k>`` sweep and the best searched plans with their bucket-only projections.
2. The compiled tier: every candidate (or, with ``config.compiled_top_k`` > 0, that many of the
   fastest by the emulated tier, and xla_default) is written into the step's pre-optimisation text
   and compiled by the real compiler for the cluster's device kind
   (:func:`xla_hooks.compile_for.plan_text_for`: deviceless XLA:GPU for an H100 cluster), and its
   module priced on the cluster (:func:`disco.sim.compiled.price`). Without the deviceless
   environment (``make install-gpu``) the emulated tier alone ranks, with a
   :class:`~xla_hooks.deviceless.DevicelessFallbackWarning`; a plan that does not compile drops out
   of the compiled ranking with a :class:`~disco.optimizer.CompiledStageWarning`.
3. The answer is the fastest plan by the most faithful tier that priced it (compiled, else emulated),
   reported as predicted, never as measured: the GPU job measures it, for instance with
   ``xla_hooks.jit(step, service=..., trials=n)``, which times the service's best plans in the job's
   first steps.

:func:`measures_here` says whether a cluster's plans can be measured in this process (its device kind
is this process's platform's); ``optimize`` refuses a cluster where it cannot.

Example::

    step, args = trax_models.make_train_step("mlp", "small", devices=8)
    result = predict(step, *args, cluster=preset("h100-sxm-8"), budget_s=30)
    print(result.chosen, result.tier, result.rows[0].compiled_s)
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from disco.optimizer._candidates import SearchSummary, candidates
from disco.optimizer._choice import PlanRow
from disco.optimizer._compiled import init, price_plans
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._prepare import Target, prepare, step_devices
from disco.plans.plan import FusionPlan, decisions
from disco.sim.cluster import ClusterSpec
from disco.sim.costs import CostModel

# plan -> its compiled module's text for the target's cluster (raises when the plan does not compile)
CompileFn = Callable[[FusionPlan], str]


def measures_here(cluster: ClusterSpec) -> bool:
    """Whether plans priced for ``cluster`` are measured on its device kind in this process: a CPU
    cluster on jax's CPU backend, a GPU cluster on a GPU backend (call it after jax has started)."""
    import jax

    local_cpu = jax.default_backend() == "cpu"
    return (cluster.device == "cpu") == local_cpu


class PredictedRow(NamedTuple):
    """One candidate, predicted and not measured.

    Attributes:
      name, kind, origin, plan: as :class:`~disco.optimizer.PlanRow`'s.
      emulated_s: the emulated tier's step time (the simulator over the cluster spec).
      compiled_s: the compiled tier's step time, or None (not compiled, or it failed: ``why``).
      compiled: the compiled tier's summary of the module (kernels, collectives, ...), or None.
      why: why the plan has no compiled price (None when it has one, or was not asked for one).
      found_as: its name in the search's order (:attr:`~disco.optimizer.PlanRow.found_as`).
    """

    name: str
    kind: str
    origin: str
    plan: FusionPlan
    emulated_s: float
    compiled_s: float | None = None
    compiled: Mapping[str, Any] | None = None
    why: str | None = None
    found_as: str = ""

    def predicted_s(self, tier: str) -> float | None:
        """The row's step time by ``tier`` ("compiled" or "emulated")."""
        return self.compiled_s if tier == "compiled" else self.emulated_s

    def to_dict(self, base: PredictedRow | None, tier: str) -> dict[str, Any]:
        mine, ref = self.predicted_s(tier), base.predicted_s(tier) if base is not None else None
        return {"name": self.name, "kind": self.kind, "origin": self.origin, "found_as": self.found_as or self.name,
                "plan_digest": self.plan.digest(),
                "plan_summary": self.plan.summary(), "decisions": list(decisions(self.plan)),
                "emulated_ms": self.emulated_s * 1e3,
                "compiled_ms": None if self.compiled_s is None else self.compiled_s * 1e3,
                "compiled": None if self.compiled is None else dict(self.compiled), "not_compiled": self.why,
                "speedup_vs_xla_default": ref / mine if mine and ref else None}

    def __repr__(self) -> str:
        cmp = "-" if self.compiled_s is None else f"{self.compiled_s * 1e3:.3f}"
        return f"PredictedRow({self.name!r}, {self.kind}, emulated {self.emulated_s * 1e3:.3f} ms, compiled {cmp} ms)"


@dataclasses.dataclass(frozen=True)
class PredictedResult:
    """The answer for a cluster whose devices are not here: every number simulated, none measured.

    Attributes:
      cluster: the cluster's name; device: its device kind.
      rows: the candidates, fastest first by ``tier``, then those ``tier`` did not price.
      chosen: the answer's row name; plan: its plan (named after the row).
      tier: "compiled" when the compiled tier priced xla_default (the answer is then a compiled
        module too: those rank first), else "emulated".
      tier_note: why the emulated tier ranked (None when the compiled one did).
      search: the search's summary; lower_bound_s: the simulator's lower bound for the graph.
    """

    cluster: str
    device: str
    rows: tuple[PredictedRow, ...]
    chosen: str
    plan: FusionPlan
    tier: str
    tier_note: str | None
    search: SearchSummary
    lower_bound_s: float

    def row(self, name: str) -> PredictedRow:
        return next(r for r in self.rows if r.name == name)

    @property
    def speedup(self) -> float:
        """The answer's predicted speedup over xla_default, by :attr:`tier`."""
        base, mine = self.row("xla_default").predicted_s(self.tier), self.row(self.chosen).predicted_s(self.tier)
        return base / mine if base and mine else 1.0

    def to_dict(self) -> dict[str, Any]:
        base = self.row("xla_default")
        return {"measured": False, "cluster": self.cluster, "device": self.device, "tier": self.tier,
                "tier_note": self.tier_note, "chosen": self.chosen, "plan": self.plan.summary(),
                "plan_json": self.plan.to_dict(), "predicted_speedup_vs_xla_default": self.speedup,
                "lower_bound_ms": self.lower_bound_s * 1e3,
                "search": {"strategy": self.search.strategy, "evals": self.search.evals,
                           "evals_per_s": self.search.evals_per_s, "elapsed_s": self.search.seconds},
                "rows": [r.to_dict(base, self.tier) for r in self.rows]}

    def __repr__(self) -> str:
        return (f"PredictedResult({self.chosen!r} on {self.cluster!r}, {self.tier} tier, "
                f"{self.speedup:.3f}x over xla_default predicted, {len(self.rows)} rows)")


def predict(step_fn: Callable[..., Any], *args: Any, cluster: ClusterSpec, costs: CostModel | None = None,
            config: OptimizeConfig | None = None, progress: Progress | None = None,
            compile_fn: CompileFn | None = None, **options: Any) -> PredictedResult:
    """The plan predicted fastest for ``cluster`` (the module doc's steps); nothing is measured.

    Args:
      step_fn, args: the training step and its example arguments, built for the cluster's device count.
      cluster: the cluster (its device kind need not be this machine's).
      costs: the cost model (default: the analytic model of the cluster's device kind).
      config: the options; used: ``budget_s``, ``max_evals``, ``strategy``, ``seed``, ``measure_top_k``
        (searched plans handed on), ``measure_buckets_only``, ``bucket_sweep``, ``compiled_top_k``.
      progress: reports phases "extract", "search", "compile".
      compile_fn: plan -> compiled module text (default: :func:`compiler` of the target).
      **options: :class:`OptimizeConfig` fields, applied over ``config``.

    Raises:
      ValueError: for a step built for another device count than the cluster's, or one disco cannot plan.
      TypeError: for an unknown option.
    """
    unknown = sorted(set(options) - set(OptimizeConfig.field_names()))
    if unknown:
        raise TypeError(f"predict: unknown options {unknown}; expected OptimizeConfig fields")
    # no reduce_fusion candidate: its fusion groups are a CPU measurement's reference, never a GPU plan
    config = dataclasses.replace(config or OptimizeConfig(), **{**options, "measure_reduce_fusion": False})
    report = progress or no_progress
    target = prepare(step_fn, args, cluster=cluster, costs=costs, progress=report)
    n = step_devices(target.graph, target.args)
    if n != cluster.num_devices:
        raise ValueError(f"predict: the step runs on {n} devices and cluster {cluster.name!r} has "
                         f"{cluster.num_devices}; build the step for {cluster.num_devices} devices (its module is "
                         "what the compiled tier compiles for the cluster)")
    cands = candidates(target, config, report)
    rows = [_emulated(r) for r in cands.rows]
    compile_fn, note = (compile_fn, None) if compile_fn is not None else compiler(target)
    if compile_fn is not None:
        rows = _compiled(rows, compile_fn, target, config.compiled_top_k, report)
    priced = [r for r in rows if r.compiled_s is not None]
    tier = "compiled" if any(r.name == "xla_default" for r in priced) else "emulated"
    if tier == "emulated" and note is None:
        base = next(r for r in rows if r.name == "xla_default")
        note = "the compiled tier priced no xla_default: " + (base.why or "not compiled")
    ranked = sorted(rows, key=lambda r: (r.predicted_s(tier) is None, r.predicted_s(tier) or 0.0))
    best = ranked[0]
    return PredictedResult(cluster.name, cluster.device, tuple(ranked), best.name,
                           best.plan.replace(name=best.name), tier, note, cands.search,
                           target.simulator.lower_bound())


def compiler(target: Target) -> tuple[CompileFn | None, str | None]:
    """(plan -> the module the real compiler builds for ``target``'s cluster, None) where one runs here,
    else (None, why not): deviceless XLA:GPU for a GPU kind needs the ``.venv-gpu`` environment."""
    from xla_hooks import compile_for, deviceless

    cluster = target.cluster
    problem = compile_for.unavailable(cluster.device)
    if problem is not None:
        why = f"the emulated tier alone ranks the plans for {cluster.name!r}: {problem}"
        warnings.warn(why, deviceless.DevicelessFallbackWarning, stacklevel=3)
        return None, why
    if target.text is None:
        raise ValueError("predict's compiled tier: the target holds no HLO text (built from a graph alone); "
                         "expected one from disco.optimizer.prepare")
    return compile_for.plan_compiler(target.text, device=cluster.device, devices=cluster.num_devices), None


def _emulated(row: PlanRow) -> PredictedRow:
    return PredictedRow(row.name, row.kind, row.origin, row.plan, row.predicted_s, found_as=row.found_as)


def _compiled(rows: list[PredictedRow], compile_fn: CompileFn, target: Target, top_k: int,
              progress: Progress) -> list[PredictedRow]:
    """``rows`` with compiled prices: all of them, or with ``top_k`` > 0 the ``top_k`` fastest by the
    emulated tier and xla_default. A plan that does not compile keeps its emulated price and says why
    (:func:`disco.optimizer._compiled.price_plans`, the funnel's compiled stage's rule)."""
    from disco.planner._compiled import pricer
    from disco.sim import compiled

    order = sorted(rows, key=lambda r: r.emulated_s)
    names = {r.name for r in (order[:top_k] if top_k > 0 else order)} | {"xla_default"}
    asked = [r for r in rows if r.name in names]
    price_plan = pricer(compile_fn, target.costs, target.cluster)
    done = [0]

    def price(plan: FusionPlan) -> compiled.CompiledStep:
        progress("compile", done[0] / len(asked), f"compiling {plan.name} for {target.cluster.name}")
        done[0] += 1
        return price_plan(plan)

    prices = price_plans(init(), [r.plan for r in asked], price)
    progress("compile", 1.0, f"{len(asked)} plans compiled for {target.cluster.name}")
    out = []
    for r in rows:
        digest = r.plan.digest()
        if r.name not in names:
            out.append(r)
        elif digest in prices.steps:
            step = prices.steps[digest]
            out.append(r._replace(compiled_s=step.step_time_s, compiled=step.summary()))
        else:
            out.append(r._replace(why=prices.failed[digest]))
    return out

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
   Besides the search's candidates, the baselines sized for the cluster: ``saturating`` (gradient
   buckets sized to saturate its link) and, on a GPU cluster, ``maxtext`` (MaxText's combine
   thresholds and loop passes as compile options), when the graph has collectives they change; and,
   on a GPU cluster whose step loops over collectives, the emulated tier's fastest row with XLA:GPU's
   loop passes on (:func:`loop_pass_rows`: the collective pipeliner, double-buffered loops). Those
   passes only the compiled tier models: an emulated price of a row carrying them is the price
   without them (so the variant row is made only where the compiled tier runs).
3. Peak memory per row, bytes per device (:attr:`PredictedRow.peak_memory_bytes`, where it came
   from in :attr:`~PredictedRow.memory_from`): the compiled tier's compile reports XLA's memory
   analysis of the executable it built (deviceless XLA:GPU's buffer assignment for an H100,
   ``"xla"``), or, for a module that came without one (a ``compile_fn`` that returns text), an
   estimate from the compiled module's buffers (:data:`disco.sim.module_memory.SOURCE`). Where no
   compiled tier runs, each candidate is compiled on this process's CPU devices for its memory
   alone (``"xla-cpu"``: XLA:CPU's buffer assignment, the plan's GPU compile options left out; not
   the GPU's figure: XLA:CPU fuses and schedules otherwise). A row above the limit (the lesser of
   the cluster's ``device_memory_bytes`` and ``config.memory_limit``) is never the answer; its
   :attr:`~PredictedRow.over_memory` says why. XLA's default is never left out: it is the step as
   written.
4. The answer is the fastest plan within the memory limit by the most faithful tier that priced it
   (compiled, else emulated), reported as predicted, never as measured: the GPU job measures it, for
   instance with ``xla_hooks.jit(step, service=..., trials=n)``, which times the service's best
   plans in the job's first steps.

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
from disco.optimizer._choice import PlanRow, over_memory
from disco.optimizer._compiled import init, price_plans
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._prepare import Target, prepare, step_devices
from disco.plans.plan import FusionPlan, decisions
from disco.sim.cluster import ClusterSpec
from disco.sim.costs import CostModel

# plan -> its compiled module for the cluster: its text, or an xla_hooks.compile_for.CompiledModule (the
# text with its peak memory); raises when the plan does not compile
CompileFn = Callable[[FusionPlan], Any]
CPU_MEMORY = "xla-cpu"  # memory_from of a row whose peak is XLA:CPU's, compiled here (no compiled tier)


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
      peak_memory_bytes: the step's peak device memory per device with the plan, predicted (the
        module doc's step 3), or None (not compiled, or its compile failed).
      memory_from: where ``peak_memory_bytes`` came from: ``"xla"`` (XLA's memory analysis of the
        executable the compiled tier built: XLA:GPU's for a GPU cluster), ``"module-estimate"`` (the
        compiled module's buffers), ``"xla-cpu"`` (XLA:CPU's analysis, where no compiled tier ran);
        None without a peak.
      over_memory: why the row is never the answer for memory (its peak above the limit, both
        numbers), or None: it fits, no limit is known, or it is xla_default.
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
    peak_memory_bytes: int | None = None
    memory_from: str | None = None
    over_memory: str | None = None

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
                "speedup_vs_xla_default": ref / mine if mine and ref else None,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_from": self.memory_from,
                "over_memory": self.over_memory}

    def __repr__(self) -> str:
        cmp = "-" if self.compiled_s is None else f"{self.compiled_s * 1e3:.3f}"
        over = "" if self.over_memory is None else ", over memory"
        return (f"PredictedRow({self.name!r}, {self.kind}, emulated {self.emulated_s * 1e3:.3f} ms, compiled {cmp} ms"
                f", peak {self.peak_memory_bytes} bytes{over})")


@dataclasses.dataclass(frozen=True)
class PredictedResult:
    """The answer for a cluster whose devices are not here: every number simulated, none measured.

    Attributes:
      cluster: the cluster's name; device: its device kind.
      rows: the candidates, fastest first by ``tier``, then those ``tier`` did not price.
      chosen: the answer's row name (the fastest row within the memory limit); plan: its plan (named
        after the row).
      tier: "compiled" when the compiled tier priced xla_default (the answer is then a compiled
        module too: those rank first), else "emulated".
      tier_note: why the emulated tier ranked (None when the compiled one did).
      search: the search's summary; lower_bound_s: the simulator's lower bound for the graph.
      memory_limit: the limit rows are held to, bytes per device (the lesser of the cluster's
        ``device_memory_bytes`` and ``config.memory_limit``; None: neither known).
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
    memory_limit: int | None = None

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
                "lower_bound_ms": self.lower_bound_s * 1e3, "memory_limit_bytes": self.memory_limit,
                "over_memory": [r.name for r in self.rows if r.over_memory is not None],
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
        (searched plans handed on), ``measure_buckets_only``, ``bucket_sweep``, ``compiled_top_k``,
        ``memory_limit`` (with the cluster's ``device_memory_bytes``: the limit rows are held to).
      progress: reports phases "extract", "search", "compile".
      compile_fn: plan -> the compiled module's text, or an :class:`xla_hooks.compile_for.CompiledModule`
        (its text with its peak memory; a text's peak is estimated from its buffers); default:
        :func:`compiler` of the target.
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
    rows += cluster_baselines(target, {r.plan.digest() for r in rows} | {r.name for r in rows})
    compile_fn, note = (compile_fn, None) if compile_fn is not None else compiler(target)
    if compile_fn is not None:
        rows += loop_pass_rows(target, rows)
        rows = _compiled(rows, compile_fn, target, config.compiled_top_k, report)
    priced = [r for r in rows if r.compiled_s is not None]
    tier = "compiled" if any(r.name == "xla_default" for r in priced) else "emulated"
    if tier == "emulated" and note is None:
        base = next(r for r in rows if r.name == "xla_default")
        note = "the compiled tier priced no xla_default: " + (base.why or "not compiled")
    if compile_fn is None:
        rows = _cpu_memory(rows, target, report)
    limit = config.limit_for(cluster.device_memory_bytes)
    rows = [r if r.name == "xla_default" else r._replace(over_memory=_over(r, limit)) for r in rows]
    ranked = sorted(rows, key=lambda r: (r.predicted_s(tier) is None, r.predicted_s(tier) or 0.0))
    best = next(r for r in ranked if r.over_memory is None)  # xla_default always is
    return PredictedResult(cluster.name, cluster.device, tuple(ranked), best.name,
                           best.plan.replace(name=best.name), tier, note, cands.search,
                           target.simulator.lower_bound(), limit)


def cluster_baselines(target: Target, seen: set[str]) -> list[PredictedRow]:
    """The baselines sized for ``target``'s cluster, as emulated rows: ``saturating`` when the graph has
    all-reduces, and on a GPU cluster ``maxtext`` when it has all-reduces, all-gathers or
    reduce-scatters (the collectives its thresholds combine); a plan whose name or digest is in
    ``seen`` (an earlier row's) is left out."""
    from disco.plans import baselines
    from disco.sim.cluster_spec import backend_of

    graph, cluster = target.graph, target.cluster
    kinds = {n.opcode.removesuffix("-start") for n in graph.nodes if n.is_collective}
    wanted = []
    if "all-reduce" in kinds:
        wanted.append(baselines.make("saturating", graph, cluster=cluster))
    if backend_of(cluster.device) == "gpu" and kinds & {"all-reduce", "all-gather", "reduce-scatter"}:
        wanted.append(baselines.make("maxtext", graph))
    out = []
    for plan in wanted:
        if plan.name in seen or plan.digest() in seen:
            continue
        seen |= {plan.name, plan.digest()}
        out.append(PredictedRow(plan.name, "baseline", plan.name, plan, target.simulator.step_time(plan)))
    return out


def loops_hold_collectives(graph: Any) -> bool:
    """Whether a ``while`` loop of ``graph`` (or a loop nested in one) runs a collective each iteration."""
    return any(any(n.is_collective for n in loop.body.nodes) or loops_hold_collectives(loop.body)
               for loop in graph.loops)


def loop_pass_rows(target: Target, rows: list[PredictedRow]) -> list[PredictedRow]:
    """On a GPU cluster whose step loops over collectives (``scan`` over layers gathering each layer's
    shards, a micro-batch loop), the emulated tier's fastest row again with XLA:GPU's loop passes on
    (:data:`disco.plans.baselines.MAXTEXT_LOOP_PASSES`: each collective pipelined across iterations,
    double-buffered loops), named ``<row>+loop_passes``: a row only the compiled tier prices (the emulated
    tier does not model those passes, so its emulated price is its source row's). None otherwise, or
    when the fastest row sets one of those options itself."""
    from disco.plans import baselines
    from disco.plans import options as plan_options
    from disco.sim.cluster_spec import backend_of

    if backend_of(target.cluster.device) != "gpu" or not loops_hold_collectives(target.graph) or not rows:
        return []
    best = min(rows, key=lambda r: r.emulated_s)
    if set(dict(best.plan.compile_options)) & set(plan_options.LOOP_PASSES):
        return []
    name = f"{best.name}+loop_passes"
    options = tuple(sorted({**dict(best.plan.compile_options), **baselines.MAXTEXT_LOOP_PASSES}.items()))
    plan = best.plan.replace(compile_options=options, name=name)
    return [PredictedRow(name, best.kind, f"{best.name} with XLA:GPU's loop passes on", plan, best.emulated_s)]


def _over(row: PredictedRow, limit: int | None) -> str | None:
    why = over_memory(row.peak_memory_bytes, limit)
    if why is None:
        return None
    source = {"xla": "XLA's memory analysis of its compiled step",
              CPU_MEMORY: "XLA:CPU's memory analysis of the plan compiled here, an estimate of the cluster's"
              }.get(row.memory_from or "", "estimated from its compiled module's buffers")
    return why.replace("XLA's memory analysis of its compiled step", f"predicted: {source}")


def _cpu_memory(rows: list[PredictedRow], target: Target, progress: Progress) -> list[PredictedRow]:
    """``rows`` with XLA:CPU's peak memory of each plan compiled on this process's CPU devices (the
    plan's compile options left out: they are the cluster's compiler's), where no compiled tier
    ran; a plan that does not compile here, or a process with too few CPU devices, keeps None."""
    import jax

    from xla_hooks import compile_for

    n = target.cluster.num_devices
    if target.text is None or len(jax.devices("cpu")) < n:
        return rows
    peaks: dict[str, int | None] = {}
    out = []
    for i, r in enumerate(rows):
        plan = r.plan.replace(compile_options=(), name="")
        digest = plan.digest()
        if digest not in peaks:
            progress("compile", i / len(rows), f"compiling {r.name} on this CPU for its memory")
            try:
                peaks[digest] = compile_for.plan_module_for(target.text, plan, device="cpu", devices=n).memory.peak
            except Exception:  # noqa: BLE001 - a plan that does not compile here has no memory figure
                peaks[digest] = None
        peak = peaks[digest]
        out.append(r if peak is None else r._replace(peak_memory_bytes=peak, memory_from=CPU_MEMORY))
    progress("compile", 1.0, f"{len(peaks)} plans compiled on this CPU for their memory")
    return out


def compiler(target: Target) -> tuple[CompileFn | None, str | None]:
    """(plan -> the module the real compiler builds for ``target``'s cluster, with its executable's memory
    analysis (:func:`xla_hooks.compile_for.plan_module_compiler`), None) where one runs here, else
    (None, why not): deviceless XLA:GPU for a GPU kind needs the ``.venv-gpu`` environment."""
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
    return compile_for.plan_module_compiler(target.text, device=cluster.device, devices=cluster.num_devices), None


def _emulated(row: PlanRow) -> PredictedRow:
    return PredictedRow(row.name, row.kind, row.origin, row.plan, row.predicted_s, found_as=row.found_as)


def _compiled(rows: list[PredictedRow], compile_fn: CompileFn, target: Target, top_k: int,
              progress: Progress) -> list[PredictedRow]:
    """``rows`` with compiled prices: all of them, or with ``top_k`` > 0 the ``top_k`` fastest by the
    emulated tier, xla_default and the rows with options only the compiled tier prices. A plan that does not compile keeps its emulated price and says why
    (:func:`disco.optimizer._compiled.price_plans`, the funnel's compiled stage's rule)."""
    from disco.sim import compiled, module_memory
    from disco.sim.cluster_spec import backend_of

    from disco.plans import options as plan_options

    order = sorted(rows, key=lambda r: r.emulated_s)
    names = {r.name for r in (order[:top_k] if top_k > 0 else order)} | {"xla_default"} | {
        r.name for r in rows if plan_options.compiled_only(r.plan.compile_options)}  # the emulated tier cannot rank them
    asked = [r for r in rows if r.name in names]
    backend = backend_of(target.cluster.device)
    memory: dict[str, tuple[int, str | None]] = {}  # digest -> (peak bytes, where it came from)
    done = [0]

    def price(plan: FusionPlan) -> compiled.CompiledStep:
        progress("compile", done[0] / len(asked), f"compiling {plan.name} for {target.cluster.name}")
        done[0] += 1
        module = compile_fn(plan)
        text = module if isinstance(module, str) else module.text
        step = compiled.price(text, target.costs, target.cluster, backend=backend)
        if isinstance(module, str) or module.memory is None:
            try:
                memory[plan.digest()] = (module_memory.estimate(text).peak, module_memory.SOURCE)
            except ValueError:  # a module the estimate cannot read: priced, with no memory figure
                pass
        else:
            memory[plan.digest()] = (module.memory.peak, module.memory_from)
        return step

    prices = price_plans(init(), [r.plan for r in asked], price)
    progress("compile", 1.0, f"{len(asked)} plans compiled for {target.cluster.name}")
    out = []
    for r in rows:
        digest = r.plan.digest()
        if r.name not in names:
            out.append(r)
        elif digest in prices.steps:
            step = prices.steps[digest]
            peak, source = memory.get(digest, (None, None))
            out.append(r._replace(compiled_s=step.step_time_s, compiled=step.summary(), peak_memory_bytes=peak,
                                  memory_from=source))
        else:
            out.append(r._replace(why=prices.failed[digest]))
    return out

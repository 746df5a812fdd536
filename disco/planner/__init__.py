"""Choosing a plan for one graph on one cluster: disco's search, or the best baseline.

:func:`plan_for_graph` is what the service's workers and ``xla_hooks.jit`` (without a
service) call. Every baseline of :mod:`disco.plans.baselines` is simulated first. Then,
by ``options["strategy"]``:

- "auto": :func:`disco.search.run` with its best-first strategy within ``budget_s``
  (and ``max_evals`` simulated plans, where given);
- a strategy of ``disco.search.STRATEGIES`` ("best_first", "annealing", "greedy");
- "baselines": the fastest baseline by simulated step time;
- "random": the fastest of the baselines and random valid plans tried within ``budget_s``
  (and ``max_evals`` random plans, where given).

A plan slower (simulated) than the best baseline is never handed out. The report
lists the method, the simulated time of every baseline and of the plan, the lower
bound and the cost model.

``options["tier"]`` says which tier of the simulator ranks the answer: None or "emulated" (the
search's own, XLA's fusion emulated), or "compiled": the search's answer, XLA's default and the
baselines are compiled by the caller's ``compile_fn`` (the real compiler for the cluster's device,
deviceless XLA:GPU for an H100 cluster) and the fastest compiled module is the answer
(:mod:`disco.planner._compiled`). The report's ``tier`` says which ranked it.

Example:
  >>> plan, report = plan_for_graph(graph, preset("local", devices=4), {"budget_s": 1})  # doctest: +SKIP
  >>> report["method"], report["plan_ms"]                                               # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.sim.costs import CostModel
    from disco.ir.graph import HloGraph
    from disco.plans.plan import FusionPlan

ProgressFn = Callable[[float, str], None]


class Cancelled(Exception):
    """Raised by a progress callback to stop planning (e.g. past a deadline); never swallowed."""
BUILTIN_STRATEGIES = ("auto", "baselines", "random")
DEFAULT_OPTIONS: dict[str, Any] = {"budget_s": 10.0, "strategy": "auto", "seed": 0, "max_evals": None,
                                   "tier": None}
TIERS = ("emulated", "compiled")  # options["tier"]; None is "emulated"
COMPILED_CANDIDATES = 8  # plans the compiled tier compiles per request (xla_default, the answer, baselines)
MAX_TIMELINE_EVENTS = 20000


def default_costs(device: str = "cpu") -> CostModel:
    """The cost model the service prices plans with: the analytic model of the cluster's device kind.

    Raises:
      ValueError: for an unknown device kind.
    """
    from disco.sim.costs import device_costs

    return device_costs.analytic(device)


def cost_model_id(costs: CostModel) -> dict[str, str]:
    """What identifies a cost model in a plan key: kind, version and parameter digest."""
    return {"name": costs.name, "version": str(costs.version), "digest": costs.digest()}


def best_baseline_name(simulated: Mapping[str, float]) -> str:
    """The fastest baseline by simulated step time; on a tie, ``xla_default`` (else the first named).

    The one rule for "the best baseline": the service's plans never fall below it and
    ``disco.optimize`` measures it.

    Args:
      simulated: simulated step seconds by baseline name.

    Raises:
      ValueError: when ``simulated`` is empty.
    """
    if not simulated:
        raise ValueError("best_baseline_name: expected simulated times of one or more baselines, got none")
    return min(simulated, key=lambda n: (simulated[n], n != "xla_default"))


def cluster_digest(cluster: ClusterSpec) -> str:
    """A hash of what the simulator reads from ``cluster`` (free-text fields left out)."""
    d = cluster.to_dict()
    d.pop("description", None)
    d.pop("label", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def plan_key(fingerprint: str, cluster: ClusterSpec, costs: CostModel, options: Mapping[str, Any],
             environment: Mapping[str, Any] | None = None) -> str:
    """The cache key of a plan request: sha256 of (graph, cluster, cost model, options, environment).

    ``environment`` is the job's side of the key (``xla_hooks.environment.CompileEnvironment``:
    jax and jaxlib versions, platform and device kind, processes and devices per process, XLA
    flags), as jax's persistent compilation cache keys an executable. None (a request that names
    none) leaves it out, and options set to None (not given) are left out, so the plans stored
    before either existed keep their keys.
    """
    given = {k: v for k, v in options.items() if v is not None}
    parts: dict[str, Any] = {"graph": fingerprint, "cluster": cluster_digest(cluster),
                             "costs": cost_model_id(costs), "options": given}
    if environment is not None:
        parts["environment"] = dict(environment)
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def strategies() -> tuple[str, ...]:
    """The strategies a request may name: the built-in ones and those of ``disco.search``."""
    from disco import search

    return BUILTIN_STRATEGIES + tuple(s for s in search.STRATEGIES if s not in BUILTIN_STRATEGIES)


def simulate_baselines(graph: HloGraph, sim: Any, on_each: Callable[[int, int, str], None] | None = None
                       ) -> tuple[dict[str, FusionPlan], dict[str, float]]:
    """Every baseline of :mod:`disco.plans.baselines` for ``graph`` and its simulated step seconds
    (``sim.step_time``): what both the planner and ``disco.optimize`` start from.
    ``on_each(i, n, name)`` is called after each."""
    from disco.plans import baselines

    plans = baselines.make_all(graph)
    simulated: dict[str, float] = {}
    for i, (name, plan) in enumerate(plans.items()):
        simulated[name] = sim.step_time(plan)
        if on_each is not None:
            on_each(i, len(plans), name)
    return plans, simulated


def search_plans(graph: HloGraph, sim: Any, strategy: str, *, budget_s: float, max_evals: int | None, seed: int,
                 on_step: Callable[[int, float, float], None] | None = None,
                 cost: Callable[[Any], float] | None = None) -> Any:
    """:func:`disco.search.run` of ``strategy`` ("auto": the search's best-first strategy, the
    Disco paper's) on ``sim.step_time``, or on ``cost`` (``disco.optimize``'s corrected model) from
    the same start plans and on the simulator's backend: the search both the planner and
    ``disco.optimize`` run. ``on_step(evals, elapsed_s, best_s)`` reports its progress."""
    from disco import search
    from disco.plans import moves

    name = "best_first" if strategy == "auto" else strategy
    # the start plans and the backend come from the simulator whatever the cost: search.run finds
    # them itself only when the cost is a simulator's bound method
    starts = None if cost is None else search.default_starts(graph, sim, moves.context(graph, sim.backend))
    return search.run(search.make(name), graph, cost or sim.step_time, budget_s=budget_s, max_evals=max_evals,
                      seed=seed, starts=starts, progress=on_step, backend=sim.backend)


def _call_search(mod: Any, graph: HloGraph, sim: Any, options: Mapping[str, Any],
                 progress: ProgressFn) -> tuple[FusionPlan, dict[str, Any]]:
    """:func:`search_plans` with the request's options; (the best plan, what the search did)."""
    budget = float(options["budget_s"])
    max_evals = options["max_evals"]

    def on_step(evals: int, elapsed: float, best: float) -> None:
        progress(mod.done_fraction(elapsed, budget, evals, max_evals),
                 f"{evals} plans evaluated, best {best * 1e3:.4f} ms (simulated)")

    result = search_plans(graph, sim, options["strategy"], budget_s=budget, max_evals=max_evals,
                          seed=int(options["seed"]), on_step=on_step)
    info = {"strategy": result.strategy, "evals": result.evals, "elapsed_s": result.elapsed_s,
            "evals_per_s": result.evals_per_s, "best_ms": result.best_cost * 1e3,
            "start_ms": {k: v * 1e3 for k, v in result.start_costs.items()}}
    return result.best_plan, info


def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` over :data:`DEFAULT_OPTIONS`, checked as :func:`plan_for_graph` checks them.

    Raises:
      ValueError: naming the first option that is unknown or not what the planner expects.
    """
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"options: expected a mapping of planner options, got {type(options).__name__}")
    opts = {**DEFAULT_OPTIONS, **dict(options or {})}
    _check_options(opts)
    return opts


def _check_options(opts: Mapping[str, Any]) -> None:
    """Raises ValueError naming the first option that is not what the planner expects."""
    unknown = sorted(set(opts) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ValueError(f"options: unknown keys {unknown}; expected some of {sorted(DEFAULT_OPTIONS)}")
    if opts["strategy"] not in strategies():
        raise ValueError(f"options.strategy: expected one of {', '.join(strategies())}, got {opts['strategy']!r}")
    from disco import search

    search.check_budgets(opts["budget_s"], opts["max_evals"], where="options.")
    seed = opts["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"options.seed: expected an integer >= 0, got {seed!r}")
    if opts["tier"] is not None and opts["tier"] not in TIERS:
        raise ValueError(f"options.tier: expected one of {', '.join(TIERS)} (or null: emulated), got {opts['tier']!r}")


def plan_for_graph(
    graph: HloGraph,
    cluster: ClusterSpec,
    options: Mapping[str, Any] | None = None,
    progress_cb: ProgressFn | None = None,
    *,
    costs: CostModel | None = None,
    compile_fn: Callable[[FusionPlan], str] | None = None,
    compile_limit: int = COMPILED_CANDIDATES,
) -> tuple[FusionPlan, dict[str, Any]]:
    """Chooses a plan for ``graph`` on ``cluster``.

    Args:
      graph: the step's pre-optimisation HLO graph.
      cluster: the cluster to plan for.
      options: ``budget_s`` (seconds the search may take, default 10), ``strategy``
        ("auto": the search's best-first strategy; "baselines";
        "random": best of baselines and random valid plans within the budget; or a
        strategy of ``disco.search``), ``seed``, ``max_evals`` (also stop after this
        many simulated plans; a search that stops there gives the same plan every time),
        ``tier`` (None or "emulated"; "compiled" needs ``compile_fn``).
      progress_cb: called as ``progress_cb(fraction, message)``; it may raise
        :class:`Cancelled` (or a subclass) to stop planning.
      costs: the cost model (default :func:`default_costs` of the cluster's device kind).
      compile_fn: for tier "compiled", plan -> the module the real compiler builds for ``cluster``
        with the plan applied (``xla_hooks.compile_for.plan_compiler``).
      compile_limit: how many plans the compiled tier compiles.

    Returns:
      ``(plan, report)``: the plan (validated against ``graph``) and a JSON-able report:
      method, strategy, tier, cost model, cluster, simulated ms of every baseline and of the
      plan, the lower bound, elapsed seconds; with the compiled tier, its prices
      (:func:`disco.planner._compiled.choose`).

    Raises:
      ValueError: for unknown options, tier "compiled" without ``compile_fn``, or a graph the
        simulator cannot price.
      Cancelled: from ``progress_cb``.
    """
    from disco import search
    from disco.sim.simulator import Simulator

    opts = check_options(options)
    compiled_tier = opts["tier"] == "compiled"
    if compiled_tier and compile_fn is None:
        raise ValueError("options.tier 'compiled': expected a compile_fn (the real compiler for the cluster's device, "
                         "e.g. xla_hooks.compile_for.plan_compiler of the step's HLO text), got none")
    progress = progress_cb or (lambda frac, msg: None)
    # the search's share of the progress bar: the compiles take the rest
    share = 0.5 if compiled_tier else 0.85
    costs = costs or default_costs(cluster.device)
    t0 = time.perf_counter()
    progress(0.0, "simulating baselines")
    sim = Simulator(graph, costs, cluster)
    candidates, simulated = simulate_baselines(
        graph, sim, lambda i, n, name: progress(0.1 * (i + 1) / n, f"simulated baseline {name}"))
    best_baseline = best_baseline_name(simulated)
    info: dict[str, Any] = {}
    if opts["strategy"] not in ("baselines", "random"):
        method = "search"  # the search's own strategy name is in report["search"]["strategy"]
        try:
            plan, info = _call_search(search, graph, sim, opts, lambda frac, msg: progress(0.1 + share * frac, msg))
            plan.validate(graph, sim.backend)
        except Cancelled:
            raise
        except Exception as e:  # noqa: BLE001 - a failing search still leaves the best baseline
            method, plan = "baselines", candidates[best_baseline]
            info = {"error": f"disco.search failed, best baseline used: {type(e).__name__}: {e}"}
    elif opts["strategy"] == "random":
        method = "random"
        plan, info = _random_search(graph, sim, candidates[best_baseline], simulated[best_baseline], opts,
                                    progress, share)
    else:
        method = "baselines"
        plan = candidates[best_baseline]
    plan_s = sim.step_time(plan)
    if plan_s > simulated[best_baseline]:  # never hand out a plan slower than a baseline
        method, plan, plan_s = f"{method}->baseline", candidates[best_baseline], simulated[best_baseline]
    lower = sim.lower_bound()
    report = {
        "method": method,
        "strategy": opts["strategy"],
        "tier": "emulated",
        "options": opts,
        "chosen": plan.name or plan.digest(),
        "best_baseline": best_baseline,
        "plan_ms": plan_s * 1e3,
        "baselines_ms": {n: t * 1e3 for n, t in simulated.items()},
        "lower_bound_ms": lower * 1e3,
        "speedup_vs_xla_default": simulated["xla_default"] / plan_s if plan_s > 0 else 1.0,
        "cost_model": cost_model_id(costs),
        "cluster": {"name": cluster.name, "devices": cluster.num_devices, "digest": cluster_digest(cluster)},
        "graph": {"name": graph.name, "fingerprint": graph.fingerprint, "nodes": len(graph.nodes),
                  "all_reduces": len(graph.all_reduces())},
        "plan_summary": plan.summary(),
        "search": _jsonable(info),
    }
    if compiled_tier:
        from disco.planner import _compiled

        assert compile_fn is not None
        plan, report = _compiled.choose(graph, plan, report, _compiled.pricer(compile_fn, costs, cluster),
                                        limit=compile_limit,
                                        progress=lambda frac, msg: progress(0.1 + share + (0.9 - share) * frac, msg))
    progress(1.0, "done")
    report["elapsed_s"] = time.perf_counter() - t0
    return plan, report


def candidates(graph: HloGraph, plan: FusionPlan, report: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """The ``n`` plans a job should measure, predicted best first: ``plan`` (the planner's answer),
    then the baselines by the simulated times in ``report["baselines_ms"]``, each plan once; after
    the compiled tier ranked them (``report["tier"] == "compiled"``), its candidates in its order.

    A job that runs trials (``xla_hooks.jit(..., trials=n)``) compiles and measures these; the
    baselines are rebuilt from ``graph`` (deterministic), so the report holds their times only.

    Args:
      graph: the step's graph; plan, report: :func:`plan_for_graph`'s answer for it.
      n: how many (at least 1).

    Returns:
      ``[{"name", "predicted_ms", "plan"}]``: at most ``n`` entries, ``plan`` as its JSON.

    Raises:
      ValueError: ``n`` below 1.
    """
    from disco.plans import baselines

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"candidates: expected a count >= 1, got {n!r}")
    if report.get("tier") == "compiled":
        return [dict(c) for c in report["candidates"][:n]]
    simulated = dict(report.get("baselines_ms") or {})
    out = [{"name": plan.name or plan.digest(), "predicted_ms": float(report.get("plan_ms", 0.0)),
            "plan": plan.to_dict()}]
    seen = {plan.digest()}
    for name in sorted(simulated, key=lambda b: (simulated[b], b != "xla_default", b)):
        if len(out) >= n:
            break
        other = baselines.make(name, graph)
        if other.digest() in seen:
            continue
        seen.add(other.digest())
        out.append({"name": name, "predicted_ms": float(simulated[name]), "plan": other.to_dict()})
    return out


def _random_search(graph: HloGraph, sim: Any, best: FusionPlan, best_s: float, opts: Mapping[str, Any],
                   progress: ProgressFn, share: float) -> tuple[FusionPlan, dict[str, Any]]:
    """Random valid plans (on a GPU cluster without fusion groups) until the budget runs out; the
    fastest by simulated time wins."""
    from disco import search
    from disco.plans.random_plans import random_plan

    budget = float(opts["budget_s"])
    max_evals = opts["max_evals"]
    t0 = time.perf_counter()
    tried = 0
    seed = int(opts["seed"])
    while time.perf_counter() - t0 < budget and (max_evals is None or tried < max_evals):
        plan = random_plan(graph, seed + tried, groups=sim.backend != "gpu")  # XLA:GPU takes no groups
        tried += 1
        t = sim.step_time(plan)
        if t < best_s:
            best, best_s = plan, t
        progress(0.1 + share * search.done_fraction(time.perf_counter() - t0, budget, tried, max_evals),
                 f"random plans tried: {tried}")
    return best, {"random_plans_tried": tried}


def timeline(graph: HloGraph, cluster: ClusterSpec, plan: FusionPlan, costs: CostModel | None = None,
             limit: int = MAX_TIMELINE_EVENTS) -> list[list[Any]]:
    """The simulated timeline of ``plan`` as ``[name, stream, start_ms, end_ms]`` rows.

    Longer timelines keep the ``limit`` longest events (enough to draw the picture).
    """
    from disco.sim.simulator import Simulator

    events = Simulator(graph, costs or default_costs(cluster.device), cluster).run(plan).timeline
    if len(events) > limit:
        events = sorted(sorted(events, key=lambda e: e.end - e.start, reverse=True)[:limit],
                        key=lambda e: e.start)
    return [[e.name, e.stream, e.start * 1e3, e.end * 1e3] for e in events]


def _jsonable(obj: Any) -> Any:
    try:
        return json.loads(json.dumps(obj, default=str))
    except (TypeError, ValueError):
        return str(obj)

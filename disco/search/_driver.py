"""The search driver: runs a strategy against a time or evaluation budget."""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from disco.plans.plan import FusionPlan
from disco.search._base import Evaluate, Strategy, problem as make_problem
from disco.search._starts import default_starts

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph

Progress = Callable[[int, float, float], None]
# Steps in a row that evaluate nothing (every move refused) before the driver gives up.
_MAX_IDLE_STEPS = 1000
# From this many graph nodes on, run() prices children incrementally by default. With the compiled
# scheduler loop incremental is faster from 1.8k nodes on (scripts/tools/bench_simulator.py, the
# search's own moves, incremental over full: 3.8x at 1.8k nodes, 7.1x at 4.6k, 11x at 9.2k;
# docs/results/simulator-speed.md), but its first evaluation in a process imports numba and loads
# the compiled kernel (~0.5 s of CPU, 1-2 s wall here), which a short search on a small graph
# may not win back.
INCREMENTAL_MIN_NODES = 4000


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What a search found.

    Attributes:
      best_plan: the plan with the lowest estimate.
      best_cost: its estimate (seconds).
      trace: (evaluations, elapsed seconds, best estimate) at the start, at every new
        best, and at the end.
      evals: plans evaluated, start plans included.
      elapsed_s: wall time of the search (start plans included).
      top: the best distinct plans, as (estimate, plan), best first.
      start_costs: start plan name -> estimate.
      strategy: the strategy's name.
    """

    best_plan: FusionPlan
    best_cost: float
    trace: list[tuple[int, float, float]]
    evals: int
    elapsed_s: float
    top: tuple[tuple[float, FusionPlan], ...]
    start_costs: dict[str, float]
    strategy: str

    def __repr__(self) -> str:
        return (f"SearchResult({self.strategy[:20]!r}, best {self.best_cost * 1e3:.3f} ms: {self.best_plan!r}, "
                f"{self.evals} evals in {self.elapsed_s:.1f} s, top {len(self.top)})")

    @property
    def evals_per_s(self) -> float:
        return self.evals / self.elapsed_s if self.elapsed_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "best_cost_s": self.best_cost, "evals": self.evals,
                "elapsed_s": self.elapsed_s, "evals_per_s": self.evals_per_s,
                "trace": [list(t) for t in self.trace], "start_costs_s": dict(self.start_costs),
                "best_plan": self.best_plan.to_dict()}


def check_budgets(budget_s: object, max_evals: object, where: str = "") -> None:
    """Checks a caller's search budgets: ``budget_s`` a finite positive number of seconds,
    ``max_evals`` an integer >= 1 or None (what ``disco.optimize`` and the planner accept;
    :func:`run` itself also takes ``budget_s=None``).

    Args:
      where: prefix of the names in the error, e.g. "options.".

    Raises:
      ValueError: naming the budget, what was expected and what was given.
    """
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s < math.inf:
        raise ValueError(f"{where}budget_s: expected a positive number of seconds, got {budget_s!r}")
    if max_evals is not None and (isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1):
        raise ValueError(f"{where}max_evals: expected an integer >= 1 or None, got {max_evals!r}")


def done_fraction(elapsed: float, budget_s: float, evals: int, max_evals: int | None) -> float:
    """How far a search is through its budgets, in [0, 1]: the larger of the time and the
    evaluations spent (for progress reports)."""
    frac = elapsed / budget_s
    if max_evals is not None:
        frac = max(frac, evals / max_evals)
    return min(1.0, frac)


def _simulator_of(evaluate: Evaluate) -> Any:
    from disco.sim.simulator import Simulator

    owner = getattr(evaluate, "__self__", None)
    return owner if isinstance(owner, Simulator) else None


def _incremental(evaluate: Evaluate, sim: Any) -> tuple[Evaluate, Any]:
    """(evaluate, evaluate_move) pricing each child from its parent's simulated state
    (:class:`disco.sim.delta.DeltaSimulator`, equal to ``sim.step_time``) when ``evaluate`` is a
    simulator's ``step_time``; else ``(evaluate, None)``."""
    from disco.sim.simulator import Simulator

    if sim is None or getattr(evaluate, "__func__", None) is not Simulator.step_time:
        return evaluate, None
    from disco.sim.delta import DeltaSimulator

    delta = DeltaSimulator(sim, freeze_gc=None)  # the collector frozen on large graphs, released by run
    return delta.step_time, delta.step_time


def run(strategy: Strategy, graph: HloGraph, evaluate: Evaluate, *, budget_s: float | None = None,
        max_evals: int | None = None, seed: int = 0, starts: Sequence[FusionPlan] | None = None,
        progress: Progress | None = None, backend: str | None = None,
        incremental: bool | None = None) -> SearchResult:
    """Runs ``strategy`` until the time budget or the evaluation budget is spent.

    The driver draws one key per step from ``random.Random(seed)``, so with
    ``max_evals`` alone a seed always gives the same result; a time budget stops at a
    step boundary, so the steps done are a prefix of that same sequence. The budgets
    are checked between steps (a step evaluates a handful of plans).

    Args:
      strategy: e.g. ``disco.search.best_first()``.
      graph: the step's graph.
      evaluate: plan -> estimated step time (seconds), e.g. ``Simulator(...).step_time``.
      budget_s: wall-clock budget in seconds.
      max_evals: evaluation budget (start plans included).
      seed: the seed.
      starts: start plans (default: :func:`default_starts`; the merged-gradient starts
        need ``evaluate`` to be a ``Simulator``'s bound method).
      progress: called after every step with (evaluations, elapsed seconds, best estimate).
      backend: "cpu" or "gpu" (default: the simulator's, when ``evaluate`` is a Simulator's
        bound method, else "cpu"): on GPU the moves make no fusion groups and search the
        GPU compile options (``disco.plans.options``).
      incremental: when ``evaluate`` is a ``Simulator``'s ``step_time``, price each child from its
        parent's simulated state (:mod:`disco.sim.delta`: the same estimates, faster on large
        graphs); False: every plan by a full simulation; None (default): incremental for graphs of
        at least :data:`INCREMENTAL_MIN_NODES` nodes.

    Returns:
      The SearchResult.

    Raises:
      ValueError: when neither budget is given, or a budget is not positive.
    """
    if budget_s is None and max_evals is None:
        raise ValueError("run needs a budget: got budget_s=None and max_evals=None; "
                         "expected budget_s (seconds) and/or max_evals")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s: expected a positive number of seconds, got {budget_s!r}")
    if max_evals is not None and (not isinstance(max_evals, int) or max_evals < 1):
        raise ValueError(f"max_evals: expected an integer >= 1, got {max_evals!r}")
    t0 = time.perf_counter()
    from disco.plans import moves

    sim = _simulator_of(evaluate)
    ctx = moves.context(graph, backend or (sim.backend if sim is not None else "cpu"))
    if starts is None:
        starts = default_starts(graph, sim, ctx)
    evaluate_move = None
    if incremental is None:
        incremental = len(graph.nodes) >= INCREMENTAL_MIN_NODES
    if incremental:
        evaluate, evaluate_move = _incremental(evaluate, sim)
    try:
        return _search(strategy, graph, evaluate, evaluate_move, starts, ctx, t0, budget_s, max_evals, seed,
                       progress)
    finally:
        delta = getattr(evaluate_move, "__self__", None)
        if delta is not None:
            delta.release()


def _search(strategy: Strategy, graph: HloGraph, evaluate: Evaluate, evaluate_move: Any,
            starts: Sequence[FusionPlan], ctx: Any, t0: float, budget_s: float | None, max_evals: int | None,
            seed: int, progress: Progress | None) -> SearchResult:
    """:func:`run`'s loop, after its checks and set-up."""
    prob = make_problem(graph, evaluate, starts, ctx, evaluate_move)
    keys = random.Random(seed)
    state = strategy.init(prob, keys.getrandbits(63))
    trace = [(state.evals, time.perf_counter() - t0, state.best_cost)]
    idle = 0
    while True:
        elapsed = time.perf_counter() - t0
        if max_evals is not None and state.evals >= max_evals:
            break
        if budget_s is not None and elapsed >= budget_s:
            break
        new = strategy.step(state, keys.getrandbits(63))
        idle = idle + 1 if new.evals == state.evals else 0
        if new.best_cost < state.best_cost:
            trace.append((new.evals, time.perf_counter() - t0, new.best_cost))
        state = new
        if progress is not None:
            progress(state.evals, time.perf_counter() - t0, state.best_cost)
        if idle >= _MAX_IDLE_STEPS:
            break
    elapsed = time.perf_counter() - t0
    trace.append((state.evals, elapsed, state.best_cost))
    # the start plans' estimates, for the report (a few evaluations, outside the search's time)
    start_costs = {p.name or p.digest(): float(evaluate(p)) for p in prob.starts}
    return SearchResult(best_plan=state.best_plan, best_cost=state.best_cost, trace=trace, evals=state.evals,
                        elapsed_s=elapsed, top=tuple((c, p) for c, _, p in state.top),
                        start_costs=start_costs, strategy=strategy.name)

"""Greedy search: the constructive start points, then first-improvement hill climbing.

Each step tries ``neighbours`` one-move neighbours of the current plan and moves to
the best of them if it is faster; otherwise it stays (the next step draws other
neighbours).
"""

from __future__ import annotations

import random
from typing import NamedTuple

from disco.plans import moves
from disco.plans.plan import FusionPlan
from disco.search._base import Problem, Scored, Strategy, plan_key, push_top, score, score_starts


class GreedyState(NamedTuple):
    problem: Problem
    current: Scored
    best_plan: FusionPlan
    best_cost: float
    evals: int
    top: tuple[Scored, ...]
    stalls: int


def greedy(*, neighbours: int = 8, top_k: int = 8) -> Strategy:
    """The greedy strategy.

    Args:
      neighbours: one-move neighbours tried per step.
      top_k: how many best distinct plans the state keeps.

    Raises:
      ValueError: for sizes below 1.
    """
    for name, v in (("neighbours", neighbours), ("top_k", top_k)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")

    def init(problem: Problem, key: int) -> GreedyState:
        scored = score_starts(problem)
        top: tuple[Scored, ...] = ()
        for s in scored:
            top = push_top(top, s, top_k)
        return GreedyState(problem, scored[0], scored[0][2], scored[0][0], len(scored), top, 0)

    def step(state: GreedyState, key: int) -> GreedyState:
        rng = random.Random(key)
        problem = state.problem
        best = state.current
        top, evals = state.top, state.evals
        tried: set[int] = set()
        for _ in range(neighbours):
            child = moves.random_move(state.current[2], problem.ctx, rng)
            if child is None:
                continue
            k = plan_key(child)
            if k in tried:
                continue
            tried.add(k)
            item = score(problem, child, state.current[2])
            evals += 1
            top = push_top(top, item, top_k)
            if item[0] < best[0]:
                best = item
        improved = best is not state.current
        return state._replace(current=best, best_plan=best[2] if best[0] < state.best_cost else state.best_plan,
                              best_cost=min(best[0], state.best_cost), evals=evals, top=top,
                              stalls=0 if improved else state.stalls + 1)

    return Strategy("greedy", init, step)

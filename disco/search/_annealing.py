"""Simulated annealing (MCMC) over the joint plan space, as in FlexFlow's search.

Each step proposes one random move from the current plan and accepts it with the
Metropolis rule: always when it is no slower, else with probability
``exp(-(new - current) / T)``. ``T`` starts at ``temperature * best start estimate``
and is multiplied by ``cooling`` every step. After ``restart_after`` steps without a
new best, the chain jumps back to the best plan (FlexFlow restarts the same way).
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from disco.plans import moves
from disco.plans.plan import FusionPlan
from disco.search._base import Problem, Scored, Strategy, push_top, score, score_starts


class AnnealingState(NamedTuple):
    problem: Problem
    current: Scored
    temperature: float
    best_plan: FusionPlan
    best_cost: float
    evals: int
    top: tuple[Scored, ...]
    since_best: int
    accepted: int


def annealing(*, temperature: float = 0.01, cooling: float = 0.998, restart_after: int = 300,
              top_k: int = 8) -> Strategy:
    """The annealing strategy.

    Args:
      temperature: the start temperature as a fraction of the best start plan's estimate.
      cooling: the factor applied to the temperature each step, in (0, 1].
      restart_after: steps without a new best before the chain returns to the best plan.
      top_k: how many best distinct plans the state keeps.

    Raises:
      ValueError: for a negative temperature, a cooling factor outside (0, 1] or sizes below 1.
    """
    if temperature < 0:
        raise ValueError(f"temperature: expected >= 0, got {temperature!r}")
    if not 0 < cooling <= 1:
        raise ValueError(f"cooling: expected a factor in (0, 1], got {cooling!r}")
    for name, v in (("restart_after", restart_after), ("top_k", top_k)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")

    def init(problem: Problem, key: int) -> AnnealingState:
        scored = score_starts(problem)
        top: tuple[Scored, ...] = ()
        for s in scored:
            top = push_top(top, s, top_k)
        best = scored[0]
        t0 = temperature * best[0] if math.isfinite(best[0]) else 0.0
        return AnnealingState(problem, best, t0, best[2], best[0], len(scored), top, 0, 0)

    def step(state: AnnealingState, key: int) -> AnnealingState:
        rng = random.Random(key)
        problem = state.problem
        temp = state.temperature * cooling
        cur = state.current
        if state.since_best >= restart_after:
            cur = (state.best_cost, state.top[0][1], state.best_plan)
            state = state._replace(since_best=0)
        child = moves.random_move(cur[2], problem.ctx, rng)
        if child is None:
            return state._replace(current=cur, temperature=temp, since_best=state.since_best + 1)
        item = score(problem, child, cur[2])
        delta = item[0] - cur[0]
        accept = delta <= 0 or (temp > 0 and rng.random() < math.exp(-delta / temp))
        best_cost, best_plan, since = state.best_cost, state.best_plan, state.since_best + 1
        if item[0] < best_cost:
            best_cost, best_plan, since = item[0], child, 0
        return state._replace(current=item if accept else cur, temperature=temp, best_plan=best_plan,
                              best_cost=best_cost, evals=state.evals + 1,
                              top=push_top(state.top, item, top_k), since_best=since,
                              accepted=state.accepted + accept)

    return Strategy("annealing", init, step)

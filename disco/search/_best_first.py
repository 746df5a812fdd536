"""Best-first search with tolerance (the Disco paper's search over fusion plans).

A capped priority queue of plans, best estimate first. Each step pops the best,
makes ``children`` children of a few random moves each, and queues a child when its
estimate is below ``(1 + tolerance) * best``: slightly worse plans stay in play, so
the search can cross small hills. Plans are deduplicated by content. Equal estimates
leave the queue first in, first out: a plateau of plans that price the same (common on
GPU, where many start plans and moves do not change the estimate) is explored breadth
first rather than down one family. When the queue runs dry it is refilled from the best
plans seen.
"""

from __future__ import annotations

import heapq
import random
from typing import NamedTuple

from disco.plans.plan import FusionPlan
from disco.search._base import Problem, Scored, Strategy, perturb, plan_key, push_top, score, score_starts


# A queued plan: (estimated step time, order queued, plan); the order breaks ties.
Queued = tuple[float, int, FusionPlan]


class BestFirstState(NamedTuple):
    problem: Problem
    queue: tuple[Queued, ...]  # a heap
    seen: frozenset[int]
    best_plan: FusionPlan
    best_cost: float
    evals: int
    top: tuple[Scored, ...]
    expansions: int
    queued: int  # plans queued so far: the next plan's order


def best_first(*, tolerance: float = 0.05, queue_size: int = 64, children: int = 8, max_moves: int = 3,
               top_k: int = 8) -> Strategy:
    """The best-first strategy.

    Args:
      tolerance: a child is queued when its estimate < (1 + tolerance) * best.
      queue_size: the queue keeps this many best plans.
      children: children made per expansion.
      max_moves: each child is 1..max_moves random moves away from its parent.
      top_k: how many best distinct plans the state keeps.

    Raises:
      ValueError: for a negative tolerance or a size below 1.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance: expected >= 0, got {tolerance!r}")
    for name, v in (("queue_size", queue_size), ("children", children), ("max_moves", max_moves),
                    ("top_k", top_k)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")

    def init(problem: Problem, key: int) -> BestFirstState:
        scored = score_starts(problem)
        top: tuple[Scored, ...] = ()
        for s in scored:
            top = push_top(top, s, top_k)
        queue = [(c, i, p) for i, (c, _, p) in enumerate(scored[:queue_size])]  # sorted: a heap
        return BestFirstState(problem, tuple(queue), frozenset(s[1] for s in scored), scored[0][2],
                              scored[0][0], len(scored), top, 0, len(queue))

    def step(state: BestFirstState, key: int) -> BestFirstState:
        rng = random.Random(key)
        problem = state.problem
        queue = list(state.queue)
        queued = state.queued
        if not queue:
            queue = [(c, queued + i, p) for i, (c, _, p) in enumerate(state.top)]  # sorted: a heap
            queued += len(queue)
        parent = heapq.heappop(queue)[2]
        best_cost, best_plan, top, evals = state.best_cost, state.best_plan, state.top, state.evals
        new_keys: set[int] = set()
        seen = state.seen
        for _ in range(children):
            child = perturb(parent, problem.ctx, rng, rng.randint(1, max_moves))
            if child is None:
                continue
            k = plan_key(child)
            if k in seen or k in new_keys:
                continue
            new_keys.add(k)
            item = score(problem, child, parent)
            evals += 1
            top = push_top(top, item, top_k)
            if item[0] < (1 + tolerance) * best_cost:
                heapq.heappush(queue, (item[0], queued, child))
                queued += 1
            if item[0] < best_cost:
                best_cost, best_plan = item[0], child
        if len(queue) > queue_size:
            queue = heapq.nsmallest(queue_size, queue)
            heapq.heapify(queue)
        return state._replace(queue=tuple(queue), seen=seen | frozenset(new_keys), best_plan=best_plan,
                              best_cost=best_cost, evals=evals, top=top, expansions=state.expansions + 1,
                              queued=queued)

    return Strategy("best_first", init, step)

"""Searching the joint space of op-fusion groups and gradient buckets.

Strategies are pairs of pure functions with explicit state (:class:`Strategy`):
``init(problem, key) -> State`` and ``step(state, key) -> State``; :func:`run`
drives one against a time or evaluation budget.

- :func:`best_first`: best-first search with tolerance (the Disco paper).
- :func:`annealing`: simulated annealing / MCMC (FlexFlow).
- :func:`greedy`: hill climbing from the best start point.

Start points (:func:`default_starts`): every baseline, greedy producer fusion
(:func:`greedy_fusion`) and buckets chosen against the simulated timeline
(:func:`merged_gradient_buckets`); on CPU also reductions with their elementwise neighbours
(:func:`reduce_fusion`) and XLA's default with reductions kept out of YNNPACK
(:func:`ynn_no_reduce`); for a step with sharded parameters also its parameter all-gathers in
gather buckets (``one_gather_bucket``, ``per_layer_gathers``), which the gather-bucket moves
(:mod:`disco.plans.moves`) then merge and split.

Example:
  >>> from disco import search
  >>> from disco.sim.simulator import Simulator
  >>> sim = Simulator(graph, costs, cluster)                                   # doctest: +SKIP
  >>> result = search.run(search.best_first(), graph, sim.step_time, budget_s=10)  # doctest: +SKIP
  >>> result.best_plan, result.best_cost, result.evals_per_s                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from disco.search._annealing import AnnealingState, annealing
from disco.search._base import Problem, Scored, Strategy, plan_key, problem
from disco.search._best_first import BestFirstState, best_first
from disco.search._driver import SearchResult, check_budgets, done_fraction, run
from disco.search._greedy import GreedyState, greedy
from disco.search._starts import default_starts, greedy_fusion, merged_gradient_buckets, reduce_fusion, ynn_no_reduce

STRATEGIES = {"best_first": best_first, "annealing": annealing, "greedy": greedy}


def make(name: str, **kw: Any) -> Strategy:
    """The strategy called ``name`` with its options.

    Raises:
      ValueError: for an unknown name.
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown search strategy {name!r}; expected one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](**kw)


__all__ = [
    "STRATEGIES", "AnnealingState", "BestFirstState", "GreedyState", "Problem", "Scored", "SearchResult",
    "Strategy", "annealing", "best_first", "check_budgets", "default_starts", "done_fraction", "greedy",
    "greedy_fusion", "make",
    "merged_gradient_buckets", "plan_key", "problem", "reduce_fusion", "run", "ynn_no_reduce",
]

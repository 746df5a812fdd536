"""What every search strategy shares: the problem, the strategy pair, start plans, bookkeeping."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from disco.plans import moves
from disco.plans.plan import FusionPlan

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph

Evaluate = Callable[[FusionPlan], float]
# (plan, parent) -> the same estimate as Evaluate's for plan, computed from the parent's (delta simulation).
EvaluateMove = Callable[[FusionPlan, FusionPlan], float]
# A scored plan: (estimated step time, content key, plan). The key deduplicates plans
# within one process; orders never depend on it (Python salts string hashes per process),
# so a seed searches the same plans in every run.
Scored = tuple[float, int, FusionPlan]


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """One search problem: the graph, its move context, the estimator and the start plans.

    Attributes:
      graph: the step's graph.
      ctx: the move context of ``graph`` (:func:`disco.plans.moves.context`).
      evaluate: plan -> estimated step time in seconds (e.g. ``Simulator.step_time``).
      starts: valid start plans, canonical (see :func:`disco.plans.moves.canonical`).
      evaluate_move: (plan, parent) -> ``evaluate(plan)``, computed from ``parent``, a plan it
        priced before (e.g. :class:`disco.sim.delta.DeltaSimulator`); None: ``evaluate`` alone.
    """

    graph: HloGraph
    ctx: moves.MoveContext
    evaluate: Evaluate
    starts: tuple[FusionPlan, ...]
    evaluate_move: EvaluateMove | None = None


class Strategy(NamedTuple):
    """A search strategy as a pair of pure functions with explicit state.

    ``init(problem, key) -> State`` evaluates the start plans; ``step(state, key) -> State``
    does one round of the strategy. Every State has the fields ``best_plan``,
    ``best_cost``, ``evals`` (plans evaluated so far, start plans included) and ``top``
    (the best distinct plans seen, as :data:`Scored`, best first). ``key`` is an int
    seeding a :class:`random.Random`: the same keys give the same states.
    """

    name: str
    init: Callable[[Problem, int], Any]
    step: Callable[[Any, int], Any]


def plan_key(plan: FusionPlan) -> int:
    """A content key for deduplication within one process (the name is left out).

    ``FusionPlan.digest`` is the stable form; it costs ~10x more (a JSON dump and a
    SHA-256), which matters at thousands of plans per second.
    """
    return hash((plan.groups, plan.xla_fusion, plan.buckets, plan.compile_options, plan.cuts, plan.gather_buckets,
                 plan.gather_after))


def push_top(top: tuple[Scored, ...], item: Scored, k: int) -> tuple[Scored, ...]:
    """``top`` with ``item`` added (if its key is new and it ranks within the best ``k``)."""
    if len(top) >= k and item[0] >= top[-1][0]:
        return top
    if any(t[1] == item[1] for t in top):
        return top
    return tuple(sorted((*top, item), key=lambda t: t[0])[:k])  # stable: of equals, the first found ranks first


def score(problem: Problem, plan: FusionPlan, parent: FusionPlan | None = None) -> Scored:
    """Evaluates ``plan`` (from ``parent``, the plan it was made from, when the problem can); a
    non-finite estimate counts as infinitely slow.

    Raises:
      ValueError: when ``evaluate`` returns something that is not a number.
    """
    if parent is not None and problem.evaluate_move is not None:
        cost = problem.evaluate_move(plan, parent)
    else:
        cost = problem.evaluate(plan)
    if not isinstance(cost, (int, float)):
        raise ValueError(f"evaluate returned {cost!r} for plan {plan.name!r}; expected a step time in seconds")
    cost = float(cost)
    if math.isnan(cost):
        cost = math.inf
    return cost, plan_key(plan), plan


def score_starts(problem: Problem) -> list[Scored]:
    """The distinct start plans, scored, best first."""
    seen: set[int] = set()
    out: list[Scored] = []
    for plan in problem.starts:
        k = plan_key(plan)
        if k in seen:
            continue
        seen.add(k)
        out.append(score(problem, plan))
    if not out:
        raise ValueError("the search got no start plans; expected at least one valid plan")
    return sorted(out, key=lambda t: t[0])  # stable: of equals, in the order of the start plans


def perturb(plan: FusionPlan, ctx: moves.MoveContext, rng: Any, n_moves: int) -> FusionPlan | None:
    """``n_moves`` random moves applied one after another; None if none applied."""
    out = None
    cur = plan
    for _ in range(n_moves):
        nxt = moves.random_move(cur, ctx, rng)
        if nxt is not None:
            cur = out = nxt
    return out


def problem(graph: HloGraph, evaluate: Evaluate, starts: Sequence[FusionPlan],
            ctx: moves.MoveContext | None = None, evaluate_move: EvaluateMove | None = None) -> Problem:
    """Builds a :class:`Problem` (start plans validated and made canonical).

    Raises:
      ValueError: a start plan that does not validate on ``graph``.
    """
    ctx = ctx or moves.context(graph)
    canon = []
    for p in starts:
        p.validate(graph, ctx.backend)
        canon.append(moves.canonical(p, ctx))
    return Problem(graph=graph, ctx=ctx, evaluate=evaluate, starts=tuple(canon), evaluate_move=evaluate_move)

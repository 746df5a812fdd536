"""Random valid plans: for tests, for the profile collector and as search seeds."""

from __future__ import annotations

import collections
import random

from disco.ir.graph import HloGraph
from disco.plans.plan import Bucket, FusionPlan
from disco.plans.check import (
    _check_layouts,
    _group_outputs,
    bucket_class,
    contraction_cycle,
    groupable,
    preds_of,
    users_of,
)


def random_groups(graph: HloGraph, rng: random.Random, *, n_groups: int = 8, max_size: int = 4,
                  tries: int = 200) -> tuple[tuple[str, ...], ...]:
    """Grows up to ``n_groups`` connected groups of fusible ops, each valid on its own and together."""
    preds = preds_of(graph)
    index = graph.name_index()
    users = users_of(graph)
    allowed = groupable(graph, preds)
    fusible = [i for i, n in enumerate(graph.nodes) if allowed[i] and n.opcode != "constant"]
    taken: set[int] = set()
    groups: list[tuple[str, ...]] = []
    for _ in range(tries):
        if len(groups) >= n_groups or not fusible:
            break
        seed = rng.choice(fusible)
        if seed in taken:
            continue
        members = [seed]
        comp = graph.nodes[seed].computation
        size = rng.randint(2, max(2, max_size))
        for _ in range(size * 3):
            if len(members) >= size:
                break
            cur = rng.choice(members)
            cand = [j for j in users[cur] + preds[cur]
                    if j not in taken and j not in members and graph.nodes[j].computation == comp
                    and allowed[j]]
            if cand:
                members.append(rng.choice(cand))
        if len(members) < 2:
            continue
        names = tuple(graph.nodes[i].name for i in sorted(members))
        if len(_group_outputs(graph, index, names, users)) != 1:
            continue
        try:
            _check_layouts(graph, index, len(groups), names, preds)
        except ValueError:
            continue
        trial = FusionPlan(groups=tuple(groups) + (names,))
        if contraction_cycle(trial, graph) is not None:
            continue
        groups.append(names)
        taken.update(members)
    return tuple(groups)


def random_buckets(graph: HloGraph, rng: random.Random, *, max_buckets: int | None = None) -> tuple[Bucket, ...]:
    """Cuts the all-reduces (program order, per compatible class) into random contiguous buckets."""
    classes: dict[tuple, list[str]] = collections.OrderedDict()
    for n in graph.all_reduces():
        classes.setdefault(bucket_class(n), []).append(n.name)
    buckets: list[Bucket] = []
    for names in classes.values():
        k = rng.randint(1, min(len(names), max_buckets or len(names)))
        cuts = sorted(rng.sample(range(1, len(names)), k - 1)) if k > 1 else []
        for a, b in zip([0] + cuts, cuts + [len(names)]):
            buckets.append(Bucket(tuple(names[a:b]), "concat"))
    return tuple(buckets)


def random_plan(graph: HloGraph, seed: int, *, groups: bool = True, buckets: bool = True,
                n_groups: int = 8, max_size: int = 4) -> FusionPlan:
    """A random plan that passes ``validate(graph)``; deterministic for a seed."""
    rng = random.Random(seed)
    plan = FusionPlan(
        groups=random_groups(graph, rng, n_groups=n_groups, max_size=max_size) if groups else (),
        xla_fusion=rng.choice(("extend", "off")) if groups else "extend",
        buckets=random_buckets(graph, rng) if buckets else None,
        name=f"random_{seed}",
    )
    # A group and a bucket can close a cycle together; drop groups on it until none is left.
    while (cycle := contraction_cycle(plan, graph)) is not None:
        on_cycle = set(cycle)
        plan = plan.replace(groups=tuple(g for g in plan.groups if not on_cycle & set(g)))
    return plan.validate(graph)

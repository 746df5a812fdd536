"""The search over scatter buckets on a sharded (FSDP) step: ``scatter_buckets`` is a start where the graph has
gradient scatters (and only there), and the moves make valid scatter-bucket plans of their own."""

from __future__ import annotations

import random

from disco import search
from disco.plans import baselines, moves
from tests.disco.search.test_gather_search import setup


def test_the_scatter_start_only_where_there_are_gradient_scatters():
    graph, sim = setup("fsdp")
    starts = {p.name: p for p in search.default_starts(graph, sim, moves.context(graph))}
    assert starts["scatter_buckets"] == baselines.make("scatter_buckets", graph)
    assert [p.name for p in starts.values() if any(b.build == "scatter" for b in p.buckets or ())] == ["scatter_buckets"]
    plain, plain_sim = setup("gspmd")
    assert not any(b.build == "scatter" for p in search.default_starts(plain, plain_sim, moves.context(plain))
                   for b in p.buckets or ())


def test_moves_from_the_scatter_start_keep_plans_valid_and_make_scatter_plans():
    """A random walk of the moves' table from ``scatter_buckets``: every child validates (a group never takes
    a dynamic-slice a scatter bucket replaces, a merge or split rebuilds "concat"), and ``switch_build``
    makes scatter buckets of its own."""
    graph, _ = setup("fsdp")
    ctx = moves.context(graph)
    cur = moves.canonical(baselines.make("scatter_buckets", graph), ctx)
    rng = random.Random(7)
    switched = 0
    for k in range(400):  # every child validates; the walk runs until switch_build has made a scatter bucket
        if k >= 60 and switched:
            break
        child = moves.random_move(cur, ctx, rng)
        if child is None:
            continue
        child.validate(graph)
        before = sum(b.build == "scatter" for b in cur.buckets)
        switched += sum(b.build == "scatter" for b in child.buckets) > before
        # every third step from per_tensor again: buckets of one all-reduce, each a candidate for "scatter"
        cur = child if k % 3 else moves.canonical(baselines.make("per_tensor", graph), ctx)
    assert switched, "no move made a scatter bucket"

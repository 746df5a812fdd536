"""The search over a step with sharded parameters: gather-bucket starts and moves (issue 60)."""

from __future__ import annotations

import functools

import pytest

from disco import search
from disco.plans import baselines
from disco.plans import moves


@functools.lru_cache(maxsize=None)
def setup(style):
    import disco
    import trax_models
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd", style=style)
    graph = disco.extract(step, *args)
    return graph, Simulator(graph, AnalyticCosts(), preset("local", devices=4))


def test_gather_bucket_starts_only_where_there_are_parameter_gathers():
    graph, sim = setup("fsdp")
    starts = {p.name: p for p in search.default_starts(graph, sim, moves.context(graph))}
    for name in baselines.GATHER_NAMES:
        assert starts[name].gather_buckets and starts[name] == baselines.make(name, graph)
    # and FSDP2's shape: the per-layer buckets with the next layer prefetched (gather anchors)
    assert [p.name for p in starts.values() if p.gather_buckets is not None] == [
        *baselines.GATHER_NAMES, "per_layer_gathers+prefetch_1"]
    assert [p.name for p in starts.values() if p.gather_after] == ["prefetch_1", "per_layer_gathers+prefetch_1",
                                                                     "prefetch_2"]
    plain, plain_sim = setup("gspmd")
    assert all(p.gather_buckets is None and not p.gather_after
               for p in search.default_starts(plain, plain_sim, moves.context(plain)))


@pytest.mark.parametrize("name", sorted(search.STRATEGIES))
def test_the_search_prices_gather_bucket_plans_its_moves_make(name):
    """Every strategy, from the default starts: among the plans it evaluates are gather-bucket plans
    that are no start (made by the moves), each valid; the same seed searches the same plans."""
    graph, sim = setup("fsdp")
    runs = []
    for _ in range(2):
        seen = []
        result = search.run(search.make(name), graph, lambda p: seen.append(p) or sim.step_time(p),
                            max_evals=120, seed=4, starts=search.default_starts(graph, sim, moves.context(graph)))
        runs.append((seen, result))
    (seen, result), (again, _) = runs
    assert [p.digest() for p in seen] == [p.digest() for p in again]
    starts = {p.digest() for p in search.default_starts(graph, sim, moves.context(graph))}
    made = [p for p in seen if p.gather_buckets and p.digest() not in starts]
    assert made, f"{name} evaluated no gather-bucket plan of its own among {len(seen)}"
    for p in made:
        p.validate(graph)
    assert result.best_cost <= min(result.start_costs.values())


@pytest.mark.parametrize("name", sorted(search.STRATEGIES))
def test_incremental_pricing_finds_what_full_pricing_finds_on_an_fsdp_step(name):
    graph, sim = setup("fsdp")
    a = search.run(search.make(name), graph, sim.step_time, max_evals=120, seed=5, incremental=True)
    b = search.run(search.make(name), graph, sim.step_time, max_evals=120, seed=5, incremental=False)
    assert a.best_plan == b.best_plan and a.best_cost == b.best_cost and a.evals == b.evals
    assert [(c, p) for c, p in a.top] == [(c, p) for c, p in b.top]

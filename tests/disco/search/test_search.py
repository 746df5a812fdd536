"""Search strategies: deterministic for a seed, valid plans, budgets, start points."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disco import search
from disco.plans import baselines
from disco.plans import moves
from disco.plans.plan import FusionPlan


@functools.lru_cache(maxsize=None)
def setup():
    import disco
    import trax_models
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    graph = disco.extract(step, *args)
    return graph, Simulator(graph, AnalyticCosts(), preset("local", devices=4))


@pytest.mark.parametrize("name", sorted(search.STRATEGIES))
def test_strategies_are_deterministic_and_return_valid_plans(name):
    graph, sim = setup()
    a = search.run(search.make(name), graph, sim.step_time, max_evals=60, seed=3)
    b = search.run(search.make(name), graph, sim.step_time, max_evals=60, seed=3)
    assert a.best_plan == b.best_plan and a.best_cost == b.best_cost and a.evals == b.evals
    assert [(e, c) for e, _, c in a.trace] == [(e, c) for e, _, c in b.trace]
    a.best_plan.validate(graph)
    assert a.evals >= 60 and a.best_cost == pytest.approx(sim.step_time(a.best_plan))
    assert a.best_cost <= min(a.start_costs.values())
    assert [c for c, _ in a.top] == sorted(c for c, _ in a.top)
    assert len({p.digest() for _, p in a.top}) == len(a.top)


_SEARCH_IN_A_PROCESS = '''
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import disco, trax_models
from disco import search
from disco.sim.costs import device_costs
from disco.sim.cluster_presets import resolve
from disco.sim.simulator import Simulator
step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
graph = disco.extract(step, *args)
cluster = resolve("h100-sxm-8")
sim = Simulator(graph, device_costs.analytic(cluster.device), cluster)
r = search.run(search.best_first(), graph, sim.step_time, max_evals=300, seed=0)
print(json.dumps({"digest": r.best_plan.digest(), "trace": [(e, c) for e, _, c in r.trace],
                  "starts": min(r.start_costs.values()), "best": r.best_cost}))
'''


def test_a_seed_searches_the_same_plans_in_every_process():
    # Python salts string hashes per process: a search whose order depended on them (it did,
    # through the plan keys breaking ties) chose a different plan on every run. On a GPU
    # cluster many start plans price the same, so ties decide the path.
    runs = []
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        r = subprocess.run([sys.executable, "-c", _SEARCH_IN_A_PROCESS], capture_output=True, text=True,
                           env=env, timeout=600, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]
    assert runs[0]["best"] < runs[0]["starts"]  # and it got off the plateau of equal start plans


@pytest.mark.parametrize("name", sorted(search.STRATEGIES))
def test_search_improves_on_a_bad_start(name):
    graph, sim = setup()
    start = baselines.make("per_tensor", graph)
    r = search.run(search.make(name), graph, sim.step_time, max_evals=400, seed=0, starts=[start])
    assert r.best_cost < 0.9 * sim.step_time(start)
    assert r.trace[0][2] == pytest.approx(sim.step_time(start)) and len(r.trace) > 2
    r.best_plan.validate(graph)


def test_state_is_not_mutated_by_step():
    graph, sim = setup()
    strat = search.best_first()
    state = strat.init(search.problem(graph, sim.step_time, [baselines.make("per_tensor", graph)]), 0)
    again = strat.step(state, 7)
    assert strat.step(state, 7) == again  # same state and key, same result
    assert state.evals == 1 and again.evals > 1


def test_time_budget_stops_the_search_at_the_first_step_past_it(monkeypatch):
    """On a clock that advances 0.1 s per step, a 0.35 s budget allows the steps that start at 0,
    0.1, 0.2 and 0.3 s, and no other; what they did is what the same seed does under an
    evaluation budget of as many evaluations."""
    from disco.search import _driver

    graph, sim = setup()
    clock = [0.0]
    monkeypatch.setattr(_driver, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    base = search.greedy()

    def step(state, key):
        clock[0] += 0.1
        return base.step(state, key)

    steps = []
    timed = search.run(base._replace(step=step), graph, sim.step_time, budget_s=0.35, seed=3,
                       progress=lambda evals, elapsed, best: steps.append(elapsed))
    assert steps == pytest.approx([0.1, 0.2, 0.3, 0.4]) and timed.elapsed_s == pytest.approx(0.4)
    counted = search.run(base, graph, sim.step_time, max_evals=timed.evals, seed=3)
    assert (counted.evals, counted.best_plan, counted.best_cost) == (timed.evals, timed.best_plan, timed.best_cost)


def test_start_points_are_valid():
    graph, sim = setup()
    ctx = moves.context(graph)
    fused = search.greedy_fusion(graph, ctx)
    assert fused.groups and fused.buckets is None
    mg = search.merged_gradient_buckets(sim, ctx)
    assert sorted(m for b in mg.buckets for m in b.members) == sorted(n.name for n in graph.all_reduces())
    names = {p.name for p in search.default_starts(graph, sim, ctx)}
    assert set(baselines.NAMES) - {"xla_threshold", "even"} <= names and "even_2" in names  # named by their setting
    assert {"greedy_fusion", "merged_gradient", "greedy_fusion+merged_gradient"} <= names


def _partitions(m: int):
    """Every way to cut range(m) into runs of consecutive items, as (lo, hi) slices."""
    for bits in range(1 << max(0, m - 1)):
        cuts = [k + 1 for k in range(m - 1) if bits >> k & 1]
        yield list(zip([0, *cuts], [*cuts, m]))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_bucket_runs_that_stop_early_are_the_whole_programmes_and_the_best_of_every_partition(data):
    from disco.search._starts import bucket_runs
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts

    m = data.draw(st.integers(1, 9), label="gradients")
    ready = sorted(data.draw(st.lists(st.floats(0, 1e-2), min_size=m, max_size=m), label="ready"))
    sizes = data.draw(st.lists(st.sampled_from([0, 4, 1 << 10, 1 << 16, 1 << 20, 1 << 24]), min_size=m,
                               max_size=m), label="bytes")
    cluster = data.draw(st.sampled_from(["local", "2x8-100gbe", "h100-sxm-8", "16x8-ib"]), label="cluster")
    costs, spec = AnalyticCosts(), preset(cluster)
    seconds = functools.partial(costs.collective_time, "all-reduce", cluster=spec)
    masks = [1 << k for k in range(m)]
    # gradient k's all-reduce may depend on earlier ones (then no run holds both)
    reach = [sum(1 << j for j in range(k) if data.draw(st.integers(0, 5), label=f"dep{k},{j}") == 0)
             for k in range(m)]
    runs = bucket_runs(ready, sizes, masks, reach, seconds)
    assert runs == bucket_runs(ready, sizes, masks, reach, seconds, stop=False)
    assert [lo for lo, _ in runs[1:]] == [hi for _, hi in runs[:-1]] and runs[0][0] == 0 and runs[-1][1] == m

    def end(partition):  # when the last bucket ends, as the programme adds it up
        t = 0.0
        for lo, hi in partition:
            if any(reach[k] & masks[j] for k in range(lo, hi) for j in range(lo, hi)):
                return float("inf")
            t = max(ready[hi - 1], t) + seconds(sum(sizes[lo:hi]))
        return t

    assert end(runs) == min(end(p) for p in _partitions(m))


def test_gpu_starts_turn_the_scheduler_on_where_there_are_buckets_to_overlap():
    # several buckets alone price worse than one on a GPU cluster (no overlap with the scheduler
    # off) and the scheduler alone has nothing to overlap: the starts carry both changes at once
    from disco.plans import options as plan_options

    graph, sim = setup()
    gpu = {p.name: p for p in search.default_starts(graph, sim, moves.context(graph, "gpu"))}
    several = [p for p in gpu.values() if p.buckets is not None and len(p.buckets) > 1
               and not p.name.endswith("+lhs")]
    assert {"per_tensor", "even_2"} <= {p.name for p in several}
    for p in several:
        on = gpu[f"{p.name}+lhs"]
        assert dict(on.compile_options) == {**dict(p.compile_options), plan_options.SCHEDULER: "True"}
        assert on.buckets == p.buckets and on.cuts == p.cuts and not on.groups
    assert not any(n.endswith("+lhs") for n, p in gpu.items() if p.buckets is None or len(p.buckets) < 2)
    cpu = {p.name for p in search.default_starts(graph, sim, moves.context(graph))}
    assert not any(n.endswith("+lhs") for n in cpu)


@pytest.mark.parametrize("call, match", [
    (lambda g, f: search.run(search.best_first(), g, f), r"needs a budget: got budget_s=None and max_evals=None"),
    (lambda g, f: search.run(search.best_first(), g, f, budget_s=0), r"budget_s: expected a positive .* got 0"),
    (lambda g, f: search.make("tabu"), r"unknown search strategy 'tabu'; expected one of: best_first"),
    (lambda g, f: search.best_first(tolerance=-1), r"tolerance: expected >= 0, got -1"),
    (lambda g, f: search.annealing(cooling=2.0), r"cooling: expected a factor in \(0, 1\], got 2.0"),
    (lambda g, f: search.run(search.greedy(), g, f, max_evals=5, starts=[]), r"no start plans"),
])
def test_errors_say_what_was_expected(call, match):
    graph, sim = setup()
    with pytest.raises(ValueError, match=match):
        call(graph, sim.step_time)


@pytest.mark.fast
def test_push_top_keeps_distinct_best():
    p, q = FusionPlan(), FusionPlan(xla_fusion="off")
    top = ()
    for item in [(3.0, 1, p), (1.0, 2, q), (2.0, 1, p), (0.5, 3, p)]:
        top = search._base.push_top(top, item, 2)
    assert [(c, k) for c, k, _ in top] == [(0.5, 3), (1.0, 2)]


@pytest.mark.parametrize("name", sorted(search.STRATEGIES))
def test_incremental_pricing_finds_what_full_pricing_finds(name):
    """run() prices children from their parents (disco.sim.delta) when given a Simulator's step_time:
    the same plans, estimates, traces and top lists as pricing every plan from scratch."""
    graph, sim = setup()
    a = search.run(search.make(name), graph, sim.step_time, max_evals=150, seed=5, incremental=True)
    b = search.run(search.make(name), graph, sim.step_time, max_evals=150, seed=5, incremental=False)
    assert a.best_plan == b.best_plan and a.best_cost == b.best_cost and a.evals == b.evals
    assert [(e, c) for e, _, c in a.trace] == [(e, c) for e, _, c in b.trace]
    assert [(c, p) for c, p in a.top] == [(c, p) for c, p in b.top]
    assert a.start_costs == b.start_costs


def test_a_large_graphs_search_freezes_the_collector_while_it_runs_and_releases_it(monkeypatch):
    """On graphs of FREEZE_MIN_NODES nodes or more run() prices with the collector frozen over the base
    state (disco.sim.delta) and unfreezes it when it returns: the same answer, no freeze left behind."""
    import gc

    from disco.sim import delta
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    graph, _ = setup()
    sim = Simulator(graph, AnalyticCosts(), preset("local", devices=4))  # its own: a mode's base state is built once
    seen = []
    monkeypatch.setattr(delta, "FREEZE_MIN_NODES", 1)
    gc.unfreeze()
    frozen = search.run(search.make("greedy"), graph, sim.step_time, max_evals=40, seed=2, incremental=True,
                        progress=lambda *_: seen.append(gc.get_freeze_count()))
    assert max(seen) > 0 and gc.get_freeze_count() == 0
    monkeypatch.setattr(delta, "FREEZE_MIN_NODES", 10 ** 9)
    plain = search.run(search.make("greedy"), graph, sim.step_time, max_evals=40, seed=2, incremental=True,
                       progress=lambda *_: seen.append(gc.get_freeze_count()))
    assert seen[-1] == 0 and (frozen.best_plan, frozen.best_cost) == (plain.best_plan, plain.best_cost)


def test_problems_price_children_from_their_parents():
    from disco.search._base import score

    calls = []
    prob = search.problem(setup()[0], lambda p: 1.0, [FusionPlan()],
                          evaluate_move=lambda p, parent: calls.append(parent) or 2.0)
    assert score(prob, FusionPlan(name="x"))[0] == 1.0 and not calls
    parent = prob.starts[0]
    assert score(prob, FusionPlan(name="x"), parent)[0] == 2.0 and calls == [parent]

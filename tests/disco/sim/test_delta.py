"""Tests for disco.sim.delta: incremental step times equal the full simulation's, bit for bit."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disco.ir.graph import HloGraph, Node
from disco.plans import baselines, moves
from disco.plans.plan import Bucket, FusionPlan
from disco.plans.random_plans import random_plan
from disco.sim.cluster import preset
from disco.sim.cluster_presets import resolve
from disco.sim.costs import AnalyticCosts
from disco.sim.delta import DeltaSimulator
from disco.sim.simulator import Simulator

# Two streams and one (CPU), and a GPU cluster (XLA:GPU's fusion; its compile options couple the streams).
CLUSTERS = {"cpu": preset("2x8-100gbe"), "cpu-one-stream": preset("2x8-100gbe").replace(overlap=False),
            "gpu": resolve("h100-sxm-8", devices=8)}
_ELEMENTWISE = ("add", "multiply", "tanh", "exponential", "subtract", "negate")


def layered_step(layers: int = 6, seed: int = 0) -> HloGraph:
    """A data-parallel step: forward dots and elementwise chains, backward, one all-reduce per
    weight, optimizer updates, with a tuple of the new weights as the step's output."""
    rng = random.Random(seed)
    nodes: list[Node] = []

    def add(opcode: str, operands: tuple[str, ...] = (), flops: float = 4096.0, nbytes: int = 16384) -> str:
        name = f"{opcode}.{len(nodes)}"
        is_ar = opcode == "all-reduce"
        nodes.append(Node(name=name, opcode=opcode, computation="main", shape="f32[64,64]", dtype="f32",
                          out_bytes=nbytes, out_elements=nbytes // 4, flops=flops, operands=operands,
                          grad_bytes=nbytes if is_ar else 0, param_path=f"w{len(nodes)}" if is_ar else None,
                          replica_groups="{}" if is_ar else None, reduction="add" if is_ar else None))
        return name

    x = add("parameter", flops=0.0)
    lr = add("constant", flops=0.0, nbytes=4)
    weights, acts = [], [x]
    for _ in range(layers):
        w = add("parameter", flops=0.0)
        weights.append(w)
        h = add("dot", (acts[-1], w), flops=rng.choice((2e5, 5e5, 1e6)))
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(_ELEMENTWISE)
            h = add(op, (h, h) if op in ("add", "multiply", "subtract") else (h,))
        acts.append(h)
    dy = add("negate", (acts[-1],))
    grads = []
    for layer in reversed(range(layers)):
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(_ELEMENTWISE)
            dy = add(op, (dy, acts[layer + 1]) if op in ("add", "multiply") else (dy,))
        dw = add("dot", (acts[layer], dy), flops=rng.choice((2e5, 1e6)))
        grads.append((layer, add("all-reduce", (dw,), nbytes=rng.choice((16384, 1 << 20, 1 << 22)))))
        dy = add("dot", (dy, weights[layer]), flops=5e5)
    outs = [add("subtract", (weights[layer], add("multiply", (ar, lr)))) for layer, ar in grads]
    add("tuple", tuple(outs), flops=0.0)
    index = {n.name: i for i, n in enumerate(nodes)}
    edges = tuple(sorted({(index[o], i) for i, n in enumerate(nodes) for o in n.operands}))
    return HloGraph(name="layered", nodes=tuple(nodes), edges=edges, fingerprint=f"layered{seed}")


@functools.lru_cache(maxsize=None)
def graph(name: str) -> HloGraph:
    """"layered", a zoo model's tiny step on 4 devices, or "<model>-fsdp": its step with sharded
    parameters on a 1 x 4 mesh (parameter all-gathers, which gather buckets merge)."""
    if name == "layered":
        return layered_step(8, seed=1)
    if name == "long":  # a longer one: more events after a move's first
        return layered_step(40, seed=2)
    import disco
    import trax_models

    model, _, style = name.partition("-")
    kw = {"style": style} if style else {}
    step, args = trax_models.make_train_step(model, "tiny", devices=4, optimizer="sgd", **kw)
    return disco.extract(step, *args)


@functools.lru_cache(maxsize=None)
def setup(graph_name: str, cluster: str) -> tuple[HloGraph, Simulator, Simulator, moves.MoveContext]:
    """(graph, the simulator a DeltaSimulator wraps, a separate reference simulator, move context)."""
    g = graph(graph_name)
    sim = Simulator(g, AnalyticCosts(), CLUSTERS[cluster])
    return g, sim, Simulator(g, AnalyticCosts(), CLUSTERS[cluster]), moves.context(g, sim.backend)


def start_plan(g: HloGraph, ctx: moves.MoveContext, seed: int) -> FusionPlan:
    """A random plan; on a graph with parameter all-gathers, with gather buckets for 2 seeds in 3 and
    gather anchors (a prefetch distance of 1 or 2 layers) for 2 in 4, where the plan stays valid."""
    plan = random_plan(g, seed, groups=ctx.backend == "cpu")
    if ctx.gather_class and seed % 3:
        plan = plan.replace(gather_buckets=baselines.make(baselines.GATHER_NAMES[seed % 3 - 1], g).gather_buckets)
    if ctx.gather_class and seed % 4 >= 2:
        anchored = plan.replace(gather_after=baselines.prefetch_anchors(g, seed % 4 - 1))
        try:
            plan = anchored.validate(g, ctx.backend)
        except ValueError:  # an anchor inside a random group, or a bucket that would wait on its own use
            pass
    return moves.canonical(plan, ctx)


walks = st.lists(st.tuples(st.sampled_from(sorted(moves.MOVES)), st.integers(0, 2**32 - 1), st.booleans()),
                 min_size=1, max_size=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_name=st.sampled_from(["layered", "mlp", "mlp-fsdp"]), cluster=st.sampled_from(sorted(CLUSTERS)),
       seed=st.integers(0, 10_000), walk=walks)
def test_delta_step_time_equals_the_full_simulation_over_random_plans_and_moves(graph_name, cluster, seed, walk):
    """Every move of the table, from random plans (with gather buckets and gather anchors on the fsdp
    step): the incremental step time is the full one (==)."""
    g, sim, ref, ctx = setup(graph_name, cluster)
    delta = DeltaSimulator(sim, cache_size=4)
    plan = start_plan(g, ctx, seed)
    assert delta.step_time(plan) == ref.step_time(plan)
    cur = plan
    for name, key, keep in walk:
        child = moves.MOVES[name](cur, ctx, random.Random(key))
        if child is None:
            continue
        assert delta.step_time(child, parent=cur) == ref.step_time(child), (name, child)
        if keep:
            cur = child


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_delta_reschedules_from_the_change_and_agrees_on_every_default_start(cluster):
    """The search's start plans and a walk of random moves from each: equal step times, and most
    children re-scheduled from a neighbour (not from scratch), placing fewer events than a full run."""
    from disco import search

    g, sim, ref, ctx = setup("layered", cluster)
    delta = DeltaSimulator(sim)
    rng = random.Random(7)
    full_events = 0
    children = 0
    for s in search.default_starts(g, sim, ctx):
        cur = moves.canonical(s, ctx)
        assert delta.step_time(cur) == ref.step_time(cur)
        for _ in range(12):
            child = moves.random_move(cur, ctx, rng)
            if child is None:
                continue
            assert delta.step_time(child, parent=cur) == ref.step_time(child)
            children += 1
            full_events += len(ref.run(child).timeline)
            cur = child if rng.random() < 0.5 else cur
    stats = delta.stats
    assert stats["delta"] + stats["same"] > children / 2
    assert stats["events"] < full_events / 2


def test_a_late_bucket_move_restarts_late_and_an_unchanged_plan_reuses_the_schedule():
    g, sim, ref, _ = setup("layered", "cpu")
    ars = [n.name for n in g.nodes if n.opcode == "all-reduce"]
    per_tensor = FusionPlan(buckets=tuple(Bucket((a,)) for a in ars))
    last_two = FusionPlan(buckets=(*(Bucket((a,)) for a in ars[:-2]), Bucket(tuple(ars[-2:]))))
    delta = DeltaSimulator(sim)
    assert delta.step_time(per_tensor) == ref.step_time(per_tensor)
    assert delta.step_time(last_two, parent=per_tensor) == ref.step_time(last_two)
    n_events = len(ref.run(last_two).timeline)
    assert 0 < delta.stats["events"] < n_events / 2  # only the tail of the step was re-scheduled
    same = per_tensor.replace(name="renamed")  # a new object, the same units
    assert delta.step_time(same, parent=per_tensor) == ref.step_time(per_tensor)
    assert delta.stats["same"] == 1


def _walk(delta, ref, ctx, cur, rng, name_at, steps=40):
    """A walk of ``steps`` moves (``name_at(k)``: the k-th move's name) from ``cur``, each child priced from
    its parent and checked against the full simulation; returns how many moves made a child."""
    made = 0
    for k in range(steps):
        name = name_at(k)
        child = moves.MOVES[name](cur, ctx, rng)
        if child is None:
            continue
        assert delta.step_time(child, parent=cur) == ref.step_time(child), (name, child)
        made += 1
        cur = child
    return made


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_anchor_moves_reschedule_from_the_parent_and_agree(cluster):
    """On the fsdp step each shift of a gather anchor (and each gather bucket move beside anchors) is
    re-patched from its parent (not priced whole), with the full simulation's step time."""
    g, sim, ref, ctx = setup("mlp-fsdp", cluster)
    delta = DeltaSimulator(sim)
    rng = random.Random(5)
    cur = moves.canonical(baselines.make("prefetch", g, distance=1), ctx)
    assert delta.step_time(cur) == ref.step_time(cur)
    made = _walk(delta, ref, ctx, cur, rng, lambda k: (
        "shift_anchor", "shift_anchor", "merge_gather_buckets", "split_gather_bucket")[k % 4])
    # the start priced whole, every child from its parent
    assert made > 20 and delta.stats["full"] == 1 and delta.stats["delta"] + delta.stats["same"] == made


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_gather_bucket_moves_reschedule_from_the_parent_and_agree(cluster):
    """On the fsdp step each gather bucket move is re-patched from its parent (not priced whole),
    with the full simulation's step time."""
    g, sim, ref, ctx = setup("mlp-fsdp", cluster)
    delta = DeltaSimulator(sim)
    rng = random.Random(3)
    cur = moves.canonical(baselines.make("xla_default", g), ctx)
    made = _walk(delta, ref, ctx, cur, rng, lambda k: (
        "merge_gather_buckets", "split_gather_bucket", "reset_gather_buckets")[k % 5 // 2])
    assert made > 20 and delta.stats["full"] == 0 and delta.stats["delta"] + delta.stats["same"] == made


def test_a_parent_out_of_the_cache_is_traced_again_and_results_stay_exact():
    g, sim, ref, ctx = setup("layered", "cpu")
    delta = DeltaSimulator(sim, cache_size=1)
    plans = [start_plan(g, ctx, s) for s in range(4)]
    assert delta.step_time(plans[0]) == ref.step_time(plans[0])
    assert delta.stats["traces"] == 0  # priced whole, its schedule recorded: no trace made for it later
    for p in plans[1:]:
        assert delta.step_time(p, parent=plans[0]) == ref.step_time(p)
    assert delta.stats["traces"] == 2  # plans[0] evicted by each child, traced again for the next two
    assert delta.trace(plans[0]) is None and delta.trace(plans[-1]) is not None


def test_a_trace_lives_as_long_as_its_plan():
    import gc

    g, sim, ref, ctx = setup("layered", "cpu")
    delta = DeltaSimulator(sim)
    parent = start_plan(g, ctx, 3)
    children = [moves.random_move(parent, ctx, random.Random(k)) for k in range(6)]
    children = [c for c in children if c is not None]
    for c in children:
        assert delta.step_time(c, parent=parent) == ref.step_time(c)
    assert len(delta) == len(children) + 1
    del children, c
    gc.collect()
    assert len(delta) == 1  # the parent's, still alive


def test_a_dropped_delta_simulator_frees_its_traces_at_once_without_the_cyclic_collector():
    import gc
    import weakref

    g, sim, ref, ctx = setup("layered", "cpu")
    parent = start_plan(g, ctx, 3)
    children = [c for c in (moves.random_move(parent, ctx, random.Random(k)) for k in range(6)) if c is not None]
    gc.collect()
    gc.disable()
    try:
        delta = DeltaSimulator(sim)
        for c in children:
            assert delta.step_time(c, parent=parent) == ref.step_time(c)
        trace = delta.trace(parent)
        assert trace is not None and delta.stats["delta"] + delta.stats["same"] == len(children)
        arrays = weakref.ref(trace.unit_of)  # the parent's per-node unit ids, held only by its trace
        del delta, trace
        # Freed by reference counting: a trace held in a reference cycle (as when the plans' weak
        # reference callbacks held the traces' dict) would live until the next full collection.
        assert arrays() is None
    finally:
        gc.enable()
    assert len(children) > 1  # (the plans outlive their traces: only the simulator went)


def test_errors_are_the_full_simulations():
    g, sim, _, _ = setup("layered", "cpu")
    delta = DeltaSimulator(sim)
    delta.step_time(FusionPlan())
    with pytest.raises(TypeError, match="expected a disco FusionPlan"):
        delta.step_time("not a plan")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not in the graph"):
        delta.step_time(FusionPlan(groups=(("nope", "nada"),)), parent=FusionPlan())
    with pytest.raises(TypeError, match="expected a disco Simulator"):
        DeltaSimulator(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_size: expected an integer >= 1, got 0"):
        DeltaSimulator(sim, cache_size=0)


def _schedule(trace):
    """A materialised trace's events: per event the unit, its end and the streams' free times."""
    return trace.order.tolist(), trace.fin[trace.order].tolist(), trace.tcs.tolist(), trace.tms.tolist()


_KERNEL_CASES = [(g, c, k) for g, c in [*(("mlp", c) for c in sorted(CLUSTERS)), ("long", "cpu"), ("long", "gpu"),
                                       ("mlp-fsdp", "cpu")]
                 for k in (True, False)]


@pytest.mark.parametrize("graph_name,cluster,compiled", [
    pytest.param(g, c, k, id=f"{g}-{c}-{'numba' if k else 'python'}",
                 marks=[pytest.mark.slow] if not k and g != "mlp" else []) for g, c, k in _KERNEL_CASES])
def test_the_compiled_and_the_plain_python_kernel_agree_with_the_full_simulation(graph_name, cluster, compiled,
                                                                                 monkeypatch):
    """disco.sim.array_sweep's kernel, compiled and as plain Python (its fallback without numba),
    over random plans and walks of moves: every step time == the full simulation's, and every event
    of a child re-scheduled from its parent (its unit, end and the streams' times after it, which
    its own children restart from) is the one a whole schedule of the child gives."""
    from disco.sim import array_sweep

    if compiled and not array_sweep.is_compiled():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(array_sweep, "is_compiled", lambda: compiled)
    g, sim, ref, ctx = setup(graph_name, cluster)
    delta = DeltaSimulator(sim)
    rng = random.Random(11)
    for seed in range(4):
        cur = start_plan(g, ctx, seed)
        assert delta.step_time(cur) == ref.step_time(cur)
        for _ in range(10):
            child = moves.random_move(cur, ctx, rng)
            if child is None:
                continue
            assert delta.step_time(child, parent=cur) == ref.step_time(child), child
            whole = DeltaSimulator(sim)
            whole.step_time(child)
            assert _schedule(delta.trace(child)) == _schedule(whole.trace(child)), child
            cur = child if rng.random() < 0.5 else cur
    assert delta.stats["delta"] > 0


def test_the_kernel_from_event_zero_is_the_schedulers_whole_step():
    """array_sweep.restart from event 0 over a plan's units (in any order) is the full simulation's
    step (==), and without a unit its readers wait on, it deadlocks (None)."""
    import numpy as np

    from disco.sim import array_sweep

    g, sim, ref, ctx = setup("layered", "cpu-one-stream")
    for seed in range(4):
        plan = start_plan(g, ctx, seed)
        delta = DeltaSimulator(sim)
        assert delta.step_time(plan) == ref.step_time(plan)
        trace = delta.trace(plan)
        assert trace is not None and len(trace.order) == trace.alive
        index = array_sweep.index_of(sim)
        none_i, none_f = np.zeros(0, np.int64), np.zeros(0)
        for compiled in (False, *([True] if array_sweep.is_compiled() else [])):
            run = array_sweep.restart(index.table, trace.order[::-1].copy(), 0, 0.0, 0.0, none_i, none_f,
                                      trace.unit_of, trace.unit_of, True, compiled=compiled)
            assert run is not None and run.step == ref.step_time(plan)
            assert sorted(run.units) == sorted(trace.order)
            # without the first unit placed (it has readers), they never become ready: a deadlock
            assert array_sweep.restart(index.table, trace.order[1:].copy(), 0, 0.0, 0.0, none_i, none_f,
                                       trace.unit_of, trace.unit_of, True, compiled=compiled) is None


def test_delta_simulators_over_one_simulator_share_unit_ids():
    from disco.sim import array_sweep

    g, sim, ref, ctx = setup("layered", "cpu")
    plan = start_plan(g, ctx, 5)
    a, b = DeltaSimulator(sim), DeltaSimulator(sim)
    assert a.step_time(plan) == b.step_time(plan) == ref.step_time(plan)
    n = array_sweep.index_of(sim).table.n
    assert a.trace(plan).unit_of.tolist() == b.trace(plan).unit_of.tolist()
    assert array_sweep.index_of(sim).table.n == n  # the second met no new unit


def _same_pieces(a, b) -> None:
    """Two plans' pieces hold the same groups, regions and buckets (their units, by identity)."""
    import numpy as np

    assert np.array_equal(a.owner, b.owner)
    assert a.regions.keys() == b.regions.keys()
    for c, r in a.regions.items():
        assert {id(it) for it in r[0]} == {id(it) for it in b.regions[c][0]}
        assert [id(u) for u in r[1][1]] == [id(u) for u in b.regions[c][1][1]]
    assert sorted((ms, id(u)) for ms, u in a.buckets.values()) == sorted((ms, id(u)) for ms, u in b.buckets.values())
    assert {m: a.buckets[k][0] for m, k in a.ar_owner.items()} == {m: b.buckets[k][0] for m, k in b.ar_owner.items()}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_name=st.sampled_from(["layered", "mlp"]), cluster=st.sampled_from(["cpu", "gpu"]),
       seed=st.integers(0, 10_000), walk=walks)
def test_a_repatched_plans_pieces_are_the_pieces_built_from_scratch(graph_name, cluster, seed, walk):
    """disco.sim.pieces: along a walk of moves, each child's pieces re-patched from its parent's (and
    materialised) are those built from the child whole: its group owners, regions and buckets."""
    from disco.sim import pieces

    g, sim, _, ctx = setup(graph_name, cluster)
    patcher = sim._patcher
    cur = start_plan(g, ctx, seed)
    cur_pieces = pieces.build(patcher, cur)
    for name, key, keep in walk:
        child = moves.MOVES[name](cur, ctx, random.Random(key))
        if child is None:
            continue
        hit = pieces.repatch(patcher, cur_pieces, cur, child)
        if hit is None:
            continue
        got = hit[0]
        got.materialise()
        _same_pieces(got, pieces.build(patcher, child))
        if keep:
            cur, cur_pieces = child, got


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_plans_that_share_their_groups_patch_them_once_and_agree(cluster, monkeypatch):
    """Start plans with one fusion and each bucketing, priced without a parent: the group part of
    the patch is made once per fusion mode, groups and cuts (by value: equal tuples, not the same
    objects), and every step time is the full simulation's."""
    from disco import search

    g, sim, ref, ctx = setup("layered", cluster)
    fused = search.greedy_fusion(g)  # (the CPU move context's groups, on every cluster)
    assert fused.groups
    plans = [fused] + [fused.replace(groups=tuple(tuple(grp) for grp in fused.groups),
                                     buckets=baselines.make(b, g).buckets)
                       for b in ("per_tensor", "one_bucket", "horovod", "xla_default")]
    plans.append(plans[1].replace(xla_fusion="off"))
    patcher = sim._patcher
    made = []
    monkeypatch.setattr(patcher, "group_patch", lambda plan, mode, **kw: made.append(plan.xla_fusion) or
                        type(patcher).group_patch(patcher, plan, mode, **kw))
    delta = DeltaSimulator(sim)
    for p in plans:
        assert delta.step_time(p) == ref.step_time(p), p.name
    assert sorted(made) == ["extend", "off"]


def test_freezing_the_collector_changes_no_result_and_is_off_for_small_graphs():
    """freeze_gc=True freezes the base state once a fusion mode has its unit ids (gc.freeze) and
    every step time is still the full simulation's, and release() unfreezes it; None leaves a small
    graph's collector alone, and so does the default (False) on any graph; a freeze_gc that is not a
    bool or None is refused."""
    import gc

    g, sim, ref, ctx = setup("layered", "cpu")
    plans = [moves.canonical(p, ctx) for p in baselines.make_all(g).values()]
    gc.unfreeze()
    try:
        delta = DeltaSimulator(sim, freeze_gc=None)
        assert [delta.step_time(p) for p in plans] == [ref.step_time(p) for p in plans]
        assert gc.get_freeze_count() == 0
        frozen = DeltaSimulator(Simulator(g, AnalyticCosts(), CLUSTERS["cpu"]), freeze_gc=True)
        assert frozen.step_time(plans[0]) == ref.step_time(plans[0])
        assert gc.get_freeze_count() > 0
        children = [moves.random_move(p, ctx, random.Random(k)) for k, p in enumerate(plans)]
        assert [frozen.step_time(c, p) for c, p in zip(children, plans) if c is not None] == [
            ref.step_time(c) for c in children if c is not None]
        frozen.release()
        assert gc.get_freeze_count() == 0
        frozen.release()  # once only
        by_default = DeltaSimulator(Simulator(g, AnalyticCosts(), CLUSTERS["cpu"]))
        by_default.step_time(plans[0])
        assert gc.get_freeze_count() == 0  # off unless asked for: the freeze is process-wide
    finally:
        gc.unfreeze()
    with pytest.raises(TypeError, match="freeze_gc"):
        DeltaSimulator(sim, freeze_gc="yes")  # type: ignore[arg-type]


unit_batches = st.lists(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 99), st.booleans(), st.integers(0, 3),
                                            st.lists(st.integers(0, 50), max_size=3),
                                            st.lists(st.tuples(st.integers(0, 50), st.integers(1, 2)), max_size=3)),
                                  max_size=40), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(batches=unit_batches)
def test_a_unit_table_grows_in_place_and_its_earlier_snapshots_never_change(batches):
    import types

    import numpy as np

    from disco.sim.array_sweep import UnitTable

    table = UnitTable()
    snapshots = [(table.arrays, [np.array(a) for a in table.arrays[1:]])]
    units = []
    for batch in batches:
        fresh = [types.SimpleNamespace(dur=d, prio=k, is_coll=c, indeg=i, preds=tuple(p), succ=tuple(s))
                 for d, k, c, i, p, s in batch]
        table.add(fresh)
        units += fresh
        snapshots.append((table.arrays, [np.array(a) for a in table.arrays[1:]]))
    for arrays, copies in snapshots:  # each as it was taken
        assert all(np.array_equal(a, c) for a, c in zip(arrays[1:], copies))
    n, dur, key, coll, indeg, pptr, pnode, sptr, snode, scnt = table.arrays
    assert n == len(units) and dur.tolist() == [u.dur for u in units] and key.tolist() == [u.prio for u in units]
    assert coll.tolist() == [u.is_coll for u in units] and indeg.tolist() == [u.indeg for u in units]
    assert [pnode[pptr[j]:pptr[j + 1]].tolist() for j in range(n)] == [list(u.preds) for u in units]
    assert [list(zip(snode[sptr[j]:sptr[j + 1]].tolist(), scnt[sptr[j]:sptr[j + 1]].tolist()))
            for j in range(n)] == [list(u.succ) for u in units]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n_nodes=st.integers(1, 30), n_units=st.integers(1, 12))
def test_the_first_event_an_added_unit_could_be_ready_at_is_its_definition(data, n_nodes, n_units):
    """_first_ready against its definition, unit by unit: over the added units with no input in a
    changed (removed or added) unit, the least of (the latest event of an input's unit) + 1, 0 for a
    unit without inputs; NEVER for none."""
    import types

    import numpy as np

    from disco.sim.delta import _NEVER, _first_ready

    old_of = np.array(data.draw(st.lists(st.integers(0, n_units - 1), min_size=n_nodes, max_size=n_nodes)))
    pos = np.array(data.draw(st.lists(st.sampled_from([0, 1, 2, 5, 9]), min_size=n_units,  # (placed: a kept unit is)
                                      max_size=n_units)), np.int64)
    nodes = st.integers(0, n_nodes - 1)

    def units(k):
        return [types.SimpleNamespace(members=tuple(data.draw(st.lists(nodes, min_size=1, max_size=3))),
                                      preds=tuple(data.draw(st.lists(nodes, max_size=4)))) for _ in range(k)]

    added, removed = units(data.draw(st.integers(1, 4))), units(data.draw(st.integers(0, 3)))
    changed = {m for u in added + removed for m in u.members}
    want = min((max((int(pos[old_of[p]]) + 1 for p in u.preds), default=0)
                for u in added if not changed.intersection(u.preds)), default=_NEVER)
    assert _first_ready(added, removed, pos, old_of) == want

"""Moves over the joint plan space: every move keeps a valid plan valid."""

from __future__ import annotations

import functools
import random

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings

from disco.plans import baselines
from disco.plans import moves
from disco.plans import random_plans
from disco.ir.graph import HloGraph, Node
from disco.plans.plan import Bucket, FusionPlan, make_plan


@functools.lru_cache(maxsize=None)
def mlp_tiny() -> HloGraph:
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    return disco.extract(step, *args)


@functools.lru_cache(maxsize=None)
def mlp_context() -> moves.MoveContext:
    return moves.context(mlp_tiny())


def node(name, opcode="multiply", **kw):
    return Node(name=name, opcode=opcode, computation="c", shape="f32[4]", dtype="f32",
                out_bytes=16, out_elements=4, flops=4.0, **kw)


def ar(name):
    return node(name, "all-reduce", grad_bytes=16, replica_groups="{{0,1}}", reduction="add")


def graph(nodes, edges):
    return HloGraph(name="g", nodes=tuple(nodes), edges=tuple(edges), fingerprint="f")


# r1 -> x -> r2: r1 and r2 can never share a bucket; r3 is independent of both.
CHAIN = graph([node("p", "parameter"), ar("r1"), node("x"), ar("r2"), ar("r3")],
              [(0, 1), (1, 2), (2, 3), (0, 4)])


def assert_checked(plan: FusionPlan) -> None:
    """The plan passes FusionPlan's field type checks (moves make plans with ``derive``, which skips
    them): rebuilt through the constructor, it is equal (a list where a tuple belongs is not)."""
    fields = {name: getattr(plan, name) for name in FusionPlan.__dataclass_fields__}
    assert FusionPlan(**fields) == plan


# -- hand-made cases ---------------------------------------------------------------------------
@pytest.mark.fast
def test_buckets_never_merge_dependent_all_reduces():
    ctx = moves.context(CHAIN)
    start = baselines.make("per_tensor", CHAIN)
    seen = set()
    for seed in range(40):
        plan = moves.merge_buckets(start, ctx, random.Random(seed))
        assert plan is not None, "r2 and r3 can always merge"
        plan.validate(CHAIN)
        seen.add(tuple(b.members for b in plan.buckets))
    assert seen == {(("r1",), ("r2", "r3"))}


@pytest.mark.fast
def test_merge_returns_none_when_every_pair_forms_a_cycle():
    ctx = moves.context(CHAIN)
    plan = make_plan(buckets=[["r1", "r3"], ["r2"]])
    assert all(moves.merge_buckets(plan, ctx, random.Random(s)) is None for s in range(10))
    for s in range(20):
        child = moves.shift_gradient(plan, ctx, random.Random(s))
        # only r3 may move: r2 joining r1's bucket forms a cycle
        assert child is None or [b.members for b in child.buckets] == [("r1",), ("r2", "r3")]


@pytest.mark.fast
def test_moves_do_not_apply_without_groups_or_buckets():
    ctx = moves.context(CHAIN)
    plan = FusionPlan()
    for name in ("split_group", "move_op", "merge_buckets", "split_bucket", "shift_gradient", "switch_build"):
        assert moves.MOVES[name](plan, ctx, random.Random(0)) is None, name
    assert moves.toggle_xla_fusion(plan, ctx, random.Random(0)).xla_fusion == "off"


@pytest.mark.fast
def test_switch_build_toggles_concat_and_rs_ag_where_the_group_size_is_known():
    ctx = moves.context(CHAIN)
    plan = make_plan(buckets=[["r1", "r3"], ["r2"]])
    builds = set()
    for s in range(20):
        child = moves.switch_build(plan, ctx, random.Random(s))
        child.validate(CHAIN)
        assert [b.members for b in child.buckets] == [b.members for b in plan.buckets]
        (changed,) = [i for i, (a, b) in enumerate(zip(plan.buckets, child.buckets)) if a != b]
        assert child.buckets[changed].build == "rs_ag"
        assert moves.switch_build(child, ctx, random.Random(0)) is not None
        builds.add(changed)
    assert builds == {0, 1}
    back = FusionPlan(buckets=(Bucket(("r1", "r3"), "rs_ag"), Bucket(("r2",), "rs_ag")))
    assert {moves.switch_build(back, ctx, random.Random(s)).buckets.count(Bucket(("r2",), "concat"))
            for s in range(20)} == {0, 1}
    unknown = graph([node("p", "parameter"),
                     node("r", "all-reduce", grad_bytes=16, replica_groups="{}", reduction="add")], [(0, 1)])
    assert moves.switch_build(make_plan(buckets=[["r"]]), moves.context(unknown), random.Random(0)) is None


def test_fuse_grows_groups_with_one_output():
    ctx = mlp_context()
    plan, rng = FusionPlan(), random.Random(0)
    for _ in range(30):
        plan = moves.fuse(plan, ctx, rng) or plan
    assert plan.groups and max(len(g) for g in plan.groups) > 2
    plan.validate(mlp_tiny())


def test_canonical_is_idempotent_and_keeps_the_meaning():
    ctx = mlp_context()
    plan = random_plans.random_plan(mlp_tiny(), 3)
    c = moves.canonical(plan, ctx)
    assert moves.canonical(c, ctx) == c
    assert sorted(map(sorted, c.groups)) == sorted(sorted(g) for g in plan.groups if len(g) > 1)
    assert sorted(map(sorted, (b.members for b in c.buckets))) == sorted(sorted(b.members) for b in plan.buckets)


def test_unknown_move_weight_is_named():
    with pytest.raises(ValueError, match=r"unknown moves \['teleport'\]; expected some of"):
        moves.random_move(FusionPlan(), mlp_context(), random.Random(0), {"teleport": 1.0})


# -- property tests ----------------------------------------------------------------------------
MOVE_NAMES = sorted(moves.MOVES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.one_of(st.sampled_from(baselines.NAMES), st.integers(0, 10_000)),
       sequence=st.lists(st.tuples(st.sampled_from(MOVE_NAMES), st.integers(0, 2**31)), min_size=1, max_size=40))
def test_random_move_sequences_keep_zoo_plans_valid(start, sequence):
    g, ctx = mlp_tiny(), mlp_context()
    plan = (baselines.make(start, g) if isinstance(start, str) else random_plans.random_plan(g, start))
    plan = moves.canonical(plan, ctx)
    applied = 0
    for name, seed in sequence:
        child = moves.MOVES[name](plan, ctx, random.Random(seed))
        if child is not None:
            child.validate(g)
            assert_checked(child)
            assert moves.canonical(child, ctx) == child, f"{name} returned a plan out of canonical form"
            plan, applied = child, applied + 1
    event(f"applied {min(applied, 10) // 5 * 5}+ moves")


@st.composite
def dags_with_all_reduces(draw):
    """A random DAG of fusible ops and all-reduces (some depending on others)."""
    n = draw(st.integers(3, 14))
    edges = sorted({(i, j) for i in range(n) for j in range(i + 1, min(n, i + 5))
                    if draw(st.integers(0, 2)) == 0})
    kinds = draw(st.lists(st.sampled_from(["multiply", "add", "all-reduce", "dot"]), min_size=n, max_size=n))
    nodes = [ar(f"n{i}") if k == "all-reduce" else node(f"n{i}", k) for i, k in enumerate(kinds)]
    return graph(nodes, edges)


@pytest.mark.fast
@settings(max_examples=150, deadline=None)
@given(g=dags_with_all_reduces(), seeds=st.lists(st.integers(0, 2**31), min_size=1, max_size=30))
def test_random_moves_on_random_dags_stay_valid(g, seeds):
    ctx = moves.context(g)
    ars = [n.name for n in g.nodes if n.is_all_reduce]
    plan = FusionPlan(buckets=tuple(Bucket((a,)) for a in ars) if ars else None)
    for seed in seeds:
        child = moves.random_move(plan, ctx, random.Random(seed))
        if child is not None:
            child.validate(g)
            assert_checked(child)
            plan = child
    event(f"{len(plan.groups)} groups, {len(plan.buckets or ())} buckets")


@pytest.mark.fast
def test_bucket_moves_leave_a_tuple_bucket_of_several_dtypes_as_it_is():
    # A "tuple" bucket may mix dtypes; merging, splitting or shifting rebuilt it "concat", which
    # needs one dtype: from this valid start the search returned plans validate refuses.
    g = graph([node("p", "parameter"), ar("a"),
               Node(name="b", opcode="all-reduce", computation="c", shape="bf16[4]", dtype="bf16", out_bytes=8,
                    out_elements=4, flops=4.0, grad_bytes=8, replica_groups="{{0,1}}", reduction="add"),
               ar("c"), ar("d")], [(0, 1), (0, 2), (0, 3), (0, 4)])
    ctx = moves.context(g)
    start = FusionPlan(buckets=(Bucket(("a", "b", "c"), "tuple"), Bucket(("d",))))
    start.validate(g)
    for name in ("merge_buckets", "split_bucket", "shift_gradient"):
        for seed in range(30):
            child = moves.MOVES[name](start, ctx, random.Random(seed))
            assert child is None or child.buckets[0] == start.buckets[0], name
            if child is not None:
                child.validate(g)


# -- gather buckets (a step with sharded parameters) -------------------------------------------
GATHER_MOVES = ("merge_gather_buckets", "split_gather_bucket", "reset_gather_buckets")
WORLD = "{{0,1,2,3}}"


def gather(name, operand, groups=WORLD, dtype="f32"):
    return Node(name=name, opcode="all-gather", computation="c", shape=f"{dtype}[16]", dtype=dtype, out_bytes=64,
                out_elements=16, flops=0.0, operands=(operand,), replica_groups=groups)


def param(name, dtype="f32"):
    return Node(name=name, opcode="parameter", computation="c", shape=f"{dtype}[4]", dtype=dtype, out_bytes=16,
                out_elements=4, flops=0.0)


@functools.lru_cache(maxsize=None)
def fsdp_graph(mesh_shape=None) -> HloGraph:
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, style="fsdp", mesh_shape=mesh_shape,
                                             optimizer="sgd")
    return disco.extract(step, *args)


@pytest.mark.fast
def test_gather_moves_merge_only_parameter_gathers_of_one_class_next_in_program_order():
    # a, b, c: parameter shards gathered over the world, updated by the step; d over other groups;
    # e bf16; h gathers an all-reduce's result (a collective above it): no gather bucket takes it
    spec = [param("pa"), param("pb"), param("pc"), param("pd"), param("pe", "bf16"),
            gather("a", "pa"), gather("b", "pb"), gather("d", "pd", "{{0,1},{2,3}}"), gather("e", "pe", dtype="bf16"),
            gather("c", "pc"), node("y", "dot", operands=("a", "b")),
            node("r", "all-reduce", operands=("y",), replica_groups=WORLD, reduction="add"),
            gather("h", "r"), node("z", "dot", operands=("h", "c", "d", "e"))]
    for n in ("a", "b", "c", "d"):  # each parameter updated: p - gathered value, a step output
        spec.append(node(f"new_{n}", "subtract", operands=(f"p{n}", n)))
    spec.append(Node(name="new_e", opcode="subtract", computation="c", shape="bf16[4]", dtype="bf16", out_bytes=8,
                     out_elements=4, flops=4.0, operands=("pe", "e")))
    spec.append(node("out", "tuple", operands=("z", *(f"new_{n}" for n in "abcde"))))
    index = {n.name: i for i, n in enumerate(spec)}
    g = graph(spec, sorted({(index[o], i) for i, n in enumerate(spec) for o in n.operands}))
    roles = {c.name: c.role for c in g.collective_roles()}
    assert [n for n in "abcdeh" if roles[n] == "param_gather"] == list("abcde")
    ctx = moves.context(g)
    assert sorted(ctx.names[i] for i in ctx.gather_class) == list("abcde")
    merged = {moves.merge_gather_buckets(FusionPlan(), ctx, random.Random(s)).gather_buckets for s in range(30)}
    assert merged == {(("a", "b"),), (("b", "c"),)}  # c follows b in the class of a, b and c; d, e alone
    plan = make_plan(gather_buckets=[["a", "b"]])
    assert {moves.merge_gather_buckets(plan, ctx, random.Random(s)).gather_buckets for s in range(10)} == {
        (("a", "b", "c"),)}
    assert moves.split_gather_bucket(plan, ctx, random.Random(0)).gather_buckets == ()  # two of one: none
    assert moves.reset_gather_buckets(plan, ctx, random.Random(0)).gather_buckets is None
    kept = make_plan(gather_buckets=[["a", "h"]])  # a start's bucket the moves may not change
    for s in range(10):
        for name in GATHER_MOVES[:2]:
            child = moves.MOVES[name](kept, ctx, random.Random(s))
            assert child is None or ("a", "h") in child.gather_buckets


@pytest.mark.fast
def test_gather_moves_do_not_apply_without_parameter_gathers():
    ctx = moves.context(CHAIN)
    assert not ctx.gather_class
    for name in GATHER_MOVES:
        assert moves.MOVES[name](FusionPlan(), ctx, random.Random(0)) is None, name


def test_a_graph_without_all_gathers_draws_the_moves_it_drew_before():
    """random_move's default draws on a step without sharded parameters are DEFAULT_WEIGHTS' own:
    the same moves in the same order for a seed (the gather moves' weights are not in the draw)."""
    g, ctx = mlp_tiny(), mlp_context()
    assert not ctx.gather_class and not any(n.opcode == "all-gather" for n in g.nodes)
    plan = moves.canonical(baselines.make("per_tensor", g), ctx)
    a, b = plan, plan
    for seed in range(60):
        a = moves.random_move(a, ctx, random.Random(seed)) or a
        b = moves.random_move(b, ctx, random.Random(seed), moves.DEFAULT_WEIGHTS) or b
        assert a == b and a.gather_buckets is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mesh_shape=st.sampled_from([None, (2, 4)]),
       start=st.sampled_from(["xla_default", "per_tensor", *baselines.GATHER_NAMES, "prefetch:1", "prefetch:2"]),
       seeds=st.lists(st.integers(0, 2**31), min_size=1, max_size=40))
def test_random_moves_on_an_fsdp_step_keep_gather_bucket_plans_valid(mesh_shape, start, seeds):
    """Gather buckets and gather anchors (from the prefetch distances too): every plan the moves make
    validates (no bucket waits on an anchor below its own use, no anchor is left inside a group)."""
    g = fsdp_graph(mesh_shape)
    ctx = moves.context(g)
    assert len(ctx.gather_class) == 17  # mlp tiny's sharded parameters, one all-gather each
    plan = moves.canonical(baselines.parse_item(start).make(g), ctx)
    for seed in seeds:
        child = moves.random_move(plan, ctx, random.Random(seed))
        if child is None:
            continue
        child.validate(g)
        assert_checked(child)
        assert moves.canonical(child, ctx) == child
        plan = child
    for b in plan.gather_buckets or ():
        assert len(b) > 1 and len({ctx.gather_class[ctx.index[m]] for m in b}) == 1
    event(f"{len(plan.gather_buckets or ())} gather buckets")
    event(f"{len(plan.gather_after) > 0} gather anchors")



@pytest.mark.fast
@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(0, 12), offset=st.integers(0, 3), ordered=st.booleans())
def test_placing_a_moves_new_entries_is_sorting_every_kept_and_new_entry_by_its_first_member(data, n, offset, ordered):
    """_finish's _placed against its definition: the entries not removed, and the new, sorted by
    first member (members are disjoint, so first members are distinct); also from an unsorted
    old order (a plan not canonical) and with an entry without members (first member -1)."""
    firsts = data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
    if ordered:
        firsts.sort()
    elif n:
        firsts[data.draw(st.integers(0, n - 1))] = -1  # an empty group
    old = tuple(f"e{f}" for f in firsts)
    gone = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n))) if n else []
    fresh = data.draw(st.lists(st.integers(0, 40).filter(lambda f: f not in firsts), unique=True, max_size=5))
    new = [(f, f"n{f}") for f in fresh]
    got = moves._placed(old, firsts, [k + offset for k in gone], new, offset)
    kept = [(f, x) for k, (f, x) in enumerate(zip(firsts, old)) if k not in gone and f >= 0]
    assert got == tuple(x for _, x in sorted(kept + new))

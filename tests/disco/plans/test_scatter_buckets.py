"""A plan's "scatter" buckets: valid only over gradient scatters (each member named when it is not one),
round-tripped through the plan's JSON, rewritten to one reduce-scatter, switched to and from by
``switch_build``, made by the ``scatter_buckets`` baseline."""

from __future__ import annotations

import random

import pytest

from disco.ir.graph import HloGraph
from disco.plans import baselines, moves
from disco.plans.plan import Bucket, FusionPlan
from tests.support.fsdp_hlo import fsdp_text
from xla_hooks.rewrite import apply_plan_to_text, count_ops


def plan_of(*buckets: tuple[tuple[str, ...], str]) -> FusionPlan:
    return FusionPlan(buckets=tuple(Bucket(m, b) for m, b in buckets))


@pytest.mark.fast
def test_a_scatter_bucket_of_a_gradient_scatter_is_valid_and_round_trips():
    graph = HloGraph.from_hlo_text(fsdp_text())
    plan = plan_of((("ar",), "scatter"), (("loss",), "concat")).validate(graph)
    assert FusionPlan.from_json(plan.to_json()) == plan
    assert FusionPlan.from_json(plan.to_json()).buckets[0].build == "scatter"


@pytest.mark.fast
def test_a_member_that_is_no_gradient_scatter_is_refused_by_name():
    graph = HloGraph.from_hlo_text(fsdp_text())
    with pytest.raises(ValueError, match=r"^bucket 1: 'loss' cannot be in a 'scatter' bucket: it is a '[a-z_]+' "
                                         r"all-reduce, not a 'grad_scatter'.*use build 'concat'"):
        plan_of((("ar",), "scatter"), (("loss",), "scatter")).validate(graph)
    uneven = HloGraph.from_hlo_text(fsdp_text(positions=[0, 0, 2, 3]))
    with pytest.raises(ValueError, match=r"^bucket 0: 'ar' cannot be in a 'scatter' bucket: its dynamic-slice 'slice' "
                                         r"over the replica group \[0, 1, 2, 3\]: block 0 is kept by 2 of its 4 devices "
                                         r"\(\[0, 1\]\) and block 1 by none; a reduce-scatter needs each of the 4 "
                                         r"blocks kept by 1"):
        plan_of((("ar",), "scatter"), (("loss",), "concat")).validate(uneven)


@pytest.mark.fast
def test_a_group_holding_the_slice_a_scatter_bucket_replaces_is_refused():
    graph = HloGraph.from_hlo_text(fsdp_text())
    plan = plan_of((("ar",), "scatter"), (("loss",), "concat")).replace(groups=(("slice", "new"),))
    with pytest.raises(ValueError, match=r"^bucket 0: build 'scatter' replaces 'ar''s dynamic-slice 'slice', which "
                                         r"group 0 holds"):
        plan.validate(graph)
    plan.replace(buckets=plan_of((("ar",), "concat"), (("loss",), "concat")).buckets).validate(graph)  # concat: fine


@pytest.mark.fast
@pytest.mark.parametrize(("shard", "dim"), [((3, 2), 0), ((3, 2), 1), ((3, 2, 5), 1), ((3, 2, 5), 2)])
def test_the_rewrite_is_one_reduce_scatter_in_place_of_the_all_reduce_and_its_slice(shard, dim):
    text = fsdp_text(dim=dim, n_groups=2, shard=shard)
    graph = HloGraph.from_hlo_text(text)
    plan = plan_of((("ar",), "scatter"), (("loss",), "concat")).validate(graph)
    out = apply_plan_to_text(text, plan)
    assert count_ops(out, ["reduce-scatter", "all-reduce", "transpose"]) == {
        "reduce-scatter": 1, "all-reduce": 1, "transpose": 2 if dim else 0}
    rewritten = HloGraph.from_hlo_text(out)
    n = 1
    for d in shard:
        n *= d
    rs = next(nd for nd in rewritten.nodes if nd.opcode == "reduce-scatter")
    assert rs.shape == f"f32[1,{n}]" and rs.replica_groups == "{{0,1,2,3},{4,5,6,7}}"
    by_name = {nd.name: nd for nd in rewritten.nodes}
    assert by_name["slice"].opcode == "reshape" and by_name["slice"].shape == f"f32[{','.join(map(str, shard))}]"
    if dim:  # the scattered dimension to the front and back: the same permutation undone
        front, back = (nd for nd in rewritten.nodes if nd.opcode == "transpose")
        assert front.shape == f"f32[{4 * shard[dim]},{','.join(str(d) for i, d in enumerate(shard) if i != dim)}]"
        assert back.shape == by_name["slice"].shape


@pytest.mark.fast
@pytest.mark.parametrize("dim", [0, 1])
def test_a_data_x_fsdp_scatter_is_rewritten_to_a_reduce_scatter_over_fsdp_then_an_all_reduce_over_data(dim):
    text = fsdp_text(p=8, blocks=4, positions=[0, 1, 2, 3] * 2, dim=dim)
    graph = HloGraph.from_hlo_text(text)
    out = apply_plan_to_text(text, plan_of((("ar",), "scatter"), (("loss",), "concat")).validate(graph))
    assert count_ops(out, ["reduce-scatter", "all-reduce"]) == {"reduce-scatter": 1, "all-reduce": 2}  # and the loss's
    by_name = {nd.name: nd for nd in HloGraph.from_hlo_text(out).nodes}
    rs = next(nd for nd in by_name.values() if nd.opcode == "reduce-scatter")
    ar = by_name["disco.bucket.0"]
    assert (rs.shape, rs.replica_groups) == ("f32[1,6]", "{{0,1,2,3},{4,5,6,7}}")  # [4, 6] rows by block
    assert (ar.opcode, ar.shape, ar.replica_groups, ar.operands) == ("all-reduce", "f32[1,6]", "{{0,4},{1,5},{2,6},{3,7}}",
                                                                    (rs.name,))
    assert "channel_id=3" in out  # the new all-reduce's channel: after the module's 1 and 2
    assert by_name["slice"].opcode == "reshape" and by_name["slice"].shape == "f32[3,2]"


@pytest.mark.fast
def test_a_table_in_another_order_reduce_scatters_over_the_group_listed_in_block_order():
    text = fsdp_text(positions=[1, 0, 3, 2], n_groups=2)
    graph = HloGraph.from_hlo_text(text)
    out = apply_plan_to_text(text, plan_of((("ar",), "scatter"), (("loss",), "concat")).validate(graph))
    rs = next(nd for nd in HloGraph.from_hlo_text(out).nodes if nd.opcode == "reduce-scatter")
    assert rs.replica_groups == "{{1,0,3,2},{5,4,7,6}}"


@pytest.mark.fast
def test_switch_build_goes_to_scatter_and_back_on_gradient_scatters_only():
    graph = HloGraph.from_hlo_text(fsdp_text())
    ctx = moves.context(graph)
    assert set(ctx.ar_scatterable) == {ctx.index["ar"]}
    assert ctx.index["slice"] not in ctx.fusible_nodes  # no move puts the replaced slice in a group
    plan = plan_of((("ar",), "concat"), (("loss",), "concat"))
    builds = {moves.switch_build(plan, ctx, random.Random(s)).buckets[0].build for s in range(40)
              if moves.switch_build(plan, ctx, random.Random(s)).buckets[1].build == "concat"}
    assert builds == {"scatter", "rs_ag"}
    children = [moves.switch_build(plan, ctx, random.Random(s)) for s in range(40)]
    for child in children:
        child.validate(graph)
        assert child.buckets[1].build != "scatter"  # the loss's all-reduce never becomes one
    scattered = plan_of((("ar",), "scatter"), (("loss",), "concat"))
    back = {moves.switch_build(scattered, ctx, random.Random(s)).buckets[0].build for s in range(40)}
    assert back <= {"concat", "scatter"} and "concat" in back
    # a start plan's group holds the slice: that bucket stays "concat" (rs_ag only)
    grouped = plan.replace(groups=(("slice", "new"),))
    assert all(moves.switch_build(grouped, ctx, random.Random(s)).buckets[0].build in ("rs_ag", "concat")
               for s in range(20))


@pytest.mark.fast
def test_on_a_data_x_fsdp_mesh_switch_build_and_the_baseline_make_scatter_buckets():
    graph = HloGraph.from_hlo_text(fsdp_text(p=8, blocks=4, positions=[0, 1, 2, 3] * 2))
    ctx = moves.context(graph)
    assert set(ctx.ar_scatterable) == {ctx.index["ar"]} and set(ctx.ar_scatter_way.values()) == {0}
    plan = plan_of((("ar",), "concat"), (("loss",), "concat"))
    children = [moves.switch_build(plan, ctx, random.Random(s)) for s in range(40)]
    assert "scatter" in {c.buckets[0].build for c in children}
    for child in children:
        child.validate(graph)
    assert baselines.make("scatter_buckets", graph).buckets == (Bucket(("ar",), "scatter"), Bucket(("loss",), "concat"))


@pytest.mark.fast
def test_the_scatter_buckets_baseline():
    graph = HloGraph.from_hlo_text(fsdp_text())
    plan = baselines.make("scatter_buckets", graph)
    assert plan.buckets == (Bucket(("ar",), "scatter"), Bucket(("loss",), "concat"))
    replicated = HloGraph.from_hlo_text(fsdp_text().replace("dynamic-slice(%ar", "dynamic-slice(%g"))
    with pytest.raises(ValueError, match=r"^baseline 'scatter_buckets': the graph has no gradient scatter"):
        baselines.make("scatter_buckets", replicated)

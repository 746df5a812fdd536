"""FusionPlan.gather_after (gather anchors: the prefetch distance): the JSON form, validation messages,
the ``prefetch`` baseline and the ``shift_anchor`` move."""

from __future__ import annotations

import json
import random

import pytest

from disco.ir.graph import HloGraph
from disco.plans import baselines, moves
from disco.plans.naming import content_name
from disco.plans.plan import FusionPlan, decisions, make_plan

# Two sharded weights w0, w1 gathered (ag0, ag1), a dot each, their gradients sliced back and
# subtracted: both gathers are parameter gathers. t0 -> e0 is an elementwise chain between the dots.
TEXT = """HloModule m, entry_computation_layout={(f32[2,8]{1,0}, f32[2,8]{1,0}, f32[4,8]{1,0})->(f32[2,8]{1,0}, f32[2,8]{1,0})}

ENTRY %main (w0: f32[2,8], w1: f32[2,8], x: f32[4,8]) -> (f32[2,8], f32[2,8]) {
  %w0 = f32[2,8]{1,0} parameter(0)
  %w1 = f32[2,8]{1,0} parameter(1)
  %x = f32[4,8]{1,0} parameter(2)
  %ag0 = f32[8,8]{1,0} all-gather(%w0), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %h0 = f32[4,8]{1,0} dot(%x, %ag0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %t0 = f32[4,8]{1,0} tanh(%h0)
  %e0 = f32[4,8]{1,0} exponential(%t0)
  %ag1 = f32[8,8]{1,0} all-gather(%w1), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %h1 = f32[4,8]{1,0} dot(%e0, %ag1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g0 = f32[8,8]{1,0} dot(%x, %h1), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %s0 = f32[2,8]{1,0} slice(%g0), slice={[0:2], [0:8]}
  %n0 = f32[2,8]{1,0} subtract(%w0, %s0)
  %g1 = f32[8,8]{1,0} dot(%e0, %h1), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %s1 = f32[2,8]{1,0} slice(%g1), slice={[0:2], [0:8]}
  %n1 = f32[2,8]{1,0} subtract(%w1, %s1)
  ROOT %out = (f32[2,8]{1,0}, f32[2,8]{1,0}) tuple(%n0, %n1)
}
"""
GRAPH = HloGraph.from_hlo_text(TEXT)


@pytest.mark.fast
def test_the_step_gathers_two_parameters():
    assert sorted(c.name for c in GRAPH.collective_roles() if c.role == "param_gather") == ["ag0", "ag1"]


@pytest.mark.fast
def test_gather_after_round_trips_and_leaves_other_plans_json_as_it_was():
    p = make_plan(gather_after=[["ag1", "h0"]], name="p").validate(GRAPH)
    q = FusionPlan.from_json(p.to_json())
    assert q == p and q.digest() == p.digest() and q.gather_after == (("ag1", "h0"),)
    assert json.loads(p.to_json())["gather_after"] == [["ag1", "h0"]]
    plain = make_plan(cuts=[["t0", "e0"]])
    assert "gather_after" not in plain.to_dict() and "gather_anchors" not in plain.summary()
    assert FusionPlan.from_json(plain.to_json()).gather_after == ()
    assert not p.is_default and p.summary()["gather_anchors"] == 1
    assert decisions(p) == ("1 gather anchor",) and "1 gather anchor" in repr(p)
    assert "_pf1_" in content_name(p)
    # a barrier on CPU holds only with XLA:CPU's barrier expander off (as for cuts); none to turn off on GPU
    assert "cse_barrier_expander" in p.compiler_options("cpu")["xla_disable_hlo_passes"]
    assert p.disabled_passes("gpu") == ()


@pytest.mark.fast
@pytest.mark.parametrize(("data", "match"), [
    ({"schema_version": 1, "gather_after": [["ag1"]]}, r"gather_after\.0"),
    ({"schema_version": 1, "gather_after": "ag1"}, "gather_after"),
    ({"schema_version": 1, "gather_after": [["ag1", 2]]}, r"gather_after\.0\.1"),
])
def test_schema_errors_name_the_gather_after_field(data, match):
    with pytest.raises(ValueError, match=match):
        FusionPlan.from_dict(data)


@pytest.mark.fast
def test_a_list_where_a_tuple_belongs_is_refused():
    with pytest.raises(TypeError, match=r"FusionPlan.gather_after: expected a tuple of \(all-gather, anchor\)"):
        FusionPlan(gather_after=[("ag1", "h0")])
    with pytest.raises(TypeError, match=r"make_plan: gather_after: expected lists of instruction names"):
        make_plan(gather_after="ag1")


@pytest.mark.fast
@pytest.mark.parametrize(("kw", "match"), [
    ({"gather_after": [["nope", "h0"]]}, r"gather anchor 0 \('nope' after 'h0'\): all-gather 'nope' is not in the graph"),
    ({"gather_after": [["ag1", "nope"]]}, r"anchor 'nope' is not in the graph"),
    ({"gather_after": [["ag1", "h0"], ["ag1", "h0"]]}, r"gather anchor 1: \('ag1', 'h0'\) is listed twice"),
    ({"gather_after": [["h1", "h0"]]}, r"'h1' is a dot, not an all-gather; an anchor holds back a parameter all-gather"),
    ({"gather_after": [["ag1", "ag0"]]}, r"the anchor is a all-gather; an anchor is a compute op"),
    ({"gather_after": [["ag1", "x"]]}, r"the anchor is a parameter, which computes nothing"),
    ({"gather_after": [["ag1", "out"]]}, r"the anchor is a tuple, which computes nothing"),
    ({"gather_after": [["ag0", "t0"]]}, r"the anchor 't0' is downstream of 'ag0' .* wait on its own result"),
    ({"gather_after": [["ag1", "t0"]], "groups": [["t0", "e0"]]}, r"the anchor 't0' is inside group 0, not its output"),
    # the anchor is below ag0, which shares ag1's bucket: the bucket would wait on itself
    ({"gather_after": [["ag1", "h0"]], "gather_buckets": [["ag0", "ag1"]]},
     r"gather bucket 0: contracting the plan forms a cycle along"),
])
def test_validation_names_the_gather_anchor_and_what_is_wrong(kw, match):
    with pytest.raises(ValueError, match=match):
        make_plan(**kw).validate(GRAPH)


@pytest.mark.fast
def test_an_anchor_that_is_its_groups_output_is_valid():
    make_plan(gather_after=[["ag1", "e0"]], groups=[["t0", "e0"]]).validate(GRAPH)


@pytest.mark.fast
def test_shift_anchor_moves_an_anchor_between_first_uses_and_keeps_plans_valid():
    ctx = moves.context(GRAPH)
    names = [ctx.names[a] for a in ctx.anchors]
    assert names == ["h0", "h1"]  # each gather's first use: its dot
    seen = set()
    for seed in range(40):
        child = moves.shift_anchor(FusionPlan(), ctx, random.Random(seed))
        if child is not None:
            child.validate(GRAPH)
            seen.add(child.gather_after)
    # only ag1 may wait (for h0, before ag1's first reader); ag0's only candidate is its own use
    assert seen == {(("ag1", "h0"),)}
    plan = make_plan(gather_after=[["ag1", "h0"]])
    earlier = {moves.shift_anchor(plan, ctx, random.Random(s)) for s in range(20)} - {None}
    assert {p.gather_after for p in earlier} == {()}  # before the first candidate: no anchor


def prefetch_graph():
    from tests.disco.plans.test_moves import fsdp_graph

    return fsdp_graph()


def test_prefetch_anchors_each_layer_on_the_first_use_of_the_layer_d_before():
    g = prefetch_graph()  # mlp tiny in fsdp style: Dense_0 .. Dense_8, a kernel and a bias each (Dense_8 none)
    index = g.index()
    dots = [n.name for n in g.nodes if n.opcode == "dot"]
    layer = {c.name: baselines.layer_of(c.param) for c in g.collective_roles() if c.role == "param_gather"}
    for d in baselines.PREFETCH_DISTANCES:
        plan = baselines.make("prefetch", g, distance=d)
        assert plan.name == f"prefetch_{d}" and plan.gather_buckets is None
        # the first d layers wait for nothing; layer k's gathers wait for layer k - d's first dot
        assert {layer[a] for a, _ in plan.gather_after} == {f"Dense_{k}" for k in range(d, 9)}
        for gather, anchor in plan.gather_after:
            k = int(layer[gather].split("_")[1])
            assert anchor == dots[k - d] and index[anchor] < index[gather]
    assert baselines.parse_item("prefetch:2").row == "prefetch_2" and baselines.item_of_row("prefetch_2") == "prefetch:2"
    assert baselines.parse_item("prefetch").make(g) == baselines.make("prefetch", g, distance=1)
    with pytest.raises(ValueError, match="distance"):
        baselines.make("prefetch", g, distance=0)
    with pytest.raises(ValueError, match="no parameter all-gather"):
        baselines.make("prefetch", HloGraph.from_hlo_text(TEXT.replace("all-gather(%w1)", "negate(%w1)")
                                                        .replace("all-gather(%w0)", "negate(%w0)")
                                                        .replace(", channel_id=1, replica_groups={{0,1,2,3}}, "
                                                                 "dimensions={0}, use_global_device_ids=true", "")
                                                        .replace(", channel_id=2, replica_groups={{0,1,2,3}}, "
                                                                 "dimensions={0}, use_global_device_ids=true", "")))


def test_the_search_starts_from_the_prefetch_distances_on_a_sharded_step():
    from disco import search

    g = prefetch_graph()
    names = [p.name for p in search.default_starts(g)]
    assert {"prefetch_1", "prefetch_2", "per_layer_gathers+prefetch_1"} <= set(names)

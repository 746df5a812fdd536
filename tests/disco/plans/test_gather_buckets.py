"""FusionPlan.gather_buckets: the JSON form, the digest of plans without them, validation messages."""

from __future__ import annotations

import json

import pytest

from disco.ir.graph import HloGraph, Node
from disco.plans.plan import FusionPlan, decisions, make_plan


def node(name, opcode="add", dtype="f32", groups=None):
    return Node(name=name, opcode=opcode, computation="c", shape=f"{dtype}[8]", dtype=dtype, out_bytes=32,
                out_elements=8, flops=0.0, replica_groups=groups)


FSDP = "{{0,1,2,3}}"
# p1 -> g1 -> d -> g4 (an activation's gather, after g1); p2 -> g2; p3 -> g3 over other groups; p4 -> g5 (bf16)
GRAPH = HloGraph(name="g", fingerprint="f", nodes=(
    node("p1", "parameter"), node("p2", "parameter"), node("p3", "parameter"), node("p4", "parameter", "bf16"),
    node("g1", "all-gather", groups=FSDP), node("g2", "all-gather", groups=FSDP),
    node("g3", "all-gather", groups="{{0,1},{2,3}}"), node("g5", "all-gather", "bf16", FSDP),
    node("d", "dot"), node("g4", "all-gather", groups=FSDP), node("r", "all-reduce", groups=FSDP)),
    edges=((0, 4), (1, 5), (2, 6), (3, 7), (4, 8), (8, 9), (9, 10)))


@pytest.mark.fast
def test_gather_buckets_round_trip_and_leave_other_plans_json_as_it_was():
    p = make_plan(gather_buckets=[["g1", "g2"], ["g3"]], name="p")
    q = FusionPlan.from_json(p.to_json())
    assert q == p and q.digest() == p.digest() and q.gather_buckets == (("g1", "g2"), ("g3",))
    assert json.loads(p.to_json())["gather_buckets"] == [["g1", "g2"], ["g3"]]
    plain = make_plan(buckets=[["r"]])
    assert "gather_buckets" not in plain.to_dict() and "gather_buckets" not in plain.summary()
    assert FusionPlan.from_json(plain.to_json()).gather_buckets is None
    assert not p.is_default and p.summary()["gather_buckets"] == 2
    assert decisions(p) == ("2 gather buckets",) and "2 gather buckets" in repr(p)


@pytest.mark.fast
@pytest.mark.parametrize(("data", "match"), [
    ({"schema_version": 1, "gather_buckets": [[]]}, r"gather_buckets\.0"),
    ({"schema_version": 1, "gather_buckets": "g1"}, "gather_buckets"),
    ({"schema_version": 1, "gather_buckets": [["g1", 2]]}, r"gather_buckets\.0\.1"),
])
def test_schema_errors_name_the_gather_buckets_field(data, match):
    with pytest.raises(ValueError, match=match):
        FusionPlan.from_dict(data)


@pytest.mark.fast
def test_a_list_where_a_tuple_belongs_is_refused():
    with pytest.raises(TypeError, match=r"FusionPlan.gather_buckets: expected None or a tuple of tuples"):
        FusionPlan(gather_buckets=[("g1",)])
    with pytest.raises(TypeError, match=r"make_plan: gather_buckets: expected lists of instruction names"):
        make_plan(gather_buckets="g1")


@pytest.mark.fast
@pytest.mark.parametrize(("buckets", "match"), [
    ([[]], r"gather bucket 0 is empty"),
    ([["nope"]], r"gather bucket 0: 'nope' is not in the graph"),
    ([["g1", "r"]], r"gather bucket 0: 'r' is a all-reduce, not an all-gather"),
    ([["g1"], ["g1", "g2"]], r"gather bucket 1: all-gather 'g1' is already in gather bucket 0"),
    ([["g1", "g3"]], r"gather bucket 0: 'g3' gathers over \{\{0,1\},\{2,3\}\} but 'g1' over \{\{0,1,2,3\}\}"),
    ([["g1", "g5"]], r"gather bucket 0: one dtype is concatenated, got f32 \('g1'\) and bf16 \('g5'\)"),
    ([["g1", "g4"]], r"gather bucket 0: contracting the plan forms a cycle along g1 -> d -> g4"),
])
def test_validate_names_the_bad_gather_bucket(buckets, match):
    with pytest.raises(ValueError, match=match):
        make_plan(gather_buckets=buckets).validate(GRAPH)


@pytest.mark.fast
def test_gathers_in_no_bucket_stay_and_a_valid_plan_passes():
    plan = make_plan(gather_buckets=[["g1", "g2"]])
    assert plan.validate(GRAPH) is plan
    assert plan.disabled_passes("cpu") == ()  # XLA:CPU has no all-gather combiner to turn off
    assert plan.disabled_passes("gpu") == ("gpu-all-gather-combiner",)

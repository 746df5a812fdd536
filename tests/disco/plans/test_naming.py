"""Plans named and described by what they do (disco.plans.naming): the same plan, the same name."""

from __future__ import annotations

import re

import pytest

from disco.plans import baselines
from disco.plans import options as plan_options
from disco.plans.naming import bucket_sizes, content_name, describe
from disco.plans.plan import Bucket, FusionPlan

@pytest.mark.fast
def test_a_name_tells_buckets_groups_cuts_and_options_and_ends_with_the_digest():
    plan = FusionPlan(groups=(("a", "b"), ("c", "d")), cuts=(("x", "y"),),
                      buckets=(Bucket(("ar.1",)), Bucket(("ar.2", "ar.3")), Bucket(("ar.4",))),
                      compile_options=((plan_options.YNN_FUSION_TYPE, plan_options.YNN_NO_REDUCE),))
    assert content_name(plan) == f"b3_g2_c1_ynn-noreduce_{plan.digest()[:6]}"
    assert content_name(FusionPlan(xla_fusion="off", groups=(("a",),))).startswith("bxla_g1_nofuse_")
    rs = FusionPlan(buckets=(Bucket(("ar.1",), "rs_ag"),), compile_options=((plan_options.SCHEDULER, "True"),))
    assert content_name(rs).startswith("b1rs_lhs_")
    gpu = FusionPlan(compile_options=((plan_options.THRESHOLD, str(64 << 20)), (plan_options.OPTIMIZATION_LEVEL, "O1")))
    assert content_name(gpu).startswith("bxla_o1_thr64m_")


@pytest.mark.fast
def test_a_name_and_description_tell_gather_buckets():
    plan = FusionPlan(buckets=(Bucket(("ar.1",)),), gather_buckets=(("ag.1", "ag.2"), ("ag.3", "ag.4")))
    assert content_name(plan) == f"b1_ag2_{plan.digest()[:6]}"
    assert describe(plan) == "1 gradient bucket, 2 gather buckets"
    assert content_name(FusionPlan(gather_buckets=())).startswith("bxla_ag0_")
    assert describe(FusionPlan(gather_buckets=())) == "XLA's all-reduce combiner, each all-gather alone"
    assert "ag" not in content_name(FusionPlan(buckets=(Bucket(("ar.1",)),)))


@pytest.mark.fast
def test_the_name_depends_on_the_content_only():
    a = FusionPlan(buckets=(Bucket(("ar.1", "ar.2")),), name="disco_5", graph_fingerprint="f" * 32)
    b = FusionPlan(buckets=(Bucket(("ar.1", "ar.2")),), name="other")
    c = FusionPlan(buckets=(Bucket(("ar.2", "ar.1")),))  # the same counts, another layout
    assert content_name(a) == content_name(b) != content_name(c)
    assert content_name(a).rsplit("_", 1)[0] == content_name(c).rsplit("_", 1)[0] == "b1"


def test_describe_says_what_a_plan_does_with_its_bucket_sizes(mlp_graph):
    assert describe(FusionPlan()) == "XLA's default compile"
    ddp = baselines.make("ddp", mlp_graph)
    sizes = bucket_sizes(ddp, mlp_graph)
    assert len(sizes) == len(ddp.buckets) and sum(sizes) == sum(n.grad_bytes for n in mlp_graph.all_reduces())
    text = describe(ddp, mlp_graph)
    assert re.fullmatch(rf"{len(ddp.buckets)} gradient buckets? of [\d.]+ [kM]?B", text), text
    per_tensor = baselines.make("per_tensor", mlp_graph)  # one bucket per gradient: a range of sizes
    assert re.fullmatch(rf"{len(per_tensor.buckets)} gradient buckets of [\d.]+( [kM]?B)?(-| to )[\d.]+ [kM]?B",
                        describe(per_tensor, mlp_graph)), describe(per_tensor, mlp_graph)
    ynn = ddp.replace(compile_options=((plan_options.YNN_FUSION_TYPE, plan_options.YNN_NO_REDUCE),))
    assert describe(ynn, mlp_graph).endswith(", reductions kept out of YNNPACK")
    assert describe(FusionPlan(cuts=(("a", "b"),))) == "XLA's all-reduce combiner, 1 fusion cut"


@pytest.fixture(scope="module")
def mlp_graph():
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=2)
    return disco.extract(step, *args)

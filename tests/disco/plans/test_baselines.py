"""Baseline plans on hand-made graphs: what each one buckets, and its errors."""

from __future__ import annotations

import pytest

from disco.plans import baselines
from disco.ir.graph import HloGraph, Node


def graph(sizes):
    """Independent all-reduces of ``sizes`` bytes, in production order, fed by one parameter."""
    nodes = [Node(name="p", opcode="parameter", computation="c", shape="f32[4]", dtype="f32",
                  out_bytes=16, out_elements=4, flops=0.0)]
    for i, b in enumerate(sizes):
        nodes.append(Node(name=f"r{i}", opcode="all-reduce", computation="c", shape=f"f32[{b // 4}]",
                          dtype="f32", out_bytes=b, out_elements=b // 4, flops=0.0, operands=("p",),
                          grad_bytes=b, replica_groups="{{0,1}}", reduction="add"))
    return HloGraph(name="g", nodes=tuple(nodes), edges=tuple((0, i + 1) for i in range(len(sizes))),
                    fingerprint="f")


@pytest.mark.fast
@pytest.mark.parametrize("sizes, k, expected", [
    ([40, 40, 40, 40], 1, [4]),
    ([40, 40, 40, 40], 2, [2, 2]),
    ([40, 40, 40, 40], 4, [1, 1, 1, 1]),
    ([40, 40, 40, 40], 9, [1, 1, 1, 1]),  # never more buckets than gradients
    ([120, 40, 40, 40], 2, [1, 3]),       # equal bytes, not equal counts
])
def test_even_cuts_production_order_into_k_buckets_of_about_equal_bytes(sizes, k, expected):
    g = graph(sizes)
    plan = baselines.make("even", g, k=k)
    assert plan.name == f"even_{k}"
    assert [len(b.members) for b in plan.buckets] == expected
    assert [m for b in plan.buckets for m in b.members] == [f"r{i}" for i in range(len(sizes))]


@pytest.mark.fast
@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_even_rejects_a_bad_count(k):
    with pytest.raises(ValueError, match=r"baseline 'even': k is the bucket count, expected an integer >= 1"):
        baselines.make("even", graph([40, 40]), k=k)


@pytest.mark.fast
@pytest.mark.parametrize("name, key, value", [
    ("horovod", "threshold_mb", -5), ("horovod", "threshold_mb", 0), ("ddp", "cap_mb", float("nan")),
    ("ddp", "first_mb", "x"), ("xla_threshold", "threshold_bytes", 0), ("xla_threshold", "threshold_bytes", 1.5)])
def test_sizes_that_are_not_positive_are_refused(name, key, value):
    """horovod:-5 and horovod:0 were accepted and made one bucket per gradient (per_tensor)."""
    with pytest.raises(ValueError, match=rf"baseline '{name}': {key} expected a positive (number of MB|integer), "
                                         rf"got {value!r}"):
        baselines.make(name, graph([40, 40]), **{key: value})


@pytest.mark.fast
def test_unknown_options_are_named():
    with pytest.raises(ValueError, match=r"baseline 'horovod' got unexpected options \['k'\]"):
        baselines.make("horovod", graph([40]), k=2)


def test_make_refuses_what_is_not_a_graph():
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=2)
    graph = disco.extract(step, *args)
    assert baselines.make("ddp", graph).buckets
    with pytest.raises(TypeError, match=r"^baseline 'ddp': graph: expected a disco HloGraph .*got str"):
        baselines.make("ddp", graph.to_json())


# A variadic (tuple-shaped) all-reduce, as HLO from other frameworks holds: it has no flat buffer,
# so it can only be a bucket of its own.
TUPLE_AR_HLO = """HloModule m, entry_computation_layout={(f32[4]{0}, f32[8]{0}, f32[2]{0})->(f32[4]{0}, f32[8]{0}, f32[2]{0})}

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  a = f32[4]{0} parameter(0)
  b = f32[8]{0} parameter(1)
  c = f32[2]{0} parameter(2)
  ma = f32[4]{0} multiply(a, a)
  mb = f32[8]{0} multiply(b, b)
  mc = f32[2]{0} multiply(c, c)
  ar = (f32[4]{0}, f32[8]{0}) all-reduce(ma, mb), replica_groups={{0,1}}, to_apply=add
  ar2 = f32[2]{0} all-reduce(mc), replica_groups={{0,1}}, to_apply=add
  g0 = f32[4]{0} get-tuple-element(ar), index=0
  g1 = f32[8]{0} get-tuple-element(ar), index=1
  ROOT t = (f32[4]{0}, f32[8]{0}, f32[2]{0}) tuple(g0, g1, ar2)
}
"""


@pytest.mark.fast
def test_a_tuple_all_reduce_is_a_bucket_of_its_own_and_every_baseline_applies():
    # one_bucket/horovod/ddp/even put it in one bucket with ar2, which validate accepted with the
    # tuple all-reduce first and the rewrite then failed on (AttributeError: its shape has no flat
    # buffer); per_tensor's one-member 'concat' bucket of it failed there too.
    from disco.plans.plan import make_plan
    from disco.plans.random_plans import random_plan
    from xla_hooks.rewrite import apply_plan_to_text

    g = HloGraph.from_hlo_text(TUPLE_AR_HLO)
    for name in baselines.NAMES:
        plan = baselines.make(name, g)
        assert all(len(b.members) == 1 for b in plan.buckets or ()), name
        HloGraph.from_hlo_text(apply_plan_to_text(TUPLE_AR_HLO, plan))
    for seed in range(10):
        random_plan(g, seed)
    for members in (["ar", "ar2"], ["ar2", "ar"]):
        with pytest.raises(ValueError, match="'ar' is already a tuple all-reduce; it can only be a bucket of its own"):
            make_plan(buckets=[members]).validate(g)


@pytest.mark.fast
@pytest.mark.parametrize("item, name, options, row", [
    ("ddp", "ddp", (), "ddp"),
    ("even", "even", (), "even"),
    ("horovod:128", "horovod", (("threshold_mb", 128.0),), "horovod:128"),
    ("ddp:0.5", "ddp", (("cap_mb", 0.5),), "ddp:0.5"),
    ("xla_threshold:4096", "xla_threshold", (("threshold_bytes", 4096),), "xla_threshold:4096"),
    ("even:4", "even", (("k", 4),), "even_4"),
    ("even:04", "even", (("k", 4),), "even_4"),
])
def test_a_plans_item_is_read_once_with_its_row(item, name, options, row):
    """--plans items were read twice (disco.cli.common.resolve_plans, disco.runtime.worker), and the two named
    even:4's row even:4 and even_4."""
    parsed = baselines.parse_item(item)
    assert (parsed.name, parsed.options, parsed.row) == (name, options, row)
    assert baselines.parse_item(baselines.item_of_row(row)) == parsed  # a worker's row read back
    assert parsed.make(graph([40, 40, 40, 40])) == baselines.make(name, graph([40, 40, 40, 40]), **dict(options))


@pytest.mark.fast
@pytest.mark.parametrize("item, message", [
    ("bogus", r"unknown plan 'bogus'; expected a baseline \(xla_default, no_fusion, per_tensor, one_bucket, "
              r"horovod, ddp, xla_threshold, even, one_gather_bucket, per_layer_gathers, xla_o1, auto_pgle, prefetch\) or a plan "
              r".json file"),
    ("xla_tuned:16", r"unknown plan 'xla_tuned'; expected a baseline \("),
    ("xla_o1:2", r"plan 'xla_o1:2': only horovod:MB, ddp:MB, xla_threshold:BYTES, even:K and prefetch:D take a value"),
    ("auto_pgle", r"auto_pgle is jax's profile-guided latency estimator \(JAX_ENABLE_PGLE=1\).*no profile without "
                  r"a GPU\); measure it on a GPU: python scripts/tools/check_gpu.py \(its auto_pgle row\)$"),
    ("per_tensor:3", r"plan 'per_tensor:3': only horovod:MB, ddp:MB, xla_threshold:BYTES, even:K and prefetch:D take a value"),
    ("horovod:big", r"plan 'horovod:big': expected a number after ':', got 'big'"),
    ("horovod:", r"plan 'horovod:': expected a number after ':', got ''"),
    ("even:2.5", r"plan 'even:2.5': expected a number after ':', got '2.5'"),
    ("horovod:-5", r"plan 'horovod:-5': baseline 'horovod': threshold_mb expected a positive number of MB, got -5.0"),
    ("ddp:nan", r"plan 'ddp:nan': baseline 'ddp': cap_mb expected a positive number of MB, got nan"),
    ("xla_threshold:0", r"plan 'xla_threshold:0': baseline 'xla_threshold': threshold_bytes expected a positive "
                        r"integer, got 0"),
    ("even:0", r"plan 'even:0': baseline 'even': k is the bucket count, expected an integer >= 1, got 0"),
])
def test_a_bad_plans_item_is_refused_naming_it(item, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        baselines.parse_item(item)


@pytest.mark.fast
@pytest.mark.parametrize("row", ["even:4", "even_x", "disco_1", "reduce_fusion", "even_0"])
def test_a_row_of_no_baseline_item_is_refused(row):
    with pytest.raises(ValueError):
        baselines.item_of_row(row)


@pytest.mark.fast
def test_xla_o1_is_the_optimization_level_option_and_refused_on_cpu():
    from disco.plans import options as plan_options

    plan = baselines.parse_item("xla_o1").make(graph([40, 40]))
    assert plan.name == "xla_o1" and plan.compile_options == (("optimization_level", "O1"),)
    assert plan.buckets is None and not plan.groups and not plan.cuts  # XLA's own fusion and combiner
    plan_options.check(plan.compile_options, "gpu")
    with pytest.raises(ValueError, match=r"^compile option optimization_level='O1' on cpu: jax's optimization "
                                         r"level is XLA:GPU's: .*XLA:CPU has none of these passes; expected a GPU "
                                         r"backend"):
        plan_options.check(plan.compile_options, "cpu")
    with pytest.raises(ValueError, match=r"optimization_level: expected one of O0, O1, O2, O3, got 'O9'"):
        plan_options.check((("optimization_level", "O9"),), "gpu")


@pytest.mark.fast
def test_auto_pgle_is_never_a_plan():
    with pytest.raises(ValueError, match=r"^auto_pgle is jax's profile-guided latency estimator"):
        baselines.make("auto_pgle", graph([40]))


@pytest.mark.fast
def test_xla_o1_reaches_the_compile_as_xlas_effort_level_number():
    # jax 0.10.2's compile takes only the number (19: ExecutionOptions.EFFORT_O1); 0.12.0.1 takes both
    assert baselines.make("xla_o1", graph([40])).compiler_options("gpu") == {"optimization_level": 19}

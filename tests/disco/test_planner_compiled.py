"""The planner's compiled tier (``options["tier"] == "compiled"``): the candidates compiled by the real
compiler and ranked by their modules. Here XLA:CPU compiles them (this process's 4 of its 8 CPU
devices); deviceless XLA:GPU is the same path, tested in tests/xla_hooks/test_deviceless.py."""

from __future__ import annotations

import functools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disco import planner
from disco.ir.graph import HloGraph
from disco.plans import baselines
from disco.plans.plan import FusionPlan
from xla_hooks import compile_for


@functools.lru_cache(maxsize=None)
def setup():
    import trax_models
    from disco.ir import extractor
    from disco.sim.cluster import preset

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    text = extractor.hlo_text(step, *args)
    return text, HloGraph.from_hlo_text(text), preset("local", devices=4)


OPTIONS = {"tier": "compiled", "max_evals": 30, "budget_s": 600.0}


def test_the_compiled_tier_answers_the_fastest_compiled_module_and_lists_every_price():
    text, graph, cluster = setup()
    compile_fn = compile_for.plan_compiler(text, device="cpu", devices=4)
    plan, report = planner.plan_for_graph(graph, cluster, OPTIONS, compile_fn=compile_fn)
    assert report["tier"] == "compiled" and "tier_note" not in report
    priced = report["compiled"]
    ms = priced["ms"]
    # xla_default, the emulated answer and the baselines: as many as the limit allows, each plan once
    distinct = len({p.digest() for p in baselines.make_all(graph).values()})
    assert "xla_default" in ms and not priced["not_compiled"]
    assert min(distinct, planner.COMPILED_CANDIDATES) <= len(ms) <= min(distinct + 1, planner.COMPILED_CANDIDATES)
    ranked = priced["ranked"]
    assert sorted(ranked) == sorted(ms) and [ms[n] for n in ranked] == sorted(ms.values())
    assert report["chosen"] == priced["chosen"] == ranked[0] == plan.name
    assert priced["speedup_vs_xla_default"] == pytest.approx(ms["xla_default"] / ms[plan.name])
    # each module is the one its plan makes: XLA:CPU keeps a bucketed plan's buckets, and one all-reduce
    # per gradient for per_tensor
    modules = priced["modules"]
    assert all(m["kernels_from"] == "compiled" and m["backend"] == "cpu" for m in modules.values())
    grads = len(graph.all_reduces())
    if "per_tensor" in modules:
        assert modules["per_tensor"]["collectives"] == grads
    bucketed = [n for n in ("one_bucket", "horovod") if n in modules]
    assert bucketed and all(modules[n]["collectives"] < grads for n in bucketed)
    # the emulated tier's own answer is kept beside it
    assert report["emulated"]["chosen"] in ms or report["emulated"]["chosen"] in priced["not_compiled"]
    # what a job measures: the compiled plans fastest first, with their compiled times
    cands = planner.candidates(graph, plan, report, 8)
    assert [c["name"] for c in cands[:len(ms)]] == ranked
    assert [c["predicted_ms"] for c in cands[:len(ms)]] == [ms[n] for n in ranked]
    if plan.name in baselines.NAMES:
        assert plan == baselines.make(plan.name, graph).replace(name=plan.name)


def test_a_plan_that_does_not_compile_drops_out_and_a_passed_deadline_leaves_the_emulated_answer():
    text, graph, cluster = setup()
    real = compile_for.plan_compiler(text, device="cpu", devices=4)

    def horovod_fails(plan):
        if plan.name == "horovod":
            raise RuntimeError("INVALID_ARGUMENT: a module XLA refuses\nsecond line")
        return real(plan)

    _, report = planner.plan_for_graph(graph, cluster, OPTIONS, compile_fn=horovod_fails, compile_limit=4)
    assert report["tier"] == "compiled"
    assert report["compiled"]["not_compiled"] == {"horovod": "RuntimeError: INVALID_ARGUMENT: a module XLA refuses"}
    assert "horovod" not in report["compiled"]["ms"] and len(report["compiled"]["ms"]) == 3
    assert report["candidates"][-1] == {"name": "horovod", "predicted_ms": None,
                                        "plan": baselines.make("horovod", graph).replace(name="horovod").to_dict()}

    late = compile_for.plan_compiler(text, device="cpu", devices=4, deadline=time.monotonic() - 1.0)
    emulated_plan, emulated = planner.plan_for_graph(graph, cluster, {**OPTIONS, "tier": None})
    plan, report = planner.plan_for_graph(graph, cluster, OPTIONS, compile_fn=late)
    assert report["tier"] == "emulated" and "DeadlinePassed" in report["tier_note"]
    assert plan == emulated_plan and report["chosen"] == emulated["chosen"] and "candidates" not in report
    assert planner.candidates(graph, plan, report, 2) == planner.candidates(graph, emulated_plan, emulated, 2)


@pytest.mark.fast
@pytest.mark.parametrize("options, compile_fn, message", [
    ({"tier": "compiled"}, None, "options.tier 'compiled': expected a compile_fn"),
    ({"tier": "measured"}, None, "options.tier: expected one of emulated, compiled"),
])
def test_the_tier_option_is_checked_before_any_search(options, compile_fn, message):
    from disco.sim.cluster import preset

    with pytest.raises(ValueError, match=message):
        planner.plan_for_graph(_tiny_graph(), preset("local", devices=2), options, compile_fn=compile_fn)


def _tiny_graph() -> HloGraph:
    return HloGraph.from_hlo_text("""HloModule m, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

ENTRY main {
  x = f32[4]{0} parameter(0)
  ROOT n = f32[4]{0} negate(x)
}
""")


def test_a_compiler_for_a_device_no_compiler_here_targets_is_refused():
    with pytest.raises(ValueError, match="no compiler here targets device kind 'tpu'"):
        compile_for.plan_compiler("HloModule m", device="tpu", devices=1)
    assert compile_for.unavailable("cpu") is None


def _grads_text(sizes: list[int]) -> str:
    """A module whose gradients are ``sizes`` f32 elements, each reduced by its own all-reduce."""
    lines = ["HloModule g, entry_computation_layout={(" + ", ".join(f"f32[{n}]{{0}}" for n in sizes) + ")->f32[]}",
             "", "add {", "  a = f32[] parameter(0)", "  b = f32[] parameter(1)", "  ROOT s = f32[] add(a, b)", "}",
             "", "ENTRY main {"]
    for i, n in enumerate(sizes):
        lines += [f"  p{i} = f32[{n}]{{0}} parameter({i})", f"  g{i} = f32[{n}]{{0}} multiply(p{i}, p{i})",
                  f"  r{i} = f32[{n}]{{0}} all-reduce(g{i}), replica_groups={{}}, to_apply=add"]
    lines += ["  z = f32[] constant(0)", "  ROOT t = f32[] reduce(r0, z), dimensions={0}, to_apply=add", "}"]
    return "\n".join(lines)


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 4_000_000), min_size=1, max_size=6), limit=st.integers(1, 10),
       answer=st.sampled_from(baselines.NAMES), data=st.data())
def test_the_compiled_choice_is_the_fastest_priced_plan_whatever_compiles(sizes, limit, answer, data):
    """Any prices and failures: each plan compiled once, xla_default first, at most ``limit``; the answer
    the fastest compiled module (never slower than xla_default's), the candidates in that order, the
    failed ones last without a time; no price for xla_default leaves the emulated answer."""
    from disco.planner import _compiled
    from disco.sim.compiled import CompiledStep

    graph = HloGraph.from_hlo_text(_grads_text(sizes))
    made = baselines.make_all(graph)
    plan = made[answer].replace(name="disco_1")  # the search's answer: here a baseline's buckets, renamed
    emulated = {n: data.draw(st.floats(0.1, 10.0), label=f"emulated {n}") for n in made}
    report = {"chosen": "disco_1", "plan_ms": emulated[answer], "baselines_ms": emulated,
              "speedup_vs_xla_default": emulated["xla_default"] / emulated[answer]}
    asked: list[str] = []

    def price(p):
        asked.append(p.name)
        t = data.draw(st.one_of(st.none(), st.floats(0.01, 100.0)), label=f"compiled {p.name}")
        if t is None:
            raise RuntimeError(f"{p.name} does not compile")
        return CompiledStep("gpu", (), (), t * 1e-3, 0.0, t * 1e-3)

    chosen, out = _compiled.choose(graph, plan, report, price, limit=limit)
    distinct = {p.digest() for p in made.values()} | {plan.digest()}
    assert asked[0] == "xla_default" and len(asked) == len(set(asked)) == min(limit, len(distinct))
    priced = out["compiled"]
    ms, failed = priced["ms"], priced["not_compiled"]
    assert sorted([*ms, *failed]) == sorted(asked)
    if "xla_default" not in ms:
        assert out["tier"] == "emulated" and chosen == plan and "candidates" not in out
        assert "does not compile" in out["tier_note"]
        return
    assert out["tier"] == "compiled" and chosen.name == out["chosen"] == priced["ranked"][0]
    assert ms[chosen.name] == min(ms.values()) <= ms["xla_default"]
    cands = out["candidates"]
    assert [c["name"] for c in cands] == priced["ranked"] + [n for n in asked if n in failed]
    assert [c["predicted_ms"] for c in cands] == [ms[n] for n in priced["ranked"]] + [None] * len(failed)
    assert len({FusionPlan.from_dict(c["plan"]).digest() for c in cands}) == len(cands)
    assert FusionPlan.from_dict(cands[0]["plan"]).digest() == chosen.digest()

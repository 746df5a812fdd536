"""``disco.planner.plan_for_graph``: options checked up front, evaluation budgets, stable plan keys."""

from __future__ import annotations

import functools

import pytest

from disco import planner


@functools.lru_cache(maxsize=None)
def setup():
    import disco
    import trax_models
    from disco.sim.cluster import preset

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    return disco.extract(step, *args), preset("local", devices=4)


@pytest.mark.parametrize("options, field", [
    ({"max_evals": 0}, "options.max_evals"),
    ({"max_evals": 2.5}, "options.max_evals"),
    ({"max_evals": True}, "options.max_evals"),
    ({"budget_s": 0}, "options.budget_s"),
    ({"budget_s": "10"}, "options.budget_s"),
    ({"budget_s": float("inf")}, "options.budget_s"),
    ({"seed": -1}, "options.seed"),
    ({"strategy": "magic"}, "options.strategy"),
    ({"evals": 10}, "unknown keys ['evals']"),
])
def test_bad_options_are_refused_before_any_search(options, field):
    graph, cluster = setup()
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        planner.plan_for_graph(graph, cluster, options)


def test_max_evals_stops_the_search_and_gives_the_same_plan_each_time():
    graph, cluster = setup()
    options = {"strategy": "auto", "budget_s": 600.0, "seed": 5, "max_evals": 40}
    fractions: list[float] = []
    plan_a, report_a = planner.plan_for_graph(graph, cluster, options, lambda f, _m: fractions.append(f))
    plan_b, report_b = planner.plan_for_graph(graph, cluster, options)
    assert plan_a == plan_b and report_a["plan_ms"] == report_b["plan_ms"]
    # the search stops at the evaluation budget (a step may finish its batch of children), not at 600 s
    assert 40 <= report_a["search"]["evals"] < 80, report_a["search"]
    assert report_a["options"]["max_evals"] == 40
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert max(fractions[:-1]) > 0.5  # progress follows the evaluations, not the (unused) 600 s


def test_max_evals_caps_the_random_strategy():
    graph, cluster = setup()
    plan, report = planner.plan_for_graph(graph, cluster, {"strategy": "random", "budget_s": 600.0,
                                                           "max_evals": 7})
    assert report["search"] == {"random_plans_tried": 7}
    plan.validate(graph)


@pytest.mark.parametrize("strategy", ["random", "auto"])
def test_a_gpu_cluster_gets_a_plan_xla_gpu_can_take(strategy):
    # the random strategy drew plans with fusion groups on a GPU cluster too, and handed out one
    # (random_32, simulated faster than every baseline) that validate(graph, "gpu") refuses
    from disco.sim.cluster_presets import resolve

    graph, _ = setup()
    plan, report = planner.plan_for_graph(graph, resolve("h100-sxm-8"), {"strategy": strategy, "budget_s": 600.0,
                                                                        "max_evals": 200})
    plan.validate(graph, "gpu")
    assert not report["search"].get("error"), report["search"]


def test_plan_keys_leave_out_options_not_given():
    from disco.sim.costs import AnalyticCosts

    _, cluster = setup()
    costs = AnalyticCosts()
    before = {"budget_s": 10.0, "strategy": "auto", "seed": 0}  # a request from before max_evals existed
    key = planner.plan_key("fp", cluster, costs, before)
    assert planner.plan_key("fp", cluster, costs, {**before, "max_evals": None}) == key
    assert planner.plan_key("fp", cluster, costs, {**before, "max_evals": 100}) != key
    assert planner.plan_key("fp", cluster, costs, {**before, "seed": 1}) != key


@pytest.mark.fast
def test_the_plan_key_holds_the_environment_and_keeps_old_keys():
    """Issue 43: a plan is keyed like jax's compilation cache keys an executable. A request naming no
    environment keeps the key it had before (the plans stored then are still found)."""
    from disco.sim.cluster import preset

    cluster, costs, options = preset("local", devices=2), planner.default_costs("cpu"), {"seed": 0}
    env = {"jax": "0.10.2", "jaxlib": "0.10.2", "platform": "cpu", "device_kind": "cpu", "processes": 2,
           "devices_per_process": 1, "xla_flags": []}
    old = planner.plan_key("fp", cluster, costs, options)
    assert old == "5dd2cc2d64db9520d0b475788b0ef589"  # computed before the environment was part of keys
    assert planner.plan_key("fp", cluster, costs, options, None) == old
    keys = {old, planner.plan_key("fp", cluster, costs, options, env)}
    for field, value in [("jax", "0.12.0.1"), ("jaxlib", "0.8.3"), ("platform", "gpu"), ("device_kind", "H100"),
                         ("processes", 1), ("devices_per_process", 2), ("xla_flags", ["--xla_cpu_use_thunk_runtime=false"])]:
        keys.add(planner.plan_key("fp", cluster, costs, options, {**env, field: value}))
    assert len(keys) == 9

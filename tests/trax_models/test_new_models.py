"""The zoo models of issue 21 (vit, gpt2, unet, moe) through the whole planning stack.

Training, extraction and applied baselines are covered for every zoo model by the parametrised
tests in test_zoo.py, tests/disco/ir/test_graph.py and tests/xla_hooks/test_apply_plan.py (slow); here: the paper presets
are the reference sizes the issue names, and each new model's graph goes through plans, the
simulator and a short search (gpt2's layers are a while loop: the plans and the simulator
must handle its body).
"""

from __future__ import annotations

import functools
import math

import pytest

import disco
import trax_models
from disco import search
from disco.plans import baselines, random_plans
from disco.sim.cluster import preset
from disco.sim.costs import AnalyticCosts
from disco.sim.simulator import Simulator

NEW_MODELS = ("vit", "gpt2", "unet", "moe")
DEVICES = 4


@pytest.mark.fast
def test_paper_presets_are_the_reference_sizes():
    vit = trax_models.config("vit", "paper")  # ViT-S/16 at 224x224, batch 64
    assert (vit.image_size, vit.patch_size, vit.d_model, vit.n_heads, vit.n_layers, vit.global_batch) == \
        (224, 16, 384, 6, 12, 64)
    gpt2 = trax_models.config("gpt2", "paper")  # 12 layers, d=768, sequence 1024, batch 8
    assert (gpt2.n_layers, gpt2.d_model, gpt2.seq_len, gpt2.global_batch) == (12, 768, 1024, 8)
    unet = trax_models.config("unet", "paper")  # 256x256, batch 16
    assert (unet.image_size, unet.global_batch) == (256, 16)
    for p in trax_models.presets():  # top-2 routing over 8 experts at every preset
        moe = trax_models.config("moe", p)
        assert (moe.n_experts, moe.top_k) == (8, 2), p


@functools.cache
def _graph(name):
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES)
    return disco.extract(step, *args)


def test_moe_routes_with_top_k_and_gpt2_layers_are_one_loop():
    moe = _graph("moe").opcode_histogram()
    assert moe.get("topk", 0) > 0, sorted(moe)
    gpt2 = _graph("gpt2")
    assert gpt2.opcode_histogram().get("while", 0) >= 1
    assert gpt2.loops, "gpt2's scan should be read as a loop"


@pytest.mark.parametrize("name", NEW_MODELS)
def test_plans_simulate_and_search_on_the_new_models(name):
    graph = _graph(name)
    sim = Simulator(graph, AnalyticCosts(), preset("local", devices=DEVICES))
    plans = {**baselines.make_all(graph), **{f"random_{s}": random_plans.random_plan(graph, s) for s in range(3)}}
    assert any(p.groups for p in plans.values()), "random plans should contain fusion groups"
    times = {}
    for pname, plan in plans.items():
        assert plan.validate(graph, "cpu") is plan, pname
        times[pname] = sim.step_time(plan)
        assert math.isfinite(times[pname]) and times[pname] > 0, (pname, times[pname])
    # bucketing changes the communication the simulator prices
    assert times["per_tensor"] != times["one_bucket"], times
    assert sim.lower_bound() <= min(times.values()) * (1 + 1e-9)
    result = search.run(search.make("best_first"), graph, sim.step_time, max_evals=60, seed=0)
    best_cost, best = result.top[0]
    assert best.validate(graph, "cpu") is best
    assert best_cost == pytest.approx(sim.step_time(best))
    assert best_cost <= min(times[b] for b in baselines.make_all(graph)) * (1 + 1e-9)

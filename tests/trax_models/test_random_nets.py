"""Random networks of the cost model's corpus (trax_models._random): names, draws, real steps."""

from __future__ import annotations

import gzip
import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trax_models
from tests.support.paths import REPO
from trax_models import _random

CORPUS = REPO / "gnn" / "data" / "h100_random_kernels_2026-11-28.jsonl.gz"


@pytest.mark.fast
def test_names_cycle_the_families_and_name_their_seeds():
    names = trax_models.random_names(9, seed=3)
    assert names[:8] == ["random_mlp_3", "random_cnn_4", "random_transformer_5", "random_moe_6", "random_rnn_7",
                         "random_vit_8", "random_resnet_9", "random_mlp_10"]
    assert all(trax_models.is_random(n) for n in names)
    assert trax_models.random_names(2, families=("cnn",)) == ["random_cnn_0", "random_cnn_1"]
    for not_random in ("mlp", "random_mlp", "random_gan_3", "random_mlp_-1", "random_mlp_3x", None, 7):
        assert not trax_models.is_random(not_random)


@pytest.mark.fast
@pytest.mark.parametrize("call, message", [
    (lambda: _random.draw("random_gan_1"), "'random_gan_1' is not a random network's name; expected "
                                            "random_<family>_<seed> with family one of mlp, cnn"),
    (lambda: _random.draw("random_mlp_1", "huge"), "unknown preset 'huge'; expected one of paper, small, tiny"),
    (lambda: trax_models.random_names(0), "n: expected an int >= 1, got 0"),
    (lambda: trax_models.random_names(2, seed=-1), "seed: expected an int >= 0, got -1"),
    (lambda: trax_models.random_names(2, families=("gan",)), r"families: \['gan'\] not known"),
])
def test_bad_requests_say_what_was_expected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(_random.FAMILIES), seed=st.integers(0, 10**6),
       preset=st.sampled_from(("tiny", "small", "paper")))
def test_a_draw_is_a_pure_function_of_name_and_preset_and_is_buildable(family, seed, preset):
    name = f"random_{family}_{seed}"
    net = _random.draw(name, preset)
    assert net == _random.draw(name, preset)
    assert (net.family, net.seed, net.preset) == (family, seed, preset)
    assert net.global_batch >= 2 and net.global_batch % 2 == 0
    s = net.spec
    if "heads" in s:
        assert s["d_model"] % s["heads"] == 0
    if "patch" in s:
        assert s["image"] % s["patch"] == 0 and s["image"] // s["patch"] >= 1
    widths = [v for k, v in s.items() if k in ("d_model", "hidden", "embed", "in_features", "classes", "vocab")]
    assert all(isinstance(w, int) and w >= 8 for w in widths)
    if preset != "paper":  # the presets scale one draw: never wider than the paper one
        paper = _random.draw(name, "paper").spec
        assert all(s[k] <= paper[k] for k in ("d_model", "hidden", "vocab") if k in s)


@pytest.mark.fast
def test_draws_differ_across_seeds():
    specs = [_random.draw(f"random_transformer_{i}").spec for i in range(10)]
    assert len({repr(s) for s in specs}) == 10


@pytest.mark.parametrize("family", _random.FAMILIES)
def test_every_family_traces_to_a_training_step(family):
    """Shapes only (jax.eval_shape: the step is not compiled, the parameters' init is), preset tiny."""
    import jax

    step, (state, batch) = trax_models.make_train_step(f"random_{family}_1", "tiny", devices=1, abstract=True)
    new_state, loss = jax.eval_shape(step, state, batch)
    assert loss.shape == () and jax.tree.structure(new_state) == jax.tree.structure(state)


@pytest.mark.parametrize("family", ["rnn", "moe"])
def test_a_step_runs_and_learns(family):
    """A real compile and five steps on CPU: the loss is finite and falls (recurrent and routed ones)."""
    import jax

    step, (state, batch) = trax_models.make_train_step(f"random_{family}_2", "tiny", devices=1)
    f = jax.jit(step)
    losses = []
    for _ in range(5):
        state, loss = f(state, batch)
        losses.append(float(loss))
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("family", _random.FAMILIES)
def test_every_family_compiles_and_runs(family):
    import jax

    step, (state, batch) = trax_models.make_train_step(f"random_{family}_5", "tiny", devices=1)
    _, loss = jax.jit(step)(state, batch)
    assert np.isfinite(float(loss))


def test_the_global_batch_is_a_multiple_of_the_devices():
    import jax

    devices = len(jax.devices())
    if devices < 3:
        pytest.skip(f"needs 3 devices, this process has {devices}")
    net = _random.draw("random_cnn_0", "tiny")
    _, (_, batch) = trax_models.make_train_step("random_cnn_0", "tiny", devices=3, abstract=True)
    assert batch["images"].shape[0] == net.global_batch // 3 * 3 and net.global_batch % 3


def _entry_parameters(hlo: str) -> str:
    """The entry computation's parameter shapes (layouts and index comments dropped)."""
    m = re.search(r"entry_computation_layout=\{\((.*?)\)->", hlo)
    return re.sub(r"\{[0-9,]*\}", "", re.sub(r"/\*index=\d+\*/", "", m.group(1)))


def _recorded() -> list[dict]:
    with gzip.open(CORPUS, "rt") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("slow", [pytest.param(False), pytest.param(True, marks=pytest.mark.slow)])
def test_the_recorded_corpus_is_what_its_names_build(slow):
    """Each network profiled on the H100 (gnn/data) lowers here, from its name alone, to a step with the
    recorded step's parameters (shapes, in order): the draws have not moved since they were profiled.
    One network a family by default, all of them with -m slow."""
    import jax

    records = _recorded()
    seen: set[str] = set()
    for rec in records:
        family = rec["model"].split("_")[1]
        if not slow and family in seen:
            continue
        seen.add(family)
        step, args = trax_models.make_train_step(rec["model"], rec["preset"], devices=1, abstract=True)
        lowered = jax.jit(step).lower(*args).as_text(dialect="hlo")
        assert _entry_parameters(lowered) == _entry_parameters(rec["pre_optimization_hlo"]), rec["model"]
    assert len(seen) == 6 and len(records) == 21

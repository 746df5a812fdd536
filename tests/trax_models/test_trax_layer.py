"""Real trax layers: the step built from a trax layer's pure function, optimised like a zoo model.

The tests marked ``trax`` need the extra (``make test-trax`` installs it; CI runs them);
without it they are skipped. The input checks below run without trax.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import trax_models
from tests.support.equivalence import assert_allclose_leaves, three_steps
from trax_models import _trax_layer
from tests.support.paths import REPO

ROOT = str(REPO)
HAVE_TRAX = importlib.util.find_spec("trax") is not None
needs_trax = pytest.mark.skipif(not HAVE_TRAX, reason="trax not installed (pip install -e '.[trax]')")
TINY_LM = {"vocab_size": 64, "d_model": 32, "d_ff": 64, "n_layers": 1, "n_heads": 2, "max_len": 64}


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "disco", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, check=False)


@pytest.mark.fast
@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object, got list"),
])
def test_bad_kwargs_say_what_was_expected(text, message):
    with pytest.raises(ValueError, match=message):
        _trax_layer.parse_kwargs(text)


@pytest.mark.fast
def test_kwargs_parse():
    assert _trax_layer.parse_kwargs('{"vocab_size": 8}') == {"vocab_size": 8}
    assert _trax_layer.parse_kwargs(None) == {}


@pytest.mark.skipif(HAVE_TRAX, reason="checks the message shown when trax is missing")
def test_missing_trax_is_a_clear_cli_error():
    r = run_cli("graph", "--trax-model", "trax.models.TransformerLM", "--trax-kwargs", json.dumps(TINY_LM),
                "--devices", "2")
    assert r.returncode == 2, r.stderr
    assert "pip install -e '.[trax]'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.trax
@needs_trax
def test_bad_layer_path_and_kwargs_are_clear_errors():
    with pytest.raises(ValueError, match="cannot find 'trax.models.NoSuchModel'"):
        _trax_layer.resolve_layer("trax.models.NoSuchModel")
    with pytest.raises(ValueError, match="expected a dotted path"):
        _trax_layer.resolve_layer("TransformerLM")
    with pytest.raises(ValueError, match=r"TransformerLM\(\*\*.*no_such_arg"):
        trax_models.make_trax_train_step("trax.models.TransformerLM", {"no_such_arg": 1}, devices=2)
    with pytest.raises(ValueError, match="task 'lm' needs vocab_size"):
        trax_models.make_trax_train_step("trax.models.MLP", {"layer_widths": [8]}, devices=2)
    with pytest.raises(ValueError, match="task 'classify' needs input_shape"):
        trax_models.make_trax_train_step("trax.models.MLP", {"layer_widths": [8]}, task="classify", devices=2)


@pytest.mark.trax
@needs_trax
def test_trax_transformer_lm_trains_and_optimize_keeps_its_numbers():
    import xla_hooks
    from disco import extract
    from disco import optimizer as opt

    step, args = trax_models.make_trax_train_step("trax.models.TransformerLM", TINY_LM, devices=4,
                                                  optimizer="sgd", learning_rate=0.5)
    graph = extract(step, *args)
    n_weights = len(jax.tree.leaves(args[0].params))
    assert graph.summary()["gradient_all_reduces"] == n_weights  # one per trax weight
    jitted = jax.jit(step)
    state, first = jitted(*args)
    for _ in range(10):
        state, loss = jitted(state, args[1])
    assert float(loss) < float(first)  # the trax model learns the token progressions

    result = opt.optimize(step, *args, budget_s=3, measure_top_k=1, rounds=2, steps=1)
    assert result.search.evals > 0 and "xla_default" in {r.name for r in result.rows}
    assert "disco_1" in {r.found_as for r in result.rows}  # the search's first, named by content
    reference = three_steps(jitted, args)
    for plan in (result.plan, result.row("disco_1").plan):
        applied = xla_hooks.apply(plan, step, *args)
        assert applied.applied, applied.fallback_reason
        assert_allclose_leaves(three_steps(applied, args), reference)


@pytest.mark.trax
@needs_trax
def test_trax_classifier_step():
    step, args = trax_models.make_trax_train_step(
        "trax.models.MLP", {"layer_widths": [16, 5], "flatten": True},
        task="classify", input_shape=(4, 4), devices=2)
    _, loss = jax.jit(step)(*args)
    assert np.isfinite(float(loss)) and args[1]["labels"].max() < 5


@pytest.mark.trax
@needs_trax
def test_cli_optimize_trax_model_json():
    r = run_cli("optimize", "--trax-model", "trax.models.TransformerLM", "--trax-kwargs", json.dumps(TINY_LM),
                "--devices", "4", "--budget", "3", "--measure-top-k", "1", "--rounds", "2", "--steps", "1",
                "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["model"] == "trax.models.TransformerLM" and out["preset"] == "trax"
    assert out["chosen"] in {row["name"] for row in out["rows"]}

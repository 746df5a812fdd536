"""disco.sim.memory: a compiled step's device memory, from XLA's buffer assignment."""

from __future__ import annotations

import types

import jax
import pytest

import trax_models
from disco.sim.memory import PeakMemory, peak_memory

DEVICES = 8


def _compiled(style, donate=()):
    # SGD: the state is the parameters alone, a program half adamw's size to compile (three of them here)
    step, args = trax_models.make_train_step("transformer_lm", "tiny", devices=DEVICES, style=style, optimizer="sgd")
    return jax.jit(step, donate_argnums=donate).lower(*args).compile()


def test_sharded_parameters_hold_an_eighth_of_the_arguments_and_donation_aliases_the_outputs():
    replicated, sharded, donated = _compiled("gspmd"), _compiled("fsdp"), _compiled("fsdp", donate=(0,))
    r, s, d = peak_memory(replicated), peak_memory(sharded), peak_memory(donated)
    for m in (r, s, d):
        assert m.peak == m.arguments + m.outputs - m.aliased + m.temporaries
        assert m.temporaries > 0 and m.xla_peak is not None
    # every transformer_lm leaf is sharded 8 ways; the batch was split before
    assert s.arguments * 6 < r.arguments < s.arguments * 9
    assert r.aliased == s.aliased == 0 and d.aliased > 0.9 * d.outputs
    assert d.peak < s.peak
    # XLA:CPU's own figure leaves the temporaries out (see the module's docstring)
    assert s.xla_peak < s.peak and abs(s.xla_peak - (s.arguments + s.outputs)) < 1024


def test_an_applied_step_and_the_stats_themselves_are_read():
    import xla_hooks

    step, args = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, style="fsdp")
    applied = xla_hooks.apply(None, step, *args, strict=True)
    assert peak_memory(applied) == peak_memory(applied.compiled) == peak_memory(applied.compiled.memory_analysis())


@pytest.mark.fast
def test_stats_are_summed_and_bad_input_named():
    stats = types.SimpleNamespace(argument_size_in_bytes=10, output_size_in_bytes=20, alias_size_in_bytes=5,
                                  temp_size_in_bytes=100)
    assert peak_memory(stats) == PeakMemory(10, 20, 5, 100, 125, None)
    with pytest.raises(ValueError, match=r"reports no memory analysis"):
        peak_memory(types.SimpleNamespace(memory_analysis=lambda: None))
    with pytest.raises(ValueError, match=r"lacks a size"):
        peak_memory(types.SimpleNamespace(temp_size_in_bytes=1))
    with pytest.raises(TypeError, match=r"expected a jax Compiled, an AppliedStep or its memory_analysis\(\), got int"):
        peak_memory(3)

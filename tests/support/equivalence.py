"""Helpers shared by the tests that check a plan never changes the step's numbers."""

from __future__ import annotations

import jax
import numpy as np


def three_steps(fn, args):
    """Runs ``fn(state, batch)`` three times from ``args``; the final state as numpy."""
    state, batch = args
    for _ in range(3):
        state, _ = fn(state, batch)
    return jax.tree.map(np.asarray, state)


def assert_allclose_leaves(a, b, rtol=1e-5, atol=1e-7):
    """``np.testing.assert_allclose`` per leaf of two pytrees of the same structure."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def assert_close(a, b, rtol=1e-5, floor=1e-7):
    """Per leaf, max |a - b| <= rtol * max |b| + floor: relative to the leaf's scale.

    The floor covers leaves whose true gradient is zero (attention key biases): their values
    are pure rounding noise near 1e-20, so no relative bound can hold there.
    """
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        err, scale = float(np.max(np.abs(x64 - y64), initial=0.0)), float(np.max(np.abs(y64), initial=0.0))
        assert err <= rtol * scale + floor, f"{jax.tree_util.keystr(path)}: max abs error {err:.3g}, scale {scale:.3g}"


def compiled_all_reduces(applied) -> int:
    """The all-reduces (sync or async start) in an applied step's compiled module."""
    text = applied.compiled_text()
    return text.count(" all-reduce(") + text.count(" all-reduce-start(")


def assert_buckets_apply_and_keep_the_numbers(plan, step, args, reference):
    """``xla_hooks.apply(plan, step, *args)`` with every warning an error: the plan applied, the compiled
    collectives its buckets (XLA's combiner would have merged them into one), and three steps within
    :func:`assert_close` of ``reference``'s."""
    import warnings

    import xla_hooks

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied = xla_hooks.apply(plan, step, *args)
    assert applied.applied, applied.fallback_reason
    assert compiled_all_reduces(applied) == len(plan.buckets)
    assert_close(three_steps(applied, args), three_steps(reference, args))


def compiled_count(applied, opcode: str) -> int:
    """The ``opcode`` collectives (sync or async start) in an applied step's compiled module."""
    import re

    return len(re.findall(rf"\s{opcode}(?:-start)?\(", applied.compiled_text()))


def apply_strictly(plan, step, args):
    """``xla_hooks.apply(plan, step, *args, strict=True)`` with every warning an error; it applied."""
    import warnings

    import xla_hooks

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied = xla_hooks.apply(plan, step, *args, strict=True)
    assert applied.applied, applied.fallback_reason
    return applied

"""The corpus of user-written training steps (``tests/support/user_steps.py``) under plain jax, no disco:
every entry builds fresh objects, trains, changes its parameters, repeats itself exactly from its
seeds and donates what its jit says; every refused entry that jax itself refuses fails as expected.

The entries' test is ``slow`` (about 140 s of CPU on 2 cores: two compiles per entry); the refused
entries' runs in the default tier."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from tests.support.user_steps import CORPUS, JAX_PATTERNS, JAX_REFUSED, REFUSED, UserStep


def _arrays(obj) -> list:
    """The arrays an argument holds: an nnx object's state, or the pytree's leaves."""
    if isinstance(obj, nnx.Pytree):
        obj = nnx.state(obj)
    return [x for x in jax.tree.leaves(obj) if isinstance(x, jax.Array)]


def _host(tree):
    """``tree`` as numpy copies (a zero-copy view of a CPU array would keep jax from donating it);
    typed keys as their key data."""

    def copy(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.array(x, copy=True)

    return jax.tree.map(copy, tree)


def _floats(tree) -> list[np.ndarray]:
    leaves = [np.asarray(x) for x in jax.tree.leaves(tree) if isinstance(x, jax.Array | np.ndarray)]
    return [x for x in leaves if np.issubdtype(x.dtype, np.floating) or x.dtype.name == "bfloat16"]


def _run(entry: UserStep, steps: int = 3):
    """``steps`` steps through ``advance(entry.step, ...)``; the float outputs of every call and the
    parameters after the last, as numpy."""
    outputs = []

    def recording(*args, **kwargs):
        out = entry.step(*args, **kwargs)
        outputs.append(_host(out))
        return out

    args, kwargs = entry.args, entry.kwargs
    for _ in range(steps):
        args, kwargs = entry.advance(recording, args, kwargs)
    return outputs, _host(entry.params(args, kwargs))


def _assert_same(a, b):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_an_entry_trains_repeats_itself_and_donates_what_it_says(name):
    a, b = CORPUS[name](), CORPUS[name]()
    assert a.name == name and a.source and a.dtype in ("float32", "bfloat16")
    assert a.style in ("nnx", "jit", "jit-static", "pmap", "shard_map")
    # two makes, two independent sets of objects
    arrays_a, arrays_b = _arrays((a.args, a.kwargs)), _arrays((b.args, b.kwargs))
    assert arrays_a and not {id(x) for x in arrays_a} & {id(x) for x in arrays_b}
    assert not {id(x) for x in a.args if not isinstance(x, int | float | str)} & {id(x) for x in b.args}
    initial = _host(a.params(a.args, a.kwargs))
    donated = [x for i in a.donated for x in _arrays(a.args[i])]
    assert not a.donated or donated

    # one call through the user's own step (inside advance): jax deletes what it donates
    args, kwargs = a.advance(a.step, a.args, a.kwargs)
    assert all(x.is_deleted() for x in donated), [x.shape for x in donated if not x.is_deleted()]
    _assert_same(_host(b.params(b.args, b.kwargs)), initial)  # b untouched by a's step
    for _ in range(2):
        args, kwargs = a.advance(a.step, args, kwargs)
    trained_a = _host(a.params(args, kwargs))

    outputs, trained_b = _run(b)
    assert len(outputs) == 3
    for leaf in _floats(outputs) + _floats(trained_b):
        assert np.all(np.isfinite(leaf.astype(np.float32)))
    assert any(not np.array_equal(x, y) for x, y in
               zip(jax.tree.leaves(trained_b), jax.tree.leaves(initial), strict=True))
    _assert_same(trained_a, trained_b)  # two fresh makes, the same parameters after 3 steps


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_entry_jax_refuses_fails_naming_what_it_must(name):
    make, pattern = REFUSED[name]
    entry = make()
    assert entry.name == name and pattern
    if name in JAX_REFUSED:
        with pytest.raises((TypeError, ValueError), match=JAX_PATTERNS.get(name, pattern)):
            entry.advance(entry.step, entry.args, entry.kwargs)
    else:  # plain jax runs it; refusing it is disco's to do
        outputs, params = _run(entry, steps=1)
        assert all(np.all(np.isfinite(x)) for x in _floats(outputs) + _floats(params))

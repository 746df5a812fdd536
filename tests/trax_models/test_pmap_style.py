"""style="pmap": the zoo step written with jax.pmap computes what the shard_map step computes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import trax_models

DEVICES = 4


@pytest.mark.parametrize("name", ["mlp", pytest.param("transformer", marks=pytest.mark.slow)])
def test_pmap_step_matches_shard_map_on_the_same_global_batch(name):
    out = {}
    for style in ("shard_map", "pmap"):
        step, (state, batch) = trax_models.make_train_step(name, "tiny", devices=DEVICES, style=style)
        fn = jax.jit(step)
        losses = []
        for _ in range(2):
            state, loss = fn(state, batch)
            losses.append(np.asarray(loss))
        out[style] = losses, jax.tree.map(np.asarray, state.params)
    (ref_losses, ref_params), (losses, params) = out["shard_map"], out["pmap"]
    for ref, loss in zip(ref_losses, losses, strict=True):
        assert loss.shape == (DEVICES,)  # one (equal) loss per replica, as pmap returns it
        np.testing.assert_allclose(loss, np.full(DEVICES, ref), rtol=1e-5)
    for (path, ref), replicas in zip(jax.tree_util.tree_leaves_with_path(ref_params), jax.tree.leaves(params),
                                     strict=True):
        assert replicas.shape == (DEVICES, *ref.shape), jax.tree_util.keystr(path)
        for replica in replicas:
            np.testing.assert_allclose(replica, ref, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_pmap_arguments_carry_a_leading_device_axis():
    _, (state, batch) = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, style="pmap", abstract=True)
    _, (ref_state, ref_batch) = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, abstract=True)
    for leaf, ref in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state), strict=True):
        assert leaf.shape == (DEVICES, *ref.shape)
    for k, v in batch.items():
        ref = ref_batch[k]
        assert v.shape == (DEVICES, ref.shape[0] // DEVICES, *ref.shape[1:])


def test_an_unknown_style_is_refused_with_the_valid_ones():
    assert trax_models.STYLES == ("shard_map", "pmap", "gspmd", "fsdp")
    with pytest.raises(ValueError, match=r"style: expected one of shard_map, pmap, gspmd, fsdp, got 'vmap'"):
        trax_models.make_train_step("mlp", "tiny", devices=1, style="vmap")

"""style="fsdp": the zoo step with sharded parameters computes what the gspmd step computes."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import trax_models
from trax_models import _fsdp

DEVICES = 8


def _three_steps(name, style, **kwargs):
    step, (state, batch) = trax_models.make_train_step(name, "tiny", devices=DEVICES, style=style, **kwargs)
    fn = jax.jit(step)
    losses = []
    for _ in range(3):
        state, loss = fn(state, batch)
        losses.append(np.asarray(loss))
    return losses, state


@pytest.mark.parametrize(("name", "mesh_shape"), [
    ("mlp", None), ("mlp", (2, 4)), ("transformer_lm", None),
    pytest.param("transformer_lm", (2, 4), marks=pytest.mark.slow),
    pytest.param("resnet50", None, marks=pytest.mark.slow), pytest.param("vgg19", (2, 4), marks=pytest.mark.slow),
])
def test_fsdp_step_matches_the_gspmd_step_after_three_steps(name, mesh_shape):
    ref_losses, ref_state = _three_steps(name, "gspmd")
    losses, state = _three_steps(name, "fsdp", mesh_shape=mesh_shape)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    fsdp = DEVICES if mesh_shape is None else mesh_shape[1]
    sharded = 0
    for (path, ref), leaf in zip(jax.tree_util.tree_leaves_with_path(ref_state.params),
                                 jax.tree.leaves(state.params), strict=True):
        where = jax.tree_util.keystr(path)
        # the state stays sharded through the step, as the rule shards it
        assert leaf.sharding.spec == _fsdp.leaf_spec(leaf.shape, fsdp), where
        sharded += leaf.sharding.spec != P()
        np.testing.assert_allclose(np.asarray(leaf), np.asarray(ref), rtol=1e-5, atol=1e-6, err_msg=where)
    assert sharded > 0
    for leaf in jax.tree.leaves(state.opt_state):
        assert leaf.sharding.spec == _fsdp.leaf_spec(leaf.shape, fsdp)


def test_the_batch_is_split_over_both_mesh_axes():
    _, (state, batch) = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, style="fsdp",
                                                    mesh_shape=(2, 4), abstract=True)
    for v in batch.values():
        assert v.sharding.spec == P(("data", "fsdp"))
        assert dict(v.sharding.mesh.shape) == {"data": 2, "fsdp": 4}


@pytest.mark.parametrize(("shape", "fsdp", "dim"), [
    ((16, 16), 8, 0),  # equal sizes: the leading one
    ((32, 64), 8, 1),  # the largest
    ((6, 16), 4, 1),
    ((12, 6), 8, None),  # nothing divides
    ((), 8, None),
    ((3, 8), 1, None),  # a size-1 fsdp axis shards nothing
])
def test_shard_dim_picks_the_largest_dimension_the_axis_divides(shape, fsdp, dim):
    assert _fsdp.shard_dim(shape, fsdp) == dim


@pytest.mark.parametrize(("mesh_shape", "error", "match"), [
    ((2, 2), ValueError, r"product is devices \(8\), got \(2, 2\)"),
    ((8,), TypeError, r"expected None or \(data, fsdp\)"),
    ((2.0, 4), TypeError, r"two ints"),
])
def test_a_bad_mesh_shape_is_refused(mesh_shape, error, match):
    with pytest.raises(error, match=match):
        trax_models.make_train_step("mlp", "tiny", devices=DEVICES, style="fsdp", mesh_shape=mesh_shape,
                                    abstract=True)


def test_only_the_fsdp_style_takes_a_mesh_shape():
    with pytest.raises(ValueError, match=r"only style 'fsdp' takes one, got \(1, 8\) with style 'gspmd'"):
        trax_models.make_train_step("mlp", "tiny", devices=DEVICES, style="gspmd", mesh_shape=(1, 8))

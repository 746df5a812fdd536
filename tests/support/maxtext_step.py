"""A flax linen transformer LM step in MaxText's idiom, for the tests of steps with sharded parameters.

Logical axis names on every weight (``nn.with_logical_partitioning``) and on the activations
(``nn.with_logical_constraint``, rules and mesh passed explicitly, so no context is needed when
disco traces the step), rules mapping them to a ``("data", "fsdp", "tensor")`` mesh as MaxText's
base config does (weights' ``embed`` over fsdp, the batch over data and fsdp), a flax ``TrainState``
with adamw, and ``jax.jit`` with in and out shardings from ``nn.logical_to_mesh_sharding``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding

RULES = (("batch", ("data", "fsdp")), ("activation_batch", ("data", "fsdp")), ("activation_length", None),
         ("activation_embed", "tensor"), ("activation_mlp", "tensor"), ("activation_heads", "tensor"),
         ("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("kv", None), ("vocab", "tensor"),
         ("norm", None))
ACTIVATION = ("activation_batch", "activation_length", "activation_embed")
VOCAB, EMBED, MLP, HEADS, LENGTH, BATCH = 64, 32, 64, 2, 16, 8


def _dense(features, axes, name):
    return nn.DenseGeneral(features, use_bias=False, name=name,
                           kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes))


def _constrain(x, axes, mesh):
    return nn.with_logical_constraint(x, axes, rules=RULES, mesh=mesh)


class Block(nn.Module):
    mesh: jax.sharding.Mesh

    @nn.compact
    def __call__(self, x):
        x = _constrain(x, ACTIVATION, self.mesh)
        norm = nn.LayerNorm(use_bias=False, scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)))
        h = norm(x)
        q = _dense((HEADS, EMBED // HEADS), ("embed", "heads", "kv"), "query")(h)
        k = _dense((HEADS, EMBED // HEADS), ("embed", "heads", "kv"), "key")(h)
        v = _dense((HEADS, EMBED // HEADS), ("embed", "heads", "kv"), "value")(h)
        w = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(EMBED // HEADS)
        w = jnp.where(jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool)), w, -1e9)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(w), v)
        x = x + nn.DenseGeneral(EMBED, axis=(-2, -1), use_bias=False, name="out", kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("heads", "kv", "embed")))(a)
        h = nn.LayerNorm(use_bias=False, scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)))(x)
        h = _constrain(nn.relu(_dense(MLP, ("embed", "mlp"), "wi")(h)),
                       ("activation_batch", "activation_length", "activation_mlp"), self.mesh)
        return x + _dense(EMBED, ("mlp", "embed"), "wo")(h)


class LM(nn.Module):
    mesh: jax.sharding.Mesh

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(VOCAB, EMBED, embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")))
        x = _constrain(embed(tokens), ACTIVATION, self.mesh)
        for i in range(2):
            x = Block(self.mesh, name=f"block_{i}")(x)
        return embed.attend(_constrain(nn.LayerNorm(use_bias=False)(x), ACTIVATION, self.mesh))


def make_step(mesh_shape: tuple[int, int, int] = (1, 8, 1)):
    """The jitted step and its ``(state, batch)`` on the first ``prod(mesh_shape)`` devices."""
    mesh = jax.make_mesh(mesh_shape, ("data", "fsdp", "tensor"), devices=jax.devices()[:int(np.prod(mesh_shape))],
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    model, tx = LM(mesh), optax.adamw(1e-3)
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(BATCH, LENGTH + 1)).astype(np.int32)

    def init_state(key):
        params = model.init(key, tokens[:, :-1])["params"]
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    specs = nn.get_partition_spec(jax.eval_shape(init_state, jax.random.key(0)))
    shardings = nn.logical_to_mesh_sharding(specs, mesh, RULES)
    state = jax.jit(lambda k: nn.meta.unbox(init_state(k)), out_shardings=shardings)(jax.random.key(0))
    batch_sharding = NamedSharding(mesh, nn.logical_to_mesh_axes(("batch", None), RULES))
    batch = jax.device_put({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}, batch_sharding)

    def train_step(state, batch):
        def loss_fn(params):
            logits = state.apply_fn({"params": params}, batch["inputs"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    step = jax.jit(train_step, in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None))
    return step, (state, batch)

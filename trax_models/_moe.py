"""A Transformer LM whose feed-forward blocks are mixtures of experts (top-2 routing, 8 experts).

Routing as GShard and Switch Transformer write it in JAX (and flaxformer's ``routing.py``): a linear
router's softmax picks each token's ``top_k`` experts; tokens are placed into per-expert slots of a
fixed capacity (``capacity_factor`` times the even share; tokens beyond it are dropped, their
residual carries them); dispatch and combine are dense one-hot einsums, so every shape is static;
the experts' weights are stacked ``[experts, d_model, d_ff]``. An auxiliary load-balancing loss
(Switch Transformer, eq. 4) keeps the router from collapsing.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trax_models._configs import MoEConfig
from trax_models._task import Task, cross_entropy, progression_tokens
from trax_models._transformer_layers import Embedding, causal_mask

AUX_LOSS_WEIGHT = 0.01


class MoEBlock(nn.Module):
    """Top-k routed experts over the tokens of a ``[batch, length, d_model]`` input.

    Returns the combined expert outputs and the load-balancing loss (sown as ``aux_loss``).
    """

    n_experts: int
    top_k: int
    d_ff: int
    capacity_factor: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        tokens = x.reshape(b * t, d)
        n, e, k = b * t, self.n_experts, self.top_k
        capacity = max(1, math.ceil(self.capacity_factor * k * n / e))
        probs = jax.nn.softmax(nn.Dense(e, use_bias=False, name="router")(tokens).astype(jnp.float32))
        gates, experts = jax.lax.top_k(probs, k)  # [n, k]
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        # Slot of each (token, choice) in its expert: choices in priority order, then tokens.
        onehot = jax.nn.one_hot(experts, e, dtype=jnp.int32)  # [n, k, e]
        flat = onehot.transpose(1, 0, 2).reshape(k * n, e)
        position = (jnp.cumsum(flat, axis=0) - 1).reshape(k, n, e).transpose(1, 0, 2)
        slot = jnp.sum(position * onehot, axis=-1)  # [n, k]
        kept = slot < capacity
        dispatch = (onehot * kept[..., None])[..., None] * jax.nn.one_hot(slot, capacity)[:, :, None, :]
        combine = jnp.sum(dispatch * gates[..., None, None], axis=1)  # [n, e, c]
        dispatch = jnp.sum(dispatch, axis=1)  # [n, e, c]
        expert_in = jnp.einsum("nec,nd->ecd", dispatch, tokens)
        w_in = self.param("w_in", nn.initializers.lecun_normal(), (e, d, self.d_ff))
        w_out = self.param("w_out", nn.initializers.lecun_normal(), (e, self.d_ff, d))
        hidden = nn.gelu(jnp.einsum("ecd,edf->ecf", expert_in, w_in))
        expert_out = jnp.einsum("ecf,efd->ecd", hidden, w_out)
        out = jnp.einsum("nec,ecd->nd", combine, expert_out)
        fraction = jnp.mean(onehot[:, 0, :].astype(jnp.float32), axis=0)  # top-1 share per expert
        self.sow("losses", "aux_loss", e * jnp.sum(fraction * jnp.mean(probs, axis=0)))
        return out.reshape(b, t, d).astype(x.dtype)


class MoEBlockLayer(nn.Module):
    """Pre-norm causal self-attention, then a pre-norm MoE feed-forward block."""

    config: MoEConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        c = self.config
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=c.n_heads)(h, h, mask=mask)
        moe = MoEBlock(n_experts=c.n_experts, top_k=c.top_k, d_ff=c.d_ff,
                       capacity_factor=c.capacity_factor)
        return x + moe(nn.LayerNorm()(x))


class MoELM(nn.Module):
    """Decoder-only LM with an MoE feed-forward block in every layer."""

    config: MoEConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        x = Embedding(vocab_size=c.vocab_size, d_model=c.d_model, max_len=c.seq_len)(tokens)
        mask = causal_mask(tokens)
        for _ in range(c.n_layers):
            x = MoEBlockLayer(config=c)(x, mask)
        return nn.Dense(c.vocab_size)(nn.LayerNorm()(x))


def task(config: MoEConfig) -> Task:
    """Next-token prediction, plus the routers' load-balancing loss."""
    if not 1 <= config.top_k <= config.n_experts:
        raise ValueError(f"top_k must be in [1, n_experts={config.n_experts}], got {config.top_k}")
    model = MoELM(config=config)

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, config.seq_len), np.int32))

    def loss(params, batch):
        logits, state = model.apply(params, batch["inputs"], mutable=["losses"])
        aux = sum(jax.tree.leaves(state["losses"]))
        return cross_entropy(logits, batch["targets"]) + AUX_LOSS_WEIGHT * aux / config.n_layers

    def make_batch(rng: np.random.Generator, global_batch: int):
        seq = progression_tokens(rng, batch=global_batch, length=config.seq_len + 1,
                                 vocab_size=config.vocab_size)
        return {"inputs": seq[:, :-1], "targets": seq[:, 1:]}

    return Task(init=init, loss=loss, make_batch=make_batch)

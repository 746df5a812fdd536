"""RNNLM: an LSTM language model (embedding, stacked LSTMs, dense logits)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from trax_models._configs import RNNLMConfig
from trax_models._task import Task, next_token_task


class RNNLM(nn.Module):
    """Stacked-LSTM language model returning next-token logits."""

    config: RNNLMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        x = nn.Embed(c.vocab_size, c.d_model)(tokens)
        for layer in range(c.n_layers):
            # A zero carry derived from ``x`` (not from a fresh constant) keeps
            # the carry's type equal to the step's output type, which matters
            # under ``shard_map`` where ``x`` varies across devices.
            zeros = jnp.zeros_like(x[:, 0])
            x = nn.RNN(nn.OptimizedLSTMCell(c.d_model), name=f"lstm_{layer}")(
                x, initial_carry=(zeros, zeros)
            )
        return nn.Dense(c.vocab_size)(x)


def task(config: RNNLMConfig) -> Task:
    """Next-token prediction on arithmetic-progression token sequences."""
    return next_token_task(RNNLM(config=config), config)

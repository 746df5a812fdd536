"""RNNLM: an LSTM language model (embedding, stacked LSTMs, dense logits)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trax_models._configs import RNNLMConfig
from trax_models._task import Task, cross_entropy, progression_tokens


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
    model = RNNLM(config=config)

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, config.seq_len), np.int32))

    def loss(params, batch):
        return cross_entropy(model.apply(params, batch["inputs"]), batch["targets"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        seq = progression_tokens(
            rng, batch=global_batch, length=config.seq_len + 1,
            vocab_size=config.vocab_size,
        )
        return {"inputs": seq[:, :-1], "targets": seq[:, 1:]}

    return Task(init=init, loss=loss, make_batch=make_batch)

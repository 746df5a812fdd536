"""TransformerLM: a decoder-only Transformer language model."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from trax_models._configs import TransformerLMConfig
from trax_models._task import Task, cross_entropy, progression_tokens
from trax_models._transformer_layers import EncoderBlock, Embedding, causal_mask


class TransformerLM(nn.Module):
    """Decoder-only Transformer returning next-token logits."""

    config: TransformerLMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        x = Embedding(vocab_size=c.vocab_size, d_model=c.d_model, max_len=c.seq_len)(
            tokens
        )
        mask = causal_mask(tokens)
        for _ in range(c.n_layers):
            x = EncoderBlock(n_heads=c.n_heads, d_ff=c.d_ff)(x, mask)
        return nn.Dense(c.vocab_size)(nn.LayerNorm()(x))


def task(config: TransformerLMConfig) -> Task:
    """Next-token prediction on arithmetic-progression token sequences."""
    model = TransformerLM(config=config)

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

"""Transformer: the encoder-decoder sequence-to-sequence model."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from trax_models._configs import TransformerConfig
from trax_models._task import Task, cross_entropy, progression_tokens
from trax_models._transformer_layers import (
    DecoderBlock,
    Embedding,
    EncoderBlock,
    causal_mask,
    shift_right,
)


class Transformer(nn.Module):
    """Encoder-decoder Transformer returning target logits (teacher forcing)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        c = self.config
        x = Embedding(
            vocab_size=c.vocab_size, d_model=c.d_model, max_len=c.seq_len,
            name="source_embedding",
        )(inputs)
        for _ in range(c.n_encoder_layers):
            x = EncoderBlock(n_heads=c.n_heads, d_ff=c.d_ff)(x)
        memory = nn.LayerNorm(name="encoder_norm")(x)

        decoder_inputs = shift_right(targets)
        y = Embedding(
            vocab_size=c.vocab_size, d_model=c.d_model, max_len=c.seq_len,
            name="target_embedding",
        )(decoder_inputs)
        mask = causal_mask(decoder_inputs)
        for _ in range(c.n_decoder_layers):
            y = DecoderBlock(n_heads=c.n_heads, d_ff=c.d_ff)(y, memory, mask)
        return nn.Dense(c.vocab_size)(nn.LayerNorm(name="decoder_norm")(y))


def task(config: TransformerConfig) -> Task:
    """Translate a token sequence into the same sequence reversed."""
    model = Transformer(config=config)

    def init(key: jax.Array):
        dummy = np.zeros((1, config.seq_len), np.int32)
        return model.init(key, dummy, dummy)

    def loss(params, batch):
        logits = model.apply(params, batch["inputs"], batch["targets"])
        return cross_entropy(logits, batch["targets"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        source = progression_tokens(
            rng, batch=global_batch, length=config.seq_len,
            vocab_size=config.vocab_size,
        )
        return {"inputs": source, "targets": np.ascontiguousarray(source[:, ::-1])}

    return Task(init=init, loss=loss, make_batch=make_batch)

"""TransformerLM: a decoder-only Transformer language model."""

from __future__ import annotations

import flax.linen as nn
import jax

from trax_models._configs import TransformerLMConfig
from trax_models._task import Task, next_token_task
from trax_models._transformer_layers import Embedding, EncoderBlock, causal_mask


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
    return next_token_task(TransformerLM(config=config), config)

"""Transformer building blocks shared by TransformerLM, Transformer and BERT."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class Embedding(nn.Module):
    """Token embedding plus a learned positional embedding."""

    vocab_size: int
    d_model: int
    max_len: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(self.vocab_size, self.d_model, name="tokens")(tokens)
        positions = self.param(
            "positions",
            nn.initializers.normal(stddev=0.02),
            (self.max_len, self.d_model),
        )
        return x + positions[None, : tokens.shape[1]]


class FeedForward(nn.Module):
    """Position-wise ``Dense -> ReLU -> Dense``."""

    d_ff: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.relu(nn.Dense(self.d_ff)(x))
        return nn.Dense(x.shape[-1])(h)


class EncoderBlock(nn.Module):
    """Pre-norm self-attention block (causal when used in a decoder-only LM)."""

    n_heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.n_heads)(h, h, mask=mask)
        return x + FeedForward(d_ff=self.d_ff)(nn.LayerNorm()(x))


class DecoderBlock(nn.Module):
    """Pre-norm causal self-attention, cross-attention and feed-forward block."""

    n_heads: int
    d_ff: int

    @nn.compact
    def __call__(
        self, x: jax.Array, memory: jax.Array, self_mask: jax.Array
    ) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.n_heads)(
            h, h, mask=self_mask
        )
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.n_heads)(h, memory)
        return x + FeedForward(d_ff=self.d_ff)(nn.LayerNorm()(x))


def causal_mask(tokens: jax.Array) -> jax.Array:
    """A ``[batch, 1, length, length]`` causal attention mask."""
    return nn.make_causal_mask(tokens)


def shift_right(tokens: jax.Array) -> jax.Array:
    """Prepends token 0 (beginning of sequence) and drops the last token."""
    return jnp.pad(tokens, ((0, 0), (1, 0)))[:, :-1]

"""GPT-2 style decoder (Radford et al. 2019) whose layers run in one ``lax.scan``.

As large-model JAX code writes it (``nn.scan`` over identical blocks, parameters stacked along a
leading layer axis): one compiled block body, a ``while`` loop in HLO, and one gradient tensor per
parameter kind rather than per layer. Pre-norm blocks with GELU MLPs, learned positions, a final
LayerNorm, and logits through the tied token embedding.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from trax_models._configs import GPT2Config
from trax_models._task import Task, next_token_task
from trax_models._transformer_layers import causal_mask
from trax_models._vit import MlpBlock


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP; ``(carry, _) -> (carry, None)`` for ``nn.scan``."""

    n_heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> tuple[jax.Array, None]:
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.n_heads)(h, h, mask=mask)
        return x + MlpBlock(d_ff=self.d_ff)(nn.LayerNorm()(x)), None


class GPT2(nn.Module):
    """Decoder-only LM; ``d_model=768, n_layers=12, n_heads=12, seq_len=1024`` is GPT-2 small."""

    config: GPT2Config

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        wte = nn.Embed(c.vocab_size, c.d_model, embedding_init=nn.initializers.normal(0.02), name="wte")
        wpe = self.param("wpe", nn.initializers.normal(stddev=0.01), (c.seq_len, c.d_model))
        x = wte(tokens) + wpe[None, : tokens.shape[1]]
        layers = nn.scan(
            Block, variable_axes={"params": 0}, split_rngs={"params": True},
            in_axes=nn.broadcast, length=c.n_layers,
        )(n_heads=c.n_heads, d_ff=c.d_ff, name="layers")
        x, _ = layers(x, causal_mask(tokens))
        x = nn.LayerNorm(name="ln_f")(x)
        return wte.attend(x.astype(jnp.float32))


def task(config: GPT2Config) -> Task:
    """Next-token prediction on arithmetic-progression token sequences."""
    return next_token_task(GPT2(config=config), config)

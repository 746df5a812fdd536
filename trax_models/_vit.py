"""Vision Transformer (Dosovitskiy et al. 2021): patches -> class token -> pre-norm encoder -> head.

Written as the reference ViT is (big_vision / the original ``vit_jax``): a strided convolution embeds
the patches, a learned class token and position embedding are added, pre-norm blocks with GELU MLPs
follow, and the class token's final LayerNorm feeds the classifier.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from trax_models._configs import ViTConfig
from trax_models._task import Task, image_classification_task


class MlpBlock(nn.Module):
    """``Dense -> GELU -> Dense``, the ViT/GPT-2 feed-forward block."""

    d_ff: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.d_ff)(x)))


class EncoderBlock(nn.Module):
    """Pre-norm self-attention and MLP, each with a residual connection."""

    n_heads: int
    d_ff: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.n_heads)(h, h)
        return x + MlpBlock(d_ff=self.d_ff)(nn.LayerNorm()(x))


class ViT(nn.Module):
    """ViT classifier; ``patch_size=16, d_model=384, n_layers=12, n_heads=6`` is ViT-S/16."""

    config: ViTConfig

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        c = self.config
        p = c.patch_size
        x = nn.Conv(c.d_model, (p, p), strides=(p, p), padding="VALID", name="embedding")(images)
        b, h, w, d = x.shape
        x = x.reshape(b, h * w, d)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, d))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, d)), x], axis=1)
        pos = self.param("pos_embedding", nn.initializers.normal(stddev=0.02), (1, h * w + 1, d))
        x = x + pos
        for _ in range(c.n_layers):
            x = EncoderBlock(n_heads=c.n_heads, d_ff=c.d_ff)(x)
        x = nn.LayerNorm(name="encoder_norm")(x)
        return nn.Dense(c.num_classes, name="head")(x[:, 0])


def task(config: ViTConfig) -> Task:
    """Image classification of random images with fixed random labels."""
    return image_classification_task(ViT(config=config), config)

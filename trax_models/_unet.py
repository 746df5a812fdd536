"""U-Net (Ronneberger et al. 2015) for per-pixel classification.

Each level: two 3x3 convolutions with GroupNorm and ReLU; 2x2 max pooling down, a stride-2
transposed convolution up, and the skip connection concatenated with the upsampled features. The
task segments random images into the pixels whose first channel is positive, which is learnable.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trax_models._configs import UNetConfig
from trax_models._task import Task, cross_entropy


class ConvBlock(nn.Module):
    """``(Conv 3x3 -> GroupNorm -> ReLU) x 2``."""

    features: int
    norm_groups: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(2):
            x = nn.Conv(self.features, (3, 3), use_bias=False)(x)
            x = nn.relu(nn.GroupNorm(num_groups=math.gcd(self.norm_groups, self.features))(x))
        return x


class UNet(nn.Module):
    """Down path over ``widths[:-1]``, a bottleneck of ``widths[-1]``, and the mirrored up path."""

    config: UNetConfig

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        c = self.config
        skips = []
        x = images
        for width in c.widths[:-1]:
            x = ConvBlock(width, c.norm_groups)(x)
            skips.append(x)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = ConvBlock(c.widths[-1], c.norm_groups)(x)
        for width, skip in zip(reversed(c.widths[:-1]), reversed(skips), strict=True):
            x = nn.ConvTranspose(width, (2, 2), strides=(2, 2))(x)
            x = ConvBlock(width, c.norm_groups)(jnp.concatenate([skip, x], axis=-1))
        return nn.Conv(c.num_classes, (1, 1), name="head")(x)


def task(config: UNetConfig) -> Task:
    """Per-pixel classification: is the pixel's first channel positive."""
    if config.image_size % 2 ** (len(config.widths) - 1):
        raise ValueError(
            f"image_size {config.image_size} must be divisible by 2**{len(config.widths) - 1} "
            f"for {len(config.widths)} U-Net levels"
        )
    model = UNet(config=config)

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, config.image_size, config.image_size, config.channels),
                                        np.float32))

    def loss(params, batch):
        return cross_entropy(model.apply(params, batch["images"]), batch["labels"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        size = config.image_size
        images = rng.standard_normal((global_batch, size, size, config.channels), dtype=np.float32)
        labels = (images[..., 0] > 0).astype(np.int32)
        return {"images": images, "labels": labels}

    return Task(init=init, loss=loss, make_batch=make_batch)

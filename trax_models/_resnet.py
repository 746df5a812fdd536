"""ResNet-50 style bottleneck network with GroupNorm (params are the only state)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from trax_models._configs import ResNetConfig
from trax_models._task import Task, image_classification_task


def _norm(features: int, groups: int, name: str | None = None) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=math.gcd(groups, features), name=name)


class Bottleneck(nn.Module):
    """``1x1 -> 3x3 (strided) -> 1x1 (x4)`` residual block."""

    features: int
    strides: int
    norm_groups: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        f, g = self.features, self.norm_groups
        y = nn.relu(_norm(f, g)(nn.Conv(f, (1, 1), use_bias=False)(x)))
        y = nn.Conv(f, (3, 3), strides=self.strides, use_bias=False)(y)
        y = nn.relu(_norm(f, g)(y))
        y = nn.Conv(4 * f, (1, 1), use_bias=False)(y)
        y = nn.GroupNorm(num_groups=math.gcd(g, 4 * f), scale_init=nn.initializers.zeros)(y)
        if x.shape[-1] != 4 * f or self.strides != 1:
            x = nn.Conv(4 * f, (1, 1), strides=self.strides, use_bias=False,
                        name="projection")(x)
            x = _norm(4 * f, g, name="projection_norm")(x)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """Bottleneck ResNet; ``stage_sizes=(3, 4, 6, 3)``, ``width=64`` is ResNet-50."""

    config: ResNetConfig

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        c = self.config
        x = nn.Conv(c.width, (7, 7), strides=2, use_bias=False, name="stem")(images)
        x = nn.relu(_norm(c.width, c.norm_groups, name="stem_norm")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for stage, blocks in enumerate(c.stage_sizes):
            for block in range(blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = Bottleneck(
                    features=c.width * 2**stage, strides=strides,
                    norm_groups=c.norm_groups,
                )(x)
        return nn.Dense(c.num_classes)(jnp.mean(x, axis=(1, 2)))


def task(config: ResNetConfig) -> Task:
    """Image classification of random images with fixed random labels."""
    return image_classification_task(ResNet(config=config), config)

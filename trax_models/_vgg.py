"""VGG-19: stacks of 3x3 convolutions with max pooling, then dense layers."""

from __future__ import annotations

import flax.linen as nn
import jax

from trax_models._configs import VGGConfig
from trax_models._task import Task, image_classification_task


class VGG(nn.Module):
    """VGG classifier; the paper preset is VGG-19 (16 convs + 3 dense layers)."""

    config: VGGConfig

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        c = self.config
        x = images
        for n_convs, features in c.stages:
            for _ in range(n_convs):
                x = nn.relu(nn.Conv(features, (3, 3))(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(c.fc_width)(x))
        x = nn.relu(nn.Dense(c.fc_width)(x))
        return nn.Dense(c.num_classes)(x)


def task(config: VGGConfig) -> Task:
    """Image classification of random images with fixed random labels."""
    return image_classification_task(VGG(config=config), config)

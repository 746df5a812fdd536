"""VGG-19: stacks of 3x3 convolutions with max pooling, then dense layers."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from trax_models._configs import VGGConfig
from trax_models._task import Task, cross_entropy, labelled_images


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
    model = VGG(config=config)

    def init(key: jax.Array):
        shape = (1, config.image_size, config.image_size, config.channels)
        return model.init(key, np.zeros(shape, np.float32))

    def loss(params, batch):
        return cross_entropy(model.apply(params, batch["images"]), batch["labels"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        return labelled_images(
            rng, batch=global_batch, size=config.image_size,
            channels=config.channels, num_classes=config.num_classes,
        )

    return Task(init=init, loss=loss, make_batch=make_batch)

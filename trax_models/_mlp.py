"""A deep, narrow MLP: many small gradient tensors for all-reduce fusion studies."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from trax_models._configs import MLPConfig
from trax_models._task import Task, cross_entropy


class MLP(nn.Module):
    """``n_layers`` ReLU layers of ``width`` (He init) and a linear classifier."""

    config: MLPConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        init = nn.initializers.he_normal()
        for _ in range(c.n_layers):
            x = nn.relu(nn.Dense(c.width, kernel_init=init)(x))
        return nn.Dense(c.num_classes)(x)


def task(config: MLPConfig) -> Task:
    """Classify random feature vectors with fixed random labels."""
    model = MLP(config=config)

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, config.in_features), np.float32))

    def loss(params, batch):
        return cross_entropy(model.apply(params, batch["inputs"]), batch["labels"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        inputs = rng.standard_normal((global_batch, config.in_features), dtype=np.float32)
        labels = rng.integers(0, config.num_classes, size=(global_batch,))
        return {"inputs": inputs, "labels": labels.astype(np.int32)}

    return Task(init=init, loss=loss, make_batch=make_batch)

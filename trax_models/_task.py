"""The interface every zoo model exposes to the training step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = Any
Batch = Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Task:
    """A model with its loss and synthetic data.

    Attributes:
      init: ``init(key) -> params``.
      loss: ``loss(params, batch) -> scalar``, the mean loss of the (local) batch.
      make_batch: ``make_batch(rng, global_batch) -> dict of numpy arrays``;
        deterministic for a seeded ``numpy.random.Generator``.
    """

    init: Callable[[jax.Array], Params]
    loss: Callable[[Params, Batch], jax.Array]
    make_batch: Callable[[np.random.Generator, int], dict[str, np.ndarray]]


def cross_entropy(
    logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None
) -> jax.Array:
    """Mean (optionally weighted) softmax cross entropy with integer labels."""
    losses = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels
    )
    if weights is None:
        return jnp.mean(losses)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def progression_tokens(
    rng: np.random.Generator, *, batch: int, length: int, vocab_size: int
) -> np.ndarray:
    """Learnable token sequences: ``(start + stride * t) mod (vocab - 1) + 1``.

    Token 0 is left free for padding / beginning of sequence.
    """
    start = rng.integers(0, vocab_size - 1, size=(batch, 1))
    stride = rng.integers(1, 4, size=(batch, 1))
    t = np.arange(length)[None, :]
    return ((start + stride * t) % (vocab_size - 1) + 1).astype(np.int32)


def labelled_images(
    rng: np.random.Generator, *, batch: int, size: int, channels: int, num_classes: int
) -> dict[str, np.ndarray]:
    """Random NHWC images with fixed random labels (learnable by memorisation)."""
    images = rng.standard_normal((batch, size, size, channels), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=(batch,)).astype(np.int32)
    return {"images": images, "labels": labels}


def image_classification_task(model: Any, config: Any) -> Task:
    """Classification of random images with fixed random labels, for any image model.

    ``config`` needs ``image_size``, ``channels`` and ``num_classes``.
    """

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


def next_token_task(model: Any, config: Any) -> Task:
    """Next-token prediction on arithmetic-progression token sequences, for any language model.

    ``config`` needs ``seq_len`` and ``vocab_size``.
    """

    def init(key: jax.Array):
        return model.init(key, np.zeros((1, config.seq_len), np.int32))

    def loss(params, batch):
        return cross_entropy(model.apply(params, batch["inputs"]), batch["targets"])

    def make_batch(rng: np.random.Generator, global_batch: int):
        seq = progression_tokens(
            rng, batch=global_batch, length=config.seq_len + 1,
            vocab_size=config.vocab_size,
        )
        return {"inputs": seq[:, :-1], "targets": seq[:, 1:]}

    return Task(init=init, loss=loss, make_batch=make_batch)

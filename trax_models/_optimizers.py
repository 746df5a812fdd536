"""The optax optimizers a training step can use."""

from __future__ import annotations

import optax

from trax_models._registry import check_optimizer

DEFAULT_LEARNING_RATES: dict[str, float] = {"adam": 1e-3, "adamw": 1e-3, "sgd": 1e-2}


def make_optimizer(
    optimizer: str, *, learning_rate: float | None = None
) -> optax.GradientTransformation:
    """Returns the optax transformation named ``optimizer``.

    Args:
      optimizer: One of ``"adam"``, ``"adamw"``, ``"sgd"`` (SGD with momentum 0.9).
      learning_rate: Step size; ``None`` picks ``DEFAULT_LEARNING_RATES[optimizer]``.

    Raises:
      ValueError: for an unknown optimizer.
    """
    check_optimizer(optimizer)
    lr = DEFAULT_LEARNING_RATES[optimizer] if learning_rate is None else learning_rate
    if optimizer == "adam":
        return optax.adam(lr)
    if optimizer == "adamw":
        return optax.adamw(lr, weight_decay=1e-4)
    return optax.sgd(lr, momentum=0.9)

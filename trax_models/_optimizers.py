"""The optax optimizers a training step can use."""

from __future__ import annotations

import math
import numbers

import optax

from trax_models._registry import check_optimizer

DEFAULT_LEARNING_RATES: dict[str, float] = {"adam": 1e-3, "adamw": 1e-3, "sgd": 1e-2}


def make_optimizer(
    optimizer: str, *, learning_rate: float | optax.Schedule | None = None
) -> optax.GradientTransformation:
    """Returns the optax transformation named ``optimizer``.

    Args:
      optimizer: One of ``"adam"``, ``"adamw"``, ``"sgd"`` (SGD with momentum 0.9).
      learning_rate: Step size, a number or an optax schedule; ``None`` picks
        ``DEFAULT_LEARNING_RATES[optimizer]``.

    Raises:
      TypeError: for a ``learning_rate`` that is not a real number.
      ValueError: for an unknown optimizer, or a negative or non-finite ``learning_rate``.
    """
    check_optimizer(optimizer)
    lr = DEFAULT_LEARNING_RATES[optimizer] if learning_rate is None else check_learning_rate(learning_rate)
    if optimizer == "adam":
        return optax.adam(lr)
    if optimizer == "adamw":
        return optax.adamw(lr, weight_decay=1e-4)
    return optax.sgd(lr, momentum=0.9)


def check_learning_rate(learning_rate: object) -> float | optax.Schedule:
    """Returns ``learning_rate`` when it is a finite real number >= 0 (as a float) or a schedule.

    A callable is taken as an optax schedule (``step -> rate``) and passed on unchecked.

    Raises:
      TypeError: for anything but a real number or a callable (a bool is not a number).
      ValueError: for a negative or non-finite number (they train towards NaN or away from the minimum).
    """
    if callable(learning_rate):
        return learning_rate
    expected = "learning_rate: expected a finite number >= 0 or an optax schedule (or None: the optimizer's default)"
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real):
        raise TypeError(f"{expected}, got {type(learning_rate).__name__} {learning_rate!r}")
    if not math.isfinite(learning_rate) or learning_rate < 0:
        raise ValueError(f"{expected}, got {learning_rate!r}")
    return float(learning_rate)

"""The training state carried between steps; importable without jax."""

from __future__ import annotations

from typing import Any, NamedTuple


class TrainState(NamedTuple):
    """Parameters and optimizer state (a pytree, as every NamedTuple is).

    Attributes:
      params: The model parameters (a nested dict of arrays).
      opt_state: The optax optimizer state for ``params``.
    """

    params: Any
    opt_state: Any

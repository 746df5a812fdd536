"""Flax ports of the trax models the Disco paper evaluated.

``import trax_models`` does not import jax; ``make_train_step`` and
``model_info`` import it on first use.

Example:
  >>> import jax, trax_models
  >>> step, (state, batch) = trax_models.make_train_step("mlp", devices=1)
  >>> state, loss = jax.jit(step)(state, batch)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trax_models._random import is_random, random_names
from trax_models._registry import PRESETS, STYLES, config, names, presets
from trax_models._train_state import TrainState

if TYPE_CHECKING:
    from trax_models._info import ModelInfo, model_info
    from trax_models._jax_compat import data_parallel_mesh
    from trax_models._train_step import build_train_step, make_train_step
    from trax_models._trax_layer import make_trax_train_step

_LAZY = {
    "make_train_step": "trax_models._train_step",
    "build_train_step": "trax_models._train_step",
    "make_trax_train_step": "trax_models._trax_layer",
    "model_info": "trax_models._info",
    "data_parallel_mesh": "trax_models._jax_compat",
    "ModelInfo": "trax_models._info",
}

__all__ = [
    "PRESETS",
    "STYLES",
    "ModelInfo",
    "TrainState",
    "build_train_step",
    "config",
    "data_parallel_mesh",
    "is_random",
    "make_train_step",
    "make_trax_train_step",
    "model_info",
    "names",
    "presets",
    "random_names",
]


def __getattr__(attr: str) -> Any:
    if attr in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[attr]), attr)
        globals()[attr] = value
        return value
    raise AttributeError(f"module 'trax_models' has no attribute {attr!r}")

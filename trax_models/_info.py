"""Model sizes without compiling anything."""

from __future__ import annotations

import dataclasses
import math

from trax_models import _registry
from trax_models._configs import ModelConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """Sizes of one zoo model at one preset.

    Attributes:
      name: The model name.
      preset: The preset name.
      param_count: Number of scalar parameters.
      param_bytes: Bytes of the parameters.
      grad_leaves: Number of parameter (and gradient) tensors.
      global_batch: Global batch size for ``devices`` devices.
      config: The model's frozen config.
    """

    name: str
    preset: str
    param_count: int
    param_bytes: int
    grad_leaves: int
    global_batch: int
    config: ModelConfig


def model_info(name: str, preset: str = "tiny", *, devices: int = 1) -> ModelInfo:
    """Describes model ``name`` at ``preset`` via ``jax.eval_shape`` (no compile).

    Args:
      name: A model of ``trax_models.names()``.
      preset: One of ``trax_models.presets()``.
      devices: Devices count used to size the global batch.

    Raises:
      TypeError: for ``devices`` that is not an int.
      ValueError: for an unknown model or preset, ``devices`` below 1, or an indivisible batch.
    """
    import jax

    config = _registry.config(name, preset)
    global_batch = config.batch_for(devices)
    task = _registry.model_module(name).task(config)
    shapes = jax.tree.leaves(jax.eval_shape(task.init, jax.random.key(0)))
    return ModelInfo(
        name=name,
        preset=preset,
        param_count=sum(math.prod(s.shape) for s in shapes),
        param_bytes=sum(math.prod(s.shape) * s.dtype.itemsize for s in shapes),
        grad_leaves=len(shapes),
        global_batch=global_batch,
        config=config,
    )

"""An nnx model's parameters as a flat map ``"path/to/param" -> array``, as checkpoints store them.

Both checkpoint formats (the step GNN's :mod:`gnn.checkpoint`, the per-kernel GNN's
:mod:`gnn.kernel_costs`) write :func:`flat` and read back with :func:`fill`, which checks every
name and shape against the model the checkpoint's config builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def flat(tree: Mapping[Any, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """The leaves of a nested mapping (``nnx.to_pure_dict`` of a model's state) by their
    ``/``-joined paths."""
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def fill(model: Any, params: Any, where: str, config: Any) -> None:
    """Sets ``model``'s parameters (in place) from ``params``, a :func:`flat` map.

    Raises:
      ValueError: ``params`` is not a map with exactly the model's parameter names, or one has
        another shape; the message names ``where`` (the checkpoint) and ``config``.
    """
    from flax import nnx

    state = nnx.state(model)
    want = flat(nnx.to_pure_dict(state))
    if not isinstance(params, dict) or set(params) != set(want):
        have = set(params) if isinstance(params, dict) else set()
        raise ValueError(f"{where}: parameters do not match config {config}: missing "
                         f"{sorted(set(want) - have)[:3]}, unexpected {sorted(have - set(want))[:3]}")
    for k, v in want.items():
        if np.shape(params[k]) != v.shape:
            raise ValueError(f"{where}: parameter {k!r} has shape {np.shape(params[k])}, expected {v.shape}")

    def filled(tree: Mapping[Any, Any], prefix: str = "") -> dict[Any, Any]:
        return {k: filled(v, f"{prefix}{k}/") if isinstance(v, Mapping) else np.asarray(params[f"{prefix}{k}"])
                for k, v in tree.items()}

    nnx.replace_by_pure_dict(state, filled(nnx.to_pure_dict(state)))
    nnx.update(model, state)

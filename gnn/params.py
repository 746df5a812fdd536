"""An nnx model's parameters as a flat map ``"path/to/param" -> array``, as checkpoints store them.

Both checkpoint formats (the step GNN's :mod:`gnn.checkpoint`, the per-kernel GNN's
:mod:`gnn.kernel_costs`) write :func:`flat` and read back with :func:`fill`, which checks every
name and shape against the model the checkpoint's config builds; both cost models rebuild from
their ``params()`` with :func:`load_checked`; both write their bytes with :func:`write_atomic`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

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
        another shape or a value that is not a finite number; the message names ``where`` (the
        checkpoint) and ``config``.
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
    check_finite(params, where)

    def filled(tree: Mapping[Any, Any], prefix: str = "") -> dict[Any, Any]:
        return {k: filled(v, f"{prefix}{k}/") if isinstance(v, Mapping) else np.asarray(params[f"{prefix}{k}"])
                for k, v in tree.items()}

    nnx.replace_by_pure_dict(state, filled(nnx.to_pure_dict(state)))
    nnx.update(model, state)


def check_finite(params: Mapping[str, Any], where: str) -> None:
    """Raises ValueError naming ``where`` and the first parameter of ``params`` (a :func:`flat` map)
    that is not all finite numbers: a NaN model (a diverged run, a hand edit) predicts NaN seconds
    everywhere, so it is neither loaded nor written."""
    for k, v in params.items():
        a = np.asarray(v)
        if a.dtype.kind not in "fiu" or not np.isfinite(a).all():
            raise ValueError(f"{where}: parameter {k!r}: expected finite numbers, got "
                             f"{'non-finite values' if a.dtype.kind == 'f' else f'dtype {a.dtype}'}")


def check_fields(config: Any, meta: Any) -> None:
    """Checks a checkpoint's decoded ``config`` and ``meta`` fields before the config is built.

    Raises:
      TypeError: for a config that is not an object naming its feature version (one without would
        load as this code's version) or meta that is not an object.
    """
    if not isinstance(config, dict) or "feature_version" not in config:
        raise TypeError(f"config: expected an object with a feature_version, got {config!r}")
    if not isinstance(meta, dict):
        raise TypeError(f"meta: expected an object, got {type(meta).__name__}")


T = TypeVar("T")


def load_checked(load: Callable[[str], T], params: Any, what: str) -> T:
    """``load(params["source"])``, checked against ``params["checkpoint_digest"]`` when that is given
    (a cost model's ``params()``: which checkpoint, and which bytes of it).

    Raises:
      ValueError: for params without a ``source`` string, or a checkpoint whose digest differs; the
        message starts with ``what``.
    """
    if not isinstance(params, Mapping) or not isinstance(params.get("source"), str):
        raise ValueError(f"{what}: expected an object with 'source' (and optionally 'checkpoint_digest'), "
                         f"got {params!r}")
    costs = load(params["source"])
    want, have = params.get("checkpoint_digest"), getattr(costs, "checkpoint_digest", None)
    if want and want != have:
        raise ValueError(f"{what}: checkpoint {params['source']} has digest {have}, expected {want}")
    return costs


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` whole or not at all: a temporary file beside it, then a rename, so a
    write that fails (a full disk, a killed run) leaves the file that was there (a shipped checkpoint)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)

"""Checkpoints of the cost GNN: flax.serialization msgpack (never pickle), checked on load.

Layout (one msgpack map): ``format`` (:data:`FORMAT`), ``config`` (the
:class:`gnn.model.GnnConfig` as JSON text), ``meta`` (JSON text: training config, data,
metrics summary), ``params`` (flat map "path/to/param" -> array).

Example:
  >>> save("model.msgpack", model, meta={"seed": 0})  # doctest: +SKIP
  >>> model, meta, digest = load("model.msgpack")      # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "disco.gnn/1"


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "/"))
        else:
            out[key] = np.asarray(v)
    return out


def to_bytes(model: Any, meta: dict[str, Any] | None = None) -> bytes:
    """Serialises ``model`` (a :class:`gnn.model.CostGNN`) and ``meta`` to msgpack bytes."""
    from flax import nnx, serialization

    params = _flat(nnx.to_pure_dict(nnx.state(model)))
    return serialization.msgpack_serialize({
        "format": FORMAT, "config": json.dumps(model.config.to_dict(), sort_keys=True),
        "meta": json.dumps(meta or {}, sort_keys=True), "params": params})


def save(path: str | os.PathLike[str], model: Any, meta: dict[str, Any] | None = None) -> str:
    """Writes the checkpoint; returns its digest (sha256 of the bytes, 16 hex digits)."""
    data = to_bytes(model, meta)
    Path(path).write_bytes(data)
    return hashlib.sha256(data).hexdigest()[:16]


def from_bytes(data: bytes, where: str = "checkpoint") -> tuple[Any, dict[str, Any]]:
    """Rebuilds (model, meta) from :func:`to_bytes` output.

    Raises:
      ValueError: for bytes that are not a disco GNN checkpoint, a different format or
        feature version, or parameters whose names or shapes do not match the config.
    """
    from flax import nnx, serialization

    from gnn import features
    from gnn.model import CostGNN, GnnConfig

    try:
        raw = serialization.msgpack_restore(data)
    except Exception as e:  # msgpack raises several unrelated types for corrupt input
        raise ValueError(f"{where}: not a msgpack checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{where}: expected format {FORMAT!r}, got {got!r}")
    try:
        config = GnnConfig.from_dict(json.loads(raw["config"]))
        meta = json.loads(raw.get("meta", "{}"))
        params = raw["params"]
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: damaged checkpoint fields ({type(e).__name__}: {e})") from None
    if config.feature_version != features.FEATURE_VERSION:
        raise ValueError(f"{where}: built for feature version {config.feature_version}, this code computes "
                         f"version {features.FEATURE_VERSION}; retrain with `disco train-gnn`")
    model = CostGNN.from_config(config, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    want = _flat(nnx.to_pure_dict(state))
    if not isinstance(params, dict) or set(params) != set(want):
        got = set(params) if isinstance(params, dict) else set()
        missing, extra = sorted(set(want) - got)[:3], sorted(got - set(want))[:3]
        raise ValueError(f"{where}: parameters do not match config {config}: missing {missing}, "
                         f"unexpected {extra}")
    for k, v in want.items():
        if np.shape(params[k]) != v.shape:
            raise ValueError(f"{where}: parameter {k!r} has shape {np.shape(params[k])}, expected {v.shape}")

    def fill(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        return {k: fill(v, f"{prefix}{k}/") if isinstance(v, dict) else np.asarray(params[f"{prefix}{k}"])
                for k, v in tree.items()}

    nnx.replace_by_pure_dict(state, fill(nnx.to_pure_dict(state)))
    nnx.update(model, state)
    return model, meta


def load(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any], str]:
    """Reads a checkpoint: (model, meta, digest).

    Raises:
      ValueError: as :func:`from_bytes`, naming the file.
      FileNotFoundError: if there is no file at ``path``.
    """
    p = Path(path)
    data = p.read_bytes()
    model, meta = from_bytes(data, p.name)
    return model, meta, hashlib.sha256(data).hexdigest()[:16]

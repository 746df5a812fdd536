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

from gnn.params import check_fields, check_finite, fill, flat, write_atomic

FORMAT = "disco.gnn/1"


def to_bytes(model: Any, meta: dict[str, Any] | None = None) -> bytes:
    """Serialises ``model`` (a :class:`gnn.model.CostGNN`) and ``meta`` to msgpack bytes."""
    from flax import nnx, serialization

    params = flat(nnx.to_pure_dict(nnx.state(model)))
    check_finite(params, "the model to save (a diverged training run?); nothing written")
    return serialization.msgpack_serialize({
        "format": FORMAT, "config": json.dumps(model.config.to_dict(), sort_keys=True),
        "meta": json.dumps(meta or {}, sort_keys=True), "params": params})


def save(path: str | os.PathLike[str], model: Any, meta: dict[str, Any] | None = None) -> str:
    """Writes the checkpoint (whole or not at all); returns its digest (sha256 of the bytes, 16 hex digits)."""
    data = to_bytes(model, meta)
    write_atomic(path, data)
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
        cfg, meta, params = json.loads(raw["config"]), json.loads(raw.get("meta", "{}")), raw["params"]
        check_fields(cfg, meta)
        config = GnnConfig.from_dict(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: damaged checkpoint fields ({type(e).__name__}: {e})") from None
    if config.feature_version != features.FEATURE_VERSION:
        raise ValueError(f"{where}: built for feature version {config.feature_version}, this code computes "
                         f"version {features.FEATURE_VERSION}; retrain with `disco train-gnn`")
    model = CostGNN.from_config(config, rngs=nnx.Rngs(0))
    fill(model, params, where, config)
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

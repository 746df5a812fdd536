"""``KernelCosts``: the per-kernel GNN behind disco's cost-model contract, and its checkpoint.

* ``kernel_time(kernel)``: seconds per launch of a :class:`disco.sim.costs.Kernel` (a simulator's
  fusion group or a compiled module's kernel, :mod:`gnn.kernel_features`), from
  :func:`gnn.kernel_model.apply` evaluated in numpy (no jax dispatch) plus the measured correction
  of a kernel the training data held (:mod:`gnn.kernel_corrections`), cached per kernel;
* ``predict(graphs)``: seconds per launch of many kernel graphs at once (jitted, batched);
* collectives: the alpha-beta model of the cluster (inherited);
* ``save``/``load``: a msgpack checkpoint (:data:`FORMAT`): the config, the device kind, the
  metadata (training data, config, metrics), the parameters and the corrections table (optional:
  a checkpoint without one loads with none).

Example:
  >>> costs = KernelCosts.load("gnn/kernel_h100.msgpack")  # doctest: +SKIP
  >>> costs.kernel_time(kernel)                           # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disco.sim.costs import CostModel, Kernel
from gnn import kernel_corrections as KC
from gnn import kernel_features as KF
from gnn import kernel_model as KM
from gnn.params import check_fields, check_finite, fill, flat, load_checked, write_atomic

FORMAT = "disco.gnn.kernel/1"
CHECKPOINTS = {"h100": Path(__file__).with_name("kernel_h100.msgpack")}


class KernelCosts(CostModel):
    """Kernel costs from a trained :class:`gnn.kernel_model.KernelGNN`.

    Args:
      model: the trained model.
      device: the device kind it was trained for (``h100``, ``cpu``).
      digest: the checkpoint's digest (sha256 of its bytes, 16 hex digits).
      source: where it came from, for reports.
      meta: the checkpoint's metadata.
      corrections: fingerprint -> log-seconds correction (:func:`gnn.kernel_corrections.fit_corrections`).
    """

    name = "gnn"
    version = "kernel/1"

    def __init__(self, model: KM.KernelGNN, *, device: str, digest: str = "", source: str = "",
                 meta: Mapping[str, Any] | None = None, corrections: Mapping[str, float] | None = None):
        self.model = model
        self.corrections = dict(corrections or {})
        self.device = device
        self.checkpoint_digest = digest
        self.source = source
        self.meta = dict(meta or {})
        self._w = KM.to_numpy(KM.weights(model))
        self._cache: dict[tuple[tuple, int, int, int], float] = {}

    def kernel_time(self, kernel: Kernel) -> float:
        """Seconds per launch of ``kernel`` (0.0 for a kernel without work)."""
        if kernel.is_empty:
            return 0.0
        key = (_structure(kernel), kernel.in_bytes, kernel.out_bytes, kernel.step_bytes)
        t = self._cache.get(key)
        if t is None:
            graph = KF.kernel_graph(kernel)
            log_s = KC.corrected(KM.apply(self._w, KF.batch([graph]), np), [graph], self.corrections)[0]
            t = self._cache[key] = float(np.exp(log_s))
        return t

    def predict(self, graphs: Sequence[KF.KernelGraph]) -> np.ndarray:
        """Seconds per launch of each graph (jax, batched)."""
        from gnn.kernel_train import predict_log_seconds

        return np.exp(KC.corrected(predict_log_seconds(KM.weights(self.model), graphs), graphs, self.corrections))

    def params(self) -> dict[str, Any]:
        return {"checkpoint_digest": self.checkpoint_digest, "source": self.source, "device": self.device}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> KernelCosts:
        """Loads the checkpoint at ``params["source"]`` and checks its digest.

        Raises:
          ValueError: for missing fields or a checkpoint whose digest differs.
        """
        return load_checked(cls.load, params, "gnn kernel cost params")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the msgpack checkpoint (whole or not at all: a failed write leaves the file that was there)."""
        data = to_bytes(self.model, device=self.device, meta=self.meta, corrections=self.corrections)
        write_atomic(path, data)
        self.checkpoint_digest, self.source = hashlib.sha256(data).hexdigest()[:16], str(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KernelCosts:
        """Reads a checkpoint written by ``save`` or ``scripts/tools/train_gnn.py --kernels``.

        Raises:
          ValueError: for a corrupt checkpoint or one that does not match this code.
          FileNotFoundError: if there is no file at ``path``.
        """
        p = Path(path)
        data = p.read_bytes()
        model, device, meta, corrections = from_bytes(data, p.name)
        return cls(model, device=device, digest=hashlib.sha256(data).hexdigest()[:16], source=str(p), meta=meta,
                   corrections=corrections)

    def digest(self) -> str:
        return self.checkpoint_digest or "untrained"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "device": self.device, "digest": self.digest(),
                "source": self.source, "trained_on": self.meta.get("data", {}),
                "measured_kernels": len(self.corrections)}

    def __repr__(self) -> str:
        return f"KernelCosts(device={self.device!r}, digest={self.digest()!r}, source={self.source!r})"


def _structure(kernel: Kernel) -> tuple:
    """What the kernel's graph (:func:`gnn.kernel_features.kernel_graph`) is made of: per node its
    opcode, shape, layout, flops and operands (as positions inside the kernel, -1 outside). Two
    kernels with the same ``Kernel.key()`` (the multiset of ``opcode:shape``) can differ in layout or
    wiring, and so in their graph and price: the cache must not give one the other's time."""
    pos = {n.name: i for i, n in enumerate(kernel.nodes)}
    return tuple((n.opcode, n.shape, n.layout, n.flops, tuple(pos.get(o, -1) for o in n.operands))
                 for n in kernel.nodes)


# -- checkpoint --------------------------------------------------------------------------------
def to_bytes(model: KM.KernelGNN, *, device: str, meta: Mapping[str, Any] | None = None,
             corrections: Mapping[str, float] | None = None) -> bytes:
    """The checkpoint bytes of ``model`` and its corrections table (msgpack, never pickle)."""
    import dataclasses

    from flax import serialization

    params = flat(KM.weights(model))
    check_finite(params, "the model to save (a diverged training run?); nothing written")
    return serialization.msgpack_serialize({
        "format": FORMAT, "device": device, "config": json.dumps(dataclasses.asdict(model.config), sort_keys=True),
        "meta": json.dumps(dict(meta or {}), sort_keys=True, default=float),
        "corrections": json.dumps(dict(corrections or {}), sort_keys=True), "params": params})


def from_bytes(data: bytes, where: str = "checkpoint") -> tuple[KM.KernelGNN, str, dict[str, Any], dict[str, float]]:
    """(model, device, meta, corrections) from :func:`to_bytes` output.

    Raises:
      ValueError: for bytes that are not a kernel-GNN checkpoint, another format or feature
        version, or parameters whose names or shapes do not match the config.
    """
    from flax import nnx, serialization

    try:
        raw = serialization.msgpack_restore(data)
    except Exception as e:  # msgpack raises several unrelated types for corrupt input
        raise ValueError(f"{where}: not a msgpack checkpoint ({type(e).__name__}: {e})") from None
    got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
    if got != FORMAT:
        raise ValueError(f"{where}: expected format {FORMAT!r}, got {got!r}")
    try:
        cfg, meta, device, params = json.loads(raw["config"]), json.loads(raw.get("meta", "{}")), str(raw["device"]), \
            raw["params"]
        table = json.loads(raw.get("corrections", "{}"))
        check_fields(cfg, meta)
        config = KM.KernelModelConfig.from_dict(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: damaged checkpoint fields ({type(e).__name__}: {e})") from None
    corrections = KC.check_table(table, where)
    try:
        model = KM.KernelGNN.from_config(config, rngs=nnx.Rngs(0))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    fill(model, params, where, config)
    return model, device, meta, corrections


def load_for_device(device: str) -> KernelCosts:
    """The checkpoint shipped for ``device``.

    Raises:
      ValueError: for a device without a shipped kernel checkpoint.
    """
    path = CHECKPOINTS.get(device)
    if path is None or not path.is_file():
        raise ValueError(f"no per-kernel GNN checkpoint for device {device!r}; shipped: "
                         f"{sorted(d for d, p in CHECKPOINTS.items() if p.is_file())}")
    return KernelCosts.load(path)

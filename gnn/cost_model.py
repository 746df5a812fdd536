"""``GnnCosts``: the trained cost GNN behind disco's CostModel interface.

Two ways to use it:

* as a :class:`disco.sim.costs.CostModel` in :class:`disco.sim.simulator.Simulator`:
  ``kernel_time`` prices one kernel with the GNN's per-kernel head, evaluated in numpy
  (no jax dispatch) and cached per kernel, so the search pays for a kernel once;
  collectives keep the alpha-beta model of the cluster;
* whole plans at once: ``predict(graph, plans)`` runs the message-passing graph head on each
  plan's fused graph (batched, jitted) and returns step seconds.

``describe()`` says which model and checkpoint are in use (name, version, digest, source).

Example:
  >>> from gnn.cost_model import load_default
  >>> costs = load_default()
  >>> Simulator(graph, costs, cluster).step_time(plan)  # doctest: +SKIP
  >>> costs.predict(graph, [plan_a, plan_b], devices=8)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disco.sim.costs import CostModel, Kernel
from gnn.params import load_checked

DEFAULT_CHECKPOINT = Path(__file__).with_name("default_checkpoint.msgpack")
DEFAULT_METRICS = Path(__file__).with_name("default_metrics.json")


class GnnCosts(CostModel):
    """Kernel and whole-plan costs from a trained :class:`gnn.model.CostGNN`.

    Args:
      model: the trained model.
      digest: the checkpoint's digest (sha256 of its bytes, 16 hex digits).
      source: where the checkpoint came from (a path), for reports.
      meta: the checkpoint's metadata (training config, data, metrics).
    """

    name = "gnn"
    version = "1"
    # What it was trained on: `disco collect` measures steps on virtual CPU devices only, so a
    # checkpoint of this kind prices CPU kernels; the registry refuses it for another device kind.
    device = "cpu"

    def __init__(self, model: Any, *, digest: str = "", source: str = "", meta: Mapping[str, Any] | None = None):
        from gnn import features as F

        self.model = model
        self.checkpoint_digest = digest
        self.source = source
        self.meta = dict(meta or {})
        self._cache: dict[tuple[str, int, int], float] = {}
        self._ctx: dict[str, F.GraphContext] = {}
        from gnn.model import kernel_head_weights

        self._w = jax_tree_to_numpy(kernel_head_weights(model))
        self.hits = 0
        self.misses = 0

    # -- CostModel -----------------------------------------------------------------------------
    def kernel_time(self, kernel: Kernel) -> float:
        """Seconds of one kernel from the per-kernel head (cached by kernel key and traffic)."""
        if kernel.is_empty:
            return 0.0
        key = (kernel.key(), kernel.in_bytes, kernel.out_bytes)
        t = self._cache.get(key)
        if t is not None:
            self.hits += 1
            return t
        self.misses += 1
        from gnn import features as F

        opc, feats = F.kernel_features(kernel)
        from gnn.model import kernel_head

        log_t = kernel_head(self._w, np.array([opc]), np.asarray(feats, np.float64)[None, :], np)[0]
        t = math.exp(float(log_t))
        self._cache[key] = t
        return t

    def params(self) -> dict[str, Any]:
        return {"checkpoint_digest": self.checkpoint_digest, "source": self.source}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GnnCosts:
        """Loads the checkpoint at ``params["source"]`` and checks its digest.

        Raises:
          ValueError: for missing fields or a checkpoint whose digest differs.
        """
        return load_checked(cls.load, params, "gnn cost params")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the model as a msgpack checkpoint (not JSON, unlike the other cost models)."""
        from gnn import checkpoint

        self.checkpoint_digest = checkpoint.save(path, self.model, self.meta)
        self.source = str(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GnnCosts:
        """Reads a checkpoint written by ``save`` or ``disco train-gnn``.

        Raises:
          ValueError: for a corrupt checkpoint or one that does not match this code.
          FileNotFoundError: if there is no file at ``path``.
        """
        from gnn import checkpoint

        model, meta, digest = checkpoint.load(path)
        return cls(model, digest=digest, source=str(path), meta=meta)

    def digest(self) -> str:
        return self.checkpoint_digest or hashlib.sha256(b"untrained").hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """Which model and checkpoint: name, version, digest, source and training summary."""
        return {"name": self.name, "version": self.version, "digest": self.digest(), "source": self.source,
                "config": self.model.config.to_dict(), "trained_on": self.meta.get("data", {}),
                "metrics": self.meta.get("metrics_summary", {})}

    # -- whole plans ---------------------------------------------------------------------------
    def predict(self, graph: Any, plans: Sequence[Any], *, devices: int = 1, batch: int = 16) -> np.ndarray:
        """Predicted step seconds of ``plans`` on ``graph`` from the graph head.

        The graph head predicts each plan's time relative to XLA's default compile; the
        default's absolute time comes from the per-kernel head.

        Raises:
          ValueError: for a plan that does not fit the graph.
        """
        from disco.plans.plan import FusionPlan
        from gnn import features as F
        from gnn.inference import predict

        ctx = self._ctx.get(graph.fingerprint)
        if ctx is None or ctx.graph is not graph:
            ctx = self._ctx[graph.fingerprint] = F.GraphContext(graph)
        feats = [F.fused_graph(ctx, FusionPlan(), devices=devices)]
        feats += [F.fused_graph(ctx, p, devices=devices) for p in plans]
        abs_log, rel = predict(self.model, feats, batch=batch)
        return np.exp(abs_log[0] + rel[1:] - rel[0])

    def update(self, dataset: Any, *, epochs: int = 3, seed: int = 0) -> GnnCosts:
        """A new GnnCosts fine-tuned on ``dataset`` (a :class:`gnn.train.Dataset` or its directory)."""
        from gnn import train

        ds = train.load_dataset(dataset) if isinstance(dataset, (str, os.PathLike)) else dataset
        cfg = train.TrainConfig(**{**self.meta.get("train_config", {}), "epochs": epochs, "seed": seed})
        tr, va, _ = train.split(ds, "plans", seed=seed, test_frac=0.0)
        model, _ = train.fit(ds, tr, va, cfg, init_model=self.model)
        return GnnCosts(model, source="", meta={**self.meta, "updated_on": ds.source})

    def __repr__(self) -> str:
        return f"GnnCosts(digest={self.digest()!r}, source={self.source!r})"


def jax_tree_to_numpy(tree: Any) -> Any:
    """A nested dict of arrays as float64 numpy arrays (the kernel head's numpy fast path)."""
    if isinstance(tree, Mapping):
        return {k: jax_tree_to_numpy(v) for k, v in tree.items()}
    return np.asarray(tree, dtype=np.float64)


def load_default() -> GnnCosts:
    """The checkpoint shipped in the package (``gnn/default_checkpoint.msgpack``).

    Raises:
      RuntimeError: if the package has no default checkpoint (train one with ``disco train-gnn``).
      ValueError: if the shipped checkpoint is corrupt or does not match this code.
    """
    if not DEFAULT_CHECKPOINT.is_file():
        raise RuntimeError(f"no default GNN checkpoint at {DEFAULT_CHECKPOINT}; train one with "
                           "`disco train-gnn --data DIR --out gnn/default_checkpoint.msgpack --overwrite-shipped`")
    return GnnCosts.load(DEFAULT_CHECKPOINT)


def default_metrics() -> dict[str, Any]:
    """The metrics JSON shipped next to the default checkpoint ({} when absent)."""
    return json.loads(DEFAULT_METRICS.read_text()) if DEFAULT_METRICS.is_file() else {}

"""gnn's entry in disco's cost-model registry (:mod:`disco.sim.costs.registry`), light to import.

``gnn`` names, per device kind, the per-kernel GNN trained on that device's kernel profiles
(``h100``: ``gnn/kernel_h100.msgpack``) and, on ``cpu``, the step-level GNN's kernel head shipped
before it (``gnn/default_checkpoint.msgpack``; :class:`gnn.cost_model.GnnCosts`). A ``.msgpack``
file is read by its ``format`` field as either kind. Heavy imports (flax, jax) happen only when a
model is built.

Example:
  >>> from disco.sim.costs import registry
  >>> registry.register(ENTRY)
  >>> costs = registry.make("gnn", device="h100")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from disco.sim.costs import CostModel
from disco.sim.costs.registry import Entry


def make(device: str) -> CostModel:
    """The GNN for ``device`` (raises ValueError for a device without a checkpoint)."""
    if device == "cpu":
        from gnn.cost_model import load_default

        return load_default()
    from gnn.kernel_costs import load_for_device

    return load_for_device(device)


def load(path: Path) -> CostModel:
    """Either GNN checkpoint kind, by the file's ``format`` field.

    Raises:
      ValueError: for a file that is neither kind (naming both expected formats).
    """
    from flax import serialization

    from gnn import checkpoint
    from gnn.cost_model import GnnCosts
    from gnn.kernel_costs import FORMAT, KernelCosts

    try:
        raw = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:  # msgpack raises several unrelated types for corrupt input
        raise ValueError(f"{path.name}: not a msgpack checkpoint ({type(e).__name__}: {e})") from None
    fmt = raw.get("format") if isinstance(raw, dict) else None
    if fmt == FORMAT:
        return KernelCosts.load(path)
    if fmt == checkpoint.FORMAT:
        return GnnCosts.load(path)
    raise ValueError(f"{path.name}: expected a GNN checkpoint of format {FORMAT!r} or {checkpoint.FORMAT!r}, "
                     f"got {fmt!r}")


ENTRY = Entry("gnn", make, load=load, claims=lambda p: p.suffix == ".msgpack",
              describe="the GNN checkpoint shipped for the device kind")

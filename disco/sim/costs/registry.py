"""Cost models by name: one narrow contract, and entries that packages above disco register.

The contract is :class:`disco.sim.costs.CostModel`: ``kernel_time(kernel)``,
``collective_time(kind, nbytes, cluster)``, ``save(path)`` and loading by name or file. An
:class:`Entry` says how to build a named model for a device kind (``make``) and how to read a
saved file of its kind (``claims`` + ``load``). disco registers ``analytic`` (the model of each
device kind in :mod:`disco.sim.costs.device_costs`: a roofline on ``cpu``, a summed model on ``h100``);
higher layers register their own, either by calling :func:`register` (the CLI registers ``gnn``)
or through the ``disco.cost_models`` entry-point group of an installed package (setup.cfg), which
:func:`make` reads when a name is unknown.
disco itself never imports those packages.

Example:
  >>> make("analytic", device="cpu").config.mem_bandwidth
  10000000000.0
  >>> make("analytic", device="h100").name
  'analytic-summed'
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from disco.sim.costs import device_costs
from disco.sim.costs import CostModel, load_costs

ENTRY_POINT_GROUP = "disco.cost_models"


class Entry(NamedTuple):
    """How to get one kind of cost model.

    Attributes:
      name: what ``--cost-model`` calls it.
      make: device kind -> the model to use on that device (raises ValueError for a device it
        has no model for).
      load: a saved file of this kind -> the model (None: nothing to load).
      claims: whether a file is of this kind (e.g. by suffix); checked before JSON models.
      describe: one line for help texts.
    """

    name: str
    make: Callable[[str], CostModel]
    load: Callable[[Path], CostModel] | None = None
    claims: Callable[[Path], bool] | None = None
    describe: str = ""


_LOCK = threading.Lock()
_ENTRIES: dict[str, Entry] = {
    "analytic": Entry("analytic", device_costs.analytic, load=device_costs.SummedCosts.load,
                      claims=device_costs.claims,
                      describe="the analytic model per device kind (disco.sim.costs.device_costs)"),
}
_ENTRY_POINTS_READ: list[bool] = []


def register(entry: Entry) -> None:
    """Adds (or replaces) an entry.

    Raises:
      ValueError: for an entry that is not an :class:`Entry` or has an empty name.
    """
    if not isinstance(entry, Entry) or not entry.name:
        raise ValueError(f"register: expected a registry.Entry with a name, got {entry!r}")
    with _LOCK:
        _ENTRIES[entry.name] = entry


def names() -> list[str]:
    """The registered names (after reading the installed entry points)."""
    _read_entry_points()
    return sorted(_ENTRIES)


def _read_entry_points() -> None:
    with _LOCK:
        if _ENTRY_POINTS_READ:
            return
        _ENTRY_POINTS_READ.append(True)
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _ENTRIES:
            entry = ep.load()
            if isinstance(entry, Entry):
                register(entry)


def make(spec: str | os.PathLike[str], device: str | None = None) -> CostModel:
    """The cost model ``spec`` names for ``device``: a registered name, or a saved model file.

    Args:
      spec: a name (``analytic``, ``gnn``, ...) or a path; a file is offered to every entry's
        ``claims`` first, then read as a JSON cost model (:func:`disco.sim.costs.load_costs`).
      device: the device kind the model prices (``cpu``, ``h100``). A name needs one (None:
        ``cpu``); a file whose model records the device it was trained for (a per-kernel GNN
        checkpoint; a step-level GNN's, ``cpu``) must be for this one (None: any).

    Raises:
      ValueError: for an unknown name, a device the model does not cover, a file trained for
        another device, or a bad file.
      FileNotFoundError: never for names; for a path that looks like a file but is missing.
    """
    key = os.fspath(spec)
    if key not in _ENTRIES:
        _read_entry_points()
    entry = _ENTRIES.get(key)
    if entry is not None:
        return entry.make(device or "cpu")
    path = Path(key)
    if path.is_file():
        model = _load_file(path)
        trained_for = getattr(model, "device", None)
        if device is not None and isinstance(trained_for, str) and trained_for != device:
            raise ValueError(f"cost model file {key!r} was trained for device {trained_for!r}, not {device!r}; "
                             f"expected a model of {device!r} kernels")
        return model
    if path.suffix:
        raise FileNotFoundError(f"cost model file {key!r} does not exist")
    raise ValueError(f"cost model {key!r}: expected {', '.join(sorted(_ENTRIES))} or a saved model file")


def _load_file(path: Path) -> CostModel:
    """A saved model: the first registry entry that claims the file, else a JSON cost model."""
    for e in list(_ENTRIES.values()):
        if e.load is not None and e.claims is not None and e.claims(path):
            return e.load(path)
    return load_costs(path)

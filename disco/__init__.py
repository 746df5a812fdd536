"""disco: joint op fusion and gradient bucketing for data-parallel JAX training steps.

Public names are imported lazily so that ``import disco`` (and ``disco --help``)
does not import jax.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports on first use
    from disco import bench, calibrate, ir, optimizer, planner, plans, search, sim
    from disco.ir.extractor import extract, hlo_text
    from disco.ir.graph import GraphArrays, HloGraph, Node
    from disco.ir.hlo_parse import HloParseError
    from disco.optimizer import OptimizeResult, optimize
    from disco.plans import baselines, moves, random_plans
    from disco.plans.plan import Bucket, FusionPlan, make_plan
    from disco.sim import cluster, collectives, costs, simulator
    from disco.sim.cluster import ClusterSpec
    from disco.sim.simulator import lower_bound, simulate


def _version() -> str:
    """The installed distribution's version (setup.cfg's ``version``, the one place it is written)."""
    try:
        return importlib.metadata.version("disco")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "0+unknown"


__version__ = _version()

_EXPORTS = {
    "HloGraph": "disco.ir.graph",
    "Node": "disco.ir.graph",
    "GraphArrays": "disco.ir.graph",
    "extract": "disco.ir.extractor",
    "hlo_text": "disco.ir.extractor",
    "HloParseError": "disco.ir.hlo_parse",
    "FusionPlan": "disco.plans.plan",
    "Bucket": "disco.plans.plan",
    "make_plan": "disco.plans.plan",
    "optimize": "disco.optimizer",
    "OptimizeResult": "disco.optimizer",
    "simulate": "disco.sim.simulator",
    "lower_bound": "disco.sim.simulator",
    "ClusterSpec": "disco.sim.cluster",
}


# Subpackages, and short names for the submodules users reach most (``disco.baselines.make``).
_SUBMODULES = {
    "ir": "disco.ir", "plans": "disco.plans", "sim": "disco.sim", "search": "disco.search",
    "baselines": "disco.plans.baselines", "random_plans": "disco.plans.random_plans", "moves": "disco.plans.moves",
    "costs": "disco.sim.costs", "simulator": "disco.sim.simulator", "cluster": "disco.sim.cluster",
    "collectives": "disco.sim.collectives", "planner": "disco.planner", "bench": "disco.bench",
    "optimizer": "disco.optimizer", "calibrate": "disco.calibrate",
}


__all__ = [  # the lazy exports below, spelled out for tools (tests/test_exports.py checks they agree)
    "Bucket", "ClusterSpec", "FusionPlan", "GraphArrays", "HloGraph", "HloParseError", "Node",
    "OptimizeResult", "baselines", "bench", "calibrate", "cluster", "collectives", "costs", "extract",
    "hlo_text", "ir", "lower_bound", "make_plan", "moves", "optimize", "optimizer", "planner", "plans",
    "random_plans", "search", "sim", "simulate", "simulator",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'disco' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))

"""disco: joint op fusion and gradient bucketing for data-parallel JAX training steps.

Public names are imported lazily so that ``import disco`` (and ``disco --help``)
does not import jax.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

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


_SUBMODULES = {
    "ir": "disco.ir", "plans": "disco.plans", "sim": "disco.sim", "search": "disco.search",
    "baselines": "disco.plans.baselines", "random_plans": "disco.plans.random_plans", "moves": "disco.plans.moves",
    "costs": "disco.sim.costs", "simulator": "disco.sim.simulator", "cluster": "disco.sim.cluster",
    "collectives": "disco.sim.collectives", "planner": "disco.planner", "bench": "disco.bench",
    "optimizer": "disco.optimizer", "calibrate": "disco.calibrate",
}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'disco' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))

"""disco: joint op fusion and gradient bucketing for data-parallel JAX training steps.

Public names are imported lazily so that ``import disco`` (and ``disco --help``)
does not import jax.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "HloGraph": "disco.graph",
    "Node": "disco.graph",
    "GraphArrays": "disco.graph",
    "extract": "disco.extractor",
    "hlo_text": "disco.extractor",
    "HloParseError": "disco.hlo_parse",
    "FusionPlan": "disco.plan",
    "Bucket": "disco.plan",
    "make_plan": "disco.plan",
    "optimize": "disco.optimizer",
    "OptimizeResult": "disco.optimizer",
    "simulate": "disco.simulator",
    "lower_bound": "disco.simulator",
    "ClusterSpec": "disco.cluster",
}


_SUBMODULES = {"baselines", "bench", "random_plans", "plan_check", "costs", "simulator", "cluster", "moves",
               "search", "optimizer", "collectives", "calibrate"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"disco.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'disco' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))

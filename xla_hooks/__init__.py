"""Applying disco plans to the real XLA compile, and measuring the result.

Imports are lazy: ``import xla_hooks`` does not import jax.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "apply": "xla_hooks.apply_plan",
    "compile_plan": "xla_hooks.apply_plan",
    "AppliedStep": "xla_hooks.apply_plan",
    "apply_plan_to_text": "xla_hooks.rewrite",
    "jit": "xla_hooks.hook",
    "PlannedStep": "xla_hooks.hook",
    "PlanServiceWarning": "xla_hooks.hook",
    "PlanFallbackWarning": "xla_hooks.apply_plan",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xla_hooks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

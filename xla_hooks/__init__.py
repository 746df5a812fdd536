"""Applying disco plans to the real XLA compile, and measuring the result.

Imports are lazy: ``import xla_hooks`` does not import jax.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports on first use
    from xla_hooks.apply_plan import AppliedStep, PlanFallbackWarning, apply, compile_plan
    from xla_hooks.hook import PlanAgreementWarning, PlannedStep, PlanServiceWarning, jit
    from xla_hooks.profiling import ProfileResult, profile
    from xla_hooks.rewrite import apply_plan_to_text
    from xla_hooks.trials import TrialReportWarning

_EXPORTS = {
    "apply": "xla_hooks.apply_plan",
    "compile_plan": "xla_hooks.apply_plan",
    "AppliedStep": "xla_hooks.apply_plan",
    "PlanFallbackWarning": "xla_hooks.apply_plan",
    "apply_plan_to_text": "xla_hooks.rewrite",
    "jit": "xla_hooks.hook",
    "PlannedStep": "xla_hooks.hook",
    "PlanServiceWarning": "xla_hooks.hook",
    "PlanAgreementWarning": "xla_hooks.hook",
    "TrialReportWarning": "xla_hooks.trials",
    "profile": "xla_hooks.profiling",
    "ProfileResult": "xla_hooks.profiling",
}

__all__ = [  # the lazy exports below, spelled out for tools (tests/test_exports.py checks they agree)
    "AppliedStep", "PlanAgreementWarning", "PlanFallbackWarning", "PlanServiceWarning", "PlannedStep", "ProfileResult", "TrialReportWarning", "apply",
    "apply_plan_to_text", "compile_plan", "jit", "profile",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'xla_hooks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

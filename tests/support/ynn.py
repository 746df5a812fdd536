"""YNNPACK fusions in XLA:CPU's compiled modules, for the tests of the options and starts that move
reductions out of them."""

from __future__ import annotations

import jaxlib
import pytest

import xla_hooks
from disco.ir.hlo_parse import parse_module
from disco.plans.plan import FusionPlan
from xla_hooks._jax_private import major_minor


def ynn_fusions(text: str) -> int:
    """kCustom fusions that XLA:CPU hands to YNNPACK, over all computations."""
    return sum(ins.opcode == "fusion" and "__ynn_fusion" in ins.attrs.get("backend_config", "")
               for comp in parse_module(text).computations for ins in comp.instructions)


def default_ynn_fusions(step, args) -> int:
    """The YNNPACK fusions of XLA's default compile of ``step``. jaxlib 0.8.3's and 0.9.2's
    XLA:CPU hand nothing to YNNPACK (measured), so there the test is skipped; from jaxlib 0.10 on
    a module without YNNPACK fusions fails the test."""
    count = ynn_fusions(xla_hooks.apply(FusionPlan(name="xla_default"), step, *args).compiled_text())
    if count == 0 and major_minor(jaxlib.__version__) < (0, 10):
        pytest.skip(f"jaxlib {jaxlib.__version__}'s XLA:CPU hands no fusion to YNNPACK: nothing for the option to move")
    assert count > 0, f"jaxlib {jaxlib.__version__}: XLA's default compile has no YNNPACK fusion"
    return count

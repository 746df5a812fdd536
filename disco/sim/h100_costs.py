"""An interim analytic cost model for NVIDIA H100 kernels, fitted to the H100 dataset.

INTERIM: the per-kernel cost models of issue 15 (the analytic roofline per device kind and the
GNN, behind a cost-model registry) are being built elsewhere; when they land, the simulator's
GPU clusters use them and this module goes. It exists so that a GPU cluster is priced by a
GPU model at all (before it, ``--cluster h100-*`` priced kernels at this CPU's roofline).

A kernel of the emulated XLA:GPU fusion (:mod:`disco.sim.gpu_fusion`) takes::

    launch + dot_flops / dot_rate + conv_flops / conv_rate + (in_bytes + out_bytes) / bandwidth

The matrix and memory terms are added, not maxed: a cuBLAS or cuDNN kernel also moves its
operands, and a sum fits the measured records better than a max (docs/benchmarks.md). The
defaults were fitted (``python scripts/gpu_sim_tables.py --fit``) to the ``default`` records
of ``../shared/data/h100_kernels`` (7 zoo models, presets paper and small, float32, one H100
80GB HBM3, jax 0.11.2): each record's kernels summed, against the simulator's prediction on
the record's pre-optimisation HLO, as relative errors (non-negative least squares). The
fitted bandwidth (3.12 TB/s) is near the 3.0 TB/s measured for device-to-device copies.
They are fitted, not datasheet figures
(H100 SXM: 3.35 TB/s HBM3, about 495 dense tf32 TFLOP/s); see docs/benchmarks.md for the
in-sample and leave-one-model-out errors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from disco.sim.costs import CostModel, Kernel, is_kernel_node


@dataclasses.dataclass(frozen=True)
class H100Config:
    """The interim model's parameters (seconds, flop/s, bytes/s).

    Attributes:
      launch: fixed seconds per kernel.
      dot_rate: flop/s of ``dot`` (float32 operands run as tf32 by XLA's default precision).
      conv_rate: flop/s of ``convolution`` (cuDNN).
      bandwidth: bytes/s to and from HBM, counting bytes read and written.
    """

    # Fitted 2026-11-23 by `python scripts/gpu_sim_tables.py --fit` (12 default records; rnnlm's
    # two left out: its while loops are single units in the graph).
    launch: float = 2.13e-6
    dot_rate: float = 2.58e14
    conv_rate: float = 2.30e14
    bandwidth: float = 3.12e12

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (f.name != "launch" and v == 0):
                raise ValueError(f"H100Config.{f.name}: expected a positive number, got {v!r}")


class H100RooflineInterim(CostModel):
    """Kernel times on one H100 (see the module docstring); collectives by the cluster's links."""

    name = "h100-roofline-interim"
    version = "1"
    device = "h100"

    def __init__(self, config: H100Config | None = None):
        self.config = config or H100Config()

    def terms(self, kernel: Kernel) -> tuple[float, float, float, float]:
        """(launches, dot flops, convolution flops, bytes) of ``kernel``: the model's features."""
        if kernel.is_empty:
            return (0.0, 0.0, 0.0, 0.0)
        dot = conv = 0.0
        for n in kernel.nodes:
            if n.opcode == "dot":
                dot += n.flops
            elif n.opcode == "convolution":
                conv += n.flops
        return (1.0, dot, conv, float(kernel.in_bytes + kernel.out_bytes))

    def kernel_time(self, kernel: Kernel) -> float:
        if kernel.is_empty or not any(is_kernel_node(n) for n in kernel.nodes):
            return 0.0
        c = self.config
        launches, dot, conv, nbytes = self.terms(kernel)
        return c.launch * launches + dot / c.dot_rate + conv / c.conv_rate + nbytes / c.bandwidth

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> H100RooflineInterim:
        if not isinstance(params, Mapping):
            raise ValueError(f"{cls.name} params: expected an object, got {params!r}")
        known = {f.name for f in dataclasses.fields(H100Config)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{cls.name} params: unknown keys {unknown}; expected some of {sorted(known)}")
        return cls(H100Config(**params))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, H100RooflineInterim) and other.config == self.config

    def __hash__(self) -> int:
        return hash(self.config)

    def __repr__(self) -> str:
        return f"H100RooflineInterim({self.config!r})"


def for_device(device: str) -> CostModel | None:
    """The built-in analytic model of a GPU device kind, or None for "cpu" (the CPU default).

    Raises:
      ValueError: for an unknown device kind.
    """
    if device == "h100":
        return H100RooflineInterim()
    if device == "cpu":
        return None
    raise ValueError(f"device: expected cpu or h100, got {device!r}")

"""The analytic kernel model of each device kind, and the device's measured roofline.

:func:`analytic` is what ``--cost-model analytic`` prices a device's kernels with:

* ``cpu``: the roofline :class:`disco.sim.costs.AnalyticCosts` with the defaults of
  :class:`disco.sim.costs.AnalyticConfig` (one XLA:CPU virtual device on a shared core), as before.
* ``h100``: :class:`SummedCosts`, ``launch + dot time + conv_flops / conv_rate + (bytes read +
  written) / bandwidth``, where the dot rate rises beyond a knee of dot flops per kernel and a
  data-movement kernel has its own launch term. The terms are added, not maxed: a cuBLAS or cuDNN
  kernel also moves its operands, and the sum predicts the simulator's step device times better
  than the max-roofline of :data:`ROOFLINE` (docs/archive/lab-notebook.md, "The simulator's GPU cost model
  through the registry" and "The H100 kernel model's form"). Its parameters are fitted
  (``python scripts/tools/gpu_sim_tables.py --fit``), bounded by the TF32 peak, not datasheet figures.

:data:`ROOFLINE` holds each device's ceilings, ``max(flops / matrix rate, bytes / bandwidth) +
launch``: the CPU's analytic model, and on the H100 the baseline the per-kernel GNN corrects
(``scripts/tools/train_gnn.py`` stores it in the checkpoint). H100 80GB HBM3, float32 models: bandwidth
3.0e12 B/s, a device-to-device copy measured on the GPU (bytes read plus written;
../shared/GPU_NOTES.md); matrix rate 3.43e14 flop/s, the 95th percentile of the achieved rate over
the GEMM and convolution kernels of ``per_instruction.jsonl.gz`` (tf32 for float32 matmuls);
launch 1.19e-6 s, fitted to every profiled kernel of the dataset (``scripts/tools/kernel_lomo.py``).

Example:
  >>> analytic("h100").config.bandwidth
  3680000000000.0
  >>> roofline_config("h100").mem_bandwidth
  3000000000000.0
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from disco.ir.opcodes import DATA_MOVEMENT_OPCODES
from disco.sim.costs import SCHEMA, AnalyticConfig, AnalyticCosts, CostModel, Kernel, is_kernel_node

ROOFLINE: Mapping[str, AnalyticConfig] = {
    "cpu": AnalyticConfig(),
    "h100": AnalyticConfig(peak_flops=3.43e14, mem_bandwidth=3.0e12, launch_overhead=1.19e-6),
}
DEVICES: tuple[str, ...] = tuple(sorted(ROOFLINE))


# NVIDIA H100 SXM5 datasheet: TF32 Tensor Core 494.7 TFLOP/s dense (989.4 with sparsity). No
# kernel runs faster, so the fit bounds every matrix rate by it (``scripts/tools/gpu_sim_tables.py --fit``).
H100_TF32_PEAK = 494.7e12



@dataclasses.dataclass(frozen=True)
class SummedConfig:
    """Parameters of :class:`SummedCosts` (seconds, flops, flop/s, bytes/s).

    Attributes:
      launch: fixed seconds per kernel.
      copy_launch: fixed seconds per data-movement kernel (only :data:`DATA_MOVEMENT_OPCODES`).
      dot_rate: flop/s of a kernel's first ``dot_knee`` dot flops (float32 operands run as tf32).
      dot_knee: dot flops per kernel beyond which the matrix rate rises to ``dot_rate_large``
        (a large cuBLAS GEMM fills the GPU's SMs; a small one does not). 0: every flop at the large rate.
      dot_rate_large: flop/s of a kernel's dot flops beyond ``dot_knee``; at least ``dot_rate``.
      conv_rate: flop/s of ``convolution`` (cuDNN).
      bandwidth: bytes/s to and from device memory, counting bytes read and written.
    """

    launch: float
    copy_launch: float
    dot_rate: float
    dot_knee: float
    dot_rate_large: float
    conv_rate: float
    bandwidth: float

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (f.name not in _MAY_BE_ZERO and v == 0):
                kind = "a non-negative" if f.name in _MAY_BE_ZERO else "a positive"
                raise ValueError(f"SummedConfig.{f.name}: expected {kind} number, got {v!r}")
        if self.dot_rate_large < self.dot_rate:
            raise ValueError(f"SummedConfig.dot_rate_large: expected at least dot_rate ({self.dot_rate!r}), "
                             f"got {self.dot_rate_large!r}")


_MAY_BE_ZERO = frozenset({"launch", "copy_launch", "dot_knee"})


class KernelTerms(NamedTuple):
    """The features :class:`SummedCosts` prices one kernel by (what ``--fit`` regresses on)."""

    launches: float  # 1.0 for a computing kernel, else 0.0
    copy_launches: float  # 1.0 for a data-movement kernel, else 0.0
    dot_flops: float
    conv_flops: float
    nbytes: float  # bytes read plus written


# Fitted 2026-11-23 by `python scripts/tools/gpu_sim_tables.py --fit`: bounded least squares of relative
# errors over the 14 `default` records of ../shared/data/h100_kernels (7 zoo models x presets paper
# and small; rnnlm's while loops priced as trip count x body), each record's measured kernel sum
# against the simulator's h100-1 prediction on its pre-optimisation HLO; dot_knee from a grid,
# every matrix rate bounded by H100_TF32_PEAK (dot_rate_large sits on the bound). docs/archive/lab-notebook.md,
# "The H100 kernel model's form".
SUMMED: Mapping[str, SummedConfig] = {
    "h100": SummedConfig(launch=1.84e-6, copy_launch=0.0, dot_rate=2.03e14, dot_knee=3e10,
                         dot_rate_large=H100_TF32_PEAK, conv_rate=2.09e14, bandwidth=3.68e12),
}


class SummedCosts(CostModel):
    """Per kernel: ``launch + dot time + conv_flops / conv_rate + bytes / bandwidth``.

    The dot time rises with the kernel's dot flops ``f`` piecewise linearly, concave:
    ``min(f, dot_knee) / dot_rate + max(f - dot_knee, 0) / dot_rate_large`` (the marginal rate of a
    large GEMM is higher). A data-movement kernel (only :data:`DATA_MOVEMENT_OPCODES`) pays
    ``copy_launch`` instead of ``launch``. A kernel without a compute node (only zero-cost ops)
    costs 0.0; collectives by the cluster's links. Every term is monotone in the kernel's work and
    subadditive across kernels, as ``Simulator.lower_bound`` needs.
    """

    name = "analytic-summed"
    version = "2"  # 1: launch + dot/dot_rate + conv/conv_rate + bytes/bandwidth (4 parameters)

    def __init__(self, config: SummedConfig):
        if not isinstance(config, SummedConfig):
            raise ValueError(f"SummedCosts: expected a SummedConfig, got {config!r}")
        self.config = config

    @staticmethod
    def terms(kernel: Kernel) -> KernelTerms:
        """The features of ``kernel`` (all 0.0 for a kernel without a compute node)."""
        work = [n for n in kernel.nodes if is_kernel_node(n)]
        if not work:
            return KernelTerms(0.0, 0.0, 0.0, 0.0, 0.0)
        dot = sum(n.flops for n in work if n.opcode == "dot")
        conv = sum(n.flops for n in work if n.opcode == "convolution")
        moves = all(n.opcode in DATA_MOVEMENT_OPCODES for n in work)
        return KernelTerms(0.0 if moves else 1.0, 1.0 if moves else 0.0, float(dot), float(conv),
                           float(kernel.in_bytes + kernel.out_bytes))

    def time_of(self, t: KernelTerms) -> float:
        """Seconds of a kernel with terms ``t``."""
        c = self.config
        dot = min(t.dot_flops, c.dot_knee) / c.dot_rate + max(t.dot_flops - c.dot_knee, 0.0) / c.dot_rate_large
        return (t.launches * c.launch + t.copy_launches * c.copy_launch + dot + t.conv_flops / c.conv_rate
                + t.nbytes / c.bandwidth)

    def kernel_time(self, kernel: Kernel) -> float:
        t = self.terms(kernel)
        if not (t.launches or t.copy_launches):
            return 0.0
        return self.time_of(t)

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SummedCosts:
        if not isinstance(params, Mapping):
            raise ValueError(f"{cls.name} params: expected an object, got {params!r}")
        known = {f.name for f in dataclasses.fields(SummedConfig)}
        if set(params) != known:
            raise ValueError(f"{cls.name} params: expected keys {sorted(known)}, got {sorted(params)}")
        return cls(SummedConfig(**params))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SummedCosts:
        """Reads a model written by ``save``.

        Raises:
          ValueError: for a file that is not a saved ``analytic-summed`` model.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p.name}: not valid JSON: {e}") from None
        if not _is_summed(data):
            got = data.get("name") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"{p.name}: expected a saved {cls.name!r} cost model (schema {SCHEMA!r}), got {got!r}")
        if data.get("version") != cls.version:
            raise ValueError(f"{p.name}: field 'version': expected {cls.version!r}, got {data.get('version')!r} "
                             f"(a model of an older form: refit it with scripts/tools/gpu_sim_tables.py --fit)")
        return cls.from_params(data.get("params", {}))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SummedCosts) and other.config == self.config

    def __hash__(self) -> int:
        return hash(self.config)

    def __repr__(self) -> str:
        return f"SummedCosts({self.config!r})"


def _is_summed(data: Any) -> bool:
    return isinstance(data, Mapping) and data.get("schema") == SCHEMA and data.get("name") == SummedCosts.name


def claims(path: Path) -> bool:
    """Whether ``path`` is a saved :class:`SummedCosts` (a small JSON file naming it)."""
    if path.suffix != ".json" or path.stat().st_size > 1 << 16:
        return False
    try:
        return _is_summed(json.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def roofline_config(device: str) -> AnalyticConfig:
    """The roofline ceilings of ``device`` (what the per-kernel GNN corrects).

    Raises:
      ValueError: for a device kind without parameters.
    """
    if device not in ROOFLINE:
        raise ValueError(f"device {device!r}: expected one of {list(DEVICES)}")
    return ROOFLINE[device]


def analytic(device: str) -> CostModel:
    """The analytic cost model of ``device``: :class:`SummedCosts` where one is fitted, else the roofline.

    Raises:
      ValueError: for an unknown device kind.
    """
    config = roofline_config(device)
    if device in SUMMED:
        return SummedCosts(SUMMED[device])
    return AnalyticCosts(config)

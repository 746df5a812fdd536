"""The analytic kernel model of each device kind, and the device's measured roofline.

:func:`analytic` is what ``--cost-model analytic`` prices a device's kernels with:

* ``cpu``: the roofline :class:`disco.sim.costs.AnalyticCosts` with the defaults of
  :class:`disco.sim.costs.AnalyticConfig` (one XLA:CPU virtual device on a shared core), as before.
* ``h100``: :class:`SummedCosts`, ``launch + dot_flops / dot_rate + conv_flops / conv_rate +
  (bytes read + written) / bandwidth``. The terms are added, not maxed: a cuBLAS or cuDNN kernel
  also moves its operands, and the sum predicts the simulator's step device times better than
  the max-roofline of :data:`ROOFLINE` (on the 7 zoo models at preset paper: within 10% for 5 of 7
  vs 1 of 7; docs/benchmarks.md, "The simulator's GPU cost model through the registry"). Its
  parameters are fitted (``python scripts/gpu_sim_tables.py --fit``), not datasheet figures.

:data:`ROOFLINE` holds each device's ceilings, ``max(flops / matrix rate, bytes / bandwidth) +
launch``: the CPU's analytic model, and on the H100 the baseline the per-kernel GNN corrects
(``scripts/train_gnn.py`` stores it in the checkpoint). H100 80GB HBM3, float32 models: bandwidth
3.0e12 B/s, a device-to-device copy measured on the GPU (bytes read plus written;
../shared/GPU_NOTES.md); matrix rate 3.43e14 flop/s, the 95th percentile of the achieved rate over
the GEMM and convolution kernels of ``per_instruction.jsonl.gz`` (tf32 for float32 matmuls);
launch 1.19e-6 s, fitted to every profiled kernel of the dataset (``scripts/kernel_lomo.py``).

Example:
  >>> analytic("h100").config.bandwidth
  3320000000000.0
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
from typing import Any

from disco.sim.costs import SCHEMA, AnalyticConfig, AnalyticCosts, CostModel, Kernel, is_kernel_node

ROOFLINE: Mapping[str, AnalyticConfig] = {
    "cpu": AnalyticConfig(),
    "h100": AnalyticConfig(peak_flops=3.43e14, mem_bandwidth=3.0e12, launch_overhead=1.19e-6),
}
DEVICES: tuple[str, ...] = tuple(sorted(ROOFLINE))


@dataclasses.dataclass(frozen=True)
class SummedConfig:
    """Parameters of :class:`SummedCosts` (seconds, flop/s, bytes/s).

    Attributes:
      launch: fixed seconds per kernel.
      dot_rate: flop/s of ``dot`` (float32 operands run as tf32 by XLA's default precision).
      conv_rate: flop/s of ``convolution`` (cuDNN).
      bandwidth: bytes/s to and from device memory, counting bytes read and written.
    """

    launch: float
    dot_rate: float
    conv_rate: float
    bandwidth: float

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (f.name != "launch" and v == 0):
                raise ValueError(f"SummedConfig.{f.name}: expected a positive number, got {v!r}")


# Fitted 2026-11-23 by `python scripts/gpu_sim_tables.py --fit`: non-negative least squares of
# relative errors over the 14 `default` records of ../shared/data/h100_kernels (7 zoo models x
# presets paper and small; rnnlm's while loops priced as trip count x body), each record's measured
# kernel sum against the simulator's h100-1 prediction on its pre-optimisation HLO.
SUMMED: Mapping[str, SummedConfig] = {
    "h100": SummedConfig(launch=1.87e-6, dot_rate=2.56e14, conv_rate=2.19e14, bandwidth=3.32e12),
}


class SummedCosts(CostModel):
    """``launch + dot_flops / dot_rate + conv_flops / conv_rate + bytes / bandwidth`` per kernel.

    A kernel without a compute node (only zero-cost ops) costs 0.0; collectives by the cluster's links.
    """

    name = "analytic-summed"
    version = "1"

    def __init__(self, config: SummedConfig):
        if not isinstance(config, SummedConfig):
            raise ValueError(f"SummedCosts: expected a SummedConfig, got {config!r}")
        self.config = config

    @staticmethod
    def terms(kernel: Kernel) -> tuple[float, float, float, float]:
        """(launches, dot flops, convolution flops, bytes) of ``kernel``: the model's features."""
        if kernel.is_empty or not any(is_kernel_node(n) for n in kernel.nodes):
            return (0.0, 0.0, 0.0, 0.0)
        dot = conv = 0.0
        for n in kernel.nodes:
            if n.opcode == "dot":
                dot += n.flops
            elif n.opcode == "convolution":
                conv += n.flops
        return (1.0, dot, conv, float(kernel.in_bytes + kernel.out_bytes))

    def kernel_time(self, kernel: Kernel) -> float:
        launches, dot, conv, nbytes = self.terms(kernel)
        if not launches:
            return 0.0
        c = self.config
        return c.launch + dot / c.dot_rate + conv / c.conv_rate + nbytes / c.bandwidth

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
            raise ValueError(f"{p.name}: field 'version': expected {cls.version!r}, got {data.get('version')!r}")
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

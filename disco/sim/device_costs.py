"""The analytic kernel model per device kind: a roofline with two ceilings and a launch term.

``kernel seconds = max(flops / matrix rate, (bytes read + written) / bandwidth) + launch``
(:class:`disco.sim.costs.AnalyticCosts` with these parameters).

* ``cpu``: the defaults of :class:`disco.sim.costs.AnalyticConfig` (one XLA:CPU virtual device
  on a shared core), as before.
* ``h100``: one NVIDIA H100 80GB HBM3, float32 models. Bandwidth 3.0e12 B/s: a device-to-device
  copy measured on the GPU (bytes read plus written; ../shared/GPU_NOTES.md). Matrix rate
  3.43e14 flop/s: the 95th percentile of the achieved rate over the cuBLAS/cuDNN/Triton GEMM and
  convolution kernels of ``per_instruction.jsonl.gz`` (tf32 for float32 matmuls; read from the
  dataset, not a separate benchmark). Launch 1.19e-6 s: fitted to every profiled kernel of the
  dataset (the value minimising the median relative error; ``scripts/kernel_lomo.py`` refits it per
  fold). docs/benchmarks.md has the numbers and commands.

Example:
  >>> analytic("h100").config.mem_bandwidth
  3000000000000.0
"""

from __future__ import annotations

from collections.abc import Mapping

from disco.sim.costs import AnalyticConfig, AnalyticCosts

ANALYTIC: Mapping[str, AnalyticConfig] = {
    "cpu": AnalyticConfig(),
    "h100": AnalyticConfig(peak_flops=3.43e14, mem_bandwidth=3.0e12, launch_overhead=1.19e-6),
}
DEVICES: tuple[str, ...] = tuple(sorted(ANALYTIC))


def analytic_config(device: str) -> AnalyticConfig:
    """The roofline parameters of ``device``.

    Raises:
      ValueError: for a device kind without parameters.
    """
    if device not in ANALYTIC:
        raise ValueError(f"device {device!r}: expected one of {list(DEVICES)}")
    return ANALYTIC[device]


def analytic(device: str) -> AnalyticCosts:
    """The analytic cost model of ``device`` (raises ValueError for an unknown device)."""
    return AnalyticCosts(analytic_config(device))

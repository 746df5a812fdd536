"""Cluster descriptions: how many devices, how they are linked, which collective algorithm.

The public face of three modules, one concept each:

- :mod:`disco.sim.cluster_spec`: the data model (:class:`ClusterSpec`, :class:`LinkSpec`),
  bandwidth and latency units, and our YAML format (``ClusterSpec.to_yaml`` / ``from_yaml``).
- :mod:`disco.sim.cluster_files`: :func:`load_cluster`, which reads our format and the
  SuperScaler-style and AutoDist-style files of other systems.
- :mod:`disco.sim.cluster_presets`: the named clusters (:func:`preset`, :data:`PRESETS`) and
  :func:`resolve`, which turns a ``--cluster`` argument (a file or a preset) into a spec.

Example:
  >>> from disco.sim import cluster
  >>> cluster.preset("2x8-100gbe").num_devices
  16
"""

from __future__ import annotations

from disco.sim.cluster_files import load_cluster
from disco.sim.cluster_presets import (H100_IB_LATENCY, H100_IB_PER_GPU, H100_MEMORY_BYTES, H100_NVLINK_BUSBW,
                                       H100_NVLINK_LATENCY,
                                       LOCAL_BANDWIDTH, LOCAL_DEVICES, LOCAL_LABEL, LOCAL_LATENCY, PRESETS,
                                       PUBLIC_LABEL, gpu_preset_for, machine_preset, preset, resolve)
from disco.sim.cluster_spec import (ALGORITHMS, DEVICES, GPU_DEVICES, Algorithm, ClusterSpec, LinkSpec,
                                    parse_bandwidth, parse_bytes, parse_latency, require_cluster)

__all__ = [
    "ALGORITHMS", "DEVICES", "GPU_DEVICES", "Algorithm", "ClusterSpec", "LinkSpec", "parse_bandwidth",
    "parse_bytes", "parse_latency", "require_cluster", "load_cluster", "PRESETS", "preset", "resolve", "gpu_preset_for",
    "machine_preset", "PUBLIC_LABEL", "LOCAL_LABEL", "LOCAL_BANDWIDTH", "LOCAL_LATENCY", "LOCAL_DEVICES", "H100_NVLINK_BUSBW",
    "H100_NVLINK_LATENCY", "H100_IB_PER_GPU", "H100_IB_LATENCY", "H100_MEMORY_BYTES",
]

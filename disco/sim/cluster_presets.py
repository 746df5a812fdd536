"""Named clusters (:data:`PRESETS`) and the ``--cluster`` argument (a file or a preset).

The GPU presets are public cluster shapes, not measurements; ``local`` is this machine's
virtual CPU devices with placeholder link costs until ``disco calibrate`` measures them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from disco.sim.cluster_files import load_cluster
from disco.sim.cluster_spec import ClusterSpec, LinkSpec, shown

PUBLIC_LABEL = "public GPU cluster shape, not measured"
LOCAL_LABEL = "this machine's virtual CPU devices; placeholder link costs until `disco calibrate`"
PRESETS: tuple[str, ...] = ("local", "dgx-a100-8", "2x8-100gbe", "16x8-ib", "h100-1", "h100-sxm-8", "h100-2x8-ib")

# 8x H100 SXM on NVLink 4 / NVSwitch: NCCL's all-reduce reaches a peak bus bandwidth of about
# 480 GB/s on 8 GPUs (NVLink SHARP, large messages; about 370 GB/s with NCCL_ALGO=RING), as
# NCCL's maintainer states in https://github.com/NVIDIA/nccl-tests/issues/212 (2024-05-06);
# the 8x H200 (same NVLink 4) output in https://github.com/NVIDIA/nccl-tests/issues/272 peaks
# at 475 GB/s. With the ring formula (``2 (p-1)/p n / bandwidth``) a link bandwidth equal to
# the bus bandwidth reproduces that time. The 1 us per step latency is our estimate, not from
# those sources (14 us for a small all-reduce on 8 GPUs).
H100_NVLINK_BUSBW = 480e9
H100_NVLINK_LATENCY = 1e-6
# 400 Gb/s InfiniBand (NDR, one ConnectX-7 per GPU, as in DGX H100): 8 x 400 Gb/s per node.
H100_IB_PER_GPU = 400e9 / 8
H100_IB_LATENCY = 5e-6
# An H100 SXM's HBM3, as NVIDIA names the part ("H100 80GB HBM3"); taken as 80 GiB (jax's
# bytes_limit on such a card is a little less, what the driver keeps aside), not measured.
H100_MEMORY_BYTES = 80 * 2**30

# Placeholders for XLA:CPU's in-process collectives (shared memory plus a rendezvous):
# a few GB/s and tens of microseconds. `disco calibrate` replaces them with measurements.
LOCAL_BANDWIDTH = 5e9
LOCAL_LATENCY = 20e-6
LOCAL_DEVICES = 8
_CALIBRATION_KEYS = frozenset({"bandwidth", "latency", "compute_speed", "operand_latency", "rs_ag_scale"})


def preset(name: str, devices: int | None = None, calibration: Mapping[str, float] | None = None) -> ClusterSpec:
    """A named cluster.

    Presets:
      local: this machine's ``devices`` virtual CPU devices (default 8, as the tests'
        ``--xla_force_host_platform_device_count=8``), one node; link costs are
        placeholders (5 GB/s, 20 us) unless ``calibration`` gives measured
        ``bandwidth`` (bytes/s), ``latency`` (s), ``operand_latency`` (s per extra operand of a
        variadic all-reduce), ``rs_ag_scale`` (a reduce-scatter plus all-gather over one
        all-reduce of the same buffer) and/or ``compute_speed``.
      dgx-a100-8: 1 node x 8 GPUs, NVLink 300 GB/s per direction, 5 us; ring.
      2x8-100gbe: 2 nodes x 8 GPUs, NVLink inside, 100 Gb/s Ethernet between (15 us); hierarchical.
      16x8-ib: 16 nodes x 8 GPUs, NVLink inside, 8 x 200 Gb/s InfiniBand per node (200 GB/s, 5 us);
        hierarchical.
      h100-1: one NVIDIA H100 (device "h100"): no collectives, kernels priced for the H100.
      h100-sxm-8: 8 H100 SXM on NVLink/NVSwitch (device "h100"): 480 GB/s NCCL all-reduce bus
        bandwidth (``H100_NVLINK_BUSBW``, published figure, see its comment), 1 us; ring.
      h100-2x8-ib: 2 nodes x 8 H100 SXM (device "h100"), NVLink inside, 400 Gb/s InfiniBand per
        GPU (8 x 400 Gb/s = 400 GB/s per node, 5 us); hierarchical.
    The H100 presets carry an H100's memory (``H100_MEMORY_BYTES``, 80 GiB); the others leave it
    unknown (None). The GPU presets are public cluster shapes, not measurements. The first four keep the CPU
    device kind (kernels priced by the CPU model), as before device kinds existed.

    Args:
      name: one of ``PRESETS``.
      devices: for "local", the number of devices; for the others, if given, must equal
        the preset's device count.
      calibration: for "local" only, measured values overriding the placeholders.

    Returns:
      The ClusterSpec.

    Raises:
      ValueError: for an unknown preset (listing the presets) or arguments it does not take.
    """
    nvlink = LinkSpec(300e9, 5e-6)
    if name == "local":
        n = LOCAL_DEVICES if devices is None else devices
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"preset 'local': devices: expected an integer >= 1, got {shown(devices)}")
        cal = dict(calibration or {})
        unknown = sorted(set(cal) - _CALIBRATION_KEYS)
        if unknown:
            raise ValueError(f"preset 'local': calibration: unknown keys {shown(unknown)}; "
                             f"expected some of {sorted(_CALIBRATION_KEYS)}")
        link = LinkSpec(float(cal.get("bandwidth", LOCAL_BANDWIDTH)), float(cal.get("latency", LOCAL_LATENCY)))
        measured = bool(cal)
        return ClusterSpec(name="local", nodes=1, devices_per_node=n, intra=link, inter=link,
                           algorithm="ring", compute_speed=float(cal.get("compute_speed", 1.0)),
                           operand_latency=float(cal.get("operand_latency", 0.0)),
                           rs_ag_scale=float(cal.get("rs_ag_scale", 1.0)),
                           overlap=False,  # the device threads that compute also reduce
                           description=f"{n} virtual CPU devices of this machine",
                           label="calibrated on this machine" if measured else LOCAL_LABEL)
    if calibration is not None:
        raise ValueError(f"preset {shown(name)}: calibration applies only to 'local', got {shown(dict(calibration))}")
    if name == "dgx-a100-8":
        spec = ClusterSpec(name=name, nodes=1, devices_per_node=8, intra=nvlink, inter=nvlink,
                           algorithm="ring", description="one DGX A100: 8 GPUs on NVLink/NVSwitch",
                           label=PUBLIC_LABEL)
    elif name == "2x8-100gbe":
        spec = ClusterSpec(name=name, nodes=2, devices_per_node=8, intra=nvlink,
                           inter=LinkSpec(100e9 / 8, 15e-6), algorithm="hierarchical",
                           description="2 nodes x 8 GPUs, NVLink inside, 100 Gb/s Ethernet between",
                           label=PUBLIC_LABEL)
    elif name == "16x8-ib":
        spec = ClusterSpec(name=name, nodes=16, devices_per_node=8, intra=nvlink,
                           inter=LinkSpec(8 * 200e9 / 8, 5e-6), algorithm="hierarchical",
                           description="16 nodes x 8 GPUs, NVLink inside, 8x200 Gb/s HDR InfiniBand per node",
                           label=PUBLIC_LABEL)
    elif name in ("h100-1", "h100-sxm-8", "h100-2x8-ib"):
        spec = _h100_preset(name)
    else:
        raise ValueError(f"unknown cluster preset {shown(name)}; expected one of {', '.join(PRESETS)}")
    if devices is not None and devices != spec.num_devices:
        raise ValueError(f"preset {shown(name)} has {spec.num_devices} devices, got devices={shown(devices)}")
    return spec


def gpu_preset_for(device_kind: str, devices: int) -> str | None:
    """The GPU preset that describes ``devices`` local GPUs of jax's ``device_kind`` (e.g.
    "NVIDIA H100 80GB HBM3"): ``h100-1`` for one H100, ``h100-sxm-8`` for eight; None where no
    preset fits (then a cluster file is needed)."""
    if "h100" not in device_kind.lower():
        return None
    return {1: "h100-1", 8: "h100-sxm-8"}.get(devices)


def machine_preset(platform: str, device_kind: str, devices: int) -> str | None:
    """The preset of ``devices`` local devices of jax's ``platform`` and ``device_kind``: "local"
    on CPU, else :func:`gpu_preset_for` (None where no preset fits)."""
    return "local" if platform == "cpu" else gpu_preset_for(device_kind, devices)


def resolve(value: str | None, devices: int | None = None) -> ClusterSpec:
    """The cluster a ``--cluster`` argument names: a cluster file when the path exists (read
    by :func:`load_cluster`), else a preset; ``None`` is ``local``. A directory is never a
    cluster file, so one named like a preset (``./local``) leaves the preset its name. ``devices``
    is passed to ``local`` only (the other presets fix their own device count).

    Raises:
      ValueError: when ``value`` is neither an existing file nor a preset (listing the presets).
    """
    if value is None:
        return preset("local", devices=devices)
    if os.path.exists(value) and not (value in PRESETS and os.path.isdir(value)):
        return load_cluster(value)
    if value in PRESETS:
        return preset(value, devices=devices if value == "local" else None)
    raise ValueError(f"--cluster {shown(value)} is neither a file nor a preset; expected a path or one of: "
                     f"{', '.join(PRESETS)}")


def _h100_preset(name: str) -> ClusterSpec:
    nvlink = LinkSpec(H100_NVLINK_BUSBW, H100_NVLINK_LATENCY)
    if name == "h100-1":
        return ClusterSpec(name=name, nodes=1, devices_per_node=1, intra=nvlink, inter=nvlink,
                           algorithm="ring", device="h100", device_memory_bytes=H100_MEMORY_BYTES,
                           description="one NVIDIA H100 80GB HBM3",
                           label=PUBLIC_LABEL)
    if name == "h100-sxm-8":
        return ClusterSpec(name=name, nodes=1, devices_per_node=8, intra=nvlink, inter=nvlink,
                           algorithm="ring", device="h100", device_memory_bytes=H100_MEMORY_BYTES,
                           description="8x H100 SXM on NVLink 4 / NVSwitch (480 GB/s NCCL all-reduce busbw)",
                           label=PUBLIC_LABEL)
    return ClusterSpec(name=name, nodes=2, devices_per_node=8, intra=nvlink,
                       inter=LinkSpec(8 * H100_IB_PER_GPU, H100_IB_LATENCY), algorithm="hierarchical",
                       device="h100", device_memory_bytes=H100_MEMORY_BYTES,
                       description="2 nodes x 8 H100 SXM, NVLink inside, 400 Gb/s InfiniBand per GPU",
                       label=PUBLIC_LABEL)

"""Measuring this machine's all-reduce cost and fitting the alpha-beta model.

``calibrate(devices)`` times jitted all-reduces (``psum`` inside ``shard_map``) of several
sizes on the real devices, fits ``t(n) = a + b * n`` by least squares on the medians, and
turns that into the per-link latency and bandwidth of a ring all-reduce over ``p``
devices (the model in :mod:`disco.collectives`):

    t(n) = 2 (p - 1) * latency + 2 (p - 1) / p * n / bandwidth
    => latency = a / (2 (p - 1)),  bandwidth = 2 (p - 1) / (p * b)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24)


@dataclasses.dataclass(frozen=True)
class Calibration:
    devices: int
    sizes: tuple[int, ...]
    medians_s: tuple[float, ...]
    latency: float  # per ring step, seconds
    bandwidth: float  # bytes/s per link
    fit_a: float
    fit_b: float

    def as_preset_calibration(self) -> dict[str, float]:
        return {"latency": self.latency, "bandwidth": self.bandwidth}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit(devices: int, sizes: Sequence[int], times: Sequence[float]) -> Calibration:
    """Least-squares fit of ``t = a + b n`` and the ring parameters it implies."""
    import numpy as np

    if devices < 2:
        raise ValueError(f"calibration needs at least 2 devices, got {devices}")
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    b, a = np.polyfit(x, y, 1)
    a, b = max(float(a), 1e-9), max(float(b), 1e-15)
    p = devices
    return Calibration(devices, tuple(int(s) for s in sizes), tuple(float(t) for t in times),
                       latency=a / (2 * (p - 1)), bandwidth=2 * (p - 1) / (p * b), fit_a=a, fit_b=b)


def measure_allreduce(devices: int, nbytes: int, reps: int = 20) -> float:
    """Median seconds of one jitted all-reduce of ``nbytes`` per device over ``devices`` devices."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    if devices > len(jax.devices()):
        raise ValueError(f"asked for {devices} devices, {len(jax.devices())} available")
    mesh = jax.make_mesh((devices,), ("dp",), devices=jax.devices()[:devices])
    n = max(1, nbytes // 4)
    f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "dp"), mesh=mesh, in_specs=P("dp"),
                              out_specs=P("dp"), check_vma=False))
    x = jax.device_put(jnp.ones((devices * n,), jnp.float32), NamedSharding(mesh, P("dp")))
    jax.block_until_ready(f(x))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate(devices: int, sizes: Sequence[int] = SIZES, reps: int = 20) -> Calibration:
    return fit(devices, sizes, [measure_allreduce(devices, s, reps) for s in sizes])

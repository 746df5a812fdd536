"""Measuring this machine's all-reduce cost and fitting the alpha-beta model.

``calibrate(devices)`` times jitted all-reduces (``psum`` inside ``shard_map``) of several
sizes on the real devices, fits ``t(n) = a + b * n`` by least squares on the medians, and
turns that into the per-link latency and bandwidth of a ring all-reduce over ``p``
devices (the model in :mod:`disco.sim.collectives`):

    t(n) = 2 (p - 1) * latency + 2 (p - 1) / p * n / bandwidth
    => latency = a / (2 (p - 1)),  bandwidth = 2 (p - 1) / (p * b)

It also measures what a *variadic* all-reduce (the form XLA's combiner produces) costs per
operand: the same bytes as ``OPERANDS`` separate gradients, psum'd together so that the
combiner makes one variadic all-reduce, against one concatenated buffer:

    operand_latency = (t_variadic - t_concat) / (OPERANDS - 1)

XLA:CPU's in-process devices run a variadic all-reduce operand by operand, so the term is
large there (the measurement: docs/archive/lab-notebook.md, "Calibration: all-reduce alpha/beta of this machine").
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24)
OPERANDS = 32
OPERAND_BYTES = 1 << 20  # total bytes of the variadic/concat pair
MIN_FIT_A = 1e-9  # seconds per all-reduce: the floor of a fitted intercept
MIN_FIT_B = 1e-15  # seconds per byte: the floor of a fitted slope (1 PB/s)


@dataclasses.dataclass(frozen=True)
class Calibration:
    devices: int
    sizes: tuple[int, ...]
    medians_s: tuple[float, ...]
    latency: float  # per ring step, seconds
    bandwidth: float  # bytes/s per link
    fit_a: float
    fit_b: float
    operand_latency: float = 0.0  # seconds per extra operand of a variadic all-reduce
    variadic_s: float | None = None  # the OPERANDS-operand variadic all-reduce, median
    concat_s: float | None = None  # the same bytes as one buffer, median
    floored: tuple[str, ...] = ()  # the fitted terms raised to their floor (floor_fit)

    def as_preset_calibration(self) -> dict[str, float]:
        return {"latency": self.latency, "bandwidth": self.bandwidth, "operand_latency": self.operand_latency}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit(devices: int, sizes: Sequence[int], times: Sequence[float]) -> Calibration:
    """Least-squares fit of ``t = a + b n`` in relative error, and the ring parameters it implies.

    Relative, not absolute, error: an absolute fit is ruled by the largest sizes and prices
    small all-reduces far below their measured time, so one all-reduce per gradient would look
    cheap where it is the slowest plan (docs/archive/lab-notebook.md, "Calibration: all-reduce
    alpha/beta of this machine").

    Raises:
      ValueError: fewer than 2 devices, fewer than 2 distinct sizes, a time per size that
        is missing or extra, or a time that is not positive.
    """
    import numpy as np

    if devices < 2:
        raise ValueError(f"calibration needs at least 2 devices, got {devices}")
    if len(set(sizes)) < 2:
        raise ValueError(f"a fit needs at least 2 distinct sizes, got sizes {tuple(sizes)!r}")
    if len(times) != len(sizes):
        raise ValueError(f"times: expected one per size ({len(sizes)}), got {len(times)}")
    x = np.asarray(sizes, dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    if not np.all(y > 0):
        raise ValueError(f"times: expected positive seconds, got {tuple(times)!r}")
    b, a = np.polyfit(x, y, 1, w=1.0 / y)
    a, b, floored = floor_fit(float(a), float(b))
    p = devices
    return Calibration(devices, tuple(int(s) for s in sizes), tuple(float(t) for t in times),
                       latency=a / (2 * (p - 1)), bandwidth=2 * (p - 1) / (p * b), fit_a=a, fit_b=b,
                       floored=floored)


def floor_fit(a: float, b: float) -> tuple[float, float, tuple[str, ...]]:
    """The fitted intercept ``a`` and slope ``b`` raised to ``MIN_FIT_A`` and ``MIN_FIT_B``, and
    the names of those that were raised.

    A term below its floor is no cost the simulator can use: noise put the intercept below
    zero, or the times did not grow with the size. The floor keeps the spec usable; the
    names go into the result so that the caller can say the fit did not measure that term.
    """
    floored = tuple(name for name, v, lo in (("fit_a", a, MIN_FIT_A), ("fit_b", b, MIN_FIT_B)) if not v >= lo)
    return (MIN_FIT_A if "fit_a" in floored else a), (MIN_FIT_B if "fit_b" in floored else b), floored


def floored_note(floored: Sequence[str]) -> str | None:
    """One line saying which fitted terms are floors, not measurements; None when none is."""
    if not floored:
        return None
    what = {"fit_a": "the latency (intercept)", "fit_b": "the per-byte time (slope)"}
    return (f"note: {' and '.join(what[f] for f in floored)} fitted at or below zero and was set to its floor: "
            f"the times did not grow with the message size as expected; measure again with more --reps "
            f"on a quieter machine")


def _data_parallel(devices: int, fns: Sequence[Any], per_device: int) -> tuple[list[Any], Any]:
    """``fns`` jitted as shard_map bodies over a ``("dp",)`` mesh of ``devices`` devices, and a
    float32 input of ``per_device`` elements per device sharded over it.

    Raises:
      ValueError: when fewer than ``devices`` devices are available.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import trax_models

    if devices > len(jax.devices()):
        raise ValueError(f"asked for {devices} devices, {len(jax.devices())} available")
    mesh = trax_models.data_parallel_mesh(devices, "dp")
    jitted = [jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False))
              for f in fns]
    x = jax.device_put(jnp.ones((devices * per_device,), jnp.float32), NamedSharding(mesh, P("dp")))
    return jitted, x


def _medians(fns: Sequence[Any], x: Any, reps: int) -> list[float]:
    """Median seconds per call of each of ``fns`` on ``x`` after a warm-up, interleaved rep by rep."""
    import jax

    for f in fns:
        jax.block_until_ready(f(x))
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for f, t in zip(fns, times):
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def measure_allreduce(devices: int, nbytes: int, reps: int = 20) -> float:
    """Median seconds of one jitted all-reduce of ``nbytes`` per device over ``devices`` devices."""
    import jax

    fns, x = _data_parallel(devices, [lambda x: jax.lax.psum(x, "dp")], max(1, nbytes // 4))
    return _medians(fns, x, reps)[0]


def measure_chained(devices: int, nbytes: int, chain: Sequence[int], reps: int = 20) -> tuple[list[float], list[int]]:
    """Median seconds per call of executables of ``k`` chained all-reduces of ``nbytes`` per device,
    for each ``k`` in ``chain``, interleaved rep by rep, and the all-reduces each compiled executable
    holds (a check that XLA kept the chain: ``k`` expected). Each all-reduce takes the previous one's
    output, so XLA's combiner cannot merge them: the per-all-reduce cost a step of several
    all-reduces pays (a lone all-reduce per call measures less under load; docs/archive/lab-notebook.md,
    "The emulated cluster: chained-latency calibration")."""
    import jax

    def chained(k):
        def f(x):
            for _ in range(k):
                x = jax.lax.psum(x, "dp") * (1.0 / devices)
            return x
        return f

    fns, x = _data_parallel(devices, [chained(k) for k in chain], max(1, nbytes // 4))
    counts = [f.lower(x).compile().as_text().count(" all-reduce(") for f in fns]
    return _medians(fns, x, reps), counts


def measure_variadic(devices: int, operands: int = OPERANDS, nbytes: int = OPERAND_BYTES,
                     reps: int = 20) -> tuple[float, float]:
    """Median seconds of (one variadic all-reduce of ``operands`` equal parts, one all-reduce of
    their concatenation), ``nbytes`` per device in all, interleaved rep by rep."""
    import jax
    import jax.numpy as jnp

    n = max(1, nbytes // 4 // operands)

    def parts(x):  # distinct values per part, so XLA cannot merge the all-reduces into one operand
        return [x[i * n:(i + 1) * n] * (i + 1.0) for i in range(operands)]

    def variadic(x):
        return jnp.concatenate(jax.lax.psum(parts(x), "dp"))

    def concat(x):
        return jax.lax.psum(jnp.concatenate(parts(x)), "dp")

    fns, x = _data_parallel(devices, [variadic, concat], n * operands)
    variadic_s, concat_s = _medians(fns, x, reps)
    return variadic_s, concat_s


def calibrate(devices: int, sizes: Sequence[int] = SIZES, reps: int = 20) -> Calibration:
    """Measures the all-reduces of ``sizes`` bytes per device over ``devices`` devices, ``reps``
    times each, fits them (:func:`fit`) and measures the per-operand cost.

    Raises:
      ValueError: fewer than 2 devices, fewer than 2 distinct sizes or ``reps`` below 1 (before
        anything is measured), or fewer devices available.
    """
    if devices < 2:
        raise ValueError(f"calibration needs at least 2 devices, got {devices}")
    if len(set(sizes)) < 2:
        raise ValueError(f"a fit needs at least 2 distinct sizes, got sizes {tuple(sizes)!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: expected an integer >= 1, got {reps!r}")
    c = fit(devices, sizes, [measure_allreduce(devices, s, reps) for s in sizes])
    variadic_s, concat_s = measure_variadic(devices, reps=reps)
    return dataclasses.replace(c, operand_latency=max(0.0, (variadic_s - concat_s) / (OPERANDS - 1)),
                               variadic_s=variadic_s, concat_s=concat_s)


def machine_cluster(devices: int, reps: int = 10) -> tuple[Any, Calibration]:
    """This machine's ``devices`` CPU devices as a cluster spec: :func:`calibrate`, then the
    ``local`` preset with the measured link and per-operand costs (what ``disco calibrate --out``
    writes, and what ``disco optimize`` prices plans with when no ``--cluster`` is given).

    Returns:
      (the ClusterSpec, the Calibration it came from).
    """
    from disco.sim.cluster import preset

    c = calibrate(devices, reps=reps)
    return preset("local", devices=devices, calibration=c.as_preset_calibration()), c

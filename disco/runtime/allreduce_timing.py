"""What a calibration runs on the devices: jitted all-reduces timed over a data-parallel mesh.

:func:`time_all_reduces` is one calibration's measurement over ``devices`` devices (every size,
the chains, the variadic/concatenated pair); :class:`disco.calibrate.InProcessRunner` calls it in
this process and each worker of :class:`disco.calibrate.ProcessRunner` calls it
(:mod:`disco.runtime.worker`'s ``calibrate`` task), the slowest worker's times then taken per cell
(:func:`disco.calibrate.timings`). It sits here, beside the worker, so that the worker needs nothing
from :mod:`disco.calibrate`, which launches it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24)
OPERANDS = 32
OPERAND_BYTES = 1 << 20  # total bytes of the variadic/concat pair
RS_AG_BYTES = 1 << 22  # bytes per device of the all-reduce / reduce-scatter + all-gather pair


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
    all-reduces pays (a lone all-reduce per call measures less under load; docs/archive/lab-notebook.md)."""
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


def measure_rs_ag(devices: int, nbytes: int = RS_AG_BYTES, reps: int = 20) -> tuple[float, float]:
    """Median seconds of (one all-reduce of ``nbytes`` per device, a reduce-scatter of the same
    buffer followed by an all-gather of its shards), interleaved rep by rep: what an ``rs_ag``
    bucket costs here against the all-reduce it replaces. On a ring the two move the same bytes in
    the same steps; a backend may run them otherwise (measured 1.13x over 8 in-process CPU devices,
    1.07x across 2 processes on the emulated 10 Gbit/s + 50 us link, both at 4 MiB;
    docs/archive/lab-notebook.md, "The measurements against themselves")."""
    import jax

    def all_reduce(x):
        return jax.lax.psum(x, "dp")

    def rs_ag(x):
        return jax.lax.all_gather(jax.lax.psum_scatter(x, "dp", tiled=True), "dp", tiled=True)

    per_device = max(devices, nbytes // 4 // devices * devices)  # a multiple of the devices, to scatter
    fns, x = _data_parallel(devices, [all_reduce, rs_ag], per_device)
    all_reduce_s, rs_ag_s = _medians(fns, x, reps)
    return all_reduce_s, rs_ag_s


def time_chained(devices: int, sizes: Sequence[int], chain: Sequence[int], reps: int = 20) -> dict[str, Any]:
    """Executables of k chained all-reduces per size (:func:`measure_chained`): ``chain_medians_s[size][k]``
    (seconds per call) and the all-reduces XLA kept in each (``chain_all_reduces``, k expected)."""
    per = [measure_chained(devices, s, tuple(chain), reps) for s in sizes]
    return {"sizes": list(sizes), "chain": list(chain), "chain_medians_s": [m for m, _ in per],
            "chain_all_reduces": [c for _, c in per]}


def time_all_reduces(devices: int, sizes: Sequence[int], reps: int, chain: Sequence[int] = ()) -> dict[str, Any]:
    """One calibration's times over ``devices`` devices: the median seconds of one all-reduce per
    call for each of ``sizes`` bytes per device (``medians_s``; the chain of one when ``chain``
    holds 1), the chained timings when ``chain`` is given (:func:`time_chained`), the variadic
    all-reduce of ``OPERANDS`` parts against their concatenation (``variadic_s``, ``concat_s``), and
    one all-reduce of ``RS_AG_BYTES`` against a reduce-scatter plus all-gather of the same buffer
    (``rs_ag_all_reduce_s``, ``rs_ag_s``: :func:`measure_rs_ag`)."""
    chain = tuple(chain)
    out: dict[str, Any] = time_chained(devices, sizes, chain, reps) if chain else {}
    if 1 in chain:  # the lone all-reduce per call is the chain of one
        medians = [m[chain.index(1)] for m in out["chain_medians_s"]]
    else:
        medians = [measure_allreduce(devices, s, reps) for s in sizes]
    variadic_s, concat_s = measure_variadic(devices, reps=reps)
    rs_ag_all_reduce_s, rs_ag_s = measure_rs_ag(devices, reps=reps)
    return {**out, "sizes": list(sizes), "medians_s": medians, "variadic_s": variadic_s, "concat_s": concat_s,
            "operands": OPERANDS, "operand_bytes": OPERAND_BYTES, "rs_ag_all_reduce_s": rs_ag_all_reduce_s,
            "rs_ag_s": rs_ag_s, "rs_ag_bytes": RS_AG_BYTES}

"""Calibration: measure all-reduces, fit the alpha-beta model, write a cluster spec.

One calibrator, two runners. :func:`calibrate` times jitted all-reduces (``psum`` inside
``shard_map``) of several sizes on a runner's devices (:class:`InProcessRunner`: this process's;
:class:`ProcessRunner`: worker processes on loopback or an emulated link, :mod:`disco.runtime.testbed`,
the slowest worker's time per cell), fits ``t(n) = a + b * n`` by least squares in relative error,
and turns that into the per-link latency and bandwidth of a ring all-reduce over ``p`` devices
(the model in :mod:`disco.sim.collectives`):

    t(n) = 2 (p - 1) * latency + 2 (p - 1) / p * n / bandwidth
    => latency = a / (2 (p - 1)),  bandwidth = 2 (p - 1) / (p * b)

With chains (the process runner's default), executables of ``k`` chained all-reduces are timed
too and fitted by :func:`fit_chained`: ``t(k, n) = c + k (a + b n)``, so ``a + b n`` is what each
all-reduce of a multi-all-reduce executable (a training step) costs and ``c`` the call's own
overhead, which a step pays once. Under load an all-reduce inside such an executable costs several
times a lone one per call, so the lone fit (kept as ``CrossCalibration.lone``) prices a step's
all-reduces too low (docs/archive/lab-notebook.md, issue 17).

It also measures what a *variadic* all-reduce (the form XLA's combiner produces) costs per
operand: the same bytes as ``OPERANDS`` separate gradients (the timings on the devices are
:mod:`disco.runtime.allreduce_timing`'s), psum'd together so that the
combiner makes one variadic all-reduce, against one concatenated buffer:

    operand_latency = (t_variadic - t_concat) / (OPERANDS - 1)

XLA:CPU's in-process devices run a variadic all-reduce operand by operand, so the term is
large there (the measurement: docs/archive/lab-notebook.md, "Calibration").

:func:`machine_cluster` is this machine's devices as a ``local`` preset; :func:`cluster_spec` a
calibration across processes as a spec (P nodes x D devices, the fitted link between them).
:mod:`disco.calibrate._compute` measures the compute side across processes: the step's compute
floor (:func:`measure_compute_floor`, :func:`with_compute_floor`) and the simulator's baselines
against measurements (:func:`compare_baselines`).

Example::

    spec, c = machine_cluster(8)                                   # this process's 8 devices
    cal = calibrate(ProcessRunner(2, 4, parse_link("1gbit/0.5ms")))  # 2 workers, an emulated link
    spec = cluster_spec(cal)
"""

from __future__ import annotations

from disco.calibrate._calibrate import calibrate, cluster_spec, machine_cluster
from disco.calibrate._compute import (
    BASELINES,
    compare_baselines,
    measure_compute_floor,
    predicted_compute_s,
    with_compute_floor,
)
from disco.calibrate._fit import MIN_FIT_A, MIN_FIT_B, Calibration, ChainFit, fit, fit_chained, floor_fit, floored_note
from disco.calibrate._runners import (
    ACROSS_CHAIN,
    ACROSS_SIZES,
    CrossCalibration,
    InProcessRunner,
    ProcessRunner,
    Runner,
    Timings,
    chained_medians,
    timings,
)

__all__ = [
    "ACROSS_CHAIN", "ACROSS_SIZES", "BASELINES", "MIN_FIT_A", "MIN_FIT_B", "Calibration", "ChainFit",
    "CrossCalibration", "InProcessRunner", "ProcessRunner", "Runner", "Timings", "calibrate", "chained_medians",
    "cluster_spec", "compare_baselines", "fit", "fit_chained", "floor_fit", "floored_note", "machine_cluster",
    "measure_compute_floor", "predicted_compute_s", "timings", "with_compute_floor",
]

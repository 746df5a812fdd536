"""The calibrator: time all-reduces on a runner, fit the alpha-beta model, write a cluster spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from disco.calibrate._fit import Calibration, fit, fit_chained
from disco.calibrate._runners import CrossCalibration, InProcessRunner, Runner

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec


def calibrate(runner: Runner, *, sizes: Sequence[int] | None = None, reps: int | None = None,
              chain: Sequence[int] | None = None) -> Any:
    """Times all-reduces on ``runner`` and fits the alpha-beta model.

    The lone fit (:func:`fit`) prices one all-reduce per call; with ``chain``, the chained fit
    (:func:`fit_chained`: ``t(k, n) = c + k (a + b n)``) gives the latency and bandwidth instead,
    ``a + b n`` being what each all-reduce of a multi-all-reduce executable costs. The per-operand
    cost is ``(t_variadic - t_concat) / (operands - 1)``; the ``rs_ag`` scale is a reduce-scatter
    plus all-gather of a buffer over one all-reduce of it, timed side by side.

    Args:
      runner: where the all-reduces run (:class:`InProcessRunner`: this process's devices;
        :class:`ProcessRunner`: worker processes, maybe over an emulated link).
      sizes: bytes per device (default: the runner's).
      reps: repetitions per executable (default: the runner's).
      chain: chain lengths, at least two; ``()``: the lone all-reduce per call only (default: the
        runner's: none in this process, 1/2/4/8 across processes).

    Returns:
      :meth:`Runner.result`'s: the :class:`Calibration` in this process, a
      :class:`CrossCalibration` across processes.

    Raises:
      ValueError: fewer than 2 devices in all, bad sizes (fewer than 2 distinct) or chain lengths,
        ``reps`` below 1 (before anything is measured).
      RuntimeError: when the workers fail (their messages).
      PermissionError: a link where network namespaces are not permitted.
    """
    sizes = tuple(runner.sizes if sizes is None else sizes)
    reps = runner.reps if reps is None else reps
    chain = tuple(runner.chain if chain is None else chain)
    runner.check_devices()
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 4 for s in sizes):
        raise ValueError(f"sizes: expected byte counts >= 4, got {sizes!r}")
    if len(set(sizes)) < 2:
        raise ValueError(f"sizes: expected at least 2 distinct byte counts to fit, got {sizes!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: expected an integer >= 1, got {reps!r}")
    if chain and len(set(chain)) < 2:
        raise ValueError(f"chain: expected at least 2 distinct chain lengths (or none), got {chain!r}")
    t = runner.time(sizes, reps, chain)
    lone = fit(t.devices, t.sizes, t.medians_s)
    c = dataclasses.replace(lone, operand_latency=max(0.0, (t.variadic_s - t.concat_s) / (t.operands - 1)),
                            variadic_s=t.variadic_s, concat_s=t.concat_s)
    c = dataclasses.replace(c, rs_ag_s=t.rs_ag_s, rs_ag_all_reduce_s=t.rs_ag_all_reduce_s)  # its rs_ag_scale
    chained = fit_chained(t.devices, t.sizes, t.chain, t.chain_medians_s) if t.chain else None
    if chained is not None:
        c = dataclasses.replace(c, latency=chained.latency, bandwidth=chained.bandwidth, fit_a=chained.fit_a,
                                fit_b=chained.fit_b, floored=chained.floored)
    return runner.result(c, chained, lone if chained else None, t)


def machine_cluster(devices: int, reps: int = 10) -> tuple[Any, Calibration]:
    """This machine's ``devices`` CPU devices as a cluster spec: :func:`calibrate`, then the
    ``local`` preset with the measured link and per-operand costs (what ``disco calibrate --out``
    writes, and what ``disco optimize`` prices plans with when no ``--cluster`` is given).

    Returns:
      (the ClusterSpec, the Calibration it came from).
    """
    from disco.sim.cluster import preset

    c = calibrate(InProcessRunner(devices), reps=reps)
    return preset("local", devices=devices, calibration=c.as_preset_calibration()), c


def cluster_spec(cal: CrossCalibration) -> ClusterSpec:
    """The calibration as a cluster spec: ``processes`` nodes of ``devices_per_process`` devices,
    the fitted link between them (and, for lack of a separate measurement, inside them too),
    a ring, one stream (XLA:CPU runs a gloo all-reduce in the thread that would compute)."""
    from disco.sim.cluster import ClusterSpec, LinkSpec as SimLink

    c = cal.calibration
    link = SimLink(c.bandwidth, c.latency)
    over = f"emulated link {cal.link.label()}" if cal.link else "127.0.0.1 (gloo)"
    fitted = (f"latency and bandwidth of all-reduces chained {'/'.join(map(str, cal.chained.chain))} per call"
              if cal.chained else "latency and bandwidth of one all-reduce per call")
    return ClusterSpec(name=f"testbed-{cal.processes}x{cal.devices_per_process}", nodes=cal.processes,
                       devices_per_node=cal.devices_per_process, intra=link, inter=link, algorithm="ring",
                       operand_latency=c.operand_latency, rs_ag_scale=c.rs_ag_scale, overlap=False,
                       description=f"{cal.processes} processes x {cal.devices_per_process} CPU devices over {over}; "
                                   f"{fitted}",
                       label=f"calibrated across processes on {over}")

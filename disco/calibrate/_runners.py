"""Runners of a calibration: where the all-reduces are timed.

:class:`InProcessRunner` times them over this process's devices; :class:`ProcessRunner` over the
devices of worker processes on loopback or an emulated link (:mod:`disco.runtime.multiprocess`; each
worker runs :func:`~disco.runtime.allreduce_timing.time_all_reduces` over all of them, and the slowest worker's
time is taken per cell). Both return :class:`Timings`, which :func:`disco.calibrate.calibrate`
fits the same way, and each knows its own defaults: across processes the sizes stop at 4 MiB
(a 16 MiB all-reduce over an emulated link takes seconds per repetition) and the all-reduces are
also timed in chains (under load one all-reduce inside an executable of several costs several times
a lone one, so the lone fit prices a step's all-reduces too low; docs/archive/lab-notebook.md, issue 17).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from disco.calibrate._fit import Calibration, ChainFit
from disco.runtime.allreduce_timing import SIZES, time_all_reduces

if TYPE_CHECKING:
    from disco.runtime.testbed import LinkSpec

ACROSS_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
ACROSS_CHAIN = (1, 2, 4, 8)  # chained all-reduces per executable


class Timings(NamedTuple):
    """One calibration's times (the slowest worker's per cell, across processes).

    Attributes:
      devices: the devices the all-reduces span.
      sizes: bytes per device.
      medians_s: one all-reduce per call, median seconds per size.
      variadic_s, concat_s: the variadic all-reduce of ``operands`` parts and their concatenation.
      operands: the variadic all-reduce's operands.
      chain: the chain lengths timed (``()``: none).
      chain_medians_s: ``chain_medians_s[i][j]``: seconds per call for ``sizes[i]`` and ``chain[j]``.
      switch: the emulated switch's statistics of the run, or None.
      rs_ag_all_reduce_s, rs_ag_s: one all-reduce against a reduce-scatter plus all-gather of the
        same buffer (:func:`~disco.runtime.allreduce_timing.measure_rs_ag`), or None (not timed).
    """

    devices: int
    sizes: tuple[int, ...]
    medians_s: tuple[float, ...]
    variadic_s: float
    concat_s: float
    operands: int
    chain: tuple[int, ...] = ()
    chain_medians_s: tuple[tuple[float, ...], ...] = ()
    switch: dict[str, Any] | None = None
    rs_ag_all_reduce_s: float | None = None
    rs_ag_s: float | None = None

    def __repr__(self) -> str:
        chain = "" if not self.chain else f", chains {'/'.join(map(str, self.chain))}"
        return f"Timings({self.devices} devices, {len(self.sizes)} sizes{chain})"


def chained_medians(results: Sequence[dict[str, Any]]) -> tuple[tuple[int, ...], tuple[int, ...],
                                                                    tuple[tuple[float, ...], ...]]:
    """(sizes, chain lengths, seconds per call) of the workers' chained timings
    (:func:`~disco.runtime.allreduce_timing.time_chained`), the slowest worker's per cell.

    Raises:
      RuntimeError: when XLA did not keep k all-reduces in the executable of a chain of k.
    """
    r0 = results[0]
    for r in results:
        for size, counts in zip(r["sizes"], r["chain_all_reduces"]):
            if list(counts) != list(r["chain"]):
                raise RuntimeError(f"chained all-reduces of {size} bytes: expected {r['chain']} all-reduces in the "
                                   f"executables, the compiled ones hold {counts}")
    medians = tuple(tuple(max(r["chain_medians_s"][i][j] for r in results) for j in range(len(r0["chain"])))
                    for i in range(len(r0["sizes"])))
    return tuple(r0["sizes"]), tuple(r0["chain"]), medians


def timings(devices: int, results: Sequence[dict[str, Any]], switch: dict[str, Any] | None = None) -> Timings:
    """The :class:`Timings` of one or more workers' :func:`~disco.runtime.allreduce_timing.time_all_reduces`, the
    slowest per cell."""
    r0 = results[0]
    sizes = tuple(r0["sizes"])
    chain: tuple[int, ...] = ()
    chain_medians: tuple[tuple[float, ...], ...] = ()
    if r0.get("chain"):
        _, chain, chain_medians = chained_medians(results)
    rs_ag = [(r["rs_ag_all_reduce_s"], r["rs_ag_s"]) for r in results if r.get("rs_ag_s") is not None]
    return Timings(devices, sizes, tuple(max(r["medians_s"][i] for r in results) for i in range(len(sizes))),
                   max(r["variadic_s"] for r in results), max(r["concat_s"] for r in results), r0["operands"],
                   chain, chain_medians, switch,
                   max(a for a, _ in rs_ag) if rs_ag else None, max(b for _, b in rs_ag) if rs_ag else None)


class Runner(Protocol):
    """Times the all-reduces of a calibration (the module doc).

    Attributes:
      devices: the devices the all-reduces span.
      sizes, reps, chain: its defaults for a calibration.
    """

    devices: int
    sizes: tuple[int, ...]
    reps: int
    chain: tuple[int, ...]

    def check_devices(self) -> None:
        """Raises ValueError when there are too few devices to calibrate (before anything starts)."""

    def time(self, sizes: tuple[int, ...], reps: int, chain: tuple[int, ...]) -> Timings:
        """Times the all-reduces of ``sizes`` bytes per device, ``reps`` times each."""

    def result(self, calibration: Calibration, chained: ChainFit | None, lone: Calibration | None,
               timed: Timings) -> Any:
        """What :func:`~disco.calibrate.calibrate` returns for this runner."""


@dataclasses.dataclass(frozen=True)
class InProcessRunner:
    """Times all-reduces over ``devices`` devices of this process; a calibration on it returns the
    :class:`~disco.calibrate.Calibration` (a chained fit, when chains are asked for, gives its
    latency and bandwidth)."""

    devices: int
    sizes: tuple[int, ...] = SIZES
    reps: int = 20
    chain: tuple[int, ...] = ()

    def check_devices(self) -> None:
        if self.devices < 2:
            raise ValueError(f"calibration needs at least 2 devices, got {self.devices}")

    def time(self, sizes: tuple[int, ...], reps: int, chain: tuple[int, ...]) -> Timings:
        return timings(self.devices, [time_all_reduces(self.devices, sizes, reps, chain)])

    def result(self, calibration: Calibration, chained: ChainFit | None, lone: Calibration | None,
               timed: Timings) -> Calibration:
        return calibration


@dataclasses.dataclass(frozen=True)
class ProcessRunner:
    """Times all-reduces over the devices of ``processes`` worker processes of
    ``devices_per_process`` CPU devices each, behind ``link`` (None: 127.0.0.1); a calibration on it
    returns a :class:`~disco.calibrate.CrossCalibration`."""

    processes: int
    devices_per_process: int = 1
    link: LinkSpec | None = None
    timeout_s: float = 900
    sizes: tuple[int, ...] = ACROSS_SIZES
    reps: int = 10
    chain: tuple[int, ...] = ACROSS_CHAIN

    def __repr__(self) -> str:
        over = "127.0.0.1" if self.link is None else self.link.label()[:60]
        return f"ProcessRunner({self.processes} x {self.devices_per_process} devices over {over})"

    @property
    def devices(self) -> int:
        return self.processes * self.devices_per_process

    def check_devices(self) -> None:
        if self.devices < 2:
            raise ValueError(f"calibration needs at least 2 devices in all, got {self.processes} processes x "
                             f"{self.devices_per_process} devices")

    def time(self, sizes: tuple[int, ...], reps: int, chain: tuple[int, ...]) -> Timings:
        from disco.runtime import multiprocess

        spec = multiprocess.WorkerSpec(task="calibrate", sizes=tuple(sizes), reps=reps, chain=tuple(chain))
        res = multiprocess.launch(self.processes, self.devices_per_process, spec, link=self.link,
                                  timeout_s=self.timeout_s)
        res.raise_if_failed("calibration across processes")
        return timings(self.devices, res.results, res.link_info().get("switch"))

    def result(self, calibration: Calibration, chained: ChainFit | None, lone: Calibration | None,
               timed: Timings) -> Any:
        return CrossCalibration(self.processes, self.devices_per_process, self.link, calibration, timed.switch,
                                chained=chained, lone=lone)


@dataclasses.dataclass(frozen=True)
class CrossCalibration:
    """A calibration across processes.

    Attributes:
      processes, devices_per_process: the workers and each one's devices.
      link: the emulated link (None: 127.0.0.1).
      calibration: the fit (:class:`~disco.calibrate.Calibration`) over ``processes * devices_per_process``
        devices, with the operand latency.
      switch: the emulated switch's statistics of the run (packets, lateness), or None.
      chained: the chained fit (:func:`~disco.calibrate.fit_chained`) that ``calibration``'s latency and bandwidth
        come from, or None (a calibration of lone all-reduces, ``chain=()``).
      lone: the fit of the lone all-reduce per call (the ``k = 1`` medians), kept for comparison
        when ``chained`` is set; otherwise None (it is ``calibration``).
    """

    processes: int
    devices_per_process: int
    link: LinkSpec | None
    calibration: Calibration
    switch: dict[str, Any] | None = None
    chained: ChainFit | None = None
    lone: Calibration | None = None

    def to_dict(self) -> dict[str, Any]:
        c = self.calibration
        out: dict[str, Any] = {
            "processes": self.processes, "devices_per_process": self.devices_per_process,
            "link": self.link.to_dict() if self.link else "loopback", **c.to_dict(),
            "fitted_bandwidth_bps": c.bandwidth * 8, "fitted_latency_us": c.latency * 1e6,
            "operand_latency_us": c.operand_latency * 1e6, "switch": self.switch,
            "fit": "chained" if self.chained else "lone",
            "chained": self.chained.to_dict() if self.chained else None,
            "lone": ({"latency_us": self.lone.latency * 1e6, "bandwidth_bps": self.lone.bandwidth * 8,
                      "fit_a": self.lone.fit_a, "fit_b": self.lone.fit_b} if self.lone else None),
        }
        if self.link is not None:
            out["bandwidth_over_link_rate"] = c.bandwidth * 8 / self.link.rate_bps
            out["latency_over_link_delay"] = c.latency / self.link.delay_s if self.link.delay_s else None
        return out

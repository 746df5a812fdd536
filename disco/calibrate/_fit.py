"""The alpha-beta fits of measured all-reduce times: one all-reduce per call (:func:`fit`) and
executables of ``k`` chained all-reduces (:func:`fit_chained`), and the floors of their terms."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

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
    rs_ag_s: float | None = None  # a reduce-scatter plus all-gather of a buffer, median
    rs_ag_all_reduce_s: float | None = None  # one all-reduce of it beside the pair, median

    @property
    def rs_ag_scale(self) -> float:
        """The reduce-scatter plus all-gather over the all-reduce of the same buffer; 1.0 when not timed."""
        if self.rs_ag_s is None or not self.rs_ag_all_reduce_s:
            return 1.0
        return self.rs_ag_s / self.rs_ag_all_reduce_s

    def as_preset_calibration(self) -> dict[str, float]:
        return {"latency": self.latency, "bandwidth": self.bandwidth, "operand_latency": self.operand_latency,
                "rs_ag_scale": self.rs_ag_scale}

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "rs_ag_scale": self.rs_ag_scale}


def fit(devices: int, sizes: Sequence[int], times: Sequence[float]) -> Calibration:
    """Least-squares fit of ``t = a + b n`` in relative error, and the ring parameters it implies.

    Relative, not absolute, error: an absolute fit is ruled by the largest sizes and prices
    small all-reduces far below their measured time, so one all-reduce per gradient would look
    cheap where it is the slowest plan (docs/archive/lab-notebook.md, "Calibration").

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


@dataclasses.dataclass(frozen=True)
class ChainFit:
    """The fit ``t(k, n) = call_s + k (fit_a + fit_b n)`` of executables of ``k`` chained
    all-reduces of ``n`` bytes per device, and the ring parameters of ``fit_a + fit_b n``.

    Attributes:
      devices: the devices the all-reduces span.
      sizes, chain: the bytes per device and the chain lengths measured.
      medians_s: ``medians_s[i][j]``: seconds per call for ``sizes[i]`` and ``chain[j]``.
      call_s: the per-call overhead (>= 0), paid once per executable.
      fit_a, fit_b: seconds per all-reduce and per byte of one, inside a chain.
      latency, bandwidth: per ring step (seconds) and per link (bytes/s).
      floored: the fitted terms raised to their floor (:func:`floor_fit`).
    """

    devices: int
    sizes: tuple[int, ...]
    chain: tuple[int, ...]
    medians_s: tuple[tuple[float, ...], ...]
    call_s: float
    fit_a: float
    fit_b: float
    latency: float
    bandwidth: float
    floored: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "per_all_reduce_1kib_s": self.fit_a + self.fit_b * 1024}


def fit_chained(devices: int, sizes: Sequence[int], chain: Sequence[int],
                medians: Sequence[Sequence[float]]) -> ChainFit:
    """Non-negative least squares, in relative error, of ``t(k, n) = c + k (a + b n)`` over every
    measured (size, chain length) pair; the ring parameters as in :func:`fit`.

    Raises:
      ValueError: fewer than 2 devices, a grid that does not match ``sizes`` x ``chain``, fewer
        than 2 chain lengths or 2 sizes, or a time that is not positive.
    """
    import numpy as np
    from scipy.optimize import nnls

    if devices < 2:
        raise ValueError(f"calibration needs at least 2 devices, got {devices}")
    if len(set(chain)) < 2 or len(set(sizes)) < 2:
        raise ValueError(f"a chained fit needs at least 2 chain lengths and 2 sizes, got chain {tuple(chain)!r}, "
                         f"sizes {tuple(sizes)!r}")
    if len(medians) != len(sizes) or any(len(row) != len(chain) for row in medians):
        raise ValueError(f"medians: expected {len(sizes)} rows (sizes) of {len(chain)} (chain lengths), got "
                         f"{[len(row) for row in medians]}")
    k = np.array([kk for _ in sizes for kk in chain], dtype=np.float64)
    n = np.array([nn for nn in sizes for _ in chain], dtype=np.float64)
    t = np.array([v for row in medians for v in row], dtype=np.float64)
    if not np.all(t > 0):
        raise ValueError(f"medians: expected positive seconds, got {medians!r}")
    a_mat = np.stack([np.ones_like(k), k, k * n], axis=1) / t[:, None]  # rows scaled by 1/t: relative error
    (c, a, b), _ = nnls(a_mat, np.ones_like(t))
    a, b, floored = floor_fit(float(a), float(b))
    p = devices
    return ChainFit(devices, tuple(int(s) for s in sizes), tuple(int(kk) for kk in chain),
                    tuple(tuple(float(v) for v in row) for row in medians), call_s=float(c), fit_a=a, fit_b=b,
                    latency=a / (2 * (p - 1)), bandwidth=2 * (p - 1) / (p * b), floored=floored)

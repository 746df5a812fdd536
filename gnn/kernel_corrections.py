"""Measured corrections: what the per-kernel GNN got wrong on the kernels it was trained on, by kernel.

A kernel the training data measured is not a stranger: the same fused computation (the same
:func:`gnn.kernel_features.fingerprint`, i.e. equal graphs apart from the step's context) shows up
in other models and other steps, from an optimizer update of a common shape to a layer norm of a
common width. For each such fingerprint the table keeps the median of ``measured - predicted`` log
seconds over its training examples; a prediction for a kernel with a known fingerprint adds it.
The network still supplies the context (the step's input bytes), so a kernel measured in small
steps and priced in a large one keeps the network's context effect.

Held out by model (``scripts/tools/kernel_lomo.py``), 41% of a model's kernels have a fingerprint that
another model's profiles hold (docs/archive/lab-notebook.md, "The per-kernel GNN with measured corrections").

Example:
  >>> table = fit_corrections(measured_log_s, predicted_log_s, graphs)  # doctest: +SKIP
  >>> log_s = corrected(predicted_log_s, graphs, table)                   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gnn import kernel_features as KF


def fit_corrections(measured_log_s: Sequence[float], predicted_log_s: Sequence[float],
                    graphs: Sequence[KF.KernelGraph]) -> dict[str, float]:
    """Fingerprint -> median of measured minus predicted log seconds over the examples with it.

    Raises:
      ValueError: for sequences of different lengths or a non-finite value.
    """
    meas, pred = np.asarray(measured_log_s, np.float64), np.asarray(predicted_log_s, np.float64)
    if not meas.shape == pred.shape == (len(graphs),):
        raise ValueError(f"fit_corrections: expected one measured and one predicted value per graph "
                         f"({len(graphs)}), got shapes {meas.shape} and {pred.shape}")
    if not (np.isfinite(meas).all() and np.isfinite(pred).all()):
        raise ValueError("fit_corrections: expected finite log seconds, got NaN or infinity")
    residuals: dict[str, list[float]] = {}
    for g, m, p in zip(graphs, meas, pred):
        residuals.setdefault(KF.fingerprint(g), []).append(m - p)
    return {fp: round(float(np.median(r)), 6) for fp, r in sorted(residuals.items())}


def corrected(log_s: Sequence[float], graphs: Sequence[KF.KernelGraph], table: Mapping[str, float]) -> np.ndarray:
    """``log_s`` plus each graph's correction (0 for a fingerprint not in ``table``)."""
    out = np.asarray(log_s, np.float64).copy()
    if table:
        out += [table.get(KF.fingerprint(g), 0.0) for g in graphs]
    return out


def check_table(table: object, where: str) -> dict[str, float]:
    """A corrections table read from a file, checked.

    Raises:
      ValueError: for anything but an object of 16-hex-digit keys and finite numbers.
    """
    if not isinstance(table, dict):
        raise ValueError(f"{where}: corrections: expected an object, got {type(table).__name__}")
    out = {}
    for k, v in table.items():
        ok_key = isinstance(k, str) and len(k) == 16 and all(c in "0123456789abcdef" for c in k)
        if not ok_key or isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ValueError(f"{where}: corrections: expected 16-hex-digit fingerprints mapped to finite "
                             f"numbers, got {k!r}: {v!r}")
        out[k] = float(v)
    return out

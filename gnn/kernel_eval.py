"""Judging a per-kernel model on held-out records: ranking, relative error, step sums, variant order.

For a record and per-launch predictions of all its kernels:

* per kernel (each profiled op): Kendall's tau between predicted and measured seconds per
  launch, the median and 90th percentile of ``|predicted / measured - 1|``;
* per record: the step's device time, every kernel's prediction times its executions summed,
  against the measured sum of every kernel of the traces;
* per (model, preset): whether the variants are ranked by predicted step as they are by measured.

Example:
  >>> m = record_metrics(record, per_launch_seconds)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gnn import kernel_data as KD
from gnn import kernel_features as KF
from gnn.metrics import kendall_tau


def record_metrics(record: KD.Record, per_launch_s: np.ndarray) -> dict[str, Any]:
    """Per-kernel and step metrics of one record from each kernel's predicted seconds per launch.

    Raises:
      ValueError: for a prediction array of the wrong length.
    """
    per_launch_s = np.asarray(per_launch_s, np.float64)
    if per_launch_s.shape != (len(record.names),):
        raise ValueError(f"record_metrics: expected {len(record.names)} predictions for {record.key}, "
                         f"got shape {per_launch_s.shape}")
    idx = record.index()
    ops = record.profiled_ops()
    pred = np.array([per_launch_s[idx[op]] for op in ops])
    meas = np.array([record.labels[op].per_launch for op in ops])
    rel = np.abs(pred / meas - 1.0)
    step = float((per_launch_s * record.executions).sum())
    return {"record": record.key, "kernels": len(ops), "tau": kendall_tau(pred, meas),
            "median_rel_err": float(np.median(rel)), "p90_rel_err": float(np.percentile(rel, 90)),
            "rel_err": rel, "pred": pred, "meas": meas,
            "step_pred_s": step, "step_meas_s": record.step_s, "step_rel_err": step / record.step_s - 1.0}


def variant_order(metrics: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model/preset: variants ordered by measured and by predicted step, and whether they agree."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for m in metrics:
        model, preset, _ = m["record"].split("/")
        groups.setdefault(f"{model}/{preset}", []).append(m)
    out = {}
    for g, ms in sorted(groups.items()):
        by_meas = [m["record"].split("/")[2] for m in sorted(ms, key=lambda m: m["step_meas_s"])]
        by_pred = [m["record"].split("/")[2] for m in sorted(ms, key=lambda m: m["step_pred_s"])]
        out[g] = {"measured": by_meas, "predicted": by_pred, "agree": by_meas == by_pred}
    return out


def pooled(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Kernel metrics over all the records' kernels together, and the worst step error."""
    rel = np.concatenate([m["rel_err"] for m in metrics])
    pred = np.concatenate([m["pred"] for m in metrics])
    meas = np.concatenate([m["meas"] for m in metrics])
    steps = np.array([m["step_rel_err"] for m in metrics])
    return {"kernels": int(rel.size), "tau": kendall_tau(pred, meas), "median_rel_err": float(np.median(rel)),
            "p90_rel_err": float(np.percentile(rel, 90)), "max_abs_step_err": float(np.abs(steps).max()),
            "steps_within_10pct": int((np.abs(steps) <= 0.10).sum()), "records": len(metrics)}


def summary(name: str, metrics: Sequence[dict[str, Any]]) -> str:
    """One line of :func:`pooled` figures and the variant order, as the scripts print them."""
    pm = pooled(metrics)
    agree = [v["agree"] for v in variant_order(metrics).values()]
    return (f"{name}: pooled over {pm['kernels']} kernels: tau {pm['tau']:.3f}, median error "
            f"{pm['median_rel_err']:.1%}, p90 {pm['p90_rel_err']:.1%}; steps within 10%: "
            f"{pm['steps_within_10pct']}/{pm['records']} (worst {pm['max_abs_step_err']:.1%}); "
            f"variant order as measured: {sum(agree)}/{len(agree)} model/preset groups")


def measured_share(records: Sequence[KD.Record], corrections: Mapping[str, float]) -> tuple[int, int]:
    """(profiled kernels whose fingerprint ``corrections`` holds, all profiled kernels) of ``records``."""
    known = total = 0
    for r in records:
        idx = r.index()
        ops = r.profiled_ops()
        known += sum(KF.fingerprint(r.graphs[idx[op]]) in corrections for op in ops)
        total += len(ops)
    return known, total


def fit_launch(roofline_s: np.ndarray, measured_s: np.ndarray, grid: np.ndarray | None = None) -> float:
    """The launch seconds L minimising the median of ``|(roofline + L) / measured - 1|`` over a grid."""
    grid = np.concatenate([[0.0], np.geomspace(1e-7, 1e-4, 121)]) if grid is None else grid
    roofline_s, measured_s = np.asarray(roofline_s, np.float64), np.asarray(measured_s, np.float64)
    errs = [np.median(np.abs((roofline_s + L) / measured_s - 1.0)) for L in grid]
    return float(grid[int(np.argmin(errs))])

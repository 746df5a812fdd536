"""Judging cost models by ranking: Kendall's tau, MAPE and top-k regret within each group.

A *group* is one model/preset/devices step; plans are only compared within a group.

* ``tau``: mean over groups of Kendall's tau-b between predicted and measured times.
* ``mape``: mean absolute percentage error of predicted milliseconds over all samples.
* ``top1_regret`` / ``top5_regret``: per group, how much slower the measured time of the
  predicted-best plan (best of the predicted top 5) is than the measured-best plan,
  ``measured(chosen) / measured(best) - 1``; averaged over groups (``*_max``: worst group).

Example:
  >>> ranking_metrics(ds, test_idx, predicted)  # doctest: +SKIP
  {'tau': 0.91, 'top1_regret': 0.004, ...}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (scipy's when installed, else an O(n^2) fallback); nan for < 2 items."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2:
        return float("nan")
    try:
        from scipy.stats import kendalltau
    except ImportError:  # pragma: no cover - scipy is in the venv
        dx = np.sign(x[:, None] - x[None, :])
        dy = np.sign(y[:, None] - y[None, :])
        iu = np.triu_indices(x.size, 1)
        dx, dy = dx[iu], dy[iu]
        denom = math.sqrt(float((dx != 0).sum()) * float((dy != 0).sum()))
        return float((dx * dy).sum() / denom) if denom else float("nan")
    t = kendalltau(x, y).statistic
    return float(t)


def group_metrics(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """tau, top-1 and top-5 regret of one group's predictions (any monotone scale)."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    order = np.argsort(p, kind="stable")
    best = m.min()
    return {"tau": kendall_tau(p, m), "top1_regret": float(m[order[0]] / best - 1.0),
            "top5_regret": float(m[order[:5]].min() / best - 1.0), "n": int(p.size)}


def ranking_metrics(ds: Any, idx: Sequence[int], predicted: Sequence[float],
                    predicted_ms: Sequence[float] | None = None) -> dict[str, Any]:
    """Per-group and mean ranking metrics of ``predicted`` for samples ``idx`` of ``ds``.

    Args:
      ds: a :class:`gnn.train.Dataset`.
      idx: sample indices.
      predicted: a score per sample (lower = faster), e.g. log time.
      predicted_ms: predicted milliseconds for MAPE (omitted: no MAPE).

    Returns:
      ``{"tau", "top1_regret", "top1_regret_max", "top5_regret", "mape", "n", "groups": {...}}``.
    """
    by_group: dict[str, list[int]] = {}
    for j, i in enumerate(idx):
        by_group.setdefault(ds.samples[i].group, []).append(j)
    groups = {}
    for g, js in sorted(by_group.items()):
        meas = [ds.samples[idx[j]].median_ms for j in js]
        groups[g] = group_metrics([predicted[j] for j in js], meas)
    taus = [v["tau"] for v in groups.values() if math.isfinite(v["tau"])]
    out: dict[str, Any] = {
        "tau": float(np.mean(taus)) if taus else float("nan"),
        "top1_regret": float(np.mean([v["top1_regret"] for v in groups.values()])) if groups else float("nan"),
        "top1_regret_max": float(max((v["top1_regret"] for v in groups.values()), default=float("nan"))),
        "top5_regret": float(np.mean([v["top5_regret"] for v in groups.values()])) if groups else float("nan"),
        "n": len(idx), "groups": groups}
    if predicted_ms is not None:
        meas = np.array([ds.samples[i].median_ms for i in idx])
        out["mape"] = float(np.mean(np.abs(np.asarray(predicted_ms) - meas) / meas))
    return out


def analytic_predictions(ds: Any, idx: Sequence[int], costs: Any = None) -> np.ndarray:
    """Simulated step milliseconds of samples ``idx`` under ``costs`` (default AnalyticCosts)."""
    from disco.cluster import preset
    from disco.costs import AnalyticCosts
    from disco.simulator import Simulator

    costs = costs or AnalyticCosts()
    sims: dict[tuple[str, int], Simulator] = {}
    out = []
    for i in idx:
        s = ds.samples[i]
        key = (s.fingerprint, s.devices)
        if key not in sims:
            sims[key] = Simulator(ds.graphs[s.fingerprint], costs, preset("local", s.devices))
        out.append(sims[key].step_time(s.plan) * 1e3)
    return np.array(out)


def evaluate_gnn(model: Any, ds: Any, idx: Sequence[int]) -> dict[str, Any]:
    """GNN metrics on samples ``idx``: the graph head (ranking, MAPE with the round's measured
    xla_default as reference) and the kernel head alone (absolute MAPE, no reference)."""
    from gnn.train import predict

    abs_log, rel = predict(model, [ds.features(i) for i in idx])
    ref = np.array([ds.samples[i].ref_ms for i in idx])
    out = ranking_metrics(ds, idx, rel, np.exp(rel) * ref)
    kern = ranking_metrics(ds, idx, abs_log, np.exp(abs_log) * 1e3)
    out["kernel_head"] = {k: kern[k] for k in ("tau", "top1_regret", "top5_regret", "mape")}
    return out


def evaluate_analytic(ds: Any, idx: Sequence[int]) -> dict[str, Any]:
    """AnalyticCosts + simulator metrics on samples ``idx`` (MAPE of its raw, uncalibrated ms)."""
    ms = analytic_predictions(ds, idx)
    return ranking_metrics(ds, idx, ms, ms)


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of a metrics dict (no per-group detail)."""
    return {k: metrics[k] for k in ("tau", "mape", "top1_regret", "top1_regret_max", "top5_regret", "n")
            if k in metrics}

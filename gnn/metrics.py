"""Ranking metrics of predicted step times against measured ones (pure numpy; no model here).

Below both training (validation tau) and evaluation, which import them.
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
    raw_taus = []
    for g, js in sorted(by_group.items()):
        meas = [ds.samples[idx[j]].norm_ms for j in js]
        groups[g] = group_metrics([predicted[j] for j in js], meas)
        raw_taus.append(kendall_tau([predicted[j] for j in js], [ds.samples[idx[j]].median_ms for j in js]))
    taus = [v["tau"] for v in groups.values() if math.isfinite(v["tau"])]
    raw_taus = [t for t in raw_taus if math.isfinite(t)]
    out: dict[str, Any] = {
        "tau": float(np.mean(taus)) if taus else float("nan"),
        "tau_raw": float(np.mean(raw_taus)) if raw_taus else float("nan"),
        "top1_regret": float(np.mean([v["top1_regret"] for v in groups.values()])) if groups else float("nan"),
        "top1_regret_max": float(max((v["top1_regret"] for v in groups.values()), default=float("nan"))),
        "top5_regret": float(np.mean([v["top5_regret"] for v in groups.values()])) if groups else float("nan"),
        "n": len(idx), "groups": groups}
    if predicted_ms is not None and not len(idx):
        out["mape"] = float("nan")
    elif predicted_ms is not None:
        meas = np.array([ds.samples[i].norm_ms for i in idx])
        out["mape"] = float(np.mean(np.abs(np.asarray(predicted_ms) - meas) / meas))
    return out

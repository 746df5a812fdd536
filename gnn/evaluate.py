"""Judging cost models by ranking: Kendall's tau, MAPE and top-k regret within each group.

A *group* is one model/preset/devices step; plans are only compared within a group.
"Measured" is the drift-normalised time :attr:`gnn.train.Sample.norm_ms` (each plan's
median relative to xla_default measured in the same rounds); ``tau_raw`` uses the raw
medians, which also carry the machine's drift between measuring chunks.

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


from gnn.metrics import group_metrics, kendall_tau, ranking_metrics  # noqa: F401 - re-exported


def analytic_predictions(ds: Any, idx: Sequence[int], costs: Any = None) -> np.ndarray:
    """Simulated step milliseconds of samples ``idx`` under ``costs`` (default AnalyticCosts)."""
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

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


def noise_ceiling(ds: Any, idx: Sequence[int], *, rounds: int = 3, trials: int = 200,
                  seed: int = 0) -> dict[str, float]:
    """The Kendall tau a perfect predictor could expect against these noisy measurements.

    Each sample's normalised time is taken as the truth; a re-measurement is simulated as the
    median of ``rounds`` normal draws whose standard deviation is the sample's own measured
    range (max - min over its rounds) / d2, d2 being the expected range of ``rounds`` standard
    normals (1.69 for 3). The result is the mean tau between truth and re-measurement, per group
    and averaged. It covers only the noise within a measuring chunk (drift between chunks is
    normalised away), so the real ceiling is lower still. A group of one sample has no tau and
    is left out; ``"mean"`` is nan when no group has two samples.
    """
    d2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326}.get(rounds, 2.5)
    rng = np.random.default_rng(seed)
    by_group: dict[str, list[int]] = {}
    for i in idx:
        by_group.setdefault(ds.samples[i].group, []).append(i)
    out: dict[str, float] = {}
    for g, members in sorted(by_group.items()):
        s = [ds.samples[i] for i in members]
        truth = np.array([x.norm_ms for x in s])
        sd = np.array([(x.max_ms - x.min_ms) / d2 * x.norm_ms / x.median_ms for x in s])
        taus = [kendall_tau(truth, np.median(truth[:, None] + sd[:, None] * rng.standard_normal((len(s), rounds)),
                                             axis=1)) for _ in range(trials)]
        taus = [t for t in taus if math.isfinite(t)]
        if taus:  # none for a group of one sample: it has no tau
            out[g] = float(np.mean(taus))
    out["mean"] = float(np.mean(list(out.values()))) if out else float("nan")
    return out


def evaluate_gnn(model: Any, ds: Any, idx: Sequence[int]) -> dict[str, Any]:
    """GNN metrics on samples ``idx``: the graph head (ranking; MAPE with the group's typical
    measured xla_default time as the scale) and the kernel head alone (absolute MAPE)."""
    from gnn.inference import predict

    abs_log, rel = predict(model, [ds.features(i) for i in idx])
    ref = np.array([ds.samples[i].group_ref_ms for i in idx])
    out = ranking_metrics(ds, idx, rel, np.exp(rel) * ref)
    kern = ranking_metrics(ds, idx, abs_log, np.exp(abs_log) * 1e3)
    out["kernel_head"] = {k: kern[k] for k in ("tau", "top1_regret", "top5_regret", "mape")}
    return out


def evaluate_gnn_simulated(costs: Any, ds: Any, idx: Sequence[int]) -> dict[str, Any]:
    """The GNN as the search uses it: its kernel head inside the simulator (``costs``, a
    :class:`gnn.cost_model.GnnCosts`), with alpha-beta collectives of the ``local`` cluster;
    metrics of the simulated ms."""
    ms = analytic_predictions(ds, idx, costs)
    return ranking_metrics(ds, idx, ms, ms)


def evaluate_analytic(ds: Any, idx: Sequence[int]) -> dict[str, Any]:
    """AnalyticCosts + simulator metrics on samples ``idx`` (MAPE of its raw, uncalibrated ms)."""
    ms = analytic_predictions(ds, idx)
    return ranking_metrics(ds, idx, ms, ms)


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of a metrics dict (no per-group detail)."""
    return {k: metrics[k] for k in ("tau", "tau_raw", "mape", "top1_regret", "top1_regret_max", "top5_regret", "n")
            if k in metrics}

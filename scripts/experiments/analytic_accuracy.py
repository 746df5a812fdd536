"""The analytic cost model's accuracy against measured step times in a collector dataset.

    python scripts/experiments/analytic_accuracy.py --data DIR [--cluster FILE] [--json]

For every (model, preset, devices) group of samples: Kendall's tau between the simulated step
time (AnalyticCosts + simulator on the ``local`` preset, or ``--cluster``) and the measured
median, the mean absolute percentage error of the raw simulated milliseconds, and the top-1
regret (how much slower the plan the simulator ranks first measured than the measured best).
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--cluster", help="a cluster YAML for the simulator (default: preset local)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import numpy as np

    from disco.sim.cluster import load_cluster
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator
    from gnn import evaluate, train

    ds = train.load_dataset(args.data)
    idx = list(range(len(ds.samples)))
    if args.cluster:
        spec = load_cluster(args.cluster)
        sims = {}
        ms = []
        for i in idx:
            s = ds.samples[i]
            if s.fingerprint not in sims:
                sims[s.fingerprint] = Simulator(ds.graphs[s.fingerprint], AnalyticCosts(),
                                                spec.replace(devices_per_node=s.devices))
            ms.append(sims[s.fingerprint].step_time(s.plan) * 1e3)
        ms = np.array(ms)
    else:
        ms = evaluate.analytic_predictions(ds, idx)
    out = {"samples": len(idx), "skipped_lines": ds.skipped, "groups": {}}
    for group, members in ds.groups().items():
        meas = np.array([ds.samples[i].norm_ms for i in members])  # drift-normalised (gnn.evaluate)
        pred = ms[members]
        g = evaluate.group_metrics(pred, meas)
        g["tau_raw"] = evaluate.kendall_tau(pred, [ds.samples[i].median_ms for i in members])
        g["noise_ceiling_tau"] = evaluate.noise_ceiling(ds, members)["mean"]
        g["mape"] = float(np.mean(np.abs(pred - meas) / meas))
        out["groups"][group] = g
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['samples']} samples")
    print("| group | samples | Kendall tau (normalised / raw) | noise ceiling | MAPE | top-1 regret |")
    print("|---|---|---|---|---|---|")
    for group, g in out["groups"].items():
        print(f"| {group} | {g['n']} | {g['tau']:.3f} / {g['tau_raw']:.3f} | {g['noise_ceiling_tau']:.2f} | "
              f"{g['mape'] * 100:.1f}% | {g['top1_regret'] * 100:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay a kept corrections file: the correction pooled over steps against each step's own compute weight.

Refits, offline, the points one machine kept (``disco optimize`` wrote them: each plan's simulated
features and its measured drift-free seconds) and prints, per step, the median relative error and
Kendall tau of the predictions against the measurements, for the correction with one compute weight
shared by every step (``graph=None``) and with each step's own (``graph=<its fingerprint>``;
:func:`disco.calibrate.correction.fit`). Nothing is measured; the figures are as measured as the
points are.

    PYTHONPATH=. python scripts/tools/replay_corrections.py corrections.json
        # a second run of each step: each point predicted from every other point kept (its own left out)
    PYTHONPATH=. python scripts/tools/replay_corrections.py corrections.json --runs zoo.json
        # each step's first run, as it ran: each point from the steps kept before it and its own
        # earlier funnel rounds (``--runs``: what optimize_zoo.py --out wrote for the same runs, in order)

The file must hold one machine (``--machine`` picks one by its key otherwise). In the second-run
mode, tau is printed but means little among plans within noise: leaving a point out of a fit that
holds its step's own compute weight moves the prediction away from that point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _points(path: str, machine: str | None):
    from disco.calibrate import correction as corr

    with open(path, encoding="utf-8") as f:
        machines = json.load(f)["machines"]
    if machine is None and len(machines) != 1:
        raise ValueError(f"{path} holds {len(machines)} machines; pick one with --machine: {sorted(machines)}")
    entry = machines[machine] if machine is not None else next(iter(machines.values()))
    return [corr.Point(g, p, tuple(f), m) for g, p, f, m in entry["points"]]


def _figures(predicted, measured) -> tuple[float, float]:
    from scipy.stats import kendalltau

    err = statistics.median(abs(a - b) / b for a, b in zip(predicted, measured))
    tau = kendalltau(predicted, measured).statistic if len(predicted) > 2 else float("nan")
    return tau, err


def second_run(points) -> dict[str, dict[str, tuple[float, float]]]:
    """Per step (fingerprint): {"pooled"|"own": (tau, median error)}, each point predicted from all others."""
    from disco.calibrate import correction as corr

    out = {}
    for g in dict.fromkeys(p.graph for p in points):
        mine = [p for p in points if p.graph == g]
        out[g] = {}
        for name, graph in (("pooled", None), ("own", g)):
            state = corr.init(points, graph)
            out[g][name] = _figures([state.predict(p.features, exclude=p.key) for p in mine],
                                    [p.measured_s for p in mine])
    return out


def first_runs(points, rounds: list[list[int]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per step, in the order kept, with ``rounds[i]`` the sizes of step i's funnel rounds: each
    point predicted from the earlier steps' points and its own earlier rounds' (none: left out)."""
    from disco.calibrate import correction as corr

    graphs = list(dict.fromkeys(p.graph for p in points))
    if len(graphs) != len(rounds):
        raise ValueError(f"the file holds {len(graphs)} steps, --runs {len(rounds)}")
    out = {}
    for g, sizes in zip(graphs, rounds):
        idx = [i for i, p in enumerate(points) if p.graph == g]
        if len(idx) != sum(sizes):
            raise ValueError(f"step {g[:12]}: {len(idx)} points kept, its rounds measured {sum(sizes)}")
        which = [r for r, n in enumerate(sizes) for _ in range(n)]
        out[g] = {}
        for name, graph in (("pooled", None), ("own", g)):
            pairs = []
            for j, i in enumerate(idx):
                before = points[:idx[0]] + [points[idx[q]] for q in range(len(idx)) if which[q] < which[j]]
                if before:
                    pairs.append((corr.init(before, graph).predict(points[i].features), points[i].measured_s))
            out[g][name] = _figures([a for a, _ in pairs], [b for _, b in pairs]) if pairs else (float("nan"),) * 2
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="a kept corrections file (disco-corrections JSON)")
    ap.add_argument("--runs", help="optimize_zoo.py --out JSON of the runs that kept the points: replay them round by round")
    ap.add_argument("--machine", help="the machine key, when the file holds several")
    args = ap.parse_args(argv)
    try:
        points = _points(args.file, args.machine)
        names = None
        if args.runs:
            with open(args.runs, encoding="utf-8") as f:
                runs = json.load(f)
            names = list(runs)
            rounds = [[len(r["measured"]) for r in runs[m]["learning"]["rounds"]] for m in names]
            table = first_runs(points, rounds)
        else:
            table = second_run(points)
    except (OSError, ValueError, KeyError) as e:
        print(f"replay_corrections: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print("| step | pooled: tau, median error | own compute weight: tau, median error |")
    print("|---|---|---|")
    for n, (g, row) in enumerate(table.items()):
        label = names[n] if names else g[:12]
        cells = " | ".join(f"{row[k][0]:.3f}, {100 * row[k][1]:.1f}%" for k in ("pooled", "own"))
        print(f"| {label} | {cells} |")
    for k in ("pooled", "own"):
        errs = [row[k][1] for row in table.values() if row[k][1] == row[k][1]]
        print(f"{k}: median error within 10% on {sum(e <= 0.10 for e in errs)} of {len(errs)} steps, "
              f"median over steps {100 * statistics.median(errs):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

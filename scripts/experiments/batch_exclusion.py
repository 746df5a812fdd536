"""A second run's first round, predicted as it ran (each plan's own kept point left out in turn) and
with one state for the whole round (every point of the round's plans left out).

    PYTHONPATH=. python scripts/experiments/batch_exclusion.py FIRST.json SECOND.json SECOND_RUNS.json

``FIRST.json``: the corrections file as the first run of the zoo left it; ``SECOND.json``: as the
second run (from a copy of it) left it; ``SECOND_RUNS.json``: ``optimize_zoo.py --out`` of the second
run. Each model's starting state is rebuilt offline: the first run's points, updated with the second
run's points of the models that ran before it (as they are in ``SECOND.json`` at the end: a plan a
later model measured again is not there, so the rebuilt predictions are close to the reported ones,
not equal; the script prints the largest difference). Nothing is measured; the figures are as
measured as the points and rows are. Tau and median error against each row's measured median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _points(path):
    from disco.calibrate import correction as corr

    with open(path, encoding="utf-8") as f:
        machines = json.load(f)["machines"]
    if len(machines) != 1:
        raise ValueError(f"{path} holds {len(machines)} machines; expected one")
    return [corr.Point(g, p, tuple(x), m) for g, p, x, m in next(iter(machines.values()))["points"]]


def main(argv: list[str] | None = None) -> int:
    from scipy.stats import kendalltau

    from disco.calibrate import correction as corr

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("runs")
    args = ap.parse_args(argv)
    first, second = _points(args.first), _points(args.second)
    with open(args.runs, encoding="utf-8") as f:
        runs = json.load(f)
    by_graph: dict[str, list] = {}
    for p in second:
        by_graph.setdefault(p.graph, []).append(p)
    before: list[str] = []
    figures: dict[str, list[tuple[float, float]]] = {"each own left out": [], "the round's left out": []}
    print("| model | plans | rebuilt vs reported, largest difference | each own point left out: tau, median error "
          "| the round's points left out: tau, median error |")
    print("|---|---|---|---|---|")
    for model, run in runs.items():
        g = run["graph"]["fingerprint"]
        rows = {r["name"]: r for r in run["rows"]}
        start = list(first)
        for done in before:
            newer = {p.key: p for p in by_graph[done]}
            start = [newer.pop(p.key, p) for p in start] + list(newer.values())
        features = {p.key: p.features for p in [*by_graph.get(g, []), *start] if p.graph == g}
        names = [n for n in run["learning"]["rounds"][0]["measured"] if (g, rows[n]["plan_digest"]) in features]
        keys = [(g, rows[n]["plan_digest"]) for n in names]
        measured = [rows[n]["measured_median_ms"] for n in names]
        state = corr.init(start, g)
        own = [1e3 * state.predict(features[k], exclude=k) for k in keys]
        batch = state.without(keys)
        round_ = [1e3 * batch.predict(features[k]) for k in keys]
        diff = max(abs(a - rows[n]["predicted_ms"]) / rows[n]["predicted_ms"] for a, n in zip(own, names))
        cells = []
        for label, pred in (("each own left out", own), ("the round's left out", round_)):
            tau = kendalltau(pred, measured).statistic
            err = statistics.median(abs(a - b) / b for a, b in zip(pred, measured))
            figures[label].append((tau, err))
            cells.append(f"{tau:.2f}, {100 * err:.1f}%")
        print(f"| {model} | {len(names)} | {100 * diff:.1f}% | {cells[0]} | {cells[1]} |")
        before.append(g)
    for label, fig in figures.items():
        taus, errs = [t for t, _ in fig], [e for _, e in fig]
        print(f"{label}: tau >= 0.7 on {sum(t >= 0.7 for t in taus)} of {len(fig)} (median {statistics.median(taus):.2f}), "
              f"median error <= 10% on {sum(e <= 0.10 for e in errs)} (median {100 * statistics.median(errs):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

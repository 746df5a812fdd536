"""Runs ``disco optimize`` on every zoo model and writes one markdown table (issue 6's benchmark).

    python scripts/optimize_zoo.py --preset small --devices 8 --budget 30 [--cluster FILE] \
        [--models a,b] [--out results.json]

Each model is optimised in its own process (``disco optimize --json``): simulated search, then
the top plans measured for real, interleaved with xla_default, per_tensor, horovod and ddp. The
table reports, per model, every measured plan's median (min-max) and the geometric mean over the
zoo of the chosen plan's confirmed speedup over xla_default (paired: per round, xla_default's
time over the plan's, the median over rounds; :func:`xla_hooks.measure.paired_speedup`); then, per model, the measured
communication-free bound (the step with its all-reduces replaced by copies, measured in the same
rounds; not a plan) and the ceiling it sets, up to noise, on what bucketing can gain:
xla_default / bound.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--budget", type=float, default=30)
    ap.add_argument("--cluster")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--models", default="")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import trax_models

    models = [m for m in args.models.split(",") if m] or trax_models.names()
    results = {}
    for m in models:
        cmd = [sys.executable, "-m", "disco", "optimize", "--model", m, "--preset", args.preset,
               "--devices", str(args.devices), "--budget", str(args.budget), "--rounds", str(args.rounds),
               "--json"]
        if args.cluster:
            cmd += ["--cluster", args.cluster]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{m}: failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        results[m] = json.loads(r.stdout)
        results[m]["wall_s"] = time.perf_counter() - t0
        print(f"{m}: {results[m]['verdict']} ({results[m]['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)
    speedups = []
    print("| model | plan | predicted ms | measured ms median (min-max) | vs xla_default |")
    print("|---|---|---|---|---|")
    for m, res in results.items():
        base = next(r for r in res["rows"] if r["name"] == "xla_default")["measured_median_ms"]
        for row in res["rows"]:
            if row["measured_median_ms"] is None:
                continue
            mark = " (chosen)" if row["name"] == res["chosen"] else ""
            print(f"| {m} | {row['name']}{mark} | {row['predicted_ms']:.3f} | {row['measured_median_ms']:.2f} "
                  f"({row['measured_min_ms']:.2f}-{row['measured_max_ms']:.2f}) | "
                  f"{row.get('speedup_vs_xla_default') or base / row['measured_median_ms']:.3f}x |")
        b = res.get("comm_free_bound_ms")
        if b:
            print(f"| {m} | comm_free_bound (not a plan) | - | {b['median']:.2f} ({b['min']:.2f}-{b['max']:.2f}) | "
                  f"{res.get('comm_free_bound_speedup') or base / b['median']:.3f}x |")
        conf = res.get("confirmation_ms")
        if conf:
            print(f"| {m} | {res['chosen']}: confirmation run | - | "
                  + "; ".join(f"{k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for k, v in conf.items())
                  + f" | {res['speedup_vs_xla_default']:.3f}x |")
        speedups.append(res["speedup_vs_xla_default"])
    if speedups:
        gm = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print(f"\nGeometric mean measured speedup of the chosen plan over xla_default (from the "
              f"confirmation runs): {gm:.3f}x over {len(speedups)} models")
    ceilings = {m: r for m, r in results.items() if r.get("comm_free_bound_ms")}
    if ceilings:
        print("\n| model | xla_default ms | chosen | chosen ms (at the confirmed speedup) | confirmed speedup | "
              "comm-free bound ms (at its paired speedup) | ceiling "
              "(xla_default / bound) | share of the possible gain |")
        print("|---|---|---|---|---|---|---|---|")
        logs = []
        for m, res in ceilings.items():
            base = next(r for r in res["rows"] if r["name"] == "xla_default")["measured_median_ms"]
            chosen = base / res["speedup_vs_xla_default"]  # the confirmed speedup, on the first run's xla_default
            ceiling = res.get("comm_free_bound_speedup") or base / res["comm_free_bound_ms"]["median"]
            bnd = base / ceiling  # the bound at its paired speedup, on the first run's xla_default
            share = (base - chosen) / (base - bnd) if base > bnd else float("nan")
            logs.append(math.log(ceiling))
            print(f"| {m} | {base:.2f} | {res['chosen']} | {chosen:.2f} | {base / chosen:.3f}x | {bnd:.2f} | "
                  f"{base / bnd:.3f}x | {share:.0%} |")
        print(f"\nGeometric mean ceiling (xla_default / communication-free bound): "
              f"{math.exp(sum(logs) / len(logs)):.3f}x over {len(logs)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())

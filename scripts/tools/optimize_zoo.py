"""Runs ``disco optimize`` on every zoo model and writes one markdown table (issue 6's benchmark).

    python scripts/tools/optimize_zoo.py --preset small --devices 8 --budget 30 [--cluster FILE] \
        [--models a,b] [--style gspmd] [--extra '--processes 2 --link rate=10gbit,delay=50us'] [--out results.json]
    python scripts/tools/optimize_zoo.py --from a.json --from b.json   # the table of saved runs, merged
    python scripts/tools/optimize_zoo.py --models mlp,moe --twice corrections/ --out twice.json
        # each model run twice: from no correction, then from the correction the first run kept

``--from`` reads what ``--out`` wrote (model -> ``disco optimize --json``) or what
``scripts/tools/fusion_share.py --out`` wrote (model -> its result, with the optimize JSON under
"optimize" and a fresh paired run of the answer against the best baseline); later files win
for a model; ``--models`` then picks which to show, nothing is measured.

Each model is optimised in its own process (``disco optimize --json``): simulated search, then
the top plans measured for real, interleaved with xla_default, per_tensor, horovod and ddp. The
table reports, per model, every measured plan's median (min-max) and the geometric mean over the
zoo of the chosen plan's confirmed speedup over xla_default (paired: per round, xla_default's
time over the plan's, the median over rounds; :func:`xla_hooks.measure.paired_speedup`); then the
answer against the best bucketing baseline (the baseline other than xla_default with the largest
paired speedup in the first run): in the first run, the ratio of the two paired speedups; from
fusion_share's fresh run when there is one, paired directly, with a bootstrap 90% interval of
the median per-round ratio; and its geometric mean over the zoo; then, per model, the measured
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

from trax_models import STYLES


def _peak(row: dict) -> str:
    """A row's measured peak device memory (XLA's memory analysis of its compiled step), "!" over the limit."""
    peak = row.get("peak_memory_bytes")
    if peak is None:
        return "-"
    return f"{peak:,} B" + (" (over the memory limit)" if row.get("over_memory") else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--budget", type=float, default=30)
    ap.add_argument("--cluster")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--style", default="shard_map", choices=STYLES,
                    help=f"how the zoo steps are written: {' | '.join(STYLES)} (default shard_map)")
    ap.add_argument("--extra", default="", help="more `disco optimize` arguments, e.g. '--processes 2 --link ...'")
    ap.add_argument("--models", default="")
    ap.add_argument("--twice", metavar="DIR",
                    help="run each model twice, keeping its correction in DIR/<model>.json: the first run starts "
                         "from none (the file is removed first), the second from what the first kept "
                         "(results as '<model>' and '<model> (run 2)')")
    ap.add_argument("--out")
    ap.add_argument("--from", dest="from_files", action="append", default=[], metavar="FILE",
                    help="make the table of saved runs (repeatable; nothing is measured)")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import trax_models

    models = [m for m in args.models.split(",") if m] or trax_models.names()
    results = {}
    if args.from_files:
        results = load_results(args.from_files, models)
        models = []
    runs = [(m, m, None) for m in models]
    if args.twice:
        os.makedirs(args.twice, exist_ok=True)
        runs = [(label, m, os.path.join(args.twice, f"{m}.json")) for m in models
                for label in (m, f"{m} (run 2)")]
    for label, m, kept in runs:
        cmd = [sys.executable, "-m", "disco", "optimize", "--model", m, "--preset", args.preset,
               "--devices", str(args.devices), "--budget", str(args.budget), "--rounds", str(args.rounds),
               "--style", args.style, "--json", *args.extra.split()]
        if args.cluster:
            cmd += ["--cluster", args.cluster]
        if kept is not None:
            if label == m and os.path.exists(kept):
                os.remove(kept)
            cmd += ["--correction", kept]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{label}: failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        results[label] = json.loads(r.stdout)
        results[label]["wall_s"] = time.perf_counter() - t0
        print(f"{label}: {results[label]['verdict']} ({results[label]['wall_s']:.0f} s)", file=sys.stderr, flush=True)
        if args.out:  # after every model: a long run stopped part-way keeps what it measured
            with open(args.out, "w") as f:
                json.dump(results, f)
    shares = {m: r.pop("_share") for m, r in results.items() if r.get("_share")}
    speedups = []
    print("| model | plan | predicted ms | measured ms median (min-max) | vs xla_default | peak memory per device |")
    print("|---|---|---|---|---|---|")
    for m, res in results.items():
        base = next(r for r in res["rows"] if r["name"] == "xla_default")["measured_median_ms"]
        for row in res["rows"]:
            if row["measured_median_ms"] is None:
                continue
            mark = " (chosen)" if row["name"] == res["chosen"] else ""
            print(f"| {m} | {row['name']}{mark} | {row['predicted_ms']:.3f} | {row['measured_median_ms']:.2f} "
                  f"({row['measured_min_ms']:.2f}-{row['measured_max_ms']:.2f}) | "
                  f"{row.get('speedup_vs_xla_default') or base / row['measured_median_ms']:.3f}x | "
                  f"{_peak(row)} |")
        b = res.get("comm_free_bound_ms")
        if b:
            print(f"| {m} | comm_free_bound (not a plan) | - | {b['median']:.2f} ({b['min']:.2f}-{b['max']:.2f}) | "
                  f"{res.get('comm_free_bound_speedup') or base / b['median']:.3f}x | - |")
        conf = res.get("confirmation_ms")
        if conf:
            print(f"| {m} | {res['chosen']}: confirmation run | - | "
                  + "; ".join(f"{k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for k, v in conf.items())
                  + f" | {res['speedup_vs_xla_default']:.3f}x | - |")
        speedups.append(res["speedup_vs_xla_default"])
    if speedups:
        gm = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print(f"\nGeometric mean measured speedup of the chosen plan over xla_default (from the "
              f"confirmation runs): {gm:.3f}x over {len(speedups)} models")
    vs_best_baseline_table(results, shares)
    accuracy_table(results)
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
            closed = (res.get("headroom_closed") or {}).get("answer")  # the report's own, where it has it
            if closed is None and base > bnd:  # a run saved before the report had it
                closed = (base - chosen) / (base - bnd)
            share = "- (bound not faster)" if closed is None else f"{closed:.0%}"
            logs.append(math.log(ceiling))
            print(f"| {m} | {base:.2f} | {res['chosen']} | {chosen:.2f} | {base / chosen:.3f}x | {bnd:.2f} | "
                  f"{base / bnd:.3f}x | {share} |")
        print(f"\nGeometric mean ceiling (xla_default / communication-free bound): "
              f"{math.exp(sum(logs) / len(logs)):.3f}x over {len(logs)} models")
    return 0


def load_results(paths: list[str], models: list[str]) -> dict:
    """model -> ``disco optimize --json`` from saved files (see the module doc); a fusion_share
    result's fresh run goes under the private key "_share"."""
    results = {}
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        for m, res in saved.items():
            if "optimize" in res:
                results[m] = {**res["optimize"], "_share": res.get("share"), "_best_baseline": res.get("best_baseline")}
            else:
                results[m] = res
    # a --twice file's second runs are "<model> (run 2)": kept with their model, in the file's order
    return {label: res for label, res in results.items() if label.split(" (run ")[0] in models}


def best_baseline(res: dict) -> dict | None:
    """The best bucketing baseline of a run by the optimizer's rule
    (:func:`disco.optimizer.fastest_baseline`, over the first run's paired speedups): its row, or None."""
    from disco.optimizer import fastest_baseline

    rows = {r["name"]: r for r in res["rows"] if r.get("applied", True) and r.get("speedup_vs_xla_default")}
    name = fastest_baseline({n: r["speedup_vs_xla_default"] for n, r in rows.items()},
                            {n: r.get("kind", "search") for n, r in rows.items()})
    return None if name is None else rows[name]


def samples_interval(samples_ms: dict, base: str, other: str) -> tuple[float, float]:
    """:func:`xla_hooks.measure.paired_interval` of ``other`` over ``base`` from saved per-round times."""
    from xla_hooks.measure import Measurement, paired_interval

    return paired_interval(Measurement(tuple(samples_ms[base])), Measurement(tuple(samples_ms[other])))


def vs_best_baseline_table(results: dict, shares: dict) -> None:
    """Prints the answer against the best bucketing baseline, per model, and the geometric means."""
    print("\n| model | answer | best baseline (first run) | first run: answer / best baseline | "
          "fresh run: answer vs best baseline, paired (90% interval) | answer vs xla_default (confirmed) |")
    print("|---|---|---|---|---|---|")
    first_logs, fresh_logs, used_logs = [], [], []
    for m, res in results.items():
        bb = best_baseline(res)
        if bb is None:
            continue
        rows = {r["name"]: r for r in res["rows"]}
        ans = res["chosen"]
        ans_first = 1.0 if ans == "xla_default" else rows[ans]["speedup_vs_xla_default"]
        first = ans_first / bb["speedup_vs_xla_default"]
        first_logs.append(math.log(first))
        fresh_cell, used = "-", first
        sh = shares.get(m)
        if sh and sh.get("answer_vs_best_baseline") is not None:
            b_name = res.get("_best_baseline") or bb["name"]
            cell = f"{sh['answer_vs_best_baseline']:.3f}x"
            samples = sh.get("samples_ms", {})
            if ans != b_name and ans in samples and b_name in samples:
                lo, hi = samples_interval(samples, b_name, ans)
                cell += f" ({lo:.3f}-{hi:.3f}; {sh['rounds']} rounds)"
            elif ans == b_name:
                cell += " (the answer is the best baseline)"
            fresh_cell, used = cell, sh["answer_vs_best_baseline"]
            fresh_logs.append(math.log(used))
        used_logs.append(math.log(used))
        print(f"| {m} | {ans} | {bb['name']} ({bb['speedup_vs_xla_default']:.3f}x) | {first:.3f}x | {fresh_cell} | "
              f"{res['speedup_vs_xla_default']:.3f}x |")
    gm = (lambda logs: math.exp(sum(logs) / len(logs)))  # noqa: E731
    if first_logs:
        print(f"\nGeometric mean of the answer over the best bucketing baseline: first run "
              f"{gm(first_logs):.3f}x over {len(first_logs)} models"
              + (f"; fresh paired runs {gm(fresh_logs):.3f}x over {len(fresh_logs)} models" if fresh_logs else "")
              + (f"; fresh where measured, else first run: {gm(used_logs):.3f}x" if fresh_logs and
                 len(fresh_logs) < len(used_logs) else ""))


def paired_accuracy(rows: list) -> dict:
    """The predictions against drift-free times (xla_default's median over each plan's paired speedup),
    from a run's JSON rows, as :func:`disco.optimizer.accuracy` computes them."""
    from disco.optimizer import kendall_tau, median_relative_error

    judged = [r for r in rows if r.get("applied", True) and r.get("measured_median_ms")]
    base = next((r["measured_median_ms"] for r in judged if r["name"] == "xla_default"), None)
    if base is None or not all(r.get("speedup_vs_xla_default") for r in judged):
        return {"paired_kendall_tau": None, "paired_median_relative_error": None}
    pred = [r["predicted_ms"] for r in judged]
    meas = [base / r["speedup_vs_xla_default"] for r in judged]
    return {"paired_kendall_tau": kendall_tau(pred, meas), "paired_median_relative_error": median_relative_error(pred, meas)}


def resolved_accuracy(rows: list) -> dict:
    """The predictions over the pairs of plans the measurements tell apart, from a run's JSON rows,
    as :func:`disco.optimizer.accuracy` computes it (:func:`disco.optimizer.resolved_tau`)."""
    from disco.optimizer import half_noise, resolved_tau

    judged = [r for r in rows if r.get("applied", True) and r.get("measured_median_ms")]
    if not judged or not all(r.get("speedup_halves") and min(r["speedup_halves"]) > 0 for r in judged):
        return {"resolved_kendall_tau": None, "resolved_pairs": 0}
    noise = half_noise([tuple(r["speedup_halves"]) for r in judged if r["name"] != "xla_default"])
    if noise is None:
        return {"resolved_kendall_tau": None, "resolved_pairs": 0}
    tau, pairs = resolved_tau([r["predicted_ms"] for r in judged], [tuple(r["speedup_halves"]) for r in judged],
                              noise)
    return {"resolved_kendall_tau": tau, "resolved_pairs": pairs}


def accuracy_table(results: dict) -> None:
    """Prints, per run, how the predictions (each made before its plan was measured) ranked and priced
    the measured plans, the funnel's rounds and the kept correction it started from."""
    runs = {m: r for m, r in results.items() if r.get("accuracy")}
    if not runs:
        return
    fmt = (lambda v, f: "-" if v is None else format(v, f))  # noqa: E731
    print("\n| run | measured plans | Kendall tau | median error | drift-free times: tau, error | simulator alone: "
          "tau, error | measurements against themselves (even vs odd rounds): tau, error | over the pairs the "
          "measurements tell apart: tau (pairs of all) | kept points at start | per round: measured, tau (cumulative measured) | answer (searched?) | "
          "answer vs best baseline (confirmed) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, res in runs.items():
        a, learn = dict(res["accuracy"]), res.get("learning") or {}
        if "paired_kendall_tau" not in a:  # a run saved before the report had it: from its rows
            a.update(paired_accuracy(res["rows"]))
        if "resolved_pairs" not in a:
            a.update(resolved_accuracy(res["rows"]))
        total, per = 0, []
        for rnd in learn.get("rounds") or []:
            total += len(rnd["measured"])
            per.append(f"{len(rnd['measured'])}, {fmt(rnd['kendall_tau'], '.2f')} ({total})")
        kind = next((r["kind"] for r in res["rows"] if r["name"] == res["chosen"]), "?")
        searched = "searched" if kind == "search" else "baseline"
        vs = res.get("confirmed_vs_best_baseline")
        print(f"| {m} | {a['plans']} | {fmt(a['kendall_tau'], '.3f')} | "
              f"{fmt(a['median_relative_error'] and a['median_relative_error'] * 100, '.1f')}% | "
              f"{fmt(a.get('paired_kendall_tau'), '.3f')}, "
              f"{fmt(a.get('paired_median_relative_error') and a['paired_median_relative_error'] * 100, '.1f')}% | "
              f"{fmt(a['simulated_kendall_tau'], '.3f')}, "
              f"{fmt(a['simulated_median_relative_error'] and a['simulated_median_relative_error'] * 100, '.1f')}% | "
              f"{fmt(a.get('repeat_kendall_tau'), '.3f')}, "
              f"{fmt(a.get('repeat_median_relative_error') and a['repeat_median_relative_error'] * 100, '.1f')}% | "
              f"{fmt(a['resolved_kendall_tau'], '.3f')} ({a['resolved_pairs']} of {a['plans'] * (a['plans'] - 1) // 2}) | "
              f"{learn.get('kept_points_used', '-')} | {'; '.join(per) or '-'} | {res['chosen']} ({searched}) | "
              f"{fmt(vs, '.3f')}x |")


if __name__ == "__main__":
    sys.exit(main())

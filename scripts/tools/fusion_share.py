"""Measures the op-fusion share of ``disco optimize``'s plans on the zoo (issue 21).

    python scripts/tools/fusion_share.py --models vit,gpt2 --devices 2 --preset small --budget 30 \
        [--cluster FILE] [--rounds 9] [--share-rounds 15] --out results.json
    python scripts/tools/fusion_share.py --table results.json [more.json ...]   # markdown, nothing measured

Per model, in its own process (the device count is fixed when jax starts):

1. ``disco optimize``'s pipeline (:mod:`disco.optimizer`: prepare, candidates, measure, run-off,
   confirm), exactly as ``disco optimize --json`` runs it; its JSON is kept under "optimize"
   (``scripts/tools/optimize_zoo.py --from`` makes the zoo table from it).
2. The plan with fusion groups: the answer when it has groups, else the searched plan with
   groups that measured fastest in the first run (``disco_<k>``), and its groups removed
   (``disco_<k>_buckets``: the same buckets, cuts and options, XLA's fusion), which the
   optimizer measured beside it.
3. A fresh interleaved run (``--share-rounds`` rounds, the executables already compiled) of
   xla_default, that plan, its buckets alone, the best baseline of the first run and the answer:
   paired speedups (:func:`xla_hooks.measure.paired_speedup`) of each over xla_default, of the
   plan over its buckets alone, and of the answer over the best baseline.
4. What the compiled modules of the plan and its buckets alone differ in: fusions by kind, the
   fused computations' opcode sets, and the unfused instructions by opcode.

The op-fusion share is (buckets-alone time - plan time) / (xla_default time - plan time),
from the fresh run's medians: the part of the plan's gain over xla_default that its fusion
groups, rather than its buckets, account for (negative: the groups cost time).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fusion_profile(text: str) -> dict:
    """Counts in a compiled module: fusions by kind, fused computations by their opcode sets,
    and instructions outside fusions by opcode (parameters, tuples and constants left out)."""
    from disco.ir.hlo_parse import parse_module

    module = parse_module(text)
    comps = {c.name: c for c in module.computations}
    called = set()
    kinds: collections.Counter = collections.Counter()
    signatures: collections.Counter = collections.Counter()
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode != "fusion":
                continue
            kind = ins.attrs.get("kind", "?")
            body = ins.attrs.get("calls", "").lstrip("%")
            kinds[kind] += 1
            if body in comps:
                called.add(body)
                ops = sorted({i.opcode for i in comps[body].instructions} - {"parameter", "constant", "tuple",
                                                                              "get-tuple-element"})
                signatures[f"{kind}:{'+'.join(ops)}"] += 1
    called |= {ins.attrs["to_apply"].lstrip("%") for comp in module.computations for ins in comp.instructions
               if "to_apply" in ins.attrs}  # reducers: not steps of the program
    unfused: collections.Counter = collections.Counter()
    for comp in module.computations:
        if comp.name in called:
            continue
        for ins in comp.instructions:
            if ins.opcode not in ("parameter", "tuple", "get-tuple-element", "constant", "fusion"):
                unfused[ins.opcode] += 1
    return {"fusions": sum(kinds.values()), "by_kind": dict(kinds), "signatures": dict(signatures),
            "unfused": dict(unfused)}


def diff_counts(a: dict, b: dict) -> dict:
    """``a - b`` per key, nonzero only."""
    return {k: a.get(k, 0) - b.get(k, 0) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}


def worker(args: argparse.Namespace) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import trax_models
    from disco import optimizer as opt
    from disco.sim.cluster import resolve
    from xla_hooks.measure import measure_interleaved, paired_speedup

    t0 = time.perf_counter()
    step, example = trax_models.make_train_step(args.model, args.preset, devices=args.devices)
    config = opt.OptimizeConfig(budget_s=args.budget, rounds=args.rounds)
    target = opt.prepare(step, example, cluster=resolve(args.cluster, args.devices))
    cands = opt.candidates(target, config)
    measured = opt.measure(target, cands, config)
    runoff = opt.run_off(target, measured, config)
    confirmation = opt.confirm(target, measured, config, runoff)
    result = opt.make_result(target, config, cands, measured, runoff, confirmation)
    optimize_s = time.perf_counter() - t0
    out = {"model": args.model, "preset": args.preset, "devices": args.devices,
           "device_kind": jax.devices()[0].device_kind,
           "optimize": {"model": args.model, "preset": args.preset, "devices": args.devices,
                        **result.to_dict(), "wall_s": optimize_s}}
    rows = {r.name: r for r in result.rows}
    base = rows["xla_default"]
    # the plan with groups: the answer if it has groups, else the fastest measured searched plan with groups
    if result.plan.groups and result.chosen in rows:
        grouped = result.chosen
    else:
        with_groups = [r for r in result.rows if r.kind == "search" and r.plan.groups and r.applied
                       and r.median_s is not None]
        grouped = max(with_groups, key=lambda r: r.gain(base)).name if with_groups else None
    baselines_ = [r for r in result.rows if r.kind == "baseline" and r.name != "xla_default" and r.applied
                  and r.median_s is not None]
    best_baseline = max(baselines_, key=lambda r: r.gain(base)).name
    out.update(chosen=result.chosen, grouped=grouped, best_baseline=best_baseline)
    if grouped is None:
        out["note"] = "no searched plan with fusion groups was measured"
        return out
    plan = rows[grouped].plan
    projected = plan.replace(groups=(), xla_fusion="extend").digest()
    buckets_only = next((r.name for r in result.rows if r.plan.digest() == projected
                         or r.name == f"{grouped}_buckets"), None)
    out["plan"] = {"name": grouped, "groups": len(plan.groups), "grouped_ops": sum(len(g) for g in plan.groups),
                   "buckets": None if plan.buckets is None else len(plan.buckets), "cuts": len(plan.cuts),
                   "compile_options": dict(plan.compile_options), "xla_fusion": plan.xla_fusion,
                   "buckets_only_row": buckets_only, "plan": plan.to_dict()}
    names = list(dict.fromkeys(n for n in ("xla_default", grouped, buckets_only, best_baseline, result.chosen)
                               if n is not None))
    compiled = {**measured.executables, **(runoff.executables if runoff is not None else {})}
    fns = {n: compiled[n] for n in names}
    t1 = time.perf_counter()
    again = measure_interleaved(fns, example, rounds=args.share_rounds, steps=config.steps)
    med = {n: m.median for n, m in again.items()}
    share = {
        "rounds": args.share_rounds, "steps": config.steps, "seconds": time.perf_counter() - t1,
        "ms": {n: {"median": m.median * 1e3, "min": m.min * 1e3, "max": m.max * 1e3} for n, m in again.items()},
        "samples_ms": {n: [round(t * 1e3, 4) for t in m.samples] for n, m in again.items()},
        "speedup_vs_xla_default": {n: paired_speedup(again["xla_default"], again[n]) for n in names
                                   if n != "xla_default"},
        "answer_vs_best_baseline": paired_speedup(again[best_baseline], again[result.chosen]),
    }
    if buckets_only is not None:
        share["plan_vs_buckets_only"] = paired_speedup(again[buckets_only], again[grouped])
        gain = med["xla_default"] - med[grouped]
        share["fusion_share"] = (med[buckets_only] - med[grouped]) / gain if gain > 0 else None
        texts = {n: fns[n].compiled_text() for n in ("xla_default", grouped, buckets_only)}
        prof = {n: fusion_profile(t) for n, t in texts.items()}
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            for n, t in texts.items():
                with open(os.path.join(args.dump, f"{args.model}.{args.devices}.{n}.compiled.hlo.txt"), "w") as f:
                    f.write(t)
        out["compiled"] = {
            "fusions": {n: p["fusions"] for n, p in prof.items()},
            "by_kind": {n: p["by_kind"] for n, p in prof.items()},
            "plan_minus_buckets_only": {
                "signatures": diff_counts(prof[grouped]["signatures"], prof[buckets_only]["signatures"]),
                "unfused": diff_counts(prof[grouped]["unfused"], prof[buckets_only]["unfused"])},
        }
    out["share"] = share
    out["wall_s"] = time.perf_counter() - t0
    return out


def interval(share: dict, base: str, other: str) -> str:
    """" (lo-hi)": a bootstrap 90% interval of the median per-round ratio base/other, or ""."""
    from optimize_zoo import samples_interval  # beside this script

    samples = share.get("samples_ms", {})
    if base not in samples or other not in samples:
        return ""
    lo, hi = samples_interval(samples, base, other)
    return f" ({lo:.3f}-{hi:.3f})"


def table(paths: list[str]) -> str:
    """The markdown table of saved results (one row per model and device count)."""
    lines = ["| model | devices | answer (confirmed vs xla_default) | plan with groups | its buckets alone | "
             "fresh run ms: xla_default / plan / buckets alone | plan vs xla_default | buckets alone vs "
             "xla_default | plan vs buckets alone (90% interval) | op-fusion share | compiled fusions: xla_default / plan / "
             "buckets alone |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        for m, r in saved.items():
            ans = f"{r['chosen']} ({r['optimize']['speedup_vs_xla_default']:.3f}x)"
            if not r.get("grouped"):
                lines.append(f"| {m} | {r['devices']} | {ans} | none measured | - | - | - | - | - | - | - |")
                continue
            p, s = r["plan"], r["share"]
            b = p["buckets_only_row"]
            nb = "XLA's combiner" if p["buckets"] is None else f"{p['buckets']} buckets"
            sp = s["speedup_vs_xla_default"]
            ms = s["ms"]
            fus = r.get("compiled", {}).get("fusions", {})
            share = s.get("fusion_share")
            lines.append(
                f"| {m} | {r['devices']} | {ans} | {p['name']}: {p['groups']} groups ({p['grouped_ops']} ops), {nb} | "
                f"{b} | {ms['xla_default']['median']:.2f} / {ms[p['name']]['median']:.2f} / {ms[b]['median']:.2f} | "
                f"{sp[p['name']]:.3f}x | {sp.get(b, 1.0):.3f}x | {s['plan_vs_buckets_only']:.3f}x{interval(s, b, p['name'])} | "
                f"{'-' if share is None else f'{share:.0%}'} | "
                f"{fus.get('xla_default', '-')} / {fus.get(p['name'], '-')} / {fus.get(b, '-')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma list (default: the whole zoo)")
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--budget", type=float, default=30)
    ap.add_argument("--cluster")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--share-rounds", type=int, default=15)
    ap.add_argument("--out", help="JSON file; results are merged into it (model -> result)")
    ap.add_argument("--dump", help="directory for the compiled modules of the plan, its buckets alone and xla_default")
    ap.add_argument("--table", nargs="+", metavar="FILE", help="print the table of saved results; measure nothing")
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    if args.table:
        print(table(args.table))
        return 0
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    import trax_models

    results = {}
    if args.out and os.path.exists(args.out):
        with open(args.out) as f:
            results = json.load(f)
    for m in [m for m in args.models.split(",") if m] or trax_models.names():
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", m, "--preset", args.preset,
               "--devices", str(args.devices), "--budget", str(args.budget), "--rounds", str(args.rounds),
               "--share-rounds", str(args.share_rounds)] + (["--cluster", args.cluster] if args.cluster else []) \
            + (["--dump", args.dump] if args.dump else [])
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
        if r.returncode != 0:
            print(f"{m}: failed: {r.stderr.strip().splitlines()[-3:]}", file=sys.stderr, flush=True)
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        results[m] = res
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        s = res.get("share", {})
        print(f"{m}/{args.devices}: chosen {res['chosen']} ({res['optimize']['speedup_vs_xla_default']:.3f}x), "
              f"grouped {res['grouped']}, plan vs buckets {s.get('plan_vs_buckets_only', float('nan')):.3f}x, "
              f"answer vs best baseline {s.get('answer_vs_best_baseline', float('nan')):.3f}x "
              f"({res.get('wall_s', 0):.0f} s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

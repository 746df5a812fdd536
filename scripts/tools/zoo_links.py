"""The zoo on an emulated cluster: per link, a calibration, then per model the baselines, the
bucket-count sweep and disco's answer measured across processes (:func:`disco.optimize` on a
:class:`disco.optimizer.ProcessRunner`).

    python scripts/tools/zoo_links.py --links 'rate=1gbit,delay=100us;rate=10gbit,delay=50us' \
        --models mlp,transformer_lm --preset small --processes 2 --budget 20 --out zoo_links.jsonl

Writes one JSON line per link (the calibration) and per (link, model) (the optimize result),
then prints a markdown table per link: per model the paired speedups over xla_default of
per_tensor, horovod, ddp, the best even_k, the answer in the measuring launch, its confirmed
speedup (fresh processes), the best baseline of the measuring launch (among the baselines and
the even_k sweep; xla_default when none beats it) and the answer's paired speedup over it in the
confirmation launch, and over it once more in the validation launch after the decision (with a
90% bootstrap interval); geometric means over the models of those ratios, the validation's with
a bootstrap interval.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def validation_ratios(res: dict) -> list[float] | None:
    """Per round of the validation launch, the best baseline's time over the answer's; [1.0] when
    the answer is that baseline (the same plan measured twice); None without a validation."""
    val = res.get("validation")
    if not val:
        return None
    if res["chosen"] == res["best_baseline"]:
        return [1.0]
    rows = {r["plan"]: r for r in val["rows"]}
    return [b / a for b, a in zip(rows[res["best_baseline"]]["samples_ms"], rows[res["chosen"]]["samples_ms"])]


def geomean_interval(per_model: list[list[float]], level: float = 0.9, draws: int = 2000) -> tuple[float, float]:
    """A percentile bootstrap interval of the geometric mean over models of each model's median
    per-round ratio: every draw resamples each model's rounds with replacement (fixed seed, so the
    same results give the same interval). A model whose answer is its best baseline contributes
    exactly 1.0, so the interval leaves out what measuring that plan twice would vary."""
    from xla_hooks.measure import bootstrap_interval

    return bootstrap_interval(lambda rng: _geomean([statistics.median(rng.choices(r, k=len(r))) for r in per_model]),
                              level, draws)


def table(link_label: str, results: list[dict]) -> str:
    """A markdown table of one link's results (``results``: optimize result dicts with a model)."""
    lines = [f"link {link_label}: paired speedup over xla_default (slowest process per round), measured",
             "",
             "| model | xla_default ms | per_tensor | horovod | ddp | best even_k | answer | answer (measuring run) "
             "| answer confirmed | best baseline (measuring run) | answer / best baseline (confirmed) "
             "| answer / best baseline (validation; 90% interval) | the answer is |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    g_x, g_b, g_v = [], [], []
    for res in results:
        rows = {r["plan"]: r for r in res["rows"]}
        evens = {k: v for k, v in rows.items() if k.startswith("even_")}
        best_even = max(evens, key=lambda k: evens[k]["paired_speedup"], default=None)
        answer, best_base = res["chosen"], res["best_baseline"]
        measured = rows[answer]["paired_speedup"]
        where = " (run-off)" if rows[answer].get("measured_in") == "run-off" else ""
        confirmed = res["speedup"]
        vs_best = res["confirmed_vs_best_baseline"]
        g_x.append(confirmed)
        if vs_best is not None:
            g_b.append(vs_best)
        val = (res.get("validation") or {}).get("vs_best_baseline")
        if val is not None:
            g_v.append(val)
        span = (res.get("validation") or {}).get("vs_best_baseline_interval")
        val_cell = "-" if val is None else f"{val:.3f}x" + ("" if span is None else f" ({span[0]:.3f}-{span[1]:.3f})")

        def cell(name: str) -> str:
            return f"{rows[name]['paired_speedup']:.3f}x" if name in rows else "-"

        lines.append(f"| {res['model']} | {rows['xla_default']['median_ms']:.2f} | {cell('per_tensor')} | "
                     f"{cell('horovod')} | {cell('ddp')} | "
                     f"{(best_even + ' ' + cell(best_even)) if best_even else '-'} | {answer} | {measured:.3f}x{where} | "
                     f"{confirmed:.3f}x | {best_base} {cell(best_base)} | "
                     f"{'-' if vs_best is None else f'{vs_best:.3f}x'} | "
                     f"{val_cell} | {res['relation']} |")
    lines += ["", f"geometric mean over {len(results)} models: answer (confirmed) vs xla_default "
                  f"{_geomean(g_x):.3f}x; answer vs best baseline (confirmed, {len(g_b)} models) {_geomean(g_b):.3f}x; "
                  f"(validation, {len(g_v)} models) {_geomean(g_v):.3f}x"]
    per_model = [r for r in map(validation_ratios, results) if r is not None]
    if per_model:
        lo, hi = geomean_interval(per_model)
        lines[-1] += f", 90% interval {lo:.3f}-{hi:.3f} (rounds resampled)"
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", required=True, help="';'-separated link specs")
    ap.add_argument("--models", default="mlp,transformer_lm,bert,vgg19")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--devices-per-process", type=int, default=1)
    ap.add_argument("--budget", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bucket-sweep", default="2,3,4")
    ap.add_argument("--validate-rounds", type=int, default=21,
                    help="rounds of the launch after the decision (0: none)")
    ap.add_argument("--out", required=True, help="append JSON lines here")
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", args.processes * args.devices_per_process)
    from disco import calibrate
    from disco.optimizer import OptimizeConfig, ProcessRunner, optimize, validate
    from disco.runtime.testbed import parse_link

    for spec in [s.strip() for s in args.links.split(";") if s.strip()]:
        link = parse_link(spec)
        label = link.label() if link else "loopback"
        t0 = time.time()
        cal = calibrate.calibrate(calibrate.ProcessRunner(args.processes, args.devices_per_process, link))
        cluster = calibrate.cluster_spec(cal)
        with open(args.out, "a") as f:
            f.write(json.dumps({"kind": "calibration", "link": spec, **cal.to_dict(),
                                "seconds": time.time() - t0}) + "\n")
        c = cal.calibration
        print(f"[{label}] calibrated: latency {c.latency * 1e6:.1f} us, bandwidth {c.bandwidth * 8 / 1e6:.1f} Mbit/s, "
              f"operand latency {c.operand_latency * 1e6:.1f} us", file=sys.stderr, flush=True)
        results = []
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            t0 = time.time()
            try:
                runner = ProcessRunner(model, args.preset, args.processes, args.devices_per_process, link)
                step, example = runner.make_step()
                # each row costs a compile in every worker of every launch: no bucket-only projections
                config = OptimizeConfig(budget_s=args.budget, rounds=args.rounds, steps=args.steps,
                                        measure_buckets_only=False,
                                        bucket_sweep=tuple(int(k) for k in args.bucket_sweep.split(",") if k.strip()))
                res = optimize(step, *example, cluster=cluster, config=config, runner=runner,
                               progress=lambda phase, frac, m, model=model: print(f"[{label}] {model}: {m}",
                                                                                  file=sys.stderr, flush=True))
            except RuntimeError as e:  # a failed launch: recorded, the other models still run
                with open(args.out, "a") as f:
                    f.write(json.dumps({"kind": "error", "link": spec, "model": model, "error": str(e)}) + "\n")
                print(f"[{label}] {model}: FAILED: {e}", file=sys.stderr, flush=True)
                continue
            d = {"kind": "optimize", "link": spec, "model": model, "preset": args.preset,
                 "processes": args.processes, "devices_per_process": args.devices_per_process,
                 "seconds": time.time() - t0, **res.to_dict()}
            if args.validate_rounds > 0:
                print(f"[{label}] {model}: validating {res.chosen} against {res.best_baseline} "
                      f"({args.validate_rounds} rounds, fresh processes)", file=sys.stderr, flush=True)
                try:
                    d["validation"] = validate(res, runner, rounds=args.validate_rounds, steps=args.steps)
                except RuntimeError as e:
                    d["validation_error"] = str(e)
                    print(f"[{label}] {model}: validation FAILED: {e}", file=sys.stderr, flush=True)
            results.append(d)
            with open(args.out, "a") as f:
                f.write(json.dumps(d) + "\n")
            print(f"[{label}] {model}: {res.verdict}", file=sys.stderr, flush=True)
        print(table(label, results) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measures the zoo at one preset: step time, HLO size, all-reduces, gradient bytes, compile time.

    python scripts/experiments/zoo_table.py --preset small --devices 8 [--steps 5] [--json]

Prints a markdown table (or JSON). Timings are medians of ``--steps`` jitted steps after one
warm-up step, measured on whatever backend jax uses (on this project's machines: CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", default="", help="comma list (default: the whole zoo)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import disco
    import trax_models

    rows = []
    for name in [m for m in args.models.split(",") if m] or trax_models.names():
        step, example = trax_models.make_train_step(name, args.preset, devices=args.devices)
        lowered = jax.jit(step).lower(*example)
        graph = disco.HloGraph.from_hlo_text(disco.hlo_text(step, *example))
        t0 = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - t0
        state, batch = example
        jax.block_until_ready(compiled(state, batch))
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(state, batch))
            times.append(time.perf_counter() - t0)
        s = graph.summary()
        rows.append({"model": name, "preset": args.preset, "devices": args.devices,
                     "step_ms_median": round(statistics.median(times) * 1e3, 2),
                     "step_ms_min": round(min(times) * 1e3, 2), "step_ms_max": round(max(times) * 1e3, 2),
                     "hlo_nodes": s["nodes"], "all_reduces": s["all_reduces"],
                     "gradient_bytes": s["gradient_bytes"], "compile_s": round(compile_s, 2)})
        print(f"done {name}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| model | step ms (median, min-max) | HLO nodes | all-reduces | gradient bytes | compile s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['step_ms_median']} ({r['step_ms_min']}-{r['step_ms_max']}) | {r['hlo_nodes']} | "
              f"{r['all_reduces']} | {r['gradient_bytes']:,} | {r['compile_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

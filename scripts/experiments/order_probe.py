"""Which plan follows which: does a plan's place in the interleaved rounds move its measured time?

    PYTHONPATH=. python scripts/experiments/order_probe.py --model bert --style gspmd [--rounds 27] [--reps 2]

Two handles of ONE compiled executable (the model's ``horovod`` plan), ``A`` and ``B``, are measured
beside XLA's default as the confirmation lists its plans (xla_default, the candidate, the baseline),
in both listings (``A`` or ``B`` right after xla_default), under the rotation used before 2026-11-29
(round ``r`` starts at the ``r``-th plan) and under :func:`xla_hooks.measure.measure_interleaved`'s
Williams design. ``A`` over ``B`` (paired, with its 90% bootstrap interval) is 1.0 in truth: what it
measures is the place's effect plus the noise of a run of that many rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def rotation(fns, args, rounds, steps):
    """The order used before 2026-11-29: one warm-up round, then round r starts at the r-th plan."""
    from xla_hooks import measure

    names = list(fns)
    for n in names:
        measure._run(fns[n], args, steps)
    samples = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            samples[n].append(measure._run(fns[n], args, steps))
    return {n: measure.Measurement(tuple(v)) for n, v in samples.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--style", default="gspmd")
    ap.add_argument("--rounds", type=int, default=27)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import jax

    import trax_models
    from disco.ir.extractor import hlo_text
    from disco.ir.graph import HloGraph
    from disco.plans import baselines
    from xla_hooks import apply_plan, measure

    step, example = trax_models.make_train_step(args.model, preset=args.preset, devices=args.devices,
                                                style=args.style)
    graph = HloGraph.from_hlo_text(hlo_text(step, *example))
    default = jax.jit(step)
    horovod = apply_plan.apply(baselines.make("horovod", graph), step, *example)
    if not horovod.applied:
        print(f"horovod did not apply ({horovod.fallback_reason}); nothing to compare", file=sys.stderr)
        return 1
    print(f"{args.model} ({args.style}, {args.preset}, {args.devices} devices): {args.rounds} rounds x {args.steps} steps")
    for rep in range(args.reps):
        for listing in (("xla_default", "A", "B"), ("xla_default", "B", "A")):
            for how, run in (("rotation", rotation), ("williams", measure.measure_interleaved)):
                fns = {"xla_default": default, "A": horovod, "B": lambda *a: horovod(*a)}
                t0 = time.time()
                t = run({n: fns[n] for n in listing}, example, args.rounds, args.steps)
                ratio = measure.paired_speedup(t["B"], t["A"])
                lo, hi = measure.paired_interval(t["B"], t["A"])
                after = ratio if listing[1] == "A" else 1 / ratio
                print(f"rep {rep} {how:8s} listed {','.join(listing)}: A over B {ratio:.4f} (90% {lo:.4f}-{hi:.4f}); "
                      f"the one right after xla_default over the other {after:.4f}; medians ms "
                      f"{t['xla_default'].median * 1e3:.1f}, {t['A'].median * 1e3:.2f}, {t['B'].median * 1e3:.2f} "
                      f"({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

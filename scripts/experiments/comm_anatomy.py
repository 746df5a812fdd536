"""Where a data-parallel step's communication time goes: bucket builds, bucket counts, floors.

    python scripts/experiments/comm_anatomy.py --preset small --devices 8 [--models a,b] [--counts 1,2,3,4,8]
        [--rounds 9] [--json out.json]

Per zoo model, in one set of interleaved rounds (medians, ms): XLA's default compile; horovod and
ddp with each bucket build ("concat": one all-reduce per bucket; "rs_ag": reduce-scatter +
all-gather); ``even_<k>`` (the gradients in production order cut into k equal-bytes buckets);
the communication-free bound (every all-reduce replaced by a copy) and the sync floor (the same,
but the scalar loss all-reduce kept: one synchronisation of the devices, no gradient data).
Bound and floor are not plans (they change the numbers); they say how much is left to gain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--models", default="")
    ap.add_argument("--counts", default="1,2,3,4,8")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import jax

    import disco
    import trax_models
    import xla_hooks
    from disco.plans import baselines
    from disco.plans.plan import Bucket
    from xla_hooks import bound, measure

    counts = [int(k) for k in args.counts.split(",") if k.strip()]
    models = [m for m in args.models.split(",") if m] or trax_models.names()
    out = {}
    for name in models:
        step, example = trax_models.make_train_step(name, args.preset, devices=args.devices)
        graph = disco.extract(step, *example)
        plans = {n: baselines.make(n, graph) for n in ("horovod", "ddp")}
        for n in ("horovod", "ddp"):
            p = plans[n]
            plans[f"{n}_rs_ag"] = p.replace(buckets=tuple(Bucket(b.members, "rs_ag") for b in p.buckets),
                                            name=f"{n}_rs_ag").validate(graph)
        for k in counts:
            plans[f"even_{k}"] = baselines.make("even", graph, k=k)
        fns = {"xla_default": jax.jit(step).lower(*example).compile()}
        for n, p in plans.items():
            applied = xla_hooks.apply(p, step, *example)
            if not applied.applied:
                print(f"{name}: {n} fell back: {applied.fallback_reason}", file=sys.stderr)
                continue
            fns[n] = applied
        fns["comm_free_bound"] = bound.compile_comm_free(step, *example)
        fns["sync_floor"] = bound.compile_comm_free(step, *example, keep_scalars=True)
        res = measure.measure_interleaved(fns, example, rounds=args.rounds, steps=args.steps)
        base = res["xla_default"].median
        grad_mib = sum(n.grad_bytes for n in graph.all_reduces()) / 2**20
        out[name] = {"gradient_mib": grad_mib, **{n: {"median_ms": m.median * 1e3, "min_ms": m.min * 1e3,
                                                      "max_ms": m.max * 1e3, "speedup": base / m.median}
                                                  for n, m in res.items()}}
        print(f"{name} ({grad_mib:.2f} MiB of gradients): "
              + " ".join(f"{n}={m.median * 1e3:.2f}({base / m.median:.3f}x)" for n, m in res.items()), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

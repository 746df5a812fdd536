"""Step times of scatter-bucket plans on in-process CPU devices (issue 60): are reduce-scatters faster?

    PYTHONPATH=. python scripts/experiments/scatter_steps.py --model mlp --mesh 2x4 [--rounds 15] [--steps 5]
    PYTHONPATH=. python scripts/experiments/scatter_steps.py --model mlp --mesh 1x8

The zoo model's fsdp step (preset tiny, SGD) on 8 host devices, each plan applied strictly (no fallback),
measured in interleaved rounds (:func:`xla_hooks.measure.measure_interleaved`, ``--steps`` steps a
sample). On ``2x4``: XLA's default, ``scatter_buckets`` (a data x fsdp mesh's scatters as a
reduce-scatter over "fsdp" and an all-reduce of the shard over "data") and ``one_bucket`` (all "concat").
On ``1x8``: ``scatter_buckets`` and the same buckets built "concat", plus XLA's default. Prints each
plan's median (min-max) per step, its compiled collectives, and the paired speedup over the first
plan (per round, the first's time over the plan's; the median, with a bootstrap 90% interval).
"""

from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--mesh", default="2x4", choices=("2x4", "1x8"))
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import warnings

    import disco
    import trax_models
    import xla_hooks
    from disco.plans import baselines
    from disco.plans.plan import Bucket, FusionPlan
    from xla_hooks.measure import measure_interleaved, paired_interval, paired_speedup
    from xla_hooks.rewrite import count_ops

    mesh = None if a.mesh == "1x8" else (2, 4)
    step, args = trax_models.make_train_step(a.model, a.preset, devices=8, style="fsdp", mesh_shape=mesh,
                                             optimizer="sgd")
    graph = disco.extract(step, *args)
    scatter = baselines.make("scatter_buckets", graph)
    if mesh is None:
        plans = {"scatter_buckets": scatter,
                 "scatter_buckets as concat": scatter.replace(
                     buckets=tuple(Bucket(b.members, "concat") for b in scatter.buckets), name="as concat"),
                 "xla_default": FusionPlan()}
    else:
        plans = {"xla_default": FusionPlan(), "scatter_buckets": scatter,
                 "one_bucket": baselines.make("one_bucket", graph)}
    fns = {}
    for name, plan in plans.items():
        plan.validate(graph)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fns[name] = applied = xla_hooks.apply(None if plan.is_default else plan, step, *args, strict=True)
        ops = count_ops(applied.compiled_text(), ["all-reduce", "reduce-scatter", "all-gather", "all-reduce-start"])
        print(f"{name}: {len(plan.buckets or ())} buckets "
              f"({', '.join(sorted({b.build for b in plan.buckets or ()})) or 'XLA'}); compiled: "
              f"{ops['all-reduce'] + ops['all-reduce-start']} all-reduce, {ops['reduce-scatter']} reduce-scatter, "
              f"{ops['all-gather']} all-gather")
    print(f"load before: {os.getloadavg()[0]:.2f}")
    res = measure_interleaved(fns, args, rounds=a.rounds, steps=a.steps)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    first = next(iter(res))
    for name, m in res.items():
        line = f"{name}: median {m.median * 1e3:.3f} ms ({m.min * 1e3:.3f}-{m.max * 1e3:.3f})"
        if name != first:
            lo, hi = paired_interval(res[first], m)
            line += f"; paired speedup over {first}: {paired_speedup(res[first], m):.3f} (90%: {lo:.3f}-{hi:.3f})"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

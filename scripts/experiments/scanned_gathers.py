"""Step times of gather buckets in a scanned step's loop bodies on in-process CPU devices (issue 60).

    PYTHONPATH=. python scripts/experiments/scanned_gathers.py [--rounds 16] [--steps 10]

maxtext's decoder with ``scan_layers`` (``tests/support/sharded_user_steps.py``, ``maxtext_scanned_fsdp``:
3 scanned MLP layers, adamw, mesh (2, 4, 1) of 8 host devices): XLA's default, the loops' gather buckets
alone (``disco.plans.baselines.loop_gather_buckets``: one all-gather per body where XLA keeps two), ``ddp``
and ``ddp`` with them, each applied strictly (no fallback), measured in interleaved rounds of ``--steps``
steps (the state carried from step to step, as the user's loop does; each round's order a row of a
Williams design, :func:`xla_hooks.measure.round_orders`). Prints each plan's median per step, its
compiled all-gathers, and the paired speedup over XLA's default (per round; the median, with a
bootstrap 90% interval). Measured on CPU: in one process communication does not overlap compute.
"""

from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import re
    import time
    import warnings

    import jax

    import disco
    import xla_hooks
    from disco.plans import baselines
    from disco.plans.plan import FusionPlan
    from tests.support import sharded_user_steps
    from xla_hooks.measure import Measurement, paired_interval, paired_speedup, round_orders

    entry = sharded_user_steps.SCANNED["maxtext_scanned_fsdp"]()
    with sharded_user_steps.context(entry), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # XLA's involuntary-rematerialization notes
        graph = disco.extract(entry.step, *entry.args, kwargs=entry.kwargs)
    loops = baselines.loop_gather_buckets(graph)
    ddp = baselines.make("ddp", graph)
    plans = {"xla_default": FusionPlan(), "loop_gathers": FusionPlan(gather_buckets=loops, name="loop_gathers"),
             "ddp": ddp, "ddp+loop_gathers": ddp.replace(gather_buckets=loops, name="ddp+loop_gathers")}
    fns = {}
    with sharded_user_steps.context(entry):
        for name, plan in plans.items():
            applied = xla_hooks.apply(None if plan.is_default else plan, entry.step, *entry.args,
                                      kwargs=entry.kwargs, strict=not plan.is_default)
            fns[name] = applied
            gathers = len(re.findall(r"\sall-gather(?:-start)?\(", applied.compiled_text()))
            print(f"{name}: {len(plan.gather_buckets or ())} gather buckets, {len(plan.buckets or ())} buckets; "
                  f"compiled: {gathers} all-gathers")
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    args, kwargs = entry.args, entry.kwargs
    print(f"load before: {os.getloadavg()[0]:.2f}")
    with sharded_user_steps.context(entry):
        for name in names:  # one untimed warm-up pass
            args, kwargs = entry.advance(fns[name], args, kwargs)
        jax.block_until_ready(args)
        orders = round_orders(len(names))
        for r in range(a.rounds):
            for i in orders[r % len(orders)]:
                t0 = time.perf_counter()
                for _ in range(a.steps):
                    args, kwargs = entry.advance(fns[names[i]], args, kwargs)
                    jax.block_until_ready(args)
                times[names[i]].append((time.perf_counter() - t0) / a.steps)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    res = {n: Measurement(tuple(v)) for n, v in times.items()}
    for name, m in res.items():
        line = f"{name}: median {m.median * 1e3:.3f} ms ({m.min * 1e3:.3f}-{m.max * 1e3:.3f})"
        if name != names[0]:
            lo, hi = paired_interval(res[names[0]], m)
            line += f"; paired speedup over {names[0]}: {paired_speedup(res[names[0]], m):.3f} (90%: {lo:.3f}-{hi:.3f})"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CPU time against wall time per step on in-process CPU devices: what the all-reduces cost the cores.

    PYTHONPATH=. python scripts/experiments/cpu_share.py --model bert [--devices 8] [--rounds 9]

XLA's default, horovod, even_4 and the communication-free bound (every all-reduce a copy,
:mod:`xla_hooks.bound`) of the model's GSPMD step at preset small, in interleaved rounds of 3 steps
(the same order every round).
Per variant: the median wall time per step, the median CPU time per step (this process's user plus
system time, ``getrusage``) and their ratio, the cores kept busy. Where the bound keeps the cores
busier and uses less CPU time than a plan, the all-reduces both add work and leave cores idle.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=9)
    args_ = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args_.devices}"
    import jax

    import disco
    import trax_models
    from disco.plans import baselines
    from xla_hooks import apply_plan, bound

    model = args_.model
    step, args = trax_models.make_train_step(model, preset="small", devices=args_.devices, style="gspmd")
    graph = disco.extract(step, *args)
    fns = {"xla_default": apply_plan.apply(None, step, *args),
           "horovod": apply_plan.apply(baselines.make("horovod", graph), step, *args),
           "even_4": apply_plan.apply(baselines.make("even", graph, k=4), step, *args),
           "bound": bound.compile_comm_free(step, *args)}
    for f in fns.values():
        jax.block_until_ready(f(*args))
    res = {n: [] for n in fns}
    for _ in range(args_.rounds):
        for n, f in fns.items():
            ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _step in range(3):
                out = f(*args)
            jax.block_until_ready(out)
            ru1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            res[n].append(((t1 - t0) / 3, cpu / 3))
    for n, v in res.items():
        wall = statistics.median(w for w, _ in v)
        cpu = statistics.median(c for _, c in v)
        print(f"{model} {n:12s} wall {wall*1e3:7.2f} ms  cpu {cpu*1e3:7.2f} ms  cpu/wall {cpu/wall:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

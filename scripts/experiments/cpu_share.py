"""CPU time against wall time per step on in-process CPU devices: what the all-reduces cost the cores.

    PYTHONPATH=. python scripts/experiments/cpu_share.py --model bert [--devices 8] [--rounds 9]
    PYTHONPATH=. python scripts/experiments/cpu_share.py --alone     # a psum alone, against a copy
    PYTHONPATH=. python scripts/experiments/cpu_share.py --wait      # do waiting devices spin?

XLA's default, horovod, horovod's text with its all-reduces made copies (its bucket's
concatenation and slices kept), even_4, the sync floor (every all-reduce a copy but the scalar loss's: one
rendezvous of the devices, no gradient data) and the communication-free bound (every all-reduce a
copy; both :mod:`xla_hooks.bound`) of the model's GSPMD step at preset small, in interleaved rounds of 3 steps
(the same order every round).
Per variant: the median wall time per step, the median CPU time per step (this process's user plus
system time, ``getrusage``) and their ratio, the cores kept busy. Where the bound keeps the cores
busier and uses less CPU time than a plan, the all-reduces both add work and leave cores idle.

With ``--alone``: a psum of 1 float and of 0.26, 1 and 4 MB per device, each beside the same array
times 2 (a copy, no collective), 15 rounds of 20 calls: what an all-reduce costs outside a step.
With ``--wait``: device 0 runs a single-threaded loop (3000 x tanh(w @ w), 48 x 48) while the others
have nothing to do, then all meet at a psum, against the same without the psum: if the waiting
devices spun, the psum would add CPU time.
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
    ap.add_argument("--alone", action="store_true", help="time a psum alone against a copy instead")
    ap.add_argument("--wait", action="store_true", help="time devices waiting at a psum for device 0 instead")
    args_ = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args_.devices}"
    import jax

    if args_.alone:
        return alone(args_.devices)
    if args_.wait:
        return wait(args_.devices)

    import disco
    import trax_models
    from disco.plans import baselines
    from xla_hooks import apply_plan, bound

    model = args_.model
    step, args = trax_models.make_train_step(model, preset="small", devices=args_.devices, style="gspmd")
    graph = disco.extract(step, *args)
    from disco.ir.extractor import lower
    from xla_hooks import _jax_private

    horovod = apply_plan.apply(baselines.make("horovod", graph), step, *args)
    fns = {"xla_default": apply_plan.apply(None, step, *args),
           "horovod": horovod,
           # horovod's text (its bucket's concatenation and slices) with its all-reduces made copies
           "horovod_no_ar": _jax_private.compile_rewritten(
               lower(step, *args), bound.strip_all_reduces(horovod.hlo), horovod.plan.compiler_options("cpu")),
           "even_4": apply_plan.apply(baselines.make("even", graph, k=4), step, *args),
           "sync_floor": bound.compile_comm_free(step, *args, keep_scalars=True),
           "bound": bound.compile_comm_free(step, *args)}
    for f in fns.values():
        jax.block_until_ready(f(*args))
    res = {n: [] for n in fns}
    for _ in range(args_.rounds):
        for n, f in fns.items():
            res[n].append(_once(f, args, calls=3))
    for n, v in res.items():
        wall = statistics.median(w for w, _ in v)
        cpu = statistics.median(c for _, c in v)
        print(f"{model} {n:12s} wall {wall*1e3:7.2f} ms  cpu {cpu*1e3:7.2f} ms  cpu/wall {cpu/wall:.2f}")
    return 0


def _once(fn, args, calls: int) -> tuple[float, float]:
    """Wall and CPU seconds (this process's user plus system time) per call of ``fn(*args)``, over
    ``calls`` calls."""
    import jax

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _call in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    return (t1 - t0) / calls, ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / calls


def _timed(fn, args, calls: int = 20, rounds: int = 15) -> tuple[float, float]:
    """Median wall and CPU seconds per call of ``fn(*args)`` over ``rounds`` of :func:`_once`."""
    times = [_once(fn, args, calls) for _ in range(rounds)]
    return statistics.median(w for w, _ in times), statistics.median(c for _, c in times)


def alone(devices: int) -> int:
    """A psum across the devices outside any step, against a copy of the same array."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((devices,), ("dp",))

    def smap(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False))

    psum, copy = smap(lambda x: jax.lax.psum(x, "dp")), smap(lambda x: x * 2.0)
    for n in (1, 65536, 262144, 1048576):
        x = jax.device_put(np.ones((devices * n,), np.float32), NamedSharding(mesh, P("dp")))
        for name, fn in (("psum", psum), ("copy (x * 2)", copy)):
            jax.block_until_ready(fn(x))
            wall, cpu = _timed(fn, (x,))
            print(f"{n * 4 / 1e6:6.3f} MB per device  {name:13s} wall {wall * 1e3:7.3f} ms  cpu {cpu * 1e3:7.3f} ms")
    return 0


def wait(devices: int) -> int:
    """Device 0 computes alone while the others wait at a psum, against the same without the psum."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((devices,), ("dp",))
    sharding = NamedSharding(mesh, P("dp"))
    x = jax.device_put(np.ones((devices * 1024,), np.float32), sharding)
    w = jax.device_put(np.tile(np.eye(48, dtype=np.float32) * 0.5, (devices, 1)), sharding)

    def heavy(m):
        return jax.lax.fori_loop(0, 3000, lambda i, m: jnp.tanh(m @ m), m)

    def body(sync: bool):
        def f(x, w):
            c = jax.lax.cond(jax.lax.axis_index("dp") == 0, heavy, lambda m: m, w)
            y = x + 0 * c[0, 0]
            return (jax.lax.psum(y, "dp") if sync else y), c
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("dp"), P("dp")), out_specs=P("dp"),
                                     check_vma=False))

    fns = {"the others wait at a psum": body(True), "no psum": body(False)}
    for f in fns.values():
        jax.block_until_ready(f(x, w))
    for _ in range(2):
        for name, f in fns.items():
            wall, cpu = _timed(f, (x, w), calls=5, rounds=9)
            print(f"device 0 computes, {name:26s} wall {wall * 1e3:7.2f} ms  cpu {cpu * 1e3:7.2f} ms  "
                  f"cores busy {cpu / wall:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

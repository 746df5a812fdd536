"""Does XLA:CPU run an all-reduce beside compute that does not depend on it?

    PYTHONPATH=. python scripts/experiments/overlap_probe.py --link rate=10gbit,delay=50us   # 2 processes (root)
    PYTHONPATH=. python scripts/experiments/overlap_probe.py --link loopback                 # 2 processes
    PYTHONPATH=. python scripts/experiments/overlap_probe.py --in-process 8                  # 8 CPU devices

Four jitted data-parallel functions (``shard_map`` over every device), each compiled once and
measured in interleaved rounds: ``comm`` (a psum of ``--floats`` float32), ``compute`` (a chain of
``--matmuls`` tanh(w @ w) on a ``--matrix`` square), ``both_independent`` (both, neither using the
other's result) and ``both_dependent`` (the psum waits for the chain). If the all-reduce ran beside
the chain, ``both_independent`` would take about the longer of the two; if it runs alone, their sum,
as ``both_dependent`` must. Printed per process: the medians (ms) and
``overlap = (comm + compute - both_independent) / min(comm, compute)`` (1: fully hidden, 0: none).
Across processes each worker runs in its own network namespace behind the emulated link
(:class:`disco.runtime.testbed.Testbed`, gloo), or on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ("comm", "compute", "both_independent", "both_dependent")


def measure(floats: int, matrix: int, matmuls: int, rounds: int, steps: int) -> dict[str, float]:
    """The four variants' medians (ms) on this process's devices (jax set up already)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((len(jax.devices()),), ("dp",))
    sharding = NamedSharding(mesh, P("dp"))
    local = len(jax.local_devices())
    x = jax.make_array_from_process_local_data(sharding, np.ones((local * floats,), np.float32))
    w = jax.make_array_from_process_local_data(
        sharding, np.tile(np.eye(matrix, dtype=np.float32) * 0.5 + 0.01, (local, 1)))

    def chain(m):
        for _ in range(matmuls):
            m = jnp.tanh(m @ m)
        return m

    def dependent(x, w):
        c = chain(w)
        return jax.lax.psum(x + 0 * c[0, 0], "dp"), c

    bodies = {"comm": lambda x, w: (jax.lax.psum(x, "dp"), w), "compute": lambda x, w: (x, chain(w)),
              "both_independent": lambda x, w: (jax.lax.psum(x, "dp"), chain(w)), "both_dependent": dependent}
    fns = {n: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("dp"), P("dp")), out_specs=P("dp"),
                                    check_vma=False)).lower(x, w).compile() for n, f in bodies.items()}
    for f in fns.values():
        jax.block_until_ready(f(x, w))
    times: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(rounds):
        for n in VARIANTS[r % 4:] + VARIANTS[:r % 4]:
            t0 = time.perf_counter()
            for _ in range(steps):
                jax.block_until_ready(fns[n](x, w))
            times[n].append((time.perf_counter() - t0) / steps)
    return {n: 1e3 * statistics.median(v) for n, v in times.items()}


def overlap(ms: dict[str, float]) -> float:
    return (ms["comm"] + ms["compute"] - ms["both_independent"]) / min(ms["comm"], ms["compute"])


def worker(argv: list[str]) -> None:
    """``--worker PID COORDINATOR OUT FLOATS MATRIX MATMULS ROUNDS STEPS``: one of two processes."""
    pid, coordinator, out = int(argv[0]), argv[1], argv[2]
    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2, process_id=pid,
                               heartbeat_timeout_seconds=600)
    ms = measure(*map(int, argv[3:8]))
    jax.distributed.shutdown()
    with open(out, "w") as f:
        json.dump({"process": pid, "median_ms": ms}, f)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link", help="2 processes on this emulated link (rate=...,delay=...) or 'loopback'")
    ap.add_argument("--in-process", type=int, metavar="N", help="N CPU devices in this process instead")
    ap.add_argument("--floats", type=int, default=4_000_000, help="float32 in the psum, per device")
    ap.add_argument("--matrix", type=int, default=384)
    ap.add_argument("--matmuls", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = [str(v) for v in (args.floats, args.matrix, args.matmuls, args.rounds, args.steps)]
    if args.in_process:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.in_process}"
        results = [{"process": "in-process", "median_ms": measure(*map(int, sizes))}]
    elif args.link:
        from disco.runtime.testbed import Testbed, is_loopback, parse_link

        out = tempfile.mkdtemp(prefix="overlap-")

        def launch(wrap, host: str) -> None:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
            procs = [subprocess.Popen(wrap(i, [*cmd, str(i), f"{host}:23456", f"{out}/{i}.json", *sizes]))
                     for i in range(2)]
            if any(p.wait(timeout=900) != 0 for p in procs):
                raise SystemExit("a worker failed (its stderr is above)")

        if is_loopback(args.link):
            launch(lambda i, cmd: cmd, "127.0.0.1")
        else:
            with Testbed(2, parse_link(args.link)) as tb:
                launch(tb.wrap, tb.address(0))
        results = []
        for i in range(2):
            with open(f"{out}/{i}.json") as f:
                results.append(json.load(f))
    else:
        ap.error("expected --link or --in-process")
    for r in results:
        ms = r["median_ms"]
        print(f"process {r['process']}: " + ", ".join(f"{n} {ms[n]:.2f} ms" for n in VARIANTS)
              + f"; overlap {overlap(ms):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmarks the plan service under gunicorn on 127.0.0.1.

Starts ``gunicorn -w 2 [--threads T] 'service:create_app()'`` on a free loopback port with a fresh
database, warms one cached plan (mlp tiny, 4 devices), then sends ``--requests``
cached-plan requests (``POST /v1/plans`` with the full HLO text, as ``xla_hooks.jit``
does) from ``--clients`` threads, each with its own keep-alive connection, stopping
after ``--max-seconds`` at the latest. Reports requests/s and p50/p99 latency, then the
time of one cold plan request for mlp small on 8 devices (POST until the job is
done; its HLO is checked in the server's child process first). The 1-minute load
average before and after is reported, since a busy machine moves every figure. The
server is stopped (its process group killed) on exit.

``--postgres`` stores in PostgreSQL instead of SQLite: a throwaway server
(:class:`service.testing.PostgresServer`), or the database of ``--db URL``. ``--replicas N``
starts N such gunicorn servers on the one database; client thread i sends to replica i mod N
(no proxy in between), and the warm-up's plan is stored once and read by all.

Usage:
  python scripts/tools/bench_service.py [--requests 2000] [--clients 4] [--threads 1] [--budget 5] [--json]
  python scripts/tools/bench_service.py --postgres [--db postgresql://...] [--replicas 2] --requests 500 --clients 4
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def hlo(model: str, preset: str, devices: int) -> str:
    import disco
    import trax_models

    step, args = trax_models.make_train_step(model, preset, devices=devices, optimizer="sgd")
    return disco.hlo_text(step, *args)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    from service.testing import ServerProcess

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000, help="cached-plan requests in all (default 2000)")
    p.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="stop sending after this long (default 60)")
    p.add_argument("--budget", type=float, default=5.0, help="search budget_s of the cold request (default 5)")
    p.add_argument("--strategy", default="auto", help="strategy of the cold request (default auto)")
    p.add_argument("--threads", type=int, default=1,
                   help="gunicorn --threads per worker (default 1: sync workers, as the documented command)")
    p.add_argument("--postgres", action="store_true", help="store in PostgreSQL (a throwaway server unless --db)")
    p.add_argument("--db", help="with --postgres: a postgresql:// URL of an existing database to use")
    p.add_argument("--replicas", type=int, default=1, help="gunicorn servers on one database (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.replicas < 1:
        p.error(f"--replicas: expected an integer >= 1, got {args.replicas}")
    if args.db and not args.postgres:
        p.error("--db: expected together with --postgres (the SQLite run makes its own file)")

    load_before = os.getloadavg()[0]
    tiny = hlo("mlp", "tiny", 4)
    small = hlo("mlp", "small", 8)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if args.postgres and not args.db:
            from service.testing import PostgresServer

            database = stack.enter_context(PostgresServer()).create_database("bench")
        else:
            database = args.db or str(Path(tmp) / "bench.sqlite")
        servers = [ServerProcess(database, gunicorn=True, gunicorn_workers=2, gunicorn_threads=args.threads,
                                 workers=1, log=Path(tmp) / f"server{i}.log") for i in range(args.replicas)]
        for srv in servers:
            stack.enter_context(srv)
        server = servers[0]
        body = json.dumps({"hlo_text": tiny, "cluster": "local", "devices": 4,
                           "options": {"strategy": "baselines"}}).encode()
        status, first, _ = server.request("POST", "/v1/plans", raw=body)
        if status == 202:
            job = server.wait_job(first["job_id"], timeout=60)
            if job["state"] != "done":
                raise SystemExit(f"warm-up job failed: {job}")
        # both gunicorn workers of each replica parse the HLO once (fingerprint cache), outside the measurement
        for srv in servers:
            for _ in range(8):
                assert srv.request("POST", "/v1/plans", raw=body)[0] == 200

        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        counter = iter(range(args.requests))
        stop_at = time.monotonic() + args.max_seconds

        def client(i: int) -> None:
            port = servers[i % len(servers)].port
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            mine: list[float] = []
            try:
                while time.monotonic() < stop_at:
                    with lock:
                        if next(counter, None) is None:
                            break
                    t0 = time.perf_counter()
                    conn.request("POST", "/v1/plans", body=body, headers={"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    mine.append(time.perf_counter() - t0)
                    if resp.status != 200:
                        errors.append(str(resp.status))
                    if resp.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            finally:
                conn.close()
                with lock:
                    latencies.extend(mine)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0

        cold_body = {"hlo_text": small, "cluster": "local", "devices": 8,
                     "options": {"strategy": args.strategy, "budget_s": args.budget}}
        t1 = time.perf_counter()
        status, resp, _ = server.request("POST", "/v1/plans", cold_body, timeout=120)
        post_s = time.perf_counter() - t1
        job = server.wait_job(resp["job_id"], timeout=args.budget + 120) if status == 202 else {"state": "cached"}
        cold_s = time.perf_counter() - t1
        report = (job.get("result") or {}).get("report", {})

    out = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "loadavg_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "server": (f"{args.replicas} x " if args.replicas > 1 else "") + f"gunicorn -w 2 --threads {args.threads}, "
                  f"127.0.0.1, {'PostgreSQL' if args.postgres else 'SQLite'}",
        "cached": {"requests": len(latencies), "clients": args.clients, "errors": len(errors),
                   "body_bytes": len(body), "seconds": wall, "requests_per_s": len(latencies) / wall,
                   "p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3,
                   "mean_ms": statistics.fmean(latencies) * 1e3},
        "cold_mlp_small_8": {"post_ms": post_s * 1e3, "total_s": cold_s, "state": job["state"],
                             "strategy": args.strategy, "budget_s": args.budget,
                             "method": report.get("method"), "plan_ms": report.get("plan_ms"),
                             "xla_default_ms": report.get("baselines_ms", {}).get("xla_default"),
                             "job_elapsed_s": report.get("elapsed_s"),
                             "search": {k: v for k, v in report.get("search", {}).items() if k != "start_ms"}},
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        c, k = out["cached"], out["cold_mlp_small_8"]
        print(f"{out['server']} on {out['machine']}, load average {load_before:.1f} before, "
              f"{out['loadavg_1min']['after']:.1f} after")
        print(f"cached plan (mlp tiny HLO, {c['body_bytes']} B body): {c['requests']} requests from "
              f"{c['clients']} clients in {c['seconds']:.2f} s: {c['requests_per_s']:.0f} req/s, "
              f"p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms, errors {c['errors']}")
        print(f"cold plan (mlp small, 8 devices, strategy {k['strategy']}, budget {k['budget_s']} s): "
              f"POST {k['post_ms']:.0f} ms, done after {k['total_s']:.2f} s ({k['state']}, method {k['method']}, "
              f"plan {k['plan_ms']} ms vs xla_default {k['xla_default_ms']} ms simulated)")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())

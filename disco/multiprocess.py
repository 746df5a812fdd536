"""Data parallelism across local processes joined with ``jax.distributed`` over 127.0.0.1.

In-process virtual devices share one address space; real jobs run one process per
accelerator with a network in between. :func:`launch` starts ``P`` worker processes
(``python -m disco.mp_worker``), each with ``D`` local CPU devices and gloo collectives,
runs the same plans on all of them and gathers every process's results. Workers that
fail or hang are killed (their whole process group) after a timeout and reported;
nothing is left running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What every worker runs."""

    model: str = "mlp"
    preset: str = "tiny"
    plans: tuple[str, ...] = ("xla_default", "per_tensor", "horovod", "ddp")
    rounds: int = 5
    steps: int = 3
    optimizer: str = "adamw"
    check_steps: int = 0  # >0: also run this many steps per plan and report parameter digests


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    processes: int
    devices_per_process: int
    results: tuple[dict[str, Any], ...]  # one JSON object per process, by process id
    failures: tuple[str, ...]  # "process i: why" for each worker that failed or hung
    pids: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.results) == self.processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def launch(processes: int, devices_per_process: int, spec: WorkerSpec, *, timeout_s: float = 600,
           env: dict[str, str] | None = None) -> LaunchResult:
    """Runs ``spec`` on ``processes`` local workers and gathers their JSON results.

    Raises:
      ValueError: processes or devices_per_process below 1.
    """
    if processes < 1 or devices_per_process < 1:
        raise ValueError(f"--processes and --devices-per-process must be >= 1, got {processes} and "
                         f"{devices_per_process}")
    port = free_port()
    outdir = tempfile.mkdtemp(prefix="disco-mp-")
    base_env = dict(os.environ if env is None else env)
    base_env.pop("XLA_FLAGS", None)  # each worker sets its own device count
    procs: list[subprocess.Popen] = []
    logs = []
    for i in range(processes):
        out = os.path.join(outdir, f"result_{i}.json")
        log = open(os.path.join(outdir, f"worker_{i}.log"), "w")
        logs.append(log)
        cmd = [sys.executable, "-m", "disco.mp_worker", "--process-id", str(i),
               "--num-processes", str(processes), "--port", str(port),
               "--devices-per-process", str(devices_per_process), "--out", out,
               "--spec", json.dumps(dataclasses.asdict(spec))]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=base_env,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout_s
    failures: list[str] = []
    try:
        for i, p in enumerate(procs):
            left = max(0.1, deadline - time.monotonic())
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                failures.append(f"process {i}: no result after {timeout_s:.0f}s; killed")
                continue
            if rc != 0:
                failures.append(f"process {i}: exited with status {rc}: {_tail(outdir, i)}")
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
        for log in logs:
            log.close()
    results = []
    for i in range(processes):
        path = os.path.join(outdir, f"result_{i}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    return LaunchResult(processes, devices_per_process, tuple(results), tuple(failures),
                        tuple(p.pid for p in procs))


def _tail(outdir: str, i: int, n: int = 3) -> str:
    try:
        with open(os.path.join(outdir, f"worker_{i}.log")) as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("[Gloo]")]
        return " | ".join(lines[-n:])
    except OSError:
        return "(no log)"


def combine(result: LaunchResult) -> list[dict[str, Any]]:
    """Per plan: the slowest process's median (a data-parallel step is as slow as its slowest worker)."""
    if not result.results:
        return []
    names = [r["plan"] for r in result.results[0]["results"]]
    rows = []
    for name in names:
        per = [next(x for x in r["results"] if x["plan"] == name) for r in result.results]
        rows.append({
            "plan": name,
            "median_ms": max(p["median_ms"] for p in per),
            "min_ms": min(p["min_ms"] for p in per),
            "max_ms": max(p["max_ms"] for p in per),
            "all_reduces": per[0]["all_reduces"],
            "applied": all(p["applied"] for p in per),
            "plan_digests": sorted({p["plan_digest"] for p in per}),
        })
    base = next((r["median_ms"] for r in rows if r["plan"] == "xla_default"), None)
    for r in rows:
        r["speedup_vs_xla_default"] = round(base / r["median_ms"], 4) if base and r["median_ms"] else None
    return rows


def stray_processes(pids: Sequence[int]) -> list[int]:
    """The pids among ``pids`` that are still alive."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            alive.append(pid)
    return alive

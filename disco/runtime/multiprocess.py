"""Data parallelism across local processes joined with ``jax.distributed`` (gloo).

In-process virtual devices share one address space; real jobs run one process per
accelerator with a network in between. :func:`launch` starts ``P`` worker processes
(``python -m disco.runtime.worker``), each with ``D`` local CPU devices and gloo collectives,
runs the same task on all of them (measure plans, or time all-reduces for a calibration)
and gathers every process's results. The workers talk over 127.0.0.1, or, given a
:class:`~disco.runtime.testbed.LinkSpec`, each in its own network namespace behind an emulated link
of that rate and delay (:mod:`disco.runtime.testbed`). When a worker fails the others are given
``grace_s`` to finish and then killed; workers still running at the timeout are killed
(their whole process group, and with a link everything in their namespaces) and reported;
nothing is left running, also when the launch is interrupted (Ctrl-C, or SIGTERM/SIGHUP,
which a launch turns into SystemExit while it runs: the workers are in sessions of their own,
so nothing else would stop them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trax_models import STYLES

if TYPE_CHECKING:
    from disco.runtime.testbed import LinkSpec, Testbed

COORDINATOR_PORT = 47613  # inside worker 0's own namespace: nothing else listens there


TASKS = ("bench", "calibrate", "jit")
PMAP_PROCESSES = ("style 'pmap' runs on one process only (its global arguments do not reach jax.pmap over the "
                  "devices of several processes); expected --processes 1, or style shard_map or gspmd")


class WorkersFailed(RuntimeError):
    """The worker processes of a launch failed (timed out, crashed, or reported an error); the
    message says what each failed process said. ``disco`` prints it as one line."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What every worker runs."""

    task: str = "bench"  # "bench": measure plans; "calibrate": time all-reduces of sizes; "jit": xla_hooks.jit
    model: str = "mlp"
    preset: str = "tiny"
    plans: tuple[str, ...] = ("xla_default", "per_tensor", "horovod", "ddp")  # baseline items or .json files
    rounds: int = 5
    steps: int = 3
    optimizer: str = "adamw"
    style: str = "shard_map"  # how the zoo step is written (trax_models.STYLES)
    # style "fsdp": the (data, fsdp) mesh over all the processes' devices, process-major (None: 1-D, (1, devices))
    mesh_shape: tuple[int, int] | None = None
    check_steps: int = 0  # >0: also run this many steps per plan and report parameter digests
    comm_free_bound: bool = False  # bench: also measure the step with its all-reduces replaced by copies
    sizes: tuple[int, ...] = ()  # calibrate: all-reduce bytes per device (default disco.runtime.allreduce_timing.SIZES)
    reps: int = 20  # calibrate: repetitions per size
    # calibrate: also time executables of k chained all-reduces per size, for each k here
    # (disco.runtime.allreduce_timing.measure_chained); bench: when set, the workers also run that calibration in
    # the same launch, after the rounds (sizes: ``sizes``, repetitions: ``reps``)
    chain: tuple[int, ...] = ()
    # jit: one fresh xla_hooks.jit per scenario, each a JSON object: name, services (one URL per
    # process, "" for the local planner), and optionally timeout_s, agree_timeout_s, token, options
    scenarios: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"WorkerSpec.task: expected one of {', '.join(TASKS)}, got {self.task!r}")
        if self.style not in STYLES:
            raise ValueError(f"WorkerSpec.style: expected one of {', '.join(STYLES)}, got {self.style!r}")
        if self.mesh_shape is not None:
            if self.style != "fsdp":
                raise ValueError(f"WorkerSpec.mesh_shape {self.mesh_shape!r} is for style 'fsdp' only, got style "
                                 f"{self.style!r}")
            shape = self.mesh_shape
            if (not isinstance(shape, tuple) or len(shape) != 2
                    or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in shape)):
                raise ValueError(f"WorkerSpec.mesh_shape: expected None or (data, fsdp), a tuple of two ints >= 1, "
                                 f"got {shape!r}")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.chain):
            raise ValueError(f"WorkerSpec.chain: expected all-reduce counts (integers >= 1), got {self.chain!r}")


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    processes: int
    devices_per_process: int
    results: tuple[dict[str, Any], ...]  # one JSON object per process, by process id
    failures: tuple[str, ...]  # "process i: why" for each worker that failed or hung
    pids: tuple[int, ...]
    link: LinkSpec | None = None  # None: 127.0.0.1
    switch_stats: dict[str, float] | None = None  # the emulated switch's (disco.runtime.testbed._switch.run)
    testbed_prefix: str | None = None  # the name prefix of the testbed's namespaces (disco.runtime.testbed.leftovers)

    def link_info(self) -> dict[str, Any]:
        """What the workers talked over, for JSON output."""
        if self.link is None:
            return {"link": "loopback"}
        out: dict[str, Any] = {"link": self.link.describe(), "link_label": self.link.label(),
                               "link_detail": self.link.to_dict()}
        if self.switch_stats:
            st = self.switch_stats
            out["switch"] = {"packets": st.get("packets"), "bytes": st.get("bytes"), "lost": st.get("lost"),
                             "late_mean_us": round(st.get("late_mean_s", 0.0) * 1e6, 1),
                             "late_max_us": round(st.get("late_max_s", 0.0) * 1e6, 1)}
        return out

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.results) == self.processes

    def raise_if_failed(self, what: str) -> None:
        """Raises :class:`WorkersFailed` ("<what> failed: <each failure>") unless :attr:`ok`."""
        if not self.ok:
            raise WorkersFailed(f"{what} failed: " + "; ".join(self.failures or ("no results",)))


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
           env: dict[str, str] | None = None, link: LinkSpec | None = None, grace_s: float = 10.0,
           on_started: Callable[[tuple[int, ...]], None] | None = None,
           worker: str = "disco.runtime.worker") -> LaunchResult:
    """Runs ``spec`` on ``processes`` local workers and gathers their JSON results.

    Args:
      processes, devices_per_process: the workers and each one's CPU devices.
      spec: what every worker runs.
      timeout_s: seconds before workers still running are killed.
      env: the workers' environment (default: this process's, without XLA_FLAGS).
      link: None: the workers talk over 127.0.0.1; a LinkSpec: each runs in its own network
        namespace behind an emulated link (:class:`disco.runtime.testbed.Testbed`), torn down on return.
      grace_s: after a worker fails, seconds the others get before they are killed (they are
        usually stuck in a collective with the one that died).
      on_started: called with the workers' pids once all are started (tests kill one).
      worker: the module each worker runs with ``python -m`` (tests pass one that wraps
        :mod:`disco.runtime.worker` to inject a fault); it takes :mod:`disco.runtime.worker`'s arguments.

    Raises:
      ValueError: processes or devices_per_process below 1, or a pmap-style step on several processes.
      PermissionError: a link where network namespaces are not permitted.
    """
    if processes < 1 or devices_per_process < 1:
        raise ValueError(f"--processes and --devices-per-process must be >= 1, got {processes} and "
                         f"{devices_per_process}")
    if spec.style == "pmap" and processes > 1:
        raise ValueError(PMAP_PROCESSES)
    if spec.mesh_shape is not None and spec.mesh_shape[0] * spec.mesh_shape[1] != processes * devices_per_process:
        raise ValueError(f"mesh {spec.mesh_shape[0]}x{spec.mesh_shape[1]} has {spec.mesh_shape[0] * spec.mesh_shape[1]} "
                         f"devices and {processes} processes x {devices_per_process} devices have "
                         f"{processes * devices_per_process}; expected a data x fsdp mesh of all of them")
    with _terminate_as_exit():
        if link is None:
            return _launch(processes, devices_per_process, spec, None, timeout_s, env, grace_s, on_started, worker)
        from disco.runtime.testbed import Testbed

        with Testbed(processes, link) as tb:
            res = _launch(processes, devices_per_process, spec, tb, timeout_s, env, grace_s, on_started, worker)
    return dataclasses.replace(res, link=link, switch_stats=tb.stats, testbed_prefix=tb.prefix)


def _exit_on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit inside the block (where their handler is the default
    one and this is the main thread), so that the launch's ``finally`` kills the workers: they run
    in sessions of their own, and a launcher that a signal ended outright left them running (and
    their directory of logs)."""
    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                old[sig] = signal.signal(sig, _exit_on_signal)
    try:
        yield
    finally:
        for sig, handler in old.items():
            if signal.getsignal(sig) is _exit_on_signal:
                signal.signal(sig, handler)


def _launch(processes: int, devices_per_process: int, spec: WorkerSpec, tb: Testbed | None, timeout_s: float,
            env: dict[str, str] | None, grace_s: float,
            on_started: Callable[[tuple[int, ...]], None] | None, worker: str = "disco.runtime.worker") -> LaunchResult:
    coordinator = f"127.0.0.1:{free_port()}" if tb is None else f"{tb.address(0)}:{COORDINATOR_PORT}"
    outdir = tempfile.mkdtemp(prefix="disco-mp-")
    base_env = dict(os.environ if env is None else env)
    base_env.pop("XLA_FLAGS", None)  # each worker sets its own device count
    procs: list[subprocess.Popen] = []
    logs = []
    failures: list[str] = []
    try:
        for i in range(processes):
            out = os.path.join(outdir, f"result_{i}.json")
            log = open(os.path.join(outdir, f"worker_{i}.log"), "w")
            logs.append(log)
            cmd = [sys.executable, "-m", worker, "--process-id", str(i),
                   "--num-processes", str(processes), "--coordinator", coordinator,
                   "--devices-per-process", str(devices_per_process), "--out", out,
                   "--spec", json.dumps(dataclasses.asdict(spec))]
            procs.append(subprocess.Popen(cmd if tb is None else tb.wrap(i, cmd), stdout=log,
                                          stderr=subprocess.STDOUT, env=base_env, start_new_session=True))
        if on_started is not None:
            on_started(tuple(p.pid for p in procs))
        failures = _wait(procs, outdir, timeout_s, grace_s, tb)
        results = []
        for i in range(processes):
            path = os.path.join(outdir, f"result_{i}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
    finally:  # also on Ctrl-C or an error here: no worker and no directory of its logs left behind
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
        for log in logs:
            log.close()
        shutil.rmtree(outdir, ignore_errors=True)
    return LaunchResult(processes, devices_per_process, tuple(results), tuple(failures),
                        tuple(p.pid for p in procs))


def _wait(procs: list[subprocess.Popen], outdir: str, timeout_s: float, grace_s: float,
          tb: Testbed | None) -> list[str]:
    """Waits for every worker; after the first failure the others get ``grace_s`` more. Returns
    the failures ("process i: why")."""
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    failures: dict[int, str] = {}
    while True:
        running = [i for i, p in enumerate(procs) if p.poll() is None]
        for i, p in enumerate(procs):
            if i not in failures and p.returncode not in (None, 0):
                failures[i] = f"process {i}: exited with status {p.returncode}: {_tail(outdir, i)}"
                failed_at = failed_at or time.monotonic()
        if not running:
            break
        now = time.monotonic()
        if tb is not None and not tb.switch_alive():
            for i in running:
                failures[i] = f"process {i}: the emulated switch died; killed"
            break
        if now >= deadline or (failed_at is not None and now >= failed_at + grace_s):
            why = (f"no result after {timeout_s:.0f}s" if now >= deadline
                   else f"still running {grace_s:.0f}s after another process failed")
            for i in running:
                failures[i] = f"process {i}: {why}; killed"
            break
        time.sleep(0.05)
    return [failures[i] for i in sorted(failures)]


def _tail(outdir: str, i: int, n: int = 3) -> str:
    try:
        with open(os.path.join(outdir, f"worker_{i}.log")) as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("[Gloo]")]
        return " | ".join(lines[-n:])
    except OSError:
        return "(no log)"


def combine(result: LaunchResult) -> list[dict[str, Any]]:
    """Per plan, over the processes: the median, min and max of the per-round step time of the
    slowest process (a data-parallel step is as slow as its slowest worker), and the paired
    speedup over xla_default (:func:`xla_hooks.measure.paired_speedup` on those per-round times)
    with its 90% bootstrap interval (``paired_interval``); ``applied`` where every process applied the
    plan, else the first process's ``fallback_reason``; ``peak_memory_bytes`` the largest process's
    compiled peak per device (None where a process reported none)."""
    from xla_hooks.measure import Measurement, paired_interval, paired_speedup

    if not result.results:
        return []
    names = [r["plan"] for r in result.results[0]["results"]]
    rows = []
    per_round: dict[str, Measurement] = {}
    for name in names:
        per = [next(x for x in r["results"] if x["plan"] == name) for r in result.results]
        rounds = [max(s) for s in zip(*(p["samples_ms"] for p in per))]
        m = per_round[name] = Measurement(tuple(rounds))
        rows.append({
            "plan": name,
            "median_ms": m.median, "min_ms": m.min, "max_ms": m.max, "samples_ms": rounds,
            "all_reduces": per[0]["all_reduces"],
            "applied": all(p["applied"] for p in per),
            "fallback_reason": next((p["fallback_reason"] for p in per if not p["applied"]), None),
            "plan_digests": sorted({p["plan_digest"] for p in per}),
            # the largest process's: the device that must hold it (None where a process read none)
            "peak_memory_bytes": (None if any(p.get("peak_memory_bytes") is None for p in per)
                                  else max(p["peak_memory_bytes"] for p in per)),
        })
    base = per_round.get("xla_default")
    for r in rows:
        # unrounded: the optimizer's rules compare these with 1.0 (printers round)
        r["speedup_vs_xla_default"] = base.median / r["median_ms"] if base and r["median_ms"] else None
        r["paired_speedup"] = paired_speedup(base, per_round[r["plan"]]) if base else None
        r["paired_interval"] = list(paired_interval(base, per_round[r["plan"]])) if base else None
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

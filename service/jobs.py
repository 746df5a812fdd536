"""Plan workers: threads that claim jobs from the database, run them, and keep their leases.

One :class:`JobRunner` per app and process, made and started by :func:`get_runner` on
the first request the process serves (``init_app`` registers that), never by
``create_app``: an app built before a fork (gunicorn ``--preload``) has no threads to
lose, and each worker process starts its own runner. ``disco serve --plan-workers-only``
runs a runner without the HTTP server (:func:`run_workers`): plan workers on other hosts
against the same PostgreSQL database.

``Store.submit`` commits a new queued job; the API refuses it (failed, 503) when more than
``QUEUE_SIZE`` jobs are queued in the database, else wakes this process's workers. Worker
threads claim the oldest queued job from the database (whichever process queued it), run
:func:`disco.planner.plan_for_graph` on its stored inputs and store the plan and report; an
idle worker looks again every ``POLL_S``. A sweeper thread renews the lease of the jobs this
process runs (every ``lease_s / 5`` at most ``HEARTBEAT_S``) and takes over jobs whose lease
expired or whose owner died (see :mod:`service.store`), so a job outlives the process that ran
it; a job this process lost (its worker could not write the job's end) expires too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, current_app

from disco.planner import Cancelled
from service import inputs, limits
from service.store import DEFAULT_LEASE_S, Store, is_database_error

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
POLL_S = 0.5


class JobTimeout(Cancelled):
    """The job ran past JOB_TIMEOUT_S."""


class JobRunner:
    """Worker threads that claim jobs from the database.

    Args:
      database: the SQLite file or the PostgreSQL URL.
      workers: number of worker threads (0: this process runs no job; others claim its jobs).
      job_timeout_s: a job running longer is failed (checked at each progress report).
      lease_s: how long a claimed job stays this process's without a renewal; after it, another
        process takes the job over (a process that dies is noticed this late, or at once on its own host).
    """

    def __init__(self, database: str, *, workers: int = 1, job_timeout_s: float = 600.0,
                 lease_s: float = DEFAULT_LEASE_S):
        self.database = database
        self.workers = workers
        self.job_timeout_s = job_timeout_s
        self.lease_s = lease_s
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._held: set[str] = set()  # ids running here: the ones whose lease is renewed

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Takes over orphaned jobs and starts the worker and sweeper threads (once)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        if self.workers <= 0:
            return
        try:
            self.sweep()
        except Exception:  # noqa: BLE001 - a database that takes no write still serves reads; the sweeper retries
            log.exception("job sweep at start failed")
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"disco-plan-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._sweeper, name="disco-plan-sweeper", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout)

    # -- submitting --------------------------------------------------------------------------------
    def notify(self) -> None:
        """Wakes this process's idle workers (a job was queued here); others find it within ``POLL_S``."""
        self._wake.set()

    def sweep(self) -> None:
        """Renews the leases of the jobs running here and takes over (re-queues or fails) expired ones."""
        with Store(self.database) as store:
            with self._lock:
                held = set(self._held)
            store.heartbeat(held, self.lease_s)
            if store.recover(held):
                self._wake.set()

    def _sweeper(self) -> None:
        every = min(HEARTBEAT_S, self.lease_s / 5)
        while not self._stop.wait(every):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - keep sweeping; the database may be busy
                log.exception("job sweep failed")

    # -- working -----------------------------------------------------------------------------------
    def _work(self) -> None:
        store: Store | None = None
        try:
            while not self._stop.is_set():
                try:
                    if store is None:
                        store = Store(self.database)  # one connection per thread
                    job_id = self._claim(store)
                except Exception as e:  # noqa: BLE001 - the database may be busy or gone for a moment
                    log.warning("claiming a job failed: %s: %s", type(e).__name__, e)
                    store, job_id = _reopen(store), None
                if job_id is None:
                    self._wake.wait(POLL_S)
                    self._wake.clear()
                    continue
                try:
                    self._run(store, job_id)
                except Exception:  # noqa: BLE001 - a worker never dies
                    log.exception("job %s crashed the worker loop", job_id)
                    store = _reopen(store)
                finally:
                    with self._lock:
                        self._held.discard(job_id)  # ended, or lost (its end not written): its lease runs out
        finally:
            if store is not None:
                store.close()

    def _claim(self, store: Store) -> str | None:
        job_id = store.claim(self.lease_s)  # leased from now: no sweep takes it over before it is held here
        if job_id is not None:
            with self._lock:
                self._held.add(job_id)
        return job_id

    def _run(self, store: Store, job_id: str) -> None:
        job = store.get_job(job_id)
        request = store.job_request(job_id)
        if job is None or request is None:
            store.fail_job(job_id, "no_inputs", "the job's inputs are not stored")
            return
        try:
            from disco import planner

            graph = inputs.graph_from_stored(request)
            cluster = inputs.cluster_from_stored(request)
            deadline = time.monotonic() + self.job_timeout_s
            last = [0.0]

            def progress(frac: float, msg: str) -> None:
                if time.monotonic() > deadline:
                    raise JobTimeout(f"job ran past JOB_TIMEOUT_S={self.job_timeout_s:g} s")
                now = time.monotonic()
                if now - last[0] >= 0.25 or frac >= 1.0:
                    last[0] = now
                    _report_progress(store, job_id, frac, msg)

            options = dict(request["options"])
            options["budget_s"] = min(float(options["budget_s"]), 0.8 * self.job_timeout_s)
            compile_fn = None
            if options.get("tier") == "compiled":  # resolved when the job was queued (inputs.planner_options)
                # compiles stop short of the job's deadline, so the plans compiled by then still rank
                compile_fn = compiler(request, cluster, deadline - max(5.0, 0.05 * self.job_timeout_s))
            plan, report = planner.plan_for_graph(graph, cluster, options, progress, compile_fn=compile_fn,
                                                  compile_limit=limits.MAX_CANDIDATES)
            if options.get("tier") is None:  # an emulated request: why the compiled tier did not rank it
                report["tier_note"] = (inputs.compiled_tier_unavailable("hlo_text" in request, cluster)
                                       or "the request asked for the emulated tier")
            if "environment" in request:  # part of the key: the client checks its plan was made for it
                report = {**report, "environment": request["environment"]}
            # what a job that runs trials measures (POST /v1/plans answers as many as it asks for)
            report = {**report, "candidates": planner.candidates(graph, plan, report, limits.MAX_CANDIDATES)}
            if time.monotonic() > deadline:
                raise JobTimeout(f"job ran past JOB_TIMEOUT_S={self.job_timeout_s:g} s")
            tl = planner.timeline(graph, cluster, plan)
            store.finish_job(job_id, job["key"], graph.fingerprint, plan.to_dict(), report, tl)
        except JobTimeout as e:
            store.fail_job(job_id, "timeout", str(e))
        except NoCompiler as e:
            store.fail_job(job_id, "no_compiler", str(e))
        except ValueError as e:
            store.fail_job(job_id, "invalid_input", str(e))
        except Exception as e:  # noqa: BLE001 - the job fails, the server stays up
            log.exception("job %s failed", job_id)
            store.fail_job(job_id, "internal", f"{type(e).__name__}: {e}")


class NoCompiler(RuntimeError):
    """A job queued for the compiled tier runs where that tier cannot (another plan worker's host)."""


def compiler(request: dict[str, Any], cluster: Any, deadline: float) -> Callable[[Any], str]:
    """The compile function of a job queued for the compiled tier: its stored HLO text compiled for the
    cluster's device (:func:`xla_hooks.compile_for.plan_compiler`), no compile begun past ``deadline``.

    Raises:
      NoCompiler: the compiled tier cannot run in this process (the job was queued where it could).
    """
    from xla_hooks import compile_for

    problem = inputs.compiled_tier_unavailable("hlo_text" in request, cluster)
    if problem is not None:
        raise NoCompiler(f"the job asks for the compiled tier, which cannot run on this plan worker: {problem}")
    return compile_for.plan_compiler(request["hlo_text"], device=cluster.device, devices=cluster.num_devices,
                                     deadline=deadline)


def _report_progress(store: Store, job_id: str, frac: float, msg: str) -> None:
    """Stores a job's progress; a write that fails (database locked, disk full) is logged, not raised.

    Progress is advisory (the sweeper keeps the heartbeat): an error raised into the planner
    would cut its search short and store the best baseline as the job's plan.
    """
    try:
        store.set_progress(job_id, frac, msg)
    except Exception as e:
        if not is_database_error(e):
            raise
        log.warning("job %s: progress not stored: %s", job_id, e)


_RUNNER = "disco_jobs"
_RUNNER_LOCK = "disco_jobs_lock"


def init_app(app: Flask) -> None:
    """Makes the first request of each process start that process's job runner."""
    app.extensions[_RUNNER_LOCK] = threading.Lock()
    app.before_request(_start_runner)


def _start_runner() -> None:
    get_runner()  # a before_request hook must return None


def get_runner(app: Flask | None = None) -> JobRunner:
    """The app's job runner in this process, made and started on first use.

    Args:
      app: the app (default: the current one).
    """
    app = app or current_app._get_current_object()
    runner = app.extensions.get(_RUNNER)
    if runner is None:
        with app.extensions[_RUNNER_LOCK]:
            runner = app.extensions.get(_RUNNER)
            if runner is None:
                runner = JobRunner(app.config["DATABASE"], workers=app.config["WORKERS"],
                                   job_timeout_s=float(app.config["JOB_TIMEOUT_S"]),
                                   lease_s=float(app.config["JOB_LEASE_S"]))
                runner.start()
                app.extensions[_RUNNER] = runner
    return runner


def _reopen(store: Store | None) -> Store | None:
    """Closes a worker's connection after an error (a new one is opened on the next try)."""
    if store is not None:
        try:
            store.close()
        except Exception:  # noqa: BLE001 - it is being dropped
            pass
    time.sleep(POLL_S)
    return None


def stop_runner(app: Flask, timeout: float = 5.0) -> None:
    """Stops the app's runner in this process, if one was started."""
    runner = app.extensions.pop(_RUNNER, None)
    if runner is not None:
        runner.stop(timeout)

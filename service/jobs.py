"""Background plan jobs: a bounded queue, worker threads, and the sweeper that resumes jobs.

One :class:`JobRunner` per app and process, made and started by :func:`get_runner` on
the first request the process serves (``init_app`` registers that), never by
``create_app``: an app built before a fork (gunicorn ``--preload``) has no threads to
lose, and each worker process starts its own runner.

``Store.submit`` commits a new queued job; the API then puts its id on the bounded
queue (``queue.Full``: the job is failed and the caller answers 503). Worker threads
take ids off the queue, run :func:`disco.planner.plan_for_graph` on the job's stored
inputs and store the plan and report. A sweeper thread refreshes the heartbeats of the
jobs this process holds (on its queue or running) and takes over jobs of dead servers
(see :mod:`service.store`), so a job outlives the server that accepted it; a job this
process lost (its worker could not write the job's end) goes stale and is taken over too.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from typing import Any

from flask import Flask, current_app

from disco.planner import Cancelled
from service import inputs
from service.store import Store

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
STALE_S = 15.0
_STOP = object()


class JobTimeout(Cancelled):
    """The job ran past JOB_TIMEOUT_S."""


class JobRunner:
    """Worker threads over a bounded queue of job ids.

    Args:
      db_path: the SQLite file.
      workers: number of worker threads (0: jobs stay queued, e.g. for a read-only replica).
      queue_size: bound of the in-process queue.
      job_timeout_s: a job running longer is failed (checked at each progress report).
    """

    def __init__(self, db_path: str, *, workers: int = 1, queue_size: int = 64, job_timeout_s: float = 600.0):
        self.db_path = db_path
        self.workers = workers
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.job_timeout_s = job_timeout_s
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._held: set[str] = set()  # ids on the queue or running here: the ones whose heartbeat is kept

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Resumes orphaned jobs and starts the worker and sweeper threads (once)."""
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
        for _ in range(self.workers):
            try:
                self.queue.put_nowait(_STOP)
            except queue.Full:
                pass
        for t in self._threads:
            t.join(timeout)

    # -- submitting --------------------------------------------------------------------------------
    def enqueue(self, job_id: str) -> None:
        """Puts ``job_id`` on the queue; raises ``queue.Full``. With no workers, jobs stay queued."""
        if self.workers <= 0:
            return
        with self._lock:
            self._held.add(job_id)
        try:
            self.queue.put_nowait(job_id)
        except queue.Full:
            self._drop(job_id)
            raise

    def _drop(self, job_id: str) -> None:
        with self._lock:
            self._held.discard(job_id)

    def sweep(self) -> None:
        """Refreshes heartbeats and takes over (resumes or fails) jobs of dead servers and jobs lost here."""
        with Store(self.db_path) as store:
            with self._lock:
                held = set(self._held)
            store.heartbeat(held)
            for job_id in store.recover(STALE_S, held):
                try:
                    self.enqueue(job_id)
                    log.info("resumed job %s", job_id)
                except queue.Full:
                    store.release(job_id)  # the next sweep (here or in another process) retries

    def _sweeper(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - keep sweeping; the database may be busy
                log.exception("job sweep failed")

    # -- working -----------------------------------------------------------------------------------
    def _work(self) -> None:
        store = Store(self.db_path)  # one connection per thread
        try:
            while not self._stop.is_set():
                job_id = self.queue.get()
                if job_id is _STOP:
                    return
                try:
                    self._run(store, job_id)
                except Exception:  # noqa: BLE001 - a worker never dies
                    log.exception("job %s crashed the worker loop", job_id)
                finally:
                    self._drop(job_id)  # ended, or lost (its end not written): its heartbeat stops
                    self.queue.task_done()
        finally:
            store.close()

    def _run(self, store: Store, job_id: str) -> None:
        if not store.start_job(job_id):
            return  # not queued any more: done, failed or taken over elsewhere
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
            plan, report = planner.plan_for_graph(graph, cluster, options, progress)
            if "environment" in request:  # part of the key: the client checks its plan was made for it
                report = {**report, "environment": request["environment"]}
            if time.monotonic() > deadline:
                raise JobTimeout(f"job ran past JOB_TIMEOUT_S={self.job_timeout_s:g} s")
            tl = planner.timeline(graph, cluster, plan)
            store.finish_job(job_id, job["key"], graph.fingerprint, plan.to_dict(), report, tl)
        except JobTimeout as e:
            store.fail_job(job_id, "timeout", str(e))
        except ValueError as e:
            store.fail_job(job_id, "invalid_input", str(e))
        except Exception as e:  # noqa: BLE001 - the job fails, the server stays up
            log.exception("job %s failed", job_id)
            store.fail_job(job_id, "internal", f"{type(e).__name__}: {e}")


def _report_progress(store: Store, job_id: str, frac: float, msg: str) -> None:
    """Stores a job's progress; a write that fails (database locked, disk full) is logged, not raised.

    Progress is advisory (the sweeper keeps the heartbeat): an error raised into the planner
    would cut its search short and store the best baseline as the job's plan.
    """
    try:
        store.set_progress(job_id, frac, msg)
    except sqlite3.Error as e:
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
                                   queue_size=app.config["QUEUE_SIZE"],
                                   job_timeout_s=float(app.config["JOB_TIMEOUT_S"]))
                runner.start()
                app.extensions[_RUNNER] = runner
    return runner


def stop_runner(app: Flask, timeout: float = 5.0) -> None:
    """Stops the app's runner in this process, if one was started."""
    runner = app.extensions.pop(_RUNNER, None)
    if runner is not None:
        runner.stop(timeout)

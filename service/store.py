"""The service's store: tables ``plans``, ``jobs``, ``profiles``, ``trials``, one interface over two backends.

``DATABASE`` (``--db``, ``DISCO_SERVICE_DB``) names the backend: a file path is SQLite
(:mod:`service.store_sqlite`, the default: nothing to install, one host), a
``postgresql://`` URL is PostgreSQL (:mod:`service.store_postgres`: several replicas and
plan workers on several hosts against one database). The queries below are written once,
with ``?`` placeholders; each backend brings its connection, its transactions, its start-up
(tables, migrations and the layout's version: :mod:`service.schema`) and its errors. Every
request and every worker thread opens its own :class:`Store` (never shared between threads).

Jobs live in the database. A new job is ``queued`` with its inputs (``request``: the validated
graph input, the resolved cluster and the options, as JSON); any worker, in any process on any
host, claims the oldest queued job (:meth:`Store.claim`: under SQLite's write lock, or ``FOR
UPDATE SKIP LOCKED`` on PostgreSQL) and holds it under a lease (``owner``: ``host:pid:boot``,
``lease_until``) that its process renews while the job runs (:meth:`Store.heartbeat`). A running
job whose lease has expired, or whose owner's pid is gone on this host, is taken over by the
next sweep of any process (:meth:`Store.recover`): re-queued when its inputs are stored and it has
not already been interrupted ``MAX_ATTEMPTS`` times, otherwise marked failed with the reason
"server restarted during the job". A job its own live process no longer holds (its worker could
not write its end: disk full, database locked) expires the same way. A job is never lost.

A unique partial index allows one active (queued or running) job per plan key, so identical
requests join one job across processes and replicas.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from service import store_postgres, store_sqlite
from service.schema import SCHEMA_VERSION, SchemaMismatch

__all__ = ["Store", "SchemaMismatch", "SCHEMA_VERSION", "backend", "is_database_error", "is_unavailable",
           "process_owner"]

BUSY_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3
DEFAULT_LEASE_S = 15.0  # a job row of schema version 1 has no lease: its heartbeat's age stands for one
STATES = ("queued", "running", "done", "failed")
ACTIVE = ("queued", "running")
RESTART_REASON = "server restarted during the job"
LOST_REASON = "the job's worker stopped without recording its end"
_BACKENDS = (store_sqlite, store_postgres)


def backend(database: str) -> ModuleType:
    """The backend module of ``database``: PostgreSQL for a ``postgresql://`` URL, else SQLite (a file path)."""
    return store_postgres if database.startswith(store_postgres.PREFIXES) else store_sqlite


def is_database_error(e: BaseException) -> bool:
    """Whether ``e`` is an error of either backend's driver."""
    return any(b.is_error(e) for b in _BACKENDS)


def is_unavailable(e: BaseException) -> bool:
    """Whether ``e`` means the database cannot be used (gone, read-only, full), not a bug in a query."""
    return any(b.is_unavailable(e) for b in _BACKENDS)


def process_owner() -> str:
    """This process's owner id: ``host:pid:boot`` (boot is random per process start).

    The host is ``DISCO_SERVICE_HOSTNAME`` when set, else the machine's name: set it where
    machines share a name (containers on the host's network), since a job whose owner names this
    host with a pid that is gone is taken over at once.
    """
    return f"{_host()}:{os.getpid()}:{_BOOT}"


def _host() -> str:
    return os.environ.get("DISCO_SERVICE_HOSTNAME") or socket.gethostname()


_BOOT = uuid.uuid4().hex[:8]


def _owner_alive(owner: str | None) -> bool:
    """False when ``owner`` is a process of this host that no longer exists."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_s, _, _ = rest.partition(":")
    if host != _host() or not pid_s.isdigit():
        return True  # another host: only the lease can tell
    try:
        os.kill(int(pid_s), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """One connection to the service database.

    Args:
      database: an SQLite file (created with its tables by :meth:`initialise`) or a ``postgresql://`` URL.
    """

    def __init__(self, database: str):
        self.path = database
        self.backend = backend(database)
        self.conn = self.backend.connect(database, BUSY_TIMEOUT_S)

    # -- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def initialise(cls, database: str) -> None:
        """Creates the tables, or migrates an older layout, and records the version (idempotent).

        Raises:
          SchemaMismatch: the database records a newer version, or holds tables of disco's names with
            other columns; it is left as it was.
        """
        s = cls(database)
        try:
            s.backend.initialise(s.conn, database)
        finally:
            s.conn.close()  # not kept for requests: start-up may run before a fork (gunicorn --preload)

    @property
    def where(self) -> str:
        """The database, for messages (a URL without its password)."""
        return self.backend.describe(self.path)

    def close(self) -> None:
        self.backend.release(self.conn, self.path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _x(self, query: str, params: Any = ()) -> Any:
        return self.conn.execute(self.backend.sql(query), params)

    def _tx(self) -> Any:
        return self.backend.Transaction(self.conn)

    # -- plans -------------------------------------------------------------------------------------
    def get_plan(self, key: str, *, timeline: bool = False) -> dict[str, Any] | None:
        cols = "key, fingerprint, plan, report, created_at" + (", timeline" if timeline else "")
        row = self._x(f"SELECT {cols} FROM plans WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        out = {"key": row["key"], "fingerprint": row["fingerprint"], "plan": json.loads(row["plan"]),
               "report": json.loads(row["report"]), "created_at": row["created_at"]}
        if timeline:
            out["timeline"] = json.loads(row["timeline"]) if row["timeline"] else []
        return out

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, key: str, request: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Returns the cached plan, the active job for ``key``, or a new queued job (committed).

        Two identical submissions at once (two replicas on PostgreSQL) meet at the unique index
        of active jobs: the later one's INSERT is refused and it tries again, finding the first's job.

        Args:
          key: the plan key.
          request: the job's inputs (JSON-able).

        Returns:
          ``(row, created)``: ``row`` is ``{"plan_key": key}`` for a cached plan or the job's
          row; ``created`` says whether this call created the job.
        """
        for attempt in range(3):
            try:
                with self._tx():
                    if self._x("SELECT key FROM plans WHERE key = ?", (key,)).fetchone() is not None:
                        return {"plan_key": key}, False
                    row = self._x("SELECT * FROM jobs WHERE key = ? AND state IN ('queued', 'running')",
                                  (key,)).fetchone()
                    if row is not None:
                        return self._job_dict(row), False
                    job_id = uuid.uuid4().hex
                    now = time.time()
                    self._x("INSERT INTO jobs (id, key, state, request, created_at, message) "
                            "VALUES (?, ?, 'queued', ?, ?, 'queued')",
                            (job_id, key, json.dumps(request, sort_keys=True), now))
                break
            except Exception as e:
                if attempt == 2 or not self.backend.is_conflict(e):
                    raise
        job = self.get_job(job_id)
        assert job is not None
        return job, True

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        row = self._x("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._job_dict(row)

    def job_request(self, job_id: str) -> dict[str, Any] | None:
        row = self._x("SELECT request FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None or row["request"] is None else json.loads(row["request"])

    def key_request(self, key: str) -> dict[str, Any] | None:
        """The inputs of the newest job of ``key`` whose inputs are stored (its program, cluster, options)."""
        row = self._x("SELECT request FROM jobs WHERE key = ? AND request IS NOT NULL ORDER BY created_at DESC "
                      "LIMIT 1", (key,)).fetchone()
        return None if row is None else json.loads(row["request"])

    @staticmethod
    def _job_dict(row: Any) -> dict[str, Any]:
        return {"job_id": row["id"], "key": row["key"], "state": row["state"],
                "progress": row["progress"], "message": row["message"],
                "error": json.loads(row["error"]) if row["error"] else None,
                "attempts": row["attempts"], "created_at": row["created_at"],
                "started_at": row["started_at"], "finished_at": row["finished_at"]}

    def backlog(self) -> int:
        """The number of queued jobs (waiting for a worker, in any process)."""
        return int(self._x("SELECT COUNT(*) AS n FROM jobs WHERE state = 'queued'").fetchone()["n"])

    def claim(self, lease_s: float) -> str | None:
        """Takes the oldest queued job for this process: running, owned here, leased for ``lease_s``.

        Returns:
          The job's id, or None when no job is queued (or every queued one was just taken by others).
        """
        if self._x("SELECT id FROM jobs WHERE state = 'queued' LIMIT 1").fetchone() is None:
            return None  # a read: idle workers do not take the write lock to find nothing
        now = time.time()
        with self._tx():
            rows = self._x(
                "UPDATE jobs SET state = 'running', started_at = ?, heartbeat_at = ?, lease_until = ?, owner = ?, "
                "message = 'running' WHERE state = 'queued' AND id = (SELECT id FROM jobs WHERE state = 'queued' "
                f"ORDER BY created_at LIMIT 1{self.backend.LOCK_ROWS}) RETURNING id",
                (now, now, now + lease_s, process_owner())).fetchall()
        return rows[0]["id"] if rows else None

    def set_progress(self, job_id: str, progress: float, message: str) -> None:
        with self._tx():
            self._x("UPDATE jobs SET progress = ?, message = ?, heartbeat_at = ? WHERE id = ? AND state = 'running'",
                    (min(max(float(progress), 0.0), 1.0), message[:500], time.time(), job_id))

    def finish_job(self, job_id: str, key: str, fingerprint: str, plan: Mapping[str, Any],
                   report: Mapping[str, Any], timeline: Iterable[Any] | None) -> None:
        """Stores the plan and marks the job done, in one transaction."""
        now = time.time()
        with self._tx():
            self._x("INSERT INTO plans (key, fingerprint, plan, report, timeline, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, "
                    "plan = excluded.plan, report = excluded.report, timeline = excluded.timeline, "
                    "created_at = excluded.created_at",
                    (key, fingerprint, json.dumps(plan, sort_keys=True), json.dumps(report, sort_keys=True),
                     json.dumps(list(timeline)) if timeline is not None else None, now))
            self._x("UPDATE jobs SET state = 'done', progress = 1.0, message = 'done', finished_at = ?, "
                    "heartbeat_at = ? WHERE id = ?", (now, now, job_id))

    def fail_job(self, job_id: str, code: str, message: str) -> None:
        now = time.time()
        err = json.dumps({"code": code, "message": message[:2000], "field": None})
        with self._tx():
            self._x("UPDATE jobs SET state = 'failed', error = ?, message = 'failed', finished_at = ? "
                    "WHERE id = ? AND state IN ('queued', 'running')", (err, now, job_id))

    def heartbeat(self, job_ids: Iterable[str], lease_s: float) -> None:
        """Renews the lease of those of ``job_ids`` that this process runs, to ``lease_s`` from now.

        Args:
          job_ids: the jobs this process's workers run; any other job of this process expires and
            :meth:`recover` takes it over.
          lease_s: the lease's length.
        """
        now, me = time.time(), process_owner()
        with self._tx():
            for job_id in sorted(job_ids):
                self._x("UPDATE jobs SET heartbeat_at = ?, lease_until = ? WHERE id = ? AND owner = ? "
                        "AND state = 'running'", (now, now + lease_s, job_id, me))

    def recover(self, held: Iterable[str] = ()) -> int:
        """Takes over the running jobs whose lease expired or whose owner is gone; returns how many were re-queued.

        A job whose owner is gone (a dead pid on this host, or a lease past its end: this
        process's own jobs too, whose lease it renews only while it runs them) is re-queued for any
        worker if its inputs are stored and it has been interrupted fewer than ``MAX_ATTEMPTS``
        times; otherwise it is marked failed with :data:`RESTART_REASON` (:data:`LOST_REASON` for
        its own). Rows another process's sweep holds at that moment are skipped (PostgreSQL).

        Args:
          held: the jobs this process's workers run, never taken over.
        """
        me = process_owner()
        held_here = set(held)
        now = time.time()
        resumed = 0
        with self._tx():
            rows = self._x(  # the candidates only: a running job of another host, in its lease, is not locked
                "SELECT id, state, owner, heartbeat_at, lease_until, attempts, request IS NOT NULL AS has_request "
                "FROM jobs WHERE state = 'running' AND (lease_until IS NULL OR lease_until < ? OR owner LIKE ?)"
                f"{self.backend.LOCK_ROWS}", (now, f"{_host()}:%")).fetchall()
            for r in rows:
                mine = r["owner"] == me
                if mine and r["id"] in held_here:
                    continue
                until = r["lease_until"] if r["lease_until"] is not None else (r["heartbeat_at"] or 0.0) + DEFAULT_LEASE_S
                if _owner_alive(r["owner"]) and until >= now:
                    continue
                attempts = r["attempts"] + 1
                if not r["has_request"] or attempts >= MAX_ATTEMPTS:
                    why = (LOST_REASON if mine else RESTART_REASON) + (
                        "" if r["has_request"] else "; its inputs were not stored")
                    if attempts >= MAX_ATTEMPTS:
                        why += f" ({attempts} times; not resumed again)"
                    code = "job_lost" if mine else "server_restarted"
                    err = json.dumps({"code": code, "message": why, "field": None})
                    self._x("UPDATE jobs SET state = 'failed', error = ?, message = 'failed', attempts = ?, "
                            "finished_at = ? WHERE id = ?", (err, attempts, now, r["id"]))
                    continue
                cause = "its worker stopped without recording its end" if mine else "its worker stopped"
                self._x("UPDATE jobs SET state = 'queued', owner = NULL, heartbeat_at = ?, lease_until = NULL, "
                        "attempts = ?, progress = 0, message = ?, started_at = NULL WHERE id = ?",
                        (now, attempts, f"resumed after {cause} (attempt {attempts + 1})", r["id"]))
                resumed += 1
        return resumed

    # -- profiles ----------------------------------------------------------------------------------
    def add_profiles(self, rows: Iterable[Mapping[str, Any]]) -> int:
        now = time.time()
        values = [(r["fingerprint"], r["plan_digest"], json.dumps(r["plan"], sort_keys=True),
                   float(r["step_time_ms"]), r.get("cluster"), r.get("device_kind"),
                   json.dumps(r.get("extra") or {}, sort_keys=True), now) for r in rows]
        with self._tx():
            self.conn.cursor().executemany(self.backend.sql(
                "INSERT INTO profiles (fingerprint, plan_digest, plan, step_time_ms, cluster, device_kind, "
                "extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"), values)
        return len(values)

    # -- trials ------------------------------------------------------------------------------------
    def add_trials(self, key: str, run_id: str, fingerprint: str, environment: Mapping[str, Any] | None,
                   trials: Iterable[Mapping[str, Any]], winner: int) -> int:
        """Stores one run's measured candidates of ``key`` (one row each, ``winner`` the index kept).

        Args:
          trials: ``{"plan", "plan_digest", "name", "predicted_ms", "samples_ms", "step_time_ms"}`` each
            (``samples_ms``: per process, per timed step).
        """
        now = time.time()
        env = None if environment is None else json.dumps(environment, sort_keys=True)
        values = [(key, run_id, fingerprint, t["plan_digest"], json.dumps(t["plan"], sort_keys=True), t["name"],
                   float(t["step_time_ms"]), t.get("predicted_ms"), int(i == winner), len(t["samples_ms"]),
                   json.dumps(t["samples_ms"]), env, now) for i, t in enumerate(trials)]
        with self._tx():
            self.conn.cursor().executemany(self.backend.sql(
                "INSERT INTO trials (key, run_id, fingerprint, plan_digest, plan, name, step_time_ms, predicted_ms, "
                "winner, processes, samples, environment, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                values)
        return len(values)

    def trials(self, key: str | None = None) -> list[dict[str, Any]]:
        """The measured trials, oldest first (of ``key`` only, when given): one dict per candidate and run."""
        where, params = ("WHERE key = ?", (key,)) if key is not None else ("", ())
        rows = self._x(f"SELECT * FROM trials {where} ORDER BY created_at, id", params).fetchall()
        return [{"key": r["key"], "run_id": r["run_id"], "fingerprint": r["fingerprint"],
                 "plan_digest": r["plan_digest"], "plan": json.loads(r["plan"]), "name": r["name"],
                 "step_time_ms": r["step_time_ms"], "predicted_ms": r["predicted_ms"], "winner": bool(r["winner"]),
                 "processes": r["processes"], "samples_ms": json.loads(r["samples"]),
                 "environment": json.loads(r["environment"]) if r["environment"] else None,
                 "created_at": r["created_at"]} for r in rows]

    def measured(self, key: str) -> dict[str, Any] | None:
        """The newest run measured for ``key``: ``{"run_id", "plan", "step_time_ms", "trials"}`` (``plan``:
        the winner's JSON; ``trials``: every candidate's name, digest, measured and predicted ms), or None."""
        row = self._x("SELECT run_id FROM trials WHERE key = ? ORDER BY created_at DESC, id DESC LIMIT 1",
                      (key,)).fetchone()
        if row is None:
            return None
        run = [t for t in self.trials(key) if t["run_id"] == row["run_id"]]
        winner = next((t for t in run if t["winner"]), run[0])
        return {"run_id": row["run_id"], "plan": winner["plan"], "name": winner["name"],
                "step_time_ms": winner["step_time_ms"], "processes": winner["processes"],
                "trials": [{"name": t["name"], "plan_digest": t["plan_digest"], "step_time_ms": t["step_time_ms"],
                            "predicted_ms": t["predicted_ms"], "winner": t["winner"]} for t in run]}

    # -- health ------------------------------------------------------------------------------------
    def write_probe(self) -> None:
        """Writes the health row; raises the driver's error if the database takes no write."""
        with self._tx():
            self._x("INSERT INTO health (id, checked_at) VALUES (1, ?) "
                    "ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at", (time.time(),))

    def quick_check(self) -> str | None:
        """The backend's integrity check (SQLite: ``PRAGMA quick_check``): None if it finds nothing, else its first finding."""
        return self.backend.quick_check(self.conn)

    def count(self, table: str) -> int:
        if table not in ("plans", "jobs", "profiles", "trials"):
            raise ValueError(f"table: expected plans, jobs, profiles or trials, got {table!r}")
        return int(self._x(f"SELECT COUNT(*) AS n FROM {table}").fetchone()["n"])

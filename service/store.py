"""The service's store: one SQLite file in WAL mode with tables ``plans``, ``jobs``, ``profiles``.

Every request and every worker thread opens its own :class:`Store` (one connection
each, never shared between threads). WAL mode lets readers run while one writer
commits; writers that collide wait up to ``BUSY_TIMEOUT_S``.

Jobs carry their inputs (``request``: the validated graph input, the resolved
cluster and the options, as JSON), an ``owner`` (``host:pid:boot``) and a
``heartbeat_at`` the owner refreshes for the jobs it holds (queued for or run by a
worker). A job whose owner died (its pid is gone on this host, or its heartbeat is
stale) is taken over by the next server that starts or sweeps: re-queued when its
inputs are stored and it has not already been interrupted ``MAX_ATTEMPTS`` times,
otherwise marked failed with the reason "server restarted during the job". A job its
own live server no longer holds (its worker could not write its end: disk full,
database locked) goes stale the same way and is taken over too. A job is never lost.

The file records its layout's version (``SCHEMA_VERSION``, in ``PRAGMA user_version``); a file
of a newer version, or with tables of these names and other columns, is refused at start and left
as it was. A change to the tables bumps the version and brings its migration.

A unique partial index allows one active (queued or running) job per plan key,
so identical requests join one job even across gunicorn worker processes.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

BUSY_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3
STATES = ("queued", "running", "done", "failed")
ACTIVE = ("queued", "running")
# The layout of the tables below, kept in the file's ``PRAGMA user_version``: a database of another
# layout is refused at start with what it holds and what was expected, never altered or half used.
SCHEMA_VERSION = 1
RESTART_REASON = "server restarted during the job"
LOST_REASON = "the job's worker stopped without recording its end"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    plan TEXT NOT NULL,
    report TEXT NOT NULL,
    timeline TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
    request TEXT,
    progress REAL NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '',
    error TEXT,
    owner TEXT,
    heartbeat_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_one_active_per_key ON jobs (key) WHERE state IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE TABLE IF NOT EXISTS profiles (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint TEXT NOT NULL,
    plan_digest TEXT NOT NULL,
    plan TEXT NOT NULL,
    step_time_ms REAL NOT NULL,
    cluster TEXT,
    device_kind TEXT,
    extra TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS profiles_fingerprint ON profiles (fingerprint);
CREATE TABLE IF NOT EXISTS health (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    checked_at REAL NOT NULL
);
"""


def _schema_columns() -> dict[str, tuple[str, ...]]:
    """Each table of ``_SCHEMA`` and its columns, read from the schema itself (one place)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(_SCHEMA)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        return {t: tuple(r[1] for r in conn.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        conn.close()


class SchemaMismatch(ValueError):
    """The database holds tables of another layout than this disco's (another version, or another program)."""


def _check_tables(conn: sqlite3.Connection, path: str) -> None:
    """Raises SchemaMismatch when a table of disco's name in ``conn`` lacks a column disco's layout has."""
    for table, columns in _schema_columns().items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        missing = [c for c in columns if c not in have]
        if have and missing:
            raise SchemaMismatch(f"the database {path!r} has a table {table!r} without the column(s) "
                                 f"{', '.join(missing)}; expected disco's plan store (schema version "
                                 f"{SCHEMA_VERSION}) or a new file (another program's database? give another database file)")


def process_owner() -> str:
    """This process's owner id: ``host:pid:boot`` (boot is random per process start)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_BOOT}"


_BOOT = uuid.uuid4().hex[:8]


def _owner_alive(owner: str | None) -> bool:
    """False when ``owner`` is a process of this host that no longer exists."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_s, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_s.isdigit():
        return True  # another host: only the heartbeat can tell
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
      path: the SQLite file (created with its tables if missing).
    """

    def __init__(self, path: str):
        self.path = path
        self.conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                    check_same_thread=True)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self.conn.execute("PRAGMA synchronous = NORMAL")

    # -- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def initialise(cls, path: str) -> None:
        """Creates the file (not its directory), switches it to WAL mode and creates the tables (idempotent)."""
        s = cls(path)
        try:
            version = s.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaMismatch(f"the database {path!r} has schema version {version}, written by a newer disco; "
                                     f"expected version {SCHEMA_VERSION} or a new file (upgrade disco, or give another "
                                     "database file)")
            _check_tables(s.conn, path)  # before anything is written: a foreign file stays as it was
            s.conn.execute("PRAGMA journal_mode = WAL")
            s.conn.executescript(_SCHEMA)
            if version != SCHEMA_VERSION:  # a new file, or one this version wrote before it recorded a version
                s.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        finally:
            s.close()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self.conn)

    # -- plans -------------------------------------------------------------------------------------
    def get_plan(self, key: str, *, timeline: bool = False) -> dict[str, Any] | None:
        cols = "key, fingerprint, plan, report, created_at" + (", timeline" if timeline else "")
        row = self.conn.execute(f"SELECT {cols} FROM plans WHERE key = ?", (key,)).fetchone()
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

        The caller hands a created job to a worker after this returns, so the worker
        always finds the row; if it cannot (queue full), it fails the job.

        Args:
          key: the plan key.
          request: the job's inputs (JSON-able).

        Returns:
          ``(row, created)``: ``row`` is ``{"plan_key": key}`` for a cached plan or the job's
          row; ``created`` says whether this call created the job.
        """
        owner = process_owner()
        with self._tx():
            plan = self.conn.execute("SELECT key FROM plans WHERE key = ?", (key,)).fetchone()
            if plan is not None:
                return {"plan_key": key}, False
            row = self.conn.execute(
                "SELECT * FROM jobs WHERE key = ? AND state IN ('queued', 'running')", (key,)).fetchone()
            if row is not None:
                return self._job_dict(row), False
            job_id = uuid.uuid4().hex
            now = time.time()
            self.conn.execute(
                "INSERT INTO jobs (id, key, state, request, owner, heartbeat_at, created_at, message) "
                "VALUES (?, ?, 'queued', ?, ?, ?, ?, 'queued')",
                (job_id, key, json.dumps(request, sort_keys=True), owner, now, now))
        return self.get_job(job_id), True

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._job_dict(row)

    def job_request(self, job_id: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT request FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None or row["request"] is None else json.loads(row["request"])

    @staticmethod
    def _job_dict(row: sqlite3.Row) -> dict[str, Any]:
        return {"job_id": row["id"], "key": row["key"], "state": row["state"],
                "progress": row["progress"], "message": row["message"],
                "error": json.loads(row["error"]) if row["error"] else None,
                "attempts": row["attempts"], "created_at": row["created_at"],
                "started_at": row["started_at"], "finished_at": row["finished_at"]}

    def start_job(self, job_id: str) -> bool:
        """Marks a queued job of this process running; False if it is not (any more) queued here."""
        now = time.time()
        with self._tx():
            cur = self.conn.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, heartbeat_at = ?, owner = ?, "
                "message = 'running' WHERE id = ? AND state = 'queued'",
                (now, now, process_owner(), job_id))
        return cur.rowcount == 1

    def set_progress(self, job_id: str, progress: float, message: str) -> None:
        with self._tx():
            self.conn.execute(
                "UPDATE jobs SET progress = ?, message = ?, heartbeat_at = ? WHERE id = ? AND state = 'running'",
                (min(max(float(progress), 0.0), 1.0), message[:500], time.time(), job_id))

    def finish_job(self, job_id: str, key: str, fingerprint: str, plan: Mapping[str, Any],
                   report: Mapping[str, Any], timeline: Iterable[Any] | None) -> None:
        """Stores the plan and marks the job done, in one transaction."""
        now = time.time()
        with self._tx():
            self.conn.execute(
                "INSERT OR REPLACE INTO plans (key, fingerprint, plan, report, timeline, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (key, fingerprint, json.dumps(plan, sort_keys=True), json.dumps(report, sort_keys=True),
                 json.dumps(list(timeline)) if timeline is not None else None, now))
            self.conn.execute(
                "UPDATE jobs SET state = 'done', progress = 1.0, message = 'done', finished_at = ?, "
                "heartbeat_at = ? WHERE id = ?", (now, now, job_id))

    def fail_job(self, job_id: str, code: str, message: str) -> None:
        now = time.time()
        err = json.dumps({"code": code, "message": message[:2000], "field": None})
        with self._tx():
            self.conn.execute(
                "UPDATE jobs SET state = 'failed', error = ?, message = 'failed', finished_at = ? "
                "WHERE id = ? AND state IN ('queued', 'running')", (err, now, job_id))

    def heartbeat(self, job_ids: Iterable[str]) -> None:
        """Refreshes the heartbeat of those of ``job_ids`` that are this process's active jobs.

        Args:
          job_ids: the jobs this process holds (queued for or run by its workers); any other
            job of this process goes stale and :meth:`recover` takes it over.
        """
        with self._tx():
            self.conn.execute("UPDATE jobs SET heartbeat_at = ? WHERE owner = ? AND state IN ('queued', 'running') "
                              "AND id IN (SELECT value FROM json_each(?))",
                              (time.time(), process_owner(), json.dumps(sorted(job_ids))))

    def recover(self, stale_s: float, held: Iterable[str] = ()) -> list[str]:
        """Takes over the active jobs of dead owners, and this process's stale ones; returns the ids to enqueue here.

        A job whose owner is gone (dead pid on this host, or no heartbeat for
        ``stale_s``: this process's own jobs too, whose heartbeat it refreshes only while
        it holds them) is re-queued under this process if its inputs are stored and it
        has been interrupted fewer than ``MAX_ATTEMPTS`` times; otherwise it is
        marked failed with :data:`RESTART_REASON` (:data:`LOST_REASON` for its own).

        Args:
          stale_s: seconds without a heartbeat after which a job's owner is taken for gone.
          held: the jobs this process holds (queued for or run by its workers), never taken over.
        """
        me = process_owner()
        held_here = set(held)
        now = time.time()
        resumed: list[str] = []
        with self._tx():
            rows = self.conn.execute(
                "SELECT id, state, owner, heartbeat_at, attempts, request IS NOT NULL AS has_request "
                "FROM jobs WHERE state IN ('queued', 'running')").fetchall()
            for r in rows:
                mine = r["owner"] == me
                if mine and r["id"] in held_here:
                    continue
                stale = (r["heartbeat_at"] or 0.0) < now - stale_s
                if _owner_alive(r["owner"]) and not stale:
                    continue
                attempts = r["attempts"] + (1 if r["state"] == "running" else 0)
                if not r["has_request"] or attempts >= MAX_ATTEMPTS:
                    why = (LOST_REASON if mine else RESTART_REASON) + (
                        "" if r["has_request"] else "; its inputs were not stored")
                    if attempts >= MAX_ATTEMPTS:
                        why += f" ({attempts} times; not resumed again)"
                    code = "job_lost" if mine else "server_restarted"
                    err = json.dumps({"code": code, "message": why, "field": None})
                    self.conn.execute(
                        "UPDATE jobs SET state = 'failed', error = ?, message = 'failed', attempts = ?, "
                        "finished_at = ? WHERE id = ?", (err, attempts, now, r["id"]))
                    continue
                cause = "its worker stopped without recording its end" if mine else "a server restart"
                note = (f"resumed after {cause} (attempt {attempts + 1})"
                        if r["state"] == "running" else f"re-queued after {cause}")
                self.conn.execute(
                    "UPDATE jobs SET state = 'queued', owner = ?, heartbeat_at = ?, attempts = ?, "
                    "progress = 0, message = ?, started_at = NULL WHERE id = ?",
                    (me, now, attempts, note, r["id"]))
                resumed.append(r["id"])
        return resumed

    def release(self, job_id: str) -> None:
        """Gives a queued job back (no owner), for another sweep to pick up."""
        with self._tx():
            self.conn.execute("UPDATE jobs SET owner = NULL, heartbeat_at = 0 WHERE id = ? AND state = 'queued'",
                              (job_id,))

    # -- profiles ----------------------------------------------------------------------------------
    def add_profiles(self, rows: Iterable[Mapping[str, Any]]) -> int:
        now = time.time()
        values = [(r["fingerprint"], r["plan_digest"], json.dumps(r["plan"], sort_keys=True),
                   float(r["step_time_ms"]), r.get("cluster"), r.get("device_kind"),
                   json.dumps(r.get("extra") or {}, sort_keys=True), now) for r in rows]
        with self._tx():
            self.conn.executemany(
                "INSERT INTO profiles (fingerprint, plan_digest, plan, step_time_ms, cluster, device_kind, "
                "extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values)
        return len(values)

    # -- health ------------------------------------------------------------------------------------
    def write_probe(self) -> None:
        """Writes the health row; raises ``sqlite3.DatabaseError`` if the database takes no write."""
        with self._tx():
            self.conn.execute("INSERT INTO health (id, checked_at) VALUES (1, ?) "
                              "ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at", (time.time(),))

    def quick_check(self) -> str | None:
        """``PRAGMA quick_check``: None if it finds nothing, else its first finding."""
        rows = [r[0] for r in self.conn.execute("PRAGMA quick_check").fetchall()]
        if rows == ["ok"]:
            return None
        return str(rows[0]) + (f" (and {len(rows) - 1} more)" if len(rows) > 1 else "")

    def count(self, table: str) -> int:
        if table not in ("plans", "jobs", "profiles"):
            raise ValueError(f"table: expected plans, jobs or profiles, got {table!r}")
        return int(self.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception).

    After some errors (disk full, I/O error) SQLite has rolled the transaction back itself;
    then no ROLLBACK is sent, whose "no transaction is active" would hide the error's reason.
    """

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

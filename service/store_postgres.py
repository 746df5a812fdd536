"""The PostgreSQL backend of the store (``postgresql://`` URLs), for replicas and plan workers on several hosts.

Driver: psycopg 3 (the ``service`` extra), imported on first use. Connections run in
autocommit mode; a transaction is ``conn.transaction()`` (READ COMMITTED). A job is claimed
with ``SELECT ... FOR UPDATE SKIP LOCKED``, so workers on any host take different jobs
without waiting on each other. Identical submissions that race end in one job: the second
INSERT hits the unique index of active jobs and the store retries, finding the first.

Each process keeps the connections its requests have closed (at most ``POOL_SIZE`` idle), so a
request does not pay for a new connection; a forked child (gunicorn) starts with an empty pool.
The layout's version is the one row of ``disco_schema``; start-up (tables, migrations, version)
runs under an advisory lock, so replicas that start together do it once.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from typing import Any

from service import schema

NAME = "postgresql"
PREFIXES = ("postgresql://", "postgres://")
LOCK_ROWS = " FOR UPDATE SKIP LOCKED"
POOL_SIZE = 16
_INIT_LOCK = 0x64697363  # pg_advisory_xact_lock key of start-up ("disc")


def _psycopg() -> Any:
    import psycopg

    return psycopg


def is_error(e: BaseException) -> bool:
    """Whether ``e`` is the driver's (any database error)."""
    import sys

    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(e, psycopg.Error)


def is_conflict(e: BaseException) -> bool:
    """Whether ``e`` is a unique index's refusal (two identical submissions at once)."""
    import sys

    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(e, psycopg.errors.UniqueViolation)


def is_unavailable(e: BaseException) -> bool:
    """Whether ``e`` means the database cannot be used: no connection, read-only, disk full, shutting down."""
    import sys

    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(e, psycopg.Error):
        return False
    from psycopg import errors as pe

    return isinstance(e, (psycopg.OperationalError, pe.ReadOnlySqlTransaction, pe.InsufficientResources,
                          pe.InsufficientPrivilege, pe.AdminShutdown, pe.CannotConnectNow))


def describe(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    return re.sub(r"^([a-z]+://[^:/@]*):[^@]*@", r"\1:***@", url)


def sql(query: str) -> str:
    """The store's queries use ``?`` placeholders (SQLite's); psycopg takes ``%s``."""
    return query.replace("?", "%s")


class _Pool:
    def __init__(self, inherited: _Pool | None = None) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.idle: dict[str, list[Any]] = {}
        # a forked child keeps its parent's connections unused and unclosed: closing one would end the
        # parent's session on the socket they share
        self.inherited = inherited


_POOL = _Pool()


@atexit.register
def _close_idle() -> None:
    """Closes this process's idle connections at exit (the server sees a goodbye, not a dropped socket)."""
    with _POOL.lock:
        if _POOL.pid != os.getpid():
            return
        conns = [c for idle in _POOL.idle.values() for c in idle]
        _POOL.idle.clear()
    for c in conns:
        c.close()


def connect(url: str, busy_timeout_s: float) -> Any:
    """A connection from this process's idle ones, else a new one (autocommit, rows as dicts).

    ``busy_timeout_s`` bounds how long a statement waits for a lock (``lock_timeout``).
    """
    global _POOL
    with _POOL.lock:
        if _POOL.pid != os.getpid():  # a forked child: the parent's sockets are not its own
            _POOL = _Pool(inherited=_POOL)
        idle = _POOL.idle.get(url)
        conn = idle.pop() if idle else None
    if conn is not None and not conn.closed:
        return conn
    psycopg = _psycopg()
    from psycopg.rows import dict_row

    return psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=10,
                           options=f"-c lock_timeout={int(busy_timeout_s * 1000)}")


def release(conn: Any, url: str) -> None:
    """Keeps an idle, healthy connection to ``url`` for the next request of this process; closes any other."""
    psycopg = _psycopg()
    ok = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if ok:
        with _POOL.lock:
            if _POOL.pid == os.getpid():
                idle = _POOL.idle.setdefault(url, [])
                if len(idle) < POOL_SIZE:
                    idle.append(conn)
                    return
    conn.close()


class Transaction:
    """One transaction (``BEGIN`` ... ``COMMIT``; ``ROLLBACK`` on an exception)."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.tx: Any = None

    def __enter__(self) -> None:
        self.tx = self.conn.transaction()
        self.tx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.tx.__exit__(*exc)


def _tables(conn: Any) -> dict[str, set[str]]:
    have: dict[str, set[str]] = {}
    for r in conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                          "WHERE table_schema = current_schema()"):
        have.setdefault(r["table_name"], set()).add(r["column_name"])
    return {t: have.get(t, set()) for t in schema.columns()}


def initialise(conn: Any, url: str) -> None:
    """Creates or migrates the tables and records the version, in one transaction under an advisory lock.

    Raises:
      SchemaMismatch: the database records a newer version, or holds tables of disco's names with other
        columns (nothing is written then).
    """
    where = describe(url)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INIT_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS disco_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
                     "version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM disco_schema WHERE id = 1").fetchone()
        version = row["version"] if row else 0
        if version > schema.SCHEMA_VERSION:
            raise schema.newer(version, where, "a new database")
        have = _tables(conn)
        schema.check_tables(have, version, where)
        for stmt in schema.migrations(version, have, schema.POSTGRES_TYPES):
            conn.execute(stmt)
        for stmt in schema.tables(schema.POSTGRES_TYPES):
            conn.execute(stmt)
        conn.execute("INSERT INTO disco_schema (id, version) VALUES (1, %s) "
                     "ON CONFLICT (id) DO UPDATE SET version = excluded.version", (schema.SCHEMA_VERSION,))


def quick_check(conn: Any) -> str | None:
    """PostgreSQL checks its own pages (checksums, WAL); this asks only that it answers a query."""
    conn.execute("SELECT 1").fetchone()
    return None

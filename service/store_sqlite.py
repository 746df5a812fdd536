"""The SQLite backend of the store: one file in WAL mode, nothing to install (the default).

Every request and every worker thread opens its own connection (never shared between
threads). WAL mode lets readers run while one writer commits; writers that collide wait
up to ``busy_timeout_s``. A transaction is ``BEGIN IMMEDIATE`` (the write lock from its
start), so a job is claimed by one worker: the claim's SELECT and UPDATE run under the lock.
The layout's version is kept in ``PRAGMA user_version``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from service import schema

NAME = "sqlite"
LOCK_ROWS = ""  # BEGIN IMMEDIATE already holds the database's write lock


def is_error(e: BaseException) -> bool:
    """Whether ``e`` is the driver's (any database error)."""
    return isinstance(e, sqlite3.Error)


def is_conflict(e: BaseException) -> bool:
    """Whether ``e`` is a unique index's refusal (cannot happen under BEGIN IMMEDIATE; kept for the interface)."""
    return isinstance(e, sqlite3.IntegrityError)


def is_unavailable(e: BaseException) -> bool:
    """Whether ``e`` means the database cannot be used (not a bug in a query)."""
    return isinstance(e, sqlite3.OperationalError) or type(e) is sqlite3.DatabaseError


def describe(path: str) -> str:
    return path


def sql(query: str) -> str:
    return query


def connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=True)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def release(conn: sqlite3.Connection, path: str) -> None:
    conn.close()


class Transaction:
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


def _tables(conn: sqlite3.Connection) -> dict[str, set[str]]:
    return {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in schema.columns()}


def initialise(conn: sqlite3.Connection, path: str) -> None:
    """Switches the file to WAL mode, creates or migrates the tables and records the version.

    Raises:
      SchemaMismatch: the file records a newer version, or holds tables of disco's names with other columns
        (checked before anything is written: a foreign file stays as it was).
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > schema.SCHEMA_VERSION:
        raise schema.newer(version, path, "a new file")
    have = _tables(conn)
    schema.check_tables(have, version, path)
    conn.execute("PRAGMA journal_mode = WAL")
    with Transaction(conn):
        for stmt in schema.migrations(version, have, schema.SQLITE_TYPES):
            conn.execute(stmt)
        for stmt in schema.tables(schema.SQLITE_TYPES):
            conn.execute(stmt)
        if version != schema.SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION}")


def quick_check(conn: sqlite3.Connection) -> str | None:
    """``PRAGMA quick_check``: None if it finds nothing, else its first finding."""
    rows = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    if rows == ["ok"]:
        return None
    return str(rows[0]) + (f" (and {len(rows) - 1} more)" if len(rows) > 1 else "")

"""The database of a request, and the database's health (Flask's tutorial pattern).

``get_store()`` opens one :class:`~service.store.Store` per request (in ``g``) and
``close_store`` closes it when the request's app context ends; ``init_app(app)`` creates
or migrates the tables (a directory, a missing directory, a file that is no database, a
PostgreSQL server that cannot be reached or a database of another layout makes
``create_app`` fail with a ValueError) and registers the teardown.
Blueprints import this module, never the application factory.

:func:`health` answers ``/healthz``: a write probe on every call and ``PRAGMA
quick_check`` (SQLite; PostgreSQL: a query) at most every ``HEALTH_QUICK_CHECK_S`` seconds (its last finding is
remembered in between). Any database error of a request is answered 503 with the
reason (:mod:`service.errors`).
"""

from __future__ import annotations

import os
import threading
import time

from flask import Flask, current_app, g

from service.store import SchemaMismatch, Store, backend, is_database_error

_HEALTH = "disco_health"


class _HealthState:
    """When quick_check last ran in this process, and what it found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked_at = float("-inf")
        self.problem: str | None = None


def init_app(app: Flask, setting: str = "config DATABASE") -> None:
    """Creates the database's tables (idempotent) and closes each request's store on teardown.

    Raises:
      ValueError: the database cannot be used (see :func:`initialise`).
    """
    initialise(app.config["DATABASE"], setting)
    app.extensions[_HEALTH] = _HealthState()
    app.teardown_appcontext(close_store)


def initialise(path: str, setting: str) -> None:
    """Creates the database file (when missing) and its tables, or migrates an older layout.

    Args:
      path: the SQLite file: an existing database, or a new file in an existing directory
        (no directory is created); or a ``postgresql://`` URL of an existing database.
      setting: what named the path (``--db``, ``DISCO_SERVICE_DB``), for the error.

    Raises:
      ValueError: ``path`` is a directory, its directory does not exist, SQLite cannot
        open it or finds no database in it, PostgreSQL cannot be reached or refuses the
        connection, or the database has another schema (a newer disco's version, or tables of
        disco's names with other columns).
    """
    be = backend(path)
    if be.NAME == "postgresql":
        try:
            Store.initialise(path)
        except SchemaMismatch as e:
            raise ValueError(f"{setting}: {e}") from None
        except ImportError as e:
            raise ValueError(f"{setting}: a postgresql:// database needs the driver psycopg (the 'service' extra: "
                             f"pip install -e '.[service]'), which is not installed ({e})") from None
        except Exception as e:
            if not is_database_error(e):
                raise
            raise ValueError(f"{setting}: expected a PostgreSQL database that takes connections, got "
                             f"{be.describe(path)!r} ({' '.join(str(e).split())})") from None
        return
    if os.path.isdir(path):
        raise ValueError(f"{setting}: expected an SQLite database file, got the directory {path!r}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{setting}: expected a database file in an existing directory, got {path!r} "
                         f"(no directory {parent!r}; create it first)")
    try:
        Store.initialise(path)
    except SchemaMismatch as e:
        raise ValueError(f"{setting}: {e}") from None
    except Exception as e:
        if not is_database_error(e):
            raise
        expected = "an SQLite database" if os.path.exists(path) else "a new file in a writable directory"
        raise ValueError(f"{setting}: expected {expected}, got {path!r} ({e})") from None


def get_store() -> Store:
    """This request's database connection (opened on first use, closed on teardown)."""
    if "store" not in g:
        g.store = Store(current_app.config["DATABASE"])
    return g.store


def close_store(exc: BaseException | None = None) -> None:
    store = g.pop("store", None)
    if store is not None:
        store.close()


def health() -> str | None:
    """None if the database takes a write and its last quick_check was clean, else the reason."""
    state: _HealthState = current_app.extensions[_HEALTH]
    every = float(current_app.config["HEALTH_QUICK_CHECK_S"])
    store = get_store()
    try:
        store.write_probe()
        with state.lock:
            due = time.monotonic() - state.checked_at >= every
            if due:
                state.checked_at = time.monotonic()
        if due:
            found = store.quick_check()
            state.problem = None if found is None else f"the database is damaged: quick_check: {found}"
    except Exception as e:
        if not is_database_error(e):
            raise
        return f"the database cannot be used: {e}"
    return state.problem



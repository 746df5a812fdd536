"""The database of a request, and the database's health (Flask's tutorial pattern).

``get_store()`` opens one :class:`~service.store.Store` per request (in ``g``) and
``close_store`` closes it when the request's app context ends; ``init_app(app)`` creates
the tables (a corrupt file makes ``create_app`` fail) and registers the teardown.
Blueprints import this module, never the application factory.

:func:`health` answers ``/healthz``: a write probe on every call and ``PRAGMA
quick_check`` at most every ``HEALTH_QUICK_CHECK_S`` seconds (its last finding is
remembered in between). Any database error of a request is answered 503 with the
reason (:mod:`service.errors`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from flask import Flask, current_app, g

from service.store import Store

_HEALTH = "disco_health"


class _HealthState:
    """When quick_check last ran in this process, and what it found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked_at = float("-inf")
        self.problem: str | None = None


def init_app(app: Flask) -> None:
    """Creates the database's tables (idempotent) and closes each request's store on teardown."""
    Store.initialise(app.config["DATABASE"])
    app.extensions[_HEALTH] = _HealthState()
    app.teardown_appcontext(close_store)


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
    except sqlite3.DatabaseError as e:
        return f"the database cannot be used: {e}"
    return state.problem



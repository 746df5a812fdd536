"""The Flask application factory and per-request resources."""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, current_app, g

from service import errors
from service.jobs import JobRunner
from service.store import Store

DEFAULTS: dict[str, Any] = {
    "DATABASE": None,            # default: <instance folder>/disco-service.sqlite
    "TOKEN": None,               # bearer token for the write endpoints; None: no auth
    "MAX_CONTENT_LENGTH": 64 * 1024 * 1024,
    "WORKERS": 1,                # background plan threads per process
    "QUEUE_SIZE": 64,            # bounded job queue; full -> 503 with Retry-After
    "JOB_TIMEOUT_S": 600.0,
    "RETRY_AFTER_S": 5,
}


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Builds the plan service.

    Args:
      config: overrides of :data:`DEFAULTS` (keys DATABASE, TOKEN, MAX_CONTENT_LENGTH,
        WORKERS, QUEUE_SIZE, JOB_TIMEOUT_S, RETRY_AFTER_S). Without one, the
        environment variables DISCO_SERVICE_DB, DISCO_SERVICE_TOKEN and
        DISCO_SERVICE_WORKERS are read (for ``gunicorn 'service:create_app()'``).

    Returns:
      The Flask app; its job runner (worker threads, resuming jobs that a dead
      server left behind) is started before it returns.
    """
    app = Flask("service", instance_relative_config=True)
    app.config.from_mapping(DEFAULTS)
    if config is None:
        env = {"DATABASE": os.environ.get("DISCO_SERVICE_DB"), "TOKEN": os.environ.get("DISCO_SERVICE_TOKEN")}
        if os.environ.get("DISCO_SERVICE_WORKERS"):
            env["WORKERS"] = int(os.environ["DISCO_SERVICE_WORKERS"])
        app.config.from_mapping({k: v for k, v in env.items() if v is not None})
    else:
        app.config.from_mapping(config)
    if not app.config["DATABASE"]:
        os.makedirs(app.instance_path, exist_ok=True)
        app.config["DATABASE"] = os.path.join(app.instance_path, "disco-service.sqlite")
    for key in ("WORKERS", "QUEUE_SIZE"):
        v = app.config[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "WORKERS" else 1):
            raise ValueError(f"config {key}: expected an integer >= {0 if key == 'WORKERS' else 1}, got {v!r}")
    Store.initialise(app.config["DATABASE"])

    errors.register(app)
    from service import api, pages

    app.register_blueprint(api.bp)
    app.register_blueprint(pages.bp)
    app.teardown_appcontext(close_store)
    app.before_request(_ensure_runner)
    _ensure_runner(app)
    return app


def _ensure_runner(app: Flask | None = None) -> None:
    """Starts this process's job runner; again after a fork (gunicorn --preload)."""
    app = app or current_app._get_current_object()
    runner = app.extensions.get("disco_jobs")
    if runner is not None and runner.pid == os.getpid():
        return
    runner = JobRunner(app.config["DATABASE"], workers=app.config["WORKERS"],
                       queue_size=app.config["QUEUE_SIZE"], job_timeout_s=float(app.config["JOB_TIMEOUT_S"]))
    runner.pid = os.getpid()
    app.extensions["disco_jobs"] = runner
    runner.start()


def runner() -> JobRunner:
    return current_app.extensions["disco_jobs"]


def get_store() -> Store:
    """This request's database connection (opened on first use, closed on teardown)."""
    if "store" not in g:
        g.store = Store(current_app.config["DATABASE"])
    return g.store


def close_store(exc: BaseException | None = None) -> None:
    store = g.pop("store", None)
    if store is not None:
        store.close()

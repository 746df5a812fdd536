"""The Flask application factory.

``create_app`` reads and checks the configuration, creates the database's tables
(:func:`service.db.init_app`), makes the app's :class:`~service.intake.Intake` and
registers the blueprints. It starts no thread and no process: the job runner starts
on the first request each process serves (:mod:`service.jobs`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from flask import Flask

from service import api, db, errors, jobs, limits, pages
from service.intake import Intake

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "DATABASE": None,            # default: <instance folder>/disco-service.sqlite
    "TOKEN": None,               # bearer token for the write endpoints; None: no auth (a warning is logged)
    "MAX_CONTENT_LENGTH": limits.MAX_CONTENT_LENGTH,
    "WORKERS": 2,                # background plan threads per process
    "QUEUE_SIZE": 64,            # jobs queued in the database (all processes) at most; more -> 503 with Retry-After
    "JOB_TIMEOUT_S": 600.0,
    "JOB_LEASE_S": 15.0,         # a running job's lease, renewed by its process; past it another process takes the job
    "RETRY_AFTER_S": 5,
    "PARSE_TIMEOUT_S": limits.PARSE_TIMEOUT_S,  # one HLO check (child process) at most this long
    "PARSE_PARALLEL": 2,         # HLO checks at once per process
    "HEALTH_QUICK_CHECK_S": 300.0,  # /healthz runs PRAGMA quick_check at most this often
}

_ENV = {"DATABASE": "DISCO_SERVICE_DB", "TOKEN": "DISCO_SERVICE_TOKEN", "WORKERS": "DISCO_SERVICE_WORKERS"}


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Builds the plan service.

    Args:
      config: overrides of :data:`DEFAULTS`. Without one, the environment variables
        DISCO_SERVICE_DB (an SQLite file or a ``postgresql://`` URL), DISCO_SERVICE_TOKEN and
        DISCO_SERVICE_WORKERS are read (for ``gunicorn 'service:create_app()'``).

    Returns:
      The Flask app. Nothing runs yet: each process starts its job runner on its
      first request.

    Raises:
      ValueError: for a bad setting, e.g. an empty token (which would turn
        authentication off without a word), WORKERS < 0, or a DATABASE that is a
        directory, not an SQLite file, or in a directory that does not exist, a PostgreSQL
        URL whose server cannot be reached, or a database of a newer layout.
    """
    app = Flask("service", instance_relative_config=True)
    app.config.from_mapping(DEFAULTS)
    app.config.from_mapping(env_config(os.environ) if config is None else config)
    _check_config(app.config)
    if not app.config["DATABASE"]:
        os.makedirs(app.instance_path, exist_ok=True)
        app.config["DATABASE"] = os.path.join(app.instance_path, "disco-service.sqlite")
    if app.config["TOKEN"] is None:
        log.warning("disco service: no write token (DISCO_SERVICE_TOKEN / --token): anyone who can reach "
                    "the server can submit plan jobs and upload profiles")

    db.init_app(app, setting="DISCO_SERVICE_DB" if config is None else "config DATABASE")
    jobs.init_app(app)
    app.extensions["disco_intake"] = Intake(timeout_s=float(app.config["PARSE_TIMEOUT_S"]),
                                            parallel=app.config["PARSE_PARALLEL"])
    errors.register(app)
    app.register_blueprint(api.bp)
    app.register_blueprint(pages.bp)
    return app


def env_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings that DISCO_SERVICE_DB, DISCO_SERVICE_TOKEN and DISCO_SERVICE_WORKERS give
    (for ``gunicorn 'service:create_app()'`` and ``disco serve``); unset or empty variables give none.

    Raises:
      ValueError: DISCO_SERVICE_TOKEN is set but empty, or DISCO_SERVICE_WORKERS is not an integer.
    """
    env = {key: environ[var] for key, var in _ENV.items() if var in environ}
    if env.get("TOKEN") is not None and not env["TOKEN"].strip():
        raise ValueError("DISCO_SERVICE_TOKEN is set but empty; set a token, or unset the variable "
                         "to run without authentication")
    if "WORKERS" in env:
        try:
            env["WORKERS"] = int(env["WORKERS"])
        except ValueError:
            raise ValueError(f"DISCO_SERVICE_WORKERS: expected an integer >= 0, got {env['WORKERS']!r}") from None
    return {k: v for k, v in env.items() if v != ""}


def _check_config(config: Any) -> None:
    token = config["TOKEN"]
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ValueError(f"config TOKEN: expected a non-empty string or None (no authentication), got {token!r}")
    for key, low in (("WORKERS", 0), ("QUEUE_SIZE", 1), ("PARSE_PARALLEL", 1)):
        v = config[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"config {key}: expected an integer >= {low}, got {v!r}")
    for key in ("JOB_TIMEOUT_S", "JOB_LEASE_S", "PARSE_TIMEOUT_S", "HEALTH_QUICK_CHECK_S"):
        v = config[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise ValueError(f"config {key}: expected a positive, finite number of seconds, got {v!r}")

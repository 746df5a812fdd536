"""disco's plan service: a Flask app that hands out fusion plans and collects profiles.

Run it for development with ``disco serve`` (127.0.0.1:8000), in production with::

    gunicorn -w 2 --threads 4 -b 127.0.0.1:8000 'service:create_app()'

(``DISCO_SERVICE_DB`` and ``DISCO_SERVICE_TOKEN`` in the environment set the database
(an SQLite file, or a ``postgresql://`` URL) and the bearer token for the write endpoints
when the app is created without a config.) Each gunicorn worker starts its own plan worker
threads on its first request; they claim jobs from the database, so identical requests join
one job across workers, replicas and ``disco serve --plan-workers-only`` processes on other
hosts (docs/deployment.md).

Endpoints: ``POST /v1/plans``, ``GET /v1/plans/<key>``, ``GET /v1/jobs/<id>``,
``POST /v1/profiles``, ``GET /plans/<key>`` (HTML report), ``GET /`` (index),
``GET /healthz``, ``GET /openapi.json``. What is enforced (auth, limits, health): the
guide docs/guides/plan-service.md and :mod:`service.limits`.

Modules, bottom up: ``limits``, ``schema`` (the tables, their version, migrations),
``store_sqlite`` and ``store_postgres`` (the backends), ``store`` (one interface), ``errors``, ``schemas`` (pydantic
boundary models), ``programs`` (program identity; the HLO check's child process),
``intake``, ``inputs``, ``db`` (per-request store, health), ``jobs`` (runner),
``api`` and ``pages`` (blueprints), ``app`` (the factory), ``cli`` (``disco serve``),
``testing`` (a real server process for tests and benchmarks).

``import service`` imports neither Flask nor jax; ``create_app`` imports Flask.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def create_app(config: dict[str, Any] | None = None) -> Any:
    """Builds the Flask app; see :func:`service.app.create_app`."""
    from service.app import create_app as _create_app

    return _create_app(config)

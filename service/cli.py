"""``disco serve``: run the plan service on one machine (Werkzeug's threaded server).

For production use gunicorn instead::

    gunicorn -w 2 --threads 4 -b 127.0.0.1:8000 'service:create_app()'

with ``DISCO_SERVICE_DB`` / ``DISCO_SERVICE_TOKEN`` in the environment for the
database path and the write token.
"""

from __future__ import annotations

import argparse
import signal
import sys


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``serve`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("serve", help="run the plan service (REST API and HTML reports)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--db", metavar="PATH", help="SQLite database (default: under the instance folder)")
    p.add_argument("--workers", type=int, default=1, help="background plan threads (default 1)")
    p.add_argument("--queue-size", type=int, default=64, help="bounded job queue (default 64)")
    p.add_argument("--job-timeout", type=float, default=600.0, help="seconds a job may run (default 600)")
    p.add_argument("--token", help="bearer token required by the write endpoints (default: none)")
    p.set_defaults(func=run)
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """Serves until interrupted (SIGINT/SIGTERM)."""
    from werkzeug.serving import make_server

    from service import create_app

    if args.workers < 0:
        raise ValueError(f"--workers: expected an integer >= 0, got {args.workers}")
    app = create_app({"DATABASE": args.db, "WORKERS": args.workers, "TOKEN": args.token,
                      "QUEUE_SIZE": args.queue_size, "JOB_TIMEOUT_S": args.job_timeout})
    server = make_server(args.host, args.port, app, threaded=True)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"disco serve: listening on http://{args.host}:{server.server_port} "
          f"(database {app.config['DATABASE']})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        app.extensions["disco_jobs"].stop(timeout=2.0)
    return 0

"""``disco serve``: run the plan service (Werkzeug's threaded server), or only its plan workers.

For production use gunicorn instead::

    gunicorn -w 2 --threads 4 -b 127.0.0.1:8000 'service:create_app()'

with ``DISCO_SERVICE_DB`` / ``DISCO_SERVICE_TOKEN`` in the environment for the
database (an SQLite file, or a ``postgresql://`` URL) and the write token. ``disco serve``
reads the same variables (and ``DISCO_SERVICE_WORKERS``) for the options it is not given.

``disco serve --plan-workers-only --db postgresql://...`` serves no HTTP: it runs
``--workers`` plan threads that claim jobs from the database, on any host that reaches it
(docs/deployment.md).

The development server here answers its own errors (a request line over 64 KiB: 414)
as JSON like the app does, and its ``Server`` header names no versions. Starting
without a token, or bound beyond loopback, logs a warning that says who can write.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import signal
import sys
import threading
from typing import Any

log = logging.getLogger("service")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``serve`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("serve", help="run the plan service (REST API and HTML reports)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--db", metavar="PATH|URL", help="SQLite database, a file in an existing directory, or a "
                   "postgresql:// URL (default: $DISCO_SERVICE_DB, else an SQLite file under the instance folder)")
    p.add_argument("--workers", type=int, help="background plan threads (default: $DISCO_SERVICE_WORKERS, else 2)")
    p.add_argument("--queue-size", type=int, default=64,
                   help="jobs queued in the database (all processes) at most; more are answered 503 (default 64)")
    p.add_argument("--job-timeout", type=float, default=600.0, help="seconds a job may run (default 600)")
    p.add_argument("--parse-timeout", type=float, default=30.0,
                   help="seconds the check of one posted HLO text may take (default 30)")
    p.add_argument("--job-lease", type=float, default=15.0,
                   help="seconds a running job stays this process's without a renewal; then another process "
                   "takes it over (default 15)")
    p.add_argument("--plan-workers-only", action="store_true",
                   help="serve no HTTP: run --workers plan threads that claim jobs from --db (a postgresql:// "
                   "URL for workers on other hosts) until interrupted")
    p.add_argument("--token", help="bearer token required by the write endpoints (default: "
                   "$DISCO_SERVICE_TOKEN, else none; then anyone who can reach the server can write)")
    p.set_defaults(func=run)
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_warning(host: str, port: int, token: str | None) -> str | None:
    """The warning for a bind beyond loopback, or None."""
    if is_loopback(host):
        return None
    who = "any host" if host in ("0.0.0.0", "::", "") else f"any host that can reach {host}"
    writes = ("can submit plan jobs and upload profiles (no token)" if token is None
              else "can read plans and reports; writes need the token")
    return f"disco serve: bound to {host}:{port}, beyond loopback: {who} {writes}"


def _colour(stream: Any) -> bool:
    """Whether request lines written to ``stream`` may carry ANSI colours: a terminal, and NO_COLOR unset."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def _request_handler() -> type:
    from werkzeug.serving import WSGIRequestHandler

    from service.errors import json_body

    class Handler(WSGIRequestHandler):
        """Werkzeug's handler without versions in ``Server`` and with JSON error bodies."""

        def version_string(self) -> str:
            return "disco"

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if _colour(sys.stderr):
                super().log_request(code, size)
                return  # Werkzeug colours the line by status for a terminal; a log file gets the plain line
            line = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in self.requestline)
            self.log("info", '"%s" %s %s', line, code, size)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            short, long = self.responses.get(code, ("error", "error"))
            body = json_body(short.lower().replace(" ", "_").replace("-", "_"), explain or message or long)
            self.log_error("code %d, message %s", code, message)
            self.send_response(code)
            self.send_header("Connection", "close")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.close_connection = True
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(body)

    return Handler


SERVICE_EXTRA_HINT = ("disco serve: the plan service needs the 'service' extra (Flask, Werkzeug), which is not "
                      "installed: pip install -e '.[service]'")


def _config(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    """The app's config from ``disco serve``'s arguments, each unset one from ``env``
    (:func:`service.app.env_config`: DISCO_SERVICE_DB, DISCO_SERVICE_TOKEN, DISCO_SERVICE_WORKERS).

    Raises:
      ValueError: for a setting ``disco serve`` cannot run with, naming the option.
    """
    token = args.token if args.token is not None else env.get("TOKEN")
    workers = args.workers if args.workers is not None else env.get("WORKERS", 2)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: expected a TCP port 0-65535 (0: any free port), got {args.port}")
    if workers < 1:
        where = "--workers" if args.workers is not None else "DISCO_SERVICE_WORKERS"
        raise ValueError(f"{where}: expected an integer >= 1 (the threads that run plan jobs), got {workers}")
    if args.queue_size < 1:
        raise ValueError(f"--queue-size: expected an integer >= 1, got {args.queue_size}")
    for option, seconds in (("--job-timeout", args.job_timeout), ("--parse-timeout", args.parse_timeout),
                            ("--job-lease", args.job_lease)):
        if not 0 < seconds < math.inf:
            raise ValueError(f"{option}: expected a positive, finite number of seconds, got {seconds}")
    if args.db is not None and not args.db.strip():
        raise ValueError("--db: expected a file path or a postgresql:// URL, got an empty one (leave --db out for "
                         "the default)")
    if args.token is not None and not args.token.strip():
        raise ValueError("--token: expected a non-empty token, got an empty one (leave --token out to run "
                         "without authentication)")
    return {"DATABASE": args.db if args.db is not None else env.get("DATABASE"), "WORKERS": workers,
            "TOKEN": token, "QUEUE_SIZE": args.queue_size, "JOB_TIMEOUT_S": args.job_timeout,
            "JOB_LEASE_S": args.job_lease, "PARSE_TIMEOUT_S": args.parse_timeout}


def _listen(host: str, port: int, app: Any) -> Any:
    """Werkzeug's threaded server bound to ``host:port``.

    Raises:
      ValueError: where the address cannot be bound (port in use, an address not of this machine, a name
        that does not resolve), naming it. Werkzeug prints the reason and exits 1; this keeps the reason
        and lets ``disco serve`` exit 2 with one line, as for its other bad settings.
    """
    import contextlib
    import io

    from werkzeug.serving import make_server

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return make_server(host, port, app, threaded=True, request_handler=_request_handler())
    except SystemExit:
        reason = said.getvalue().strip().splitlines()[0] if said.getvalue().strip() else "cannot bind"
        hint = ("another program listens there: stop it, or give another --port (0: any free port)"
                if "in use" in reason.lower() else
                "expected an address of this machine or a name that resolves to one (--host)")
        raise ValueError(f"cannot listen on {host}:{port}: {reason}; {hint}") from None


def run(args: argparse.Namespace) -> int:
    """Serves until interrupted (SIGINT/SIGTERM); without the service extra, prints how to install
    it and returns 2."""
    try:
        import flask  # noqa: F401
        import werkzeug  # noqa: F401
    except ImportError as e:
        print(f"{SERVICE_EXTRA_HINT} (missing: {e.name})", file=sys.stderr)
        return 2

    from service import create_app
    from service.app import env_config
    from service.db import initialise
    from service.jobs import stop_runner
    from service.store import backend

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    given = {"DISCO_SERVICE_DB": args.db, "DISCO_SERVICE_TOKEN": args.token, "DISCO_SERVICE_WORKERS": args.workers}
    config = _config(args, env_config({k: v for k, v in os.environ.items() if given.get(k) is None}))
    if config["DATABASE"] is not None:
        initialise(config["DATABASE"], "--db" if args.db is not None else "DISCO_SERVICE_DB")
    if args.plan_workers_only:
        return _run_workers(config)
    app = create_app(config)
    try:
        server = _listen(args.host, args.port, app)
    except ValueError:  # printed by the command line as one line, exit status 2
        stop_runner(app, timeout=2.0)
        raise
    warning = bind_warning(args.host, server.server_port, config["TOKEN"])
    if warning:
        log.warning(warning)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"disco serve: listening on http://{args.host}:{server.server_port} "
          f"(database {backend(app.config['DATABASE']).describe(app.config['DATABASE'])}); {_tiers()}",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        stop_runner(app, timeout=2.0)
    return 0


def _tiers() -> str:
    """Which tier ranks a GPU cluster's plans in this process (``options.tier`` auto), for the start line."""
    from xla_hooks import compile_for, deviceless

    problem = compile_for.unavailable("h100")
    if problem is None:
        return f"GPU clusters' plans ranked by the compiled tier (deviceless XLA:GPU: {deviceless.gpu_python()})"
    return f"GPU clusters' plans ranked by the emulated tier ({problem})"


def _run_workers(config: dict[str, Any]) -> int:
    """Runs plan worker threads against the database, without HTTP, until SIGINT/SIGTERM."""
    from service.jobs import JobRunner
    from service.store import backend

    if config["DATABASE"] is None:
        raise ValueError("--plan-workers-only: expected --db or DISCO_SERVICE_DB naming the service's database "
                         "(a postgresql:// URL, or the SQLite file of a server on this host), got neither")
    where = backend(config["DATABASE"]).describe(config["DATABASE"])
    runner = JobRunner(config["DATABASE"], workers=config["WORKERS"], job_timeout_s=config["JOB_TIMEOUT_S"],
                       lease_s=config["JOB_LEASE_S"])
    signal.signal(signal.SIGTERM, _interrupt)
    runner.start()
    print(f"disco serve: plan workers on {where}: {config['WORKERS']} threads, lease {config['JOB_LEASE_S']:g} s, "
          f"no HTTP; {_tiers()}", file=sys.stderr, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        runner.stop(timeout=2.0)
    return 0

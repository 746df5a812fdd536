"""A real plan-service process on 127.0.0.1, and a throwaway PostgreSQL server, for tests and benchmarks.

:class:`ServerProcess` starts ``python -m disco serve`` (or gunicorn, or ``disco serve
--plan-workers-only``) in its own process group on a free loopback port, waits for
``/healthz`` (for plan workers: their start line), and on ``stop`` or ``kill`` ends that
group only, so nothing it started is left running. :class:`PostgresServer` runs ``initdb``
and ``pg_ctl`` from the machine's PostgreSQL in a temporary directory on a free port.

Example::

  with ServerProcess(db=tmp_path / "s.sqlite") as server:
      urllib.request.urlopen(server.url + "/healthz")
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """The plan service in a child process.

    Args:
      db: the SQLite file or a ``postgresql://`` URL.
      workers: plan worker threads (``disco serve --workers``).
      plan_workers_only: run ``disco serve --plan-workers-only`` (no HTTP; ``start`` waits for its start line).
      token: the write token, or None.
      gunicorn: run ``gunicorn -w gunicorn_workers --threads gunicorn_threads`` instead of
        ``disco serve`` (database, token and plan threads from the environment).
      port: the port (default: a free one).
      host: the address ``disco serve`` binds (the client always uses 127.0.0.1).
      log: where the server's output goes (default: next to an SQLite ``db``, else in the temporary directory).
      extra_args: more ``disco serve`` arguments.
      env: more environment variables for the server.
    """

    def __init__(self, db: str | os.PathLike[str], *, workers: int = 1, token: str | None = None,
                 gunicorn: bool = False, gunicorn_workers: int = 2, gunicorn_threads: int = 1,
                 plan_workers_only: bool = False, port: int | None = None, host: str = "127.0.0.1",
                 log: str | os.PathLike[str] | None = None, extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.db = str(db)
        self.host = host
        self.env = dict(env or {})
        self.workers = workers
        self.token = token
        self.gunicorn = gunicorn
        self.gunicorn_workers = gunicorn_workers
        self.gunicorn_threads = gunicorn_threads
        self.plan_workers_only = plan_workers_only
        self.port = port or free_port()
        if log is None and "://" in self.db:
            log = os.path.join(tempfile.gettempdir(), f"disco-service-{self.port}-{uuid.uuid4().hex[:6]}.log")
        self.log = str(log or f"{self.db}.{self.port}.log")
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, healthy: bool = True) -> ServerProcess:
        """Starts the server and waits until ``/healthz`` answers 200 (any status if not ``healthy``)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        if self.gunicorn:
            env.update({"DISCO_SERVICE_DB": self.db, "DISCO_SERVICE_WORKERS": str(self.workers)})
            if self.token:
                env["DISCO_SERVICE_TOKEN"] = self.token
            # --no-control-socket: gunicorn (25+) puts one at ~/.gunicorn/gunicorn.ctl by default, shared by
            # every test server at once and unlinked by whichever master exits first
            cmd = [sys.executable, "-m", "gunicorn", "-w", str(self.gunicorn_workers), "-b",
                   f"127.0.0.1:{self.port}", "--threads", str(self.gunicorn_threads), "--no-control-socket",
                   "service:create_app()"]
        else:
            cmd = [sys.executable, "-m", "disco", "serve", "--host", self.host, "--port", str(self.port),
                   "--db", self.db, "--workers", str(self.workers), *self.extra_args]
            if self.token:
                cmd += ["--token", self.token]
            if self.plan_workers_only:
                cmd.append("--plan-workers-only")
        env.update(self.env)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=str(_ROOT), start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}; log:\n{self.tail()}")
            if self.plan_workers_only:
                if "plan workers on" in self.tail():
                    return self
                time.sleep(0.1)
                continue
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1.0) as r:
                    if r.status == 200:
                        return self
            except urllib.error.HTTPError as e:
                e.close()
                if not healthy:
                    return self
                time.sleep(0.1)
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"the server did not answer /healthz within {timeout} s; log:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return Path(self.log).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL to the server's process group (the server and anything it forked)."""
        self._signal(signal.SIGKILL, wait=10.0)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 10 s."""
        if not self._signal(signal.SIGTERM, wait=10.0):
            self.kill()

    def _signal(self, sig: int, wait: float) -> bool:
        if self.proc is None:
            return True
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return False
        # the group may hold forked workers that outlive the leader for a moment
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None
        return True

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- a small client ----------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int, Any, dict[str, str]]:
        """``(status, parsed JSON or text, headers)``; sends the token when the server has one."""
        hdrs = {"Content-Type": "application/json"}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        hdrs.update(headers or {})
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, headers=hdrs, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, payload, rh = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            with e:
                status, payload, rh = e.code, e.read(), dict(e.headers)
        try:
            return status, json.loads(payload), rh
        except ValueError:
            return status, payload.decode(errors="replace"), rh

    def wait_job(self, job_id: str, timeout: float = 60.0, states: tuple[str, ...] = ("done", "failed")) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, job, _ = self.request("GET", f"/v1/jobs/{job_id}")
            if status != 200:
                raise RuntimeError(f"GET /v1/jobs/{job_id}: {status} {job}")
            if job["state"] in states or time.monotonic() > deadline:
                return job
            time.sleep(0.05)


def postgres_bindir() -> str | None:
    """The directory of PostgreSQL's ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest
    ``/usr/lib/postgresql/<version>/bin``; None if there is none."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl", path=os.path.dirname(found)):
        return os.path.dirname(found)
    dirs = [d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.path.exists(os.path.join(d, "initdb"))]
    dirs.sort(key=lambda d: [int(x) for x in re.findall(r"\d+", d)])
    return dirs[-1] if dirs else None


def postgres_missing() -> str | None:
    """Why :class:`PostgresServer` cannot run here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the PostgreSQL driver psycopg is not installed (pip install -e '.[service]')"
    if postgres_bindir() is None:
        return ("PostgreSQL's initdb and pg_ctl were not found (on PATH or in /usr/lib/postgresql/*/bin; "
                "Debian: apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' user to run initdb as (initdb refuses root)"
        if shutil.which("runuser") is None:
            return "running as root without runuser to run initdb as the 'postgres' user (initdb refuses root)"
    return None


class PostgresServer:
    """A throwaway PostgreSQL server on 127.0.0.1 (a new cluster in a temporary directory, trust auth).

    As root, the cluster belongs to the ``postgres`` user (initdb refuses root). Durability is off
    (``fsync``, ``synchronous_commit``): it is for tests and benchmarks only.

    Example::

      with PostgresServer() as pg:
          url = pg.create_database()   # postgresql://disco@127.0.0.1:<port>/<new database>
    """

    def __init__(self, *, port: int | None = None, max_connections: int = 300):
        self.port = port or free_port()
        self.max_connections = max_connections
        self.dir: str | None = None
        self.bindir = postgres_bindir()

    def _run(self, *cmd: str) -> str:
        assert self.bindir is not None and self.dir is not None
        argv = [os.path.join(self.bindir, cmd[0]), *cmd[1:]]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=self.dir, timeout=120)
        if done.returncode != 0:
            log = os.path.join(self.dir, "server.log")
            tail = open(log).read()[-2000:] if os.path.exists(log) else ""
            raise RuntimeError(f"{' '.join(cmd[:2])} failed ({done.returncode}): {done.stderr.strip()}\n{tail}")
        return done.stdout

    def start(self) -> PostgresServer:
        why = postgres_missing()
        if why:
            raise RuntimeError(why)
        self.dir = tempfile.mkdtemp(prefix="disco-pg-")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = os.path.join(self.dir, "data")
        self._run("initdb", "-D", data, "-U", "disco", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c synchronous_commit=off -c full_page_writes=off -c max_connections={self.max_connections}")
        self._run("pg_ctl", "-D", data, "-l", os.path.join(self.dir, "server.log"), "-w", "-t", "60", "-o", opts,
                  "start")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://disco@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Creates an empty database (default: a new name) and returns its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stops the server (fast shutdown) and removes its directory."""
        if self.dir is None:
            return
        try:
            self._run("pg_ctl", "-D", os.path.join(self.dir, "data"), "-m", "fast", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", os.path.join(self.dir, "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

"""A real plan-service process on 127.0.0.1, for tests and benchmarks.

:class:`ServerProcess` starts ``python -m disco serve`` (or gunicorn) in its own
process group on a free loopback port, waits for ``/healthz``, and on ``stop`` or
``kill`` ends that group only, so nothing it started is left running.

Example::

  with ServerProcess(db=tmp_path / "s.sqlite") as server:
      urllib.request.urlopen(server.url + "/healthz")
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
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
      db: the SQLite file.
      workers: plan worker threads (``disco serve --workers``).
      token: the write token, or None.
      gunicorn: run ``gunicorn -w gunicorn_workers --threads gunicorn_threads`` instead of
        ``disco serve`` (database, token and plan threads from the environment).
      port: the port (default: a free one).
      host: the address ``disco serve`` binds (the client always uses 127.0.0.1).
      log: where the server's output goes (default: next to ``db``).
      extra_args: more ``disco serve`` arguments.
      env: more environment variables for the server.
    """

    def __init__(self, db: str | os.PathLike[str], *, workers: int = 1, token: str | None = None,
                 gunicorn: bool = False, gunicorn_workers: int = 2, gunicorn_threads: int = 1,
                 port: int | None = None, host: str = "127.0.0.1",
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
        self.port = port or free_port()
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
            cmd = [sys.executable, "-m", "gunicorn", "-w", str(self.gunicorn_workers), "-b",
                   f"127.0.0.1:{self.port}", "--threads", str(self.gunicorn_threads), "service:create_app()"]
        else:
            cmd = [sys.executable, "-m", "disco", "serve", "--host", self.host, "--port", str(self.port),
                   "--db", self.db, "--workers", str(self.workers), *self.extra_args]
            if self.token:
                cmd += ["--token", self.token]
        env.update(self.env)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=str(_ROOT), start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}; log:\n{self.tail()}")
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

"""The plan service's HTTP client, as :func:`xla_hooks.jit` uses it: every request within one deadline.

A job asks ``POST /v1/plans`` (a 202 job is polled at ``GET /v1/jobs/<id>`` until done) and, after
trials, reports ``POST /v1/trials``. Whatever goes wrong (refused connections, error answers,
bodies that are not JSON objects, a deadline that passes) is a :class:`NoPlan` saying why, which the
caller turns into a warning and XLA's default compile: training never stops because of the service.

urlopen's ``timeout`` bounds each socket operation, not a request: a service that answers a byte at
a time would hold the step for as long as it kept sending. So each request's sockets are shut down
when its share of the deadline has passed (:class:`_Deadline`).

Example::

  client = ServiceClient("http://127.0.0.1:8000", token=None, timeout_s=30.0)
  answer = client.plan({"hlo_text": text, "cluster": "local", "devices": 8})
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

MAX_RESPONSE = 64 * 1024 * 1024  # bytes read of one answer


class NoPlan(Exception):
    """Why no plan was obtained (the caller turns it into a PlanServiceWarning)."""


class TimedOut(NoPlan):
    """A request to the service that the deadline ran out before or during."""


@dataclasses.dataclass(frozen=True)
class ServiceClient:
    """One service's base URL (no trailing slash), its bearer token and the seconds a call may take.

    Attributes:
      base: e.g. "http://127.0.0.1:8000" (checked by :func:`check_service_url`).
      token: the bearer token sent on every request, or None (:func:`checked_token`).
      timeout_s: how long :meth:`plan` may take in all, and :meth:`report_trials`.
    """

    base: str
    token: str | None
    timeout_s: float

    def plan(self, body: dict[str, Any], candidates: int = 0) -> dict[str, Any]:
        """The service's answer to ``POST /v1/plans`` with ``body``, polling a 202 job until done,
        all within ``timeout_s``; with ``candidates`` > 1 the job's result lists that many.

        Raises:
          NoPlan: for any failure, with why (a job still running at the deadline goes on in the
            service: a later run of the step gets its plan).
        """
        deadline = time.monotonic() + self.timeout_s
        status, data = self.request("POST", "/v1/plans", body, deadline)
        if status == 202:
            return self._poll(data, candidates, deadline)
        if status != 200:
            raise NoPlan(f"POST /v1/plans answered {status}: {_message(data)}")
        return data

    def report_trials(self, body: dict[str, Any]) -> None:
        """``POST /v1/trials`` within ``timeout_s``.

        Raises:
          NoPlan: where the service did not store them (any answer but 201), with why.
        """
        status, data = self.request("POST", "/v1/trials", body, time.monotonic() + self.timeout_s)
        if status != 201:
            raise NoPlan(f"POST /v1/trials answered {status}: {_message(data)}")

    def _poll(self, accepted: dict[str, Any], candidates: int, deadline: float) -> dict[str, Any]:
        job_id = accepted.get("job_id")
        if not isinstance(job_id, str):
            raise NoPlan(f"the service answered 202 without a job id: {str(accepted)[:200]}")
        query = f"?candidates={candidates}" if candidates > 1 else ""
        delay, state, progress = 0.05, "queued", None
        while True:
            try:
                status, job = self.request("GET", f"/v1/jobs/{job_id}{query}", None, deadline)
            except TimedOut:  # the deadline passed while polling: the job is not done, as below
                raise NoPlan(self._not_done(state, progress)) from None
            if status != 200:
                raise NoPlan(f"GET /v1/jobs/{job_id} answered {status}")
            state = job.get("state")
            if state == "done":
                return job.get("result") or {}
            if state == "failed":
                err = job.get("error") or {}
                raise NoPlan(f"the plan job failed: {err.get('message', err)}")
            if state not in ("queued", "running"):
                raise NoPlan(f"the job has an unknown state {state!r}")
            progress = job.get("progress")
            if time.monotonic() + delay > deadline:
                raise NoPlan(self._not_done(state, progress))
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _not_done(self, state: str, progress: Any) -> str:
        return (f"the plan job was not done within timeout_s={self.timeout_s:g} (state {state}, progress "
                f"{progress}); it goes on in the service, and a later run of this step gets its plan "
                "(or give timeout_s more)")

    def request(self, method: str, path: str, body: Any, deadline: float) -> tuple[int, dict[str, Any]]:
        """One HTTP request that ends by ``deadline`` (a ``time.monotonic()`` value).

        Returns:
          The status and the answer's JSON object.

        Raises:
          TimedOut: where the deadline passes before or during the request.
          NoPlan: where it fails otherwise, or the answer is not a JSON object.
        """
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimedOut(f"timed out after timeout_s={self.timeout_s:g} before {method} {path}")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        with _Deadline(remaining) as deadline_left:
            try:
                try:
                    with _opener(deadline_left).open(req, timeout=remaining) as resp:
                        status, raw = resp.status, resp.read(MAX_RESPONSE)
                except urllib.error.HTTPError as e:
                    with e:
                        status, raw = e.code, e.read(MAX_RESPONSE)
            except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as e:
                # HTTPException: an answer that is not HTTP (BadStatusLine, LineTooLong, IncompleteRead)
                if not deadline_left.passed:
                    reason = getattr(e, "reason", e)
                    raise NoPlan(f"{method} {path} failed: {type(reason).__name__}: {reason}") from None
        if deadline_left.passed:  # its sockets were shut: what was read is cut short
            raise TimedOut(f"{method} {path} did not finish within timeout_s={self.timeout_s:g}")
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError):
            raise NoPlan(f"{method} {path} answered {status} with a body that is not JSON: {raw[:80]!r}") from None
        if not isinstance(parsed, dict):
            raise NoPlan(f"{method} {path} answered {status} with JSON that is not an object")
        return status, parsed


def _message(data: dict[str, Any]) -> Any:
    """An error answer's ``message`` (the service's JSON errors carry one), else the whole answer."""
    return data.get("message", data)


def check_service_url(url: Any) -> None:
    """ValueError unless ``url`` is an http(s) base URL with a host (a wrong URL is a setup error,
    raised at once, not a service outage to fall back from at the first step)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url) if isinstance(url, str) else None
    expected = "service: expected the plan service's base URL, e.g. 'http://127.0.0.1:8000', got"
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{expected} {url!r}")
    if not all(" " < c < "\x7f" for c in url):  # http.client refuses them at the first request
        raise ValueError(f"{expected} {url!r}, which holds whitespace, control or non-ASCII characters "
                         "(percent-encode them)")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"{expected} {url!r}, with a query or fragment (disco appends /v1/plans to the URL)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{expected} {url!r}, with a user name (the client sends no user:password; "
                         "writes take token=)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise ValueError(f"service: the port of {url!r} is not a number in 0-65535") from None


def checked_token(token: Any) -> str | None:
    """The token as the ``Authorization`` header carries it: surrounding whitespace dropped (a
    token read from a file ends in a newline; the service strips what it receives too).

    Raises:
      TypeError: for a token that is not a string.
      ValueError: for one with characters an HTTP header cannot carry (the request raised at the
        first step).
    """
    if token is None:
        return None
    if not isinstance(token, str):
        raise TypeError(f"token: expected the service's bearer token as a str, got {type(token).__name__}")
    token = token.strip()
    bad = next((c for c in token if not " " <= c < "\x7f"), None)
    if bad is not None:
        raise ValueError(f"token: expected printable ASCII (what an HTTP header carries), got a token "
                         f"holding {bad!r}")
    return token


class _Deadline:
    """Shuts down the sockets of one request when ``seconds`` have passed; ``passed`` then says why."""

    def __init__(self, seconds: float):
        self.passed = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            passed = self.passed
        if passed:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedConnections:
    """A urllib handler whose connections register their socket with a :class:`_Deadline`."""

    deadline: _Deadline

    def do_open(self, http_class: Any, req: Any, **kw: Any) -> Any:
        deadline = self.deadline

        def connection(host: str, **conn_kw: Any) -> Any:
            conn = http_class(host, **conn_kw)
            connect = conn.connect

            def watched_connect() -> None:
                connect()
                deadline.watch(conn.sock)

            conn.connect = watched_connect
            return conn

        return super().do_open(connection, req, **kw)  # type: ignore[misc]


class _WatchedHTTP(_WatchedConnections, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPS(_WatchedConnections, urllib.request.HTTPSHandler):
    pass


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies and redirects as urlopen's) with its connections under ``deadline``."""
    handlers = [_WatchedHTTP(), _WatchedHTTPS()]
    for h in handlers:
        h.deadline = deadline
    return urllib.request.build_opener(*handlers)

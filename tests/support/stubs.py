"""Stubs for the tests of ``xla_hooks.jit``: HTTP services whose requests are answered by a function,
and the coordination service's key-value store in memory."""

from __future__ import annotations

import contextlib
import http.server
import threading

from xla_hooks.agreement import KeyTimeout, KeyValueError


class _Stub(http.server.BaseHTTPRequestHandler):
    """Answers every request with ``server.reply(handler)``; a POST's body is ``handler.body``."""

    body = b""

    def do_POST(self):
        self.body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.reply(self)

    def do_GET(self):
        self.server.reply(self)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def stub(reply):
    """A threaded HTTP server on 127.0.0.1 answering with ``reply(handler)``; yields its base URL."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    srv.daemon_threads = True
    srv.reply = reply
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def send(handler, status, body: bytes, ctype="application/json"):
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class MemoryKV:
    """The coordination service's key-value store, in memory: a key is set once."""

    def __init__(self):
        self.values: dict[str, bytes] = {}
        self._cv = threading.Condition()

    def set(self, key, value):
        with self._cv:
            if key in self.values:
                raise KeyValueError(f"setting key {key!r} failed: ALREADY_EXISTS")
            self.values[key] = bytes(value)
            self._cv.notify_all()

    def get(self, key, timeout_s):
        with self._cv:
            if not self._cv.wait_for(lambda: key in self.values, timeout_s):
                raise KeyTimeout(key)
            return self.values[key]

"""Stub HTTP services for the tests of ``xla_hooks.jit``: each request is answered by a function."""

from __future__ import annotations

import contextlib
import http.server
import threading


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

"""A TCP port forwarded through a Unix socket: how a worker inside a network namespace of the
emulated testbed reaches a service listening on the host's 127.0.0.1 (namespaces share the file
system, not the loopback). Test plumbing only.

The host side (:func:`unix_to_tcp`) accepts on a Unix socket and connects to a TCP port on
127.0.0.1; the worker side (:func:`tcp_to_unix`, started inside the namespace) accepts on
127.0.0.1:port there and connects to the Unix socket.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


def _pump(a: socket.socket, b: socket.socket) -> None:
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        a.close()  # each direction closes the socket it read from


def _serve(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


@contextlib.contextmanager
def unix_to_tcp(path: str, port: int) -> Iterator[str]:
    """Accepts on the Unix socket ``path`` and forwards each connection to 127.0.0.1:``port``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    t = threading.Thread(target=_serve, args=(listener, lambda: socket.create_connection(("127.0.0.1", port))),
                         daemon=True)
    t.start()
    try:
        yield path
    finally:
        listener.close()


def tcp_to_unix(port: int, path: str) -> None:
    """Accepts on 127.0.0.1:``port`` (in this process's namespace) and forwards to the Unix socket ``path``,
    in a daemon thread."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s

    threading.Thread(target=_serve, args=(listener, connect), daemon=True).start()

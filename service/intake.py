"""Reading what a plan request posts: the program's identity, checked off the request thread.

One :class:`Intake` per app (``app.extensions["disco_intake"]``, made by ``create_app``;
it starts nothing). For HLO text it runs :func:`service.programs.check_hlo` in a child
process, at most ``parallel`` at a time per server process and each for at most
``timeout_s`` (then the child is killed), and remembers the answers for the last
``cache_size`` texts by their SHA-256, so a worker asking again for a plan it already
has costs one hash, not a parse.

Graph JSON is validated by its pydantic schema (fast, in the request) and identified by
:func:`graph_program`, which builds the graph and digests it; its ``fingerprint`` field is
ignored and replaced by the server's digest.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from service import limits
from service.errors import ApiError

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Program(NamedTuple):
    """A posted program as the server identified it."""

    fingerprint: str  # HLO: the HLO fingerprint; graph JSON: the server's digest of the graph
    identity: str     # what plan keys are made of (service.programs.program_identity)
    nodes: int


class Intake:
    """Checks posted HLO text in child processes and remembers the results.

    Args:
      timeout_s: seconds one check may take before its process is killed.
      parallel: checks running at once in this server process; more wait up to ``wait_s``.
      wait_s: how long a request waits for a free slot before it is answered 503.
      cache_size: texts whose result is remembered.
      memory_bytes: address-space limit of the checking process.
    """

    def __init__(self, *, timeout_s: float = limits.PARSE_TIMEOUT_S, parallel: int = 2, wait_s: float = 10.0,
                 cache_size: int = 256, memory_bytes: int = limits.PARSE_MEMORY_BYTES):
        if parallel < 1:
            raise ValueError(f"parallel: expected an integer >= 1, got {parallel!r}")
        self.timeout_s = float(timeout_s)
        self.wait_s = float(wait_s)
        self.cache_size = int(cache_size)
        self.memory_bytes = int(memory_bytes)
        self._slots = threading.BoundedSemaphore(parallel)
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, Program] = collections.OrderedDict()

    def hlo(self, text: str) -> Program:
        """The program of HLO ``text``.

        Raises:
          ApiError: 400 (field ``hlo_text``) for text that is not HLO, is past a limit or
            takes longer than ``timeout_s`` to check; 503 when every slot stays busy.
        """
        lines = text.count("\n") + 1
        if lines > limits.MAX_HLO_LINES:  # rejected before anything is parsed
            raise ApiError(400, "too_large", f"hlo_text: {lines} lines; the service accepts at most "
                           f"{limits.MAX_HLO_LINES}", "hlo_text")
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                return hit
        if not self._slots.acquire(timeout=self.wait_s):
            raise ApiError(503, "busy", f"every HLO check slot stayed busy for {self.wait_s:g} s; retry later",
                           None, {"Retry-After": "5"})
        try:
            out = self._run_check(text)
        finally:
            self._slots.release()
        if not out.get("ok"):
            raise ApiError(400, "invalid_hlo", f"hlo_text: {out.get('message')}", "hlo_text")
        program = Program(out["fingerprint"], out["identity"], int(out["nodes"]))
        with self._lock:
            self._cache[digest] = program
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return program

    def _run_check(self, text: str) -> dict[str, Any]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
        try:
            proc = subprocess.run([sys.executable, "-m", "service.programs", str(self.memory_bytes)],
                                  input=text.encode("utf-8", "surrogatepass"), capture_output=True,
                                  timeout=self.timeout_s, env=env, cwd=_ROOT, check=False)
        except subprocess.TimeoutExpired:
            raise ApiError(400, "too_large", f"hlo_text: checking it took longer than PARSE_TIMEOUT_S="
                           f"{self.timeout_s:g} s; the service accepts graphs of up to "
                           f"{limits.MAX_GRAPH_NODES} instructions", "hlo_text") from None
        try:
            out = json.loads(proc.stdout)
        except ValueError:
            out = None
        if proc.returncode != 0 or not isinstance(out, dict):
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            if proc.returncode < 0 or any("MemoryError" in line for line in err[-3:]):
                return {"ok": False, "message": f"checking it failed (exit status {proc.returncode}); "
                        f"it may need more than {self.memory_bytes} bytes of memory"}
            raise RuntimeError(f"the HLO check process failed (exit status {proc.returncode}): "
                               f"{err[-1] if err else 'no output'}")
        return out


def graph_program(graph: HloGraph) -> tuple[HloGraph, Program]:
    """The server's identity of a validated graph JSON, and the graph carrying it as fingerprint."""
    from service.programs import program_identity

    identity = program_identity("graph", graph)
    return dataclasses.replace(graph, fingerprint=identity), Program(identity, identity, len(graph.nodes))

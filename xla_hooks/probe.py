"""Compiling a rewritten module in a child process first, so an XLA abort cannot kill the caller.

XLA:CPU (jaxlib 0.10.2) answers some injected fusions with a CHECK failure that aborts the
whole process instead of raising (e.g. ``Check failed: has_layout()``). Validation rules out
every case measured so far, but a plan is input, and the user's training must survive any plan:
:func:`probe` compiles the module in ``python -m xla_hooks.probe --serve`` and reports how the child
ended. The child sets its own virtual device count and uses the parent's platform, and stays up for
the next probe of the same platform and device count (a jax start-up costs about 1 s of CPU here,
measured); one XLA aborted is replaced. One module by hand:

    python -m xla_hooks.probe --devices N --options '{"xla_disable_hlo_passes": "fusion"}' < module.hlo

A module that compiled is not probed again: its key (the module's text, the compile options, the
device count, the platform, jax's and jaxlib's versions) is kept as an empty file in
``$DISCO_PROBE_CACHE`` (default ``$XDG_CACHE_HOME/disco/probed``, else ``~/.cache/disco/probed``;
``off`` keeps nothing). XLA compiles the same module with the same options and versions the same way,
so a kept success stands; a failure is never kept (the next apply probes again and says why). A run
of ``disco optimize`` probes the same baselines every time.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CACHE_ENV = "DISCO_PROBE_CACHE"


# The child's one-line summary of an exception (an error message can span many lines, and its
# last line is often a fragment of MLIR, useless as a reason).
_ERROR_MARK = "disco-probe-error: "


class ProbeFailure(RuntimeError):
    """XLA rejected or aborted on the module in the probe process."""


def child_env(parent: Mapping[str, str], platform: str) -> dict[str, str]:
    """The probe child's environment: the parent's, without XLA_FLAGS, on the parent's platform.

    On CPU the child is pinned to "cpu". On an accelerator it keeps the parent's JAX_PLATFORMS
    (or none), so jax picks the same device; never "gpu", which jax expands to cuda and rocm,
    failing on the one that is missing (measured on an H100 with jax 0.11.2: "Unable to
    initialize backend 'rocm'").
    """
    env = dict(parent)
    env.pop("XLA_FLAGS", None)
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    return env


def probe(text: str, num_devices: int, compiler_options: Mapping[str, str], *, platform: str = "cpu",
          timeout_s: float = 600) -> None:
    """Compiles ``text`` in a child process; returns if XLA accepts it.

    The child lives on for the next probe on the same platform and device count (one jax start-up
    for them all); one that XLA aborted, or that did not answer in ``timeout_s``, is replaced.

    Raises:
      ProbeFailure: naming the signal and XLA's ``Check failed`` line, or the error.
    """
    kept = _kept_path(text, num_devices, compiler_options, platform)
    if kept is not None and kept.exists():
        return
    with _LOCK:
        child = _CHILDREN.get((platform, num_devices))
        if child is not None and child.proc.poll() is not None:  # ended between probes
            child.close()
            child = None
        if child is None:
            child = _CHILDREN[(platform, num_devices)] = _Child(num_devices, platform)
        try:
            child.compile(text, dict(compiler_options), timeout_s)
        except _ChildGone as gone:
            del _CHILDREN[(platform, num_devices)]
            raise gone.failure from None
    if kept is not None:
        _keep(kept)


class _ChildGone(Exception):
    """The child died or hung: ``failure`` says how; it must be replaced."""

    def __init__(self, failure: ProbeFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure


class _Child:
    """One ``python -m xla_hooks.probe --serve`` process: a request is a JSON line (the options and
    the module's length in bytes) then the module; the answer one JSON line. Its stderr goes to a
    temporary file, read back when it dies (XLA's ``Check failed`` line)."""

    def __init__(self, num_devices: int, platform: str) -> None:
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "xla_hooks.probe", "--devices", str(num_devices),
                                      "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     env=child_env(os.environ, platform))

    def compile(self, text: str, options: dict[str, Any], timeout_s: float) -> None:
        data = text.encode()
        try:
            self.proc.stdin.write(json.dumps({"options": options, "bytes": len(data)}).encode() + b"\n" + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _ChildGone(self._death()) from None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.close()
            raise _ChildGone(ProbeFailure(f"the probe compile did not finish in {timeout_s:.0f}s"))
        line = self.proc.stdout.readline()
        if not line:
            raise _ChildGone(self._death())
        reply = json.loads(line)
        if not reply["ok"]:
            raise ProbeFailure(f"the probe compile failed: {reply['error']}")

    def _death(self) -> ProbeFailure:
        """How the child ended: the signal and XLA's ``Check failed`` line, or its last words."""
        code = self.proc.wait()
        self.err.seek(0, os.SEEK_END)
        self.err.seek(max(0, self.err.tell() - (1 << 16)))
        lines = self.err.read().decode(errors="replace").splitlines()
        self.close()
        check = next((ln.split("] ", 1)[-1] for ln in reversed(lines) if "Check failed" in ln), None)
        if code < 0:
            sig = signal.Signals(-code).name
            return ProbeFailure(f"XLA aborted the probe compile ({sig}): {check or lines[-1:] or 'no message'}")
        last = next((ln for ln in reversed(lines) if ln.strip()), "no message")
        return ProbeFailure(f"the probe compile failed: the probe process exited ({code}): {last}")

    def close(self) -> None:
        """Ends the child (killed if it is still up) and closes its pipes and stderr file."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            with contextlib.suppress(OSError):
                f.close()


_LOCK = threading.Lock()
_CHILDREN: dict[tuple[str, int], _Child] = {}


@atexit.register
def _close_children() -> None:
    for child in list(_CHILDREN.values()):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            child.proc.stdin.close()  # the child's loop ends at end of input
            child.proc.wait(timeout=5)
        child.close()
    _CHILDREN.clear()


def cache_dir() -> Path | None:
    """Where compiled modules' keys are kept; None when ``$DISCO_PROBE_CACHE`` is ``off``."""
    env = os.environ.get(CACHE_ENV)
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "disco" / "probed"


def probe_key(text: str, num_devices: int, compiler_options: Mapping[str, str], platform: str) -> str:
    """What makes a probe's outcome: the module, the options, the devices, the platform and versions."""
    import jax
    import jaxlib

    head = {"devices": num_devices, "platform": platform, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "options": {k: repr(compiler_options[k]) for k in sorted(compiler_options)}}
    h = hashlib.sha256(json.dumps(head, sort_keys=True).encode())
    h.update(b"\n")
    h.update(text.encode())
    return h.hexdigest()


def _kept_path(text: str, num_devices: int, compiler_options: Mapping[str, str], platform: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / probe_key(text, num_devices, compiler_options, platform)


def _keep(path: Path) -> None:
    """Marks ``path``'s module as compiled; a cache that cannot be written only costs the next probe."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def _summary(e: Exception) -> str:
    """An exception in one line: its type, its first line and its first ``error:`` line (an error
    message can span many lines, and its last line is often a fragment of MLIR)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    summary = " ".join(dict.fromkeys(lines[:1] + [ln for ln in lines if "error:" in ln][:1]))
    return f"{type(e).__name__}: {summary[:600]}"


def _serve(devices: int) -> int:
    """Answers :class:`_Child`'s requests until the end of input. The answers go to the process's
    original stdout; whatever else writes to stdout (jax, XLA) goes to stderr instead."""
    from xla_hooks import _jax_private

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while head := requests.readline():
        request = json.loads(head)
        text = requests.read(request["bytes"]).decode()
        try:
            _jax_private.compile_text_standalone(text, devices, request["options"])
            answer = {"ok": True}
        except Exception as e:  # noqa: BLE001 - a rejected module is an answer, not the child's end
            answer = {"ok": False, "error": _summary(e)}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="compile an HLO module read from stdin (disco's probe)")
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--options", default="{}")
    ap.add_argument("--serve", action="store_true", help="answer requests until the end of input (probe()'s child)")
    args = ap.parse_args(argv)
    import jax

    if jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_num_cpu_devices", args.devices)
    if args.serve:
        return _serve(args.devices)
    from xla_hooks import _jax_private

    try:
        _jax_private.compile_text_standalone(sys.stdin.read(), args.devices, json.loads(args.options))
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line, then traced
        print(f"{_ERROR_MARK}{_summary(e)}", file=sys.stderr, flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

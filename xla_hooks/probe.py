"""Compiling a rewritten module in a child process first, so an XLA abort cannot kill the caller.

XLA:CPU (jaxlib 0.10.2) answers some injected fusions with a CHECK failure that aborts the
whole process instead of raising (e.g. ``Check failed: has_layout()``). Validation rules out
every case measured so far, but a plan is input, and the user's training must survive any plan:
:func:`probe` compiles the module in ``python -m xla_hooks.probe`` and reports how the child
ended. The child sets its own virtual device count and uses the parent's platform.

    python -m xla_hooks.probe --devices N --options '{"xla_disable_hlo_passes": "fusion"}' < module.hlo

A module that compiled is not probed again: its key (the module's text, the compile options, the
device count, the platform, jax's and jaxlib's versions) is kept as an empty file in
``$DISCO_PROBE_CACHE`` (default ``$XDG_CACHE_HOME/disco/probed``, else ``~/.cache/disco/probed``;
``off`` keeps nothing). XLA compiles the same module with the same options and versions the same way,
so a kept success stands; a failure is never kept (the next apply probes again and says why). Each
probe child costs a jax start-up and a compile (measured: 1-2 s of CPU for mlp tiny), and a run of
``disco optimize`` probes the same baselines every time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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

    Raises:
      ProbeFailure: naming the signal and XLA's ``Check failed`` line, or the error.
    """
    kept = _kept_path(text, num_devices, compiler_options, platform)
    if kept is not None and kept.exists():
        return
    env = child_env(os.environ, platform)
    cmd = [sys.executable, "-m", "xla_hooks.probe", "--devices", str(num_devices),
           "--options", json.dumps(dict(compiler_options))]
    try:
        r = subprocess.run(cmd, input=text, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ProbeFailure(f"the probe compile did not finish in {timeout_s:.0f}s") from None
    if r.returncode == 0:
        if kept is not None:
            _keep(kept)
        return
    lines = r.stderr.splitlines()
    check = next((ln.split("] ", 1)[-1] for ln in lines if "Check failed" in ln), None)
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        raise ProbeFailure(f"XLA aborted the probe compile ({sig}): {check or lines[-1:] or 'no message'}")
    err = next((ln[len(_ERROR_MARK):] for ln in lines if ln.startswith(_ERROR_MARK)), None)
    err = err or next((ln for ln in reversed(lines) if ln.strip()), "no message")
    raise ProbeFailure(f"the probe compile failed: {err}")


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="compile an HLO module read from stdin (disco's probe)")
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--options", default="{}")
    args = ap.parse_args(argv)
    import jax

    if jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_num_cpu_devices", args.devices)
    from xla_hooks import _jax_private

    try:
        _jax_private.compile_text_standalone(sys.stdin.read(), args.devices, json.loads(args.options))
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line, then traced
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        summary = " ".join(dict.fromkeys(lines[:1] + [ln for ln in lines if "error:" in ln][:1]))
        print(f"{_ERROR_MARK}{type(e).__name__}: {summary[:600]}", file=sys.stderr, flush=True)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

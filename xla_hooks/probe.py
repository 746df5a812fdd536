"""Compiling a rewritten module in a child process first, so an XLA abort cannot kill the caller.

XLA:CPU (jaxlib 0.10.2) answers some injected fusions with a CHECK failure that aborts the
whole process instead of raising (e.g. ``Check failed: has_layout()``). Validation rules out
every case measured so far, but a plan is input, and the user's training must survive any plan:
:func:`probe` compiles the module in ``python -m xla_hooks.probe`` and reports how the child
ended. The child sets its own virtual device count and uses the parent's platform.

    python -m xla_hooks.probe --devices N --options '{"xla_disable_hlo_passes": "fusion"}' < module.hlo
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping


class ProbeFailure(RuntimeError):
    """XLA rejected or aborted on the module in the probe process."""


def probe(text: str, num_devices: int, compiler_options: Mapping[str, str], *, platform: str = "cpu",
          timeout_s: float = 600) -> None:
    """Compiles ``text`` in a child process; returns if XLA accepts it.

    Raises:
      ProbeFailure: naming the signal and XLA's ``Check failed`` line, or the error.
    """
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = platform
    cmd = [sys.executable, "-m", "xla_hooks.probe", "--devices", str(num_devices),
           "--options", json.dumps(dict(compiler_options))]
    try:
        r = subprocess.run(cmd, input=text, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ProbeFailure(f"the probe compile did not finish in {timeout_s:.0f}s") from None
    if r.returncode == 0:
        return
    lines = r.stderr.splitlines()
    check = next((ln.split("] ", 1)[-1] for ln in lines if "Check failed" in ln), None)
    if r.returncode < 0:
        sig = signal.Signals(-r.returncode).name
        raise ProbeFailure(f"XLA aborted the probe compile ({sig}): {check or lines[-1:] or 'no message'}")
    err = next((ln for ln in reversed(lines) if ln.strip()), "no message")
    raise ProbeFailure(f"the probe compile failed: {err}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="compile an HLO module read from stdin (disco's probe)")
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--options", default="{}")
    args = ap.parse_args(argv)
    import jax

    if jax.config.jax_platforms in (None, "", "cpu"):
        jax.config.update("jax_num_cpu_devices", args.devices)
    from xla_hooks import _jax_private

    _jax_private.compile_text_standalone(sys.stdin.read(), args.devices, json.loads(args.options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compiling for a device this machine does not have: deviceless XLA:GPU, in a worker process.

XLA:GPU compiles for an H100 on a machine without a GPU (``../shared/GPU_NOTES.md``, last section):
jax's CUDA plugin describes a target from its ``target_config`` (``targets/h100.txtpb``) and a
topology, and compiles for the topology's compile-only devices; the result is XLA's optimised,
scheduled module (its fusions, combined collectives and schedule), not an executable. It needs
Python 3.12 and ``jax[cuda12]`` at the GPU image's jax (0.11.2, the jax the shipped H100 kernel times and
autotuning results were measured with: the same XLA forms the same kernels and reads the same autotune
keys), which disco's main environment lacks, so the
compile runs in a child process of that environment: ``make install-gpu`` makes it at ``.venv-gpu``
(:func:`gpu_python` finds it; ``DISCO_GPU_PYTHON`` overrides). Only the child's environment gets
``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1`` (without it the plugin's start-up check calls ``cuInit`` and
fails: no driver).

* :func:`compile_hlo` compiles a pre-optimisation module's text (as
  ``jax.jit(f).lower(...).as_text(dialect="hlo")`` prints it) for a target with N devices;
* :func:`compile_hlo_module` is the same with XLA:GPU's memory analysis of the executable it built
  (the step's peak device memory for the target: arguments, outputs, aliases, temporaries);
* :func:`compile_zoo_step` lowers a zoo model's training step for N devices in the child (a GSPMD
  step over abstract arguments) and compiles it the same way: (pre-optimisation text, compiled text).

Both take ``autotune_results``: a file of XLA's autotuning results (as a device compile writes them
with ``--xla_gpu_dump_autotune_results_to``), read and keyed for the target by
:mod:`xla_hooks.autotune_results` and loaded by the child's compile, so that the GEMMs (and
convolutions) it names get the kernels the device chose instead of the first candidate that compiles.
:func:`shipped_autotune_results` is the file measured on an H100 for the zoo's steps (``targets/``),
for a child whose jax is the one that wrote it (another XLA keys its results otherwise).

Results are cached on disk (``DISCO_COMPILE_CACHE``, default ``~/.cache/disco/compiled``) by the
module's digest, the target, the devices, the compile options, the autotune results loaded and the
child's jax version.
Without the environment, :func:`available` is False and the compiles raise
:class:`DevicelessUnavailable`; callers fall back to the Python emulation of XLA:GPU's fusion with
a :class:`DevicelessFallbackWarning`.

The child: ``python -m xla_hooks.deviceless`` reads one JSON request on stdin and writes one JSON
answer on stdout.

Example:
  >>> compiled = compile_hlo(text, target="h100", devices=1)  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

GPU_PYTHON_ENV = "DISCO_GPU_PYTHON"
CACHE_ENV = "DISCO_COMPILE_CACHE"
ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"h100": Path(__file__).with_name("targets") / "h100.txtpb"}
# target -> (autotuning results dumped on that device for the zoo's steps, the jax that dumped them):
# measured on one H100 80GB HBM3, 2026-11-28 (scripts/tools/gpu_truth.py; targets/README.md)
SHIPPED_AUTOTUNE = {"h100": (Path(__file__).with_name("targets") / "h100_autotune.textproto.gz", "0.11.2")}
COMPILE_TIMEOUT_S = 900.0  # a deviceless compile's default timeout, seconds
INSTALL_HINT = "run `make install-gpu` (Python 3.12 and jax[cuda12]==0.11.2 in .venv-gpu)"


class DevicelessUnavailable(RuntimeError):
    """The environment deviceless compilation needs is not there, or the child failed."""


class DevicelessFallbackWarning(UserWarning):
    """A GPU cluster was priced by the Python emulation because deviceless compilation is not available."""


def gpu_python() -> Path | None:
    """The Python of the deviceless environment: ``$DISCO_GPU_PYTHON``, else ``.venv-gpu/bin/python``
    of this checkout; None when neither is a file."""
    env = os.environ.get(GPU_PYTHON_ENV)
    p = Path(env) if env else ROOT / ".venv-gpu" / "bin" / "python"
    return p if p.is_file() else None


def available() -> bool:
    """Whether deviceless compilation can run here."""
    return gpu_python() is not None


def shipped_autotune_results(target: str) -> Path | None:
    """The autotuning results shipped for ``target`` when the deviceless environment's jax is the
    one that wrote them (None otherwise: no file for the target, no environment, or another jax,
    whose XLA keys its results by other fusions and key versions, so that they would not apply)."""
    shipped = SHIPPED_AUTOTUNE.get(target)
    py = gpu_python()
    if shipped is None or py is None or child_jax_version(py) != shipped[1]:
        return None
    return shipped[0]


def child_jax_version(python: Path) -> str:
    """The jax version installed beside ``python`` (read from its dist-info; '?' when not found)."""
    for d in glob.glob(str(python.parent.parent / "lib" / "python*" / "site-packages" / "jax-*.dist-info")):
        return Path(d).name.removeprefix("jax-").removesuffix(".dist-info")
    return "?"


def cache_key(text: str, *, target: str, devices: int, options: Mapping[str, Any], jax_version: str,
              kind: str = "hlo", autotune_results: str | None = None) -> str:
    """The cache key of one compile: sha256 over the module (or step) and everything that changes the
    result (``autotune_results``: the text of the results loaded, as the child gets it)."""
    h = hashlib.sha256()
    key = {"kind": kind, "target": target, "devices": devices, "jax": jax_version,
           "options": {k: options[k] for k in sorted(options)}}
    if autotune_results:  # only then: a compile without results keeps the key it had before they existed
        key["autotune"] = hashlib.sha256(autotune_results.encode()).hexdigest()
    h.update(json.dumps(key, sort_keys=True).encode())
    h.update(b"\n")
    h.update(text.encode())
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "disco" / "compiled")


def _check_target(target: str, devices: int) -> None:
    if target not in TARGETS:
        raise ValueError(f"deviceless target {target!r}: expected one of {sorted(TARGETS)}")
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices: expected an int >= 1, got {devices!r}")


def _autotune_text(options: Mapping[str, Any], autotune_results: str | os.PathLike[str] | None,
                   target: str) -> str | None:
    """The results file's text keyed for ``target`` (None without a file).

    Raises:
      ValueError: for a results file passed as a raw compile option, or one
        :func:`xla_hooks.autotune_results.read` refuses.
    """
    from xla_hooks import autotune_results as results_file

    if results_file.LOAD_OPTION in options:
        raise ValueError(f"compile option {results_file.LOAD_OPTION}: pass the file as autotune_results= "
                         "(it is checked, keyed for the deviceless target and loaded by the child)")
    if autotune_results is None:
        return None
    return results_file.for_target(results_file.read(autotune_results), TARGETS[target].read_text())


def _run_child(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    py = gpu_python()
    if py is None:
        raise DevicelessUnavailable(f"deviceless XLA:GPU compilation needs its environment: {INSTALL_HINT}; "
                                    f"or set {GPU_PYTHON_ENV} to such a Python")
    env = {**os.environ, "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={int(request.get('devices', 1))}"}
    try:
        r = subprocess.run([str(py), "-m", "xla_hooks.deviceless"], input=json.dumps(request), text=True,
                           capture_output=True, env=env, timeout=timeout, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        raise DevicelessUnavailable(f"deviceless compile ran past {timeout:.0f} s") from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-8:]
        raise DevicelessUnavailable(f"deviceless compile failed (exit {r.returncode}) with {py}:\n" + "\n".join(tail))
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise DevicelessUnavailable(f"deviceless compile: expected one JSON line on stdout, got "
                                    f"{r.stdout[-300:]!r}") from None


def _cached_compile(request: dict[str, Any], key_text: str, *, use_cache: bool, timeout: float,
                    needs: str = "compiled") -> dict[str, Any]:
    """The child's answer to ``request``, from the cache where an entry holds ``needs`` (an entry
    written before the child reported memory has no ``memory`` key: compiled again and replaced)."""
    py = gpu_python()
    jaxv = child_jax_version(py) if py is not None else "?"
    key = cache_key(key_text, target=request["target"], devices=request["devices"], options=request["options"],
                    jax_version=jaxv, kind=request["kind"], autotune_results=request.get("autotune_results"))
    path = cache_dir() / f"{key}.json"
    if use_cache and path.is_file():
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            entry = {}  # a damaged entry: compiled again and replaced
        if needs in entry:
            return {**entry, "cached": True}
    out = _run_child(request, timeout)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, path)
    return {**out, "cached": False}


def compile_hlo(text: str, *, target: str = "h100", devices: int = 1, options: Mapping[str, Any] | None = None,
                autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                timeout: float = COMPILE_TIMEOUT_S) -> str:
    """XLA:GPU's optimised, scheduled module for pre-optimisation HLO ``text`` on ``devices`` of ``target``.

    Args:
      autotune_results: a file of XLA's autotuning results (:mod:`xla_hooks.autotune_results`) whose
        choices the compile takes where it finds them (None: the first candidate that compiles).

    Raises:
      ValueError: for an unknown target, a bad device count, or a missing or malformed autotune
        results file.
      DevicelessUnavailable: without the environment, or when the compile fails (its message ends
        with the child's last lines of output).
    """
    _check_target(target, devices)
    opts = dict(options or {})
    req = {"kind": "hlo", "text": text, "target": target, "devices": devices, "options": opts,
           "autotune_results": _autotune_text(opts, autotune_results, target)}
    return _cached_compile(req, text, use_cache=use_cache, timeout=timeout)["compiled"]


class DevicelessModule(NamedTuple):
    """One deviceless compile: the module and XLA:GPU's memory analysis of its executable.

    Attributes:
      text: the optimised, scheduled module (``Compiled.as_text()``).
      memory: the executable's memory sizes in bytes per device (``get_compiled_memory_stats()``:
        ``argument_size_in_bytes``, ``output_size_in_bytes``, ``alias_size_in_bytes``,
        ``temp_size_in_bytes``, ...; :func:`disco.sim.memory.peak_memory` reads them), or None.
      memory_note: why ``memory`` is None (None when it is there).
    """

    text: str
    memory: Mapping[str, int] | None
    memory_note: str | None = None


def compile_hlo_module(text: str, *, target: str = "h100", devices: int = 1,
                       options: Mapping[str, Any] | None = None,
                       autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                       timeout: float = COMPILE_TIMEOUT_S) -> DevicelessModule:
    """:func:`compile_hlo` with XLA:GPU's memory analysis of the executable it built (the peak
    device memory of the step as compiled for the target: :class:`DevicelessModule`).

    Raises:
      ValueError, DevicelessUnavailable: as :func:`compile_hlo`.
    """
    _check_target(target, devices)
    opts = dict(options or {})
    req = {"kind": "hlo", "text": text, "target": target, "devices": devices, "options": opts,
           "autotune_results": _autotune_text(opts, autotune_results, target)}
    out = _cached_compile(req, text, use_cache=use_cache, timeout=timeout, needs="memory")
    return DevicelessModule(out["compiled"], out.get("memory"), out.get("memory_note"))


def compile_zoo_step(model: str, preset: str, *, target: str = "h100", devices: int = 1,
                     options: Mapping[str, Any] | None = None,
                     autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                     timeout: float = COMPILE_TIMEOUT_S) -> tuple[str, str]:
    """(pre-optimisation text, compiled text) of the zoo model's GSPMD training step (adamw) for
    ``devices`` of ``target``, lowered and compiled in the child (``autotune_results``: as
    :func:`compile_hlo`).

    Raises:
      ValueError, DevicelessUnavailable: as :func:`compile_hlo`.
    """
    _check_target(target, devices)
    opts = dict(options or {})
    req = {"kind": "step", "model": model, "preset": preset, "target": target, "devices": devices,
           "options": opts, "autotune_results": _autotune_text(opts, autotune_results, target)}
    out = _cached_compile(req, f"zoo:{model}/{preset}", use_cache=use_cache, timeout=timeout)
    return out["pre_optimization"], out["compiled"]


# -- the child ----------------------------------------------------------------------------------
def _topology_devices(target: str, devices: int) -> list[Any]:
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(platform="cuda", target_config=TARGETS[target].read_text(),
                                        topology=f"1x1x{devices}")
    return list(topo.devices)


def _lower_zoo_step(model: str, preset: str, devices: int) -> str:
    import jax

    import trax_models

    step, args = trax_models.make_train_step(model, preset=preset, devices=devices, optimizer="adamw",
                                             abstract=True, style="gspmd")
    return jax.jit(step).lower(*args).as_text(dialect="hlo")


def serve(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's work for one request (runs in the deviceless environment)."""
    import jax

    from xla_hooks import _jax_private

    t0 = time.perf_counter()
    target, devices, options = request["target"], int(request["devices"]), dict(request.get("options") or {})
    if request["kind"] == "step":
        text = _lower_zoo_step(request["model"], request["preset"], devices)
    else:
        text = request["text"]
    with tempfile.TemporaryDirectory(prefix="disco-autotune-") as tmp:
        if request.get("autotune_results"):  # XLA loads it once per process: this child compiles once
            from xla_hooks import autotune_results as results_file

            path = Path(tmp) / f"results{results_file.TEXT_SUFFIX}"
            path.write_text(request["autotune_results"])
            options.update(results_file.load_options(str(path)))
        compiled, memory, why = _jax_private.compile_module_for(text, _topology_devices(target, devices), options)
    out = {"compiled": compiled, "jax": jax.__version__, "compile_s": round(time.perf_counter() - t0, 3),
           "memory": memory, "memory_note": why}
    if request["kind"] == "step":
        out["pre_optimization"] = text
    return out


def main() -> int:
    request = json.loads(sys.stdin.read())
    print(json.dumps(serve(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

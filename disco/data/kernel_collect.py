"""``disco collect --kernels``: per-kernel device times of zoo steps under compile-option variants.

Writes the format of ``../shared/data/h100_kernels`` (its README): one JSON object per compile
of ``trax_models.make_train_step(model, preset, devices, optimizer)`` with a variant's compile
options, holding the compiled module, the wall step time, and two independent traces of the
same executable with every kernel's device time (:func:`xla_hooks.profiling.trace_kernels`).

On GPU every variant is compiled with CUDA-graph command buffers off
(``xla_gpu_enable_command_buffer=""``), so every kernel event names the HLO instruction that
launched it. Variants (``VARIANTS``): on GPU ``default``, ``no_priority_fusion``,
``no_multi_output_fusion``, ``no_triton_gemm`` (the options the shared data used); on CPU
``default`` and ``no_fusion`` (XLA:CPU's fusion pass off).

Fields per record: ``record_id`` (``model/preset/variant``; added to the shared format, the
resume key), ``model``, ``preset``, ``variant``, ``compile_options``, ``command_buffers``,
``jax``, ``device_kind``, ``devices``, ``optimizer`` (added to the shared format), ``compile_s``, ``wall_step_ms``, ``wall_samples_ms``,
``kernels_trace_a``, ``kernels_trace_b`` (per kernel ``stream``, ``kernel``, ``hlo_op``,
``ns_per_step``, ``launches_per_step``), ``compiled_hlo``, and ``pre_optimization_hlo`` on
``default`` records.

``DIR/kernels.jsonl`` gets one line per record, written with flush + fsync (``gzip`` it to
get the shared file's form; both read the same). A rerun skips every ``record_id`` already
there (a file holding another device kind's records, or records of another device count or optimizer,
is refused: their ids would pass for this one's); a truncated last line (a crash mid-write) is cut off before appending, and a whole last
record without its newline gets one. One collector per directory at a time (``DIR/.lock``, as
:mod:`disco.data.collect` holds it). A progress line
per record goes to ``progress``.

Example::

  disco collect --kernels --models mlp,bert --presets paper --out /tmp/h100_kernels
  disco collect --kernels --models random:40 --presets paper --variants default --out /tmp/corpus

Models are zoo models or random networks of the cost model's corpus (``random_<family>_<seed>``,
:mod:`trax_models._random`; ``random:N`` on the command line names N of them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

RECORDS = "kernels.jsonl"
GPU_BASE_OPTIONS: Mapping[str, Any] = {"xla_gpu_enable_command_buffer": ""}
VARIANTS: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    "gpu": {
        "default": {},
        "no_priority_fusion": {"xla_disable_hlo_passes": "priority-fusion"},
        "no_multi_output_fusion": {"xla_disable_hlo_passes": "multi_output_fusion"},
        "no_triton_gemm": {"xla_gpu_enable_triton_gemm": False},
    },
    "cpu": {
        "default": {},
        "no_fusion": {"xla_disable_hlo_passes": "fusion"},
    },
}


@dataclasses.dataclass(frozen=True)
class KernelCollectConfig:
    """What to collect.

    Attributes:
      models: zoo model names.
      presets: zoo presets.
      out: the dataset directory.
      variants: variant names (of ``VARIANTS`` for the backend); None: all of the backend's.
      devices: data-parallel devices of the step (1: no all-reduce, as in the shared data).
      steps: steps per trace (two traces per record).
      rounds: timed rounds of ``round_steps`` steps for ``wall_step_ms``.
      round_steps: steps per timed round.
      optimizer: the zoo step's optimizer.
      budget_s: no record starts once this many seconds have passed (None: no limit); a rerun
        resumes with the rest.
    """

    models: tuple[str, ...]
    presets: tuple[str, ...]
    out: str
    variants: tuple[str, ...] | None = None
    devices: int = 1
    steps: int = 5
    rounds: int = 3
    round_steps: int = 20
    optimizer: str = "adamw"
    budget_s: float | None = None

    def __post_init__(self) -> None:
        if not self.models or not self.presets:
            raise ValueError(f"expected at least one model and one preset, got models={self.models!r}, "
                             f"presets={self.presets!r}")
        for field in ("devices", "steps", "rounds", "round_steps"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"KernelCollectConfig.{field}: expected an integer >= 1, got {v!r}")
        b = self.budget_s
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0):
            raise ValueError(f"KernelCollectConfig.budget_s: expected seconds > 0 or None, got {b!r}")


@dataclasses.dataclass(frozen=True)
class KernelCollectSummary:
    """What one run did: records written and skipped (already there), lines dropped, records left
    undone when the time budget ran out."""

    written: int
    skipped: int
    dropped_lines: int
    left: int = 0


def variant_options(backend: str, variant: str) -> dict[str, Any]:
    """The compile options of ``variant`` on ``backend`` ("gpu" or "cpu"), command buffers off on GPU.

    Raises:
      ValueError: for an unknown backend or variant (listing the known ones).
    """
    table = VARIANTS.get(backend)
    if table is None:
        raise ValueError(f"backend: expected one of {sorted(VARIANTS)}, got {backend!r}")
    if variant not in table:
        raise ValueError(f"variant {variant!r} is not known on {backend}; expected one of {', '.join(table)}")
    base = dict(GPU_BASE_OPTIONS) if backend == "gpu" else {}
    return {**table[variant], **base}


def read_records(path: str, *, repair: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Reads a kernels file (plain or ``.gz``), skipping lines that are not records.

    Args:
      path: the file (missing means empty).
      repair: cut a truncated last line off a plain file, and end a whole last record's line
        where its newline is missing, so the next append starts a line of its own.

    Returns:
      (the records, the number of lines skipped).
    """
    if not os.path.exists(path):
        return [], 0
    if path.endswith(".gz"):
        import gzip

        with gzip.open(path, "rb") as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    out: list[dict[str, Any]] = []
    bad = 0
    pos = 0
    lines = data.split(b"\n")
    unended = False
    for i, raw in enumerate(lines):
        start, pos = pos, pos + len(raw) + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or "model" not in obj or "variant" not in obj:
                raise ValueError("not a record")
        except ValueError:
            bad += 1
            if repair and i == len(lines) - 1 and not path.endswith(".gz"):
                with open(path, "r+b") as f:
                    f.truncate(start)
                    os.fsync(f.fileno())
            continue
        out.append(obj)
        unended = i == len(lines) - 1  # a record on the last line: no newline after it
    if repair and unended and not path.endswith(".gz"):
        # a whole record without its newline (cut off just before it, or a file written by another
        # tool): end its line, or the next append would join the two into one unreadable line
        with open(path, "ab") as f:
            f.write(b"\n")
            os.fsync(f.fileno())
    return out, bad


def record_id(rec: Mapping[str, Any]) -> str:
    """``model/preset/variant``: the resume key (also for shared records without ``record_id``)."""
    return rec.get("record_id") or f"{rec['model']}/{rec['preset']}/{rec['variant']}"


def _append(path: str, obj: Mapping[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _wall_ms(fn: Callable[..., Any], args: Sequence[Any], rounds: int, steps: int) -> list[float]:
    import jax

    jax.block_until_ready(fn(*args))  # warm-up
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        res = None
        for _ in range(steps):
            res = fn(*args)
        jax.block_until_ready(res)
        out.append((time.perf_counter() - t0) / steps * 1e3)
    return out


def measure_record(model: str, preset: str, variant: str, config: KernelCollectConfig) -> dict[str, Any]:
    """Compiles and profiles one (model, preset, variant); returns the record."""
    import jax

    import trax_models
    from disco.ir.hlo_parse import parse_module
    from xla_hooks.profiling import trace_kernels

    backend = jax.default_backend()
    kind = "gpu" if backend in ("gpu", "cuda", "rocm") else "cpu"
    options = variant_options(kind, variant)
    step, args = trax_models.make_train_step(model, preset=preset, devices=config.devices,
                                             optimizer=config.optimizer)
    lowered = jax.jit(step).lower(*args)
    t0 = time.perf_counter()
    compiled = lowered.compile(compiler_options=dict(options)) if options else lowered.compile()
    compile_s = time.perf_counter() - t0
    text = compiled.as_text()
    module = parse_module(text).name
    samples = _wall_ms(compiled, args, config.rounds, config.round_steps)
    traces = [[dataclasses.asdict(k) for k in trace_kernels(compiled, args, config.steps, module)]
              for _ in range(2)]
    rec: dict[str, Any] = {
        "record_id": f"{model}/{preset}/{variant}", "model": model, "preset": preset, "variant": variant,
        "compile_options": options, "command_buffers": kind != "gpu", "jax": jax.__version__,
        "device_kind": jax.devices()[0].device_kind, "devices": config.devices, "optimizer": config.optimizer,
        "compile_s": round(compile_s, 3), "wall_step_ms": statistics.median(samples),
        "wall_samples_ms": samples, "kernels_trace_a": traces[0], "kernels_trace_b": traces[1],
        "compiled_hlo": text,
    }
    if variant == "default":
        rec["pre_optimization_hlo"] = lowered.as_text(dialect="hlo")
    return rec


def collect_kernels(config: KernelCollectConfig, *, progress: Callable[[str], None] | None = print,
                    measure: Callable[..., dict[str, Any]] = measure_record) -> KernelCollectSummary:
    """Collects every (model, preset, variant) not yet in ``config.out``; see the module docstring.

    Args:
      config: what to collect.
      progress: called with one line per record (None: silent).
      measure: ``(model, preset, variant, config) -> record``; the real compile and profile
        by default.

    Returns:
      The summary.

    Raises:
      ValueError: for an unknown model, preset or variant, or a file of records from another device
        kind (a resumed record id would be taken as this device's).
      RuntimeError: another collector holds the directory (``DIR/.lock``).
    """
    import jax

    import trax_models

    bad = [m for m in config.models if m not in trax_models.names() and not trax_models.is_random(m)]
    if bad:
        raise ValueError(f"unknown models {bad}; expected some of {', '.join(trax_models.names())}, or random "
                         "networks random_<family>_<seed> (trax_models.random_names)")
    bad = [p for p in config.presets if p not in trax_models.presets()]
    if bad:
        raise ValueError(f"unknown presets {bad}; expected some of {', '.join(trax_models.presets())}")
    kind = "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"
    variants = config.variants or tuple(VARIANTS[kind])
    for v in variants:
        variant_options(kind, v)  # raises for an unknown variant
    os.makedirs(config.out, exist_ok=True)
    path = os.path.join(config.out, RECORDS)
    from disco.data.dataset import DirLock

    with DirLock(config.out):  # one collector per directory: two would measure and append every record
        existing, dropped = read_records(path, repair=True)
        here = jax.devices()[0].device_kind
        other = sorted({str(r.get("device_kind")) for r in existing if r.get("device_kind", here) != here})
        if other:
            raise ValueError(f"{path} holds records profiled on {', '.join(other)}, but this process runs on {here!r}; "
                             "expected a directory of this device's records (give another --out)")
        # nor devices nor optimizer is in a record id: another step's records would pass for this one's
        # (shared records have neither field: one device, the optimizer not recorded)
        other = sorted({f"devices {r.get('devices', 1)}" for r in existing if r.get("devices", 1) != config.devices}
                       | {f"optimizer {r['optimizer']}" for r in existing
                          if r.get("optimizer", config.optimizer) != config.optimizer})
        if other:
            raise ValueError(f"{path} holds records of steps with {', '.join(other)}, but this run compiles devices "
                             f"{config.devices} with optimizer {config.optimizer}; expected a directory of this step's "
                             "records (give another --out)")
        done = {record_id(r) for r in existing}
        todo = [(m, p, v) for m in config.models for p in config.presets for v in variants]
        written = skipped = 0
        started = time.perf_counter()
        for i, (m, p, v) in enumerate(todo, 1):
            rid = f"{m}/{p}/{v}"
            if config.budget_s is not None and rid not in done and time.perf_counter() - started > config.budget_s:
                left = sum(f"{a}/{b}/{c}" not in done for a, b, c in todo[i - 1:])
                if progress:
                    progress(f"[{i}/{len(todo)}] the budget of {config.budget_s:g} s is spent: {left} records "
                             "left for a rerun")
                return KernelCollectSummary(written=written, skipped=skipped, dropped_lines=dropped, left=left)
            if rid in done:
                skipped += 1
                if progress:
                    progress(f"[{i}/{len(todo)}] {rid}: already there, skipped")
                continue
            t0 = time.perf_counter()
            rec = measure(m, p, v, config)
            _append(path, rec)
            written += 1
            done.add(rid)
            if progress:
                device_ms = sum(k["ns_per_step"] for k in rec["kernels_trace_a"]) / 1e6
                progress(f"[{i}/{len(todo)}] {rid}: {len(rec['kernels_trace_a'])} kernels, "
                         f"{device_ms:.3f} ms device, {rec['wall_step_ms']:.3f} ms wall, "
                         f"compile {rec['compile_s']:.1f} s, {time.perf_counter() - t0:.1f} s in all")
    return KernelCollectSummary(written=written, skipped=skipped, dropped_lines=dropped)

"""Collecting samples: measure many real plans per model and append them to a dataset.

For each model the collector extracts the step's graph (stored once as
``DIR/graphs/<fingerprint>.json``), builds the baselines plus ``CollectConfig.random`` (K) random
valid plans (seeds 0..K-1; seed % 4 == 1 is bucket-only, seed % 4 == 2 group-only,
the rest both), applies each to the real compile, and measures it interleaved with
XLA's default compile (a few plans per chunk), so drift between chunks can be
normalised by ``reference_xla_default_median_ms`` (measured in the same rounds).
With ``profile`` every sample also gets per-kernel and per-collective times from
:func:`xla_hooks.profile` (traced; see its caveats).

``DIR/samples.jsonl`` gets one JSON object per sample (the format, and the rule for
lines that are not samples: :mod:`disco.data.dataset`), written with flush + fsync.
A rerun skips every ``sample_id`` already there, so an interrupted run loses at most
the chunk in flight (a sample id leaves the optimizer and the graph out, so a directory holding
samples of one of this run's steps measured with another optimizer or on another graph is refused); a truncated last line (a crash mid-write) is reported and cut
off before appending. One collector per directory at a time (``DIR/.lock``).
The command line is ``disco collect`` (:mod:`disco.cli.collect`).

Example::

  summary = collect(CollectConfig(models=("mlp",), out="/tmp/profiles", random=20))
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from disco.data import dataset


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    """What to collect.

    Attributes:
      models: zoo model names.
      out: the dataset directory.
      preset: zoo preset.
      devices: data-parallel CPU devices.
      random: random plans per model (seeds 0..random-1).
      rounds: interleaved measuring rounds per chunk.
      steps: steps per round.
      profile: also record per-kernel/per-collective times (traced).
      baselines: baseline names (``disco.plans.baselines.NAMES`` by default).
      interleave: plans measured together with the reference in one chunk.
      optimizer: the zoo step's optimizer.
    """

    models: tuple[str, ...]
    out: str
    preset: str = "tiny"
    devices: int = 4
    random: int = 10
    rounds: int = 3
    steps: int = 3
    profile: bool = False
    baselines: tuple[str, ...] | None = None
    interleave: int = 3
    optimizer: str = "adamw"


@dataclasses.dataclass
class CollectSummary:
    written: int = 0
    skipped: int = 0
    duplicates: int = 0
    invalid_plans: int = 0
    dropped_lines: int = 0
    per_model: dict[str, int] = dataclasses.field(default_factory=dict)


# -- environment -------------------------------------------------------------------------------
def environment() -> tuple[dict[str, str], dict[str, Any]]:
    """The versions (jax, jaxlib, python, numpy) and the device (platform, kind, host) a sample records."""
    import jax
    import jaxlib
    import numpy

    versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "python": platform.python_version(), "numpy": numpy.__version__}
    d = jax.devices()[0]
    device = {"platform": d.platform, "kind": getattr(d, "device_kind", "?"), "available": len(jax.devices()),
              "machine": platform.machine(), "cpus": os.cpu_count(), "node": platform.node()}
    return versions, device


def _setup_devices(n: int) -> None:
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass  # backend already up (tests, library use): make_train_step checks the count


# -- plans -------------------------------------------------------------------------------------
def plan_list(graph: Any, random: int, baselines: Sequence[str] | None = None
              ) -> tuple[list[tuple[str, Any]], int]:
    """(kind, plan) pairs for one graph: the baselines, then random plans; and how many seeds failed."""
    from disco.plans import baselines as bl
    from disco.plans import random_plans

    out: list[tuple[str, Any]] = [("baseline", p) for p in bl.make_all(graph, tuple(baselines or bl.NAMES)).values()]
    invalid = 0
    for seed in range(random):
        kind = {1: "random_buckets", 2: "random_groups"}.get(seed % 4, "random")
        try:
            plan = random_plans.random_plan(graph, seed, groups=kind != "random_buckets",
                                            buckets=kind != "random_groups")
        except ValueError:
            invalid += 1
            continue
        out.append((kind, plan))
    return out, invalid


def _chunks(items: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), max(1, n)):
        yield items[i:i + max(1, n)]


# -- collecting --------------------------------------------------------------------------------
def collect(config: CollectConfig, *, log: Callable[[str], None] | None = None,
            show_progress: bool = True) -> CollectSummary:
    """Collects samples into ``config.out`` (resumable); see the module docstring.

    Raises:
      ValueError: unknown model or preset, or bad counts.
      RuntimeError: another collector holds the directory.
    """
    import trax_models

    from disco.plans import baselines as bl

    bad = [f"{name} {value} (expected >= {lo})" for name, value, lo in
           (("rounds", config.rounds, 1), ("steps", config.steps, 1), ("devices", config.devices, 1),
            ("random", config.random, 0), ("interleave", config.interleave, 1)) if value < lo]
    if bad:
        raise ValueError("collect: " + ", ".join(bad))
    unknown_baselines = [b for b in config.baselines or () if b not in bl.NAMES]
    if unknown_baselines:  # before the directory is made: a typo leaves nothing behind
        raise ValueError(f"unknown baselines {unknown_baselines}; expected some of: {', '.join(bl.NAMES)}")
    unknown = [m for m in config.models if m not in trax_models.names()]
    if unknown or not config.models:
        raise ValueError(f"unknown models {unknown or '(none given)'}; expected some of: "
                         f"{', '.join(trax_models.names())}")
    if config.preset not in trax_models.presets():
        raise ValueError(f"unknown preset {config.preset!r}; expected one of: {', '.join(trax_models.presets())}")
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    os.makedirs(os.path.join(config.out, dataset.GRAPHS), exist_ok=True)
    path = dataset.samples_path(config.out)
    with dataset.DirLock(config.out):
        existing, _, dropped = dataset.read(path, repair=True, report=log)
        seen = _steps_seen(existing)
        steps = {dataset.step_id(m, config.preset, config.devices) for m in config.models}
        other = sorted({f"{step} with optimizer {opt}" for step, opts in seen.items() if step in steps
                        for opt, _ in opts if opt is not None and opt != config.optimizer})
        if other:  # their sample ids are this run's: the plans would be skipped as measured
            raise ValueError(f"{path} holds samples of {', '.join(other)}, but this run measures --optimizer "
                             f"{config.optimizer} (sample ids leave the optimizer out); expected a directory "
                             "of this optimizer's samples (give another --out)")
        done = {s["sample_id"] for s in existing}
        summary = CollectSummary(dropped_lines=dropped)
        if existing:
            log(f"resuming: {len(done)} samples already in {path}")
        _setup_devices(config.devices)
        versions, device = environment()
        device["count"] = config.devices
        from disco.plans import baselines

        n_base = len(set(config.baselines or baselines.NAMES))  # a name given twice is one plan (make_all)
        total = len(config.models) * (n_base + config.random)
        with _Progress(total, show_progress, log) as prog:
            for model in config.models:
                _collect_model(model, config, path, done, seen, versions, device, prog, summary, log)
    log(f"collect: wrote {summary.written}, skipped {summary.skipped} already present and "
        f"{summary.duplicates} duplicate plans, {summary.invalid_plans} random seeds gave no valid plan; {path}")
    return summary


def _steps_seen(samples: Sequence[dict[str, Any]]) -> dict[str, set[tuple[str | None, str | None]]]:
    """Per step id (a sample id less its plan digest): the (optimizer, graph fingerprint) pairs its
    samples were measured on."""
    seen: dict[str, set[tuple[str | None, str | None]]] = {}
    for s in samples:
        step = dataset.step_of(s["sample_id"])
        seen.setdefault(step, set()).add((s.get("optimizer"), s.get("graph_fingerprint")))
    return seen


def _collect_model(model: str, config: CollectConfig, path: str, done: set[str],
                   seen: dict[str, set[tuple[str | None, str | None]]], versions: dict,
                   device: dict, prog: _Progress, summary: CollectSummary, log: Callable[[str], None]) -> None:
    import trax_models

    from disco.ir import extractor
    from disco.bench import compiled_counts
    from disco.ir.graph import HloGraph
    from xla_hooks import apply_plan, measure

    prog.describe(f"{model}: building")
    step, args = trax_models.make_train_step(model, preset=config.preset, devices=config.devices,
                                             optimizer=config.optimizer)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *args))
    step_key = dataset.step_id(model, config.preset, config.devices)
    other = sorted({fp for _, fp in seen.get(step_key, ()) if fp is not None and fp != graph.fingerprint})
    if other:  # another jax, optimizer or model code: the same sample ids, another step
        raise ValueError(f"{path} holds samples of {step_key} measured on graph {', '.join(other)}, but this "
                         f"step's graph is {graph.fingerprint} (sample ids leave the graph out); expected a "
                         "directory of this step's samples (give another --out)")
    dataset.write_graph(config.out, graph.fingerprint, graph.to_json())
    plans, invalid = plan_list(graph, config.random, config.baselines)
    summary.invalid_plans += invalid
    prog.advance(invalid)
    pending: list[tuple[str, str, Any]] = []
    for kind, plan in plans:
        sid = dataset.sample_id(model, config.preset, config.devices, plan.digest())
        if sid in done or any(sid == p[0] for p in pending):
            if sid in done:
                summary.skipped += 1
            else:  # the same plan twice (a baseline equal to another, or a repeated random plan)
                summary.duplicates += 1
            prog.advance(1)
            continue
        pending.append((sid, kind, plan))
    if not pending:
        return
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", apply_plan.PlanFallbackWarning)
        reference = apply_plan.apply(None, step, *args)
    reference_s = time.perf_counter() - t0
    for chunk in _chunks(pending, config.interleave):
        prog.describe(f"{model}: compiling {len(chunk)}")
        compiled: dict[str, Any] = {}
        meta: dict[str, dict[str, Any]] = {}
        for sid, kind, plan in chunk:
            t0 = time.perf_counter()
            if plan.is_default:  # XLA's default compile is the reference itself
                applied, t0 = reference, t0 - reference_s
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", apply_plan.PlanFallbackWarning)
                    applied = apply_plan.apply(plan, step, *args)
            fus, ars = compiled_counts(applied.compiled_text())
            compiled[sid] = applied
            meta[sid] = {"compile_s": round(time.perf_counter() - t0, 3), "applied": applied.applied,
                         "fallback_reason": applied.fallback_reason,
                         "compiled": {"fusions": fus, "all_reduces": ars}}
        prog.describe(f"{model}: measuring {len(chunk)}")
        ms = measure.measure_interleaved({"__reference__": reference, **compiled}, args,
                                         rounds=config.rounds, steps=config.steps)
        ref = ms["__reference__"]
        for sid, kind, plan in chunk:
            m = ms[sid]
            rec = dataset.sample(
                model=model, preset=config.preset, devices=config.devices, graph_fingerprint=graph.fingerprint,
                kind=kind, plan=plan,
                measured={"median_ms": m.median * 1e3, "min_ms": m.min * 1e3, "max_ms": m.max * 1e3,
                          "samples_ms": [s * 1e3 for s in m.samples], "rounds": config.rounds, "steps": config.steps},
                reference_ms=ref.median * 1e3 if ref.median > 0 else None, optimizer=config.optimizer,
                **meta[sid], versions=versions, device=device)
            if config.profile:
                rec["per_kernel"] = _profile_summary(compiled[sid], args, config.steps, graph)
            dataset.append(path, rec)
            done.add(sid)
            summary.written += 1
            summary.per_model[model] = summary.per_model.get(model, 0) + 1
            prog.advance(1, measured=True)
        del compiled


def _profile_summary(applied: Any, args: Sequence[Any], steps: int, graph: Any) -> dict[str, Any]:
    from xla_hooks.profiling import profile

    r = profile(applied, args, steps=steps, graph=graph, rounds=3)
    return {
        "step_ms": r.step_s * 1e3, "traced_step_ms": r.traced_step_s * 1e3, "total_op_ms": r.total_op_s * 1e3,
        "kernels": [[k, s * 1e3] for k, s in r.kernel_records()],
        "groups_ms": {str(k): v * 1e3 for k, v in r.by_group().items()},
        "buckets_ms": {str(k): v * 1e3 for k, v in r.by_bucket().items()},
        "bucket_pack_ms": {str(k): v * 1e3 for k, v in r.by_bucket(None).items()},
        "collectives_ms": sum(o.seconds for o in r.ops if o.opcode.startswith("all-reduce")) * 1e3,
    }


class _Progress:
    """rich progress (with ETA) on stderr; plain lines with an ETA when stderr is not a terminal."""

    def __init__(self, total: int, enabled: bool, log: Callable[[str], None]):
        self.total, self.enabled, self.log = total, enabled, log
        self.done = 0
        self.measured = 0
        self.t0 = time.perf_counter()
        self.desc = ""
        self._prog: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        console = Console(stderr=True)
        if console.is_terminal:
            self._prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                  console=console)
            self._prog.__enter__()
            self._task = self._prog.add_task("collect", total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._prog is not None:
            self._prog.__exit__(*exc)

    def describe(self, text: str) -> None:
        self.desc = text
        if self._prog is not None:
            self._prog.update(self._task, description=text)

    def advance(self, n: int, measured: bool = False) -> None:
        if n <= 0:
            return
        self.done += n
        self.measured += n if measured else 0
        if self._prog is not None:
            self._prog.update(self._task, advance=n)
        elif self.enabled and measured:
            el = time.perf_counter() - self.t0
            eta = (self.total - self.done) * el / max(1, self.measured)
            self.log(f"[{self.done}/{self.total}] {self.desc} elapsed "
                     f"{datetime.timedelta(seconds=int(el))} ETA {datetime.timedelta(seconds=int(eta))}")

"""The samples dataset: the one reader and writer of ``samples.jsonl`` and its graph files.

A dataset is a directory::

    DIR/samples.jsonl              one measured plan per line (a JSON object), appended
    DIR/graphs/<fingerprint>.json  each step's graph (:meth:`disco.ir.graph.HloGraph.to_json`), once
    DIR/.lock                      held by the one collector writing to DIR (:class:`DirLock`)

A line of ``samples.jsonl`` (schema ``disco.samples/1``; :func:`sample` makes every writer's: :mod:`disco.data.collect`,
:mod:`disco.data.runs`, ``service.trials``)::

    sample_id        "<model>/<preset>/d<devices>/<plan digest>" (:func:`sample_id`); unique in a file
    schema           "disco.samples/1"
    model, preset, devices, optimizer     the zoo step that was measured
    graph_fingerprint                     its graph (the file under graphs/)
    kind             "baseline", "random", "random_buckets" or "random_groups" (collect), "optimize"
                     (a ``disco optimize`` run), "trial" (a service job)
    plan_name, plan_digest, plan          the plan (:meth:`disco.plans.plan.FusionPlan.to_dict`)
    measured         {median_ms, min_ms, max_ms, samples_ms (where kept), rounds, steps}
    reference_xla_default_median_ms       xla_default measured in the same rounds (null: not measured)
    ratio_to_reference                    measured median / that reference
    compile_s, applied, fallback_reason   how the plan's compile went
    compiled         {fusions, all_reduces} in the compiled module
    versions, device, created             the environment and a UTC timestamp (ISO 8601, ``Z``)
    predicted_ms, predicted_by, winner, plan_key   (optimize, trial) the writer's own fields
    per_kernel       (optional, with --profile) traced per-kernel and per-collective times

The tolerance rule (one for every reader): a line is a sample when it is a JSON object with
a ``sample_id``; blank lines are ignored; any other line is skipped, counted and reported
with its line number, never an error (a collector may be writing the file right now). Only
the last line may be cut short by a crash mid-write: :func:`read` with ``repair=True`` cuts
such a line off, and terminates a valid last line that lacks its newline, so the next
:func:`append` starts on a fresh line. Whether a sample is *usable* (applied, a finite time)
is for the consumer to decide (``gnn.train.load_dataset``).

Example::

    >>> f = read("tests/data/profiles_small/samples.jsonl")    # doctest: +SKIP
    >>> len(f.samples), f.skipped                               # doctest: +SKIP
    (30, 0)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

SCHEMA = "disco.samples/1"
SAMPLES = "samples.jsonl"
GRAPHS = "graphs"


class SampleFile(NamedTuple):
    """What :func:`read` found.

    Attributes:
      samples: the sample objects, in file order.
      lines: each sample's 1-based line number in the file.
      skipped: lines that were not samples (blank lines aside).
    """

    samples: list[dict[str, Any]]
    lines: list[int]
    skipped: int


def step_id(model: str, preset: str, devices: int) -> str:
    """The measured step's part of a sample id: ``"<model>/<preset>/d<devices>"``."""
    return f"{model}/{preset}/d{devices}"


def sample_id(model: str, preset: str, devices: int, digest: str) -> str:
    """A sample's id: the step (:func:`step_id`) and the plan's digest."""
    return f"{step_id(model, preset, devices)}/{digest}"


def step_of(sid: str) -> str:
    """The step part (:func:`step_id`) of a sample id (:func:`sample_id`): all but its plan digest."""
    return str(sid).rpartition("/")[0]


def group_key(sample: Mapping[str, Any]) -> str:
    """The step a sample measured: ``"<model>/<preset>/d<devices>/<fingerprint[:8]>"``.

    Samples are comparable (ranked) only within one group. A missing preset reads as ``""``
    and missing devices as 1 (samples written before those fields existed).
    """
    return (f"{step_id(sample['model'], sample.get('preset', ''), sample.get('devices', 1))}"
            f"/{str(sample['graph_fingerprint'])[:8]}")


def samples_path(root: str | os.PathLike[str]) -> str:
    """``DIR/samples.jsonl``."""
    return os.path.join(os.fspath(root), SAMPLES)


def graph_path(root: str | os.PathLike[str], fingerprint: str) -> str:
    """``DIR/graphs/<fingerprint>.json``."""
    return os.path.join(os.fspath(root), GRAPHS, f"{fingerprint}.json")


def write_graph(root: str | os.PathLike[str], fingerprint: str, graph_json: str) -> str:
    """Writes a graph file once (atomically: a temporary file, then a rename); returns its path.

    An existing file is kept: a fingerprint names one graph.
    """
    path = graph_path(root, fingerprint)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(graph_json)
        os.replace(tmp, path)
    return path


def read_graph_json(root: str | os.PathLike[str], fingerprint: str) -> str:
    """The text of a graph file.

    Raises:
      ValueError: when the file is missing, naming the path expected.
    """
    path = graph_path(root, fingerprint)
    if not os.path.isfile(path):
        raise ValueError(f"graph {fingerprint} is missing; expected {path}")
    with open(path, encoding="utf-8") as f:
        return f.read()


def sample(*, model: str, preset: str, devices: int, graph_fingerprint: str, kind: str, plan: Any,
           measured: Mapping[str, Any], reference_ms: float | None, created: float | None = None,
           **fields: Any) -> dict[str, Any]:
    """One sample line's object: the fields every writer sets, then ``fields`` beside them.

    The one place a sample's id, plan fields and ratio are made (:mod:`disco.data.collect`,
    :mod:`disco.data.runs`, ``service.trials``).

    Args:
      model, preset, devices: the step (:func:`step_id`); ``preset`` may name a run's group.
      graph_fingerprint: the step's graph (its file under ``graphs/``).
      kind: how the plan came to be measured ("baseline", "random", "optimize", "trial", ...).
      plan: the :class:`~disco.plans.plan.FusionPlan` measured.
      measured: ``{median_ms, min_ms, max_ms, rounds, steps}`` and, where kept, ``samples_ms``.
      reference_ms: xla_default's median in the same rounds; None when it was not measured.
      created: when it was measured (POSIX seconds; default now), written as UTC ISO 8601.
      **fields: the writer's own fields (``applied``, ``versions``, ``predicted_ms``, ...).

    Raises:
      ValueError: ``measured`` has no positive finite ``median_ms``.
    """
    median = measured.get("median_ms")
    if not (isinstance(median, (int, float)) and math.isfinite(median) and median > 0):
        raise ValueError(f"a sample's measured median_ms: expected a positive finite time, got {median!r}")
    digest = plan.digest()
    stamp = time.time() if created is None else created
    return {"schema": SCHEMA, "sample_id": sample_id(model, preset, devices, digest), "model": model,
            "preset": preset, "devices": devices, "graph_fingerprint": graph_fingerprint, "kind": kind,
            "plan_name": plan.name, "plan_digest": digest, "plan": plan.to_dict(), "measured": dict(measured),
            "reference_xla_default_median_ms": reference_ms,
            "ratio_to_reference": median / reference_ms if reference_ms else None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp)), **fields}


def output_dir(out: str | os.PathLike[str]) -> tuple[str, set[str]]:
    """Opens a dataset directory to append to: made when missing; returns its path and the ids of
    the samples already in it (a writer skips those).

    Raises:
      ValueError: ``out`` exists and is not a directory.
    """
    path = os.fspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"samples: expected a dataset directory, got the file {path!r}")
    os.makedirs(path, exist_ok=True)
    return path, {s["sample_id"] for s in read(samples_path(path)).samples}


def is_sample(obj: Any) -> bool:
    """Whether a parsed line is a sample: a JSON object with a ``sample_id``."""
    return isinstance(obj, dict) and "sample_id" in obj


def read(path: str | os.PathLike[str], *, repair: bool = False,
         report: Callable[[str], None] | None = None) -> SampleFile:
    """Reads a samples file by the tolerance rule of the module docstring.

    Args:
      path: the ``samples.jsonl`` file; a missing file reads as empty.
      repair: cut a last line that is not a sample off the file, and end a valid last line
        that lacks its newline, so the next :func:`append` starts on a fresh line.
      report: called with one message per line skipped (``"<path>:<line>: ..."``).

    Returns:
      The samples, their line numbers and the count of skipped lines.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return SampleFile([], [], 0)
    with open(path, "rb") as f:
        data = f.read()
    samples: list[dict[str, Any]] = []
    numbers: list[int] = []
    skipped = 0
    pos = 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        start, pos = pos, pos + len(raw) + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if not is_sample(obj):
            skipped += 1
            if last:
                if report:
                    report(f"{path}:{i + 1}: ignoring a truncated last line ({len(raw)} bytes)"
                           + (", cut off" if repair else ""))
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(start)
                        os.fsync(f.fileno())
            elif report:
                report(f"{path}:{i + 1}: ignoring a line that is not a sample")
            continue
        if last and repair:  # valid but unterminated: terminate it
            with open(path, "ab") as f:
                f.write(b"\n")
                os.fsync(f.fileno())
        samples.append(obj)
        numbers.append(i + 1)
    return SampleFile(samples, numbers, skipped)


def encode(sample: Mapping[str, Any]) -> str:
    """One line of the file: compact JSON with sorted keys, newline-terminated.

    Raises:
      ValueError: when ``sample`` has no ``sample_id``.
    """
    if not is_sample(dict(sample)):
        raise ValueError(f"a sample needs a 'sample_id'; got keys {sorted(sample)}")
    return json.dumps(dict(sample), sort_keys=True, separators=(",", ":")) + "\n"


def append(path: str | os.PathLike[str], sample: Mapping[str, Any]) -> None:
    """Appends one sample as one line, flushed and fsynced (a crash loses at most this line).

    Raises:
      ValueError: when ``sample`` has no ``sample_id``.
    """
    line = encode(sample)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


class DirLock:
    """An exclusive flock on ``DIR/.lock`` (released by the OS if the process dies): one collector
    per dataset directory (:mod:`disco.data.collect`, :mod:`disco.data.kernel_collect`).

    Raises:
      RuntimeError: on entry, when another process holds it.
    """

    def __init__(self, directory: str):
        self.path = os.path.join(directory, ".lock")
        self.fd: int | None = None

    def __enter__(self) -> DirLock:
        import fcntl

        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise RuntimeError(f"another collector is writing to {os.path.dirname(self.path)!r} "
                               f"(it holds {self.path}); expected one collector per directory") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)

"""Per-kernel training data: the shared dataset's records as kernel graphs with measured times.

Reads the format of ``../shared/data/h100_kernels/README.md`` (``per_instruction.jsonl.gz``: one
compile per line with ``compiled_hlo`` and two profiler traces). For each record:

* every kernel-launching instruction (:func:`gnn.kernel_features.module_kernels`), its graph
  and executions per step;
* labels: per ``hlo_op`` the profiler reported and the module holds, the device seconds per
  step (the mean of the two traces, summed over the op's kernels and streams: a cuBLAS call's
  memset counts with its GEMM) and the launches per step (its kernels' largest launch count, so a
  memset beside each GEMM is not a launch of its own). XLA:GPU runs identical kernels once
  compiled, and the profiler names all their launches after one instruction, so a label's
  seconds per launch is the mean over the instructions sharing its kernel.
* the record's measured step device time: every kernel of both traces summed, averaged.

Features are cached per record under ``cache_dir`` (keyed by the HLO's hash and the feature
version), since parsing a module takes seconds.

Example:
  >>> records = load_records("../shared/data/h100_kernels/per_instruction.jsonl.gz")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import os
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gnn import kernel_features as KF


class Label(NamedTuple):
    """One profiled hlo_op: seconds per step over ``launches`` launches per step."""

    seconds: float
    launches: float

    @property
    def per_launch(self) -> float:
        return self.seconds / max(self.launches, 1.0)


class Record(NamedTuple):
    """One profiled compile as kernel graphs and labels.

    Attributes:
      model, preset, variant: which compile.
      names: kernel-launching instruction names, in program order.
      executions: launches of each per step (loop trip counts).
      graphs: each one's :class:`gnn.kernel_features.KernelGraph`.
      labels: hlo_op name -> :class:`Label`, for the profiled ops the module holds.
      step_s: measured device seconds per step, every kernel summed (unmatched ones too).
    """

    model: str
    preset: str
    variant: str
    names: tuple[str, ...]
    executions: np.ndarray
    graphs: tuple[KF.KernelGraph, ...]
    labels: dict[str, Label]
    step_s: float

    @property
    def key(self) -> str:
        return f"{self.model}/{self.preset}/{self.variant}"

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def profiled_ops(self) -> list[str]:
        """The labelled ops with a positive time, sorted: the kernels a model is trained and judged on."""
        return sorted(op for op, lab in self.labels.items() if lab.per_launch > 0)


def _iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line.

    Raises:
      ValueError: for a line that is not a JSON object, or a damaged gzip file (naming the file).
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p.name}:{lineno}: not a JSON object ({e})") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"{p.name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                yield lineno, obj
    except (gzip.BadGzipFile, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"{p.name}:{lineno + 1}: not a complete gzip file of UTF-8 JSON lines "
                         f"({type(e).__name__}: {e})") from None


def profiled_on(rec: dict[str, Any]) -> str | None:
    """The device kind (``cpu``, ``h100``) a record was profiled on, read from jax's ``device_kind``
    (``cpu``, ``NVIDIA H100 80GB HBM3``); None for a record that does not say or a kind not known here."""
    kind = str(rec.get("device_kind", "")).lower()
    if kind == "cpu":
        return "cpu"
    return "h100" if "h100" in kind else None


def labels_of(rec: dict[str, Any]) -> tuple[dict[str, Label], float]:
    """(hlo_op -> Label, measured step seconds) from a record's two traces (their mean).

    Raises:
      ValueError: for a record without ``kernels_trace_a``, or a kernel whose time or launches are
        not a finite number >= 0.
    """
    traces = [rec[k] for k in ("kernels_trace_a", "kernels_trace_b") if isinstance(rec.get(k), list)]
    if not traces:
        raise ValueError(f"record {rec.get('model')}/{rec.get('variant')}: expected 'kernels_trace_a', "
                         f"got keys {sorted(rec)[:12]}")
    secs: dict[str, float] = {}
    launches: dict[str, float] = {}
    memset_only: dict[str, float] = {}
    for tr in traces:
        for k in tr:
            op, ns, n = k["hlo_op"], k["ns_per_step"], k["launches_per_step"]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                       for v in (ns, n)):  # one NaN or infinity made the step time or the training loss one
                raise ValueError(f"record {rec.get('model')}/{rec.get('variant')}: kernel {k.get('kernel')!r} of "
                                 f"{op!r}: expected ns_per_step and launches_per_step finite numbers >= 0, got "
                                 f"{ns!r} and {n!r}")
            secs[op] = secs.get(op, 0.0) + ns * 1e-9 / len(traces)
            n = float(n)
            if str(k.get("kernel", "")).startswith("Memset"):
                memset_only[op] = max(memset_only.get(op, 0.0), n)
            else:
                launches[op] = max(launches.get(op, 0.0), n)
    labels = {op: Label(s, launches.get(op) or memset_only.get(op, 1.0)) for op, s in secs.items()}
    return labels, sum(secs.values())


def record_from_json(rec: dict[str, Any]) -> Record:
    """Features and labels of one dataset line (no cache).

    Raises:
      ValueError: for a line without ``compiled_hlo`` or traces, or HLO that does not parse.
    """
    if not isinstance(rec.get("compiled_hlo"), str):
        raise ValueError(f"record {rec.get('model')}/{rec.get('variant')}: expected 'compiled_hlo' text")
    kernels = [k for k in KF.module_kernels(rec["compiled_hlo"]) if not k.kernel.is_empty]
    labels, step = labels_of(rec)
    names = tuple(k.name for k in kernels)
    known = set(names)
    return Record(**_which(rec), names=names, executions=np.array([k.executions for k in kernels], np.float64),
                  graphs=tuple(KF.kernel_graph(k.kernel) for k in kernels),
                  labels={op: lab for op, lab in labels.items() if op in known}, step_s=step)


def _which(rec: dict[str, Any]) -> dict[str, str]:
    """The record's model, preset and variant (``?`` where missing)."""
    return {k: str(rec.get(k, "?")) for k in ("model", "preset", "variant")}


# -- cache ------------------------------------------------------------------------------------
def _save(path: Path, r: Record) -> None:
    """Writes the cache file whole or not at all (a run killed mid-write leaves no half file)."""
    gs = r.graphs
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez_compressed(
        tmp, meta=np.array(json.dumps({"model": r.model, "preset": r.preset, "variant": r.variant,
                                        "names": list(r.names), "step_s": r.step_s,
                                        "labels": {k: list(v) for k, v in r.labels.items()}})),
        executions=r.executions, n_node=np.array([len(g.opcodes) for g in gs]),
        n_edge=np.array([len(g.senders) for g in gs]), opcodes=np.concatenate([g.opcodes for g in gs]),
        nodes=np.concatenate([g.nodes for g in gs]), senders=np.concatenate([g.senders for g in gs]),
        receivers=np.concatenate([g.receivers for g in gs]), totals=np.stack([g.totals for g in gs]))
    os.replace(tmp, path)


def _load(path: Path) -> Record:
    # the file opened here, so that a damaged one is closed too (np.load leaves its own handle open
    # when the zip cannot be read); an NpzFile reads (and decompresses) an array on every access: once each
    with open(path, "rb") as fh, np.load(fh) as npz:
        z = {k: npz[k] for k in npz.files}
    meta = json.loads(str(z["meta"]))
    no, eo = np.concatenate([[0], np.cumsum(z["n_node"])]), np.concatenate([[0], np.cumsum(z["n_edge"])])
    graphs = tuple(KF.KernelGraph(z["opcodes"][no[i]:no[i + 1]], z["nodes"][no[i]:no[i + 1]],
                                  z["senders"][eo[i]:eo[i + 1]], z["receivers"][eo[i]:eo[i + 1]], z["totals"][i])
                   for i in range(len(z["n_node"])))
    return Record(meta["model"], meta["preset"], meta["variant"], tuple(meta["names"]), z["executions"], graphs,
                  {k: Label(*v) for k, v in meta["labels"].items()}, float(meta["step_s"]))


def _cached(path: Path | None) -> Record | None:
    """The cached features at ``path``; None when there are none or the file cannot be read (one
    written by an older version of this code, or cut short): they are computed again and replace it."""
    if path is None or not path.is_file():
        return None
    try:
        return _load(path)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # a damaged or foreign file
        return None


def load_records(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 models: Sequence[str] | None = None, device: str | None = None, log: Any = None) -> list[Record]:
    """Every record of a per-kernel dataset file (``.jsonl`` or ``.jsonl.gz``), in file order.

    Args:
      path: the dataset file.
      cache_dir: where to keep computed features (None: no cache).
      models: keep only these models.
      device: the device kind every record must have been profiled on (:func:`profiled_on`;
        a record that does not say passes); None: any.
      log: called with a progress line per record (None: silent).

    Raises:
      ValueError: for a malformed line or record, or one profiled on another device (naming the
        file and line).
      FileNotFoundError: if ``path`` is not a file.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no per-kernel dataset at {path}" + (" (a directory; expected a .jsonl or "
                                                                       ".jsonl.gz file)" if p.is_dir() else ""))
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    out = []
    for lineno, rec in _iter_lines(p):
        if models is not None and rec.get("model") not in models:
            continue
        try:
            r = _record(rec, cache, device)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{p.name}:{lineno}: record {'/'.join(_which(rec).values())}: damaged fields "
                             f"({type(e).__name__}: {e})") from None
        except ValueError as e:
            raise ValueError(f"{p.name}:{lineno}: {e}") from None
        if log:
            log(f"{r.key}: {len(r.names)} kernels, {len(r.labels)} profiled ops, step {r.step_s * 1e3:.2f} ms")
        out.append(r)
    return out


@functools.cache
def features_code_digest() -> str:
    """A digest of the code that turns a module into features (``gnn.kernel_features`` and
    ``disco.sim.compiled_kernels``, which reads the kernels): part of the feature cache's key, so a
    change to either, version bumped or not, never reads features an earlier version of it wrote."""
    from disco.sim import compiled_kernels

    h = hashlib.sha256()
    for module in (KF, compiled_kernels):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:16]


def _record(rec: dict[str, Any], cache: Path | None, device: str | None) -> Record:
    """One line's record, its features from ``cache`` where they are there (and put there if not)."""
    on = profiled_on(rec)
    if device is not None and on is not None and on != device:
        raise ValueError(f"record {'/'.join(_which(rec).values())} was profiled on {rec['device_kind']!r} "
                         f"({on}), not {device!r}; expected records of {device!r} kernels")
    hlo = rec.get("compiled_hlo", "")
    if not isinstance(hlo, str):
        raise ValueError(f"record {'/'.join(_which(rec).values())}: expected 'compiled_hlo' text")
    h = hashlib.sha256(f"{KF.FEATURE_VERSION}\n{features_code_digest()}\n{hlo}".encode()).hexdigest()[:20]
    f = cache / f"{h}.npz" if cache is not None else None
    r = _cached(f)
    if r is not None:
        # labels and names are cheap and not part of the features: two records can share a module
        labels, step = labels_of(rec)
        known = set(r.names)
        return r._replace(**_which(rec), labels={k: v for k, v in labels.items() if k in known}, step_s=step)
    r = record_from_json(rec)
    if f is not None:
        _save(f, r)
    return r

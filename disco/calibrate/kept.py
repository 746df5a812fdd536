"""The kept corrections: one JSON file of measured points per machine, so the next run starts calibrated.

The file (default ``$XDG_CACHE_HOME/disco/corrections.json``, else ``~/.cache/disco/corrections.json``;
the environment variable ``DISCO_CORRECTIONS`` or an explicit path overrides it) holds, per machine
key (:func:`machine_key`: device kind and count, host, how the plans were measured, cost model), the
points of :mod:`disco.calibrate.correction`::

    {"format": "disco-corrections", "version": 1, "features": [...],
     "machines": {"<key>": {"updated": "<UTC time>", "points": [[graph, plan, [features], measured_s], ...],
                            "floors": {"<graph>": floor_ms, ...}}}}

``floors`` (optional) holds each step's compute floor, where the runner scaled the simulator's
compute to one (:class:`disco.optimizer.ProcessRunner`): the points' features were priced at that
scale, so the next run of the step reuses it (:func:`floor`) rather than measure a new one, which
moved by up to 20% between runs of one model on the 2-core VM and would put the new features on
another scale than the kept points'.

A file that cannot be read as that (corrupt, another version, other features) is never lost silently:
it is moved aside to ``<file>.unreadable-<UTC time>``, a :class:`KeptCorrectionWarning` names both
paths, and the run starts fresh. Writes go to a temporary file renamed over the old one, under an
exclusive lock (``<file>.lock``, ``flock``): two runs that keep at once both keep their points, a
machine's points from another run since this one loaded are merged, not dropped (:func:`save`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from disco.calibrate.correction import FEATURES, MAX_POINTS, Point, check_point

FORMAT = "disco-corrections"
VERSION = 1
ENV = "DISCO_CORRECTIONS"


class KeptCorrectionWarning(UserWarning):
    """A kept-corrections file could not be used (it was moved aside; the run starts fresh)."""


def default_path() -> str:
    """Where corrections are kept: ``$DISCO_CORRECTIONS``, else the per-user cache directory's
    ``disco/corrections.json``."""
    env = os.environ.get(ENV)
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "disco", "corrections.json")


def machine_key(device_kind: str, devices: int, runner: Mapping[str, Any], cost_model: str,
                host: str | None = None) -> str:
    """The key of one machine's correction: what measured (device kind and count, host, the runner
    and its link) and what predicted (the cost model) -- a correction fitted for one is wrong for another."""
    how = ", ".join(f"{k}={runner[k]}" for k in sorted(runner))
    return f"{devices} x {device_kind} on {host or socket.gethostname()} [{how}] priced by {cost_model}"


def _moved_aside(path: str, why: str) -> None:
    aside = f"{path}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    try:
        os.replace(path, aside)
        where = f"moved to {aside}"
    except OSError as e:
        where = f"left in place ({e.strerror})"
    warnings.warn(f"kept corrections {path}: {why}; {where}; starting without a kept correction",
                  KeptCorrectionWarning, stacklevel=3)


def _read(path: str) -> dict[str, Any] | None:
    """The file's machines (key -> entry), {} when there is no file; None when it was unreadable
    (then moved aside, with a warning)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        _moved_aside(path, f"not readable as JSON ({type(e).__name__}: {e})")
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        _moved_aside(path, f"expected a {FORMAT!r} file, got {str(data)[:60]!r}")
        return None
    if data.get("version") != VERSION or list(data.get("features") or []) != list(FEATURES):
        _moved_aside(path, f"expected version {VERSION} with features {list(FEATURES)}, got version "
                           f"{data.get('version')!r} with {data.get('features')!r}")
        return None
    machines = data.get("machines")
    if not isinstance(machines, dict):
        _moved_aside(path, "expected a 'machines' object")
        return None
    return machines


def _points(entry: Any) -> tuple[Point, ...]:
    """The points of one machine's entry.

    Raises:
      ValueError: for an entry that is not a list of valid points.
    """
    try:
        return tuple(check_point(Point(str(g), str(p), tuple(float(v) for v in f), float(m)))
                     for g, p, f, m in entry["points"])
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(f"expected points [graph, plan, [features], measured_s]: {e}") from None


def load(path: str, key: str) -> tuple[Point, ...]:
    """The points kept for machine ``key`` in ``path``; () when there are none or the file could
    not be used (moved aside, with a :class:`KeptCorrectionWarning`)."""
    machines = _read(path)
    if not machines or key not in machines:
        return ()
    try:
        return _points(machines[key])
    except ValueError as e:
        _moved_aside(path, f"machine {key!r}: {e}")
        return ()


def floor(path: str, key: str, graph: str) -> float | None:
    """The compute floor (ms) kept for step ``graph`` on machine ``key`` in ``path``; None when
    none is kept or the file could not be used (moved aside, with a :class:`KeptCorrectionWarning`)."""
    machines = _read(path)
    if not machines or key not in machines:
        return None
    value = (machines[key].get("floors") or {}).get(graph) if isinstance(machines[key], dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        warnings.warn(f"kept corrections {path}: machine {key!r}: the floor of {graph[:12]} is {value!r}, "
                      "expected a positive number of ms; measuring a new one", KeptCorrectionWarning, stacklevel=2)
        return None
    return float(value)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``<path>.lock`` for a read-modify-write of ``path`` (where ``fcntl``
    exists: every POSIX system)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system: no lock
        yield
        return
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def merged(kept_points: tuple[Point, ...], points: tuple[Point, ...]) -> tuple[Point, ...]:
    """What :func:`save` keeps for a machine: the points already kept for plans ``points`` does not
    measure (another run's, kept since this one loaded), then ``points`` (this run's own and what it
    loaded: for a plan both hold, this run's measurement is the newer); the newest
    :data:`~disco.calibrate.correction.MAX_POINTS`."""
    mine = {(p.graph, p.plan) for p in points}
    return (tuple(p for p in kept_points if (p.graph, p.plan) not in mine) + tuple(points))[-MAX_POINTS:]


def save(path: str, key: str, points: tuple[Point, ...], floors: Mapping[str, float] | None = None) -> None:
    """Keeps ``points`` for machine ``key`` in ``path``, merged with what the file holds for it
    (:func:`merged`), beside the other machines' (under the file's lock; atomically: a temporary
    file renamed over it); ``floors`` (step -> compute floor in ms) join the floors kept for it.

    Raises:
      OSError: when the file or its directory cannot be written.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with _locked(path):
        machines = _read(path) or {}
        try:
            before = _points(machines[key]) if key in machines else ()
        except ValueError as e:  # damaged since this run loaded: kept aside as load() does, and a fresh file
            _moved_aside(path, f"machine {key!r}: {e}")
            machines, before = {}, ()
        kept_floors = machines.get(key, {}).get("floors") if isinstance(machines.get(key), dict) else None
        entry = {"updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "points": [[p.graph, p.plan, list(p.features), p.measured_s] for p in merged(before, points)]}
        all_floors = {**(kept_floors if isinstance(kept_floors, dict) else {}),
                      **{g: float(ms) for g, ms in (floors or {}).items()}}
        if all_floors:
            entry["floors"] = all_floors
        machines[key] = entry
        _write(path, folder, {"format": FORMAT, "version": VERSION, "features": list(FEATURES),
                              "machines": machines})


def _write(path: str, folder: str, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".corrections-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

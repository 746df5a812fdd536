"""A per-machine correction of the simulator, learned from measured plans (TVM Ansor's update/predict).

The simulator prices a plan from a cost model and a cluster spec; on a real machine it can be off by
a factor (CPU compute several times slower than the roofline) and, worse, rank plans wrongly (each
all-reduce's fixed cost on in-process CPU devices, which the overlap the simulator credits does
not pay for). The correction maps a plan's simulated *features* to its measured step time:

    measured ~ w . (compute_s, exposed_s, comm_s, collectives_ms)

- ``compute_s``: the simulated kernels' summed time; ``exposed_s``: the simulated time the compute
  stream waits for collectives (step - compute); ``comm_s``: the collectives' summed time, exposed or
  not; ``collectives_ms``: the number of collectives the plan makes for the step's all-reduces
  (an ``rs_ag`` bucket's reduce-scatter and all-gather count two), times 1 ms (so its weight is
  milliseconds per collective).
- The prior is the simulator with its compute rescaled: ``w0 = (r, 1, 0, 0)``, ``r`` the median over
  the points of (measured - exposed) / compute (on CPU devices the roofline prices compute several
  times too fast, while the all-reduces are priced by a calibration on this machine), so one point
  fixes the scale without inventing a ranking of its own.
- One machine's points come from several steps (graphs). How far the cost model is off on a step's
  compute is the step's own (its kernels'); what a collective costs is the machine's. So, fitted for
  one graph (``graph``), the compute weight is that graph's own -- its prior ``r`` from its own
  points, or, for a graph with none yet, the median over the other graphs' ``r`` (one vote each) --
  while the other weights are shared by every point. Without ``graph`` every point shares one
  compute weight (measured on CPU across processes, where the runner already scales each step's
  compute to its own measured floor: one shared compute weight carried mlp's residual, 1.54, to
  transformer, whose median error was 45% against the simulator's own 16%). The weights
  are a ridge regression towards ``w0`` on relative residuals (``(measured - w.x) / measured``, so
  small and large steps count alike), the penalty ``PRIOR_POINTS`` pseudo-points strong per
  feature, with every weight kept >= 0 (a negative cost per all-reduce would send the search to
  thousands of buckets). Two or three points move it part of the way; a dozen varied ones decide it.

The state is explicit and immutable (:class:`Correction`): :func:`init` from kept points,
:func:`update` with new ones (refit), :func:`predict`; a plan's own point can be left out of its
prediction (``exclude``), or a batch's points out of the batch's (:meth:`Correction.without`), so a
report never judges a prediction that saw its measurement.

Example::

    c = init()                                      # no points: predicts the simulator's step time
    c = update(c, [Point("g", "p1", features_of(sim.result(p1), n1), 0.041)])
    c.predict(features_of(sim.result(p2), n2))     # seconds
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple

FEATURES = ("compute_s", "exposed_s", "comm_s", "collectives_ms")
PRIOR = (1.0, 1.0, 0.0, 0.0)  # the simulator's step time: compute + exposed communication
PRIOR_POINTS = 1.0  # the prior's strength, in points, per feature
MAX_POINTS = 256  # the newest kept per machine


class Point(NamedTuple):
    """One measured plan: which graph and plan (digests), its simulated features and its measured seconds."""

    graph: str
    plan: str
    features: tuple[float, ...]
    measured_s: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.graph, self.plan)


def features(compute_s: float, exposed_s: float, comm_s: float, collectives: int) -> tuple[float, ...]:
    """The :data:`FEATURES` of a step: its compute, exposed and total communication seconds and the
    number of collectives it makes (in thousands, on the scale of the times)."""
    return (float(compute_s), float(exposed_s), float(comm_s), collectives * 1e-3)


def features_of(result: object, collectives: int) -> tuple[float, ...]:
    """The :data:`FEATURES` of a plan from its simulated result (a ``disco.sim.SimResult``: step,
    compute, comm and exposed times) and the number of collectives it makes."""
    return features(result.compute_time, result.exposed_comm, result.comm_time,  # type: ignore[attr-defined]
                    collectives)


def check_point(p: Point) -> Point:
    """``p`` checked: finite non-negative features, as many as :data:`FEATURES`, a positive time.

    Raises:
      ValueError: naming what was wrong and what was expected.
    """
    if not isinstance(p, Point):
        raise ValueError(f"expected a correction Point, got {type(p).__name__}")
    if len(p.features) != len(FEATURES):
        raise ValueError(f"point {p.plan[:12]}: expected {len(FEATURES)} features ({', '.join(FEATURES)}), "
                         f"got {len(p.features)}")
    if any(not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in p.features):
        raise ValueError(f"point {p.plan[:12]}: expected finite features >= 0, got {p.features!r}")
    if not isinstance(p.measured_s, (int, float)) or not math.isfinite(p.measured_s) or p.measured_s <= 0:
        raise ValueError(f"point {p.plan[:12]}: expected a measured time > 0 s, got {p.measured_s!r}")
    return p


def fit(points: Sequence[Point], prior_points: float = PRIOR_POINTS, graph: str | None = None
        ) -> tuple[float, ...]:
    """The weights of :data:`FEATURES` fitted to ``points`` (the module doc), for the step ``graph``
    (its own compute weight; None: one compute weight for every graph); :data:`PRIOR` without points."""
    if not points:
        return PRIOR
    import numpy as np

    y = np.array([p.measured_s for p in points], dtype=float)
    group = [p.graph if graph is not None else None for p in points]  # whose compute weight each point fits
    graphs = sorted({*group, graph}) if graph is not None else [None]
    column = {g: i for i, g in enumerate(graphs)}
    # the design: one compute column per graph (one in all without ``graph``), then the shared features
    x = np.zeros((len(points), len(graphs) + len(FEATURES) - 1))
    for row, (p, g) in enumerate(zip(points, group)):
        x[row, column[g]] = p.features[0]
        x[row, len(graphs):] = p.features[1:]
    # the prior: the communication as simulated, each compute scaled to what is left of the measurement
    ratios: dict[str | None, list[float]] = {}
    for p, g in zip(points, group):
        c, e = p.features[0], p.features[1]
        if c > 0:
            ratios.setdefault(g, []).append(max(p.measured_s - e, 0.1 * p.measured_s) / c)
    own = {g: statistics.median(r) for g, r in ratios.items()}
    pooled = statistics.median(own.values()) if own else 1.0
    w0 = np.array([own.get(g, pooled) for g in graphs] + list(PRIOR[1:]))
    xr = x / y[:, None]  # relative: the target is 1 for every point
    spread = np.sqrt((xr ** 2).mean(axis=0))  # each column's typical size, relative to the step
    # ridge towards w0, prior_points pseudo-points strong per column (a column no point has stays at
    # w0), with every weight >= 0: a bounded linear least-squares problem on the augmented system
    strength = np.sqrt(prior_points) * np.where(spread > 0, spread, 1.0)
    a = np.vstack([xr, np.diag(strength)])
    b = np.concatenate([np.ones(len(y)), strength * w0])
    from scipy.optimize import lsq_linear

    w = lsq_linear(a, b, bounds=(0.0, np.inf), method="bvls").x  # exact (an active set) at this size
    return (float(w[column[graph]]), *(float(v) for v in w[len(graphs):]))


class Correction(NamedTuple):
    """The correction's state: the measured points it holds and the weights fitted to them.

    Attributes:
      points: the points, at most one per (graph, plan): a newer measurement replaces an older.
      weights: :func:`fit` of ``points``.
      kept: how many of ``points`` came from a kept correction (an earlier run).
      graph: the step it prices (its compute weight is that graph's own, :func:`fit`); None: one
        compute weight for every graph's points.
    """

    points: tuple[Point, ...] = ()
    weights: tuple[float, ...] = PRIOR
    kept: int = 0
    graph: str | None = None

    def predict(self, features: Sequence[float], exclude: tuple[str, str] | None = None) -> float:
        """The corrected step time of a plan with ``features``; with ``exclude`` (graph, plan), the
        weights refitted without that plan's own point, if it holds one."""
        w = self.weights if exclude is None else self.without((exclude,)).weights
        return float(sum(a * b for a, b in zip(w, features)))

    def without(self, keys: Iterable[tuple[str, str]]) -> Correction:
        """This correction refitted without the points of ``keys`` ((graph, plan) pairs): the state a
        batch of plans is predicted from, none of them seeing a measurement of its own.

        One state for the whole batch, rather than each plan's own point left out in turn: plans
        the features cannot tell apart then get one prediction, where leaving out each one's own
        point moves its prediction away from its measurement (the others' mean), which ranks such
        plans against their measurements (measured on CPU: docs/results.md, "The second run in one
        process")."""
        drop = set(keys)
        if not any(p.key in drop for p in self.points):
            return self
        points = tuple(p for p in self.points if p.key not in drop)
        kept = sum(1 for p in self.points[:self.kept] if p.key not in drop)
        return Correction(points, fit(points, graph=self.graph), kept, self.graph)

    def describe(self) -> dict[str, object]:
        """JSON-able: the points held, how many were kept from before, the weights by feature."""
        return {"points": len(self.points), "kept_points": self.kept,
                "weights": dict(zip(FEATURES, self.weights))}

    def __repr__(self) -> str:
        w = ", ".join(f"{n}={v:.3g}" for n, v in zip(FEATURES, self.weights))
        of = "" if self.graph is None else f" for {self.graph[:12]}"
        return f"Correction({len(self.points)} points, {self.kept} kept{of}; {w})"


def init(kept: Iterable[Point] = (), graph: str | None = None) -> Correction:
    """A correction for the step ``graph`` fitted to ``kept`` points (an earlier run's, of any graph;
    none: the simulator as it is).

    Raises:
      ValueError: for a point that is not valid (:func:`check_point`).
    """
    points = _merge((), kept)
    return Correction(points, fit(points, graph=graph), len(points), graph)


def update(state: Correction, new: Iterable[Point]) -> Correction:
    """``state`` with ``new`` points (each replacing a point of the same graph and plan), refitted.

    Raises:
      ValueError: for a point that is not valid (:func:`check_point`).
    """
    new = [check_point(p) for p in new]
    points = _merge(state.points, new)
    replaced = {p.key for p in new}
    kept = sum(1 for p in state.points[:state.kept] if p.key not in replaced)
    return Correction(points, fit(points, graph=state.graph), kept, state.graph)


def _merge(old: Sequence[Point], new: Iterable[Point]) -> tuple[Point, ...]:
    """``old`` then ``new``, one point per key (the newest, at the newest's place), the last :data:`MAX_POINTS`."""
    by_key: dict[tuple[str, str], Point] = {}
    for p in (*old, *(check_point(q) for q in new)):
        by_key.pop(p.key, None)
        by_key[p.key] = p
    return tuple(by_key.values())[-MAX_POINTS:]

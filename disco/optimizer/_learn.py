"""The model the funnel ranks plans with: the simulator through this machine's correction.

:class:`Predictor` prices a plan as :mod:`disco.calibrate.correction` does from its simulated
features (compute, exposed and total communication, all-reduces made), with the correction's
current state; with no measured points it is the simulator's own step time. :func:`kept_state`
and :func:`keep` read and write the machine's kept points (:mod:`disco.calibrate.kept`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from disco.calibrate import correction as corr
from disco.calibrate import kept
from disco.ir.graph import HloGraph
from disco.optimizer._accuracy import source_of
from disco.plans.plan import FusionPlan
from disco.sim.simulator import Simulator


def collectives(graph: HloGraph | int, plan: FusionPlan) -> int:
    """How many collectives ``plan`` makes for the step's all-reduces: one per bucket, two per
    ``rs_ag`` bucket (a reduce-scatter and an all-gather, each a point where every device waits
    for the others), one per all-reduce in no bucket, or 1 for XLA's combiner (``buckets=None``).
    ``graph``: the step's graph, or its number of all-reduces."""
    if plan.buckets is None:
        return 1
    total = graph if isinstance(graph, int) else len(graph.all_reduces())
    in_buckets = sum(len(b.members) for b in plan.buckets)
    made = sum(2 if b.build == "rs_ag" else 1 for b in plan.buckets)
    return made + max(0, total - in_buckets)


@dataclasses.dataclass(frozen=True)
class Predictor:
    """The simulator of one step through a correction (``state``); immutable, :meth:`with_state`
    gives the next one.

    Attributes:
      simulator: the step's simulator.
      state: the correction (its points and weights).
      source: what the simulator's own predictions are (:func:`~disco.optimizer._accuracy.source_of`).
      all_reduces: the step's all-reduces (counted once, not at every evaluation).
    """

    simulator: Simulator = dataclasses.field(repr=False)
    state: corr.Correction
    source: str
    all_reduces: int = 0

    @classmethod
    def of(cls, simulator: Simulator, state: corr.Correction | None = None) -> Predictor:
        costs = simulator.costs
        state = state or corr.init(graph=simulator.graph.fingerprint)  # its own step's compute weight
        return cls(simulator, state, source_of(getattr(costs, "name", type(costs).__name__)),
                   len(simulator.graph.all_reduces()))

    def with_state(self, state: corr.Correction) -> Predictor:
        return dataclasses.replace(self, state=state)

    def features(self, plan: FusionPlan) -> tuple[float, ...]:
        return corr.features_of(self.simulator.result(plan), collectives(self.all_reduces, plan))

    def key(self, plan: FusionPlan) -> tuple[str, str]:
        return (self.simulator.graph.fingerprint, plan.digest())

    def cost(self, plan: FusionPlan) -> float:
        """The search's cost: the corrected step time with every point the correction holds."""
        if not self.state.points:
            return self.simulator.step_time(plan)
        return self.state.predict(self.features(plan))

    def predict(self, plan: FusionPlan) -> tuple[float, str, float]:
        """(prediction, where it came from, the simulator's own step time) for a plan not measured
        yet: its own point, if the correction holds one from an earlier run, is left out."""
        simulated = self.simulator.step_time(plan)
        key = self.key(plan)
        if not any(p.key != key for p in self.state.points):
            return simulated, self.source, simulated
        return self.state.predict(self.features(plan), exclude=key), "corrected", simulated

    def for_batch(self, plans: Iterable[FusionPlan]) -> Predictor:
        """This predictor without any point of ``plans`` (:meth:`~disco.calibrate.correction.Correction.without`):
        what a batch measured together is predicted from, one state for all of them."""
        return self.with_state(self.state.without(self.key(p) for p in plans))

    def point(self, plan: FusionPlan, measured_s: float) -> corr.Point:
        return corr.Point(*self.key(plan), self.features(plan), measured_s)


@dataclasses.dataclass(frozen=True)
class Keeping:
    """Where this machine's correction is kept: the file (None: nothing kept, nothing read) and
    the machine's key in it (:func:`disco.calibrate.kept.machine_key`)."""

    path: str | None
    key: str


def keeping(path: str | None, simulator: Simulator, runner: Mapping[str, Any]) -> Keeping:
    """The :class:`Keeping` of a run on ``runner`` (its :meth:`~disco.optimizer.Runner.describe`)
    priced by ``simulator``."""
    import jax

    costs = simulator.costs
    name = getattr(costs, "name", type(costs).__name__)
    digest = getattr(costs, "digest", None)
    model = f"{name} {digest()[:12]}" if callable(digest) else name
    return Keeping(path, kept.machine_key(jax.devices()[0].device_kind, simulator.cluster.num_devices,
                                          runner, model))


def kept_state(where: Keeping, graph: str | None = None) -> corr.Correction:
    """The correction for the step ``graph`` (its fingerprint) fitted to the points kept for this
    machine (none without a file): its compute weight is that step's own, the rest shared by the
    machine's steps (:func:`disco.calibrate.correction.fit`)."""
    if where.path is None:
        return corr.init(graph=graph)
    return corr.init(kept.load(where.path, where.key), graph)


def kept_floor(where: Keeping, graph: str) -> float | None:
    """The compute floor (ms) kept for the step ``graph`` on this machine (:func:`disco.calibrate.kept.floor`)."""
    return None if where.path is None else kept.floor(where.path, where.key, graph)


def keep(where: Keeping, state: corr.Correction, floors: Mapping[str, float] | None = None) -> str | None:
    """Writes ``state``'s points for this machine, and ``floors`` (step -> the compute floor in ms
    its features were priced at); None when written (or nothing to keep), else why not (a warning
    says so too: a run's answer is not lost because its correction could not be kept)."""
    if where.path is None or not state.points:
        return None
    try:
        kept.save(where.path, where.key, state.points, floors)
    except OSError as e:
        why = f"cannot write {where.path}: {e.strerror}"
        warnings.warn(f"the correction was not kept: {why}", kept.KeptCorrectionWarning, stacklevel=2)
        return why
    return None

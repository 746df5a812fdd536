"""Runners: what measures a list of plans in interleaved rounds for ``optimize``.

The pipeline (its steps: :mod:`disco.optimizer._prepare` to :mod:`disco.optimizer._confirm`) picks the plans and makes every decision; a runner
only measures, as TVM's ``auto_scheduler/measure.py`` keeps its local and RPC runners behind one
interface so that one tuning loop serves both. Two runners:

- :class:`InProcessRunner`: this process's devices (compiles each plan once and reuses the
  executable in later runs of the same optimisation);
- :class:`disco.optimizer.ProcessRunner`: worker processes on loopback or an emulated link
  (:mod:`disco.runtime.multiprocess`; every run is a fresh launch that compiles every plan again).

A runner's :meth:`~Runner.run` takes the plans by row name and returns one :class:`Trial` per
plan, in the same order, with the per-round times; :class:`Trials` holds them.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from disco.optimizer._choice import Span
from disco.plans.plan import FusionPlan
from disco.sim.memory import peak_bytes
from xla_hooks.measure import Measurement

if TYPE_CHECKING:
    from disco.optimizer._config import OptimizeConfig, Progress
    from disco.optimizer._prepare import Target

OnRound = Callable[[int], None]
OnCompile = Callable[[str], None]


class Trial(NamedTuple):
    """One plan as a runner measured it.

    Attributes:
      times: the per-round step times in seconds (a :class:`~xla_hooks.measure.Measurement`): the
        paired speedups are computed on these.
      applied: whether the plan was applied (False: it fell back to XLA's default compile).
      fallback_reason: why it fell back, or None.
      all_reduces: the all-reduces in the compiled step, where the runner counted them.
      record: the runner's own JSON row for the plan (a launch's combined row), or None.
      peak_memory_bytes: the compiled step's peak device memory per device, as XLA's memory analysis
        reports it (:func:`disco.sim.memory.peak_memory`), where the runner read it; else None.
    """

    times: Measurement
    applied: bool
    fallback_reason: str | None = None
    all_reduces: int | None = None
    record: Mapping[str, Any] | None = None
    peak_memory_bytes: int | None = None

    def span(self) -> Span:
        """The median and range in seconds."""
        m = self.times
        return Span(m.median, m.min, m.max)

    def __repr__(self) -> str:
        s = self.span()
        fell = "" if self.applied else ", fell back"
        return f"Trial({s.median * 1e3:.3f} ms median over {len(self.times.samples)} rounds{fell})"


@dataclasses.dataclass(frozen=True)
class Trials:
    """What one run of a runner measured.

    Attributes:
      by_name: one :class:`Trial` per plan measured, by row name, in measuring order (a plan the
        runner did not measure is absent: see :meth:`Runner.run`'s ``measure_fallbacks``).
      bound: the communication-free bound's Trial, when asked for and measured; else None.
      compiled: the compiled steps by row name, for later runs of the same optimisation to reuse
        (:class:`InProcessRunner`; empty for runners that compile afresh every run).
      info: what the runner says about this run (e.g. the link and whether the workers compiled
        the graph the search saw).
    """

    by_name: Mapping[str, Trial]
    bound: Trial | None = None
    compiled: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Trials({len(self.by_name)} plans{', bound' if self.bound is not None else ''})"


class Runner(Protocol):
    """Measures plans for ``optimize`` (the module doc).

    Attributes:
      name: the runner's name in results ("in-process", "processes").
      reuses_compiles: whether a later run of the same optimisation reuses the compiled steps of
        an earlier one. A runner that compiles every plan afresh on every run (fresh processes)
        makes the run-off cost a full launch, so there it measures only the first choice against
        the regrouped plan (:func:`disco.optimizer.run_off`).
      measures_bound: whether it can measure the communication-free bound.
    """

    name: str
    reuses_compiles: bool
    measures_bound: bool

    def fit(self, target: Target, config: OptimizeConfig, progress: Progress) -> tuple[Target, dict[str, Any]]:
        """The target priced for the devices this runner measures on, and what was done (JSON-able)."""

    def run(self, target: Target, plans: Mapping[str, FusionPlan], *, rounds: int, steps: int,
            bound: bool = False, measure_fallbacks: bool = True,
            compiled: Mapping[str, Callable[..., Any]] | None = None,
            on_compile: OnCompile | None = None, on_round: OnRound | None = None) -> Trials:
        """Measures ``plans`` (by row name, xla_default among them) in ``rounds`` interleaved rounds
        of ``steps`` steps each.

        Args:
          bound: also measure the communication-free bound (where :attr:`measures_bound`).
          measure_fallbacks: False: a plan newly compiled that fell back is left out (where the
            runner knows before measuring).
          compiled: the compiled steps of earlier runs, by row name (reused where possible).
          on_compile: called with each row name compiled.
          on_round: called with each round's index when it is done.
        """

    def describe(self) -> dict[str, Any]:
        """What the runner is, for results (JSON-able)."""


@dataclasses.dataclass(frozen=True)
class InProcessRunner:
    """Measures plans on this process's devices (:func:`disco.bench.run_bench`,
    :func:`xla_hooks.measure.measure_interleaved`), reusing the executables of earlier runs.

    On CPU devices, :meth:`fit` first scales the cluster's compute to the step's compute floor
    (the step with its all-reduces replaced by copies, :func:`xla_hooks.bound.compile_comm_free`,
    timed on these devices), as :class:`~disco.optimizer.ProcessRunner` does across processes: the
    CPU roofline prices a step's compute 2-6x too fast, by a factor of the step's own (0.7 for
    rnnlm's loop of small kernels; docs/results.md, "The whole zoo in GSPMD style"), so a step
    with no measured plans of its own is priced at its own scale from its first round. On other
    devices the cost model is the device kind's own and the cluster is used as given.

    Attributes:
      scale_compute: scale the compute on CPU devices (above); False: the cluster as given.
      compute_floor_ms: that floor, when measured already (a kept one); None: timed in :meth:`fit`.
    """

    scale_compute: bool = True
    compute_floor_ms: float | None = None

    name = "in-process"
    reuses_compiles = True
    measures_bound = True

    def __repr__(self) -> str:
        floor = "" if self.compute_floor_ms is None else f"compute_floor_ms={self.compute_floor_ms:.4g}"
        return f"InProcessRunner({'scale_compute=False' if not self.scale_compute else floor})"

    def scales(self) -> bool:
        """Whether :meth:`fit` scales the compute: ``scale_compute`` and this process's devices are CPUs."""
        import jax

        return self.scale_compute and jax.default_backend() == "cpu"

    def fit(self, target: Target, config: OptimizeConfig, progress: Progress) -> tuple[Target, dict[str, Any]]:
        """``target`` with its cluster's compute scaled to the step's compute floor where
        :meth:`scales`; returns it and ``{"compute_floor": ..., "compute_speed": ...}`` ({} where it
        does not scale; ``{"compute_floor": None, ...}`` with a warning when the floor could not be timed)."""
        if not self.scales():
            return target, {}
        if self.compute_floor_ms is None:
            progress("extract", 1.0, "timing the compute floor on this process's devices")
            floor = _floor_here(target, config.rounds, config.steps)
            if floor is None:
                return target, {"compute_floor": None, "compute_speed": target.cluster.compute_speed}
        else:
            floor = {"median_ms": self.compute_floor_ms}
        return scaled_to_floor(target, floor, "this step")

    def describe(self) -> dict[str, Any]:
        # a scaled run's points are priced at another scale than an unscaled one's: another machine key
        return {"runner": self.name, **({"compute": "floor"} if self.scales() else {})}

    def run(self, target: Target, plans: Mapping[str, FusionPlan], *, rounds: int, steps: int,
            bound: bool = False, measure_fallbacks: bool = True,
            compiled: Mapping[str, Callable[..., Any]] | None = None,
            on_compile: OnCompile | None = None, on_round: OnRound | None = None) -> Trials:
        from disco import bench
        from xla_hooks import apply_plan
        from xla_hooks import measure as _measure
        from xla_hooks.apply_plan import PlanFallbackWarning

        compiled = dict(compiled or {})
        if not compiled:  # the first run: every plan compiled and measured, fallbacks included
            def progress(msg: str) -> None:
                if msg.startswith("compiled ") and on_compile is not None:
                    on_compile(msg[len("compiled "):])
                elif msg.startswith("round ") and on_round is not None:
                    on_round(int(msg.split()[1].split("/")[0]) - 1)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlanFallbackWarning)  # reported in the trials instead
                results = bench.run_bench(target.step_fn, target.args, dict(plans), rounds=rounds, steps=steps,
                                          kwargs=target.kwargs,
                                          progress=progress, comm_free_bound=bound)
            trials = {m.name: Trial(m.measurement, m.applied, m.fallback_reason, all_reduces=m.all_reduces,
                                    peak_memory_bytes=m.peak_memory_bytes)
                      for m in results if not m.is_bound}
            found = next((Trial(m.measurement, m.applied, m.fallback_reason, all_reduces=m.all_reduces)
                          for m in results if m.is_bound), None)
            return Trials(trials, found, {m.name: m.step for m in results if not m.is_bound})
        execs: dict[str, Any] = {}
        new: dict[str, Any] = {}
        for name, plan in plans.items():
            if name in compiled:
                execs[name] = compiled[name]
                continue
            if on_compile is not None:
                on_compile(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlanFallbackWarning)  # reported in the trial instead
                step = apply_plan.apply(plan, target.step_fn, *target.args, kwargs=target.kwargs)
            new[name] = step
            if step.applied or measure_fallbacks:
                execs[name] = step
        times = _measure.measure_interleaved(execs, target.args, rounds=rounds, steps=steps, on_round=on_round,
                                             kwargs=target.kwargs)
        trials = {}
        for name in plans:
            step = new.get(name)
            if name in times:
                trials[name] = Trial(times[name], True if step is None else step.applied,
                                     None if step is None else step.fallback_reason,
                                     peak_memory_bytes=peak_bytes(execs[name]))
        unmeasured = {n: s for n, s in new.items() if n not in times}
        info = {"unmeasured": {n: s.fallback_reason for n, s in unmeasured.items()}} if unmeasured else {}
        return Trials(trials, None, {**execs}, info)


def scaled_to_floor(target: Target, floor: dict[str, Any], what: str) -> tuple[Target, dict[str, Any]]:
    """``target`` with its cluster's compute scaled so that the simulator prices xla_default's compute
    at ``floor["median_ms"]`` (:func:`disco.calibrate.with_compute_floor`), and what a runner's ``fit``
    reports: ``{"compute_floor": floor`` with the cost model's own price added as ``predicted_ms``,
    ``"compute_speed"}``. ``what`` names the measurement in the cluster's description."""
    from disco import calibrate
    from disco.sim.simulator import Simulator

    cluster, costs = target.cluster, target.costs
    floor = {**floor, "predicted_ms": calibrate.predicted_compute_s(target.graph, cluster, costs) * 1e3}
    cluster = calibrate.with_compute_floor(cluster, target.graph, floor["median_ms"] / 1e3, costs, what=what)
    fitted = dataclasses.replace(target, simulator=Simulator(target.graph, costs, cluster))
    return fitted, {"compute_floor": floor, "compute_speed": cluster.compute_speed}


def _floor_here(target: Target, rounds: int, steps: int) -> dict[str, Any] | None:
    """The step's compute floor on this process's devices: the step with its all-reduces replaced
    by copies (not a plan: it changes the numbers), ``rounds`` samples of ``steps`` steps; None,
    with a ``RuntimeWarning`` saying why, when it does not compile."""
    from xla_hooks import bound, measure

    try:
        fn = bound.compile_comm_free(target.step_fn, *target.args, kwargs=target.kwargs)
    except Exception as e:  # noqa: BLE001 - the cluster is then priced as given, and the run goes on
        warnings.warn(f"disco: the compute floor was not timed ({type(e).__name__}: {e}); the simulator's compute "
                      "is not scaled to this step", RuntimeWarning, stacklevel=3)
        return None
    m = measure.measure(fn, target.args, rounds=rounds, steps=steps, kwargs=target.kwargs)
    return {"median_ms": m.median * 1e3, "min_ms": m.min * 1e3, "max_ms": m.max * 1e3}

"""The process runner: ``optimize``'s plans measured on worker processes, maybe over an emulated link.

Every run is one launch (:func:`disco.runtime.multiprocess.launch`) of ``processes`` workers with
``devices_per_process`` CPU devices each, behind ``link`` when one is given
(:mod:`disco.runtime.testbed`). Each worker rebuilds the zoo step by name (model, preset, optimizer,
style), reads the plans (baseline items, or plan files written here), compiles them and
measures them in interleaved rounds; a round's time is the slowest worker's
(:func:`disco.runtime.multiprocess.combine`). Every launch compiles every plan again, so the pipeline
keeps its run-off to the first choice and the regrouped plan with this runner
(:attr:`ProcessRunner.reuses_compiles`).

Before the search, :meth:`ProcessRunner.fit` scales the cluster's compute to the step's compute
floor measured across the workers (:func:`disco.calibrate.with_compute_floor`; in a launch of
its own unless ``compute_floor_ms`` is given): the analytic costs price a CPU step's compute
several times too low.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from disco.optimizer._runners import OnCompile, OnRound, Trial, Trials, scaled_to_floor
from disco.plans import baselines
from disco.plans.plan import FusionPlan
from xla_hooks.measure import Measurement

if TYPE_CHECKING:
    from disco.optimizer._config import OptimizeConfig, Progress
    from disco.optimizer._prepare import Target
    from disco.runtime.testbed import LinkSpec


@dataclasses.dataclass(frozen=True)
class ProcessRunner:
    """Measures plans on ``processes`` worker processes of ``devices_per_process`` CPU devices.

    This process's jax must have at least ``processes * devices_per_process`` devices to extract
    the step's graph (:meth:`make_step` builds the step the workers build).

    Attributes:
      model, preset: the zoo model the workers build (``trax_models.make_train_step``).
      processes, devices_per_process: the launch's shape.
      link: the emulated link between the workers, or None for 127.0.0.1.
      optimizer, style: the step's optimizer and how it is written (``trax_models.STYLES``).
      mesh_shape: style ``"fsdp"``: the ``(data, fsdp)`` mesh over all the workers' devices, process-major
        (``(2, 4)`` on 2 processes x 4: data parallel across the processes, FSDP within each); None: 1-D.
      timeout_s: each launch's time limit.
      scale_compute: price the search on the cluster with its compute scaled to the step's
        measured compute floor (:meth:`fit`); False: the cluster as given.
      compute_floor_ms: that floor, when measured already; None: measured in :meth:`fit`, in a
        launch of its own (``config.rounds`` rounds).

    Example::

        runner = ProcessRunner("mlp", "tiny", processes=2, devices_per_process=1)
        step, args = runner.make_step()
        result = disco.optimize(step, *args, cluster=cluster, runner=runner, budget_s=10)

    Raises:
      ValueError: process counts below 1.
    """

    model: str
    preset: str
    processes: int
    devices_per_process: int = 1
    link: LinkSpec | None = None
    optimizer: str = "adamw"
    style: str = "shard_map"
    mesh_shape: tuple[int, int] | None = None
    timeout_s: float = 1800
    scale_compute: bool = True
    compute_floor_ms: float | None = None

    name = "processes"
    reuses_compiles = False
    measures_bound = True

    def __post_init__(self) -> None:
        for f in ("processes", "devices_per_process"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {v!r}")

    def __repr__(self) -> str:
        over = "127.0.0.1" if self.link is None else self.link.label()[:60]
        return (f"ProcessRunner({self.model[:40]}/{self.preset[:20]}, {self.processes} x {self.devices_per_process} "
                f"devices over {over})")

    @property
    def devices(self) -> int:
        """The devices of all the workers together."""
        return self.processes * self.devices_per_process

    def make_step(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The step and example arguments the workers build, over :attr:`devices` devices of this process."""
        import trax_models

        return trax_models.make_train_step(self.model, self.preset, devices=self.devices, optimizer=self.optimizer,
                                           style=self.style, mesh_shape=self.mesh_shape)

    def describe(self) -> dict[str, Any]:
        out = {"runner": self.name, "processes": self.processes, "devices_per_process": self.devices_per_process}
        return {**out, "mesh_shape": list(self.mesh_shape)} if self.mesh_shape is not None else out

    def fit(self, target: Target, config: OptimizeConfig, progress: Progress) -> tuple[Target, dict[str, Any]]:
        """``target`` with its cluster's compute scaled to the step's compute floor across the
        workers (unless ``scale_compute`` is off); returns it and ``{"compute_floor": ...,
        "compute_speed": ...}``."""
        from disco import calibrate

        if not self.scale_compute:
            return target, {"compute_floor": None, "compute_speed": target.cluster.compute_speed}
        if self.compute_floor_ms is None:
            progress("extract", 1.0, f"measuring the compute floor across {self.processes} processes")
            floor = calibrate.measure_compute_floor(
                self.processes, self.devices_per_process, self.link, model=self.model, preset=self.preset,
                rounds=config.rounds, steps=config.steps, optimizer=self.optimizer, style=self.style,
                mesh_shape=self.mesh_shape, timeout_s=self.timeout_s)
        else:
            floor = {"median_ms": self.compute_floor_ms}
        return scaled_to_floor(target, floor, f"{self.model}/{self.preset}")

    def scales(self) -> bool:
        """Whether :meth:`fit` scales the compute to a floor: ``scale_compute``."""
        return self.scale_compute

    def run(self, target: Target, plans: Mapping[str, FusionPlan], *, rounds: int, steps: int,
            bound: bool = False, measure_fallbacks: bool = True,
            compiled: Mapping[str, Callable[..., Any]] | None = None,
            on_compile: OnCompile | None = None, on_round: OnRound | None = None) -> Trials:
        """One launch: every plan compiled by every worker and measured in ``rounds`` interleaved
        rounds, with the communication-free bound last in each round when ``bound`` (each round's
        time the slowest worker's, as the plans'). ``measure_fallbacks`` and ``compiled`` do not
        apply: whether a plan falls back is known after the launch, and every launch compiles."""
        from disco.bench import COMM_FREE_BOUND
        from disco.runtime import multiprocess

        tmp = tempfile.mkdtemp(prefix="disco-runner-")
        try:
            items = [_item(name, plan, target, tmp) for name, plan in plans.items()]
            spec = multiprocess.WorkerSpec(model=self.model, preset=self.preset, plans=tuple(items), rounds=rounds,
                                           steps=steps, optimizer=self.optimizer, style=self.style,
                                           mesh_shape=self.mesh_shape, comm_free_bound=bound)
            launched = multiprocess.launch(self.processes, self.devices_per_process, spec, link=self.link,
                                           timeout_s=self.timeout_s)
            launched.raise_if_failed("measuring across processes")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if on_round is not None:  # the workers report only at the end
            for r in range(rounds):
                on_round(r)
        rows = multiprocess.combine(launched)
        trials = trials_of(rows, plans)
        # no row when a worker could not compile the bound (bench warns and measures the plans anyway)
        has_bound = bound and any(r["plan"] == COMM_FREE_BOUND for r in rows)
        found = trials_of(rows, [COMM_FREE_BOUND])[COMM_FREE_BOUND] if has_bound else None
        info = {"link": launched.link_info(),
                "fingerprints_match": {r["fingerprint"] for r in launched.results} == {target.graph.fingerprint}}
        return Trials(trials, found, {}, info)


def trials_of(rows: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, Trial]:
    """A launch's combined rows (:func:`disco.runtime.multiprocess.combine`: ``samples_ms`` per plan,
    each round's step on its slowest process) as the trials of ``names``, in seconds like every
    :class:`~xla_hooks.measure.Measurement`, with the largest process's compiled peak memory."""
    by_plan = {r["plan"]: r for r in rows}
    return {name: Trial(Measurement(tuple(v * 1e-3 for v in by_plan[name]["samples_ms"])), by_plan[name]["applied"],
                        by_plan[name]["fallback_reason"], all_reduces=by_plan[name]["all_reduces"],
                        record=by_plan[name], peak_memory_bytes=by_plan[name].get("peak_memory_bytes"))
            for name in names}


def _item(name: str, plan: FusionPlan, target: Target, tmp: str) -> str:
    """The worker's plan argument for row ``name``: the baseline item whose row it is when that
    item makes ``plan``, else a plan file written under ``tmp``."""
    try:
        item = baselines.item_of_row(name)
        if baselines.parse_item(item).make(target.graph).digest() == plan.digest():
            return item
    except ValueError:
        pass
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(plan.replace(name=name).to_json())
    return path

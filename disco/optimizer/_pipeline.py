"""``optimize``: the steps of :mod:`disco.optimizer` in order, on a runner."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._result import OptimizeResult, make_result
from disco.optimizer._runners import InProcessRunner, Runner
from disco.calibrate.correction import Correction
from disco.optimizer._compiled import Prices
from disco.optimizer._funnel import funnel
from disco.optimizer._learn import Keeping, keep, keeping, kept_floor, kept_state
from disco.optimizer._confirm import confirm
from disco.optimizer._measure import Measured
from disco.optimizer._prepare import prepare
from disco.optimizer._runoff import run_off
from disco.sim.cluster import ClusterSpec
from disco.sim.costs import CostModel


def optimize(
    step_fn: Callable[..., Any],
    *args: Any,
    cluster: ClusterSpec | None = None,
    costs: CostModel | None = None,
    config: OptimizeConfig | None = None,
    progress: Progress | None = None,
    runner: Runner | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> OptimizeResult:
    """Finds the fastest measured plan for ``step_fn`` on ``args`` (the module doc's steps, in order).

    Args:
      step_fn: the training step (plain or jitted).
      *args: its example arguments (real arrays: the plans are measured).
      cluster: the cluster the simulator prices collectives with (default:
        ``cluster.preset("local", devices=<devices args are sharded over>)``, or over the devices
        the all-reduces' replica groups span when more (a pmap step's host arrays), whose link costs are
        placeholders; ``disco.calibrate.machine_cluster(devices)[0]`` measures this machine's, as
        ``disco optimize`` does without ``--cluster``).
      costs: the cost model (default: the cluster's device kind's, ``disco.sim.costs.device_costs.analytic(cluster.device)``:
        the CPU roofline, or ``SummedCosts`` on an H100 cluster).
      config: the options (default ``OptimizeConfig()``).
      progress: called as ``progress(phase, fraction, message)``; phases "extract", "search", "compile",
        "measure", "run-off", "confirm".
      runner: what measures the plans (default :class:`~disco.optimizer.InProcessRunner`: this
        process's devices; :class:`~disco.optimizer.ProcessRunner`: worker processes, whose step
        ``step_fn`` must be, :meth:`~disco.optimizer.ProcessRunner.make_step`).
      kwargs: the step's example keyword arguments, if it is called with some (a mapping, so that
        their names cannot clash with these options').
      **options: :class:`OptimizeConfig` fields (e.g. ``budget_s``, default 60 s; ``rounds``,
        default 9), applied over ``config``.

    Returns:
      The OptimizeResult.

    Raises:
      ValueError: for a bad option (:class:`OptimizeConfig` names it), or a ``cluster`` of another device
        kind than the one plans are measured on here (:func:`~disco.optimizer.predict` is for that),
        before anything runs.
      TypeError: for an option that is not an :class:`OptimizeConfig` field, or a ``config``,
        ``cluster`` or ``costs`` of the wrong type (before the graph is extracted).
      RuntimeError: when the runner fails (worker processes: their messages).
    """
    unknown = sorted(set(options) - set(OptimizeConfig.field_names()))
    if unknown:
        raise TypeError(f"optimize: unknown options {unknown}; expected OptimizeConfig fields: "
                        f"{', '.join(OptimizeConfig.field_names())}")
    if config is not None and not isinstance(config, OptimizeConfig):
        raise TypeError(f"config: expected an OptimizeConfig or None, got {type(config).__name__} "
                        "(pass options as keywords: optimize(step, *args, budget_s=30))")
    config = dataclasses.replace(config or OptimizeConfig(), **options)
    if isinstance(cluster, ClusterSpec):  # another type is refused by prepare, saying what was expected
        from disco.optimizer._predicted import measures_here

        if not measures_here(cluster):
            import jax

            raise ValueError(f"optimize measures plans on this process's {jax.default_backend()} devices, but cluster "
                             f"{cluster.name!r} is of {cluster.device} devices: those times would not be the "
                             "cluster's; disco.optimizer.predict chooses a plan for a cluster whose devices are not "
                             "here, by prediction")
    report = progress or no_progress
    runner = runner or InProcessRunner()
    if kwargs and not isinstance(runner, InProcessRunner):
        raise ValueError(f"kwargs: the {runner.name} runner calls the zoo's steps positionally; measure a step "
                         "with keyword arguments in this process (runner=None)")
    target = prepare(step_fn, args, cluster=cluster, costs=costs, progress=report, kwargs=kwargs)
    where = keeping(config.correction_file, target.simulator, machine_of(runner))
    graph = target.graph.fingerprint
    runner, floor_kept = with_kept_floor(runner, where, graph) if config.learn else (runner, False)
    target, fitted = runner.fit(target, config, report)
    if floor_kept and isinstance(fitted.get("compute_floor"), dict):
        fitted = {**fitted, "compute_floor": {**fitted["compute_floor"], "kept": True}}
    state = kept_state(where, graph) if config.learn else None
    cands, measured = funnel(target, config, report, runner, state)
    runoff = run_off(target, measured, config, report, runner)
    confirmation = confirm(target, measured, config, runoff, report, runner)
    floor = (fitted.get("compute_floor") or {}).get("median_ms")
    not_kept = (keep(where, measured.correction, {graph: floor} if floor else None)
                if config.learn and measured.correction is not None else None)
    info = {**runner.describe(), **fitted, **(measured.trials.info if measured.trials is not None else {})}
    learned = learning(config, where, state, measured, not_kept)
    return make_result(target, config, cands, measured, runoff, confirmation, info, learned)


def with_kept_floor(runner: Runner, where: Keeping, graph: str) -> tuple[Runner, bool]:
    """``runner`` given the compute floor kept for ``graph`` on this machine, and whether it was:
    a runner that scales the simulator's compute to a measured floor (a
    :class:`~disco.optimizer.ProcessRunner`, or an :class:`~disco.optimizer.InProcessRunner` on CPU
    devices) and was given none (``compute_floor_ms``) then prices this run's plans at the
    scale the kept points were priced at, and measures no new floor."""
    scales = getattr(runner, "scales", None)  # a runner of the Runner protocol alone has no floor
    if scales is None or not scales() or runner.compute_floor_ms is not None:
        return runner, False
    ms = kept_floor(where, graph)
    return (runner, False) if ms is None else (dataclasses.replace(runner, compute_floor_ms=ms), True)


def machine_of(runner: Runner) -> dict[str, Any]:
    """What of ``runner`` tells one machine's correction from another's: its description and its link."""
    link = getattr(runner, "link", None)
    return {**runner.describe(), **({"link": link.label()} if link is not None else {})}


def learning(config: OptimizeConfig, where: Keeping, start: Correction | None, measured: Measured,
             not_kept: str | None) -> dict[str, Any]:
    """What the run learned, JSON-able (:attr:`~disco.optimizer.OptimizeResult.learning`)."""
    end = measured.correction
    return {"learn": config.learn, "file": where.path, "machine": where.key,
            "kept_points_used": 0 if start is None else len(start.points),
            "points": None if end is None else len(end.points),
            "weights": None if end is None else end.describe()["weights"],
            "kept": bool(config.learn and where.path is not None and not_kept is None and end is not None
                         and end.points),
            "not_kept": not_kept, "rounds": [r.to_dict() for r in measured.rounds],
            "compiled_stage": None if measured.prices is None else compiled_stage(measured.prices)}


def compiled_stage(prices: Prices) -> dict[str, Any]:
    """What the funnel's compiled stage did, JSON-able: its compiles, the plans that did not compile
    (digest: why), the compiled tier's correction (points, weights)."""
    return {"compiles": prices.compiles, "failed": dict(prices.failed),
            "priced_from_executables": len(prices.executables), **prices.correction.describe()}

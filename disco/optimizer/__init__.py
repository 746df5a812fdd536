"""``optimize``: search a step's joint fusion/bucketing space, then keep only what measures faster.

The pipeline is a few pure steps, each with its own small result (the shape of
:mod:`disco.search`); :func:`optimize` runs them in order:

1. :func:`prepare`: extract the step's graph (:func:`disco.extract`) and its simulator.
2. :func:`candidates`: search plans against the simulator within a time budget
   (:mod:`disco.search`) and pick what to measure: the ``measure_top_k`` best plans by
   estimate together with ``xla_default``, the best baseline by estimate
   (:func:`disco.planner.best_baseline_name`), ``per_tensor``, ``horovod`` and ``ddp``, and a
   short sweep of bucket counts (``even_<k>``: the gradients cut into ``k`` buckets of equal
   bytes), measured because the bucket count that wins on CPU devices is not what the
   simulator predicts.
3. :func:`measure`: apply and time them in interleaved rounds (:func:`disco.bench.run_bench`).
   The first choice is the fastest *measured* plan by the paired speedup
   (:func:`xla_hooks.measure.paired_speedup`); when nothing beats ``xla_default`` the answer is
   ``xla_default`` and the verdict says so.
4. :func:`run_off`: the ``finalists`` fastest plans that beat ``xla_default`` are measured
   again, with it, in fresh interleaved rounds, and the fastest there is chosen (picking the
   fastest of a dozen noisy medians favours whichever plan got lucky rounds). With them, the
   fastest fusing plan's fusion groups on the fastest baseline's buckets, when those differ
   (:func:`regrouped_row`): the search chose its plans' buckets by the simulator, the
   measurement may have found a faster bucketing.
5. :func:`confirm`: the choice is measured once more against ``xla_default`` and, when the
   choice is not that baseline, the first run's best baseline (also beside another baseline), in fresh rounds (three times as many
   by default). The answer and its reported speedup come from that run: the faster of the choice
   and that baseline if it beats ``xla_default`` there, else ``xla_default``.

The options are one immutable :class:`OptimizeConfig`; the answer is an
:class:`OptimizeResult` (``print(result.summary())``); :func:`chrome_trace` draws a plan's
simulated timeline on request.

Example::

    step, args = trax_models.make_train_step("mlp", "small", devices=8)
    result = disco.optimize(step, *args, budget_s=30)
    print(result.summary())
    fast_step = xla_hooks.apply(result.plan, step, *args)

    # the same, step by step
    config = OptimizeConfig(budget_s=30)
    target = prepare(step, args)
    cands = candidates(target, config)
    measured = measure(target, cands, config)
    runoff = run_off(target, measured, config)
    result = make_result(target, config, cands, measured, runoff, confirm(target, measured, config, runoff))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from disco.optimizer._choice import (
    PlanRow,
    Span,
    confirmed_winner,
    fastest_baseline,
    regroup_sources,
    runoff_choice,
)
from disco.optimizer._config import OptimizeConfig, Progress, no_progress
from disco.optimizer._result import OptimizeResult, Setting, chrome_trace, make_result
from disco.optimizer._steps import (
    REPORTED_BASELINES,
    Bound,
    Candidates,
    Confirmation,
    Measured,
    RunOff,
    SearchSummary,
    Target,
    candidates,
    confirm,
    devices_of,
    fusion_decisions,
    measure,
    prepare,
    reduce_fusion_row,
    regrouped,
    regrouped_plan,
    regrouped_row,
    run_off,
)
from disco.sim.cluster import ClusterSpec
from disco.sim.costs import CostModel

__all__ = [
    "REPORTED_BASELINES", "Bound", "Candidates", "Confirmation", "Measured", "OptimizeConfig", "OptimizeResult",
    "PlanRow", "Progress", "RunOff", "SearchSummary", "Setting", "Span", "Target", "candidates", "chrome_trace",
    "confirm", "confirmed_winner", "devices_of", "fastest_baseline", "fusion_decisions", "make_result", "measure", "optimize", "prepare",
    "reduce_fusion_row", "regroup_sources", "regrouped", "regrouped_plan", "regrouped_row", "run_off", "runoff_choice",
]


def optimize(
    step_fn: Callable[..., Any],
    *args: Any,
    cluster: ClusterSpec | None = None,
    costs: CostModel | None = None,
    config: OptimizeConfig | None = None,
    progress: Progress | None = None,
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
      costs: the cost model (default: the cluster's device kind's, ``disco.sim.device_costs.analytic(cluster.device)``:
        the CPU roofline, or ``SummedCosts`` on an H100 cluster).
      config: the options (default ``OptimizeConfig()``).
      progress: called as ``progress(phase, fraction, message)``; phases "extract", "search",
        "measure", "run-off", "confirm".
      **options: :class:`OptimizeConfig` fields (e.g. ``budget_s``, default 60 s; ``rounds``,
        default 9), applied over ``config``.

    Returns:
      The OptimizeResult.

    Raises:
      ValueError: for a bad option (:class:`OptimizeConfig` names it), before anything runs.
      TypeError: for an option that is not an :class:`OptimizeConfig` field, or a ``config``,
        ``cluster`` or ``costs`` of the wrong type (before the graph is extracted).
    """
    unknown = sorted(set(options) - set(OptimizeConfig.field_names()))
    if unknown:
        raise TypeError(f"optimize: unknown options {unknown}; expected OptimizeConfig fields: "
                        f"{', '.join(OptimizeConfig.field_names())}")
    if config is not None and not isinstance(config, OptimizeConfig):
        raise TypeError(f"config: expected an OptimizeConfig or None, got {type(config).__name__} "
                        "(pass options as keywords: optimize(step, *args, budget_s=30))")
    config = dataclasses.replace(config or OptimizeConfig(), **options)
    report = progress or no_progress
    target = prepare(step_fn, args, cluster=cluster, costs=costs, progress=report)
    cands = candidates(target, config, report)
    measured = measure(target, cands, config, report)
    runoff = run_off(target, measured, config, report)
    confirmation = confirm(target, measured, config, runoff, report)
    return make_result(target, config, cands, measured, runoff, confirmation)

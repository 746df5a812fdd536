"""``optimize``: search a step's joint fusion/bucketing space, then keep only what measures faster.

The pipeline is a few pure steps, each with its own small result (the shape of
:mod:`disco.search`); :func:`optimize` runs them in order:

1. :func:`prepare`: extract the step's graph (:func:`disco.extract`) and its simulator.
2. :func:`funnel`: rounds (``measure_rounds``) of search on the model (the simulator through this
   machine's correction, :mod:`disco.calibrate.correction`), measurement of the ``measure_top_k``
   plans it ranks fastest among those not measured yet (searched plans, their bucket-only
   projections, the best baseline by prediction, the ``even_<k>`` sweep of bucket counts), and a
   refit of the correction from every plan measured, before the next round searches (with
   ``compiled_top_k``, on CPU devices, the model's top plans are first compiled by XLA and priced
   by the compiled tier, and that price picks the ones measured); the first
   round also measures xla_default, ``per_tensor``, ``horovod``, ``ddp`` and, on CPU devices,
   ``reduce_fusion``. Plans are measured in interleaved rounds on a runner: this process's devices
   (:class:`InProcessRunner`, the default; :func:`disco.bench.run_bench`) or worker processes on
   loopback or an emulated link (:class:`ProcessRunner`). The correction is kept per machine
   between runs (``correction_file``, :mod:`disco.calibrate.kept`). Each row's prediction is made
   before its plan is measured; :func:`accuracy` judges them (Kendall tau, median error).
3. The first choice is the fastest *measured* plan by the paired speedup
   (:func:`xla_hooks.measure.paired_speedup`) over xla_default in its own rounds; when nothing beats
   ``xla_default`` the answer is ``xla_default`` and the verdict says so. (:func:`candidates` and
   :func:`measure` are one search's list and one interleaved run of it, for a pipeline of one round.)
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

For a cluster whose devices are not here (a GPU cluster planned from a CPU machine), nothing can be
measured: :func:`predict` runs the search, compiles the candidates for the cluster's devices
(deviceless XLA:GPU) and answers with the one the compiled tier prices fastest, as a prediction
(:mod:`disco.optimizer._predicted`); :func:`optimize` refuses such a cluster (:func:`measures_here`).

The steps make every decision and a runner only measures (:mod:`disco.optimizer._runners`), so
one pipeline serves both; where fresh processes make a step dearer (every run recompiles every
plan), the runner says so and the step does less (:func:`run_off`). The options are one
immutable :class:`OptimizeConfig`; the answer is an
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
    cands, measured = funnel(target, config)
    runoff = run_off(target, measured, config)
    result = make_result(target, config, cands, measured, runoff, confirm(target, measured, config, runoff))

    # across 2 worker processes (the same pipeline, another runner)
    runner = ProcessRunner("mlp", "small", processes=2, devices_per_process=4)
    step, args = runner.make_step()
    result = disco.optimize(step, *args, cluster=cluster, runner=runner, budget_s=30)

Only :class:`OptimizeConfig` is imported eagerly (it does not import jax: ``disco optimize``
checks its options before jax starts); the rest on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from disco.optimizer._config import OptimizeConfig, Progress, no_progress

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports on first use
    from disco.optimizer._accuracy import Accuracy, accuracy, kendall_tau, RESOLVED_Z, half_noise, median_relative_error, resolved_tau
    from disco.optimizer._answer import Answer, answer, answer_lines, apply_snippet
    from disco.optimizer._choice import (
        PlanRow,
        Span,
        confirmed_winner,
        fastest_baseline,
        regroup_sources,
        relation_to_baselines,
        runoff_choice,
    )
    from disco.optimizer._compiled import CompiledStageWarning
    from disco.optimizer._funnel import FunnelRound, funnel
    from disco.optimizer._pipeline import optimize
    from disco.optimizer._predicted import PredictedResult, PredictedRow, measures_here, predict
    from disco.optimizer._process import ProcessRunner
    from disco.optimizer._result import OptimizeResult, Setting, chrome_trace, make_result
    from disco.optimizer._runners import InProcessRunner, Runner, Trial, Trials
    from disco.optimizer._candidates import REPORTED_BASELINES, Candidates, SearchSummary, candidates, reduce_fusion_row
    from disco.optimizer._confirm import Confirmation, confirm, validate
    from disco.optimizer._measure import Bound, Measured, measure
    from disco.optimizer._prepare import Target, devices_of, prepare
    from disco.optimizer._runoff import RunOff, fusion_decisions, regrouped, regrouped_plan, regrouped_row, run_off

_MODULES = {
    "_accuracy": ("Accuracy", "accuracy", "kendall_tau", "median_relative_error", "half_noise", "resolved_tau", "RESOLVED_Z"),
    "_answer": ("Answer", "answer", "answer_lines", "apply_snippet"),
    "_choice": ("PlanRow", "Span", "confirmed_winner", "fastest_baseline", "regroup_sources",
                "relation_to_baselines", "runoff_choice"),
    "_compiled": ("CompiledStageWarning",),
    "_funnel": ("FunnelRound", "funnel"),
    "_pipeline": ("optimize",),
    "_predicted": ("PredictedResult", "PredictedRow", "measures_here", "predict"),
    "_process": ("ProcessRunner",),
    "_result": ("OptimizeResult", "Setting", "chrome_trace", "make_result"),
    "_runners": ("InProcessRunner", "Runner", "Trial", "Trials"),
    "_prepare": ("Target", "devices_of", "prepare"),
    "_candidates": ("REPORTED_BASELINES", "Candidates", "SearchSummary", "candidates", "reduce_fusion_row"),
    "_measure": ("Bound", "Measured", "measure"),
    "_runoff": ("RunOff", "fusion_decisions", "regrouped", "regrouped_plan", "regrouped_row", "run_off"),
    "_confirm": ("Confirmation", "confirm", "validate"),
}
_EXPORTS = {name: f"disco.optimizer.{module}" for module, names in _MODULES.items() for name in names}

__all__ = [
    "REPORTED_BASELINES", "RESOLVED_Z", "Accuracy", "Answer", "Bound", "Candidates", "CompiledStageWarning", "Confirmation", "FunnelRound", "InProcessRunner", "Measured", "OptimizeConfig",
    "OptimizeResult", "PlanRow", "PredictedResult", "PredictedRow", "ProcessRunner", "Progress", "RunOff", "Runner", "SearchSummary", "Setting",
    "Span", "Target", "Trial", "Trials", "accuracy", "answer", "answer_lines", "apply_snippet", "candidates", "chrome_trace", "confirm", "confirmed_winner", "devices_of",
    "fastest_baseline", "funnel", "fusion_decisions", "half_noise", "kendall_tau", "make_result", "measure", "measures_here", "median_relative_error", "no_progress", "optimize", "predict", "prepare",
    "reduce_fusion_row", "regroup_sources", "regrouped", "regrouped_plan", "regrouped_row", "relation_to_baselines",
    "resolved_tau", "run_off", "runoff_choice", "validate",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'disco.optimizer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

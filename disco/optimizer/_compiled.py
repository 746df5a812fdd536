"""The funnel's middle stage: the emulated search's top plans compiled by XLA and priced as built.

Between the emulated search and the measurement (:mod:`disco.optimizer._funnel`), the
``config.compiled_top_k`` unmeasured plans the emulated model ranks fastest are compiled with the
real compiler (:func:`xla_hooks.compile_for.compiled_plan_text`: XLA:CPU, the plan applied) and
priced by the compiled tier (:func:`disco.sim.compiled.price`: the kernels XLA really formed, in its
schedule, on the cluster's links); the measured plans are the ones that price ranks best.

A compiled price goes through a correction as the emulated one does
(:mod:`disco.calibrate.correction`; the roofline prices CPU compute several times too fast): the
compiled tier's own, fitted to the measured plans' compiled features (:func:`features`: the
module's kernels' time, its exposed and total communication, its all-reduces) when it holds points
of other plans; before any (a run's first round), the machine's correction of the emulated tier,
its weights applied to the compiled features, where it holds some. Its source is then
``compiled-corrected``, else ``compiled`` (:data:`~disco.optimizer._accuracy.SOURCES`). A measured
plan's compiled features come from the stage's compile, or, for a plan the stage did not compile
(the first round's references), from the runner's executable where it keeps one (this process's
devices: its module priced, not compiled again).

The state is explicit and immutable (:class:`Prices`): :func:`init`; :func:`price_plans`, which
compiles only the plans not priced yet (by digest: a plan is compiled once per run) and leaves a
plan that fails to compile out of the ranking with a :class:`CompiledStageWarning`, never failing
the run; :func:`learn`, which refits the compiled tier's correction after a round's measurements.

CPU devices only, for now: the stage compiles the plan applied to the jax step on this process's
backend, and measures on it. A GPU cluster planned from a machine without its GPUs is not measured at
all: :func:`disco.optimizer.predict` compiles its candidates deviceless
(:func:`xla_hooks.compile_for.plan_text_for`) and the compiled price decides. On a GPU machine the
stage does not run yet. :func:`available` says whether the stage runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from disco.calibrate import correction as corr
from disco.optimizer._learn import Predictor
from disco.plans.plan import FusionPlan

if TYPE_CHECKING:
    from disco.optimizer._prepare import Target
    from disco.sim.compiled import CompiledStep

# plan -> its compiled module, priced (raises when the plan does not compile)
PriceFn = Callable[[FusionPlan], "CompiledStep"]


class CompiledStageWarning(UserWarning):
    """A plan did not compile for the compiled stage (it drops out of the compiled ranking), or the
    stage does not run on this backend."""


class Prices(NamedTuple):
    """The compiled stage's state: what was compiled and priced in this run, by plan digest.

    Attributes:
      steps: the modules the stage compiled and priced (:class:`~disco.sim.compiled.CompiledStep`).
      failed: why a plan did not compile (not compiled again either).
      executables: measured plans the stage did not compile, priced from the runner's executables.
      correction: the compiled tier's correction, fitted to the measured plans' compiled features.
    """

    steps: Mapping[str, CompiledStep]
    failed: Mapping[str, str]
    executables: Mapping[str, CompiledStep]
    correction: corr.Correction

    @property
    def compiles(self) -> int:
        """How many compiles the stage made (one per digest)."""
        return len(self.steps) + len(self.failed)

    def __repr__(self) -> str:
        return (f"Prices({len(self.steps)} priced, {len(self.failed)} failed, {len(self.executables)} from "
                f"executables, {len(self.correction.points)} points)")


def init() -> Prices:
    """Nothing compiled yet."""
    return Prices({}, {}, {}, corr.init())


def available() -> str | None:
    """None where the stage runs (jax's default backend is the CPU), else why not."""
    import jax

    backend = jax.default_backend()
    if backend == "cpu":
        return None
    return (f"the compiled stage runs on CPU devices only, not on {backend!r} (a GPU cluster planned from a "
            "machine without its GPUs is priced by disco.optimizer.predict's compiled tier instead)")


def _priced(text: str, target: Target) -> CompiledStep:
    """An XLA:CPU module of ``target``'s step priced with its cost model on its cluster."""
    from disco.sim import compiled

    return compiled.price(text, target.costs, target.cluster, backend="cpu")


def compiler(target: Target) -> PriceFn:
    """The :data:`PriceFn` of ``target``: its step compiled with the plan on this process's CPU
    devices, priced with its cost model on its cluster."""
    from xla_hooks.compile_for import compiled_plan_text

    def price(plan: FusionPlan) -> CompiledStep:
        return _priced(compiled_plan_text(plan, target.step_fn, *target.args, kwargs=target.kwargs), target)

    return price


def price_plans(prices: Prices, plans: Iterable[FusionPlan], price_fn: PriceFn) -> Prices:
    """``prices`` with every plan of ``plans`` not compiled yet compiled and priced by ``price_fn``.

    A plan that fails (any exception: XLA's, the rewrite's, the tier's) is recorded in
    :attr:`Prices.failed` with a :class:`CompiledStageWarning`; the run goes on
    (:func:`disco.planner._compiled.price_each`, the planner's rule too).
    """
    from disco.planner._compiled import Priced, price_each

    def warn(plan: FusionPlan, failed: str | None) -> None:
        if failed is not None:
            warnings.warn(f"the compiled stage: plan {plan.name or plan.digest()[:12]!r} did not compile ({failed}); "
                          "left out of the compiled ranking", CompiledStageWarning, stacklevel=4)

    done = price_each(plans, price_fn, Priced(prices.steps, prices.failed), on_each=warn)
    return prices._replace(steps=done.steps, failed=done.failed)


def features(step: CompiledStep) -> tuple[float, ...]:
    """The correction's features (:data:`disco.calibrate.correction.FEATURES`) of a compiled module:
    its kernels' time, its exposed and total communication, its all-reduces (each execution)."""
    all_reduces = sum(c.executions for c in step.collectives if c.kind == "all-reduce")
    return corr.features(step.compute_s, step.exposed_comm_s, step.comm_s, all_reduces)


def predict(predictor: Predictor, prices: Prices, plan: FusionPlan, step: CompiledStep,
            batch: Iterable[FusionPlan] = ()) -> tuple[float, str, float]:
    """(prediction, where it came from, the simulator's own step time) of ``plan`` from its compiled
    module ``step``, before the plan is measured: through the compiled tier's correction when it
    holds points of other plans, else through the emulated tier's (``predictor``'s) when that does,
    else the compiled tier's step time. The points of ``plan`` and of the plans measured with it
    (``batch``), from an earlier round or run, are left out: one state for the batch, as
    :meth:`~disco.optimizer._learn.Predictor.for_batch` for the emulated tier."""
    simulated = predictor.simulator.step_time(plan)
    keys = [predictor.key(p) for p in (plan, *batch)]
    for state in (prices.correction, predictor.state):
        rest = state.without(keys)
        if rest.points:
            return rest.predict(features(step)), "compiled-corrected", simulated
    return step.step_time_s, "compiled", simulated


def ranked(prices: Prices, plans: Mapping[str, FusionPlan], predictor: Predictor
           ) -> list[tuple[str, tuple[float, str, float]]]:
    """The plans of ``plans`` (by digest) that compiled, fastest first by :func:`predict`, each with
    its prediction; a plan not compiled (failed, or never asked) is left out."""
    out = [(d, predict(predictor, prices, plan, prices.steps[d])) for d, plan in plans.items() if d in prices.steps]
    return sorted(out, key=lambda item: item[1][0])


def executable_step(executable: object, target: Target) -> CompiledStep | None:
    """The priced module of a runner's executable (one with ``compiled_text()``, as
    :class:`xla_hooks.apply_plan.AppliedStep`), or None for another (a process runner keeps none)."""
    text_of = getattr(executable, "compiled_text", None)
    if not callable(text_of):
        return None
    try:
        return _priced(text_of(), target)
    except Exception:  # noqa: BLE001 - a module the tier cannot read adds no point, it never fails the run
        return None


def learn(prices: Prices, predictor: Predictor, measured: Iterable[tuple[FusionPlan, float, object]],
          target: Target) -> Prices:
    """``prices`` with its correction refitted with the newly measured plans, as (plan, measured
    seconds on the first round's scale, the runner's executable or None): each plan's compiled
    features from the stage's compile, else from its executable (recorded in
    :attr:`Prices.executables`); a plan with neither adds no point."""
    executables = dict(prices.executables)
    points = []
    for plan, seconds, executable in measured:
        digest = plan.digest()
        step = prices.steps.get(digest) or executables.get(digest)
        if step is None and (step := executable_step(executable, target)) is not None:
            executables[digest] = step
        if step is not None:
            points.append(corr.Point(*predictor.key(plan), features(step), seconds))
    return prices._replace(executables=executables, correction=corr.update(prices.correction, points))

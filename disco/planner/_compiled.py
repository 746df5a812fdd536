"""The planner's compiled tier: its candidates ranked by the modules the real compiler builds for them.

The planner's search runs on the emulated tier (:mod:`disco.sim.simulator`: XLA's fusion emulated in
Python). On a GPU cluster that tier overrates its searched plans at realistic sizes (docs/results.md,
"Planning eight H100s from this CPU machine"). With ``options["tier"] == "compiled"``,
:func:`choose` compiles the planner's candidates (XLA's default compile first, the planner's answer,
then the baselines by emulated step time, ``limit`` plans in all) with a ``compile_fn`` the caller
gives (:func:`xla_hooks.compile_for.plan_compiler`: deviceless XLA:GPU for an H100 cluster), prices
each module with the compiled tier (:func:`disco.sim.compiled.price`) and answers the fastest.

:func:`price_each` is the one rule for a plan that does not compile: it drops out of the compiled
ranking with the reason, and never fails the run (``disco.optimizer``'s compiled stages use it too).

Nothing here imports ``xla_hooks`` (it sits above the planner): the compile is the caller's function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph
    from disco.plans.plan import FusionPlan
    from disco.sim.cluster import ClusterSpec
    from disco.sim.compiled import CompiledStep
    from disco.sim.costs import CostModel

# plan -> its compiled module's text for the cluster (raises when the plan does not compile)
CompileFn = Callable[["FusionPlan"], str]
# plan -> its compiled module, priced (raises when the plan does not compile)
PriceFn = Callable[["FusionPlan"], "CompiledStep"]

XLA_DEFAULT = "xla_default"


class Priced(NamedTuple):
    """What a compiled stage priced, by plan digest.

    Attributes:
      steps: the modules compiled and priced.
      failed: why a plan has no compiled price (its compile or its pricing raised).
    """

    steps: Mapping[str, CompiledStep]
    failed: Mapping[str, str]


def why(e: BaseException) -> str:
    """A failure as one line: the exception's type and the first line of its message (200 characters)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def price_each(plans: Iterable[FusionPlan], price_fn: PriceFn, done: Priced | None = None,
               on_each: Callable[[FusionPlan, str | None], None] | None = None) -> Priced:
    """``done`` (default: nothing) with every plan of ``plans`` not priced yet (by digest) priced by
    ``price_fn``, in order; a plan whose compile or pricing raises (any exception) is recorded in
    :attr:`Priced.failed` and the rest go on. ``on_each(plan, why_failed_or_None)`` is called after each."""
    steps, failed = dict(done.steps) if done else {}, dict(done.failed) if done else {}
    for plan in plans:
        digest = plan.digest()
        if digest in steps or digest in failed:
            continue
        reason = None
        try:
            steps[digest] = price_fn(plan)
        except Exception as e:  # noqa: BLE001 - a plan that does not compile drops out, never the run
            reason = failed[digest] = why(e)
        if on_each is not None:
            on_each(plan, reason)
    return Priced(steps, failed)


def _named(graph: HloGraph, plan: FusionPlan, report: Mapping[str, Any], limit: int
           ) -> list[tuple[str, FusionPlan, float]]:
    """The plans to compile, each plan once, with their emulated step ms: xla_default, the planner's
    answer, then the other baselines by their emulated step time; ``limit`` in all. Each is named by
    its plan's own name (``even_2``, ``xla_threshold_<bytes>``), else its baseline's."""
    from disco.plans import baselines

    emulated = dict(report["baselines_ms"])
    order: list[tuple[str, FusionPlan | None, float]] = [
        (XLA_DEFAULT, None, emulated[XLA_DEFAULT]), (report["chosen"], plan, report["plan_ms"])]
    order += [(b, None, emulated[b]) for b in sorted(emulated, key=lambda b: (emulated[b], b)) if b != XLA_DEFAULT]
    out: list[tuple[str, FusionPlan, float]] = []
    seen: set[str] = set()
    for name, p, ms in order:
        if len(out) >= limit:
            break
        if p is None:
            if name not in baselines.NAMES:
                continue
            p = baselines.make(name, graph)
        if p.digest() in seen:
            continue
        seen.add(p.digest())
        label = p.name or name
        if any(label == n for n, _, _ in out):  # a searched plan named as a baseline: names key the prices
            label = f"{label}@{p.digest()[:8]}"
        out.append((label, p.replace(name=label), ms))
    return out


def pricer(compile_fn: CompileFn, costs: CostModel, cluster: ClusterSpec) -> PriceFn:
    """plan -> its module from ``compile_fn``, priced by the compiled tier (:func:`disco.sim.compiled.price`)
    with ``costs`` on ``cluster``."""
    from disco.sim import compiled
    from disco.sim.cluster_spec import backend_of

    backend = backend_of(cluster.device)
    return lambda plan: compiled.price(compile_fn(plan), costs, cluster, backend=backend)


def choose(graph: HloGraph, plan: FusionPlan, report: Mapping[str, Any], price_fn: PriceFn, *, limit: int,
           progress: Callable[[float, str], None] | None = None) -> tuple[FusionPlan, dict[str, Any]]:
    """The fastest of the planner's candidates by the compiled tier, and the report with its prices.

    Args:
      graph: the step's graph (the baselines are built from it).
      plan, report: the emulated tier's answer (:func:`disco.planner.plan_for_graph`'s).
      price_fn: plan -> its compiled module, priced (:func:`pricer`); it raises for a plan that does not
        compile (a caller past its deadline raises too: the plans left keep no compiled price).
      limit: how many plans to compile (at least 1: xla_default).
      progress: ``progress(fraction, message)`` after each compile.

    Returns:
      ``(plan, report)``: the plan with the lowest compiled step time (named after its candidate), and
      ``report`` with ``tier`` "compiled" and ``compiled``: ``{"chosen", "plan_ms",
      "speedup_vs_xla_default", "ranked" (the compiled candidates' names, fastest first), "ms" (name:
      compiled step ms), "not_compiled" (name: why), "modules" (name: the module's summary)}``;
      ``chosen``, ``plan_ms``, ``plan_summary`` and ``speedup_vs_xla_default`` are then the answer's (``plan_ms`` the emulated tier's time, as
      ``baselines_ms``: one tier per field), ``emulated`` holds the emulated tier's own answer, and
      ``candidates`` every plan compiled, as :func:`disco.planner.candidates` lists them (the compiled
      ones fastest first, ``predicted_ms`` their compiled time; then the others, ``predicted_ms``
      None). When xla_default has no compiled price, the emulated answer stands: ``tier`` "emulated",
      ``tier_note`` says why, and no ``candidates``.
    """
    if limit < 1:
        raise ValueError(f"choose: expected a limit >= 1 plans to compile, got {limit!r}")
    named = _named(graph, plan, report, limit)
    done = [0]

    def on_each(p: FusionPlan, failed: str | None) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0] / len(named), f"compiled {done[0]}/{len(named)}: {p.name}"
                     + (f" (did not compile: {failed})" if failed else ""))

    priced = price_each((p for _, p, _ in named), price_fn, on_each=on_each)
    ms = {n: priced.steps[p.digest()].step_time_s * 1e3 for n, p, _ in named if p.digest() in priced.steps}
    not_compiled = {n: priced.failed[p.digest()] for n, p, _ in named if p.digest() in priced.failed}
    out = dict(report)
    if XLA_DEFAULT not in ms:
        out.update(tier="emulated", tier_note="the compiled tier priced no xla_default ("
                   + not_compiled.get(XLA_DEFAULT, "not compiled") + "): the emulated tier's answer stands",
                   compiled={"ms": ms, "not_compiled": not_compiled})
        return plan, out
    ranked = sorted(ms, key=lambda n: (ms[n], n != XLA_DEFAULT, n))
    rank = {n: i for i, n in enumerate(ranked)}
    best = ranked[0]
    best_plan, emulated_ms = next((p, e) for n, p, e in named if n == best)
    out.update(
        tier="compiled", chosen=best, plan_ms=emulated_ms, plan_summary=best_plan.summary(),
        speedup_vs_xla_default=report["baselines_ms"][XLA_DEFAULT] / emulated_ms if emulated_ms > 0 else 1.0,
        emulated={"chosen": report["chosen"], "plan_ms": report["plan_ms"],
                  "speedup_vs_xla_default": report["speedup_vs_xla_default"]},
        compiled={"chosen": best, "plan_ms": ms[best], "speedup_vs_xla_default": ms[XLA_DEFAULT] / ms[best],
                  "ranked": ranked, "ms": ms, "not_compiled": not_compiled,
                  "modules": {n: priced.steps[p.digest()].summary() for n, p, _ in named if n in ms}},
        # what a job that runs trials measures: the compiled plans fastest first, then the others
        # (predicted_ms None: the ranking tier has no time for them)
        candidates=[{"name": n, "predicted_ms": ms.get(n), "plan": p.to_dict()}
                    for n, p, _ in sorted(named, key=lambda item: rank.get(item[0], len(rank)))])
    return best_plan, out


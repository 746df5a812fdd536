"""``optimize`` across processes: search priced on a calibrated cluster, candidates measured on it.

The in-process :func:`disco.optimizer.optimize` measures on this process's virtual devices;
here every measurement runs on ``P`` worker processes (:func:`disco.multiprocess.launch`),
behind an emulated link when one is given (:mod:`disco.testbed`):

1. Extract the step's graph in this process (``P * D`` virtual devices: the same program the
   workers compile; the workers' graph fingerprints are checked against it).
2. Search plans against the simulator on ``cluster`` (e.g. :func:`disco.mp_calibrate.cluster_spec`
   of a calibration on the same link).
3. Measure, in one launch of interleaved rounds, xla_default, per_tensor, horovod, ddp, the
   best baseline by estimate, the ``even_<k>`` sweep and the ``measure_top_k`` best searched
   plans (written as plan files the workers read). A round's time is the slowest worker's;
   plans are compared by the paired speedup over xla_default
   (:func:`xla_hooks.measure.paired_speedup`).
4. Confirm the fastest against xla_default in a fresh launch (fresh processes, ``confirm_rounds``
   rounds); the answer is xla_default when it is not faster there. (No run-off between
   finalists, unlike the in-process optimize: every extra launch recompiles every plan.)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from disco import multiprocess
from disco.optimizer import REPORTED_BASELINES

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.sim.costs import CostModel
    from disco.testbed import LinkSpec

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class CrossOptimizeResult:
    """What :func:`optimize` found and measured across processes.

    Attributes:
      chosen: the answer's row name (xla_default when nothing beat it in both launches).
      plan_json: the answer as plan JSON.
      verdict: one sentence.
      rows: per measured plan: name, kind (baseline/search), predicted_ms, measured median/min/max
        ms (slowest worker per round), paired speedup over xla_default, applied.
      confirmed_speedup: the chosen plan's paired speedup in the confirmation launch (None: none ran).
      confirmation: that launch's rows.
      link: the link info (:meth:`disco.multiprocess.LaunchResult.link_info`) of the measuring launch.
      search: strategy, evaluations, seconds.
      cluster: the simulator's cluster name.
      fingerprints_match: whether every worker compiled the graph the search saw.
    """

    chosen: str
    plan_json: str
    verdict: str
    rows: tuple[dict[str, Any], ...]
    confirmed_speedup: float | None
    confirmation: tuple[dict[str, Any], ...] | None
    link: dict[str, Any]
    search: dict[str, Any]
    cluster: str
    fingerprints_match: bool

    @property
    def speedup(self) -> float:
        """The answer's speedup over xla_default: the confirmed one; 1.0 for xla_default."""
        if self.chosen == "xla_default":
            return 1.0
        return self.confirmed_speedup if self.confirmed_speedup is not None else self.row(self.chosen)["paired_speedup"]

    def row(self, name: str) -> dict[str, Any]:
        for r in self.rows:
            if r["plan"] == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {', '.join(r['plan'] for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["speedup"] = self.speedup
        return d


def optimize(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None, *,
             cluster: ClusterSpec, costs: CostModel | None = None, budget_s: float = 30, strategy: str = "best_first",
             measure_top_k: int = 3, seed: int = 0, rounds: int = 7, steps: int = 3,
             bucket_sweep: Sequence[int] = (2, 3, 4), confirm: bool = True, confirm_rounds: int | None = None,
             optimizer: str = "adamw", timeout_s: float = 1800,
             progress: Progress | None = None) -> CrossOptimizeResult:
    """Searches plans for a zoo model priced on ``cluster`` and measures them across processes.

    This process's jax must have at least ``processes * devices_per_process`` devices.

    Raises:
      ValueError: bad budgets, counts or names.
      RuntimeError: when the workers fail (their messages).
      PermissionError: a link where network namespaces are not permitted.
    """
    import trax_models

    from disco import search
    from disco.ir import extractor
    from disco.ir.graph import HloGraph
    from disco.plans import baselines
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in bucket_sweep):
        raise ValueError(f"bucket_sweep: expected bucket counts (integers >= 1), got {tuple(bucket_sweep)!r}")
    if rounds < 1 or steps < 1 or measure_top_k < 0:
        raise ValueError(f"rounds, steps >= 1 and measure_top_k >= 0 expected, got {rounds}, {steps}, {measure_top_k}")
    confirm_rounds = 3 * rounds if confirm_rounds is None else confirm_rounds
    say = progress or (lambda msg: None)
    n = processes * devices_per_process
    step, example = trax_models.make_train_step(model, preset, devices=n, optimizer=optimizer)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    sim = Simulator(graph, costs or AnalyticCosts(), cluster)
    say(f"searching ({strategy}, {budget_s:g} s) on cluster {cluster.name}")
    found = search.run(search.make(strategy), graph, sim.step_time, budget_s=budget_s, seed=seed)

    # -- candidates: (row name, worker plan argument, kind, predicted seconds) ------------------
    predicted = {name: sim.step_time(baselines.make(name, graph)) for name in baselines.NAMES if name != "even"}
    best_base = min(predicted, key=lambda k: (predicted[k], k != "xla_default"))
    cands: dict[str, tuple[str, str, float]] = {}
    seen: set[str] = set()
    for name in dict.fromkeys((*REPORTED_BASELINES, best_base)):
        cands[name] = (name, "baseline", predicted[name])
        seen.add(baselines.make(name, graph).digest())
    for k in dict.fromkeys(bucket_sweep):
        p = baselines.make("even", graph, k=k)
        if p.digest() not in seen:
            seen.add(p.digest())
            cands[p.name] = (f"even:{k}", "baseline", sim.step_time(p))
    tmp = tempfile.mkdtemp(prefix="disco-mpopt-")
    plans_json: dict[str, str] = {}
    rank = 0
    for cost, p in found.top:
        if rank >= measure_top_k:
            break
        if p.digest() in seen:
            continue
        seen.add(p.digest())
        rank += 1
        name = f"disco_{rank}"
        path = os.path.join(tmp, f"{name}.json")
        plans_json[name] = p.replace(name=name).to_json()
        with open(path, "w", encoding="utf-8") as f:
            f.write(plans_json[name])
        cands[name] = (path, "search", cost)

    # -- measure ----------------------------------------------------------------------------
    say(f"measuring {len(cands)} plans across {processes} processes")
    try:
        return _measure(model, preset, processes, devices_per_process, link, cands, plans_json, graph, found,
                        cluster, rounds, steps, confirm, confirm_rounds, optimizer, timeout_s, say)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None,
             cands: dict[str, tuple[str, str, float]], plans_json: dict[str, str], graph: Any, found: Any,
             cluster: ClusterSpec, rounds: int, steps: int, confirm: bool, confirm_rounds: int, optimizer: str,
             timeout_s: float, say: Progress) -> CrossOptimizeResult:
    """Steps 3 and 4 of the module doc."""
    res = _launch(model, preset, processes, devices_per_process, link, [a for a, _, _ in cands.values()],
                  rounds, steps, optimizer, timeout_s)
    by_plan = {r["plan"]: r for r in multiprocess.combine(res)}
    rows = []
    for name, (arg, kind, pred) in cands.items():
        r = by_plan[name]
        rows.append({"plan": name, "kind": kind, "predicted_ms": pred * 1e3, "median_ms": r["median_ms"],
                     "min_ms": r["min_ms"], "max_ms": r["max_ms"], "paired_speedup": r["paired_speedup"],
                     "applied": r["applied"], "all_reduces": r["all_reduces"]})
    others = [r for r in rows if r["plan"] != "xla_default" and r["applied"]]
    best = max(others, key=lambda r: r["paired_speedup"], default=None)
    chosen, verdict, confirmed, confirmation = "xla_default", "no plan beat xla_default when measured", None, None
    if best is not None and best["paired_speedup"] > 1.0:
        chosen = best["plan"]
        verdict = f"{chosen} measured {best['paired_speedup']:.3f}x faster than xla_default (paired)"
        if confirm:
            say(f"confirming {chosen} against xla_default ({confirm_rounds} rounds, fresh processes)")
            again = _launch(model, preset, processes, devices_per_process, link,
                            ["xla_default", cands[chosen][0]], confirm_rounds, steps, optimizer, timeout_s)
            confirmation = tuple(multiprocess.combine(again))
            confirmed = next(r["paired_speedup"] for r in confirmation if r["plan"] == chosen)
            if confirmed > 1.0:
                verdict += f"; confirmed in fresh processes: {confirmed:.3f}x over {confirm_rounds} rounds"
            else:
                verdict = (f"{chosen} measured fastest ({best['paired_speedup']:.3f}x) but not in the confirmation "
                           f"({confirmed:.3f}x); keeping XLA's default compile")
                chosen = "xla_default"
    plan_json = plans_json.get(chosen) or _baseline_json(chosen, graph)
    return CrossOptimizeResult(
        chosen=chosen, plan_json=plan_json, verdict=verdict, rows=tuple(rows), confirmed_speedup=confirmed,
        confirmation=confirmation, link=res.link_info(), cluster=cluster.name,
        search={"strategy": found.strategy, "evals": found.evals, "seconds": found.elapsed_s},
        fingerprints_match={r["fingerprint"] for r in res.results} == {graph.fingerprint})


def _baseline_json(name: str, graph: Any) -> str:
    from disco.plans import baselines

    kind, _, k = name.partition("_")
    plan = baselines.make("even", graph, k=int(k)) if kind == "even" and k.isdigit() else baselines.make(name, graph)
    return plan.replace(name=name).to_json()


def _launch(model: str, preset: str, processes: int, devices_per_process: int, link: LinkSpec | None,
            plans: list[str], rounds: int, steps: int, optimizer: str, timeout_s: float) -> multiprocess.LaunchResult:
    spec = multiprocess.WorkerSpec(model=model, preset=preset, plans=tuple(plans), rounds=rounds, steps=steps,
                                   optimizer=optimizer)
    res = multiprocess.launch(processes, devices_per_process, spec, link=link, timeout_s=timeout_s)
    if not res.ok:
        raise RuntimeError("measuring across processes failed: " + "; ".join(res.failures or ("no results",)))
    return res

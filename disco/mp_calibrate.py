"""Calibration across processes: the alpha-beta model of an all-reduce over a real (emulated) link.

:func:`calibrate` runs :mod:`disco.mp_worker`'s ``calibrate`` task on ``P`` workers (each
behind the emulated link of a :class:`~disco.testbed.LinkSpec`, or over 127.0.0.1): every
worker times jitted all-reduces of several sizes over all ``P * D`` devices and one
variadic all-reduce against one concatenated buffer (:mod:`disco.calibrate`'s measurements).
The slowest worker's medians are fitted as in :func:`disco.calibrate.fit` (``t = a + b n``,
ring latency ``a / (2 (p - 1))``, bandwidth ``2 (p - 1) / (p b)``) and the per-operand cost
``(t_variadic - t_concat) / (operands - 1)``; :func:`cluster_spec` writes them as a
:class:`~disco.sim.cluster.ClusterSpec` (P nodes x D devices, the fitted link between them).

:func:`compare_baselines` then prices the baselines of a zoo model with that spec
(:class:`disco.sim.simulator.Simulator`, analytic costs) and measures them across the same
kind of cluster: per baseline the predicted and measured step time and the error, and
Kendall's tau between the two orders. In the same rounds it measures the step with its
all-reduces replaced by copies (:mod:`xla_hooks.bound`: the compute floor) and sets it beside
the simulator's step on a free link, so the error splits into compute and communication; it
also reports the predictions with the compute scaled to that measured floor (``compute_speed``,
labelled as such: the floor comes from the same launch, the communication terms do not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from disco import multiprocess
from disco.calibrate import Calibration, fit

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.testbed import LinkSpec

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
BASELINES = ("xla_default", "per_tensor", "one_bucket", "horovod", "ddp", "even:2", "even:4")


@dataclasses.dataclass(frozen=True)
class CrossCalibration:
    """A calibration across processes.

    Attributes:
      processes, devices_per_process: the workers and each one's devices.
      link: the emulated link (None: 127.0.0.1).
      calibration: the fit (:class:`disco.calibrate.Calibration`) over ``processes * devices_per_process``
        devices, with the operand latency.
      switch: the emulated switch's statistics of the run (packets, lateness), or None.
    """

    processes: int
    devices_per_process: int
    link: LinkSpec | None
    calibration: Calibration
    switch: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        c = self.calibration
        out: dict[str, Any] = {
            "processes": self.processes, "devices_per_process": self.devices_per_process,
            "link": self.link.to_dict() if self.link else "loopback", **c.to_dict(),
            "fitted_bandwidth_bps": c.bandwidth * 8, "fitted_latency_us": c.latency * 1e6,
            "operand_latency_us": c.operand_latency * 1e6, "switch": self.switch,
        }
        if self.link is not None:
            out["bandwidth_over_link_rate"] = c.bandwidth * 8 / self.link.rate_bps
            out["latency_over_link_delay"] = c.latency / self.link.delay_s if self.link.delay_s else None
        return out


def calibrate(processes: int, devices_per_process: int, link: LinkSpec | None, *,
              sizes: Sequence[int] = SIZES, reps: int = 10, timeout_s: float = 900) -> CrossCalibration:
    """Measures all-reduces across ``processes`` workers and fits the alpha-beta model.

    Raises:
      ValueError: fewer than 2 devices in all, or bad sizes.
      RuntimeError: when the workers fail (their messages).
      PermissionError: a link where network namespaces are not permitted.
    """
    if processes * devices_per_process < 2:
        raise ValueError(f"calibration needs at least 2 devices in all, got {processes} processes x "
                         f"{devices_per_process} devices")
    if not sizes or any(not isinstance(s, int) or s < 4 for s in sizes):
        raise ValueError(f"sizes: expected byte counts >= 4, got {tuple(sizes)!r}")
    spec = multiprocess.WorkerSpec(task="calibrate", sizes=tuple(sizes), reps=reps)
    res = multiprocess.launch(processes, devices_per_process, spec, link=link, timeout_s=timeout_s)
    if not res.ok:
        raise RuntimeError("calibration across processes failed: " + "; ".join(res.failures or ("no results",)))
    medians = [max(r["medians_s"][i] for r in res.results) for i in range(len(sizes))]
    variadic = max(r["variadic_s"] for r in res.results)
    concat = max(r["concat_s"] for r in res.results)
    operands = res.results[0]["operands"]
    c = fit(processes * devices_per_process, sizes, medians)
    c = dataclasses.replace(c, operand_latency=max(0.0, (variadic - concat) / (operands - 1)),
                            variadic_s=variadic, concat_s=concat)
    return CrossCalibration(processes, devices_per_process, link, c, res.link_info().get("switch"))


def cluster_spec(cal: CrossCalibration) -> ClusterSpec:
    """The calibration as a cluster spec: ``processes`` nodes of ``devices_per_process`` devices,
    the fitted link between them (and, for lack of a separate measurement, inside them too),
    a ring, one stream (XLA:CPU runs a gloo all-reduce in the thread that would compute)."""
    from disco.sim.cluster import ClusterSpec, LinkSpec as SimLink

    c = cal.calibration
    link = SimLink(c.bandwidth, c.latency)
    over = f"emulated link {cal.link.label()}" if cal.link else "127.0.0.1 (gloo)"
    return ClusterSpec(name=f"testbed-{cal.processes}x{cal.devices_per_process}", nodes=cal.processes,
                       devices_per_node=cal.devices_per_process, intra=link, inter=link, algorithm="ring",
                       operand_latency=c.operand_latency, overlap=False,
                       description=f"{cal.processes} processes x {cal.devices_per_process} CPU devices over {over}",
                       label=f"calibrated across processes on {over}")


def compare_baselines(spec: ClusterSpec, processes: int, devices_per_process: int, link: LinkSpec | None, *,
                      model: str, preset: str, plans: Sequence[str] = BASELINES, rounds: int = 5,
                      steps: int = 3, optimizer: str = "adamw", timeout_s: float = 900) -> dict[str, Any]:
    """The simulator's step times for ``plans`` on ``spec`` next to the times measured across
    the cluster (the graph is extracted in this process, whose jax must have at least
    ``processes * devices_per_process`` devices).

    Returns:
      ``{"rows": [{plan, predicted_ms, predicted_compute_ms, measured_ms, error,
      predicted_ms_floor_scaled, error_floor_scaled}], "tau": ..., "mean_abs_error": ...,
      "compute_floor": {predicted_ms, measured_ms}, "tau_floor_scaled": ...,
      "mean_abs_error_floor_scaled": ..., "fingerprints_match": ..., **link info}``; error is
      predicted / measured - 1; the ``floor_scaled`` keys are absent when the floor could not
      be measured.

    Raises:
      RuntimeError: when the workers fail.
    """
    import trax_models
    from scipy.stats import kendalltau

    from disco.ir import extractor
    from disco.ir.graph import HloGraph
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    from disco.bench import COMM_FREE_BOUND
    from disco.sim.cluster import LinkSpec as SimLink

    n = processes * devices_per_process
    step, example = trax_models.make_train_step(model, preset, devices=n, optimizer=optimizer)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    sim = Simulator(graph, AnalyticCosts(), spec)
    free_link = SimLink(1e18, 0.0)
    free = Simulator(graph, AnalyticCosts(), dataclasses.replace(spec, intra=free_link, inter=free_link,
                                                                 operand_latency=0.0))
    wspec = multiprocess.WorkerSpec(model=model, preset=preset, plans=tuple(plans), rounds=rounds, steps=steps,
                                    optimizer=optimizer, comm_free_bound=True)
    res = multiprocess.launch(processes, devices_per_process, wspec, link=link, timeout_s=timeout_s)
    if not res.ok:
        raise RuntimeError("measuring the baselines across processes failed: "
                           + "; ".join(res.failures or ("no results",)))
    combined = multiprocess.combine(res)
    floor = next((r for r in combined if r["plan"] == COMM_FREE_BOUND), None)
    plans_by_row = {r["plan"]: _baseline_plan(r["plan"], graph) for r in combined if r["plan"] != COMM_FREE_BOUND}
    compute_ms = free.step_time(plans_by_row.get("xla_default") or next(iter(plans_by_row.values()))) * 1e3
    scaled = None
    if floor is not None and floor["median_ms"] > 0:
        scaled = Simulator(graph, AnalyticCosts(), dataclasses.replace(
            spec, compute_speed=spec.compute_speed * compute_ms / floor["median_ms"]))
    rows = []
    for r in combined:
        if r["plan"] == COMM_FREE_BOUND:
            continue
        plan = plans_by_row[r["plan"]]
        pred = sim.step_time(plan) * 1e3
        row = {"plan": r["plan"], "predicted_ms": pred, "predicted_compute_ms": free.step_time(plan) * 1e3,
               "measured_ms": r["median_ms"], "measured_min_ms": r["min_ms"], "measured_max_ms": r["max_ms"],
               "error": pred / r["median_ms"] - 1, "all_reduces": r["all_reduces"]}
        if scaled is not None:
            row["predicted_ms_floor_scaled"] = scaled.step_time(plan) * 1e3
            row["error_floor_scaled"] = row["predicted_ms_floor_scaled"] / r["median_ms"] - 1
        rows.append(row)
    tau = float(kendalltau([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]).statistic)
    out = {"model": model, "preset": preset, "cluster": spec.name, **res.link_info(), "rows": rows,
           "tau": tau, "mean_abs_error": sum(abs(r["error"]) for r in rows) / len(rows),
           "gradient_bytes": res.results[0]["gradient_bytes"],
           "fingerprints_match": {r["fingerprint"] for r in res.results} == {graph.fingerprint},
           "compute_floor": {"predicted_ms": compute_ms,
                             **({"measured_ms": floor["median_ms"], "measured_min_ms": floor["min_ms"],
                                 "measured_max_ms": floor["max_ms"]} if floor is not None else {})}}
    if scaled is not None:
        out["tau_floor_scaled"] = float(kendalltau([r["predicted_ms_floor_scaled"] for r in rows],
                                                   [r["measured_ms"] for r in rows]).statistic)
        out["mean_abs_error_floor_scaled"] = sum(abs(r["error_floor_scaled"]) for r in rows) / len(rows)
    return out


def _baseline_plan(name: str, graph: Any) -> Any:
    """The baseline of row ``name`` (``even_<k>``: the even split into k buckets)."""
    from disco.plans import baselines

    kind, _, k = name.partition("_")
    return baselines.make("even", graph, k=int(k)) if kind == "even" and k.isdigit() else baselines.make(name, graph)

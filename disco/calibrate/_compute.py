"""The compute side of a cluster across processes: the step's compute floor and the simulator's
baselines against measurements.

The analytic costs price a CPU step's compute well below what it takes across processes; the
step with its all-reduces replaced by copies (:mod:`xla_hooks.bound`: the compute floor,
:func:`measure_compute_floor`) gives the factor: :func:`with_compute_floor` sets the spec's
``compute_speed`` so that the simulator's compute of the step equals the floor. The search on a
:class:`disco.optimizer.ProcessRunner` prices plans on that spec.

:func:`compare_baselines` prices the baselines of a zoo model and measures them across the same
kind of cluster, in one launch that also measures the compute floor and the chained all-reduces
(after the rounds): per baseline the predicted (on the spec with the compute scaled to the
floor: what the search uses), the unscaled and the same-launch-refit predictions next to the
measured step time, the errors, and Kendall's tau between the orders.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from disco.runtime import multiprocess
from disco.calibrate._fit import fit_chained
from disco.calibrate._runners import ACROSS_CHAIN, ACROSS_SIZES, chained_medians

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.runtime.testbed import LinkSpec

BASELINES = ("xla_default", "per_tensor", "one_bucket", "horovod", "ddp", "even:2", "even:4")


def predicted_compute_s(graph: Any, spec: ClusterSpec, costs: Any = None, plan: Any = None) -> float:
    """The simulator's step time of ``plan`` (default: ``graph``'s xla_default) on ``spec`` with a
    free link and no operand latency: its compute (at ``spec.compute_speed``; ``costs`` default to
    the analytic costs of the spec's device)."""
    from disco.plans import baselines
    from disco.sim.costs import device_costs
    from disco.sim.cluster import LinkSpec as SimLink
    from disco.sim.simulator import Simulator

    free_link = SimLink(1e18, 0.0)
    free = dataclasses.replace(spec, intra=free_link, inter=free_link, operand_latency=0.0)
    return Simulator(graph, costs if costs is not None else device_costs.analytic(spec.device), free).step_time(
        plan if plan is not None else baselines.make("xla_default", graph))


def with_compute_floor(spec: ClusterSpec, graph: Any, floor_s: float, costs: Any = None, *,
                       what: str = "") -> ClusterSpec:
    """``spec`` with ``compute_speed`` set so that the simulator's compute of ``graph``'s step
    (:func:`predicted_compute_s`, with ``costs``: default the analytic costs of the spec's device)
    equals the measured compute floor ``floor_s``: ``compute_speed * predicted / floor``.
    ``what`` names the measurement (e.g. "mlp/tiny") in the spec's description.

    Raises:
      ValueError: a floor that is not a positive number of seconds.
    """
    if isinstance(floor_s, bool) or not isinstance(floor_s, (int, float)) or not floor_s > 0:
        raise ValueError(f"floor_s: expected a positive number of seconds, got {floor_s!r}")
    pred = predicted_compute_s(graph, spec, costs)
    speed = spec.compute_speed * pred / floor_s
    note = (f"compute scaled to the measured compute floor{' of ' + what if what else ''} "
            f"({floor_s * 1e3:.3f} ms vs {pred * 1e3:.3f} ms predicted: compute_speed {speed:.4g})")
    return dataclasses.replace(spec, compute_speed=speed,
                               description=f"{spec.description}; {note}" if spec.description else note)


def measure_compute_floor(processes: int, devices_per_process: int, link: LinkSpec | None, *, model: str,
                          preset: str, rounds: int = 3, steps: int = 3, optimizer: str = "adamw",
                          style: str = "shard_map", mesh_shape: tuple[int, int] | None = None,
                          timeout_s: float = 900) -> dict[str, Any]:
    """The compute floor of a zoo model's step across the cluster: the step with its all-reduces
    replaced by copies (:mod:`xla_hooks.bound`), measured beside xla_default in one launch.

    Returns:
      ``{"median_ms", "min_ms", "max_ms", "xla_default_ms", "fingerprint"}`` (the slowest worker per round).

    Raises:
      RuntimeError: when the workers fail or report no floor.
    """
    from disco.bench import COMM_FREE_BOUND

    wspec = multiprocess.WorkerSpec(model=model, preset=preset, plans=("xla_default",), rounds=rounds, steps=steps,
                                    optimizer=optimizer, style=style, mesh_shape=mesh_shape, comm_free_bound=True)
    res = multiprocess.launch(processes, devices_per_process, wspec, link=link, timeout_s=timeout_s)
    res.raise_if_failed("measuring the compute floor across processes")
    rows = {r["plan"]: r for r in multiprocess.combine(res)}
    if COMM_FREE_BOUND not in rows:
        raise RuntimeError(f"the workers reported no {COMM_FREE_BOUND} row; rows: {', '.join(rows)}")
    floor = rows[COMM_FREE_BOUND]
    return {"median_ms": floor["median_ms"], "min_ms": floor["min_ms"], "max_ms": floor["max_ms"],
            "xla_default_ms": rows["xla_default"]["median_ms"], "fingerprint": res.results[0]["fingerprint"]}


def compare_baselines(spec: ClusterSpec, processes: int, devices_per_process: int, link: LinkSpec | None, *,
                      model: str, preset: str, plans: Sequence[str] = BASELINES, rounds: int = 5,
                      steps: int = 3, optimizer: str = "adamw", chain: Sequence[int] = ACROSS_CHAIN,
                      chain_sizes: Sequence[int] = ACROSS_SIZES, chain_reps: int = 5,
                      timeout_s: float = 900) -> dict[str, Any]:
    """The simulator's step times for ``plans`` next to the times measured across the cluster (the
    graph is extracted in this process, whose jax must have at least ``processes *
    devices_per_process`` devices).

    One launch measures the plans and the compute floor in interleaved rounds, then (``chain``
    non-empty) the chained all-reduces. Three predictions per plan:

    - ``predicted_ms``: ``spec`` with the compute scaled to the measured floor
      (:func:`with_compute_floor`): the spec the search on a :class:`disco.optimizer.ProcessRunner` prices plans on;
    - ``predicted_ms_unscaled``: ``spec`` as given (analytic compute);
    - ``predicted_ms_same_launch``: the floor-scaled spec with latency and bandwidth refitted
      from the chained all-reduces of this launch (:func:`fit_chained`): the load of the moment.

    Returns:
      ``{"rows": [{plan, predicted_ms, error, predicted_ms_unscaled, error_unscaled,
      predicted_ms_same_launch, error_same_launch, predicted_compute_ms, measured_ms, ...}],
      "tau", "mean_abs_error"`` (and ``_unscaled``, ``_same_launch``), ``"compute_floor":
      {predicted_ms, measured_ms, ...}, "compute_speed", "cluster_spec", "same_launch_fit",
      "fingerprints_match", **link info}``; an error is predicted / measured - 1.

    Raises:
      RuntimeError: when the workers fail or report no compute floor.
    """
    import trax_models
    from scipy.stats import kendalltau

    from disco.bench import COMM_FREE_BOUND
    from disco.ir import extractor
    from disco.ir.graph import HloGraph
    from disco.sim.cluster import LinkSpec as SimLink
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    n = processes * devices_per_process
    step, example = trax_models.make_train_step(model, preset, devices=n, optimizer=optimizer)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    wspec = multiprocess.WorkerSpec(model=model, preset=preset, plans=tuple(plans), rounds=rounds, steps=steps,
                                    optimizer=optimizer, comm_free_bound=True, chain=tuple(chain),
                                    sizes=tuple(chain_sizes), reps=chain_reps)
    res = multiprocess.launch(processes, devices_per_process, wspec, link=link, timeout_s=timeout_s)
    res.raise_if_failed("measuring the baselines across processes")
    combined = multiprocess.combine(res)
    floor = next((r for r in combined if r["plan"] == COMM_FREE_BOUND), None)
    if floor is None or not floor["median_ms"] > 0:
        raise RuntimeError(f"the workers reported no {COMM_FREE_BOUND} row with a positive time")
    costs = AnalyticCosts()
    scaled_spec = with_compute_floor(spec, graph, floor["median_ms"] / 1e3, costs, what=f"{model}/{preset}")
    specs = {"": scaled_spec, "_unscaled": spec}
    same = (fit_chained(n, *chained_medians([r["chain_calibration"] for r in res.results]))
            if chain else None)
    if same is not None:
        link_now = SimLink(same.bandwidth, same.latency)
        specs["_same_launch"] = dataclasses.replace(scaled_spec, intra=link_now, inter=link_now)
    sims = {k: Simulator(graph, costs, v) for k, v in specs.items()}
    rows = []
    for r in combined:
        if r["plan"] == COMM_FREE_BOUND:
            continue
        plan = _baseline_plan(r["plan"], graph)
        row = {"plan": r["plan"], "measured_ms": r["median_ms"], "measured_min_ms": r["min_ms"],
               "measured_max_ms": r["max_ms"], "all_reduces": r["all_reduces"],
               "predicted_compute_ms": predicted_compute_s(graph, spec, costs, plan) * 1e3}
        for key, sim in sims.items():
            row[f"predicted_ms{key}"] = sim.step_time(plan) * 1e3
            row[f"error{key}"] = row[f"predicted_ms{key}"] / r["median_ms"] - 1
        rows.append(row)
    measured = [r["measured_ms"] for r in rows]
    out: dict[str, Any] = {"model": model, "preset": preset, "cluster": spec.name, **res.link_info(), "rows": rows}
    for key in sims:
        out[f"tau{key}"] = float(kendalltau([r[f"predicted_ms{key}"] for r in rows], measured).statistic)
        out[f"mean_abs_error{key}"] = sum(abs(r[f"error{key}"]) for r in rows) / len(rows)
    out.update({
        "gradient_bytes": res.results[0]["gradient_bytes"],
        "fingerprints_match": {r["fingerprint"] for r in res.results} == {graph.fingerprint},
        "compute_floor": {"predicted_ms": predicted_compute_s(graph, spec, costs) * 1e3,
                          "measured_ms": floor["median_ms"], "measured_min_ms": floor["min_ms"],
                          "measured_max_ms": floor["max_ms"]},
        "compute_speed": scaled_spec.compute_speed, "cluster_spec": scaled_spec.to_dict(),
        "same_launch_fit": same.to_dict() if same is not None else None})
    return out


def _baseline_plan(name: str, graph: Any) -> Any:
    """The baseline of row ``name`` (``even_<k>``: the even split into k buckets)."""
    from disco.plans import baselines

    return baselines.parse_item(baselines.item_of_row(name)).make(graph)

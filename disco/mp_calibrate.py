"""Calibration across processes: the alpha-beta model of an all-reduce over a real (emulated) link.

:func:`calibrate` runs :mod:`disco.mp_worker`'s ``calibrate`` task on ``P`` workers (each
behind the emulated link of a :class:`~disco.testbed.LinkSpec`, or over 127.0.0.1): every
worker times, per size, executables of ``k`` chained all-reduces for each ``k`` in ``chain``
(:func:`disco.calibrate.measure_chained`) over all ``P * D`` devices, and one variadic
all-reduce against one concatenated buffer (:mod:`disco.calibrate`'s measurements). The slowest
worker's medians are fitted by :func:`fit_chained`: ``t(k, n) = c + k (a + b n)``, so ``a + b n``
is what each all-reduce of a multi-all-reduce executable (a training step) costs and ``c`` is
the call's own overhead, which a step pays once (its compute floor holds it). Under load an
all-reduce inside such an executable costs several times a lone one per call, so the lone fit
(:func:`disco.calibrate.fit` on the ``k = 1`` column, kept as ``CrossCalibration.lone``) prices a
step's all-reduces too low (docs/benchmarks.md, issue 17). Ring latency ``a / (2 (p - 1))``,
bandwidth ``2 (p - 1) / (p b)``, per-operand cost ``(t_variadic - t_concat) / (operands - 1)``;
:func:`cluster_spec` writes them as a :class:`~disco.sim.cluster.ClusterSpec` (P nodes x D
devices, the fitted link between them).

The analytic costs price a CPU step's compute well below what it takes across processes; the
step with its all-reduces replaced by copies (:mod:`xla_hooks.bound`: the compute floor,
:func:`measure_compute_floor`) gives the factor: :func:`with_compute_floor` sets the spec's
``compute_speed`` so that the simulator's compute of the step equals the floor. The search of
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

from disco import multiprocess
from disco.calibrate import Calibration, fit, floor_fit

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.testbed import LinkSpec

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
CHAIN = (1, 2, 4, 8)  # chained all-reduces per executable
BASELINES = ("xla_default", "per_tensor", "one_bucket", "horovod", "ddp", "even:2", "even:4")


@dataclasses.dataclass(frozen=True)
class ChainFit:
    """The fit ``t(k, n) = call_s + k (fit_a + fit_b n)`` of executables of ``k`` chained
    all-reduces of ``n`` bytes per device, and the ring parameters of ``fit_a + fit_b n``.

    Attributes:
      devices: the devices the all-reduces span.
      sizes, chain: the bytes per device and the chain lengths measured.
      medians_s: ``medians_s[i][j]``: seconds per call for ``sizes[i]`` and ``chain[j]``.
      call_s: the per-call overhead (>= 0), paid once per executable.
      fit_a, fit_b: seconds per all-reduce and per byte of one, inside a chain.
      latency, bandwidth: per ring step (seconds) and per link (bytes/s).
      floored: the fitted terms raised to their floor (:func:`disco.calibrate.floor_fit`).
    """

    devices: int
    sizes: tuple[int, ...]
    chain: tuple[int, ...]
    medians_s: tuple[tuple[float, ...], ...]
    call_s: float
    fit_a: float
    fit_b: float
    latency: float
    bandwidth: float
    floored: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "per_all_reduce_1kib_s": self.fit_a + self.fit_b * 1024}


def fit_chained(devices: int, sizes: Sequence[int], chain: Sequence[int],
                medians: Sequence[Sequence[float]]) -> ChainFit:
    """Non-negative least squares, in relative error, of ``t(k, n) = c + k (a + b n)`` over every
    measured (size, chain length) pair; the ring parameters as in :func:`disco.calibrate.fit`.

    Raises:
      ValueError: fewer than 2 devices, a grid that does not match ``sizes`` x ``chain``, fewer
        than 2 chain lengths or 2 sizes, or a time that is not positive.
    """
    import numpy as np
    from scipy.optimize import nnls

    if devices < 2:
        raise ValueError(f"calibration needs at least 2 devices, got {devices}")
    if len(set(chain)) < 2 or len(set(sizes)) < 2:
        raise ValueError(f"a chained fit needs at least 2 chain lengths and 2 sizes, got chain {tuple(chain)!r}, "
                         f"sizes {tuple(sizes)!r}")
    if len(medians) != len(sizes) or any(len(row) != len(chain) for row in medians):
        raise ValueError(f"medians: expected {len(sizes)} rows (sizes) of {len(chain)} (chain lengths), got "
                         f"{[len(row) for row in medians]}")
    k = np.array([kk for _ in sizes for kk in chain], dtype=np.float64)
    n = np.array([nn for nn in sizes for _ in chain], dtype=np.float64)
    t = np.array([v for row in medians for v in row], dtype=np.float64)
    if not np.all(t > 0):
        raise ValueError(f"medians: expected positive seconds, got {medians!r}")
    a_mat = np.stack([np.ones_like(k), k, k * n], axis=1) / t[:, None]  # rows scaled by 1/t: relative error
    (c, a, b), _ = nnls(a_mat, np.ones_like(t))
    a, b, floored = floor_fit(float(a), float(b))
    p = devices
    return ChainFit(devices, tuple(int(s) for s in sizes), tuple(int(kk) for kk in chain),
                    tuple(tuple(float(v) for v in row) for row in medians), call_s=float(c), fit_a=a, fit_b=b,
                    latency=a / (2 * (p - 1)), bandwidth=2 * (p - 1) / (p * b), floored=floored)


@dataclasses.dataclass(frozen=True)
class CrossCalibration:
    """A calibration across processes.

    Attributes:
      processes, devices_per_process: the workers and each one's devices.
      link: the emulated link (None: 127.0.0.1).
      calibration: the fit (:class:`disco.calibrate.Calibration`) over ``processes * devices_per_process``
        devices, with the operand latency.
      switch: the emulated switch's statistics of the run (packets, lateness), or None.
      chained: the chained fit (:func:`fit_chained`) that ``calibration``'s latency and bandwidth
        come from, or None (a calibration of lone all-reduces, ``chain=()``).
      lone: the fit of the lone all-reduce per call (the ``k = 1`` medians), kept for comparison
        when ``chained`` is set; otherwise None (it is ``calibration``).
    """

    processes: int
    devices_per_process: int
    link: LinkSpec | None
    calibration: Calibration
    switch: dict[str, Any] | None = None
    chained: ChainFit | None = None
    lone: Calibration | None = None

    def to_dict(self) -> dict[str, Any]:
        c = self.calibration
        out: dict[str, Any] = {
            "processes": self.processes, "devices_per_process": self.devices_per_process,
            "link": self.link.to_dict() if self.link else "loopback", **c.to_dict(),
            "fitted_bandwidth_bps": c.bandwidth * 8, "fitted_latency_us": c.latency * 1e6,
            "operand_latency_us": c.operand_latency * 1e6, "switch": self.switch,
            "fit": "chained" if self.chained else "lone",
            "chained": self.chained.to_dict() if self.chained else None,
            "lone": ({"latency_us": self.lone.latency * 1e6, "bandwidth_bps": self.lone.bandwidth * 8,
                      "fit_a": self.lone.fit_a, "fit_b": self.lone.fit_b} if self.lone else None),
        }
        if self.link is not None:
            out["bandwidth_over_link_rate"] = c.bandwidth * 8 / self.link.rate_bps
            out["latency_over_link_delay"] = c.latency / self.link.delay_s if self.link.delay_s else None
        return out


def calibrate(processes: int, devices_per_process: int, link: LinkSpec | None, *,
              sizes: Sequence[int] = SIZES, chain: Sequence[int] = CHAIN, reps: int = 10,
              timeout_s: float = 900) -> CrossCalibration:
    """Measures all-reduces across ``processes`` workers and fits the alpha-beta model.

    Args:
      sizes: bytes per device.
      chain: chain lengths (:func:`fit_chained`; at least two); ``()``: the lone all-reduce per
        call only, fitted by :func:`disco.calibrate.fit`.
      reps: repetitions per executable.

    Raises:
      ValueError: fewer than 2 devices in all, bad sizes (fewer than 2 distinct) or chain lengths,
        ``reps`` below 1 (before any worker starts).
      RuntimeError: when the workers fail (their messages).
      PermissionError: a link where network namespaces are not permitted.
    """
    if processes * devices_per_process < 2:
        raise ValueError(f"calibration needs at least 2 devices in all, got {processes} processes x "
                         f"{devices_per_process} devices")
    if not sizes or any(not isinstance(s, int) or s < 4 for s in sizes):
        raise ValueError(f"sizes: expected byte counts >= 4, got {tuple(sizes)!r}")
    if len(set(sizes)) < 2:
        raise ValueError(f"sizes: expected at least 2 distinct byte counts to fit, got {tuple(sizes)!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: expected an integer >= 1, got {reps!r}")
    if chain and len(set(chain)) < 2:
        raise ValueError(f"chain: expected at least 2 distinct chain lengths (or none), got {tuple(chain)!r}")
    spec = multiprocess.WorkerSpec(task="calibrate", sizes=tuple(sizes), reps=reps, chain=tuple(chain))
    res = multiprocess.launch(processes, devices_per_process, spec, link=link, timeout_s=timeout_s)
    res.raise_if_failed("calibration across processes")
    n = processes * devices_per_process
    medians = [max(r["medians_s"][i] for r in res.results) for i in range(len(sizes))]
    variadic = max(r["variadic_s"] for r in res.results)
    concat = max(r["concat_s"] for r in res.results)
    operands = res.results[0]["operands"]
    lone = fit(n, sizes, medians)
    c = dataclasses.replace(lone, operand_latency=max(0.0, (variadic - concat) / (operands - 1)),
                            variadic_s=variadic, concat_s=concat)
    chained = _fit_results(n, res.results) if chain else None
    if chained is not None:
        c = dataclasses.replace(c, latency=chained.latency, bandwidth=chained.bandwidth, fit_a=chained.fit_a,
                                fit_b=chained.fit_b, floored=chained.floored)
    return CrossCalibration(processes, devices_per_process, link, c, res.link_info().get("switch"),
                            chained=chained, lone=lone if chained else None)


def _fit_results(devices: int, results: Sequence[dict[str, Any]]) -> ChainFit:
    """:func:`fit_chained` of the workers' chained timings (``chain_medians_s``), the slowest worker's
    per cell.

    Raises:
      RuntimeError: when XLA did not keep k all-reduces in the executable of a chain of k.
    """
    r0 = results[0]
    for r in results:
        for size, counts in zip(r["sizes"], r["chain_all_reduces"]):
            if list(counts) != list(r["chain"]):
                raise RuntimeError(f"chained all-reduces of {size} bytes: expected {r['chain']} all-reduces in the "
                                   f"executables, the compiled ones hold {counts}")
    medians = [[max(r["chain_medians_s"][i][j] for r in results) for j in range(len(r0["chain"]))]
               for i in range(len(r0["sizes"]))]
    return fit_chained(devices, r0["sizes"], r0["chain"], medians)


def cluster_spec(cal: CrossCalibration) -> ClusterSpec:
    """The calibration as a cluster spec: ``processes`` nodes of ``devices_per_process`` devices,
    the fitted link between them (and, for lack of a separate measurement, inside them too),
    a ring, one stream (XLA:CPU runs a gloo all-reduce in the thread that would compute)."""
    from disco.sim.cluster import ClusterSpec, LinkSpec as SimLink

    c = cal.calibration
    link = SimLink(c.bandwidth, c.latency)
    over = f"emulated link {cal.link.label()}" if cal.link else "127.0.0.1 (gloo)"
    fitted = (f"latency and bandwidth of all-reduces chained {'/'.join(map(str, cal.chained.chain))} per call"
              if cal.chained else "latency and bandwidth of one all-reduce per call")
    return ClusterSpec(name=f"testbed-{cal.processes}x{cal.devices_per_process}", nodes=cal.processes,
                       devices_per_node=cal.devices_per_process, intra=link, inter=link, algorithm="ring",
                       operand_latency=c.operand_latency, overlap=False,
                       description=f"{cal.processes} processes x {cal.devices_per_process} CPU devices over {over}; "
                                   f"{fitted}",
                       label=f"calibrated across processes on {over}")


def predicted_compute_s(graph: Any, spec: ClusterSpec, costs: Any = None, plan: Any = None) -> float:
    """The simulator's step time of ``plan`` (default: ``graph``'s xla_default) on ``spec`` with a
    free link and no operand latency: its compute (at ``spec.compute_speed``; ``costs`` default to
    the analytic costs of the spec's device)."""
    from disco.plans import baselines
    from disco.sim import device_costs
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
                          style: str = "shard_map",
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
                                    optimizer=optimizer, style=style, comm_free_bound=True)
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
                      steps: int = 3, optimizer: str = "adamw", chain: Sequence[int] = CHAIN,
                      chain_sizes: Sequence[int] = SIZES, chain_reps: int = 5,
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
    same = _fit_results(n, [r["chain_calibration"] for r in res.results]) if chain else None
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

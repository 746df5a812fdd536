"""The baselines disco is compared with, each expressed as a FusionPlan.

* ``xla_default``: no plan; XLA's fusion and all-reduce combiner decide.
* ``no_fusion``: XLA's op-fusion pass off; all-reduces left to the combiner.
* ``per_tensor``: one all-reduce per gradient (the combiner off).
* ``one_bucket``: every all-reduce in one bucket (one per dtype/reduction class).
* ``horovod``: Horovod's fusion buffer: gradients in the order the backward pass
  produces them, a bucket closes once it holds ``threshold_mb`` (default 64; 128 is
  the other common setting).
* ``ddp``: PyTorch DDP: parameters in reverse order, a 1 MB first bucket, then
  ``cap_mb`` (default 25) buckets.
* ``xla_threshold``: XLA's combiner with a given byte threshold (and its 256-operand
  limit), emulated with buckets because XLA:CPU has no threshold flag.
* ``even``: the gradients in production order cut into ``k`` buckets of about equal bytes
  (default 2; named ``even_<k>``): the bucket count a DDP user tunes with ``bucket_cap_mb``,
  stated as a count so that one setting means the same on every model.
* ``xla_tuned`` (GPU; not in :data:`NAMES`): NVIDIA JAX-Toolbox's recipe as compile options,
  the latency-hiding scheduler on and XLA:GPU's all-reduce combine threshold set
  (``threshold_bytes``, default 16 MiB); :func:`xla_tuned_sweep` gives the recipe's sweep,
  powers of two from 16 MiB up to the gradients' size (JAX-Toolbox issue 674). On CPU these
  options do nothing (the plan compiles as ``xla_default``).
* ``xla_o1`` (GPU): what users turn on today with ``jax_optimization_level=O1``: the compile option
  ``optimization_level=O1`` (:mod:`disco.plans.options` says what XLA:GPU enables with it: the
  latency-hiding scheduler, collective pipelining, double-buffered loops, the speed-of-light latency
  estimator on Hopper). Priced by the compiled tier (deviceless XLA:GPU) on GPU clusters; refused on
  CPU, which has none of these passes, and by the emulated tier, which does not model them.
* ``maxtext`` (GPU): MaxText's XLA:GPU recipe for sharded steps as compile options: the all-gather,
  reduce-scatter and all-reduce combine thresholds at 512 MiB each (:data:`MAXTEXT_THRESHOLD`), the
  collective pipeliner on for all three collectives and double-buffered loops
  (:data:`disco.plans.options.LOOP_PASSES`). MaxText's older scripts write the pipeliner as the
  booleans ``xla_gpu_enable_pipelined_all_gather=true`` and siblings, which jax 0.11.2's compile
  rejects ("No such compile option"); its newer ones write the enum ``xla_gpu_pipeline_all_gather=on``
  that 0.11.2 takes (per compile: ``COLLECTIVE_PIPELINING_MODE_ON``), so the recipe carries the enum.
  Only the compiled tier prices the loop passes (the emulated tier prices the thresholds alone).
  Refused on CPU (:data:`disco.plans.options.CPU_HAS_NO_GATHER_COMBINER`: XLA:CPU has no all-gather or
  reduce-scatter combiner, nor the loop passes).
* ``saturating`` (any backend; needs ``cluster``): gradient buckets sized to saturate the link, the
  rule of PyTorch's pre-bucketing of FSDP collectives (pytorch/pytorch PR 179935): the smallest
  bucket whose collective spends at least ``efficiency`` (0.95) of its time moving bytes in the
  alpha-beta model, ``n / B >= e (alpha + n / B)``, so ``n = e / (1 - e) * alpha * B``, with ``B`` the
  link's bandwidth and ``alpha`` the all-reduce's latency (``2 (p - 1)`` ring steps of the link's
  latency over ``p`` devices), times a calibration multiplier (1.0), clipped to 50-2000 MiB as the PR
  clips it (:func:`saturating_bytes`). Too small a bucket leaves the link idle for latency, too big
  a one leaves the scheduler nothing to overlap. The link is the cluster's slowest one an all-reduce
  crosses (between nodes when there are several). Buckets fill in production order.
* ``auto_pgle`` (GPU, never a plan): jax's automatic profile-guided latency estimator
  (``JAX_ENABLE_PGLE=1``: a step's first ``jax_pgle_profiling_runs`` runs are profiled, then it is
  recompiled with the measured latencies). Its schedule comes from a profile of real GPU runs, so
  nothing off a GPU can price it: :func:`make` refuses it with :data:`AUTO_PGLE_OFF_GPU`, and
  ``scripts/tools/check_gpu.py`` measures it on a GPU (its ``auto_pgle`` row).
* ``one_gather_bucket`` and ``per_layer_gathers`` (a step with sharded parameters; not in
  :data:`NAMES`, :data:`GATHER_NAMES`): every parameter all-gather in one gather bucket, or one
  gather bucket per layer as PyTorch FSDP2 groups its all-gathers (``fully_shard`` per block): the
  parameters below one top-level module of the parameter tree (``['EncoderBlock_0']``), a parameter
  the backward pass gathers again in a second bucket of its layer. All-reduces stay to XLA. In a
  scanned step (``lax.scan`` / ``nn.scan`` over stacked layers) a loop body is one layer: both add
  :func:`loop_gather_buckets`, each body's all-gathers in one bucket per class and level.
* ``prefetch`` (a step with sharded parameters; not in :data:`NAMES`, :data:`PREFETCH_DISTANCES`;
  ``prefetch_<d>``, ``distance=d``): each layer's all-gathers anchored (``FusionPlan.gather_after``;
  no gather buckets, all-reduces to XLA) on the first use of the layer ``d`` earlier, so a layer's parameters
  are gathered while the layer ``d`` before it computes and not from the step's start: PyTorch FSDP's
  forward prefetch of ``d`` layers, ``limit_all_gathers`` in spirit. A layer is one bucket of
  ``per_layer_gathers`` (a top-level module of the parameter tree; its re-gathers for the backward
  pass a second one); the layers are ordered by their first use in program order (the forward pass
  first, then the backward pass's re-gathers), a layer's first use being the earliest first use of
  its gathers (:func:`disco.ir.sharded.first_uses`: a dot or convolution reading the gathered value
  where one does). The first ``d`` layers wait for nothing.
* ``scatter_buckets`` (a step with sharded parameters; not in :data:`NAMES`, :data:`SCATTER_NAMES`):
  the gradient scatters as reduce-scatters, one "scatter" bucket per class of them, the other
  all-reduces as in ``one_bucket``.

:func:`parse_item` reads one ``--plans`` item (``horovod``, ``horovod:128``, ``even:4``): which
baseline, the keyword of :func:`make` its value sets, and its row name in tables and JSON.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from disco.ir.graph import HloGraph, Node, require_graph
from disco.ir.step_checks import all_reduce_dependencies
from disco.plans import options as plan_options
from disco.ir.sharded import first_uses
from disco.plans.check import anchorable, bucket_class, contraction_cycle, gather_class, scatter_groups, scatterable
from disco.plans.plan import Bucket, BucketBuild, FusionPlan

MB = 1 << 20
NAMES = ("xla_default", "no_fusion", "per_tensor", "one_bucket", "horovod", "ddp", "xla_threshold", "even")
# Baselines that only mean something on GPU (compile options XLA:CPU ignores).
GPU_NAMES = ("xla_tuned", "xla_o1", "auto_pgle", "maxtext")
# Baselines sized from the cluster (``make(name, graph, cluster=...)``).
LINK_NAMES = ("saturating",)
MAXTEXT_THRESHOLD = 512 * (1 << 20)
# MaxText's loop passes: the pipeliner on for every collective, double-buffered loops.
MAXTEXT_LOOP_PASSES = {**dict.fromkeys(plan_options.PIPELINE_KEYS, plan_options.PIPELINE_ON),
                       plan_options.DOUBLE_BUFFERING: "True"}
# PyTorch PR 179935's pre-bucketing of FSDP collectives: its target efficiency, calibration multiplier
# and clip (MiB: the PR's cap_mb is bytes / (1024 * 1024)).
SATURATION_EFFICIENCY = 0.95
SATURATION_MIN_MB = 50
SATURATION_MAX_MB = 2000
# Baselines of a step with sharded parameters (FSDP): its parameter all-gathers bucketed.
GATHER_NAMES = ("one_gather_bucket", "per_layer_gathers")
# The prefetch distances (in layers) the search starts from: ``prefetch_<d>``; not in NAMES.
PREFETCH_DISTANCES = (1, 2)
# A sharded step's gradient scatters as reduce-scatters ("scatter" buckets); not in NAMES.
SCATTER_NAMES = ("scatter_buckets",)
# --plans items beyond NAMES: one GPU baseline each (xla_tuned is a sweep of rows, not an item).
GPU_ITEMS = ("xla_o1", "auto_pgle")
TUNED_MIN_THRESHOLD = 16 * MB
AUTO_PGLE_OFF_GPU = (
    "auto_pgle is jax's profile-guided latency estimator (JAX_ENABLE_PGLE=1): XLA:GPU reschedules the step "
    "with latencies measured over its first profiled runs on a GPU, so no simulation can price it (there is "
    "no profile without a GPU); measure it on a GPU: python scripts/tools/check_gpu.py (its auto_pgle row)")


def _classes(nodes: Sequence[Node]) -> dict[tuple, list[Node]]:
    """All-reduces grouped by what may share a bucket, keeping order within a class; a tuple-shaped
    all-reduce is a class of its own (it can only be a bucket of its own)."""
    out: dict[tuple, list[Node]] = collections.OrderedDict()
    for n in nodes:
        out.setdefault(bucket_class(n), []).append(n)
    return out


def _greedy(nodes: Sequence[Node], caps: Callable[[int], int], max_members: int = 1 << 30,
            build: BucketBuild = "concat", deps: dict[str, frozenset[str]] | None = None) -> tuple[Bucket, ...]:
    """Fills buckets in the given order; bucket ``i`` closes once it holds ``caps(i)`` bytes, and
    before an all-reduce that depends on a member or a member depends on (``deps``: each
    all-reduce's upstream all-reduces; a GSPMD step's token count feeds its gradients)."""
    buckets: list[Bucket] = []
    deps = deps or {}
    for cls in _classes(nodes).values():
        cur: list[str] = []
        held: set[str] = set()  # cur's members
        above: set[str] = set()  # the all-reduces they depend on (no member may be one)
        size = 0
        for n in cls:
            ups = deps.get(n.name, frozenset())
            if cur and (not ups.isdisjoint(held) or n.name in above):
                buckets.append(Bucket(tuple(cur), build))
                cur, size, held, above = [], 0, set(), set()
            cur.append(n.name)
            held.add(n.name)
            above |= ups
            size += n.grad_bytes
            if size >= caps(len(buckets)) or len(cur) >= max_members:
                buckets.append(Bucket(tuple(cur), build))
                cur, size, held, above = [], 0, set(), set()
        if cur:
            buckets.append(Bucket(tuple(cur), build))
    return tuple(buckets)


def _without_cycles(buckets: tuple[Bucket, ...], graph: HloGraph) -> tuple[Bucket, ...]:
    """``buckets`` with each bucket on a cycle of their contraction split by all-reduce level (the
    all-reduces on the longest chain above it), until none is left; the buckets as they were when they
    form none.

    :func:`_greedy` keeps a bucket from holding an all-reduce and one it depends on, but across classes
    buckets can still wait on each other: on a data x fsdp mesh a gradient's reduction over fsdp feeds
    its reduction over data, which feeds a norm reduced over fsdp again (maxtext's scanned step). Buckets of
    one level each form no cycle (along any path between two all-reduces the level grows), so this ends.
    """
    cycle = contraction_cycle(FusionPlan(buckets=buckets), graph)
    if cycle is None:
        return buckets
    deps = all_reduce_dependencies(graph)
    level: dict[str, int] = {}
    for n in graph.all_reduces():  # program order: upstream all-reduces first
        level[n.name] = max((level[u] + 1 for u in deps[n.name]), default=0)

    def by_level(b: Bucket) -> list[Bucket]:
        parts: dict[int, list[str]] = collections.OrderedDict()
        for m in b.members:
            parts.setdefault(level[m], []).append(m)
        return [Bucket(tuple(ms), b.build) for ms in parts.values()]

    out = list(buckets)
    while cycle is not None:
        on_it = set(cycle)  # (every bucket on the cycle has a member on its path)
        split = [part for b in out for part in (by_level(b) if on_it.intersection(b.members) else [b])]
        if len(split) == len(out):
            break  # no bucket of two levels on it (cannot happen): validation names the cycle
        out = split
        cycle = contraction_cycle(FusionPlan(buckets=tuple(out)), graph)
    return tuple(out)


def production_order(graph: HloGraph) -> list[Node]:
    """All-reduces in program order: the order the backward pass produces gradients."""
    return graph.all_reduces()


def reverse_parameter_order(graph: HloGraph) -> list[Node]:
    """Gradients in reverse parameter order (DDP's bucket order); unnamed all-reduces last."""
    ars = graph.all_reduces()
    named = sorted((n for n in ars if n.param_path is not None), key=lambda n: n.param_path, reverse=True)
    return named + [n for n in ars if n.param_path is None]


def make(name: str, graph: HloGraph, **kw: Any) -> FusionPlan:
    """Builds the baseline plan ``name`` for ``graph``.

    Args:
      name: one of :data:`NAMES`, :data:`GPU_NAMES`, :data:`GATHER_NAMES`, :data:`SCATTER_NAMES` or
        :data:`LINK_NAMES`.
      graph: the step's pre-optimisation graph.
      **kw: ``threshold_mb`` (horovod), ``cap_mb``/``first_mb`` (ddp),
        ``threshold_bytes`` (xla_threshold, xla_tuned), ``k`` (even: the bucket count, >= 1), ``build``
        ("concat", "rs_ag" or "tuple"; scatter_buckets sets its own), ``cluster`` (saturating: a ClusterSpec, required) with
        ``min_mb``/``max_mb`` (its clip), ``backend`` (maxtext: "gpu" by default; "cpu" is refused).

    Raises:
      TypeError: ``graph`` is not an HloGraph.
      ValueError: unknown name or keyword; ``scatter_buckets`` on a graph without gradient scatters; ``auto_pgle`` (:data:`AUTO_PGLE_OFF_GPU`: measured on a
        GPU, never a plan).
    """
    require_graph(graph, f"baseline {name!r}: graph")
    build = kw.pop("build", "concat")
    ars = graph.all_reduces()

    def greedy(order: Sequence[Node], caps: Callable[[int], int], **opts: Any) -> tuple[Bucket, ...]:
        return _greedy(order, caps, build=build, deps=all_reduce_dependencies(graph), **opts)

    if name == "xla_default":
        plan = FusionPlan(name=name)
    elif name == "no_fusion":
        plan = FusionPlan(xla_fusion="off", name=name)
    elif name == "per_tensor":
        plan = FusionPlan(buckets=tuple(Bucket((n.name,), build) for n in ars), name=name)
    elif name == "one_bucket":
        plan = FusionPlan(buckets=greedy(ars, lambda i: 1 << 62), name=name)
    elif name == "horovod":
        mb = _positive_size(name, "threshold_mb", kw.pop("threshold_mb", 64))
        plan = FusionPlan(buckets=greedy(production_order(graph), lambda i: int(mb * MB)),
                          name="horovod" if mb == 64 else f"horovod_{mb:g}mb")
    elif name == "ddp":
        cap = _positive_size(name, "cap_mb", kw.pop("cap_mb", 25))
        first = _positive_size(name, "first_mb", kw.pop("first_mb", 1))
        plan = FusionPlan(buckets=greedy(reverse_parameter_order(graph),
                                         lambda i: int((first if i == 0 else cap) * MB)),
                          name=name)
    elif name == "xla_threshold":
        thr = _positive_bytes(name, "threshold_bytes", kw.pop("threshold_bytes", 30 * MB))
        plan = FusionPlan(buckets=greedy(production_order(graph), lambda i: thr, max_members=256),
                          name=f"xla_threshold_{thr}")
    elif name == "even":
        k = _bucket_count(name, "k", kw.pop("k", 2))
        per_class = [sum(n.grad_bytes for n in cls) for cls in _classes(ars).values()]
        cap = -(-max(per_class, default=0) // k) or 1  # the largest class cut into k
        plan = FusionPlan(buckets=greedy(production_order(graph), lambda i: cap),
                          name=f"even_{k}")
    elif name == "xla_o1":
        plan = FusionPlan(compile_options=((plan_options.OPTIMIZATION_LEVEL, "O1"),), name=name)
    elif name == "auto_pgle":
        raise ValueError(AUTO_PGLE_OFF_GPU)
    elif name == "maxtext":
        thr = str(MAXTEXT_THRESHOLD)
        opts = {plan_options.THRESHOLD: thr, plan_options.GATHER_THRESHOLD: thr, plan_options.SCATTER_THRESHOLD: thr,
                **MAXTEXT_LOOP_PASSES}
        plan = FusionPlan(compile_options=tuple(sorted(opts.items())), name=name)
        backend = kw.pop("backend", "gpu")
        if plan_options.normalize(backend) == "cpu":
            raise ValueError(f"baseline 'maxtext' on cpu: {plan_options.CPU_HAS_NO_GATHER_COMBINER}")
    elif name == "saturating":
        cluster = kw.pop("cluster", None)
        if cluster is None or not hasattr(cluster, "inter"):
            raise ValueError(f"baseline 'saturating': expected cluster=<a ClusterSpec> (its link sizes the buckets), "
                             f"got {type(cluster).__name__}")
        cap = saturating_bytes(cluster, min_mb=kw.pop("min_mb", SATURATION_MIN_MB),
                               max_mb=kw.pop("max_mb", SATURATION_MAX_MB))
        plan = FusionPlan(buckets=greedy(production_order(graph), lambda i: cap), name=name)
    elif name in GATHER_NAMES:
        plan = FusionPlan(gather_buckets=_gather_buckets(graph, per_layer=name == "per_layer_gathers"), name=name)
    elif name in SCATTER_NAMES:
        plan = FusionPlan(buckets=_scatter_buckets(graph), name=name)
    elif name == "prefetch":
        d = _bucket_count(name, "distance", kw.pop("distance", 1))
        plan = FusionPlan(gather_after=prefetch_anchors(graph, d), name=f"prefetch_{d}")
    elif name == "xla_tuned":
        thr = _positive_bytes(name, "threshold_bytes", kw.pop("threshold_bytes", TUNED_MIN_THRESHOLD))
        opts = {plan_options.SCHEDULER: "True", plan_options.THRESHOLD: str(thr)}
        plan = FusionPlan(compile_options=tuple(sorted(opts.items())),
                          name=f"xla_tuned_{thr // MB}mb" if thr % MB == 0 else f"xla_tuned_{thr}")
    else:
        raise ValueError(f"unknown baseline {name!r}; expected one of: "
                         f"{', '.join(NAMES + GPU_NAMES + GATHER_NAMES + SCATTER_NAMES + LINK_NAMES + ('prefetch',))}")
    if kw:
        raise ValueError(f"baseline {name!r} got unexpected options {sorted(kw)}")
    if plan.buckets:
        plan = plan.replace(buckets=_without_cycles(plan.buckets, graph))
    # a GPU baseline is checked for GPU: plan_options.check refuses xla_o1 where it is applied on CPU
    return plan.validate(graph, "gpu" if name in GPU_NAMES else "cpu")


def saturating_bytes(cluster: Any, *, min_mb: float = SATURATION_MIN_MB, max_mb: float = SATURATION_MAX_MB,
                     efficiency: float = SATURATION_EFFICIENCY, multiplier: float = 1.0) -> int:
    """The bucket bytes that saturate ``cluster``'s link (the module doc's ``saturating``): ``multiplier
    * e / (1 - e) * alpha * B``, ``alpha`` the latency of a ring all-reduce over every device (``2 (p -
    1)`` steps of the link's latency), ``B`` the link's bandwidth (between nodes where there are
    several), clipped to ``[min_mb, max_mb]`` MiB.

    Raises:
      ValueError: an efficiency outside (0, 1), a multiplier that is not positive, or a clip that is
        not ``0 < min_mb <= max_mb``.
    """
    if not 0 < efficiency < 1 or not multiplier > 0:
        raise ValueError(f"saturating_bytes: expected 0 < efficiency < 1 and multiplier > 0, got {efficiency!r}, "
                         f"{multiplier!r}")
    if isinstance(min_mb, bool) or isinstance(max_mb, bool) or not 0 < min_mb <= max_mb < math.inf:
        raise ValueError(f"baseline 'saturating': expected 0 < min_mb <= max_mb, got {min_mb!r}, {max_mb!r}")
    link = cluster.inter if cluster.nodes > 1 else cluster.intra
    steps = 2 * max(cluster.num_devices - 1, 1)
    n = multiplier * efficiency / (1 - efficiency) * steps * link.latency * link.bandwidth
    return int(min(max(n, min_mb * MB), max_mb * MB))


def layer_of(param_path: str) -> str:
    """The layer a parameter belongs to: the first key of its path below the variables' collection
    (``"state.params['params']['Dense_0']['kernel']"`` -> ``"Dense_0"``); the path itself without keys."""
    import re

    keys = re.findall(r"\[['\"]?([^'\"\]]*)['\"]?\]", param_path)
    if keys and keys[0] == "params" and len(keys) > 1:
        keys = keys[1:]
    return keys[0] if keys else param_path


def _gather_buckets(graph: HloGraph, *, per_layer: bool) -> tuple[tuple[str, ...], ...]:
    """The parameter all-gathers in program order, one bucket per class (computation, replica groups,
    dtype), or per (layer, how many times the parameter was gathered before, class)."""
    seen: collections.Counter[str] = collections.Counter()
    buckets: dict[tuple, list[str]] = collections.OrderedDict()
    nodes = {n.name: n for n in graph.nodes}
    for c in graph.collective_roles():
        if c.role != "param_gather" or c.opcode != "all-gather":
            continue
        n = nodes[c.name]
        key: tuple = gather_class(n)
        if per_layer:
            key = (layer_of(c.param or c.name), seen[c.param or c.name], *key)
        seen[c.param or c.name] += 1
        buckets.setdefault(key, []).append(c.name)
    return tuple(tuple(b) for b in buckets.values()) + loop_gather_buckets(graph)


def loop_gather_buckets(graph: HloGraph) -> tuple[tuple[str, ...], ...]:
    """Each loop body's all-gathers (a scanned step's layer: ``lax.scan`` over stacked sharded weights
    gathers one layer's weights per iteration) in gather buckets of several, one per class (replica
    groups, dtype) and level (the all-gathers on the longest chain above it in the body), so no bucket
    waits on another's result; in program order. Empty for a graph whose loops gather nothing."""
    out: list[tuple[str, ...]] = []
    for loop in graph.loops:
        body = loop.body
        level = [0] * len(body.nodes)
        is_gather = [n.opcode == "all-gather" for n in body.nodes]
        for s, d in sorted(body.edges, key=lambda e: e[1]):  # nodes are in topological order
            level[d] = max(level[d], level[s] + is_gather[s])
        buckets: dict[tuple, list[str]] = collections.OrderedDict()
        for i, n in enumerate(body.nodes):
            if is_gather[i] and not n.shape.startswith("("):
                buckets.setdefault((level[i], *gather_class(n)), []).append(n.name)
        out += [tuple(b) for b in buckets.values() if len(b) > 1]
    return tuple(out)


def prefetch_anchors(graph: HloGraph, distance: int) -> tuple[tuple[str, str], ...]:
    """``prefetch``'s gather anchors for ``distance`` layers (the module doc's ``prefetch``), in program
    order of (all-gather, anchor).

    Raises:
      ValueError: the graph has no parameter all-gather (no step with sharded parameters).
    """
    layers = _gather_buckets(graph, per_layer=True)
    if not layers:
        raise ValueError("baseline 'prefetch': the graph has no parameter all-gather (a step with parameters sharded "
                         "over a mesh axis has them, see docs/guides/sharded-steps.md)")
    uses = first_uses(graph)
    ok = set(anchorable(graph, sorted(set(uses.values()))))
    first = {b: min((uses[g] for g in b if uses.get(g) in ok), default=None) for b in layers}
    ordered = [b for b in sorted(layers, key=lambda b: first[b] if first[b] is not None else -1) if first[b] is not None]
    nodes, index = graph.nodes, graph.index()
    after = [(g, nodes[first[ordered[k - distance]]].name) for k in range(distance, len(ordered)) for g in ordered[k]
             if nodes[index[g]].computation == nodes[first[ordered[k - distance]]].computation]
    return tuple(sorted(after, key=lambda p: (index[p[0]], index[p[1]])))


def _scatter_buckets(graph: HloGraph) -> tuple[Bucket, ...]:
    """``scatter_buckets``: the gradient scatters a "scatter" bucket may hold
    (:func:`disco.plans.check.scatterable`) in one "scatter" bucket per class and way of scattering
    (:func:`disco.plans.check.scatter_groups`: on a data x fsdp mesh those over "fsdp" and those over
    both axes), every other all-reduce in one "concat" bucket per class (as ``one_bucket``), in program
    order of their first members."""
    ok = scatterable(graph)
    if not ok:
        raise ValueError("baseline 'scatter_buckets': the graph has no gradient scatter a 'scatter' bucket may hold "
                         "(an all-reduce whose every user is a dynamic-slice keeping this device's block; a step "
                         "with parameters sharded over a mesh axis has them, see docs/guides/sharded-steps.md)")
    ars = graph.all_reduces()
    deps = all_reduce_dependencies(graph)
    everything = lambda i: 1 << 62  # noqa: E731
    how = scatter_groups(graph)
    ways: dict[tuple, list[Node]] = {}
    for n in ars:
        if n.name in ok:
            ways.setdefault(how[n.name], []).append(n)
    buckets = (tuple(b for way in ways.values() for b in _greedy(way, everything, build="scatter", deps=deps))
               + _greedy([n for n in ars if n.name not in ok], everything, deps=deps))
    order = {n.name: i for i, n in enumerate(ars)}
    return tuple(sorted(buckets, key=lambda b: order[b.members[0]]))


def _positive_size(name: str, key: str, value: Any) -> float:
    """``value`` as a positive finite number of MB, or ValueError naming the baseline and the key."""
    try:
        mb = float(value)
    except (TypeError, ValueError):
        mb = math.nan
    if isinstance(value, bool) or not 0 < mb < math.inf:
        raise ValueError(f"baseline {name!r}: {key} expected a positive number of MB, got {value!r}")
    return mb


def _positive_bytes(name: str, key: str, value: Any) -> int:
    """``value`` as a positive integer number of bytes, or ValueError naming the baseline and the key."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"baseline {name!r}: {key} expected a positive integer, got {value!r}")
    return value


def _bucket_count(name: str, key: str, value: Any) -> int:
    """``value`` as a bucket count (an integer >= 1), or ValueError naming the baseline and the key."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"baseline {name!r}: {key} is the bucket count, expected an integer >= 1, got {value!r}")
    return value


# -- --plans items ---------------------------------------------------------------------------------
class _Value(NamedTuple):
    """What the value of an item ``name:VALUE`` is: the keyword of :func:`make` it sets, its
    placeholder in messages, how it is read and how it is checked (as :func:`make` checks it)."""

    key: str
    placeholder: str
    read: Callable[[str], Any]
    check: Callable[[str, str, Any], Any]


_VALUES = {"horovod": _Value("threshold_mb", "MB", float, _positive_size),
           "ddp": _Value("cap_mb", "MB", float, _positive_size),
           "xla_threshold": _Value("threshold_bytes", "BYTES", int, _positive_bytes),
           "even": _Value("k", "K", int, _bucket_count),
           "prefetch": _Value("distance", "D", int, _bucket_count)}


@dataclasses.dataclass(frozen=True)
class BaselineItem:
    """One baseline item of a ``--plans`` list, read by :func:`parse_item`.

    Attributes:
      name: the baseline (one of :data:`NAMES`, :data:`GATHER_NAMES` or :data:`GPU_ITEMS`).
      options: the keywords of :func:`make` the item sets, as ``(key, value)`` pairs.
      row: its row name in tables and JSON: the item as written, but ``even_<k>`` for ``even:K``.
    """

    name: str
    options: tuple[tuple[str, Any], ...]
    row: str

    def make(self, graph: HloGraph) -> FusionPlan:
        """The item's plan for ``graph`` (:func:`make` with its options)."""
        return make(self.name, graph, **dict(self.options))


def parse_item(item: str) -> BaselineItem:
    """Reads a ``--plans`` baseline item: a name of :data:`NAMES`, :data:`GATHER_NAMES` or :data:`GPU_ITEMS`, or ``horovod:MB``,
    ``ddp:MB``, ``xla_threshold:BYTES``, ``even:K`` or ``prefetch[:D]`` (row ``prefetch_<d>``). The value is checked as :func:`make` checks it,
    before any graph is at hand (a launcher checks the items its workers will build); ``auto_pgle`` is
    refused here with :data:`AUTO_PGLE_OFF_GPU`.

    Example::

        >>> parse_item("even:4")
        BaselineItem(name='even', options=(('k', 4),), row='even_4')

    Raises:
      ValueError: for an unknown baseline (naming the valid ones), a value on a baseline that takes
        none, a value that is not a number, or one :func:`make` refuses; the message names the item.
    """
    name, colon, arg = item.partition(":")
    if name == "auto_pgle":
        raise ValueError(AUTO_PGLE_OFF_GPU)
    if name not in NAMES + GATHER_NAMES + GPU_ITEMS + ("prefetch",):
        raise ValueError(f"unknown plan {name!r}; expected a baseline ({', '.join(NAMES + GATHER_NAMES + GPU_ITEMS)}, "
                         "prefetch) "
                         "or a plan "
                         ".json file")
    if not colon:
        return BaselineItem(name, (("distance", 1),), "prefetch_1") if name == "prefetch" else BaselineItem(name, (), item)
    spec = _VALUES.get(name)
    if spec is None:
        *most, last = (f"{n}:{v.placeholder}" for n, v in _VALUES.items())
        raise ValueError(f"plan {item!r}: only {', '.join(most)} and {last} take a value")
    try:
        value = spec.read(arg)
    except ValueError:
        raise ValueError(f"plan {item!r}: expected a number after ':', got {arg!r}") from None
    try:
        value = spec.check(name, spec.key, value)
    except ValueError as e:
        raise ValueError(f"plan {item!r}: {e}") from None
    return BaselineItem(name, ((spec.key, value),), f"{name}_{value}" if name in ("even", "prefetch") else item)


def item_of_row(row: str) -> str:
    """The ``--plans`` item whose row (:func:`parse_item`) is ``row``: ``even_4`` -> ``even:4``, any
    other baseline row is its item (a launcher's workers report rows; this reads them back).

    Raises:
      ValueError: ``row`` is no baseline item's row.
    """
    kind, _, k = row.partition("_")
    item = f"{kind}:{k}" if kind in ("even", "prefetch") and k.isdigit() else row
    if parse_item(item).row != row:
        raise ValueError(f"{row!r} is not the row of a baseline item (expected e.g. ddp, horovod:64 or even_4)")
    return item


def make_all(graph: HloGraph, names: Sequence[str] = NAMES) -> dict[str, FusionPlan]:
    return {n: make(n, graph) for n in names}


def tuned_thresholds(graph: HloGraph) -> list[int]:
    """JAX-Toolbox's threshold sweep: powers of two from 16 MiB up to the first that holds every
    gradient (16 MiB alone when the gradients are smaller)."""
    total = sum(n.grad_bytes for n in graph.all_reduces())
    out = [TUNED_MIN_THRESHOLD]
    while out[-1] < total:
        out.append(out[-1] * 2)
    return out


def xla_tuned_sweep(graph: HloGraph) -> dict[str, FusionPlan]:
    """``xla_tuned`` at every threshold of :func:`tuned_thresholds`, by name."""
    plans = (make("xla_tuned", graph, threshold_bytes=t) for t in tuned_thresholds(graph))
    return {p.name: p for p in plans}

"""Constructive start points: the baselines, greedy producer fusion, reductions with their
elementwise neighbours, merged-gradient buckets, (CPU) reductions kept out of YNNPACK, and (a step
with sharded parameters) its parameter all-gathers in gather buckets, and prefetched a few layers ahead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from disco.ir.opcodes import FUSIBLE_OPCODES
from disco.plans import baselines
from disco.plans import moves
from disco.plans import options as plan_options
from disco.plans.plan import Bucket, FusionPlan

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph
    from disco.sim.simulator import Simulator


def _grow_producers(ctx: moves.MoveContext, root: int, taken: set[int], max_size: int,
                    admit: Callable[[int], bool] = lambda p: True) -> set[int]:
    """``root`` and the producers walked back from it that may share its group: fusible with a
    member (``ctx.fusible_nbrs``), not ``taken``, accepted by ``admit`` and with every user
    already inside (so the group's one output is ``root``); at most ``max_size`` ops."""
    succ, pred, nbrs = ctx.succ, ctx.pred, ctx.fusible_nbrs
    members = {root}
    frontier = [root]
    while frontier and len(members) < max_size:
        y = frontier.pop()
        ok = set(nbrs[y])
        for p in pred[y]:
            if (p in ok and p not in taken and p not in members and succ[p] and admit(p)
                    and all(u in members for u in succ[p])):
                members.add(p)
                frontier.append(p)
                if len(members) >= max_size:
                    break
    return members


def greedy_fusion(graph: HloGraph, ctx: moves.MoveContext | None = None, max_size: int = 64) -> FusionPlan:
    """Fuses every fusible producer into its consumer's group when all its users are in that group.

    Walks the graph from the end; each unassigned fusible op roots a group that takes in
    producers whose every user is already inside (XLA's loop fusion does the same), so
    every group has exactly one output: the root.

    Args:
      graph: the step's graph.
      ctx: its move context (built when None).
      max_size: the most ops in one group.

    Returns:
      A valid plan named "greedy_fusion" (no buckets: XLA's combiner).
    """
    ctx = ctx or moves.context(graph)
    taken: set[int] = set()
    groups: list[tuple[int, ...]] = []
    for root in reversed(ctx.fusible_nodes):
        if root in taken:
            continue
        members = _grow_producers(ctx, root, taken, max_size)
        if len(members) > 1:
            taken |= members
            groups.append(tuple(sorted(members)))
    groups.sort()
    names = ctx.names
    plan = FusionPlan(groups=tuple(tuple(names[i] for i in g) for g in groups), name="greedy_fusion")
    return plan.validate(graph)


def reduce_fusion(graph: HloGraph, ctx: moves.MoveContext | None = None, max_size: int = 16) -> FusionPlan:
    """Groups each reduce with its elementwise producers (or, when it has none, its one consumer).

    The pattern behind the fusion groups that measured faster on XLA:CPU (docs/archive/lab-notebook.md,
    "The zoo on CPU: op-fusion share and disco optimize vs the best baseline"): jaxlib 0.10.2 hands small reductions (LayerNorm/GroupNorm statistics, softmax
    sums) to YNNPACK one by one; in a planned group with their elementwise neighbours they go
    into XLA's loop fusions instead. Walking from the reduce, a producer joins when it may share
    a group with a member (``ctx.fusible_nbrs``), is elementwise or a reduce's operand (in
    ``FUSIBLE_OPCODES``, no second reduce) and every one of its users is already inside, so each
    group has one output: the reduce (or its consumer). A reduce with no such producer takes
    its consumer instead when that is its only user and is fusible with it.

    Args:
      graph: the step's graph.
      ctx: its move context (built when None).
      max_size: the most ops in one group.

    Returns:
      A valid plan named "reduce_fusion" (no buckets: XLA's combiner); groups that would make
      the plan invalid together are left out.
    """
    ctx = ctx or moves.context(graph)
    nodes = graph.nodes
    succ, nbrs = ctx.succ, ctx.fusible_nbrs
    taken: set[int] = set()
    groups: list[tuple[int, ...]] = []
    for r in reversed(ctx.fusible_nodes):
        if nodes[r].opcode != "reduce" or r in taken:
            continue
        members = _grow_producers(ctx, r, taken, max_size, admit=lambda p: (
            nodes[p].opcode in FUSIBLE_OPCODES and nodes[p].opcode not in ("reduce", "constant")))
        if len(members) == 1 and len(succ[r]) == 1:
            c = succ[r][0]
            if c in nbrs[r] and c not in taken and nodes[c].opcode != "reduce":
                members.add(c)
        if len(members) > 1:
            taken |= members
            groups.append(tuple(sorted(members)))
    groups.sort()
    names = ctx.names
    named = [tuple(names[i] for i in g) for g in groups]
    plan = FusionPlan(groups=tuple(named), name="reduce_fusion")
    try:
        return plan.validate(graph)
    except ValueError:  # keep the groups that are valid together, in order
        kept: list[tuple[str, ...]] = []
        for g in named:
            try:
                FusionPlan(groups=(*kept, g)).validate(graph)
            except ValueError:
                continue
            kept.append(g)
        return FusionPlan(groups=tuple(kept), name="reduce_fusion").validate(graph)


def ynn_no_reduce(plan: FusionPlan) -> FusionPlan:
    """``plan`` with XLA:CPU's reductions kept out of YNNPACK (the CPU option table's choice)."""
    return _with_table_option(plan, plan_options.YNN_FUSION_TYPE, "cpu", plan_options.YNN_NO_REDUCE, "ynn_no_reduce")


def _with_table_option(plan: FusionPlan, key: str, backend: str, value: str, suffix: str) -> FusionPlan:
    """``plan`` with the option table's ``key`` set to ``value``, named ``<name>+<suffix>``."""
    opt = plan_options.spec(key, backend)
    if opt is None:
        raise ValueError(f"compile option {key!r} is not in the {backend} option table (disco.plans.options)")
    return moves.with_option(plan, opt, value).replace(name=f"{plan.name}+{suffix}")


class _FreeCollectives:
    """A cost model's kernel times with free collectives: the compute stream on its own."""

    def __init__(self, costs):
        self.costs = costs

    def kernel_time(self, kernel):
        return self.costs.kernel_time(kernel)

    def collective_time(self, kind, nbytes, cluster):
        return 0.0


def _ready_times(sim: Simulator, plan: FusionPlan) -> dict[int, float]:
    """Per all-reduce node: when its inputs are computed if communication took no time.

    (With real collective times the in-order compute stream waits for earlier
    all-reduces, which would make the gaps between gradients look like communication.)
    """
    from disco.sim.simulator import Simulator

    graph = sim.graph
    idx = graph.name_index()
    n = len(graph.nodes)
    end = [-1.0] * n
    free = Simulator(graph, _FreeCollectives(sim.costs), sim.cluster)  # type: ignore[arg-type]
    for ev in free.run(plan).timeline:
        if ev.stream == "compute":
            for m in ev.members:
                end[idx[m]] = ev.end
    pred = graph.operands_of()
    finish = [0.0] * n
    for i in range(n):
        finish[i] = end[i] if end[i] >= 0 else max((finish[p] for p in pred[i]), default=0.0)
    return {i: max((finish[p] for p in pred[i]), default=0.0) for i in range(n) if graph.nodes[i].is_all_reduce}


def bucket_runs(ready: Sequence[float], sizes: Sequence[int], masks: Sequence[int], reach: Sequence[int],
                seconds: Callable[[int], float], *, stop: bool = True) -> list[tuple[int, int]]:
    """The runs of consecutive gradients whose buckets end soonest (:func:`merged_gradient_buckets`'s
    dynamic programme), as ``(lo, hi)`` slices in order.

    Gradient ``k`` (in the order they are ready) is ready at ``ready[k]`` (non-decreasing), has
    ``sizes[k]`` bytes, its all-reduce's bit ``masks[k]`` and the bits of the all-reduces it depends
    on, ``reach[k]``; a run's bucket starts when its last gradient is ready and the previous bucket
    has ended, and lasts ``seconds(its bytes)``. A run holding an all-reduce that depends on another
    of it is never formed.

    With ``stop`` the search over the runs ending at a gradient stops once a longer run cannot end
    sooner: it starts no earlier than the gradient is ready and, for a ``seconds`` that does not fall
    as bytes grow (every cost model's alpha-beta formula, :mod:`disco.sim.collectives`), lasts no
    less. That turns the programme's O(m^2) cost model calls into about O(m) where buckets stay
    small (3,300 gradients: 7.5 s -> 1.0 s, on CPU); the runs are the same (tested against
    ``stop=False``).
    """
    m = len(ready)
    best = [0.0] * (m + 1)  # best[j]: earliest end of the last bucket covering the first j
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        best[j] = float("inf")
        nbytes = 0
        mask = down = 0
        last = ready[j - 1]
        for i in range(j, 0, -1):  # the run [i - 1, j)
            mask |= masks[i - 1]
            down |= reach[i - 1]
            if down & mask:
                break  # an all-reduce of the run depends on another: no bigger run works
            nbytes += sizes[i - 1]
            t = seconds(nbytes)
            end = max(last, best[i - 1]) + t
            if end < best[j]:
                best[j], cut[j] = end, i - 1
            if stop and last + t >= best[j]:
                break  # every longer run ends at last + t or later (the floats too: rounding is monotone)
    runs = []
    j = m
    while j > 0:
        runs.append((cut[j], j))
        j = cut[j]
    return runs[::-1]


def merged_gradient_buckets(sim: Simulator, ctx: moves.MoveContext | None = None,
                            groups: Sequence[Sequence[str]] = ()) -> FusionPlan:
    """Buckets chosen against the simulated timeline (MG-WFBP's idea, solved exactly by DP).

    Gradients are ordered by when the simulated backward pass (one all-reduce per
    gradient, ``groups`` fused) produces them. Per bucket class, a bucket is a run of
    consecutive gradients; it starts when its last gradient is ready and the
    communication stream is free, and lasts the cost model's all-reduce time for its
    bytes. A dynamic programme over the runs minimises when the last bucket ends, so
    a gradient is merged into the next bucket exactly when sending it alone would not
    pay for its start-up cost. Runs whose all-reduces depend on each other are skipped.

    Args:
      sim: the simulator (its graph, cost model and cluster).
      ctx: the graph's move context (built when None).
      groups: op groups to simulate the backward pass with (and to keep in the plan).

    Returns:
      A valid plan named "merged_gradient".
    """
    graph = sim.graph
    ctx = ctx or moves.context(graph)
    base = FusionPlan(groups=tuple(tuple(g) for g in groups),
                      buckets=tuple(Bucket((n.name,)) for n in graph.all_reduces()))
    ready = _ready_times(sim, base)
    by_class: dict[int, list[int]] = {}
    for a in sorted(ready, key=lambda a: (ready[a], a)):
        by_class.setdefault(ctx.ar_class[a], []).append(a)
    nodes = graph.nodes
    bit, reach = ctx.ar_bit, ctx.ar_reach
    seconds: dict[int, float] = {}  # the cost model's all-reduce time, by bytes (one class's sums recur)

    def allreduce(nbytes: int) -> float:
        t = seconds.get(nbytes)
        if t is None:
            t = seconds[nbytes] = sim.costs.collective_time("all-reduce", nbytes, sim.cluster)
        return t

    buckets: list[tuple[int, ...]] = []
    for ars in by_class.values():
        runs = bucket_runs([ready[a] for a in ars], [nodes[a].out_bytes for a in ars],
                           [1 << bit[a] for a in ars], [reach[a] for a in ars], allreduce)
        buckets += [tuple(sorted(ars[lo:hi])) for lo, hi in runs]
    buckets.sort()
    names = ctx.names
    plan = FusionPlan(groups=base.groups,
                      buckets=tuple(Bucket(tuple(names[i] for i in b)) for b in buckets),
                      name="merged_gradient")
    return plan.validate(graph)


def default_starts(graph: HloGraph, sim: Simulator | None = None,
                   ctx: moves.MoveContext | None = None) -> list[FusionPlan]:
    """Every baseline, greedy fusion, and (with a simulator) merged-gradient buckets with and without it.

    On CPU also :func:`reduce_fusion` and XLA's default with reductions kept out of YNNPACK
    (:func:`ynn_no_reduce`): the two forms of the one pattern measured to win there. For a graph
    with parameter all-gathers (``ctx.gather_class``: a step with sharded parameters) also the
    gather-bucket baselines ``one_gather_bucket`` and ``per_layer_gathers``, the prefetch distances
    ``prefetch_1`` and ``prefetch_2`` (:data:`~disco.plans.baselines.PREFETCH_DISTANCES`) and
    ``per_layer_gathers+prefetch_1`` (FSDP2's per-layer buckets with the next layer prefetched), last. For a GPU
    context (``ctx.backend``) the plans with fusion groups are left out, and the ``xla_tuned``
    sweep and every start with several buckets with the latency-hiding scheduler on
    (:func:`_with_scheduler`) are added.

    Returns:
      Valid plans, named for where they come from.
    """
    ctx = ctx or moves.context(graph)
    starts = list(baselines.make_all(graph).values())
    starts.append(baselines.make("horovod", graph, threshold_mb=128))
    fused = greedy_fusion(graph, ctx)
    starts.append(fused)
    if ctx.backend == "cpu":
        reduced = reduce_fusion(graph, ctx)
        if reduced.groups:
            starts.append(reduced)
        starts.append(ynn_no_reduce(baselines.make("xla_default", graph)))
    if sim is not None and graph.all_reduces():
        starts.append(merged_gradient_buckets(sim, ctx))
        mg = merged_gradient_buckets(sim, ctx, fused.groups)
        starts.append(mg.replace(name="greedy_fusion+merged_gradient"))
    for p in list(starts):
        if p.buckets is not None and fused.groups and not p.groups:
            joint = p.replace(groups=fused.groups, name=f"greedy_fusion+{p.name}")
            try:
                starts.append(joint.validate(graph))
            except ValueError:
                pass  # a group and a bucket close a cycle together: leave this pair out
    if ctx.backend == "gpu":
        starts = [p for p in starts if not p.groups]
        starts += [_with_scheduler(p) for p in starts if p.buckets is not None and len(p.buckets) > 1]
        starts += list(baselines.xla_tuned_sweep(graph).values())
    if ctx.gather_class or baselines.loop_gather_buckets(graph):  # gathers outside loops or in their bodies
        starts += [baselines.make(name, graph) for name in baselines.GATHER_NAMES]
        per_layer = next(p for p in starts if p.name == "per_layer_gathers")
        for d in baselines.PREFETCH_DISTANCES:  # each layer gathered d layers before its use
            try:
                prefetch = baselines.make("prefetch", graph, distance=d)
            except ValueError:
                continue  # no first use to anchor on
            starts.append(prefetch)
            if d == 1:  # FSDP2's shape: a bucket per layer, the next layer's gathered while one computes
                joint = prefetch.replace(gather_buckets=per_layer.gather_buckets, name="per_layer_gathers+prefetch_1")
                try:
                    starts.append(joint.validate(graph))
                except ValueError:
                    pass  # a layer's bucket would wait on its own use
    if ctx.ar_scatterable:  # a sharded step's gradient scatters: as reduce-scatters
        starts += [baselines.make(name, graph) for name in baselines.SCATTER_NAMES]
    return starts


def _with_scheduler(plan: FusionPlan) -> FusionPlan:
    """``plan`` with XLA:GPU's latency-hiding scheduler on (name ``<name>+lhs``).

    The scheduler can overlap an all-reduce only with compute it does not wait on, so it pays
    when the gradients go in several all-reduces. A plan needs both changes at once to gain:
    several buckets alone start communication earlier but (scheduler off) do not overlap it, so
    they price worse than one bucket (bert tiny on h100-sxm-8: one bucket 264.1 us, even_2
    278.1 us, beyond the best-first search's 5% tolerance), and the scheduler alone has nothing
    to overlap.
    """
    return _with_table_option(plan, plan_options.SCHEDULER, "gpu", "True", "lhs")

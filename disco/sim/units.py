"""Units: the kernels and collectives a plan compiles to, and the plan-independent data per fusion mode.

A graph node is *virtual* (a zero-cost op, :data:`disco.ir.opcodes.ZERO_COST_OPCODES`: it takes no
time and only passes dependencies through), a *kernel* op, or a *collective*. A :class:`Mode` holds,
for one ``xla_fusion`` mode, the adjacency with virtual nodes folded away and the *base units*: the
kernels and collectives of the plan without groups or buckets. :class:`UnitBuilder` makes units,
cached by their members, pricing a kernel with the cost model and a collective with the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from disco.ir.opcodes import COLLECTIVE_KIND, ZERO_COST_OPCODES
from disco.ir.replica_groups import replica_group_lists
from disco.sim.collectives import over_group

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph, Node
    from disco.sim.cluster import ClusterSpec
    from disco.sim.costs import CostModel, GraphKernels

# What a node is.
VIRTUAL, KERNEL, COLL = 0, 1, 2
# What a cached unit is: a kernel, a collective, or a variadic (tuple / XLA-combined) all-reduce,
# or a reduce-scatter plus all-gather ("rs_ag" bucket), or a reduce-scatter ("scatter" bucket; then an
# all-reduce of the shard where two or more devices keep each block).
UNIT_KERNEL, UNIT_COLL, UNIT_VARIADIC, UNIT_RS_AG, UNIT_SCATTER = 0, 1, 2, 3, 4
BUILD_UNIT = {"concat": UNIT_COLL, "tuple": UNIT_VARIADIC, "rs_ag": UNIT_RS_AG, "scatter": UNIT_SCATTER}
# Units a bucket of one all-reduce still changes (a "concat" or "tuple" bucket of one is the all-reduce).
REBUILT_UNITS = frozenset({UNIT_RS_AG, UNIT_SCATTER})


def node_kinds(nodes: Sequence[Node]) -> list[int]:
    """Per node: COLL (a collective), VIRTUAL (a zero-cost op) or KERNEL."""
    return [COLL if node.opcode in COLLECTIVE_KIND else VIRTUAL if node.opcode in ZERO_COST_OPCODES else KERNEL
            for node in nodes]


def group_producers(groups: Sequence[tuple[int, ...]]) -> tuple[dict[int, int], list[tuple[int, tuple[int, ...], bool]]]:
    """Where a fusion emulation starts from its planned groups.

    Returns:
      (gid, items): node -> index of its group, and one producer item per group,
      ``(last member, members, True)``; the emulation adds its single nodes as ``(node, (node,), False)``.
    """
    gid: dict[int, int] = {}
    items: list[tuple[int, tuple[int, ...], bool]] = []
    for gi, g in enumerate(groups):
        for m in g:
            gid[m] = gi
        items.append((g[-1], g, True))
    return gid, items


class FusionEmulation(Protocol):
    """What a backend's fusion emulation gives a mode (see :mod:`disco.sim.cpu_fusion`).

    Attributes:
      duplicated: kernel nodes the backend duplicates into every consumer (they become virtual).
    """

    duplicated: frozenset[int]

    def clusters(self, region: list[int], groups: list[tuple[int, ...]],
                 cuts: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[int, ...]]:
        """The backend's fusions of ``region`` (sorted real compute nodes), ``groups`` pre-fused,
        no producer fused into a user it is cut from (``cuts``: (producer, user) node pairs)."""
        ...


class Unit:
    """A kernel or collective of one contracted plan (internal; cached across plans).

    ``succ`` lists (node, count) pairs: for each real node outside the unit that reads it, how
    many of the unit's members it reads; ``preds`` lists the outside real input of each of the
    unit's (member, outside real input) pairs and ``indeg`` counts them, so a unit is ready when
    every pair has been released.

    A plan's gather anchors (``FusionPlan.gather_after``) add dependencies no graph edge has: the
    units at their two ends run as copies (:func:`waited`) whose ``extra`` names the added inputs
    and readers and whose ``orig`` is the unit copied; ``extra`` is part of a unit's identity.
    """

    __slots__ = ("is_coll", "members", "dur", "prio", "succ", "preds", "indeg", "groups", "name", "extra", "orig")

    def __init__(self, is_coll: bool, members: tuple[int, ...], dur: float, succ: tuple[tuple[int, int], ...],
                 preds: tuple[int, ...], name: str, groups: tuple[tuple[str, ...], ...] = ()):
        self.is_coll = is_coll
        self.members = members  # sorted node indices (real nodes only)
        self.dur = dur
        self.prio = members[0]  # program position: its first member
        self.succ = succ
        self.preds = preds
        self.indeg = len(preds)
        self.name = name  # the label of a unit that is not a planned group or a bucket
        self.groups = groups  # the planned groups (by names) it contains
        self.extra: tuple = ()  # (added inputs, added (reader, count) pairs) of a waited copy
        self.orig: Unit | None = None  # the unit a waited copy copies


def waited(u: Unit, preds: tuple[int, ...], succ: tuple[tuple[int, int], ...]) -> Unit:
    """A copy of ``u`` that also waits for the real nodes ``preds`` (one input pair each) and releases
    ``succ`` ((node, count) pairs added to its readers): the two ends of a gather anchor's dependency."""
    merged = dict(u.succ)
    for node, count in succ:
        merged[node] = merged.get(node, 0) + count
    w = Unit(u.is_coll, u.members, u.dur, tuple(merged.items()), u.preds + preds, u.name, u.groups)
    w.extra = (preds, succ)
    w.orig = u
    return w


def unit_key(u: Unit) -> tuple:
    """What makes two units schedule alike: kind, members, duration and added dependencies."""
    return (u.is_coll, u.members, u.dur, u.extra)


class Mode:
    """Plan-independent data for one ``xla_fusion`` mode: folded adjacency and the base units."""

    __slots__ = ("fusion", "virtual", "through", "rp", "rs", "inline", "cluster_of", "clusters", "units", "unit_of",
                 "dur", "key", "succ", "coll", "indeg", "ready_k", "ready_c", "kernel_total", "comm_total",
                 "ar_unit")


def rs_ag_time(costs: CostModel, nbytes: float, cluster: ClusterSpec) -> float:
    """An "rs_ag" bucket's time: a reduce-scatter followed by an all-gather of the same bytes,
    times the cluster's ``rs_ag_scale`` (measured by a calibration; 1.0 elsewhere)."""
    return cluster.rs_ag_scale * (costs.collective_time("reduce-scatter", nbytes, cluster)
                                  + costs.collective_time("all-gather", nbytes, cluster))


def scatter_time(costs: CostModel, nbytes: float, way: ScatterWay) -> float:
    """A "scatter" bucket's time: a reduce-scatter of its members' whole ``nbytes`` over a scatter group,
    then, where two or more devices keep each block (a data x fsdp mesh's gradients reduced over both
    axes), an all-reduce of the ``1 / k`` shard over the devices keeping one block."""
    rs = costs.collective_time("reduce-scatter", nbytes, way.scatter_over)
    return rs if way.across_over is None else rs + costs.collective_time("all-reduce", nbytes / way.blocks,
                                                                         way.across_over)


class ScatterWay(NamedTuple):
    """How a gradient scatter's "scatter" bucket runs (:class:`disco.ir.scatter_blocks.ScatterBlock`):
    the cluster of one of its scatter groups, of one of its across groups (None without them) and the
    blocks ``k``."""

    scatter_over: ClusterSpec
    across_over: ClusterSpec | None
    blocks: int


class UnitBuilder:
    """Makes the units of one graph, cached by (mode, unit kind, members) across plans.

    Args:
      graph: the graph.
      costs: the cost model (kernel and collective times).
      cluster: the cluster (``compute_speed``, collective costs, ``operand_latency``).
      kernels: the graph's adjacency.
      cbytes: per node, the bytes a collective moves (0 for other nodes).
      loop_time: ``(node index, fusion mode) -> seconds`` of a ``while`` node (all its
        iterations), or None for a node it does not price; such nodes, and every node when
        ``loop_time`` is None, are priced by ``costs``.
    """

    def __init__(self, graph: HloGraph, costs: CostModel, cluster: ClusterSpec, kernels: GraphKernels,
                 cbytes: list[int], loop_time: Callable[[int, str], float | None] | None = None):
        self.graph = graph
        self.loop_time = loop_time
        self.costs = costs
        self.cluster = cluster
        self.kernels = kernels
        self._cbytes = cbytes
        self._kernel_cache: dict[tuple[bool, tuple[int, ...]], float] = {}
        self._group_clusters: dict[str | None, ClusterSpec] = {}  # replica groups text -> the cluster of one group
        self._blocks: dict[str, tuple] | None = None  # gradient scatter name -> (scatter groups, across groups)
        self.unit_cache: dict[tuple[str, int, tuple[int, ...]], Unit] = {}  # (fusion, UNIT_*, members)

    def group_cluster(self, node: int) -> ClusterSpec:
        """The cluster a collective node runs over (:func:`disco.sim.collectives.over_group`): one of
        its replica groups' devices where it has several, else the whole cluster."""
        text = self.graph.nodes[node].replica_groups
        c = self._group_clusters.get(text)
        if c is None:
            c = self._group_clusters[text] = over_group(self.cluster, replica_group_lists(text))
        return c

    def scatter_way(self, node: int) -> ScatterWay:
        """How a "scatter" bucket whose first member is ``node`` runs (a bucket's members scatter alike):
        over its replica groups when each block is kept by one device, else over its scatter groups and
        then its across groups (:func:`disco.plans.check.scatter_groups`)."""
        if self._blocks is None:
            self._blocks = {b.all_reduce: (b.scatter_groups, b.across_groups)
                            for b in self.graph.scatter_blocks if b.dim is not None}
        scatter, across = self._blocks.get(self.graph.nodes[node].name, ((), ()))
        if not across:  # as the all-reduce's groups: one device per block
            return ScatterWay(self.group_cluster(node), None, len(scatter[0]) if scatter else 0)
        return ScatterWay(over_group(self.cluster, scatter), over_group(self.cluster, across), len(scatter[0]))

    @property
    def cbytes(self) -> list[int]:
        """Per node, the bytes a collective moves (0 for other nodes)."""
        return self._cbytes

    def links(self, mode: Mode, members: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        """(succ, preds) of a unit of ``members`` (see :class:`Unit`)."""
        mset = set(members)
        rp, rs = mode.rp, mode.rs
        preds: list[int] = []
        succ: dict[int, int] = {}
        for m in members:
            for p in rp[m]:
                if p not in mset:
                    preds.append(p)
            for s in rs[m]:
                if s not in mset:
                    succ[s] = succ.get(s, 0) + 1
        return tuple(succ.items()), tuple(preds)

    def kernel_unit(self, mode: Mode, members: tuple[int, ...],
                     groups: tuple[tuple[str, ...], ...] = ()) -> Unit:
        key = (mode.fusion, UNIT_KERNEL, members)
        u = self.unit_cache.get(key)
        if u is None:
            inl = sorted({d for m in members for d in mode.inline[m]})
            ck = (bool(inl), members)
            dur = self._kernel_cache.get(ck)
            if dur is None and self.loop_time is not None and len(members) == 1:
                # A while loop: all its iterations' kernels; they depend on the mode (not cached by ck).
                dur = self.loop_time(members[0], mode.fusion)
            if dur is None:
                dur = self.costs.kernel_time(self.kernels.kernel(members, inl)) / self.cluster.compute_speed
                self._kernel_cache[ck] = dur
            succ, preds = self.links(mode, members)
            names = self.graph.nodes
            name = names[members[0]].name if len(members) == 1 else f"xla_fusion({names[members[-1]].name})"
            u = Unit(False, members, dur, succ, preds, name)
            self.unit_cache[key] = u
        if groups and u.groups != groups:  # the same members, labelled by other groups
            u = Unit(False, u.members, u.dur, u.succ, u.preds, u.name, groups)
        return u

    def coll_unit(self, mode: Mode, members: tuple[int, ...], kind: str, variadic: bool = False,
                   unit: int | None = None) -> Unit:
        """One collective over ``members``; ``variadic`` (XLA's combined or a "tuple" bucket) adds the
        cluster's ``operand_latency`` for each operand after the first (on more than one device); ``unit=UNIT_RS_AG`` (an
        "rs_ag" bucket) prices it as a reduce-scatter followed by an all-gather of the same bytes, ``unit=UNIT_SCATTER``
        (a "scatter" bucket of gradient scatters) as one reduce-scatter of the members' summed (whole) bytes, then
        (where two or more devices keep each block) one all-reduce of ``1 / k`` of them (:func:`scatter_time`)."""
        unit = unit if unit is not None else (UNIT_VARIADIC if variadic else UNIT_COLL)
        key = (mode.fusion, unit, members)
        u = self.unit_cache.get(key)
        if u is None:
            nbytes = sum(self._cbytes[m] for m in members)
            over = self.group_cluster(members[0])  # a bucket's members share their replica groups
            if unit == UNIT_RS_AG:
                dur = rs_ag_time(self.costs, nbytes, over)
            elif unit == UNIT_SCATTER:
                dur = scatter_time(self.costs, nbytes, self.scatter_way(members[0]))
            else:
                dur = self.costs.collective_time(kind, nbytes, over)
            if unit == UNIT_VARIADIC and over.num_devices > 1:  # one device: every collective is free
                dur += self.cluster.operand_latency * (len(members) - 1)
            succ, preds = self.links(mode, members)
            u = Unit(True, members, dur, succ, preds, self.graph.nodes[members[0]].name)
            self.unit_cache[key] = u
        return u


def build_mode(builder: UnitBuilder, fusion: str, kind: Sequence[int], ar_set: frozenset[int],
               emulation: FusionEmulation | None) -> Mode:
    """The base units of ``fusion`` mode: ``emulation``'s fusions of the whole graph (None: a kernel per op)."""
    n = len(kind)
    raw_p = builder.kernels.preds
    dup = emulation.duplicated if emulation is not None else frozenset()
    virtual = [kind[i] == VIRTUAL or i in dup for i in range(n)]
    # Real preds: fold virtual nodes away (transitively). Node order is topological.
    through: list[frozenset[int]] = [frozenset()] * n
    rp: list[tuple[int, ...]] = [()] * n
    inline: list[tuple[int, ...]] = [()] * n  # duplicated broadcasts each node recomputes
    inl_through: list[frozenset[int]] = [frozenset()] * n
    for i in range(n):
        acc: set[int] = set()
        inl: set[int] = set()
        for p in raw_p[i]:
            if virtual[p]:
                acc |= through[p]
                if p in dup:
                    inl.add(p)
                    inl |= inl_through[p]
            else:
                acc.add(p)
        if virtual[i]:
            through[i] = frozenset(acc)
            if i in dup:
                inl_through[i] = frozenset(inl)
        else:
            rp[i] = tuple(sorted(acc))
            inline[i] = tuple(sorted(inl))
    rs_l: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for p in rp[i]:
            rs_l[p].append(i)
    mode = Mode()
    mode.fusion = fusion
    mode.virtual = virtual
    mode.through = through  # per virtual node, the real nodes it passes on
    mode.rp = rp
    mode.rs = [tuple(s) for s in rs_l]
    mode.inline = inline
    real_kernels = [i for i in range(n) if kind[i] == KERNEL and not virtual[i]]
    if emulation is not None:
        clusters = emulation.clusters(real_kernels, [])
    else:
        clusters = [(i,) for i in real_kernels]
    mode.clusters = clusters
    mode.cluster_of = [-1] * n
    for ci, c in enumerate(clusters):
        for m in c:
            mode.cluster_of[m] = ci
    units = [builder.kernel_unit(mode, c) for c in clusters]
    mode.ar_unit = {}
    for i in range(n):
        if kind[i] == COLL:
            if i in ar_set:
                mode.ar_unit[i] = len(units)
            units.append(builder.coll_unit(mode, (i,), COLLECTIVE_KIND[builder.graph.nodes[i].opcode]))
    mode.units = units
    mode.unit_of = [-1] * n
    for ui, u in enumerate(units):
        for m in u.members:
            mode.unit_of[m] = ui
    mode.dur = [u.dur for u in units]
    mode.key = [u.prio for u in units]
    mode.succ = [u.succ for u in units]
    mode.coll = [u.is_coll for u in units]
    mode.indeg = [u.indeg for u in units]
    mode.ready_k = [ui for ui, u in enumerate(units) if u.indeg == 0 and not u.is_coll]
    mode.ready_c = [ui for ui, u in enumerate(units) if u.indeg == 0 and u.is_coll]
    mode.kernel_total = sum(u.dur for u in units if not u.is_coll)
    mode.comm_total = sum(u.dur for u in units if u.is_coll)
    return mode

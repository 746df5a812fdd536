"""A two-stream list-scheduling simulator of one data-parallel training step.

``simulate(graph, plan, costs, cluster)`` predicts the step time of ``graph``
compiled with ``plan``:

1. **Kernels.** Zero-cost ops (``disco.sim.costs.ZERO_COST_OPCODES``: parameters,
   constants, tuple plumbing, bitcasts, inlined calls) are not kernels: they take no
   time and only pass dependencies through. The other compute ops are contracted into
   kernels according to ``plan.xla_fusion``:

   - ``"off"``: each of ``plan.groups`` is one kernel; every other compute op is a
     kernel of one (XLA's fusion pass is disabled).
   - ``"extend"`` (XLA's fusion pass runs after ours): an emulation of XLA:CPU's loop
     fusion. Producers are visited consumers-first (descending program position). A
     loop-fusible producer (``XLA_CPU_LOOP_OPCODES``: elementwise ops, broadcast, reshape,
     transpose, slice, concatenate, reduce, ...; or a planned group, which is a loop
     fusion) is fused into its users' fusion when all its users are loop-fusible and
     already in one and the same fusion, and its value is not read by a zero-cost op
     (tuple, get-tuple-element, call: a step output) or a collective; otherwise it
     roots a fusion of its own. A broadcast whose users are all loop-fusible is
     duplicated into each consumer (it becomes part of every consumer's kernel: its
     inputs are read there, its result is never written; ``XLA_CPU_DUPLICATED_OPCODES``).
     Dots, convolutions, custom calls, scatters and collectives are never fused (XLA:CPU
     runs dots and convolutions as library calls). Planned groups are pre-fused before
     the pass, so XLA grows them by the same rule. Every fusion has one root that all its
     members reach, so contracting it never adds a dependency between outside ops.

   A kernel's time is ``costs.kernel_time(kernel) / cluster.compute_speed``; a fused
   kernel's traffic is the bytes it reads from outside plus the bytes of its members
   read outside (``disco.sim.costs.GraphKernels.kernel``).
2. **Collectives.** Each of ``plan.buckets`` becomes one all-reduce of the members'
   summed bytes (``costs.collective_time("all-reduce", bytes, cluster)``); all-reduces
   in no bucket are one collective each. ``buckets=None`` models XLA's combiner: all
   all-reduces in one bucket; where some all-reduces depend on others (so one bucket
   would deadlock), one bucket per *level* (the number of all-reduces on the longest
   chain of all-reduces above it). Other collectives are one collective each.
3. **Two streams, ready-list scheduling.** A *compute stream* runs kernels one at a
   time; a *communication stream* runs collectives one at a time. A unit is *ready* at
   the time the last of its inputs (kernels and collectives) ends.

   - Whenever the compute stream is free (time ``t``), it starts the kernel that is
     ready by ``t`` with the smallest priority key; if none is ready it idles until the
     next kernel becomes ready. A kernel waiting for a collective never blocks ready
     kernels after it (XLA:CPU's thunk executor runs any ready thunk; XLA:GPU's
     latency-hiding scheduler moves the consumers of asynchronous collectives late).
   - ``order="program"`` (default): the key is the program position (the kernel's
     first member in ``graph.nodes``). ``order="topological"``: the key is the longest
     remaining path to the end of the step (its own time plus the longest chain of
     kernel and collective times after it), longest first, ties by program position.
   - A collective starts at ``max(ready, comm stream free)``; collectives are served
     first come, first served (by ready time, ties by program position). When the
     comm stream's next start and the compute stream's next start coincide, the
     collective is placed first.
4. **Result.** ``step_time`` is when the last kernel or collective ends;
   ``compute_time``/``comm_time`` are the summed kernel/collective durations;
   ``exposed_comm = step_time - compute_time`` is the time the compute stream sat
   idle (waiting for collectives, or for the last collectives after the last kernel).

Performance: :class:`Simulator` precomputes, per fusion mode, the kernels of the plan
without groups (XLA's fusion of the whole graph for "extend", computed once in the
constructor), their successor lists and input counts in flat arrays. A plan is a patch
of that: its groups (in "extend": each set of XLA fusions its groups touch, re-fused
with the groups pre-fused; cached per set of groups) and buckets replace some units.
Kernel times are cached per member set. ``Simulator.step_time`` then costs one
O(U log U) heap sweep over the U units; ``Simulator.run`` also builds the timeline and
critical path.

Example:
  >>> from disco.sim.simulator import Simulator
  >>> sim = Simulator(graph, AnalyticCosts(), preset("local"))  # doctest: +SKIP
  >>> sim.step_time(plan), sim.run(plan).to_chrome_trace()        # doctest: +SKIP
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from disco.ir.opcodes import (ALL_REDUCE_OPCODES, COLLECTIVE_KIND, FUSIBLE_OPCODES, XLA_CPU_DUPLICATED_OPCODES,
                              XLA_CPU_LOOP_OPCODES, ZERO_COST_OPCODES)
from disco.sim import gpu_fusion
from disco.sim.costs import CostModel, GraphKernels

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.ir.graph import HloGraph
    from disco.plans.plan import FusionPlan

Order = Literal["program", "topological"]
ORDERS: tuple[str, ...] = ("program", "topological")
# What a cached unit is: a kernel, a collective, or a variadic (tuple / XLA-combined) all-reduce.
_UNIT_KERNEL, _UNIT_COLL, _UNIT_VARIADIC, _UNIT_RS_AG = 0, 1, 2, 3
_BUILD_UNIT = {"concat": _UNIT_COLL, "tuple": _UNIT_VARIADIC, "rs_ag": _UNIT_RS_AG}
_INF = float("inf")
_VIRTUAL, _KERNEL, _COLL = 0, 1, 2

# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Event:
    """One kernel or collective on the timeline.

    Attributes:
      name: the label: an instruction name, "fusion.<i>", "bucket.<i>" or "combined.<level>".
      stream: "compute" or "comm".
      start: seconds from the step's start.
      end: seconds from the step's start.
      members: the instruction names it runs.
    """

    name: str
    stream: str
    start: float
    end: float
    members: tuple[str, ...]

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What one simulated step looks like.

    Attributes:
      step_time: seconds until the last kernel or collective ends.
      compute_time: summed kernel durations.
      comm_time: summed collective durations.
      exposed_comm: ``step_time - compute_time``: compute-stream idle time.
      critical_path: labels of the chain of events that determines ``step_time``, first to last.
      timeline: every event, in the order the simulator placed them.
    """

    step_time: float
    compute_time: float
    comm_time: float
    exposed_comm: float
    critical_path: tuple[str, ...] = ()
    timeline: tuple[Event, ...] = ()

    def to_chrome_trace(self) -> dict[str, Any]:
        """The timeline in Chrome trace event format (loadable by Perfetto and chrome://tracing).

        Returns:
          ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`` with one
          complete ("X") event per kernel/collective, ``ts``/``dur`` in microseconds,
          pid 0, tid 0 for the compute stream and tid 1 for the comm stream, plus
          metadata ("M") events naming them.
        """
        tids = {"compute": 0, "comm": 1}
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "disco simulated step"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "compute"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "comm"}},
        ]
        for ev in self.timeline:
            events.append({"name": ev.name, "cat": ev.stream, "ph": "X", "pid": 0, "tid": tids[ev.stream],
                           "ts": ev.start * 1e6, "dur": (ev.end - ev.start) * 1e6,
                           "args": {"members": list(ev.members)}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"step_time_s": self.step_time, "compute_time_s": self.compute_time,
                              "comm_time_s": self.comm_time, "exposed_comm_s": self.exposed_comm}}

    def to_chrome_trace_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_chrome_trace(), indent=indent)

    def summary(self) -> dict[str, float]:
        return {"step_time": self.step_time, "compute_time": self.compute_time,
                "comm_time": self.comm_time, "exposed_comm": self.exposed_comm}


# ---------------------------------------------------------------------------------------------
class _Unit:
    """A kernel or collective of one contracted plan (internal; cached across plans).

    ``succ`` lists (node, count) pairs: for each real node outside the unit that reads it, how
    many of the unit's members it reads; ``indeg`` is the matching count of the unit's
    (member, outside real input) pairs, so a unit is ready when every pair has been released.
    """

    __slots__ = ("is_coll", "members", "dur", "prio", "succ", "indeg", "groups", "name")

    def __init__(self, is_coll: bool, members: tuple[int, ...], dur: float, succ: tuple[tuple[int, int], ...],
                 indeg: int, name: str, groups: tuple[tuple[str, ...], ...] = ()):
        self.is_coll = is_coll
        self.members = members  # sorted node indices (real nodes only)
        self.dur = dur
        self.prio = members[0]  # program position: its first member
        self.succ = succ
        self.indeg = indeg
        self.name = name  # the label of a unit that is not a planned group or a bucket
        self.groups = groups  # the planned groups (by names) it contains


class _Mode:
    """Plan-independent data for one ``xla_fusion`` mode: folded adjacency and the base units."""

    __slots__ = ("fusion", "virtual", "rp", "rs", "inline", "cluster_of", "clusters", "units", "unit_of",
                 "dur", "key", "succ", "coll", "indeg", "ready_k", "ready_c", "kernel_total", "comm_total",
                 "ar_unit")


class _Group:
    """A planned group resolved against the graph (cached by its names)."""

    __slots__ = ("names", "members", "unit_off", "kmembers_ext", "touched", "solo")

    def __init__(self, names: tuple[str, ...], members: tuple[int, ...]):
        self.names = names
        self.members = members
        self.unit_off: _Unit | None = None
        self.kmembers_ext: tuple[int, ...] = ()
        self.touched: tuple[int, ...] = ()
        self.solo: tuple[list[int], list[_Unit], float] | None = None  # re-fusion when alone


class _Patch:
    """What one plan changes in a mode's base units: units removed and units added."""

    __slots__ = ("mode", "dead", "new", "compute", "comm", "buckets")

    def __init__(self, mode: _Mode, dead: list[int], new: list[_Unit], buckets: list[_Unit] | None,
                 compute: float, comm: float):
        self.mode = mode
        self.dead = dead
        self.new = new
        self.buckets = buckets  # the plan's bucket units in plan order (None: the combiner's)
        self.compute = compute
        self.comm = comm


class _Deadlock(Exception):
    pass


class Simulator:
    """Plan-independent precomputation for fast repeated simulation of one graph.

    Args:
      graph: the step's HLO graph.
      costs: the cost model.
      cluster: the cluster (collective costs and ``compute_speed``).

    Example:
      >>> sim = Simulator(graph, costs, cluster)  # doctest: +SKIP
      >>> best = min(plans, key=sim.step_time)    # doctest: +SKIP
    """

    def __init__(self, graph: HloGraph, costs: CostModel, cluster: ClusterSpec):
        self.graph = graph
        self.costs = costs
        self.cluster = cluster
        self.kernels = GraphKernels(graph)
        nodes = graph.nodes
        n = len(nodes)
        self._n = n
        self._index = graph.index()
        kind = []
        for node in nodes:
            if node.opcode in COLLECTIVE_KIND:
                kind.append(_COLL)
            elif node.opcode in ZERO_COST_OPCODES:
                kind.append(_VIRTUAL)
            else:
                kind.append(_KERNEL)
        self._kind = kind
        for d, preds in enumerate(self.kernels.preds):
            for p in preds:
                if p >= d:
                    raise ValueError(f"graph {graph.name!r}: edge {nodes[p].name!r} -> {nodes[d].name!r} "
                                     "goes backwards; expected nodes in topological order")
        self._loop = [node.opcode in XLA_CPU_LOOP_OPCODES for node in nodes]
        p = cluster.num_devices
        self._cbytes = [0] * n
        for i, node in enumerate(nodes):
            if kind[i] == _COLL:
                # The full buffer: a reduce-scatter's result is one device's shard.
                scale = p if COLLECTIVE_KIND[node.opcode] == "reduce-scatter" else 1
                self._cbytes[i] = node.out_bytes * scale
        self._ars = [i for i in range(n) if nodes[i].opcode in ALL_REDUCE_OPCODES]
        self._ar_set = frozenset(self._ars)
        self._kernel_cache: dict[tuple[bool, tuple[int, ...]], float] = {}
        self._group_cache: dict[tuple[str, ...], _Group] = {}
        self._bucket_names: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._unit_cache: dict[tuple[str, int, tuple[int, ...]], _Unit] = {}  # (fusion, _UNIT_*, members)
        self._region_cache: dict[tuple[tuple[str, ...], ...], tuple[list[int], list[_Unit], float]] = {}
        self._combined: dict[str, list[_Unit]] = {}
        self._modes: dict[str, _Mode] = {}
        self._levels = self._ar_levels_graph()
        # A GPU cluster: XLA:GPU's fusion (disco.sim.gpu_fusion) instead of XLA:CPU's.
        self._gpu = bool(getattr(cluster, "is_gpu", False))
        self._gpu_ctx: gpu_fusion.GpuFusionContext | None = None
        self._mode("extend")  # XLA's own fusion of the unplanned graph, once

    # -- modes -----------------------------------------------------------------------------------
    def _mode(self, fusion: str) -> _Mode:
        mode = self._modes.get(fusion)
        if mode is None:
            if fusion not in ("extend", "off"):
                raise ValueError(f"plan.xla_fusion: expected 'extend' or 'off', got {fusion!r}")
            mode = self._modes[fusion] = self._build_mode(fusion)
        return mode

    def _duplicated(self) -> set[int]:
        """Broadcasts XLA duplicates into every consumer: all users are loop-fusible compute ops."""
        nodes, kind, loop = self.graph.nodes, self._kind, self._loop
        succs = self.kernels.succs
        if self._gpu:
            return gpu_fusion.duplicated([nd.opcode for nd in nodes], [k == _KERNEL for k in kind], succs,
                                         self.kernels.preds, [nd.out_elements for nd in nodes])
        dup: set[int] = set()
        for i in range(self._n - 1, -1, -1):
            if nodes[i].opcode in XLA_CPU_DUPLICATED_OPCODES and kind[i] == _KERNEL and succs[i] and all(
                    s in dup or (kind[s] == _KERNEL and loop[s]) for s in succs[i]):
                dup.add(i)
        return dup

    def _build_mode(self, fusion: str) -> _Mode:
        n, kind = self._n, self._kind
        raw_p, raw_s = self.kernels.preds, self.kernels.succs
        dup = self._duplicated() if fusion == "extend" else set()
        virtual = [kind[i] == _VIRTUAL or i in dup for i in range(n)]
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
        mode = _Mode()
        mode.fusion = fusion
        mode.virtual = virtual
        mode.rp = rp
        mode.rs = [tuple(s) for s in rs_l]
        mode.inline = inline
        real_kernels = [i for i in range(n) if kind[i] == _KERNEL and not virtual[i]]
        if fusion == "extend":
            # Users for fusion decisions: through duplicated broadcasts only; a value read by a
            # zero-cost op (tuple, get-tuple-element, call) or a collective, or by nobody, leaves.
            users: list[tuple[int, ...]] = [()] * n
            blocked = [False] * n
            for i in range(n - 1, -1, -1):
                acc2: set[int] = set()
                blk = not raw_s[i]
                for s in raw_s[i]:
                    if s in dup:
                        acc2 |= set(users[s])
                        blk = blk or blocked[s]
                    elif kind[s] != _KERNEL:
                        blk = True
                    else:
                        acc2.add(s)
                users[i] = tuple(sorted(acc2))
                blocked[i] = blk
            self._fuse_users, self._blocked = users, blocked
            if self._gpu:
                self._gpu_ctx = self._gpu_context(dup)
            clusters = self._xla_clusters(real_kernels, [])
        else:
            clusters = [(i,) for i in real_kernels]
        mode.clusters = clusters
        mode.cluster_of = [-1] * n
        for ci, c in enumerate(clusters):
            for m in c:
                mode.cluster_of[m] = ci
        units = [self._kernel_unit(mode, c) for c in clusters]
        mode.ar_unit = {}
        for i in range(n):
            if kind[i] == _COLL:
                if i in self._ar_set:
                    mode.ar_unit[i] = len(units)
                units.append(self._coll_unit(mode, (i,), COLLECTIVE_KIND[self.graph.nodes[i].opcode]))
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

    def _xla_clusters(self, region: list[int], groups: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """XLA:CPU's loop fusion over ``region`` (sorted real compute nodes), ``groups`` pre-fused.

        Producers are visited consumers-first (descending program position; a group at its last
        member). A loop-fusible producer (or a planned group) joins its users' fusion when every
        user is a loop-fusible op (or in a planned group) in ``region`` and all users are in the
        same fusion; otherwise it roots a fusion of its own. Dots, convolutions, custom calls and
        collectives are never fused.
        """
        if self._gpu_ctx is not None:
            return gpu_fusion.clusters(self._gpu_ctx, region, groups)
        loop, users, blocked = self._loop, self._fuse_users, self._blocked
        gid: dict[int, int] = {}
        items: list[tuple[int, tuple[int, ...], bool]] = []
        for gi, g in enumerate(groups):
            for m in g:
                gid[m] = gi
            items.append((g[-1], g, True))
        items += [(m, (m,), False) for m in region if m not in gid]
        items.sort(reverse=True)
        cl: dict[int, int] = {}
        members: dict[int, list[int]] = {}
        for pos, mem, is_group in items:
            target = -1
            if is_group or loop[pos]:
                inside = set(mem) if is_group else ()
                for m in mem:
                    if blocked[m]:
                        target = -2
                        break
                    for s in users[m]:
                        if s in inside:
                            continue
                        c = cl.get(s, -2)
                        if c == -2 or not (loop[s] or s in gid) or (target >= 0 and c != target):
                            target = -2
                            break
                        target = c
                    if target == -2:
                        break
            if target < 0:
                target = pos
                members[pos] = []
            members[target].extend(mem)
            for m in mem:
                cl[m] = target
        return sorted(tuple(sorted(ms)) for ms in members.values())

    def _gpu_context(self, dup: set[int]) -> gpu_fusion.GpuFusionContext:
        nodes, index = self.graph.nodes, self._index
        out_el = [nd.out_elements for nd in nodes]
        in_el = [out_el[index[nd.operands[0]]] if nd.operands and nd.operands[0] in index else out_el[i]
                 for i, nd in enumerate(nodes)]
        return gpu_fusion.make_context([nd.opcode for nd in nodes], out_el, in_el,
                                       [k == _KERNEL for k in self._kind], dup, self.kernels.succs,
                                       self.kernels.preds)

    # -- units -----------------------------------------------------------------------------------
    def _links(self, mode: _Mode, members: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], int]:
        mset = set(members)
        rp, rs = mode.rp, mode.rs
        indeg = 0
        succ: dict[int, int] = {}
        for m in members:
            for p in rp[m]:
                if p not in mset:
                    indeg += 1
            for s in rs[m]:
                if s not in mset:
                    succ[s] = succ.get(s, 0) + 1
        return tuple(succ.items()), indeg

    def _kernel_unit(self, mode: _Mode, members: tuple[int, ...],
                     groups: tuple[tuple[str, ...], ...] = ()) -> _Unit:
        key = (mode.fusion, _UNIT_KERNEL, members)
        u = self._unit_cache.get(key)
        if u is None:
            inl = sorted({d for m in members for d in mode.inline[m]})
            ck = (bool(inl), members)
            dur = self._kernel_cache.get(ck)
            if dur is None:
                dur = self.costs.kernel_time(self.kernels.kernel(members, inl)) / self.cluster.compute_speed
                self._kernel_cache[ck] = dur
            succ, indeg = self._links(mode, members)
            names = self.graph.nodes
            name = names[members[0]].name if len(members) == 1 else f"xla_fusion({names[members[-1]].name})"
            u = _Unit(False, members, dur, succ, indeg, name)
            self._unit_cache[key] = u
        if groups and u.groups != groups:  # the same members, labelled by other groups
            u = _Unit(False, u.members, u.dur, u.succ, u.indeg, u.name, groups)
        return u

    def _coll_unit(self, mode: _Mode, members: tuple[int, ...], kind: str, variadic: bool = False,
                   unit: int | None = None) -> _Unit:
        """One collective over ``members``; ``variadic`` (XLA's combined or a "tuple" bucket) adds the
        cluster's ``operand_latency`` for each operand after the first; ``unit=_UNIT_RS_AG`` (an
        "rs_ag" bucket) prices it as a reduce-scatter followed by an all-gather of the same bytes."""
        unit = unit if unit is not None else (_UNIT_VARIADIC if variadic else _UNIT_COLL)
        key = (mode.fusion, unit, members)
        u = self._unit_cache.get(key)
        if u is None:
            nbytes = sum(self._cbytes[m] for m in members)
            if unit == _UNIT_RS_AG:
                dur = (self.costs.collective_time("reduce-scatter", nbytes, self.cluster)
                       + self.costs.collective_time("all-gather", nbytes, self.cluster))
            else:
                dur = self.costs.collective_time(kind, nbytes, self.cluster)
            if unit == _UNIT_VARIADIC:
                dur += self.cluster.operand_latency * (len(members) - 1)
            succ, indeg = self._links(mode, members)
            u = _Unit(True, members, dur, succ, indeg, self.graph.nodes[members[0]].name)
            self._unit_cache[key] = u
        return u

    # -- plan contraction ------------------------------------------------------------------------
    def _resolve(self, names: Sequence[str], what: str) -> tuple[int, ...]:
        idx = self._index
        try:
            return tuple(sorted({idx[nm] for nm in names}))
        except KeyError as e:
            raise ValueError(f"{what}: instruction {e.args[0]!r} is not in the graph {self.graph.name!r}") from None
        except TypeError:
            raise ValueError(f"{what}: expected a sequence of instruction names, got {names!r}") from None

    def _group(self, gi: int, names: tuple[str, ...]) -> _Group:
        g = self._group_cache.get(names)
        if g is not None:
            return g
        members = self._resolve(names, f"group {gi}")
        if not members:
            raise ValueError(f"group {gi} is empty; expected at least one instruction name")
        bad = [self.graph.nodes[m].name for m in members if self._kind[m] == _COLL]
        if bad:
            raise ValueError(f"group {gi}: {bad[0]!r} is a collective; groups hold compute ops")
        g = _Group(names, members)
        off = self._modes.get("off")
        if off is not None:
            self._group_off(off, g)
        ext = self._modes["extend"]
        g.kmembers_ext = tuple(m for m in members if not ext.virtual[m])
        g.touched = tuple(sorted({ext.cluster_of[m] for m in g.kmembers_ext}))
        self._group_cache[names] = g
        return g

    def _group_off(self, mode: _Mode, g: _Group) -> None:
        km = tuple(m for m in g.members if not mode.virtual[m])
        g.unit_off = self._kernel_unit(mode, km, (g.names,)) if km else None

    def _bucket_members(self, bi: int, names: tuple[str, ...]) -> tuple[int, ...]:
        members = self._bucket_names.get(names)
        if members is None:
            members = self._resolve(names, f"bucket {bi}")
            bad = [self.graph.nodes[m].name for m in members if m not in self._ar_set]
            if bad or not members:
                raise ValueError(f"bucket {bi}: expected all-reduce instruction names, got "
                                 f"{bad[:3] if bad else 'none'}")
            self._bucket_names[names] = members
        return members

    def _ar_levels_graph(self) -> dict[int, int]:
        """Per all-reduce, the number of all-reduces on the longest chain above it."""
        lvl = [0] * self._n
        ar = self._ar_set
        for i, preds in enumerate(self.kernels.preds):
            best = 0
            for p in preds:
                v = lvl[p] + (1 if p in ar else 0)
                if v > best:
                    best = v
            lvl[i] = best
        return {a: lvl[a] for a in self._ars}

    def _combiner(self, mode: _Mode, levels: dict[int, int] | None = None) -> list[_Unit]:
        """XLA's combiner: all all-reduces in one bucket, split by all-reduce level if needed."""
        if levels is None and mode.fusion in self._combined:
            return self._combined[mode.fusion]
        by_level: dict[int, list[int]] = collections.defaultdict(list)
        for a in self._ars:
            by_level[(levels or self._levels)[a]].append(a)
        out = [self._coll_unit(mode, tuple(by_level[lv]), "all-reduce", variadic=True) for lv in sorted(by_level)]
        if levels is None:
            self._combined[mode.fusion] = out
        return out

    def _patch(self, plan: FusionPlan, levels: dict[int, int] | None = None) -> _Patch:
        """The units ``plan`` removes from and adds to its mode's base units.

        Raises:
          ValueError: for names not in the graph, overlapping groups or overlapping buckets.
        """
        mode = self._mode(plan.xla_fusion)
        cache_get = self._group_cache.get
        groups: list[_Group] = []
        for gi, names in enumerate(plan.groups):
            groups.append(cache_get(names) or self._group(gi, names))
        if groups:
            count = sum(len(g.members) for g in groups)
            if len(set().union(*[g.members for g in groups])) != count:
                self._raise_overlap(plan)
        dead: list[int] = []
        new: list[_Unit] = []
        compute = mode.kernel_total
        comm = mode.comm_total
        dur = mode.dur
        if groups:
            if mode.fusion == "off":
                unit_of = mode.unit_of
                for g in groups:
                    if g.unit_off is None:
                        self._group_off(mode, g)
                    u = g.unit_off
                    if u is not None:
                        gone = [unit_of[m] for m in u.members]
                        dead += gone
                        new.append(u)
                        compute += u.dur - sum(dur[d] for d in gone)
            else:
                compute += self._extend_groups(mode, groups, dead, new)
        ar_unit = mode.ar_unit
        if plan.buckets is None:
            buckets = None
            if self._ars:
                dead += ar_unit.values()
                combined = self._combiner(mode, levels)
                new += combined
                comm += sum(u.dur for u in combined) - sum(dur[d] for d in ar_unit.values())
        else:
            buckets = []
            seen: set[int] = set()
            count = 0
            bucket_get = self._bucket_names.get
            coll_get = self._unit_cache.get
            fusion = mode.fusion
            for bi, b in enumerate(plan.buckets):
                members = bucket_get(b.members) or self._bucket_members(bi, b.members)
                seen.update(members)
                count += len(members)
                unit = _BUILD_UNIT[b.build]
                u = coll_get((fusion, unit, members)) or self._coll_unit(mode, members, "all-reduce", unit=unit)
                buckets.append(u)
                if len(members) > 1 or unit == _UNIT_RS_AG:
                    gone = [ar_unit[m] for m in members]
                    dead += gone
                    new.append(u)
                    comm += u.dur - sum(dur[d] for d in gone)
            if len(seen) != count:
                self._raise_overlap(plan)
        return _Patch(mode, dead, new, buckets, compute, comm)

    def _extend_groups(self, mode: _Mode, groups: list[_Group], dead: list[int], new: list[_Unit]) -> float:
        """Planned groups grown by XLA's fusion: each set of base fusions that groups touch is re-fused.

        Appends to ``dead`` and ``new``; returns the change in summed kernel time.
        """
        # The common case: every group lies inside one XLA fusion.
        by_cluster: dict[int, list[_Group]] = {}
        for g in groups:
            t = g.touched
            if len(t) != 1:
                if t:
                    break
                continue
            lst = by_cluster.get(t[0])
            if lst is None:
                by_cluster[t[0]] = [g]
            else:
                lst.append(g)
        else:
            delta = 0.0
            cache = self._region_cache
            for lst in by_cluster.values():
                if len(lst) == 1:
                    hit = lst[0].solo
                    if hit is None:
                        hit = lst[0].solo = self._refuse(mode, lst)
                else:
                    key = tuple(sorted(g.names for g in lst))
                    hit = cache.get(key)
                    if hit is None:
                        hit = cache[key] = self._refuse(mode, lst)
                dead += hit[0]
                new += hit[1]
                delta += hit[2]
            return delta
        owner: dict[int, int] = {}
        comps: list[list[_Group] | None] = []
        for g in groups:
            if not g.touched:
                continue
            hit = {owner[c] for c in g.touched if c in owner}
            if not hit:
                ci = len(comps)
                comps.append([g])
            else:
                ci = min(hit)
                comp = comps[ci]
                comp.append(g)  # type: ignore[union-attr]
                for cj in hit - {ci}:
                    other = comps[cj]
                    comp.extend(other)  # type: ignore[union-attr,arg-type]
                    comps[cj] = None
                    for h in other:  # type: ignore[union-attr]
                        for c in h.touched:
                            owner[c] = ci
            for c in g.touched:
                owner[c] = ci
        cache = self._region_cache
        delta = 0.0
        for comp in comps:
            if comp is None:
                continue
            key = tuple(sorted(g.names for g in comp))
            hit_ = cache.get(key)
            if hit_ is None:
                hit_ = cache[key] = self._refuse(mode, comp)
            dead += hit_[0]
            new += hit_[1]
            delta += hit_[2]
        return delta

    def _refuse(self, mode: _Mode, comp: list[_Group]) -> tuple[list[int], list[_Unit], float]:
        """(base units removed, units added, kernel-time change) when ``comp``'s groups are pre-fused."""
        touched = sorted({c for g in comp for c in g.touched})
        region = sorted(m for c in touched for m in mode.clusters[c])
        ordered = sorted(comp, key=lambda g: g.kmembers_ext)
        clusters = self._xla_clusters(region, [g.kmembers_ext for g in ordered])
        where = {m: g.names for g in comp for m in g.kmembers_ext}
        units = []
        for c in clusters:
            inside = tuple(dict.fromkeys(where[m] for m in c if m in where))
            units.append(self._kernel_unit(mode, c, inside))
        gone = [mode.unit_of[mode.clusters[c][0]] for c in touched]
        return gone, units, sum(u.dur for u in units) - sum(mode.dur[d] for d in gone)

    def _raise_overlap(self, plan: FusionPlan) -> None:
        owner: dict[str, str] = {}
        parts = [(f"group {gi}", names) for gi, names in enumerate(plan.groups)]
        parts += [(f"bucket {bi}", b.members) for bi, b in enumerate(plan.buckets or ())]
        for where, names in parts:
            for name in names:
                if name in owner:
                    raise ValueError(f"{where}: instruction {name!r} is already in {owner[name]}; "
                                     "groups and buckets must be disjoint")
                owner[name] = where
        raise ValueError("plan has overlapping groups or buckets")  # pragma: no cover

    def _arrays(self, patch: _Patch) -> tuple[list, list, list, list, list, list, list[int], list[int]]:
        """Per-plan unit arrays: the mode's base arrays with the patch applied."""
        mode = patch.mode
        new = patch.new
        nb = len(mode.dur)
        unit_of = mode.unit_of[:]
        indeg = mode.indeg + [u.indeg for u in new]
        for d in patch.dead:
            indeg[d] = -(1 << 40)  # never becomes ready
        ready_k = [u for u in mode.ready_k if indeg[u] == 0]
        ready_c = [u for u in mode.ready_c if indeg[u] == 0]
        for k, u in enumerate(new):
            uid = nb + k
            for m in u.members:
                unit_of[m] = uid
            if u.indeg == 0:
                (ready_c if u.is_coll else ready_k).append(uid)
        if new:
            dur = mode.dur + [u.dur for u in new]
            key = mode.key + [u.prio for u in new]
            succ = mode.succ + [u.succ for u in new]
            coll = mode.coll + [u.is_coll for u in new]
        else:
            dur, key, succ, coll = mode.dur, mode.key, mode.succ, mode.coll
        return unit_of, indeg, dur, key, succ, coll, ready_k, ready_c

    def _all_units(self, patch: _Patch) -> list[_Unit]:
        dead = set(patch.dead)
        return [u for ui, u in enumerate(patch.mode.units) if ui not in dead] + patch.new

    # -- the sweeps --------------------------------------------------------------------------------
    def _fast(self, patch: _Patch) -> float:
        """The step time under the ready-list schedule keyed by program position (no timeline).

        The hot path of the search; ``_sweep`` does the same with any key and records events.
        """
        unit_of, indeg, dur, key, succ, coll, ready_k, ready_c = self._arrays(patch)
        blocking = not self.cluster.overlap
        heappush, heappop = heapq.heappush, heapq.heappop
        rk = [key[u] for u in ready_k]  # kernels ready now, by program position
        heapq.heapify(rk)
        tc = [(0.0, key[u]) for u in ready_c]  # collectives, by (ready time, program position)
        heapq.heapify(tc)
        tk: list[tuple[float, int]] = []  # kernels waiting for a collective, by ready time
        rt = [0.0] * len(dur)
        t_c = t_m = 0.0
        done = len(patch.dead)
        # The comm stream's next start; a kernel starts only strictly before it (ties: comm first).
        limit = (tc[0][0] if tc[0][0] > t_m else t_m) if tc else _INF
        while True:
            while True:  # the compute stream, until the comm stream's next start comes first
                while tk and tk[0][0] <= t_c:
                    heappush(rk, heappop(tk)[1])
                if not rk:
                    if not tk or tk[0][0] >= limit:
                        break
                    t_c = tk[0][0]  # idle until a kernel's collective input ends
                    continue
                if t_c >= limit:
                    break
                u = unit_of[heappop(rk)]
                fin = t_c = t_c + dur[u]
                done += 1
                for s, c in succ[u]:
                    w = unit_of[s]
                    k = indeg[w] - c
                    indeg[w] = k
                    if fin > rt[w]:
                        rt[w] = fin
                    if not k:
                        if coll[w]:
                            heappush(tc, (rt[w], key[w]))
                            r = tc[0][0]
                            limit = r if r > t_m else t_m
                        elif rt[w] <= fin:
                            heappush(rk, key[w])
                        else:
                            heappush(tk, (rt[w], key[w]))
            if not tc:
                break
            u = unit_of[heappop(tc)[1]]
            if blocking:  # one stream: the collective waits for the running kernel, then holds it
                start = limit if limit > t_c else t_c
                fin = t_m = start + dur[u]
            else:
                fin = t_m = limit + dur[u]
            done += 1
            for s, c in succ[u]:
                w = unit_of[s]
                k = indeg[w] - c
                indeg[w] = k
                if fin > rt[w]:
                    rt[w] = fin
                if not k:
                    if coll[w]:
                        heappush(tc, (rt[w], key[w]))
                    elif rt[w] <= t_c:
                        heappush(rk, key[w])
                    else:
                        heappush(tk, (rt[w], key[w]))
            if blocking:
                t_c = fin
            if tc:
                r = tc[0][0]
                limit = r if r > t_m else t_m
            else:
                limit = _INF
        if done != len(dur):
            raise _Deadlock()
        return t_c if t_c > t_m else t_m

    def _sweep(self, patch: _Patch, order: str, labels: dict[int, str]) -> SimResult:
        """The general sweep: any order, records the timeline and critical path."""
        unit_of, indeg, dur, key, succ, coll, ready_k, ready_c = self._arrays(patch)
        blocking = not self.cluster.overlap
        units = patch.mode.units + patch.new
        if order == "topological":
            prio = self._ranks(patch, unit_of, dur, succ)
            key = [(-prio[u], key[u]) for u in range(len(dur))]
        heappush, heappop = heapq.heappush, heapq.heappop
        rk = [(key[u], u) for u in ready_k]
        heapq.heapify(rk)
        tc = [(0.0, key[u], u) for u in ready_c]
        heapq.heapify(tc)
        tk: list[tuple[float, Any, int]] = []
        rt = [0.0] * len(dur)
        arg = [-1] * len(dur)  # the event whose end set the unit's ready time
        nodes = self.graph.nodes
        events: list[Event] = []
        binding: list[int] = []
        last = [-1, -1]
        t_c = t_m = 0.0
        done = len(patch.dead)

        def place(u: int, start: float, free: float, k: int) -> float:
            fin = start + dur[u]
            ei = len(events)
            unit = units[u]
            members = tuple(nodes[m].name for m in unit.members)
            events.append(Event(labels.get(u) or unit.name, "comm" if k else "compute", start, fin, members))
            if arg[u] >= 0 and rt[u] >= free:
                binding.append(arg[u])
            else:
                binding.append(last[k] if free > 0 else -1)
            last[k] = ei
            for s, c in succ[u]:
                w = unit_of[s]
                kk = indeg[w] - c
                indeg[w] = kk
                if fin > rt[w]:
                    rt[w] = fin
                    arg[w] = ei
                if not kk:
                    if coll[w]:
                        heappush(tc, (rt[w], key[w], w))
                    elif rt[w] <= (fin if not k else t_c):
                        heappush(rk, (key[w], w))
                    else:
                        heappush(tk, (rt[w], key[w], w))
            return fin

        while True:
            while tk and tk[0][0] <= t_c:
                _, kw, w = heappop(tk)
                heappush(rk, (kw, w))
            if rk:
                nxt = t_c
            elif tk:
                nxt = tk[0][0]
            else:
                nxt = _INF
            if tc:
                r = tc[0][0]
                if r < t_m:
                    r = t_m
                if r <= nxt:
                    u = heappop(tc)[2]
                    done += 1
                    if blocking:  # one stream: after the running kernel, and nothing beside it
                        t_m = place(u, r if r > t_c else t_c, t_m, 1)
                        t_c = t_m
                    else:
                        t_m = place(u, r, t_m, 1)
                    continue
            if nxt == _INF:
                break
            if not rk:
                t_c = nxt
                while tk and tk[0][0] <= t_c:
                    _, kw, w = heappop(tk)
                    heappush(rk, (kw, w))
            u = heappop(rk)[1]
            done += 1
            free = t_c
            t_c = t_c + dur[u]
            place(u, free, free, 0)
        if done != len(dur):
            raise _Deadlock()
        step = t_c if t_c > t_m else t_m
        path: list[str] = []
        if events:
            ei = max(range(len(events)), key=lambda k: (events[k].end, k))
            while ei >= 0:
                path.append(events[ei].name)
                ei = binding[ei]
            path.reverse()
        return SimResult(step_time=step, compute_time=patch.compute, comm_time=patch.comm,
                         exposed_comm=max(0.0, step - patch.compute), critical_path=tuple(path),
                         timeline=tuple(events))

    def _ranks(self, patch: _Patch, unit_of: list[int], dur: list[float], succ: list) -> list[float]:
        """Per unit: its time plus the longest chain of unit times after it."""
        order = self._toposort(patch)
        rank = [0.0] * len(dur)
        for u in reversed(order):
            best = 0.0
            for s, _ in succ[u]:
                v = rank[unit_of[s]]
                if v > best:
                    best = v
            rank[u] = dur[u] + best
        return rank

    def _toposort(self, patch: _Patch) -> list[int]:
        """Alive unit ids (base ids, then the patch's new units) in a topological order.

        Raises:
          ValueError: naming units on a cycle.
        """
        unit_of, indeg, dur, key, succ, coll, ready_k, ready_c = self._arrays(patch)
        heap = [(key[u], u) for u in ready_k + ready_c]
        heapq.heapify(heap)
        order = []
        while heap:
            _, u = heapq.heappop(heap)
            order.append(u)
            for s, c in succ[u]:
                w = unit_of[s]
                indeg[w] -= c
                if indeg[w] == 0:
                    heapq.heappush(heap, (key[w], w))
        if len(order) + len(patch.dead) != len(dur):
            units = patch.mode.units + patch.new
            names = self.graph.nodes
            stuck = sorted({names[m].name for u in range(len(dur)) if indeg[u] > 0 for m in units[u].members})
            raise ValueError(f"contracting the plan forms a cycle through {stuck[:6]}; "
                             "check the plan with disco.plans.check.validate")
        return order

    def _contracted_levels(self, patch: _Patch) -> dict[int, int]:
        """All-reduce levels on the graph with the plan's kernels contracted (all-reduces single)."""
        mode = patch.mode
        dead = set(patch.dead)
        kernels = [u for ui, u in enumerate(mode.units) if ui not in dead and not u.is_coll]
        kernels += [u for u in patch.new if not u.is_coll]
        singles = [mode.units[mode.ar_unit[a]] for a in self._ars]
        others = [u for u in mode.units if u.is_coll and u.members[0] not in self._ar_set]
        units = kernels + singles + others
        unit_of = [-1] * self._n
        for ui, u in enumerate(units):
            for m in u.members:
                unit_of[m] = ui
        indeg = [u.indeg for u in units]
        heap = [(u.prio, ui) for ui, u in enumerate(units) if u.indeg == 0]
        heapq.heapify(heap)
        lvl = [0] * len(units)
        ar = self._ar_set
        while heap:
            _, ui = heapq.heappop(heap)
            u = units[ui]
            up = lvl[ui] + (1 if u.is_coll and u.members[0] in ar else 0)
            for s, c in u.succ:
                w = unit_of[s]
                if up > lvl[w]:
                    lvl[w] = up
                indeg[w] -= c
                if indeg[w] == 0:
                    heapq.heappush(heap, (units[w].prio, w))
        return {a: lvl[unit_of[a]] for a in self._ars}

    def _labels(self, plan: FusionPlan, patch: _Patch) -> dict[int, str]:
        labels: dict[int, str] = {}
        nb = len(patch.mode.dur)
        gindex = {names: gi for gi, names in enumerate(plan.groups)}
        combined = 0
        bucket_index = {id(u): bi for bi, u in enumerate(patch.buckets or ())}
        for k, u in enumerate(patch.new):
            if u.groups:
                labels[nb + k] = f"fusion.{min(gindex[g] for g in u.groups)}"
            elif u.is_coll:
                if patch.buckets is None:
                    labels[nb + k] = f"combined.{combined}"
                    combined += 1
                else:
                    labels[nb + k] = f"bucket.{bucket_index[id(u)]}"
        if patch.buckets is not None:  # single-member buckets keep their base unit
            for bi, u in enumerate(patch.buckets):
                if len(u.members) == 1:
                    labels[patch.mode.ar_unit[u.members[0]]] = f"bucket.{bi}"
        return labels

    def _simulate(self, plan: FusionPlan, order: str, record: bool) -> SimResult:
        if order not in ORDERS:
            raise ValueError(f"order: expected one of {', '.join(ORDERS)}, got {order!r}")
        patch = self._patch(plan)
        for attempt in range(2):
            try:
                if record or order != "program":
                    return self._sweep(patch, order, self._labels(plan, patch))
                step = self._fast(patch)
                return SimResult(step_time=step, compute_time=patch.compute, comm_time=patch.comm,
                                 exposed_comm=max(0.0, step - patch.compute))
            except _Deadlock:
                if attempt or plan.buckets is not None or not plan.groups or not self._ars:
                    break
                # One combined bucket deadlocks against the groups: one bucket per level of the
                # graph with the plan's kernels contracted.
                try:
                    levels = self._contracted_levels(patch)
                except (IndexError, KeyError):  # pragma: no cover
                    break
                patch = self._patch(plan, levels)
        self._toposort(patch)  # raises ValueError naming the cycle
        raise RuntimeError("simulation deadlocked on an acyclic plan; this is a bug in disco.sim.simulator")

    # -- public API --------------------------------------------------------------------------------
    def run(self, plan: FusionPlan, order: Order = "program") -> SimResult:
        """Simulates ``plan`` with the timeline and critical path.

        Args:
          plan: the fusion plan (groups and buckets by instruction name).
          order: "program" or "topological" (see the module docstring).

        Returns:
          The SimResult.

        Raises:
          ValueError: for an unknown order, a name not in the graph, overlapping groups or
            buckets, or a plan whose contraction forms a cycle.
        """
        return self._simulate(plan, order, record=True)

    def step_time(self, plan: FusionPlan, order: Order = "program") -> float:
        """Only the predicted step time of ``plan`` (no timeline): the fast path for search.

        Raises:
          ValueError: as ``run``.
        """
        return self._simulate(plan, order, record=False).step_time

    def result(self, plan: FusionPlan, order: Order = "program") -> SimResult:
        """The step, compute, comm and exposed times without timeline or critical path.

        Raises:
          ValueError: as ``run``.
        """
        return self._simulate(plan, order, record=False)

    def fusions(self, plan: FusionPlan) -> list[tuple[str, ...]]:
        """The compute kernels ``plan`` compiles to (instruction names per kernel), program order.

        With ``xla_fusion="extend"`` this is the emulation of XLA's loop fusion around the
        plan's groups; with ``"off"`` the planned groups and one kernel per other op.

        Raises:
          ValueError: as ``run``.
        """
        patch = self._patch(plan)
        names = self.graph.nodes
        return [tuple(names[m].name for m in u.members)
                for u in sorted(self._all_units(patch), key=lambda u: u.prio) if not u.is_coll]

    def lower_bound(self) -> float:
        """See :func:`lower_bound`."""
        nodes = self.graph.nodes
        gk = self.kernels
        speed = self.cluster.compute_speed
        compute = sum(self.costs.kernel_time(gk.kernel((i,))) / speed for i in range(self._n)
                      if self._kind[i] == _KERNEL and nodes[i].opcode not in FUSIBLE_OPCODES
                      and nodes[i].opcode not in XLA_CPU_LOOP_OPCODES)
        ar_bytes = sum(self._cbytes[a] for a in self._ars)
        comm = (self.costs.collective_time("all-reduce", ar_bytes, self.cluster) if self._ars else 0.0)
        mode = self._modes["extend"]
        comm += sum(mode.dur[ui] for ui, u in enumerate(mode.units)
                    if u.is_coll and u.members[0] not in self._ar_set)
        return max(compute, comm)


# ---------------------------------------------------------------------------------------------
def simulate(graph: HloGraph, plan: FusionPlan, costs: CostModel, cluster: ClusterSpec,
             order: Order = "program") -> SimResult:
    """Simulates one step of ``graph`` compiled with ``plan``; see the module docstring.

    Builds a :class:`Simulator` each call; for many plans of one graph, build it once.

    Args:
      graph: the step's HLO graph.
      plan: the fusion plan.
      costs: the cost model.
      cluster: the cluster.
      order: "program" or "topological".

    Returns:
      The SimResult, with timeline and critical path.

    Raises:
      ValueError: for an unknown order or a plan that does not fit the graph.
    """
    return Simulator(graph, costs, cluster).run(plan, order)


def lower_bound(graph: HloGraph, costs: CostModel, cluster: ClusterSpec) -> float:
    """A step time no plan can beat under this cost model (ideal overlap of compute and comm).

    ``max(compute, comm)`` where

    - ``compute`` is the summed unfused kernel time of the compute ops that no plan can fuse
      (opcodes outside ``disco.ir.opcodes.FUSIBLE_OPCODES`` and ``XLA_CPU_LOOP_OPCODES``, always kernels
      of one in both fusion modes), divided by
      ``cluster.compute_speed``; fusible ops are counted as free, since fusion may hide them.
    - ``comm`` is one all-reduce of all all-reduce bytes together (any bucketing costs at least
      this, as the alpha-beta cost is affine in bytes with a non-negative intercept) plus the
      time of every other collective.

    Both streams are serial, so a simulated step is never shorter than either term.
    """
    return Simulator(graph, costs, cluster).lower_bound()

"""A two-stream list-scheduling simulator of one data-parallel training step.

``simulate(graph, plan, costs, cluster)`` predicts the step time of ``graph``
compiled with ``plan``:

1. **Contraction.** Each of ``plan.groups`` becomes one fused kernel; every other
   compute node is a kernel of one. Zero-cost ops (``disco.costs.ZERO_COST_OPCODES``:
   parameters, constants, tuple plumbing, bitcasts, inlined calls) are not kernels:
   they take no time on any stream and only pass dependencies through (a node that
   reads a ``get-tuple-element`` waits for whatever the tuple element waits for).
   Each of ``plan.buckets`` becomes one all-reduce of the members' summed bytes
   (``costs.collective_time("all-reduce", bytes, cluster)``). ``buckets=None`` models
   XLA's combiner: all all-reduces in one bucket; where some all-reduces depend on
   others (so one bucket would deadlock), one bucket per *level* (the number of
   all-reduces on the longest chain of all-reduces above it), which keeps every
   bucket's members independent. Other collectives (all-gather, reduce-scatter,
   all-to-all, collective-permute) are one collective each.
2. **Two streams.** A *compute stream* runs kernels one at a time, in order; a
   *communication stream* runs collectives one at a time.

   - Kernel order: ``order="program"`` runs kernels in program order, i.e. by the
     position of their first member in ``graph.nodes``; where that order is not
     topological after contraction (a group whose member reads a value computed
     after the group's first member), a kernel waits until its inputs' kernels have
     run (a priority topological sort, priority = program position).
     ``order="topological"`` runs the ready kernel with the longest remaining path
     to the end of the step first (critical-path list scheduling; remaining path =
     its own time plus the longest chain of kernel and collective times after it),
     ties broken by program position.
   - A kernel starts when the compute stream is free **and** all its inputs
     (including collective outputs) are done. The stream is in-order, so a kernel
     waiting on a collective blocks the kernels after it (like one CUDA stream).
   - A collective becomes ready when all its inputs (the producers of every member's
     operands) are done, and starts at ``max(ready, comm stream free)``. Collectives
     are served first come, first served, in the order they become ready.
3. **Result.** ``step_time`` is when the last kernel or collective ends;
   ``compute_time``/``comm_time`` are the summed kernel/collective durations;
   ``exposed_comm = step_time - compute_time`` is the time the compute stream sat
   idle (waiting for collectives, or for the last collectives after the last kernel).

Kernel times come from ``costs.kernel_time`` divided by ``cluster.compute_speed``.

Performance: :class:`Simulator` precomputes everything that does not depend on the
plan (dependencies with zero-cost ops folded away, every unfused kernel's time) and
caches fused-kernel and bucket costs per member set, so ``Simulator.step_time`` costs
one pass over the compute nodes in plain Python; ``Simulator.run`` also builds the
timeline and critical path.

Example:
  >>> from disco.simulator import Simulator
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

from disco.costs import COLLECTIVE_KIND, ZERO_COST_OPCODES, CostModel, GraphKernels

if TYPE_CHECKING:
    from disco.cluster import ClusterSpec
    from disco.graph import HloGraph
    from disco.plan import FusionPlan

Order = Literal["program", "topological"]
ORDERS: tuple[str, ...] = ("program", "topological")
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
    """A kernel or collective of one contracted plan (internal)."""

    __slots__ = ("uid", "is_coll", "members", "preds", "dur", "prio", "label", "succs", "trigger")

    def __init__(self, uid: int, is_coll: bool, members: tuple[int, ...], preds: tuple[int, ...],
                 dur: float, prio: int, label: str, succs: tuple[int, ...]):
        self.uid = uid
        self.is_coll = is_coll
        self.members = members
        self.preds = preds  # real (non-virtual) nodes outside the unit it reads
        self.dur = dur
        self.prio = prio
        self.label = label
        self.succs = succs  # real nodes outside the unit that read it
        self.trigger = max(preds) if preds else -1


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
        # Real preds: fold zero-cost nodes away (transitively). Node order is topological.
        raw_preds = self.kernels.preds
        through: list[frozenset[int]] = [frozenset()] * n
        rp: list[tuple[int, ...]] = [()] * n
        for i in range(n):
            acc: set[int] = set()
            for p in raw_preds[i]:
                if kind[p] == _VIRTUAL:
                    acc |= through[p]
                else:
                    acc.add(p)
            if kind[i] == _VIRTUAL:
                through[i] = frozenset(acc)
            else:
                rp[i] = tuple(sorted(acc))
        rs: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for p in rp[i]:
                rs[p].append(i)
        self._rp = rp
        self._rs = [tuple(s) for s in rs]
        self._cpreds = [tuple(p for p in rp[i] if kind[p] == _COLL) for i in range(n)]
        speed = cluster.compute_speed
        gk = self.kernels
        self._kdur = [costs.kernel_time(gk.kernel((i,))) / speed if kind[i] == _KERNEL else 0.0
                      for i in range(n)]
        p = cluster.num_devices
        self._cbytes = [0] * n
        for i, node in enumerate(nodes):
            if kind[i] == _COLL:
                ck = COLLECTIVE_KIND[node.opcode]
                if ck == "reduce-scatter":
                    self._cbytes[i] = node.out_bytes * p
                else:
                    self._cbytes[i] = node.out_bytes
        self._scan = [i for i in range(n) if kind[i] == _KERNEL]
        self._base_kernel_total = sum(self._kdur)
        self._singles: list[_Unit | None] = [None] * n
        for i in range(n):
            if kind[i] == _VIRTUAL:
                continue
            if kind[i] == _COLL:
                dur = costs.collective_time(COLLECTIVE_KIND[nodes[i].opcode], self._cbytes[i], cluster)
            else:
                dur = self._kdur[i]
            self._singles[i] = _Unit(i, kind[i] == _COLL, (i,), rp[i], dur, i, nodes[i].name, self._rs[i])
        self._ars = [i for i in range(n) if nodes[i].opcode in ("all-reduce", "all-reduce-start")]
        self._ar_set = frozenset(self._ars)
        self._other_colls = [i for i in range(n) if kind[i] == _COLL and i not in self._ar_set]
        self._group_cache: dict[tuple[str, ...], _Unit] = {}
        self._bucket_cache: dict[tuple[int, ...], _Unit] = {}
        self._default_buckets = self._combiner_buckets(None)

    # -- plan contraction ------------------------------------------------------------------------
    def _resolve(self, names: Sequence[str], what: str) -> tuple[int, ...]:
        idx = self._index
        try:
            return tuple(sorted({idx[nm] for nm in names}))
        except KeyError as e:
            raise ValueError(f"{what}: instruction {e.args[0]!r} is not in the graph {self.graph.name!r}") from None

    def _group_unit(self, gi: int, names: tuple[str, ...]) -> _Unit:
        u = self._group_cache.get(names)
        if u is None:
            members = self._resolve(names, f"group {gi}")
            if not members:
                raise ValueError(f"group {gi} is empty; expected at least one instruction name")
            mset = set(members)
            bad = [self.graph.nodes[m].name for m in members if self._kind[m] == _COLL]
            if bad:
                raise ValueError(f"group {gi}: {bad[0]!r} is a collective; groups hold compute ops")
            preds = tuple(sorted({p for m in members for p in self._rp[m] if p not in mset}))
            succs = tuple(sorted({s for m in members for s in self._rs[m] if s not in mset}))
            dur = self.costs.kernel_time(self.kernels.kernel(members)) / self.cluster.compute_speed
            # The group runs where its first compute member is (zero-cost members are never scanned).
            anchor = min((m for m in members if self._kind[m] == _KERNEL), default=-1)
            u = _Unit(-1, False, members, preds, dur, anchor, "", succs)
            self._group_cache[names] = u
        return u

    def _bucket_unit(self, members: tuple[int, ...]) -> _Unit:
        u = self._bucket_cache.get(members)
        if u is None:
            mset = set(members)
            preds = tuple(sorted({p for m in members for p in self._rp[m] if p not in mset}))
            succs = tuple(sorted({s for m in members for s in self._rs[m] if s not in mset}))
            nbytes = sum(self._cbytes[m] for m in members)
            dur = self.costs.collective_time("all-reduce", nbytes, self.cluster)
            u = _Unit(-1, True, members, preds, dur, members[0], "", succs)
            self._bucket_cache[members] = u
        return u

    def _combiner_buckets(self, groups: list[_Unit] | None) -> list[_Unit]:
        """XLA's combiner: all all-reduces in one bucket, split by all-reduce level if needed.

        With ``groups``, levels are computed on the graph with those groups contracted.
        """
        if not self._ars:
            return []
        level = self._ar_levels(groups)
        by_level: dict[int, list[int]] = collections.defaultdict(list)
        for a in self._ars:
            by_level[level[a]].append(a)
        out = []
        for lv in sorted(by_level):
            u = self._bucket_unit(tuple(by_level[lv]))
            out.append(_Unit(-1, True, u.members, u.preds, u.dur, u.prio, f"combined.{lv}", u.succs))
        return out

    def _ar_levels(self, groups: list[_Unit] | None) -> dict[int, int]:
        """Per all-reduce, the number of all-reduces on the longest chain above it."""
        units, unit_of = self._contracted(groups or [], [self._singles[i] for i in self._ars])
        order = self._toposort(units, unit_of)
        # lvl[u]: the largest number of all-reduces on a path ending just above u.
        lvl = [0] * len(units)
        for u in order:
            unit = units[u]
            best = 0
            for p in unit.preds:
                pu = unit_of[p]
                v = lvl[pu] + (1 if units[pu].is_coll and p in self._ar_set else 0)
                if v > best:
                    best = v
            lvl[u] = best
        return {a: lvl[unit_of[a]] for a in self._ars}

    def _contracted(self, groups: list[_Unit], colls: list[_Unit]) -> tuple[list[_Unit], list[int]]:
        """The units of a plan and node -> unit index (-1 for zero-cost nodes)."""
        unit_of = [-1] * self._n
        units: list[_Unit] = []
        for u in groups:
            for m in u.members:
                unit_of[m] = len(units)
            units.append(u)
        for u in colls:
            for m in u.members:
                unit_of[m] = len(units)
            units.append(u)
        for i in range(self._n):
            if self._kind[i] != _VIRTUAL and unit_of[i] < 0:
                unit_of[i] = len(units)
                units.append(self._singles[i])
        return units, unit_of

    def _toposort(self, units: list[_Unit], unit_of: list[int]) -> list[int]:
        indeg = [0] * len(units)
        succ: list[set[int]] = [set() for _ in units]
        for ui, u in enumerate(units):
            ps = {unit_of[p] for p in u.preds}
            ps.discard(ui)
            indeg[ui] = len(ps)
            for pu in ps:
                succ[pu].add(ui)
        heap = [(units[ui].prio, ui) for ui in range(len(units)) if indeg[ui] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, ui = heapq.heappop(heap)
            order.append(ui)
            for s in succ[ui]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(heap, (units[s].prio, s))
        if len(order) != len(units):
            stuck = sorted((units[ui].label or self.graph.nodes[units[ui].members[0]].name)
                           for ui in range(len(units)) if indeg[ui] > 0)
            raise ValueError(f"contracting the plan forms a cycle through {stuck[:5]}; "
                             "check the plan with disco.plan_check.validate")
        return order

    def _prepare(self, plan: FusionPlan) -> tuple[list[_Unit], list[_Unit]]:
        """(group units, collective units) of ``plan``, labelled."""
        groups = []
        owner: dict[int, int] = {}
        for gi, names in enumerate(plan.groups):
            u = self._group_unit(gi, names)
            for m in u.members:
                if m in owner:
                    raise ValueError(f"group {gi}: instruction {self.graph.nodes[m].name!r} is already in "
                                     f"group {owner[m]}; groups must be disjoint")
                owner[m] = gi
            if u.prio < 0:  # only zero-cost ops (e.g. constants): not a kernel
                continue
            groups.append(_Unit(-1, False, u.members, u.preds, u.dur, u.prio, f"fusion.{gi}", u.succs))
        if plan.buckets is None:
            colls = list(self._default_buckets)
        else:
            colls = []
            seen: set[int] = set()
            for bi, b in enumerate(plan.buckets):
                members = self._resolve(b.members, f"bucket {bi}")
                bad = [self.graph.nodes[m].name for m in members if m not in self._ar_set]
                if bad or not members:
                    raise ValueError(f"bucket {bi}: expected all-reduce names, got {bad[:3] or 'none'}")
                if seen.intersection(members):
                    raise ValueError(f"bucket {bi}: all-reduce "
                                     f"{self.graph.nodes[min(seen.intersection(members))].name!r} "
                                     "is already in another bucket")
                seen.update(members)
                u = self._bucket_unit(members)
                colls.append(_Unit(-1, True, u.members, u.preds, u.dur, u.prio, f"bucket.{bi}", u.succs))
            colls += [self._singles[a] for a in self._ars if a not in seen]
        colls += [self._singles[c] for c in self._other_colls]
        return groups, colls

    # -- the sweep ---------------------------------------------------------------------------------
    def _sweep(self, groups: list[_Unit], colls: list[_Unit], order: str, record: bool) -> SimResult:
        end = [_INF] * self._n
        waiters: dict[int, list[_Unit]] = {}
        heap: list[tuple[int, int, _Unit]] = []
        seq = [0]
        nodes = self.graph.nodes
        events: list[Event] = []
        binding: list[int] = []  # per event: the event that bound its start, or -1
        node_event = [-1] * self._n if record else None
        last = {False: -1, True: -1}  # is_coll -> last event index on that stream
        comm_total = [0.0]
        prio_of = None
        if order == "topological":
            prio_of = self._priorities(groups, colls)

        def attempt(u: _Unit, t_c: float, t_m: float) -> tuple[float, float, bool]:
            r = 0.0
            arg = -1
            for p in u.preds:
                e = end[p]
                if e > r:
                    r = e
                    arg = p
            if r == _INF:
                for p in u.preds:
                    if end[p] == _INF:
                        waiters.setdefault(p, []).append(u)
                        break
                if not u.is_coll:
                    for s in u.succs:
                        if s not in special:
                            special[s] = self._singles[s]
                return t_c, t_m, False
            if u.is_coll:
                free = t_m
                start = r if r > t_m else t_m
                t_m = start + u.dur
                fin = t_m
                comm_total[0] += u.dur
            else:
                free = t_c
                start = r if r > t_c else t_c
                t_c = start + u.dur
                fin = t_c
            for m in u.members:
                end[m] = fin
            if record:
                ei = len(events)
                members = tuple(nodes[m].name for m in u.members)
                events.append(Event(u.label or members[0], "comm" if u.is_coll else "compute", start, fin, members))
                if arg >= 0 and r >= free:
                    binding.append(node_event[arg])
                else:
                    binding.append(last[u.is_coll] if free > 0 else -1)
                last[u.is_coll] = ei
                for m in u.members:
                    node_event[m] = ei
            return t_c, t_m, True

        def wake(members: tuple[int, ...], t_c: float, t_m: float) -> tuple[float, float]:
            pending: collections.deque[_Unit] = collections.deque()

            def collect(ms: tuple[int, ...]) -> None:
                for m in ms:
                    ws = waiters.pop(m, None)
                    if ws:
                        for w in ws:
                            if w.is_coll:
                                pending.append(w)
                            else:
                                seq[0] += 1
                                key = prio_of[id(w)] if prio_of is not None else w.prio
                                heapq.heappush(heap, (key, seq[0], w))

            collect(members)
            while pending or heap:
                w = pending.popleft() if pending else heapq.heappop(heap)[2]
                t_c, t_m, done = attempt(w, t_c, t_m)
                if done:
                    collect(w.members)
            return t_c, t_m

        def slow(u: _Unit, t_c: float, t_m: float) -> tuple[float, float]:
            t_c, t_m, done = attempt(u, t_c, t_m)
            if done:
                t_c, t_m = wake(u.members, t_c, t_m)
            return t_c, t_m

        t_c = t_m = 0.0
        # Collectives wait on their last-placed input; those without inputs start at once.
        ready_now = []
        for c in colls:
            if c.trigger < 0:
                ready_now.append(c)
            else:
                waiters.setdefault(c.trigger, []).append(c)
        for c in ready_now:
            t_c, t_m = slow(c, t_c, t_m)

        special: dict[int, _Unit | None] = {}
        for g in groups:
            for m in g.members:
                special[m] = None
            special[g.prio] = g
        for g in groups:
            for s in g.succs:
                if s not in special:
                    special[s] = self._singles[s]

        if order == "program" and not record:
            kdur = self._kdur
            cpreds = self._cpreds
            singles = self._singles
            for i in self._scan:
                if i in special:
                    u = special[i]
                    if u is not None:
                        t_c, t_m = slow(u, t_c, t_m)
                    continue
                cp = cpreds[i]
                if cp:
                    r = t_c
                    for p in cp:
                        e = end[p]
                        if e > r:
                            r = e
                    if r == _INF:
                        t_c, t_m = slow(singles[i], t_c, t_m)
                        continue
                    t_c = r + kdur[i]
                else:
                    t_c += kdur[i]
                end[i] = t_c
                if i in waiters:
                    t_c, t_m = wake((i,), t_c, t_m)
        else:
            for u in self._scan_units(special, order, prio_of):
                t_c, t_m = slow(u, t_c, t_m)
        if waiters or heap:
            raise _Deadlock()
        step = t_c if t_c > t_m else t_m
        compute = self._base_kernel_total + sum(
            g.dur - sum(self._kdur[m] for m in g.members) for g in groups)
        if record:
            comm = comm_total[0]
        else:
            comm = sum(c.dur for c in colls)
        result = SimResult(step_time=step, compute_time=compute, comm_time=comm,
                           exposed_comm=max(0.0, step - compute))
        if not record:
            return result
        path: list[str] = []
        if events:
            ei = max(range(len(events)), key=lambda k: (events[k].end, -k))
            while ei >= 0:
                path.append(events[ei].name)
                ei = binding[ei]
            path.reverse()
        return dataclasses.replace(result, critical_path=tuple(path), timeline=tuple(events))

    def _scan_units(self, special: dict[int, _Unit | None], order: str,
                    prio_of: dict[int, float] | None) -> list[_Unit]:
        units = []
        singles = self._singles
        for i in self._scan:
            u = special.get(i, singles[i])
            if u is not None:
                units.append(u)
        if order == "topological":
            units.sort(key=lambda u: prio_of[id(u)])
        return units

    def _priorities(self, groups: list[_Unit], colls: list[_Unit]) -> dict[int, tuple[float, int]]:
        """Per kernel unit (by id): (-remaining path length, program position)."""
        units, unit_of = self._contracted(groups, colls)
        order = self._toposort(units, unit_of)
        succ: list[set[int]] = [set() for _ in units]
        for ui, u in enumerate(units):
            for p in u.preds:
                pu = unit_of[p]
                if pu != ui:
                    succ[pu].add(ui)
        rank = [0.0] * len(units)
        for ui in reversed(order):
            rank[ui] = units[ui].dur + max((rank[s] for s in succ[ui]), default=0.0)
        return {id(u): (-rank[ui], u.prio) for ui, u in enumerate(units)}

    def _simulate(self, plan: FusionPlan, order: str, record: bool) -> SimResult:
        if order not in ORDERS:
            raise ValueError(f"order: expected one of {', '.join(ORDERS)}, got {order!r}")
        groups, colls = self._prepare(plan)
        try:
            return self._sweep(groups, colls, order, record)
        except _Deadlock:
            pass
        if plan.buckets is None and groups:
            # One combined bucket per level of the graph *with the groups contracted*.
            colls = self._combiner_buckets(groups) + [self._singles[c] for c in self._other_colls]
            try:
                return self._sweep(groups, colls, order, record)
            except _Deadlock:
                pass
        units, unit_of = self._contracted(groups, colls)
        self._toposort(units, unit_of)  # raises ValueError naming the cycle
        raise RuntimeError("simulation deadlocked on an acyclic plan; this is a bug in disco.simulator")

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

    def lower_bound(self) -> float:
        """See :func:`lower_bound`."""
        from disco.plan import FUSIBLE_OPCODES

        nodes = self.graph.nodes
        compute = sum(self._kdur[i] for i in self._scan if nodes[i].opcode not in FUSIBLE_OPCODES)
        ar_bytes = sum(self._cbytes[a] for a in self._ars)
        comm = (self.costs.collective_time("all-reduce", ar_bytes, self.cluster) if self._ars else 0.0)
        comm += sum(self._singles[c].dur for c in self._other_colls)
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
      (opcodes outside ``disco.plan.FUSIBLE_OPCODES``, always kernels of one), divided by
      ``cluster.compute_speed``; fusible ops are counted as free, since fusion may hide them.
    - ``comm`` is one all-reduce of all all-reduce bytes together (any bucketing costs at least
      this, as the alpha-beta cost is affine in bytes with a non-negative intercept) plus the
      time of every other collective.

    Both streams are serial, so a simulated step is never shorter than either term.
    """
    return Simulator(graph, costs, cluster).lower_bound()

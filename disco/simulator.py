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
    """A kernel or collective of one contracted plan (internal; cached across plans)."""

    __slots__ = ("is_coll", "members", "preds", "dur", "prio", "name", "succs", "trigger", "delta",
                 "items")

    def __init__(self, is_coll: bool, members: tuple[int, ...], preds: tuple[int, ...], dur: float,
                 prio: int, name: str, succs: tuple[int, ...], delta: float = 0.0):
        self.is_coll = is_coll
        self.members = members
        self.preds = preds  # real (non-virtual) nodes outside the unit that it reads
        self.dur = dur
        self.prio = prio  # program position: the first compute member (kernels), first member (collectives)
        self.name = name  # label of an unfused unit
        self.succs = succs  # real nodes outside the unit that read it
        self.trigger = max(preds) if preds else -1
        self.delta = delta  # fused time minus the members' unfused times (groups)
        self.items: tuple[tuple[int, _Unit | None], ...] = ()  # a group's scan-table entries


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
                if p >= i:
                    raise ValueError(f"graph {graph.name!r}: edge {nodes[p].name!r} -> {nodes[i].name!r} "
                                     "goes backwards; expected nodes in topological order")
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
                # The full buffer: a reduce-scatter's result is one device's shard.
                scale = p if COLLECTIVE_KIND[node.opcode] == "reduce-scatter" else 1
                self._cbytes[i] = node.out_bytes * scale
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
            self._singles[i] = _Unit(kind[i] == _COLL, (i,), rp[i], dur, i, nodes[i].name, self._rs[i])
        self._ars = [i for i in range(n) if nodes[i].opcode in ("all-reduce", "all-reduce-start")]
        self._ar_set = frozenset(self._ars)
        self._other_colls = [self._singles[i] for i in range(n) if kind[i] == _COLL and i not in self._ar_set]
        self._group_cache: dict[tuple[str, ...], _Unit] = {}
        self._bucket_cache: dict[tuple[int, ...], _Unit] = {}
        self._bucket_names: dict[tuple[str, ...], _Unit] = {}
        self._default_buckets = self._combiner_buckets(None)

    # -- plan contraction ------------------------------------------------------------------------
    def _resolve(self, names: Sequence[str], what: str) -> tuple[int, ...]:
        idx = self._index
        try:
            return tuple(sorted({idx[nm] for nm in names}))
        except KeyError as e:
            raise ValueError(f"{what}: instruction {e.args[0]!r} is not in the graph {self.graph.name!r}") from None
        except TypeError:
            raise ValueError(f"{what}: expected a sequence of instruction names, got {names!r}") from None

    def _group_unit(self, gi: int, names: tuple[str, ...]) -> _Unit:
        u = self._group_cache.get(names)
        if u is not None:
            return u
        members = self._resolve(names, f"group {gi}")
        if not members:
            raise ValueError(f"group {gi} is empty; expected at least one instruction name")
        bad = [self.graph.nodes[m].name for m in members if self._kind[m] == _COLL]
        if bad:
            raise ValueError(f"group {gi}: {bad[0]!r} is a collective; groups hold compute ops")
        mset = set(members)
        preds = tuple(sorted({p for m in members for p in self._rp[m] if p not in mset}))
        succs = tuple(sorted({s for m in members for s in self._rs[m] if s not in mset}))
        dur = self.costs.kernel_time(self.kernels.kernel(members)) / self.cluster.compute_speed
        # The group runs where its first compute member is (zero-cost members are never scanned).
        anchor = min((m for m in members if self._kind[m] == _KERNEL), default=-1)
        delta = dur - sum(self._kdur[m] for m in members)
        u = _Unit(False, members, preds, dur, anchor, "", succs, delta)
        if anchor >= 0:
            u.items = tuple((m, None) for m in members) + ((anchor, u),)
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
            u = _Unit(True, members, preds, dur, members[0], "", succs)
            self._bucket_cache[members] = u
        return u

    def _bucket_by_names(self, bi: int, names: tuple[str, ...]) -> _Unit:
        u = self._bucket_names.get(names)
        if u is None:
            members = self._resolve(names, f"bucket {bi}")
            bad = [self.graph.nodes[m].name for m in members if m not in self._ar_set]
            if bad or not members:
                raise ValueError(f"bucket {bi}: expected all-reduce instruction names, got "
                                 f"{bad[:3] if bad else 'none'}")
            u = self._bucket_unit(members)
            self._bucket_names[names] = u
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
        return [self._bucket_unit(tuple(by_level[lv])) for lv in sorted(by_level)]

    def _ar_levels(self, groups: list[_Unit] | None) -> dict[int, int]:
        """Per all-reduce, the number of all-reduces on the longest chain above it."""
        units, unit_of = self._contracted(groups or [], [self._singles[i] for i in self._ars])
        order = self._toposort(units, unit_of)
        lvl = [0] * len(units)
        for u in order:
            best = 0
            for p in units[u].preds:
                pu = unit_of[p]
                v = lvl[pu] + (1 if p in self._ar_set else 0)
                if v > best:
                    best = v
            lvl[u] = best
        return {a: lvl[unit_of[a]] for a in self._ars}

    def _contracted(self, groups: list[_Unit], colls: list[_Unit]) -> tuple[list[_Unit], list[int]]:
        """The units of a plan and node -> unit index (-1 for zero-cost nodes)."""
        unit_of = [-1] * self._n
        units: list[_Unit] = []
        for u in [*groups, *colls]:
            for m in u.members:
                unit_of[m] = len(units)
            units.append(u)
        for i in range(self._n):
            if self._kind[i] != _VIRTUAL and unit_of[i] < 0:
                unit_of[i] = len(units)
                units.append(self._singles[i])
        return units, unit_of

    def _toposort(self, units: list[_Unit], unit_of: list[int]) -> list[int]:
        """Units in a topological order (priority: program position).

        Raises:
          ValueError: naming units on a cycle.
        """
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
            nodes = self.graph.nodes
            stuck = sorted({nodes[m].name for ui in range(len(units)) if indeg[ui] > 0
                            for m in units[ui].members})
            raise ValueError(f"contracting the plan forms a cycle through {stuck[:6]}; "
                             "check the plan with disco.plan_check.validate")
        return order

    def _prepare(self, plan: FusionPlan) -> tuple[list[_Unit], list[_Unit]]:
        """(group units, collective units) of ``plan``.

        Raises:
          ValueError: for names not in the graph, overlapping groups or overlapping buckets.
        """
        groups = []
        used: set[int] = set()
        count = 0
        group_unit = self._group_unit
        for gi, names in enumerate(plan.groups):
            u = group_unit(gi, names)
            used.update(u.members)
            count += len(u.members)
            if len(used) != count:
                self._raise_overlap(plan)
            if u.prio >= 0:  # a group of only zero-cost ops (e.g. constants) is not a kernel
                groups.append(u)
        if plan.buckets is None:
            colls = list(self._default_buckets)
        else:
            colls = []
            seen: set[int] = set()
            count = 0
            for bi, b in enumerate(plan.buckets):
                u = self._bucket_by_names(bi, b.members)
                seen.update(u.members)
                count += len(u.members)
                if len(seen) != count:
                    self._raise_overlap(plan)
                colls.append(u)
            if count != len(self._ars):
                colls += [self._singles[a] for a in self._ars if a not in seen]
        if self._other_colls:
            colls += self._other_colls
        return groups, colls

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

    def _labels(self, plan: FusionPlan, groups: list[_Unit], colls: list[_Unit]) -> dict[int, str]:
        labels: dict[int, str] = {}
        if plan.groups:
            by_members = {u.members: gi for gi, u in
                          ((gi, self._group_cache[names]) for gi, names in enumerate(plan.groups))}
            for u in groups:
                labels[id(u)] = f"fusion.{by_members[u.members]}"
        if plan.buckets is None:
            for lv, u in enumerate(c for c in colls if c.name == ""):
                labels[id(u)] = f"combined.{lv}"
        else:
            for bi, b in enumerate(plan.buckets):
                labels[id(self._bucket_names[b.members])] = f"bucket.{bi}"
        return labels

    # -- the sweeps --------------------------------------------------------------------------------
    def _fast(self, groups: list[_Unit], colls: list[_Unit]) -> tuple[float, float, float]:
        """(step, compute, comm) in program order, no timeline: the hot path of the search."""
        end = [_INF] * self._n
        waiters: dict[int, list[_Unit]] = {}
        heap: list[tuple[int, int, _Unit]] = []
        singles = self._singles
        special: dict[int, _Unit | None] = {}
        counter = [0]
        state = [0.0, 0.0]  # t_c, t_m for the rare paths

        def attempt(u: _Unit) -> bool:
            r = 0.0
            for p in u.preds:
                e = end[p]
                if e > r:
                    r = e
            if r == _INF:
                for p in u.preds:
                    if end[p] == _INF:
                        waiters.setdefault(p, []).append(u)
                        break
                if not u.is_coll:
                    for s in u.succs:
                        if s not in special:
                            special[s] = singles[s]
                return False
            k = 1 if u.is_coll else 0
            t = state[k]
            fin = (r if r > t else t) + u.dur
            state[k] = fin
            for m in u.members:
                end[m] = fin
            return True

        def wake(members: tuple[int, ...]) -> None:
            pending: list[_Unit] = []
            todo = [members]
            while todo or pending or heap:
                if todo:
                    for m in todo.pop():
                        ws = waiters.pop(m, None)
                        if ws:
                            for w in ws:
                                if w.is_coll:
                                    pending.append(w)
                                else:
                                    counter[0] += 1
                                    heapq.heappush(heap, (w.prio, counter[0], w))
                    continue
                w = pending.pop(0) if pending else heapq.heappop(heap)[2]
                if attempt(w):
                    todo.append(w.members)

        for c in colls:  # register every collective before any can complete
            if c.trigger >= 0:
                waiters.setdefault(c.trigger, []).append(c)
        for c in colls:
            if c.trigger < 0 and attempt(c):
                wake(c.members)
        for g in groups:
            for s in g.succs:
                special[s] = singles[s]
        for g in groups:
            special.update(g.items)
        compute = self._base_kernel_total
        for g in groups:
            compute += g.delta

        kdur = self._kdur
        cpreds = self._cpreds
        t_c = state[0]
        for i in self._scan:
            if i in special:
                u = special[i]
                if u is None:
                    continue
                r = t_c
                for p in u.preds:
                    e = end[p]
                    if e > r:
                        r = e
                if r == _INF:
                    state[0] = t_c
                    attempt(u)  # registers it as waiting
                    continue
                t_c = r + u.dur
                for m in u.members:
                    end[m] = t_c
                for m in u.members:
                    if m in waiters:
                        state[0] = t_c
                        wake(u.members)
                        t_c = state[0]
                        break
                continue
            cp = cpreds[i]
            if cp:
                r = t_c
                for p in cp:
                    e = end[p]
                    if e > r:
                        r = e
                if r == _INF:
                    state[0] = t_c
                    attempt(singles[i])
                    continue
                t_c = r + kdur[i]
            else:
                t_c += kdur[i]
            end[i] = t_c
            if i in waiters:
                state[0] = t_c
                wake((i,))
                t_c = state[0]
        if waiters:
            raise _Deadlock()
        t_m = state[1]
        comm = 0.0
        for c in colls:
            comm += c.dur
        return (t_c if t_c > t_m else t_m), compute, comm

    def _sweep(self, groups: list[_Unit], colls: list[_Unit], order: str,
               labels: dict[int, str]) -> SimResult:
        """The general sweep: any order, records the timeline and critical path."""
        n = self._n
        end = [_INF] * n
        waiters: dict[int, list[_Unit]] = {}
        heap: list[tuple[Any, int, _Unit]] = []
        nodes = self.graph.nodes
        events: list[Event] = []
        binding: list[int] = []  # per event: the event that bound its start, or -1
        node_event = [-1] * n
        last = [-1, -1]  # last event index on compute / comm
        state = [0.0, 0.0]
        counter = [0]
        prio = self._priorities(groups, colls) if order == "topological" else None

        def key(u: _Unit) -> Any:
            return prio[id(u)] if prio is not None else u.prio

        def attempt(u: _Unit) -> bool:
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
                return False
            k = 1 if u.is_coll else 0
            free = state[k]
            start = r if r > free else free
            fin = start + u.dur
            state[k] = fin
            ei = len(events)
            members = tuple(nodes[m].name for m in u.members)
            events.append(Event(labels.get(id(u)) or u.name or members[0], "comm" if k else "compute",
                                start, fin, members))
            if arg >= 0 and r >= free:
                binding.append(node_event[arg])
            else:
                binding.append(last[k] if free > 0 else -1)
            last[k] = ei
            for m in u.members:
                end[m] = fin
                node_event[m] = ei
            return True

        def run_unit(u: _Unit) -> None:
            if not attempt(u):
                return
            pending: list[_Unit] = []
            todo = [u.members]
            while todo or pending or heap:
                if todo:
                    for m in todo.pop():
                        for w in waiters.pop(m, ()):
                            if w.is_coll:
                                pending.append(w)
                            else:
                                counter[0] += 1
                                heapq.heappush(heap, (key(w), counter[0], w))
                    continue
                w = pending.pop(0) if pending else heapq.heappop(heap)[2]
                if attempt(w):
                    todo.append(w.members)

        for c in colls:  # register every collective before any can complete
            if c.trigger >= 0:
                waiters.setdefault(c.trigger, []).append(c)
        for c in colls:
            if c.trigger < 0:
                run_unit(c)
        special: dict[int, _Unit | None] = {}
        for g in groups:
            special.update(g.items)
        units = [u for u in (special.get(i, self._singles[i]) for i in self._scan) if u is not None]
        if prio is not None:
            units.sort(key=key)
        for u in units:
            run_unit(u)
        if waiters:
            raise _Deadlock()
        t_c, t_m = state
        step = t_c if t_c > t_m else t_m
        compute = self._base_kernel_total + sum(g.delta for g in groups)
        comm = sum(c.dur for c in colls)
        path: list[str] = []
        if events:
            ei = max(range(len(events)), key=lambda k: (events[k].end, k))
            while ei >= 0:
                path.append(events[ei].name)
                ei = binding[ei]
            path.reverse()
        return SimResult(step_time=step, compute_time=compute, comm_time=comm,
                         exposed_comm=max(0.0, step - compute), critical_path=tuple(path),
                         timeline=tuple(events))

    def _priorities(self, groups: list[_Unit], colls: list[_Unit]) -> dict[int, tuple[float, int]]:
        """Per unit (by id): (-remaining path length, program position)."""
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
        attempts = [colls]
        if plan.buckets is None and groups and self._ars:
            # If one combined bucket deadlocks against the groups: one bucket per level of the
            # graph with the groups contracted.
            attempts.append(None)
        for cs in attempts:
            if cs is None:
                cs = self._combiner_buckets(groups) + self._other_colls
            try:
                if record or order != "program":
                    return self._sweep(groups, cs, order, self._labels(plan, groups, cs))
                step, compute, comm = self._fast(groups, cs)
                return SimResult(step_time=step, compute_time=compute, comm_time=comm,
                                 exposed_comm=max(0.0, step - compute))
            except _Deadlock:
                continue
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
        comm += sum(c.dur for c in self._other_colls)
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

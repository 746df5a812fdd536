"""Delta simulation: a plan's step time from a simulated neighbour's, re-scheduling only what moved.

FlexFlow's simulator re-simulates only the part of the timeline a change touches (delta
simulation). :class:`DeltaSimulator` does the same for :class:`disco.sim.simulator.Simulator`,
exactly: ``DeltaSimulator(sim).step_time(plan, parent)`` is ``sim.step_time(plan)`` bit for bit
(``==``), for every plan. The full simulation stays the reference; this is its fast path for a
search, which prices plans one move away from plans it has priced.

How. A :class:`Trace` is the simulated state of one plan: its patch (:mod:`disco.sim.patch`),
and, per event of its schedule in placement order, the unit placed and the two streams' free
times after it; per graph node, the event that placed its unit and that unit's end. For a new
plan and the trace of a neighbour (its parent in the search, else the last plan priced):

1. Its units are compared with the neighbour's by identity (units are cached by their members
   and build, so a unit that a move leaves alone is the same object): the *removed* and the
   *added* units.
2. The schedules agree up to the first event that places a removed unit or could place an added
   one (the first event after all of its inputs from unchanged units are placed): up to there the
   scheduler makes the same choices (a removed unit that was ready but not chosen changed no
   choice; an added unit was not yet ready).
3. The scheduler's state at that event is rebuilt from the trace (which inputs of each later unit
   are placed and their latest end; which units are ready, in which queue; the streams' free
   times) and :func:`disco.sim.scheduler.sweep`, the full simulation's own loop, runs the rest.

A change no unit sees (a group inside one of XLA's fusions, a cut between two ops XLA would not
fuse) costs only its patch and the comparison. Anything this does not cover falls back to the full
simulation: another fusion mode or stream coupling than the neighbour's, ``order="topological"``,
a plan whose schedule deadlocks (the full simulation's retry and errors apply).

Example:
  >>> delta = DeltaSimulator(Simulator(graph, costs, cluster))  # doctest: +SKIP
  >>> t0 = delta.step_time(plan)                                  # doctest: +SKIP
  >>> t1 = delta.step_time(child, parent=plan)                    # == sim.step_time(child)
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from disco.plans.plan import FusionPlan
from disco.sim import scheduler

if TYPE_CHECKING:
    from disco.sim.patch import Patch
    from disco.sim.simulator import Simulator
    from disco.sim.units import Mode, Unit

__all__ = ["DeltaSimulator", "Trace"]

_NEVER = 1 << 62  # the event index of a node no unit holds (virtual), or not yet placed


class Trace:
    """The simulated state of one plan (internal): what :class:`DeltaSimulator` restarts from.

    A trace is *materialised* when its per-event and per-node lists are filled; a trace made by a
    delta holds its parent, the event it restarted at and the events placed from there instead,
    until it is first used as a neighbour.

    Attributes:
      plan: the plan (cached by identity).
      patch: its patch.
      step: its step time.
      order: per event, the unit placed (None until materialised).
      tcs, tms: per event, the compute and comm streams' free times after it.
      pos_node, fin_node: per graph node, the event that placed its unit and that unit's end.
    """

    __slots__ = ("plan", "patch", "step", "order", "tcs", "tms", "pos_node", "fin_node", "new_ids", "dead",
                 "_parent", "_start", "_placed", "_dur")

    def __init__(self, plan: FusionPlan, patch: Patch, step: float, parent: Trace | None, start: int,
                 placed: list[tuple[int, float]], dur: list[float]):
        self.plan = plan
        self.patch = patch
        self.step = step
        nb = len(patch.mode.units)
        self.new_ids = {id(u): nb + k for k, u in enumerate(patch.new)}  # unit object -> id in this plan
        self.dead = frozenset(patch.dead)
        self.order: list[Unit] | None = None
        self.tcs: list[float] = []
        self.tms: list[float] = []
        self.pos_node: list[int] = []
        self.fin_node: list[float] = []
        self._parent = parent
        self._start = start
        self._placed = placed
        self._dur = dur

    def unit(self, uid: int) -> Unit:
        """The unit with id ``uid`` in this plan's arrays (base units, then the patch's new ones)."""
        units = self.patch.mode.units
        return units[uid] if uid < len(units) else self.patch.new[uid - len(units)]

    def materialise(self, n_nodes: int) -> None:
        """Fills the per-event and per-node lists (from the parent's, for a delta's trace)."""
        if self.order is not None:
            return
        parent, i, placed = self._parent, self._start, self._placed
        if parent is None:
            order: list[Unit] = []
            tcs: list[float] = []
            tms: list[float] = []
            pos = [_NEVER] * n_nodes
            fin = [0.0] * n_nodes
        else:
            parent.materialise(n_nodes)
            if not placed and i == len(parent.order):  # the same schedule: share the parent's lists
                self.order, self.tcs, self.tms = parent.order, parent.tcs, parent.tms
                self.pos_node, self.fin_node = parent.pos_node, parent.fin_node
                self._parent = None
                return
            order, tcs, tms = parent.order[:i], parent.tcs[:i], parent.tms[:i]
            pos, fin = parent.pos_node[:], parent.fin_node[:]
        t_c = tcs[-1] if tcs else 0.0
        t_m = tms[-1] if tms else 0.0
        blocking = self.patch.blocking
        dur = self._dur
        ev = i
        for u, start in placed:
            unit = self.unit(u)
            f = start + dur[u]  # the scheduler's own sum
            if unit.is_coll:
                t_m = f
                if blocking:
                    t_c = f
            else:
                t_c = f
            order.append(unit)
            tcs.append(t_c)
            tms.append(t_m)
            for m in unit.members:
                pos[m] = ev
                fin[m] = f
            ev += 1
        self.order, self.tcs, self.tms, self.pos_node, self.fin_node = order, tcs, tms, pos, fin
        self._parent = None
        self._placed = []


class DeltaSimulator:
    """Incremental step times for one simulator: each plan re-scheduled from its neighbour's trace.

    Args:
      sim: the simulator (the reference: every result equals ``sim.step_time``).
      cache_size: how many plans' traces it keeps (the most recently priced or used).

    Raises:
      TypeError: for a ``sim`` that is not a :class:`~disco.sim.simulator.Simulator`.
      ValueError: for a ``cache_size`` below 1.

    Example:
      >>> delta = DeltaSimulator(sim)                       # doctest: +SKIP
      >>> delta.step_time(child, parent=plan) == sim.step_time(child)  # doctest: +SKIP
      True
    """

    def __init__(self, sim: Simulator, *, cache_size: int = 16):
        from disco.sim.simulator import Simulator

        if not isinstance(sim, Simulator):
            raise TypeError(f"sim: expected a disco Simulator, got {type(sim).__name__}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size: expected an integer >= 1, got {cache_size!r}")
        self.sim = sim
        self._patcher = sim._patcher
        self._n = len(sim.graph.nodes)
        self._cache_size = cache_size
        self._traces: dict[int, Trace] = {}  # id(plan) -> trace, least recently used first
        self._last: Trace | None = None
        self._base_ids: dict[str, dict[int, int]] = {}  # per fusion mode: unit object -> base id
        self.stats = {"full": 0, "delta": 0, "same": 0, "events": 0}

    # -- public API --------------------------------------------------------------------------------
    def step_time(self, plan: FusionPlan, parent: FusionPlan | None = None) -> float:
        """``sim.step_time(plan)``, re-scheduled from the trace of ``parent`` (else of the last plan).

        Args:
          plan: the plan to price.
          parent: a plan priced before (by this object), e.g. the one ``plan`` is a move away
            from; None, or one no longer cached: the last plan priced.

        Returns:
          The step time in seconds, equal to ``sim.step_time(plan)``.

        Raises:
          TypeError, ValueError: as ``Simulator.step_time``.
        """
        if not isinstance(plan, FusionPlan):
            return self.sim.step_time(plan)  # raises its TypeError
        hit = self._get(plan)
        if hit is not None:
            return hit.step
        base = self._get(parent) if parent is not None else None
        if base is None:
            base = self._last
        trace = None
        if base is not None:
            base.materialise(self._n)
            trace = self._delta(base, plan)
        if trace is None:
            trace = self._full(plan)
            if trace is None:  # deadlocked (or raises): the full simulation's retry and errors
                return self.sim.step_time(plan)
        self._put(trace)
        return trace.step

    def trace(self, plan: FusionPlan) -> Trace | None:
        """The cached trace of ``plan`` (materialised), or None."""
        t = self._get(plan)
        if t is not None:
            t.materialise(self._n)
        return t

    # -- internals ---------------------------------------------------------------------------------
    def _get(self, plan: FusionPlan) -> Trace | None:
        t = self._traces.get(id(plan))
        if t is None or t.plan is not plan:
            return None
        del self._traces[id(plan)]  # most recently used last
        self._traces[id(plan)] = t
        return t

    def _put(self, trace: Trace) -> None:
        self._traces.pop(id(trace.plan), None)
        self._traces[id(trace.plan)] = trace
        while len(self._traces) > self._cache_size:
            del self._traces[next(iter(self._traces))]
        self._last = trace

    def _base_id(self, mode: Mode) -> dict[int, int]:
        hit = self._base_ids.get(mode.fusion)
        if hit is None:
            hit = self._base_ids[mode.fusion] = {id(u): k for k, u in enumerate(mode.units)}
        return hit

    def _full(self, plan: FusionPlan) -> Trace | None:
        """A trace from scratch (the full simulation, recorded); None when it deadlocks."""
        patcher = self._patcher
        patch = patcher.patch(plan)
        unit_of, indeg, dur, key, succ, coll, ready_k, ready_c = patcher.arrays(patch)
        placed: list[tuple[int, float]] = []
        try:
            step = scheduler.schedule(unit_of, unit_of, indeg, dur, key, succ, coll, ready_k, ready_c,
                                      len(patch.dead), patch.blocking, placed)
        except scheduler.Deadlock:
            return None
        self.stats["full"] += 1
        return Trace(plan, patch, step, None, 0, placed, dur)

    def _delta(self, base: Trace, plan: FusionPlan) -> Trace | None:
        """``plan``'s trace re-scheduled from ``base`` (materialised); None where only the full
        simulation applies."""
        patch = self._patcher.patch(plan)
        old = base.patch
        mode = patch.mode
        if mode is not old.mode or patch.blocking != old.blocking:
            return None
        bid = self._base_id(mode)
        units = mode.units
        new_ids, old_ids = {id(u): len(units) + k for k, u in enumerate(patch.new)}, base.new_ids
        dead_n, dead_o = frozenset(patch.dead), base.dead

        def alive_new(u: Unit) -> bool:
            k = bid.get(id(u))
            return id(u) in new_ids or (k is not None and k not in dead_n)

        def alive_old(u: Unit) -> bool:
            k = bid.get(id(u))
            return id(u) in old_ids or (k is not None and k not in dead_o)

        removed = [u for u in old.new if not alive_new(u)]
        removed += [units[d] for d in dead_n - dead_o if not alive_new(units[d])]
        added = [u for u in patch.new if not alive_old(u)]
        added += [units[d] for d in dead_o - dead_n if not alive_old(units[d])]
        order = base.order
        assert order is not None
        if not removed and not added:
            self.stats["same"] += 1
            return Trace(plan, patch, base.step, base, len(order), [], [])
        pos_node, fin_node = base.pos_node, base.fin_node
        # The first event the change can move: a removed unit's, or the first at which an added unit
        # could be ready (all its inputs from unchanged units placed).
        changed = {m for u in removed for m in u.members}
        changed.update(m for u in added for m in u.members)
        i = min((pos_node[u.members[0]] for u in removed), default=len(order))
        for u in added:
            b = 0
            for p in u.preds:
                if p in changed:  # an input in an added unit: that unit is placed first
                    break
                q = pos_node[p] + 1
                if q > b:
                    b = q
            else:
                if b < i:
                    i = b
        unit_of, indeg, dur, key, succ, coll, _, _ = self._patcher.arrays(patch)
        # The units still to place: the neighbour's from event i on that the plan keeps, and the added.
        rest: list[int] = []
        for u in order[i:]:
            k = new_ids.get(id(u))
            if k is None:
                k = bid.get(id(u))
                if k is None or k in dead_n:
                    continue  # removed
            rest.append(k)
        for u in added:
            k = new_ids.get(id(u))
            rest.append(bid[id(u)] if k is None else k)
        t_c = base.tcs[i - 1] if i else 0.0
        t_m = base.tms[i - 1] if i else 0.0
        rt = [0.0] * len(dur)
        rk: list[int] = []
        tc: list[tuple[float, int]] = []
        tk: list[tuple[float, int]] = []
        nb = len(units)
        new = patch.new
        for w in rest:
            unit = units[w] if w < nb else new[w - nb]
            c = 0
            r = 0.0
            for p in unit.preds:
                if pos_node[p] < i:  # placed before event i: an unchanged unit, placed there in both
                    c += 1
                    f = fin_node[p]
                    if f > r:
                        r = f
            k = unit.indeg - c
            indeg[w] = k
            rt[w] = r
            if not k:
                if coll[w]:
                    tc.append((r, key[w]))
                elif r <= t_c:
                    rk.append(key[w])
                else:
                    tk.append((r, key[w]))
        heapq.heapify(rk)
        heapq.heapify(tc)
        heapq.heapify(tk)
        placed: list[tuple[int, float]] = []
        try:
            step = scheduler.sweep(unit_of, unit_of, indeg, dur, key, succ, coll, rk, tc, tk, rt, t_c, t_m,
                                   len(patch.dead) + i, patch.blocking, placed)
        except scheduler.Deadlock:
            return None
        self.stats["delta"] += 1
        self.stats["events"] += len(placed)
        return Trace(plan, patch, step, base, i, placed, dur)

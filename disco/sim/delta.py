"""Delta simulation: a plan's step time from a simulated neighbour's, re-scheduling only what moved.

FlexFlow's simulator re-simulates only the part of the timeline a change touches (delta
simulation). :class:`DeltaSimulator` does the same for :class:`disco.sim.simulator.Simulator`,
exactly: ``DeltaSimulator(sim).step_time(plan, parent)`` is ``sim.step_time(plan)`` bit for bit
(``==``), for every plan. The full simulation stays the reference; this is its fast path for a
search, which prices plans one move away from plans it has priced.

How. A :class:`Trace` is the simulated state of one plan: its patch by piece
(:mod:`disco.sim.pieces`), per event of its schedule in placement order the unit placed and the two
streams' free times after it, and per unit the event that placed it and its end. For a new plan and
the trace of its parent (the plan the search made it from; traced when first given as a parent):

1. The plan is re-patched from the parent's pieces, re-making only the regions, groups and
   buckets the move touched, and its units are compared with the parent's by identity (units are
   cached by their members and build, so a unit that a move leaves alone is the same object; two
   that differ only in their label, a re-fused kernel named for the group it now holds, count as
   one): the *removed* and the *added* units.
2. The schedules agree up to the first event that places a removed unit or could place an added
   one (the first event after all of its inputs from unchanged units are placed): up to there the
   scheduler makes the same choices (a removed unit that was ready but not chosen changed no
   choice; an added unit was not yet ready).
3. The scheduler's state at that event is rebuilt from the trace (which inputs of each later unit
   are placed and their latest end; which units are ready, in which queue; the streams' free
   times) and :func:`disco.sim.scheduler.sweep`, the full simulation's own loop, runs the rest.

A change no unit sees (a group inside one of XLA's fusions, a cut between two ops XLA would not
fuse) costs only its re-patch and the comparison. Anything this does not cover is simulated whole:
a plan without a parent, another fusion mode or stream coupling than the parent's, a plan whose
schedule deadlocks (the full simulation's retry and errors apply). Only ``order="program"`` step
times are incremental; ``Simulator.run`` (timelines) and ``order="topological"`` stay full.

Example:
  >>> delta = DeltaSimulator(Simulator(graph, costs, cluster))  # doctest: +SKIP
  >>> t0 = delta.step_time(plan)                                  # doctest: +SKIP
  >>> t1 = delta.step_time(child, parent=plan)                    # == sim.step_time(child)
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from typing import TYPE_CHECKING

from disco.plans.plan import FusionPlan
from disco.sim import pieces as plan_pieces
from disco.sim import scheduler

if TYPE_CHECKING:
    from disco.sim.pieces import Pieces
    from disco.sim.simulator import Simulator
    from disco.sim.units import Unit

__all__ = ["DeltaSimulator", "Trace"]

_NEVER = 1 << 62  # the event index of a unit not placed


class Trace:
    """The simulated state of one plan (internal): what :class:`DeltaSimulator` restarts from.

    Unit ids are the :class:`DeltaSimulator`'s: one per (fusion mode, kind, members, duration), for
    good. A trace is *materialised* when its per-event and per-unit lists are filled; a trace made by
    a delta holds its parent, the event it restarted at and the events it placed from there instead,
    until it is first used as a parent.

    Attributes:
      pieces: its patch by piece (:mod:`disco.sim.pieces`); None for a plan priced whole (no trace).
      step: its step time.
      unit_of: per graph node, the id of its unit (-1 for none).
      alive: how many units it runs.
      order: per event, the id of the unit placed (None until materialised).
      tcs, tms: per event, the compute and comm streams' free times after it.
      pos, fin: per unit id, the event that placed it (:data:`_NEVER` for none) and its end.
    """

    __slots__ = ("pieces", "step", "unit_of", "alive", "order", "tcs", "tms", "pos", "fin",
                 "_parent", "_start", "_placed")

    def __init__(self, pieces: Pieces | None, step: float, unit_of: list[int], alive: int,
                 parent: Trace | None, start: int, placed: list[tuple[int, float]]):
        self.pieces = pieces
        self.step = step
        self.unit_of = unit_of
        self.alive = alive
        self.order: list[int] | None = None
        self.tcs: list[float] = []
        self.tms: list[float] = []
        self.pos: list[int] = []
        self.fin: list[float] = []
        self._parent = parent
        self._start = start
        self._placed = placed

    def materialise(self, units: list[Unit], dur: list[float]) -> None:
        """Fills the per-event and per-node lists (from the parent's, for a delta's trace)."""
        if self.order is not None:
            return
        parent, i, placed = self._parent, self._start, self._placed
        n = len(units)
        if parent is None:
            order: list[int] = []
            tcs: list[float] = []
            tms: list[float] = []
            pos = [_NEVER] * n
            fin = [0.0] * n
        else:
            parent.materialise(units, dur)
            assert parent.order is not None
            if not placed and i == len(parent.order):  # the same schedule: share the parent's lists
                self.order, self.tcs, self.tms = parent.order, parent.tcs, parent.tms
                self.pos, self.fin = parent.pos, parent.fin
                self._parent = None
                return
            order, tcs, tms = parent.order[:i], parent.tcs[:i], parent.tms[:i]
            pos, fin = parent.pos[:], parent.fin[:]
            if len(pos) < n:  # units met since
                pos += [_NEVER] * (n - len(pos))
                fin += [0.0] * (n - len(fin))
            # (the parent's later units keep their entries: the kept are placed again below, and no
            # node maps to the others)
        t_c = tcs[-1] if tcs else 0.0
        t_m = tms[-1] if tms else 0.0
        ids = [u for u, _ in placed]
        ends = [start + dur[u] for u, start in placed]  # the scheduler's own sums
        coll = [units[u].is_coll for u in ids]
        # Each stream's free time after each event: the latest end on it so far (its ends only grow).
        assert self.pieces is not None  # a trace priced whole is never materialised (see _base)
        on_compute = ends if self.pieces.blocking else [0.0 if c else f for f, c in zip(ends, coll)]
        tcs += itertools.accumulate(on_compute, max, initial=t_c)
        del tcs[i]  # the initial value
        tms += itertools.accumulate([f if c else 0.0 for f, c in zip(ends, coll)], max, initial=t_m)
        del tms[i]
        for u, e, f in zip(ids, range(i, i + len(ids)), ends):
            pos[u] = e
            fin[u] = f
        order += ids
        self.order, self.tcs, self.tms, self.pos, self.fin = order, tcs, tms, pos, fin
        self._parent = None
        self._placed = []


class DeltaSimulator:
    """Incremental step times for one simulator: each plan re-scheduled from a neighbour's trace.

    A plan's trace is kept while the plan object lives (a search holds the plans it may expand:
    its queue, its current plan, its best), and at most ``cache_size`` of them, the most recently
    priced or used.

    Args:
      sim: the simulator (the reference: every result equals ``sim.step_time``).
      cache_size: the most traces it keeps.

    Raises:
      TypeError: for a ``sim`` that is not a :class:`~disco.sim.simulator.Simulator`.
      ValueError: for a ``cache_size`` below 1.

    Example:
      >>> delta = DeltaSimulator(sim)                       # doctest: +SKIP
      >>> delta.step_time(child, parent=plan) == sim.step_time(child)  # doctest: +SKIP
      True
    """

    def __init__(self, sim: Simulator, *, cache_size: int = 256):
        from disco.sim.simulator import Simulator

        if not isinstance(sim, Simulator):
            raise TypeError(f"sim: expected a disco Simulator, got {type(sim).__name__}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size: expected an integer >= 1, got {cache_size!r}")
        self.sim = sim
        self._patcher = sim._patcher
        self._cache_size = cache_size
        # id(plan) -> (a weak reference to the plan, its trace), least recently used first
        self._traces: dict[int, tuple[weakref.ref, Trace]] = {}
        # Every unit met, by id: one id per (fusion mode, kind, members, duration), so two unit objects
        # that schedule alike (a re-fused kernel labelled by the group it holds) share one.
        self._gid: dict[tuple, int] = {}
        self._units: list[Unit] = []
        self._dur: list[float] = []
        self._key: list[int] = []
        self._succ: list[tuple[tuple[int, int], ...]] = []
        self._coll: list[bool] = []
        self._indeg: list[int] = []  # scratch: only the entries of units still to place are read
        self._rt: list[float] = []
        # plans priced whole, re-scheduled, found to run the same units; traces made; events placed
        self.stats = {"full": 0, "delta": 0, "same": 0, "traces": 0, "events": 0}

    # -- public API --------------------------------------------------------------------------------
    def step_time(self, plan: FusionPlan, parent: FusionPlan | None = None) -> float:
        """``sim.step_time(plan)``, re-scheduled from the trace of ``parent``.

        Without a ``parent`` the plan is simulated whole (its trace is made when it is first given
        as a parent: most start plans of a search never are).

        Args:
          plan: the plan to price.
          parent: a plan ``plan`` is a few moves away from (priced before, by this object, or not:
            its trace is made then, once, for all its children); None: a full simulation.

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
        base = self._base(parent) if parent is not None else None
        trace = self._delta(base, parent, plan) if base is not None else None
        if trace is None:  # the full simulation (its retry and errors); the trace when a parent
            trace = Trace(None, self.sim.step_time(plan), [], 0, None, 0, [])
            self.stats["full"] += 1
        self._put(plan, trace)
        return trace.step

    def trace(self, plan: FusionPlan) -> Trace | None:
        """The cached trace of ``plan`` (materialised; made now if it was priced whole), or None."""
        if self._get(plan) is None:
            return None
        return self._base(plan)

    def __len__(self) -> int:
        """How many plans' traces it keeps (a plan's goes when the plan object does)."""
        return len(self._traces)

    # -- internals ---------------------------------------------------------------------------------
    def _get(self, plan: FusionPlan) -> Trace | None:
        hit = self._traces.get(id(plan))
        if hit is None or hit[0]() is not plan:
            return None
        del self._traces[id(plan)]  # most recently used last
        self._traces[id(plan)] = hit
        return hit[1]

    def _put(self, plan: FusionPlan, trace: Trace) -> None:
        key = id(plan)
        traces = self._traces
        traces.pop(key, None)
        ref = weakref.ref(plan, lambda r, key=key, traces=traces: traces.pop(key, None) if traces.get(
            key, (None,))[0] is r else None)
        traces[key] = (ref, trace)
        while len(traces) > self._cache_size:
            del traces[next(iter(traces))]

    def _base(self, parent: FusionPlan) -> Trace | None:
        """``parent``'s trace, materialised (made from scratch if it has none); None where it cannot
        be (not a plan this simulator can price, or one whose schedule deadlocks)."""
        t = self._get(parent)
        if t is None or t.pieces is None:
            if not isinstance(parent, FusionPlan):
                return None
            try:
                t = self._full(parent)
            except ValueError:
                return None
            if t is None:
                return None
            self._put(parent, t)
        t.materialise(self._units, self._dur)
        return t

    def _ids(self, units: list[Unit], fusion: str) -> list[int]:
        """Each unit's id, giving new units the next ones."""
        gid = self._gid
        out = []
        for u in units:
            key = (fusion, u.is_coll, u.members, u.dur)
            k = gid.get(key)
            if k is None:
                k = gid[key] = len(self._units)
                self._units.append(u)
                self._dur.append(u.dur)
                self._key.append(u.prio)
                self._succ.append(u.succ)
                self._coll.append(u.is_coll)
                self._indeg.append(0)
                self._rt.append(0.0)
            out.append(k)
        return out

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
        local = self._ids(patch.mode.units + patch.new, patch.mode.fusion)  # this plan's unit ids -> ours
        self.stats["traces"] += 1
        return Trace(plan_pieces.build(patcher, plan), step, [local[u] if u >= 0 else -1 for u in unit_of],
                     len(dur) - len(patch.dead), None, 0, [(local[u], t) for u, t in placed])

    def _delta(self, base: Trace, base_plan: FusionPlan, plan: FusionPlan) -> Trace | None:
        """``plan``'s trace re-scheduled from ``base``, the materialised trace of ``base_plan``; None
        where only the full simulation applies."""
        hit = plan_pieces.repatch(self._patcher, base.pieces, base_plan, plan)
        if hit is None:
            return None
        pieces, removed, added = hit
        fusion = pieces.mode.fusion
        if removed and added:  # a unit removed and added again alike (only its label differs) stays
            alike = {(u.is_coll, u.members, u.dur): u for u in removed}
            added = [u for u in added if alike.pop((u.is_coll, u.members, u.dur), None) is None]
            removed = list(alike.values())
        order = base.order
        assert order is not None
        if not removed and not added:
            self.stats["same"] += 1
            return Trace(pieces, base.step, base.unit_of, base.alive, base, len(order), [])
        pos, fin, old_of = base.pos, base.fin, base.unit_of
        gid = self._gid
        gone = sorted(pos[gid[fusion, u.is_coll, u.members, u.dur]] for u in removed)  # their events
        # The first event the change can move: a removed unit's, or the first at which an added unit
        # could be ready (all its inputs from unchanged units placed).
        changed = {m for u in removed for m in u.members}
        changed.update(m for u in added for m in u.members)
        i = gone[0] if gone else len(order)
        for u in added:
            b = 0
            for p in u.preds:
                if p in changed:  # an input in an added unit: that unit is placed first
                    break
                q = pos[old_of[p]] + 1
                if q > b:
                    b = q
            else:
                if b < i:
                    i = b
        new_ids = self._ids(added, fusion)
        unit_of = old_of[:]
        for u, k in zip(added, new_ids):
            for m in u.members:
                unit_of[m] = k
        units, key, coll = self._units, self._key, self._coll
        # The units still to place: the neighbour's from event i on that the plan keeps, and the added.
        rest = order[i:]
        for e in reversed(gone):
            del rest[e - i]
        rest += new_ids
        t_c = base.tcs[i - 1] if i else 0.0
        t_m = base.tms[i - 1] if i else 0.0
        indeg, rt = self._indeg, self._rt
        rk: list[int] = []
        tc: list[tuple[float, int]] = []
        tk: list[tuple[float, int]] = []
        for w in rest:
            unit = units[w]
            c = 0
            r = 0.0
            for p in unit.preds:
                v = old_of[p]
                if pos[v] < i:  # placed before event i: an unchanged unit, placed there in both
                    c += 1
                    f = fin[v]
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
        alive = base.alive - len(removed) + len(added)
        placed: list[tuple[int, float]] = []
        dur = self._dur
        try:
            step = scheduler.sweep(unit_of, unit_of, indeg, dur, key, self._succ, coll, rk, tc, tk, rt, t_c, t_m,
                                   len(dur) - alive + i, pieces.blocking, placed)
        except scheduler.Deadlock:
            return None
        self.stats["delta"] += 1
        self.stats["events"] += len(placed)
        return Trace(pieces, step, unit_of, alive, base, i, placed)

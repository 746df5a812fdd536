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
   times) and the full simulation's loop (:func:`disco.sim.scheduler.sweep`) runs the rest:
   :func:`disco.sim.array_sweep.restart` does both, on flat arrays, compiled with numba.

A plan priced without a parent is scheduled whole the same way and keeps its schedule; its patch by
piece is made when it is first a parent. Its patch's group part (over every group) is kept by value,
so plans that share their groups (a search's start plans: one fusion with each bucketing) patch
only their buckets.

A plan's gather anchors replace the units at their dependencies' two ends by waited copies
(:meth:`disco.sim.patch.Patcher.wait_patch`); the pieces hold the units before that, and
:meth:`DeltaSimulator._rewait` turns their difference into the difference of the units the two plans
run (a shifted anchor: its old and new ends' units, and the gather's).

A change no unit sees (a group inside one of XLA's fusions, a cut between two ops XLA would not
fuse) costs only its re-patch and the comparison. Anything this does not cover is scheduled whole:
a plan without a parent, another fusion mode or stream coupling than the parent's; a plan whose
schedule deadlocks is priced by the simulator itself (its retry and errors apply). Only ``order="program"`` step
times are incremental; ``Simulator.run`` (timelines) and ``order="topological"`` stay full.

Example:
  >>> delta = DeltaSimulator(Simulator(graph, costs, cluster))  # doctest: +SKIP
  >>> t0 = delta.step_time(plan)                                  # doctest: +SKIP
  >>> t1 = delta.step_time(child, parent=plan)                    # == sim.step_time(child)
"""

from __future__ import annotations

import functools
import gc
import itertools
import weakref
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from disco.plans.plan import FusionPlan
from disco.sim import array_sweep
from disco.sim import pieces as plan_pieces
from disco.sim.units import unit_key

if TYPE_CHECKING:
    from disco.sim.pieces import Pieces
    from disco.sim.simulator import Simulator
    from disco.sim.units import Mode, Unit

__all__ = ["DeltaSimulator", "Trace"]

_NEVER = array_sweep.NEVER  # the event index of a unit not placed
_NO_I = np.zeros(0, np.int64)
_NO_F = np.zeros(0)
_GROUP_PARTS = 8  # how many plans' group parts of their patches are kept, by value
# From how many graph nodes a delta simulator freezes the collector's view of the base state (see
# DeltaSimulator): below it a full collection is cheap.
FREEZE_MIN_NODES = 4000


class _GroupPart(NamedTuple):
    """The group part of a plan's patch as unit ids (see ``DeltaSimulator._group_part``); read only.

    Attributes:
      base_ids: per base unit of the plan's fusion mode, its id.
      keep: per base unit, whether the group part keeps it.
      new_ids: the ids of the units the group part adds.
      unit_of: per graph node, its unit's id after the group part.
    """

    base_ids: np.ndarray
    keep: np.ndarray
    new_ids: np.ndarray
    unit_of: np.ndarray


class Trace:
    """The simulated state of one plan (internal): what :class:`DeltaSimulator` restarts from.

    Unit ids are the :class:`DeltaSimulator`'s: one per (fusion mode, kind, members, duration), for
    good. A trace is *materialised* when its per-event and per-unit arrays are filled; a trace made by
    a delta holds its parent, the event it restarted at and the events it placed from there instead,
    until it is first used as a parent.

    Attributes:
      pieces: its patch by piece (:mod:`disco.sim.pieces`); None until it is first a parent, or for
        a plan priced whole by the simulator (``order`` None too: no trace).
      step: its step time.
      unit_of: per graph node, the id of its unit (-1 for none).
      alive: how many units it runs.
      order: per event, the id of the unit placed (None until materialised).
      tcs, tms: per event, the compute and comm streams' free times after it.
      pos, fin: per unit id, the event that placed it (:data:`~disco.sim.array_sweep.NEVER` for
        none) and its end.
    """

    __slots__ = ("pieces", "step", "unit_of", "alive", "order", "tcs", "tms", "pos", "fin",
                 "_parent", "_start", "_run")

    def __init__(self, pieces: Pieces | None, step: float, unit_of: np.ndarray | None, alive: int,
                 parent: Trace | None, start: int, run: array_sweep.Run | None):
        self.pieces = pieces
        self.step = step
        self.unit_of = unit_of
        self.alive = alive
        self.order: np.ndarray | None = None
        self.tcs = self.tms = self.fin = _NO_F
        self.pos = _NO_I
        self._parent = parent
        self._start = start
        self._run = run

    def materialise(self, n: int) -> None:
        """Fills the per-event and per-unit arrays (from the parent's, for a delta's trace), for
        unit ids up to ``n``."""
        if self.order is not None:
            return
        parent, i, run = self._parent, self._start, self._run
        if parent is not None:
            parent.materialise(n)
            assert parent.order is not None
            if run is None:  # the same schedule: share the parent's arrays
                self.order, self.tcs, self.tms = parent.order, parent.tcs, parent.tms
                self.pos, self.fin = parent.pos, parent.fin
                self._parent = None
                return
            order = np.concatenate((parent.order[:i], run.units))
            tcs = np.concatenate((parent.tcs[:i], run.tcs))
            tms = np.concatenate((parent.tms[:i], run.tms))
            # (the parent's later units keep their entries: the kept are placed again below, and no
            # node maps to the others)
            pos, fin = _grown(parent.pos, n, _NEVER), _grown(parent.fin, n, 0.0)
        elif run is None:
            return  # priced whole by the simulator: nothing to fill (see DeltaSimulator._base)
        else:
            order, tcs, tms = run.units, run.tcs, run.tms
            pos = np.full(n, _NEVER, np.int64)
            fin = np.zeros(n)
        pos[run.units] = np.arange(i, i + len(run.units))
        fin[run.units] = run.ends
        self.order, self.tcs, self.tms, self.pos, self.fin = order, tcs, tms, pos, fin
        self._parent = None
        self._run = None


class DeltaSimulator:
    """Incremental step times for one simulator: each plan re-scheduled from a neighbour's trace.

    A plan's trace is kept while the plan object lives (a search holds the plans it may expand:
    its queue, its current plan, its best), and at most ``cache_size`` of them, the most recently
    priced or used.

    The simulator's base state (the graph, each fusion mode's base units and their ids) is
    hundreds of thousands of Python objects on a large graph, alive as long as the simulator, and
    Python's cyclic collector traversed all of them in each full collection, about once per few
    hundred evaluations (at 46k nodes ~170 ms each, a sixth of the time). With ``freeze_gc``, once
    a fusion mode's base units have their ids (on its first plan) it runs one full collection and
    then :func:`gc.freeze`: every object alive then moves to the collector's permanent generation,
    which later collections do not traverse. Those objects are still freed by reference counting
    as usual; only a reference cycle among them that becomes garbage later is not collected until
    :meth:`release` (:func:`gc.unfreeze`). It changes no result. The freeze is process-wide (it holds
    whatever else the process has alive then, too), so it is off unless asked for: the search asks for
    it on large graphs (:func:`disco.search.run`) and releases it when it returns.

    Args:
      sim: the simulator (the reference: every result equals ``sim.step_time``).
      cache_size: the most traces it keeps.
      freeze_gc: freeze the collector's view of the base state as above (False, the default: never);
        None: for graphs of at least :data:`FREEZE_MIN_NODES` nodes.

    Raises:
      TypeError: for a ``sim`` that is not a :class:`~disco.sim.simulator.Simulator`.
      ValueError: for a ``cache_size`` below 1.

    Example:
      >>> delta = DeltaSimulator(sim)                       # doctest: +SKIP
      >>> delta.step_time(child, parent=plan) == sim.step_time(child)  # doctest: +SKIP
      True
    """

    def __init__(self, sim: Simulator, *, cache_size: int = 256, freeze_gc: bool | None = False):
        from disco.sim.simulator import Simulator

        if not isinstance(sim, Simulator):
            raise TypeError(f"sim: expected a disco Simulator, got {type(sim).__name__}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size: expected an integer >= 1, got {cache_size!r}")
        if freeze_gc is not None and not isinstance(freeze_gc, bool):
            raise TypeError(f"freeze_gc: expected True, False or None, got {freeze_gc!r}")
        self.sim = sim
        self._freeze_gc = len(sim.graph.nodes) >= FREEZE_MIN_NODES if freeze_gc is None else freeze_gc
        self._froze = False
        self._patcher = sim._patcher
        self._cache_size = cache_size
        # id(plan) -> (a weak reference to the plan, its trace), least recently used first
        self._traces: dict[int, tuple[weakref.ref, Trace]] = {}
        # Every unit met, by id (shared by the delta simulators over one simulator): one id per
        # (fusion mode, kind, members, duration), so two unit objects that schedule alike (a re-fused
        # kernel labelled by the group it holds) share one.
        self._index = array_sweep.index_of(sim)
        self._group_pieces: dict = {}  # plans' group parts of their pieces, by value (pieces.build)
        self._group_parts: dict[tuple, _GroupPart] = {}  # ... and of their whole patches (_group_part)
        # plans priced whole, re-scheduled, found to run the same units; traces made; events placed
        self.stats = {"full": 0, "delta": 0, "same": 0, "traces": 0, "events": 0}

    # -- public API --------------------------------------------------------------------------------
    def release(self) -> None:
        """Undoes this simulator's freeze of the collector (:func:`gc.unfreeze`, process-wide: every
        frozen object goes back to the oldest generation), if it froze it; a no-op otherwise."""
        if self._froze:
            gc.unfreeze()
            self._froze = False

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
        if trace is None:  # from scratch, recorded; else the full simulation (its retry and errors)
            try:
                trace = self._scratch(plan, "full")
            except ValueError:
                trace = None
            if trace is None:
                trace = Trace(None, self.sim.step_time(plan), None, 0, None, 0, None)
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
        ref = weakref.ref(plan, functools.partial(_forget, weakref.ref(self), key))
        traces[key] = (ref, trace)
        while len(traces) > self._cache_size:
            del traces[next(iter(traces))]

    def _base(self, parent: FusionPlan) -> Trace | None:
        """``parent``'s trace, materialised (made from scratch if it has none); None where it cannot
        be (not a plan this simulator can price, or one whose schedule deadlocks)."""
        t = self._get(parent)
        if t is None or (t.pieces is None and t.unit_of is None):  # none, or priced by the simulator
            if not isinstance(parent, FusionPlan):
                return None
            try:
                t = self._scratch(parent, "traces")
            except ValueError:
                return None
            if t is None:
                return None
            self._put(parent, t)
        if t.pieces is None:  # a schedule made whole: its patch by piece, once it is a parent
            t.pieces = plan_pieces.build(self._patcher, parent, self._group_pieces)
        t.materialise(self._index.table.n)
        return t

    def _scratch(self, plan: FusionPlan, stat: str) -> Trace | None:
        """A trace of a plan priced without a neighbour: its whole schedule (counted in
        ``stats[stat]``); None when it deadlocks.

        Raises:
          ValueError: as ``Patcher.patch``.
        """
        trace = self._full(plan)
        if trace is not None:
            self.stats[stat] += 1
        return trace

    def _full(self, plan: FusionPlan) -> Trace | None:
        """The plan's whole schedule, recorded (its patch by piece is made when it is a parent); None
        when it deadlocks.

        Its patch is :meth:`Patcher.patch`'s in its two parts: the group part (the groups and cuts,
        over every group) kept by value (:meth:`_group_part`), for plans that share it; the rest (its
        buckets, gather buckets and options) made for each plan.

        Raises:
          ValueError: as ``Patcher.patch``.
        """
        patcher, index = self._patcher, self._index
        mode = patcher.mode(plan.xla_fusion)
        part = self._group_part(plan, mode)
        dead: list[int] = []
        new: list[Unit] = []
        _, _, blocking, _ = patcher.bucket_patch(plan, mode, dead, new)
        unit_of = _relabel(part.unit_of, new, index.ids(new, mode.fusion))
        keep = part.keep
        if dead:
            keep = keep.copy()
            keep[dead] = False
        rest = np.concatenate((part.base_ids[keep], part.new_ids, unit_of[[u.members[0] for u in new]]))
        if plan.gather_after:  # the units at a gather anchor's ends, replaced by their waited copies
            pairs = patcher.waits(mode, patcher.wait_edges(plan, mode), lambda x: index.unit(int(unit_of[x])))
            if pairs:
                gone = [index.id_of(u, mode.fusion) for u, _ in pairs]
                copies = [w for _, w in pairs]
                unit_of = _relabel(unit_of, copies, index.ids(copies, mode.fusion))
                rest = np.concatenate((rest[~np.isin(rest, gone)], unit_of[[w.members[0] for w in copies]]))
        run = array_sweep.restart(index.table, rest, 0, 0.0, 0.0, _NO_I, _NO_F, unit_of, unit_of, blocking)
        if run is None:
            return None
        return Trace(None, run.step, unit_of, len(rest), None, 0, run)

    def _group_part(self, plan: FusionPlan, mode: Mode) -> _GroupPart:
        """The group part of the plan's patch (:meth:`Patcher.group_patch`) as unit ids, kept by the
        plan's fusion mode, groups and cuts (their values) for the plans that share them (a search's
        start plans: one fusion with each bucketing), the most recent :data:`_GROUP_PARTS`.

        Raises:
          ValueError: as ``Patcher.group_patch`` (nothing is kept then).
        """
        key = (plan.xla_fusion, plan.groups, self._patcher.cuts_of(plan))
        parts = self._group_parts
        part = parts.get(key)
        if part is None:
            dead, new, _ = self._patcher.group_patch(plan, mode, summed=False)
            fresh = not self._index.has_mode(mode.fusion)
            base_ids, base_of = self._index.mode(mode.fusion, mode.units, mode.unit_of)
            if fresh and self._freeze_gc:  # the mode's base state is built: out of the collector's way
                gc.collect()
                gc.freeze()
                self._froze = True
            new_ids = self._index.ids(new, mode.fusion)
            keep = np.ones(len(base_ids), bool)
            keep[dead] = False
            part = _GroupPart(base_ids, keep, np.array(new_ids, np.int64), _relabel(base_of, new, new_ids))
            while len(parts) >= _GROUP_PARTS:
                del parts[next(iter(parts))]
            parts[key] = part
        return part

    def _delta(self, base: Trace, base_plan: FusionPlan, plan: FusionPlan) -> Trace | None:
        """``plan``'s trace re-scheduled from ``base``, the materialised trace of ``base_plan``; None
        where only the full simulation applies."""
        hit = plan_pieces.repatch(self._patcher, base.pieces, base_plan, plan)
        if hit is None:
            return None
        pieces, removed, added = hit
        fusion = pieces.mode.fusion
        if removed and added:  # a unit removed and added again alike (only its label differs) stays
            alike = {unit_key(u): u for u in removed}
            added = [u for u in added if alike.pop(unit_key(u), None) is None]
            removed = list(alike.values())
        if plan.gather_after or base_plan.gather_after:
            removed, added = self._rewait(pieces.mode, base, base_plan, plan, removed, added)
        order = base.order
        assert order is not None
        if not removed and not added:
            self.stats["same"] += 1
            return Trace(pieces, base.step, base.unit_of, base.alive, base, len(order), None)
        pos, fin, old_of = base.pos, base.fin, base.unit_of
        id_of = self._index.id_of
        gone = sorted(int(pos[id_of(u, fusion)]) for u in removed)  # their events
        # The first event the change can move: a removed unit's, or the first at which an added unit
        # could be ready (all its inputs from unchanged units placed).
        i = gone[0] if gone else len(order)
        if added:
            i = min(i, _first_ready(added, removed, pos, old_of))
        new_ids = self._index.ids(added, fusion)
        unit_of = _relabel(old_of, added, new_ids)
        # The units still to place: the neighbour's from event i on that the plan keeps, and the added.
        rest = order[i:]
        if gone:
            rest = np.delete(rest, np.array(gone, np.int64) - i)
        if new_ids:
            rest = np.concatenate((rest, np.array(new_ids, np.int64)))
        t_c = float(base.tcs[i - 1]) if i else 0.0
        t_m = float(base.tms[i - 1]) if i else 0.0
        run = array_sweep.restart(self._index.table, rest, i, t_c, t_m, pos, fin, old_of, unit_of, pieces.blocking)
        if run is None:
            return None
        self.stats["delta"] += 1
        self.stats["events"] += len(run.units)
        return Trace(pieces, run.step, unit_of, base.alive - len(removed) + len(added), base, i, run)


    def _rewait(self, mode: Mode, base: Trace, base_plan: FusionPlan, plan: FusionPlan, removed: list[Unit],
                added: list[Unit]) -> tuple[list[Unit], list[Unit]]:
        """The units removed and added with the plans' gather anchors, from those without them.

        ``removed`` and ``added`` are the difference of the two plans' units before their anchors'
        waited copies replace some (:meth:`Patcher.wait_patch`). With ``R``, ``A`` those, and each plan's
        replaced units and copies (``dom``, ``img``; the neighbour's ``b``, the plan's ``p``), compared
        by :func:`~disco.sim.units.unit_key`: removed are the ``R`` not in ``dom_b``, the ``img_b`` not in
        ``img_p`` and the ``dom_p`` neither in ``A`` nor in ``dom_b``; added are the ``A`` not in ``dom_p``,
        the ``img_p`` not in ``img_b`` and the ``dom_b`` neither in ``R`` nor in ``dom_p``.
        """
        patcher, index = self._patcher, self._index
        old_of = base.unit_of

        def before(x: int) -> Unit:  # the neighbour's unit of node x before its anchors
            u = index.unit(int(old_of[x]))
            return u.orig if u.orig is not None else u

        held = {m: u for u in added for m in u.members}

        def now(x: int) -> Unit:  # the plan's, before its anchors
            u = held.get(x)
            return u if u is not None else before(x)

        pairs_b = patcher.waits(mode, patcher.wait_edges(base_plan, mode), before) if base_plan.gather_after else []
        pairs_p = patcher.waits(mode, patcher.wait_edges(plan, mode), now) if plan.gather_after else []
        if not pairs_b and not pairs_p:
            return removed, added
        key = unit_key
        dom_b, img_b = {key(u) for u, _ in pairs_b}, {key(w) for _, w in pairs_b}
        dom_p, img_p = {key(u) for u, _ in pairs_p}, {key(w) for _, w in pairs_p}
        r_keys, a_keys = {key(u) for u in removed}, {key(u) for u in added}
        out_r = [u for u in removed if key(u) not in dom_b]
        out_r += [w for _, w in pairs_b if key(w) not in img_p]
        out_r += [u for u, _ in pairs_p if key(u) not in a_keys and key(u) not in dom_b]
        out_a = [u for u in added if key(u) not in dom_p]
        out_a += [w for _, w in pairs_p if key(w) not in img_b]
        out_a += [u for u, _ in pairs_b if key(u) not in r_keys and key(u) not in dom_p]
        return out_r, out_a


def _forget(owner: weakref.ref, key: int, ref: weakref.ref) -> None:
    """Drops the trace of a plan that is gone (the callback of the plan's weak reference ``ref``).

    It reaches the traces through the delta simulator, held weakly. A callback that held the
    traces' dict itself closed a cycle (the dict -> its entry -> the reference -> the callback ->
    the dict), so a dropped simulator's traces stayed until the cyclic collector's next full
    collection: at 46k nodes up to 256 traces of ~2.5 MB each, hundreds of MB that the next
    search's traces could not reuse and took as fresh pages instead (page faults that halved the
    evaluations per second, measured on CPU 2026-12-02).
    """
    delta = owner()
    if delta is not None and delta._traces.get(key, (None,))[0] is ref:
        del delta._traces[key]


def _grown(a: np.ndarray, n: int, fill: float) -> np.ndarray:
    """A copy of ``a`` of length ``n`` (``fill`` after its end)."""
    if len(a) >= n:
        return a[:n].copy()
    out = np.empty(n, a.dtype)
    out[:len(a)] = a
    out[len(a):] = fill
    return out


def _first_ready(added: list[Unit], removed: list[Unit], pos: np.ndarray, old_of: np.ndarray) -> int:
    """The first event at which an added unit could be ready in the neighbour's schedule: the event
    after the last of its inputs from unchanged units (``pos``: per unit id its event; ``old_of``:
    per node the neighbour's unit id), over the added units none of whose inputs is in a changed
    unit (such an input's unit is placed first); :data:`_NEVER` for none.
    """
    chain = itertools.chain.from_iterable
    changed = np.zeros(len(old_of), np.bool_)
    changed[np.fromiter(chain(u.members for u in itertools.chain(removed, added)), np.int64)] = True
    preds = np.fromiter(chain(u.preds for u in added), np.int64)
    seg = np.repeat(np.arange(len(added)), [len(u.preds) for u in added])
    blocked = np.bincount(seg, weights=changed[preds], minlength=len(added)) > 0
    ready = np.zeros(len(added), np.int64)  # (a unit without inputs: event 0)
    np.maximum.at(ready, seg, pos[old_of[preds]] + 1)
    ready = ready[~blocked]
    return int(ready.min()) if len(ready) else _NEVER


def _relabel(unit_of: np.ndarray, units: list[Unit], ids: list[int]) -> np.ndarray:
    """A copy of ``unit_of`` (node -> unit id) with the members of ``units`` mapped to ``ids``."""
    out = unit_of.copy()
    if units:
        out[np.fromiter(itertools.chain.from_iterable(u.members for u in units), np.int64)] = np.repeat(
            np.array(ids, np.int64), [len(u.members) for u in units])
    return out

"""The scheduler's sweep over flat numpy arrays, restartable, compiled with numba when it is installed.

:class:`disco.sim.delta.DeltaSimulator` re-schedules a plan from the event its change first moves.
That costs one :func:`disco.sim.scheduler.sweep` step per later event, about a microsecond each in
Python; here the same loop runs on arrays (a :class:`UnitTable` of every unit met, by id) and is
compiled with numba (``njit``), about fifteen times faster (~50 ns an event). :func:`restart` also rebuilds the
scheduler's state at the restart event (which inputs of each unit still to place were placed
before it, and their latest end), which was the other per-unit Python loop of a delta.

The loop is :func:`disco.sim.scheduler.sweep`'s, statement for statement: the same comparisons, the
same float sums in the same order, so its step times are the same floats (``==``). Its three
ready queues are binary heaps on arrays instead of :mod:`heapq` lists; every entry's key is unique
(a unit's key is its first member's program position), so any correct heap pops them in the same
order. Without numba (:func:`is_compiled` is False) the same source runs as plain Python on lists:
about four times slower than :func:`~disco.sim.scheduler.sweep`, the same results.
"""

from __future__ import annotations

import itertools
import threading
import types
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from disco.sim.units import Unit

__all__ = ["NEVER", "Neighbour", "Run", "UnitIndex", "UnitTable", "index_of", "is_compiled", "restart"]

NEVER = 1 << 62  # the event index of a unit not placed
_INF = float("inf")


def _push(ht, hk, n, t, k):
    """Pushes (t, k) on the heap of the first ``n`` entries of (ht, hk); returns the new size."""
    j = n
    while j > 0:
        p = (j - 1) >> 1
        pt = ht[p]
        if pt < t or (pt == t and hk[p] < k):
            break
        ht[j] = pt
        hk[j] = hk[p]
        j = p
    ht[j] = t
    hk[j] = k
    return n + 1


def _pop(ht, hk, n):
    """Removes the smallest (t, k) of the heap of ``n`` entries (returned by the caller from [0]
    first); returns the new size."""
    n -= 1
    t = ht[n]
    k = hk[n]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        ct = ht[c]
        ck = hk[c]
        if c + 1 < n:
            dt = ht[c + 1]
            dk = hk[c + 1]
            if dt < ct or (dt == ct and dk < ck):
                c += 1
                ct = dt
                ck = dk
        if t < ct or (t == ct and k < ck):
            break
        ht[j] = ct
        hk[j] = ck
        j = c
    if n > 0:
        ht[j] = t
        hk[j] = k
    return n


def _restart(rest, i, t_c, t_m, pos, fin, old_of, unit_of, dur, key, coll, indeg0, pptr, pnode, sptr, snode,
             scnt, indeg, rt, blocking, rk_t, rk_k, tc_t, tc_k, tk_t, tk_k, out_u, out_f, out_tc, out_tm,
             watch, porder, ptcs, ptms, pstep, chg, cnode, n_rem, n_add, nfin, xs):
    """Rebuilds the scheduler's state at event ``i`` and runs the rest of the step (the kernel).

    With ``watch``, it also follows the neighbour's schedule (``porder``, ``ptcs``, ``ptms``,
    ``pstep``; ``chg``: per unit id 1 for a unit only the neighbour runs, 2 for one only this plan
    runs, else 0; ``cnode``: per node, whether such a unit holds it) and stops where this schedule's
    state becomes the neighbour's state after one of its events: every changed unit placed in both,
    the same other units placed, the streams' free times equal, and every unit still to place that
    reads a changed unit or one placed at another end equally ready (see :func:`_rejoins`). From
    there the two schedules are the same events (the state after an event is what
    :func:`_restart` rebuilds at a restart: which units are placed, their ends and the streams'
    free times).

    Returns (step time, events placed, the neighbour's event it rejoined at or -1); the events'
    units, ends and the streams' free times after each are written to ``out_*``.
    """
    # The state at event i: per unit still to place, its inputs placed before i and their latest end.
    nrk = 0
    ntc = 0
    ntk = 0
    nx = 0  # (watch) the units still to place that read a changed node, in xs[:nx]
    for j in range(len(rest)):
        w = rest[j]
        c = 0
        r = 0.0
        if i > 0:
            reads = False
            for q in range(pptr[w], pptr[w + 1]):
                x = pnode[q]
                if watch and cnode[x]:
                    reads = True
                v = old_of[x]
                if pos[v] < i:  # placed before event i: an unchanged unit, placed there in both
                    c += 1
                    f = fin[v]
                    if f > r:
                        r = f
            if reads and chg[w] == 0:
                chg[w] = 3  # (in xs; otherwise an unchanged unit)
                xs[nx] = w
                nx += 1
        k = indeg0[w] - c
        indeg[w] = k
        rt[w] = r
        if k == 0:
            if coll[w]:
                ntc = _push(tc_t, tc_k, ntc, r, key[w])
            elif r <= t_c:
                nrk = _push(rk_t, rk_k, nrk, 0.0, key[w])
            else:
                ntk = _push(tk_t, tk_k, ntk, r, key[w])
    # disco.sim.scheduler.sweep's loop (see there), with the events recorded.
    cc = t_c  # the compute and comm streams' free times after each event (the latest end on each)
    mm = t_m
    done = 0
    # (watch) Following the neighbour: its events up to pp are the ones this schedule's first events
    # are compared with (d = how many more events it has); one counts the unchanged units placed in
    # one of the two only; rem and add the changed units not yet placed. An unchanged unit placed in
    # both at different ends is changed for its readers: they join xs.
    pp = i - 1
    d = n_rem - n_add
    one = 0
    rem = n_rem
    add = n_add
    retry = -_INF  # the compute stream's time after which a failed comparison is tried again
    if ntc:
        limit = tc_t[0] if tc_t[0] > t_m else t_m
    else:
        limit = _INF
    while True:
        while ntk and tk_t[0] <= t_c:
            nrk = _push(rk_t, rk_k, nrk, 0.0, tk_k[0])
            ntk = _pop(tk_t, tk_k, ntk)
        if nrk and t_c < limit:
            u = unit_of[rk_k[0]]
            nrk = _pop(rk_t, rk_k, nrk)
            fin_u = t_c + dur[u]
            t_c = fin_u
            is_coll = False
        elif not nrk and ntk and tk_t[0] < limit:
            t_c = tk_t[0]
            continue
        elif ntc:
            u = unit_of[tc_k[0]]
            ntc = _pop(tc_t, tc_k, ntc)
            start = limit if not blocking or limit > t_c else t_c
            fin_u = start + dur[u]
            t_m = fin_u
            is_coll = True
        else:
            break
        out_u[done] = u
        out_f[done] = fin_u
        if is_coll:
            if fin_u > mm:
                mm = fin_u
            if blocking and fin_u > cc:
                cc = fin_u
        elif fin_u > cc:
            cc = fin_u
        out_tc[done] = cc
        out_tm[done] = mm
        done += 1
        for q in range(sptr[u], sptr[u + 1]):
            w = unit_of[snode[q]]
            k = indeg[w] - scnt[q]
            indeg[w] = k
            if fin_u > rt[w]:
                rt[w] = fin_u
            if not k:
                if coll[w]:
                    ntc = _push(tc_t, tc_k, ntc, rt[w], key[w])
                    r = tc_t[0]
                    limit = r if r > t_m else t_m
                elif rt[w] <= t_c:
                    nrk = _push(rk_t, rk_k, nrk, 0.0, key[w])
                else:
                    ntk = _push(tk_t, tk_k, ntk, rt[w], key[w])
        if is_coll:
            if blocking:
                t_c = fin_u
            if ntc:
                r = tc_t[0]
                limit = r if r > t_m else t_m
            else:
                limit = _INF
        if watch:
            if chg[u] == 2:
                add -= 1
            else:
                nfin[u] = fin_u
                if pos[u] <= pp:
                    one -= 1
                    if fin[u] != fin_u:
                        nx = _mark_readers(u, xs, nx, chg, nfin, unit_of, sptr, snode)
                else:
                    one += 1
            target = i + done - 1 + d
            while pp < target:
                pp += 1
                v = porder[pp]
                if chg[v] == 1:
                    rem -= 1
                elif nfin[v] >= 0.0:
                    one -= 1
                    if nfin[v] != fin[v]:
                        nx = _mark_readers(v, xs, nx, chg, nfin, unit_of, sptr, snode)
                else:
                    one += 1
            if (pp == target and not one and not rem and not add and t_c > retry and cc == ptcs[pp]
                    and mm == ptms[pp]):
                nx, retry = _rejoins(xs, nx, pp, t_c, pos, fin, old_of, nfin, indeg, rt, coll, indeg0, pptr, pnode)
                if not nx:
                    return pstep, done, pp
    return (t_c if t_c > t_m else t_m), done, -1


def _mark_readers(u, xs, nx, chg, nfin, unit_of, sptr, snode):
    """Appends to ``xs[:nx]`` the units still to place that read unit ``u`` (not in it yet, nor
    changed: ``chg`` 0, then 3); returns the new count."""
    for q in range(sptr[u], sptr[u + 1]):
        w = unit_of[snode[q]]
        if chg[w] == 0 and nfin[w] < 0.0:
            chg[w] = 3
            xs[nx] = w
            nx += 1
    return nx


def _rejoins(xs, nx, pp, t_c, pos, fin, old_of, nfin, indeg, rt, coll, indeg0, pptr, pnode):
    """Whether each unit of ``xs[:nx]`` still to place (it reads a changed unit) is as ready here as
    in the neighbour's state after its event ``pp``: as many of its inputs placed, and the same
    latest end of them, or (a kernel whose inputs are all placed) both ends at most the compute
    stream's time ``t_c``, where the ready queue orders kernels by program position alone.

    Returns (0 where the states are the same, else how many of ``xs`` are still to place, kept
    first in ``xs``; the compute stream's time after which to compare again).
    """
    keep = 0
    retry = t_c
    for j in range(nx):
        w = xs[j]
        if nfin[w] >= 0.0:  # placed since (at the neighbour's end: its difference is counted)
            continue
        c = 0
        r = 0.0
        for q in range(pptr[w], pptr[w + 1]):
            v = old_of[pnode[q]]
            if pos[v] <= pp:
                c += 1
                f = fin[v]
                if f > r:
                    r = f
        same = indeg[w] == indeg0[w] - c and (rt[w] == r or (indeg[w] == 0 and not coll[w]
                                                            and rt[w] <= t_c and r <= t_c))
        if not same:
            if rt[w] > retry:
                retry = rt[w]
            if r > retry:
                retry = r
            for jj in range(j, nx):  # (the rest are not compared: one difference is enough)
                xs[keep] = xs[jj]
                keep += 1
            return keep, retry
        xs[keep] = w
        keep += 1
    return 0, retry


def _compile():
    """The kernel compiled with numba (None without numba): :func:`_restart` with its heap
    functions compiled too (a copy of it whose globals name the compiled ones)."""
    try:
        import numba
    except ImportError:
        return None
    jit = numba.njit(cache=True, nogil=True)
    scope = dict(globals(), _push=jit(_push), _pop=jit(_pop), _rejoins=jit(_rejoins),
                 _mark_readers=jit(_mark_readers))
    kernel = types.FunctionType(_restart.__code__, scope, _restart.__name__)
    kernel.__qualname__ = _restart.__qualname__
    kernel.__module__ = _restart.__module__
    return jit(kernel)


_KERNEL: list = []  # [the compiled kernel or None], filled on first use (importing numba takes a second)


def is_compiled() -> bool:
    """Whether :func:`restart` runs compiled (numba is installed); compiles the kernel on first call."""
    if not _KERNEL:
        _KERNEL.append(_compile())
    return _KERNEL[0] is not None


class UnitTable:
    """Every unit met, by id, as flat arrays (grown as units are added; each growth is a new snapshot).

    Attributes:
      arrays: (n, dur, key, coll, indeg, pptr, pnode, sptr, snode, scnt): how many units, and per
        unit id its seconds, key (program position), whether it is a collective and its count of
        outside inputs; its inputs (nodes), CSR: ``pnode[pptr[u]:pptr[u + 1]]``; its readers
        (node, count), CSR. One tuple, replaced whole by :meth:`add`, so a reader that takes it
        once sees one consistent table.
    """

    def __init__(self) -> None:
        i0 = np.zeros(0, np.int64)
        self.arrays = (0, np.zeros(0), i0, np.zeros(0, np.bool_), i0, np.zeros(1, np.int64), i0,
                       np.zeros(1, np.int64), i0, i0)

    @property
    def n(self) -> int:
        """How many units."""
        return self.arrays[0]

    def add(self, units: Sequence[Unit]) -> None:
        """Appends ``units`` (their ids are the next ones)."""
        if not units:
            return
        n, dur, key, coll, indeg, pptr, pnode, sptr, snode, scnt = self.arrays
        chain = itertools.chain.from_iterable
        pairs = np.fromiter(chain(chain(u.succ) for u in units), np.int64).reshape(-1, 2)
        self.arrays = (
            n + len(units),
            np.concatenate((dur, np.array([u.dur for u in units], np.float64))),
            np.concatenate((key, np.array([u.prio for u in units], np.int64))),
            np.concatenate((coll, np.array([u.is_coll for u in units], np.bool_))),
            np.concatenate((indeg, np.array([u.indeg for u in units], np.int64))),
            np.concatenate((pptr, pptr[-1] + np.cumsum([len(u.preds) for u in units], dtype=np.int64))),
            np.concatenate((pnode, np.fromiter(chain(u.preds for u in units), np.int64))),
            np.concatenate((sptr, sptr[-1] + np.cumsum([len(u.succ) for u in units], dtype=np.int64))),
            np.concatenate((snode, pairs[:, 0])),
            np.concatenate((scnt, pairs[:, 1])),
        )


class UnitIndex:
    """Unit ids for one simulator's units, shared by every delta simulator over it (:func:`index_of`).

    One id per (fusion mode, kind, members, duration, added dependencies), for good: two unit objects
    that schedule alike (a re-fused kernel labelled by the group it holds) share one. Thread-safe.

    Attributes:
      table: per unit id, what the scheduler reads.
    """

    def __init__(self) -> None:
        self.table = UnitTable()
        self._gid: dict[tuple, int] = {}
        self._by_obj: dict[int, int] = {}  # id(unit object) -> its id (the objects are held in _held)
        self._held: list[Unit] = []
        self._first: list[Unit] = []  # per id, the first unit object given it
        self._modes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def ids(self, units: Sequence[Unit], fusion: str) -> list[int]:
        """Each unit's id, giving new units the next ones."""
        by_obj = self._by_obj
        out = [by_obj.get(id(u), -1) for u in units]
        if -1 in out:
            with self._lock:
                gid = self._gid
                fresh = []
                for j, u in enumerate(units):
                    if out[j] >= 0:
                        continue
                    k = by_obj.get(id(u))
                    if k is None:
                        key = (fusion, u.is_coll, u.members, u.dur, u.extra)
                        k = gid.get(key)
                        if k is None:
                            k = gid[key] = len(gid)
                            fresh.append(u)
                            self._first.append(u)
                        self._held.append(u)  # id(u) stays u's
                        by_obj[id(u)] = k
                    out[j] = k
                self.table.add(fresh)
        return out

    def id_of(self, unit: Unit, fusion: str) -> int:
        """The id of a unit met before."""
        k = self._by_obj.get(id(unit))
        return k if k is not None else self._gid[fusion, unit.is_coll, unit.members, unit.dur, unit.extra]

    def unit(self, k: int) -> Unit:
        """A unit object of id ``k`` (the first given it; any other of that id schedules alike)."""
        return self._first[k]

    def has_mode(self, fusion: str) -> bool:
        """Whether :meth:`mode` has given a fusion mode's base units their ids."""
        return fusion in self._modes

    def mode(self, fusion: str, units: Sequence[Unit], unit_of: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of a fusion mode's base ``units``, per node the id of its base unit or -1)."""
        hit = self._modes.get(fusion)
        if hit is None:
            ids = np.array(self.ids(units, fusion), np.int64)
            of = np.array(unit_of, np.int64)
            hit = self._modes[fusion] = (ids, np.where(of >= 0, ids[of], -1))
        return hit


_INDEXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_INDEXES_LOCK = threading.Lock()


def index_of(owner: object) -> UnitIndex:
    """The unit index of ``owner`` (a simulator: its units, cached by it, get one id each), made
    on first use and kept while ``owner`` lives."""
    with _INDEXES_LOCK:
        hit = _INDEXES.get(owner)
        if hit is None:
            hit = _INDEXES[owner] = UnitIndex()
        return hit


class Run:
    """What :func:`restart` placed: per event the unit, its end and the streams' free times after it
    (to the step's end: where it rejoined its neighbour's schedule, the neighbour's events from
    there); ``placed``: how many events the kernel placed itself."""

    __slots__ = ("step", "units", "ends", "tcs", "tms", "placed")

    def __init__(self, step: float, units: np.ndarray, ends: np.ndarray, tcs: np.ndarray, tms: np.ndarray,
                 placed: int | None = None):
        self.step = step
        self.units = units
        self.ends = ends
        self.tcs = tcs
        self.tms = tms
        self.placed = len(units) if placed is None else placed


class Neighbour:
    """The neighbour's schedule a :func:`restart` follows, and what differs from it, so that it can
    stop where its state becomes the neighbour's (every later event is then the neighbour's).

    Attributes:
      order, tcs, tms: the neighbour's events (materialised trace).
      step: its step time.
      removed, added: the ids of the units only the neighbour runs, and only this plan runs.
      nodes: per graph node, whether one of those units holds it.
    """

    __slots__ = ("order", "tcs", "tms", "step", "removed", "added", "nodes")

    def __init__(self, order: np.ndarray, tcs: np.ndarray, tms: np.ndarray, step: float, removed: np.ndarray,
                 added: np.ndarray, nodes: np.ndarray):
        self.order, self.tcs, self.tms, self.step = order, tcs, tms, step
        self.removed, self.added, self.nodes = removed, added, nodes


_NO_NEIGHBOUR = (False, np.zeros(0, np.int64), np.zeros(0), np.zeros(0), 0.0, np.zeros(0, np.int8),
                 np.zeros(0, np.bool_), 0, 0, np.zeros(0), np.zeros(0, np.int64))


def restart(table: UnitTable, rest: np.ndarray, i: int, t_c: float, t_m: float, pos: np.ndarray, fin: np.ndarray,
            old_of: np.ndarray, unit_of: np.ndarray, blocking: bool, *, neighbour: Neighbour | None = None,
            compiled: bool | None = None) -> Run | None:
    """Schedules the units ``rest`` from event ``i`` of a neighbour's schedule to the step's end.

    Args:
      table: the units, by id.
      rest: the ids of the units still to place (any order).
      i: the event it restarts at (0: the whole step; nothing is read from ``pos`` and ``fin``).
      t_c, t_m: the compute and comm streams' free times before event ``i``.
      pos, fin: per unit id of the neighbour's schedule, the event that placed it and its end.
      old_of: per node, the neighbour's unit id (for the inputs placed before ``i``).
      unit_of: per node, this plan's unit id.
      blocking: collectives hold the compute stream.
      neighbour: the neighbour's schedule and what differs from it (``i`` > 0): it stops where it
        rejoins that schedule and takes the neighbour's later events; None: it runs to the end.
      compiled: run the numba kernel (default: when numba is installed); False: plain Python.

    Returns:
      The events from ``i`` on, or None when some unit never became ready (a deadlock).
    """
    m = len(rest)
    n, *arrays = table.arrays
    args = (rest, i, t_c, t_m, pos, fin, old_of, unit_of, *arrays)
    # indeg and rt of the units not to place (replaced ones that an input still releases) must start
    # at 0: their count only falls below it, so they never become ready; the heaps' are written first.
    scratch = (np.zeros(n, np.int64), np.zeros(n, np.float64), np.empty(m), np.empty(m, np.int64), np.empty(m),
               np.empty(m, np.int64), np.empty(m), np.empty(m, np.int64))
    out = (np.empty(m, np.int64), np.empty(m), np.empty(m), np.empty(m))
    if neighbour is not None and i > 0:
        chg = np.zeros(n, np.int8)
        chg[neighbour.removed] = 1
        chg[neighbour.added] = 2
        follow = (True, neighbour.order, neighbour.tcs, neighbour.tms, neighbour.step, chg, neighbour.nodes,
                  len(neighbour.removed), len(neighbour.added), np.full(n, -1.0), np.empty(m, np.int64))
    else:
        follow = _NO_NEIGHBOUR
    if compiled is None:
        compiled = is_compiled()
    if compiled:
        if not is_compiled():
            raise RuntimeError("restart(compiled=True): numba is not installed; expected compiled=None or False")
        step, done, at = _KERNEL[0](*args, *scratch[:2], blocking, *scratch[2:], *out, *follow)
    else:
        lists = [a.tolist() if isinstance(a, np.ndarray) else a for a in args]
        py_scratch = [s.tolist() for s in scratch]
        py_out = [o.tolist() for o in out]
        py_follow = [a.tolist() if isinstance(a, np.ndarray) else a for a in follow]
        step, done, at = _restart(*lists, *py_scratch[:2], blocking, *py_scratch[2:], *py_out, *py_follow)
        out = (np.array(py_out[0], np.int64), np.array(py_out[1]), np.array(py_out[2]), np.array(py_out[3]))
    if at >= 0:  # rejoined the neighbour after its event ``at``: its later events follow
        assert neighbour is not None
        tail = neighbour.order[at + 1:]
        if done + len(tail) != m:
            raise AssertionError(f"restart rejoined with {done} + {len(tail)} events for {m} units")
        units = np.concatenate((out[0][:done], tail))
        return Run(float(step), units, np.concatenate((out[1][:done], fin[tail])),
                   np.concatenate((out[2][:done], neighbour.tcs[at + 1:])),
                   np.concatenate((out[3][:done], neighbour.tms[at + 1:])), done)
    if done != m:
        return None
    return Run(float(step), *out)

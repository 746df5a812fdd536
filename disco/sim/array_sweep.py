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

__all__ = ["NEVER", "Run", "UnitIndex", "UnitTable", "index_of", "is_compiled", "restart"]

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
             scnt, indeg, rt, blocking, rk_t, rk_k, tc_t, tc_k, tk_t, tk_k, out_u, out_f, out_tc, out_tm):
    """Rebuilds the scheduler's state at event ``i`` and runs the rest of the step (the kernel).

    Returns (step time, events placed); the events' units, ends and the streams' free times after
    each are written to ``out_*``.
    """
    # The state at event i: per unit still to place, its inputs placed before i and their latest end.
    nrk = 0
    ntc = 0
    ntk = 0
    for j in range(len(rest)):
        w = rest[j]
        c = 0
        r = 0.0
        if i > 0:
            for q in range(pptr[w], pptr[w + 1]):
                v = old_of[pnode[q]]
                if pos[v] < i:  # placed before event i: an unchanged unit, placed there in both
                    c += 1
                    f = fin[v]
                    if f > r:
                        r = f
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
    return (t_c if t_c > t_m else t_m), done


def _compile():
    """The kernel compiled with numba (None without numba): :func:`_restart` with its heap
    functions compiled too (a copy of it whose globals name the compiled ones)."""
    try:
        import numba
    except ImportError:
        return None
    jit = numba.njit(cache=True, nogil=True)
    scope = dict(globals(), _push=jit(_push), _pop=jit(_pop))
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

    The arrays are views of buffers with room to spare (doubled when full), so adding units costs
    what they hold, not the whole table: a search meets new units all along (a 600-evaluation
    search at 46k nodes added 355 batches), and concatenating every array each time was a fifth
    of its pricing (measured on CPU). :meth:`add` writes only past the ends of the views it gave
    out, so a snapshot taken before never changes.
    """

    # per array after n: its dtype, and whether it is a CSR pointer array (which starts as [0])
    _FIELDS = ((np.float64, False), (np.int64, False), (np.bool_, False), (np.int64, False), (np.int64, True),
               (np.int64, False), (np.int64, True), (np.int64, False), (np.int64, False))

    def __init__(self) -> None:
        self._bufs = [np.zeros(1 if ptr else 0, dt) for dt, ptr in self._FIELDS]
        self.arrays = (0, *self._bufs)

    @property
    def n(self) -> int:
        """How many units."""
        return self.arrays[0]

    def add(self, units: Sequence[Unit]) -> None:
        """Appends ``units`` (their ids are the next ones)."""
        if not units:
            return
        chain = itertools.chain.from_iterable
        pairs = np.fromiter(chain(chain(u.succ) for u in units), np.int64).reshape(-1, 2)
        n, *views = self.arrays
        pptr_end, sptr_end = views[4][-1], views[6][-1]
        tails = (
            np.array([u.dur for u in units], np.float64),
            np.array([u.prio for u in units], np.int64),
            np.array([u.is_coll for u in units], np.bool_),
            np.array([u.indeg for u in units], np.int64),
            pptr_end + np.cumsum([len(u.preds) for u in units], dtype=np.int64),
            np.fromiter(chain(u.preds for u in units), np.int64),
            sptr_end + np.cumsum([len(u.succ) for u in units], dtype=np.int64),
            pairs[:, 0],
            pairs[:, 1],
        )
        grown = []
        for k, (view, tail) in enumerate(zip(views, tails)):
            buf, used = self._bufs[k], len(view)
            if used + len(tail) > len(buf):
                buf = np.empty(max(2 * len(buf), used + len(tail), 16), buf.dtype)
                buf[:used] = view
                self._bufs[k] = buf
            buf[used:used + len(tail)] = tail
            grown.append(buf[:used + len(tail)])
        self.arrays = (n + len(units), *grown)


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
    """What :func:`restart` placed: per event the unit, its end and the streams' free times after it."""

    __slots__ = ("step", "units", "ends", "tcs", "tms")

    def __init__(self, step: float, units: np.ndarray, ends: np.ndarray, tcs: np.ndarray, tms: np.ndarray):
        self.step = step
        self.units = units
        self.ends = ends
        self.tcs = tcs
        self.tms = tms


def restart(table: UnitTable, rest: np.ndarray, i: int, t_c: float, t_m: float, pos: np.ndarray, fin: np.ndarray,
            old_of: np.ndarray, unit_of: np.ndarray, blocking: bool, *, compiled: bool | None = None) -> Run | None:
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
      compiled: run the numba kernel (default: when numba is installed); False: plain Python.

    Returns:
      The events it placed, or None when some unit never became ready (a deadlock).
    """
    m = len(rest)
    n, *arrays = table.arrays
    args = (rest, i, t_c, t_m, pos, fin, old_of, unit_of, *arrays)
    # indeg and rt of the units not to place (replaced ones that an input still releases) must start
    # at 0: their count only falls below it, so they never become ready; the heaps' are written first.
    scratch = (np.zeros(n, np.int64), np.zeros(n, np.float64), np.empty(m), np.empty(m, np.int64), np.empty(m),
               np.empty(m, np.int64), np.empty(m), np.empty(m, np.int64))
    out = (np.empty(m, np.int64), np.empty(m), np.empty(m), np.empty(m))
    if compiled is None:
        compiled = is_compiled()
    if compiled:
        if not is_compiled():
            raise RuntimeError("restart(compiled=True): numba is not installed; expected compiled=None or False")
        step, done = _KERNEL[0](*args, *scratch[:2], blocking, *scratch[2:], *out)
    else:
        lists = [a.tolist() if isinstance(a, np.ndarray) else a for a in args]
        py_scratch = [s.tolist() for s in scratch]
        py_out = [o.tolist() for o in out]
        step, done = _restart(*lists, *py_scratch[:2], blocking, *py_scratch[2:], *py_out)
        out = (np.array(py_out[0], np.int64), np.array(py_out[1]), np.array(py_out[2]), np.array(py_out[3]))
    if done != m:
        return None
    return Run(float(step), *out)

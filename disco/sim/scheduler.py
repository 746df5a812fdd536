"""The two-stream list scheduler: one loop for the fast step time and for the recorded timeline.

A *compute stream* runs kernels one at a time and a *communication stream* runs collectives one
at a time; a unit is ready when the last of its inputs ends (see :mod:`disco.sim.simulator`).
:func:`schedule` is that loop over flat per-unit arrays. Priorities are integer keys, smallest
first: the program position for ``order="program"``, the rank of :func:`topological_keys` for
``order="topological"``. With ``placed`` it also records each unit's start, in the order it placed
them (:mod:`disco.sim.timeline` and :mod:`disco.sim.critical_path` read that); without, it only
returns the step time: the hot path of the search, which calls it thousands of times.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

_INF = float("inf")
# A unit whose indegree starts here never becomes ready (a base unit a plan replaced).
DEAD = -(1 << 40)


class Deadlock(Exception):
    """Some units never became ready (the contracted graph has a cycle, or buckets wait on each other)."""


def schedule(unit_of: Sequence[int], key_unit: Sequence[int], indeg: list[int], dur: Sequence[float],
             key: Sequence[int], succ: Sequence[tuple[tuple[int, int], ...]], coll: Sequence[bool],
             ready_k: Sequence[int], ready_c: Sequence[int], done: int, blocking: bool,
             placed: list[tuple[int, float]] | None = None) -> float:
    """Runs the ready-list schedule; returns when the last kernel or collective ends.

    Whenever the compute stream is free it starts the ready kernel with the smallest key (or idles
    until one is ready); a kernel starts only strictly before the comm stream's next start, so on a
    tie the collective is placed first. Collectives start at ``max(ready, comm stream free)``, by
    (ready time, key). ``blocking`` (one stream): a collective also waits for the running kernel,
    and the compute stream waits for it.

    Args:
      unit_of: node index -> unit id, for the nodes in ``succ``.
      key_unit: key -> unit id.
      indeg: per unit, its count of unreleased (member, input) pairs; consumed.
      dur: per unit, seconds.
      key: per unit, its priority (unique).
      succ: per unit, (reading node, count) pairs.
      coll: per unit, whether it is a collective.
      ready_k: kernels ready at the start.
      ready_c: collectives ready at the start.
      done: units that will never run (replaced base units).
      blocking: collectives and kernels share one stream.
      placed: if given, receives (unit id, start) for every unit, in placement order.

    Raises:
      Deadlock: when some unit never became ready.
    """
    rk = [key[u] for u in ready_k]  # kernels ready now, by key
    heapq.heapify(rk)
    tc = [(0.0, key[u]) for u in ready_c]  # collectives, by (ready time, key)
    heapq.heapify(tc)
    return sweep(unit_of, key_unit, indeg, dur, key, succ, coll, rk, tc, [], [0.0] * len(dur), 0.0, 0.0, done,
                 blocking, placed)


def sweep(unit_of: Sequence[int], key_unit: Sequence[int], indeg: list[int], dur: Sequence[float],
          key: Sequence[int], succ: Sequence[tuple[tuple[int, int], ...]], coll: Sequence[bool],
          rk: list[int], tc: list[tuple[float, int]], tk: list[tuple[float, int]], rt: list[float],
          t_c: float, t_m: float, done: int, blocking: bool, placed: list[tuple[int, float]] | None = None) -> float:
    """:func:`schedule`'s loop from any state between two events: the rest of the step.

    :func:`schedule` starts it with nothing placed; :mod:`disco.sim.delta` restarts it at the first
    event a plan change moves, with the state the earlier events left (see :func:`schedule` for
    the arguments it shares).

    Args:
      rk: heap of the keys of the kernels ready by ``t_c``; consumed.
      tc: heap of (ready time, key) of the ready collectives; consumed.
      tk: heap of (ready time, key) of the kernels ready after ``t_c``; consumed.
      rt: per unit, the latest end among its inputs placed so far; updated.
      t_c: when the compute stream is free (the end of the last kernel; with ``blocking``, or of
        the last collective).
      t_m: when the comm stream is free (the end of the last collective).
      done: units placed so far plus units that never run.

    Returns:
      When the last kernel or collective ends.

    Raises:
      Deadlock: when some unit never became ready.
    """
    heappush, heappop = heapq.heappush, heapq.heappop
    record = None if placed is None else placed.append
    # The comm stream's next start; a kernel starts only strictly before it (ties: comm first).
    limit = (tc[0][0] if tc[0][0] > t_m else t_m) if tc else _INF
    while True:
        while tk and tk[0][0] <= t_c:
            heappush(rk, heappop(tk)[1])
        if rk and t_c < limit:  # the compute stream runs the ready kernel with the smallest key
            u = key_unit[heappop(rk)]
            if record is not None:
                record((u, t_c))
            fin = t_c = t_c + dur[u]
            is_coll = False
        elif not rk and tk and tk[0][0] < limit:
            t_c = tk[0][0]  # idle until a kernel's collective input ends
            continue
        elif tc:  # the comm stream's next start comes first
            u = key_unit[heappop(tc)[1]]
            # one stream: the collective waits for the running kernel, then holds it
            start = limit if not blocking or limit > t_c else t_c
            if record is not None:
                record((u, start))
            fin = t_m = start + dur[u]
            is_coll = True
        else:
            break
        done += 1
        # Releases the unit's readers (inline: a helper call per unit costs the search measurably).
        # A kernel reader is ready when its last input ends by the compute stream's time.
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
                elif rt[w] <= t_c:
                    heappush(rk, key[w])
                else:
                    heappush(tk, (rt[w], key[w]))
        if is_coll:
            if blocking:
                t_c = fin
            if tc:
                r = tc[0][0]
                limit = r if r > t_m else t_m
            else:
                limit = _INF
    if done != len(dur):
        raise Deadlock()
    return t_c if t_c > t_m else t_m


def toposort(unit_of: Sequence[int], indeg: list[int], key: Sequence[int],
             succ: Sequence[tuple[tuple[int, int], ...]], ready: Sequence[int]) -> list[int]:
    """Unit ids in a topological order, smallest key first among the ready; ``indeg`` is consumed.

    Units left out (``len(order)`` short of the live units) lie on or after a cycle: their
    ``indeg`` stays above 0.
    """
    heap = [(key[u], u) for u in ready]
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
    return order


def topological_keys(order: Sequence[int], unit_of: Sequence[int], dur: Sequence[float], key: Sequence[int],
                     succ: Sequence[tuple[tuple[int, int], ...]]) -> tuple[list[int], list[int]]:
    """Keys for ``order="topological"``: longest remaining path first, ties by ``key`` (program position).

    A unit's remaining path is its own time plus the longest chain of unit times after it.

    Args:
      order: the live units in a topological order (:func:`toposort`).

    Returns:
      (keys, key_unit): per unit its rank in that priority (0 first), and rank -> unit id.
    """
    n = len(dur)
    rank = [0.0] * n
    for u in reversed(order):
        best = 0.0
        for s, _ in succ[u]:
            v = rank[unit_of[s]]
            if v > best:
                best = v
        rank[u] = dur[u] + best
    key_unit = sorted(range(n), key=lambda u: (-rank[u], key[u]))
    keys = [0] * n
    for r, u in enumerate(key_unit):
        keys[u] = r
    return keys, key_unit

"""The critical path of a simulated step: the chain of events that determines its step time.

Each event is *bound* by the event that let it start: the input whose end set its ready time
when it started no earlier than that (the first placed among inputs that end together), else
the previous event on its own stream (nothing, if its stream was free from the start). Where
collectives hold the compute stream (``blocking``: one stream), that is the previous event of
either kind: a kernel that waited for a collective is bound by it. The
path runs from the event that ends last (the later placed of those that end together) back
along these bindings.
"""

from __future__ import annotations

from collections.abc import Sequence

from disco.sim.timeline import Event


def critical_path(events: Sequence[Event], placed: Sequence[tuple[int, float]], unit_of: Sequence[int],
                  succ: Sequence[tuple[tuple[int, int], ...]], coll: Sequence[bool],
                  blocking: bool = False) -> tuple[str, ...]:
    """Labels of the events on the critical path, first to last.

    Args:
      events: the timeline, one event per entry of ``placed``, in the same order.
      placed: (unit id, start) per event, in the order the scheduler placed them.
      unit_of: node index -> unit id (the patched plan's).
      succ: per unit, (reading node, count) pairs.
      coll: per unit, whether it is a collective (runs on the comm stream).
      blocking: collectives and kernels share one stream (:func:`disco.sim.scheduler.schedule`).
    """
    n_units = len(coll)
    rt = [0.0] * n_units  # each unit's ready time: when its last input ends
    arg = [-1] * n_units  # the event whose end set it
    binding: list[int] = []
    last = [-1, -1]  # the latest event per stream (compute, comm)
    comm_free = 0.0
    for ei, (u, start) in enumerate(placed):
        k = 1 if coll[u] and not blocking else 0
        fin = events[ei].end
        free = comm_free if k else start  # when the event's stream became free for it
        if arg[u] >= 0 and rt[u] >= free:
            binding.append(arg[u])
        else:
            binding.append(last[k] if free > 0 else -1)
        last[k] = ei
        if k:
            comm_free = fin
        for s, _ in succ[u]:
            w = unit_of[s]
            if fin > rt[w]:
                rt[w] = fin
                arg[w] = ei
    path: list[str] = []
    if events:
        ei = max(range(len(events)), key=lambda j: (events[j].end, j))
        while ei >= 0:
            path.append(events[ei].name)
            ei = binding[ei]
        path.reverse()
    return tuple(path)

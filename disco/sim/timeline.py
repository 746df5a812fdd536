"""What a simulated step looks like: its events on the two streams, and the Chrome trace of them.

:class:`SimResult` is what :class:`disco.sim.simulator.Simulator` returns; :func:`timeline` turns
the scheduler's placements (:func:`disco.sim.scheduler.schedule`) into :class:`Event` objects.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disco.ir.graph import Node
    from disco.sim.units import Unit


# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Event:
    """One kernel or collective on the timeline.

    Attributes:
      name: the label: an instruction name, "fusion.<i>", "bucket.<i>", "gather_bucket.<i>" or
        "combined.<level>".
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

    def __repr__(self) -> str:
        """One line of times in ms (the timeline is often thousands of events: ``to_chrome_trace()``)."""
        return (f"SimResult(step {self.step_time * 1e3:.3f} ms, compute {self.compute_time * 1e3:.3f} ms, comm "
                f"{self.comm_time * 1e3:.3f} ms, exposed {self.exposed_comm * 1e3:.3f} ms, "
                f"{len(self.timeline)} events, critical path of {len(self.critical_path)})")

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



def timeline(placed: Sequence[tuple[int, float]], units: Sequence[Unit], dur: Sequence[float],
             labels: Mapping[int, str], nodes: Sequence[Node]) -> list[Event]:
    """The events of ``placed`` ((unit id, start) in the order the scheduler placed them).

    An event is labelled ``labels[u]`` where given (planned groups, buckets, combined
    all-reduces), else by its unit's name; its end is ``start + dur[u]``.
    """
    events = []
    for u, start in placed:
        unit = units[u]
        events.append(Event(labels.get(u) or unit.name, "comm" if unit.is_coll else "compute", start,
                            start + dur[u], tuple(nodes[m].name for m in unit.members)))
    return events

"""The emulated switch: forwards IPv4 packets between the workers' TUN devices, shaped.

One process (``python -m disco.runtime.testbed._switch``, started by :class:`disco.runtime.testbed.Testbed`)
holds every worker's TUN file descriptor; a packet read from worker i's device is scheduled
by :func:`schedule` (the link semantics in :mod:`disco.runtime.testbed._link`) and written to worker
j's device when it is due. A userspace switch rather than veth pairs with tc netem because
the kernels these workers run on were built without ``sch_netem`` (``tc qdisc add ... netem``:
"Specified qdisc kind is unknown"), and one mechanism for rate, delay, jitter and loss keeps
every machine's emulation the same. Its cost: the switch's own scheduling latency, which it
measures (``lateness``: how long after its due time a packet was written) and reports in its
statistics, so a run can say how faithful its link was.
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import os
import random
import select
import signal
import sys
import time

from disco.runtime.testbed._link import LinkSpec, parse_link

MAX_PACKET = 1 << 16
_PR_SET_TIMERSLACK = 29


def schedule(link: LinkSpec, now: float, nbytes: int, up_free: float, down_free: float,
             jitter_u: float) -> tuple[float, float, float]:
    """When a packet of ``nbytes`` sent at ``now`` reaches its receiver.

    Args:
      link: the link every worker has.
      now: the time the packet reached the sender's uplink.
      nbytes: its size.
      up_free: when the sender's uplink finishes its previous packet.
      down_free: when the receiver's downlink finished its previous packet.
      jitter_u: a uniform draw in [0, 1) for the jitter.

    Returns:
      (deliver_at, the sender's new up_free, the receiver's new down_free). Packets to one
      receiver leave in the order they were scheduled (``deliver_at`` never decreases per
      receiver), so jitter does not reorder.
    """
    tx = nbytes * 8 / link.rate_bps
    depart = max(now, up_free) + tx
    arrive = depart + link.delay_s + link.jitter_s * (2 * jitter_u - 1)
    out = max(arrive, down_free + tx)
    return out, depart, out


def run(fds: list[int], addrs: list[bytes], link: LinkSpec, *, seed: int = 0,
        stop: list[bool] | None = None) -> dict[str, float]:
    """Forwards packets between ``fds`` (TUN devices, port i has IPv4 address ``addrs[i]``)
    until ``stop[0]`` is set; returns the statistics."""
    rng = random.Random(seed)
    stop = stop if stop is not None else [False]
    port_of = {a: i for i, a in enumerate(addrs)}
    up_free = [0.0] * len(fds)
    down_free = [0.0] * len(fds)
    heap: list[tuple[float, int, int, bytes]] = []
    seq = 0
    stats = {"packets": 0, "bytes": 0, "lost": 0, "dropped": 0, "late_sum_s": 0.0, "late_max_s": 0.0,
             "late_over_50us": 0, "max_queue": 0}
    for fd in fds:
        os.set_blocking(fd, False)
    index = {fd: i for i, fd in enumerate(fds)}
    clock = time.monotonic
    while not stop[0]:
        timeout = 0.1 if not heap else min(0.1, max(0.0, heap[0][0] - clock()))
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        now = clock()
        for fd in ready:
            src = index[fd]
            while True:
                try:
                    pkt = os.read(fd, MAX_PACKET)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # the device went away (teardown)
                    stop[0] = True
                    break
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    stats["dropped"] += 1  # not IPv4 (the workers speak IPv4 only)
                    continue
                dst = port_of.get(pkt[16:20])
                if dst is None or dst == src:
                    stats["dropped"] += 1
                    continue
                if link.loss and rng.random() < link.loss:
                    stats["lost"] += 1
                    continue
                due, up_free[src], down_free[dst] = schedule(link, now, len(pkt), up_free[src],
                                                             down_free[dst], rng.random())
                heapq.heappush(heap, (due, seq, dst, pkt))
                seq += 1
        stats["max_queue"] = max(stats["max_queue"], len(heap))
        now = clock()
        while heap and heap[0][0] <= now:
            due, _, dst, pkt = heapq.heappop(heap)
            try:
                os.write(fds[dst], pkt)
            except (BlockingIOError, OSError):
                stats["dropped"] += 1
                continue
            late = now - due
            stats["packets"] += 1
            stats["bytes"] += len(pkt)
            stats["late_sum_s"] += late
            stats["late_max_s"] = max(stats["late_max_s"], late)
            stats["late_over_50us"] += late > 50e-6
    stats["late_mean_s"] = stats["late_sum_s"] / stats["packets"] if stats["packets"] else 0.0
    return stats


def _tighten_timers(realtime: bool) -> None:
    """Asks the kernel for precise wake-ups: 1 ns timer slack (default 50 us), a higher priority,
    and with ``realtime`` SCHED_FIFO (the switch sleeps between packets, so it takes a core
    only while there are packets to move)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m disco.runtime.testbed._switch")
    ap.add_argument("--fds", required=True, help="comma list of TUN file descriptors, one per worker")
    ap.add_argument("--addrs", required=True, help="comma list of the workers' IPv4 addresses, same order")
    ap.add_argument("--link", required=True)
    ap.add_argument("--stats", required=True, help="write the statistics here (JSON) on exit")
    ap.add_argument("--realtime", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    link = parse_link(args.link)
    if link is None:
        raise ValueError(f"--link {args.link!r}: the switch needs a shaped link, not loopback")
    fds = [int(x) for x in args.fds.split(",")]
    addrs = [bytes(int(o) for o in a.split(".")) for a in args.addrs.split(",")]
    stop = [False]

    def on_signal(signum, frame):  # noqa: ARG001
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _tighten_timers(args.realtime)
    stats = run(fds, addrs, link, seed=args.seed, stop=stop)
    with open(args.stats, "w") as f:
        json.dump(stats, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

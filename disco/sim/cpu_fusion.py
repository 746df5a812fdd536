"""XLA:CPU's loop fusion, emulated: which ops XLA:CPU fuses into one kernel around a plan's groups.

Producers are visited consumers-first (descending program position). A loop-fusible producer
(:data:`disco.ir.opcodes.XLA_CPU_LOOP_OPCODES`: elementwise ops, broadcast, reshape, transpose,
slice, concatenate, reduce, ...; or a planned group, which is a loop fusion) is fused into its
users' fusion when all its users are loop-fusible and already in one and the same fusion, and its
value is not read by a zero-cost op (tuple, get-tuple-element, call: a step output) or a
collective; otherwise it roots a fusion of its own. A broadcast whose users are all loop-fusible
is duplicated into each consumer (:data:`disco.ir.opcodes.XLA_CPU_DUPLICATED_OPCODES`: it becomes
part of every consumer's kernel; its inputs are read there, its result is never written). Dots,
convolutions, custom calls, scatters and collectives are never fused (XLA:CPU runs dots and
convolutions as library calls). Planned groups are pre-fused, so XLA grows them by the same rule.
A ``while`` is never fused: it is one unit, which the simulator prices as its trip count times one
iteration of its body's and condition's graphs, each contracted by this same emulation.
Every fusion has one root that all its members reach, so contracting it never adds a dependency
between outside ops.

XLA:GPU's fusion is the module beside this one (:mod:`disco.sim.gpu_fusion`); both give the
simulator the same two members (:class:`disco.sim.units.FusionEmulation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from disco.ir.opcodes import XLA_CPU_DUPLICATED_OPCODES, XLA_CPU_LOOP_OPCODES
from disco.sim.units import KERNEL, group_producers

if TYPE_CHECKING:
    from disco.ir.graph import Node


class CpuFusion:
    """XLA:CPU's loop fusion over one graph.

    Args:
      nodes: the graph's nodes, in topological order.
      kind: per node, :func:`disco.sim.units.node_kinds`.
      succs: per node, the sorted indices of the nodes that read it.

    Attributes:
      duplicated: the broadcasts XLA duplicates into every consumer: all their users are
        loop-fusible compute ops (or duplicated themselves).
    """

    def __init__(self, nodes: Sequence[Node], kind: Sequence[int], succs: Sequence[tuple[int, ...]]):
        n = len(nodes)
        loop = [node.opcode in XLA_CPU_LOOP_OPCODES for node in nodes]
        dup: set[int] = set()
        for i in range(n - 1, -1, -1):
            if nodes[i].opcode in XLA_CPU_DUPLICATED_OPCODES and kind[i] == KERNEL and succs[i] and all(
                    s in dup or (kind[s] == KERNEL and loop[s]) for s in succs[i]):
                dup.add(i)
        # Users for fusion decisions: through duplicated broadcasts only; a value read by a
        # zero-cost op (tuple, get-tuple-element, call) or a collective, or by nobody, leaves.
        users: list[tuple[int, ...]] = [()] * n
        blocked = [False] * n
        for i in range(n - 1, -1, -1):
            acc: set[int] = set()
            blk = not succs[i]
            for s in succs[i]:
                if s in dup:
                    acc |= set(users[s])
                    blk = blk or blocked[s]
                elif kind[s] != KERNEL:
                    blk = True
                else:
                    acc.add(s)
            users[i] = tuple(sorted(acc))
            blocked[i] = blk
        self.duplicated = frozenset(dup)
        self._loop = loop
        self._users = users
        self._blocked = blocked

    def clusters(self, region: list[int], groups: list[tuple[int, ...]],
                 cuts: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[int, ...]]:
        """XLA:CPU's loop fusion over ``region`` (sorted real compute nodes), ``groups`` pre-fused.

        Producers are visited consumers-first (descending program position; a group at its last
        member). A loop-fusible producer (or a planned group) joins its users' fusion when every
        user is a loop-fusible op (or in a planned group) in ``region``, all users are in the
        same fusion and no (producer, user) pair is in ``cuts`` (a plan's optimization barrier);
        otherwise it roots a fusion of its own. Dots, convolutions, custom calls and collectives
        are never fused.
        """
        loop, users, blocked = self._loop, self._users, self._blocked
        gid, items = group_producers(groups)
        items += [(m, (m,), False) for m in region if m not in gid]
        items.sort(reverse=True)
        cl: dict[int, int] = {}
        members: dict[int, list[int]] = {}
        for pos, mem, is_group in items:
            target = -1
            if is_group or loop[pos]:
                inside = set(mem) if is_group else ()
                for m in mem:
                    if blocked[m]:
                        target = -2
                        break
                    for s in users[m]:
                        if s in inside:
                            continue
                        if cuts and (m, s) in cuts:
                            target = -2
                            break
                        c = cl.get(s, -2)
                        if c == -2 or not (loop[s] or s in gid) or (target >= 0 and c != target):
                            target = -2
                            break
                        target = c
                    if target == -2:
                        break
            if target < 0:
                target = pos
                members[pos] = []
            members[target].extend(mem)
            for m in mem:
                cl[m] = target
        return sorted(tuple(sorted(ms)) for ms in members.values())

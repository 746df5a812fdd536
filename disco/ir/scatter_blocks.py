"""Which all-reduces are reduce-scatters in disguise: each user keeps this device's block.

XLA:CPU's SPMD partitioner writes a gradient's return to its shard as an all-reduce of the whole
gradient followed by a ``dynamic-slice`` whose offset comes from ``partition-id`` through constant
tables (``offsets[partition-id]``). :func:`scatter_blocks` evaluates each slice's offset for every
device of the all-reduce's replica groups and records for each all-reduce that a dynamic-slice reads
either how it is a reduce-scatter or why it is none. A plan's "scatter" bucket
(:mod:`disco.plans.check`) takes only the first.

The pair is a reduce-scatter when every user keeps, on every device ``d`` of a replica group ``G`` of
``p`` devices, block ``b(d)`` of ``k`` along one dimension, each block kept by exactly ``p / k`` devices
of ``G``. The all-reduce over ``G`` then equals a reduce-scatter over ``p / k`` *scatter groups*, each
holding one device per block, listed in block order (XLA's reduce-scatter gives the ``i``-th listed
device of a group the ``i``-th block), followed by an all-reduce of the ``1 / k`` shard over the
*across groups*, the ``p / k`` devices that keep the same block. On a 1-D mesh (``k = p``) the scatter
group is ``G`` in block order and no across group is needed. On a ``data x fsdp`` mesh XLA reduces a
gradient sharded over ``"fsdp"`` over all devices and slices it by the ``"fsdp"`` position: ``k`` is
the ``"fsdp"`` size and the two stages are a reduce-scatter over ``"fsdp"`` and an all-reduce over
``"data"``.

Which devices form a scatter group is a choice (any one device per block gives the same sums): the
``j``-th scatter group holds the ``j``-th smallest device id of each block's holders. jax numbers a
mesh's devices row-major, so on a ``data x fsdp`` mesh the holders of a block are one ``"fsdp"``
position at every ``"data"`` index and the ``j``-th scatter group is the devices of ``"data"`` index
``j``: the ``"fsdp"`` axis's own groups (those XLA's all-gathers of the step use), the large
reduce-scatter over consecutive devices (one node of a cluster that numbers devices by node) and only
the ``1 / k`` shard's all-reduce across.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from disco.ir.replica_groups import replica_group_lists

if TYPE_CHECKING:
    from disco.ir.hlo_module import Instruction

Groups = tuple[tuple[int, ...], ...]


class ScatterBlock(NamedTuple):
    """An all-reduce that a dynamic-slice reads, and whether (and how) it is a reduce-scatter.

    Attributes:
      all_reduce: its graph name.
      dim: the dimension every user takes this device's block along; None when it is no scatter.
      slices: the graph names of its dynamic-slice users.
      why: for ``dim=None``, what is not a block scatter ("" otherwise).
      scatter_groups: the reduce-scatter's groups, each one device per block in block order (its
        ``i``-th device keeps block ``i``); ``()`` for ``dim=None``.
      across_groups: the devices that keep the same block, one group per block and replica group,
        over which the ``1 / k`` shard is all-reduced after the reduce-scatter; ``()`` when each
        block is kept by one device (``k = p``, a 1-D mesh) and for ``dim=None``.
    """

    all_reduce: str
    dim: int | None
    slices: tuple[str, ...] = ()
    why: str = ""
    scatter_groups: Groups = ()
    across_groups: Groups = ()

    @property
    def blocks(self) -> int:
        """``k``, the blocks the gradient is cut into (the scatter groups' size); 0 for no scatter."""
        return len(self.scatter_groups[0]) if self.scatter_groups else 0

    def to_dict(self) -> dict:
        return {"all_reduce": self.all_reduce, "dim": self.dim, "slices": list(self.slices), "why": self.why,
                "scatter_groups": [list(g) for g in self.scatter_groups],
                "across_groups": [list(g) for g in self.across_groups]}

    @classmethod
    def from_dict(cls, data: object, where: str) -> ScatterBlock:
        """Reads :meth:`to_dict`'s output. Raises ValueError naming ``where`` and what is wrong."""
        keys = {"all_reduce", "dim", "slices", "why", "scatter_groups", "across_groups"}
        if (not isinstance(data, dict) or set(data) != keys
                or not isinstance(data["all_reduce"], str) or not isinstance(data["why"], str)
                or not (data["dim"] is None or (_is_int(data["dim"]) and data["dim"] >= 0))
                or not isinstance(data["slices"], list) or not all(isinstance(s, str) for s in data["slices"])
                or not _is_groups(data["scatter_groups"]) or not _is_groups(data["across_groups"])):
            raise ValueError(f"graph JSON field {where!r}: expected an object with all_reduce (str), dim (int >= 0 "
                             f"or null), slices (list of str), why (str), scatter_groups and across_groups (lists "
                             f"of lists of device ids >= 0), got {str(data)[:80]!r}")
        scatter = tuple(tuple(g) for g in data["scatter_groups"])
        across = tuple(tuple(g) for g in data["across_groups"])
        if data["dim"] is None:
            wrong = "a block that is no scatter has no groups" if scatter or across else ""
        else:
            wrong = decomposition_error(scatter, across)
        if wrong:
            raise ValueError(f"graph JSON field {where!r}: {wrong}")
        return cls(data["all_reduce"], data["dim"], tuple(data["slices"]), data["why"], scatter, across)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_groups(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(g, list) and all(_is_int(d) and d >= 0 for d in g) for g in v)


def decomposition_error(scatter: Groups, across: Groups) -> str:
    """What is wrong with ``scatter`` and ``across`` as a reduce-scatter's groups and the groups of
    devices keeping the same block (see :class:`ScatterBlock`); "" when they are one.

    Scatter groups: at least one, all of one size ``k >= 1``, no device twice. Across groups: none
    (each block kept by one device), or groups of one size ``m >= 2`` holding the scatter groups'
    devices once each, every group's devices at one position (one block) of ``m`` different scatter
    groups.

    >>> decomposition_error(((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 4), (1, 5), (2, 6), (3, 7)))
    ''
    >>> decomposition_error(((0, 1), (2, 3)), ((0, 3), (1, 2)))
    'across group [0, 3] holds devices of blocks 0 and 1 (their positions in their scatter groups); expected one block'
    """
    if not scatter:
        return "a scatter needs at least one scatter group"
    k = len(scatter[0])
    if k < 1 or any(len(g) != k for g in scatter):
        return f"the scatter groups differ in size or are empty: {[len(g) for g in scatter]}"
    where: dict[int, tuple[int, int]] = {}
    for gi, g in enumerate(scatter):
        for pos, d in enumerate(g):
            if d in where:
                return f"device {d} is in the scatter groups twice"
            where[d] = (gi, pos)
    if not across:
        return ""
    m = len(across[0])
    if m < 2 or any(len(g) != m for g in across):
        return f"the across groups differ in size or hold fewer than 2 devices: {[len(g) for g in across]}"
    seen: set[int] = set()
    for g in across:
        for d in g:
            if d not in where:
                return f"device {d} of across group {list(g)} is in no scatter group"
            if d in seen:
                return f"device {d} is in the across groups twice"
            seen.add(d)
        blocks = sorted({where[d][1] for d in g})
        if len(blocks) != 1:
            return (f"across group {list(g)} holds devices of blocks {' and '.join(map(str, blocks[:2]))} (their "
                    "positions in their scatter groups); expected one block")
        if len({where[d][0] for d in g}) != m:
            return f"across group {list(g)} holds two devices of one scatter group"
    if seen != set(where):
        return f"devices {sorted(set(where) - seen)[:4]} of the scatter groups are in no across group"
    return ""


def decompose(blocks: Mapping[int, int], k: int) -> tuple[Groups, Groups] | str:
    """The scatter and across groups (:class:`ScatterBlock`) of one replica group whose device ``d``
    keeps block ``blocks[d]`` of ``k``, or why it is no reduce-scatter: each block must be kept by
    ``len(blocks) / k`` devices. The ``j``-th scatter group holds the ``j``-th smallest device of each
    block's holders, in block order (the module docstring says why).

    >>> decompose({0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1, 6: 2, 7: 3}, 4)
    (((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 4), (1, 5), (2, 6), (3, 7)))
    >>> decompose({0: 1, 1: 0}, 2)
    (((1, 0),), ())
    >>> decompose({0: 0, 1: 0, 2: 1, 3: 3}, 4)
    'block 0 is kept by 2 of its 4 devices ([0, 1]) and block 2 by none; a reduce-scatter needs each of the 4 blocks kept by 1'
    """
    p = len(blocks)
    holders: dict[int, list[int]] = {b: [] for b in range(k)}
    for d in sorted(blocks):
        b = blocks[d]
        if b not in holders:
            return f"device {d} keeps block {b}, outside the {k} blocks"
        holders[b].append(d)
    per = p // k if p % k == 0 else 0
    bad = [b for b in range(k) if len(holders[b]) != per]
    if bad:
        more = next((b for b in bad if len(holders[b]) > per), None)
        less = next((b for b in bad if len(holders[b]) < per), None)
        told = []
        if more is not None:
            told.append(f"block {more} is kept by {len(holders[more])} of its {p} devices ({holders[more][:8]})")
        if less is not None:
            n = len(holders[less])
            told.append(f"block {less} by {'none' if not n else n}" if more is not None
                        else f"block {less} is kept by {n or 'none'} of its {p} devices")
        want = f"kept by {per}" if per else f"kept by as many devices ({p} devices do not split into {k} equal parts)"
        return f"{' and '.join(told)}; a reduce-scatter needs each of the {k} blocks {want}"
    scatter = tuple(tuple(holders[b][j] for b in range(k)) for j in range(per))
    across = tuple(tuple(holders[b]) for b in range(k)) if per > 1 else ()
    return scatter, across


class _Unknown(Exception):
    pass


_SHAPE_RE = re.compile(r"([a-z0-9]+)\[([^\]]*)\]")
_ALL_REDUCES = frozenset({"all-reduce"})
_IDENTITY = frozenset({"reshape", "bitcast", "copy", "convert"})
_BINARY = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
           "maximum": max, "minimum": min,
           "divide": lambda a, b: int(a / b) if b else 0, "remainder": lambda a, b: a - b * int(a / b) if b else a}


def _dims(shape: str) -> list[int] | None:
    if shape.startswith("("):
        return None
    m = _SHAPE_RE.match(shape)
    return [int(d) for d in m.group(2).split(",") if d.strip()] if m else None


def _literal(text: str) -> list[int]:
    if "..." in text:  # XLA's dump elides a large constant's values unless xla_dump_large_constants
        raise _Unknown("a constant whose values the HLO dump leaves out ({...})")
    try:
        return [int(v) for v in re.findall(r"-?\d+", text)]
    except ValueError:  # pragma: no cover - findall gives digits only
        raise _Unknown("a literal") from None


def _evaluate(scope: Mapping[str, Instruction], name: str, device: int, memo: dict[str, list[int]]) -> list[int]:
    """The integer value (flat) of ``name`` on ``device`` (``partition-id`` = the device)."""
    hit = memo.get(name)
    if hit is not None:
        return hit
    ins = scope.get(name)
    if ins is None:
        raise _Unknown(f"{name!r}, which is not in its computation")
    op = ins.opcode
    if op == "partition-id":
        out = [device]
    elif op == "constant":
        out = _literal(ins.raw_operands)
    elif op in _IDENTITY:
        out = _evaluate(scope, ins.operands[0], device, memo)
    elif op == "broadcast":
        v = _evaluate(scope, ins.operands[0], device, memo)
        n = 1
        for d in _dims(ins.shape) or []:
            n *= d
        if len(v) != 1:
            raise _Unknown(f"broadcast {name!r} of an array")
        out = v * n
    elif op in ("dynamic-slice", "slice"):
        table = _evaluate(scope, ins.operands[0], device, memo)
        if len(_dims(scope[ins.operands[0]].shape) or [0, 0]) != 1:
            raise _Unknown(f"{op} {name!r} of a table that is not 1-D")
        if op == "slice":
            m = re.fullmatch(r"\{\s*\[(\d+):(\d+)(?::(\d+))?\]\s*\}", ins.attrs.get("slice", ""))
            if m is None:
                raise _Unknown(f"slice {name!r}")
            out = table[int(m.group(1)):int(m.group(2)):int(m.group(3) or 1)]
        else:
            size = (_dims(ins.shape) or [1])[0]
            start = _evaluate(scope, ins.operands[1], device, memo)[0]
            start = min(max(start, 0), len(table) - size)  # XLA clamps a dynamic-slice's start
            out = table[start:start + size]
    elif op in _BINARY and len(ins.operands) == 2:
        a = _evaluate(scope, ins.operands[0], device, memo)
        b = _evaluate(scope, ins.operands[1], device, memo)
        if len(a) != len(b):
            raise _Unknown(f"{op} {name!r} of different sizes")
        out = [_BINARY[op](x, y) for x, y in zip(a, b)]
    else:
        raise _Unknown(f"{op} {name!r}")
    memo[name] = out
    return out


def _block_dim(ar: Instruction, ds: Instruction, scope: Mapping[str, Instruction],
               groups: list[tuple[int, ...]]) -> tuple[int, dict[int, int], int] | str:
    """(the dimension ``ds`` takes this device's block of ``ar`` along, each device's block, the
    number of blocks) or why it takes no one block per device."""
    full, shard = _dims(ar.shape), _dims(ds.shape)
    if full is None or shard is None or len(full) != len(shard):
        return f"its dynamic-slice {ds.name!r} has shape {ds.shape}, the all-reduce {ar.shape}"
    if ds.operands[0] != ar.name:
        return f"it is an offset of the dynamic-slice {ds.name!r}, not the sliced array"
    cut = [i for i, (f, s) in enumerate(zip(full, shard)) if f != s]
    if len(cut) != 1:
        return (f"its dynamic-slice {ds.name!r} keeps {ds.shape} of {ar.shape}: "
                f"{'the whole array' if not cut else 'blocks along several dimensions'}, not one block "
                "along one dimension")
    dim = cut[0]
    p = len(groups[0])
    if any(len(g) != p for g in groups):
        return "its replica groups differ in size"
    if shard[dim] == 0 or full[dim] % shard[dim]:
        return (f"its dynamic-slice {ds.name!r} keeps {shard[dim]} of {full[dim]} along dimension {dim}, which "
                "does not cut it into equal blocks")
    k = full[dim] // shard[dim]
    if p % k:
        return (f"its dynamic-slice {ds.name!r} keeps {shard[dim]} of {full[dim]} along dimension {dim} ({k} blocks), "
                f"but its replica groups hold {p} devices, which do not keep {k} blocks equally often (a "
                f"reduce-scatter's block would be {full[dim] / p:g}): the slice is taken over other devices than "
                "the reduction's")
    if len(ds.operands) != 1 + len(full):
        return f"its dynamic-slice {ds.name!r} does not give one offset per dimension"
    blocks: dict[int, int] = {}
    for g in groups:
        for device in g:
            try:
                got = _evaluate(scope, ds.operands[1 + dim], device, {})
            except _Unknown as e:
                return (f"the offset of its dynamic-slice {ds.name!r} along dimension {dim} is computed by {e}, "
                        "which disco does not evaluate")
            start = min(max(got[0], 0), full[dim] - shard[dim]) if len(got) == 1 else None
            if start is None or start % shard[dim]:
                return (f"its dynamic-slice {ds.name!r} gives device {device} the offset {got} along dimension "
                        f"{dim}, which is no block's start (a multiple of {shard[dim]})")
            blocks[device] = start // shard[dim]
    return dim, blocks, k


def _decomposition(name: str, blocks: Mapping[int, int], k: int, groups: list[tuple[int, ...]]) -> tuple[Groups, Groups] | str:
    """Each replica group's :func:`decompose`, joined; or why one is no reduce-scatter."""
    scatter: list[tuple[int, ...]] = []
    across: list[tuple[int, ...]] = []
    for g in groups:
        got = decompose({d: blocks[d] for d in g}, k)
        if isinstance(got, str):
            return f"its dynamic-slice {name!r} over the replica group {list(g)}: {got}"
        scatter += got[0]
        across += got[1]
    return tuple(scatter), tuple(across)


def scatter_blocks(ordered: Sequence[Instruction], names: Mapping[tuple[str, str], str]) -> tuple[ScatterBlock, ...]:
    """One :class:`ScatterBlock` per all-reduce of ``ordered`` that a dynamic-slice reads.

    Args:
      ordered: a graph's instructions (its computations' instructions, in program order).
      names: (computation, instruction name) -> the graph's name of it (an instruction missing from
        it is named by its own name).
    """
    scopes: dict[str, dict[str, Instruction]] = collections.defaultdict(dict)
    users: dict[tuple[str, str], list[Instruction]] = collections.defaultdict(list)
    for ins in ordered:
        scopes[ins.computation][ins.name] = ins
        for op in dict.fromkeys(ins.operands):
            users[(ins.computation, op)].append(ins)
    out = []
    for ins in ordered:
        if ins.opcode not in _ALL_REDUCES:
            continue
        us = users.get((ins.computation, ins.name), [])
        slices = [u for u in us if u.opcode == "dynamic-slice"]
        if not slices:
            continue
        gname = names.get((ins.computation, ins.name), ins.name)
        snames = tuple(names.get((u.computation, u.name), u.name) for u in slices)
        groups = replica_group_lists(ins.attrs.get("replica_groups"))
        others = [u for u in us if u.opcode != "dynamic-slice"]
        why = ""
        if ins.shape.startswith("("):
            why = "it reduces several arrays"
        elif ins.is_root:
            why = "its result is the computation's result"
        elif others:
            why = f"its result also feeds {others[0].opcode} {others[0].name!r}, not only dynamic-slices"
        elif not groups:
            why = f"its replica groups {ins.attrs.get('replica_groups')!r} are not read as lists of devices"
        if why:
            out.append(ScatterBlock(gname, None, snames, why))
            continue
        scope = scopes[ins.computation]
        first: tuple[int, dict[int, int], int] | None = None
        for ds in slices:
            got = _block_dim(ins, ds, scope, groups)
            if isinstance(got, str):
                why = got
                break
            if first is not None and got[0] != first[0]:
                why = f"its dynamic-slices take blocks along dimensions {first[0]} and {got[0]}"
                break
            if first is not None and got[1:] != first[1:]:
                why = f"its dynamic-slices {slices[0].name!r} and {ds.name!r} give the devices different blocks"
                break
            first = first or got
        parts = why if why or first is None else _decomposition(slices[0].name, first[1], first[2], groups)
        if isinstance(parts, str) or first is None:
            out.append(ScatterBlock(gname, None, snames, parts))
        else:
            out.append(ScatterBlock(gname, first[0], snames, "", *parts))
    return tuple(out)

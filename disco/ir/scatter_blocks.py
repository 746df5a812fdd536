"""Which all-reduces are reduce-scatters in disguise: each user keeps this device's block.

XLA:CPU's SPMD partitioner writes a gradient's return to its shard as an all-reduce of the whole
gradient followed by a ``dynamic-slice`` whose offset comes from ``partition-id`` through constant
tables (``offsets[partition-id]``). That pair is a reduce-scatter when the slice keeps, on every
device, block ``i`` of ``p`` along one dimension, ``i`` the device's position in its replica group
(XLA's reduce-scatter gives the ``i``-th device of a group the ``i``-th block). :func:`scatter_blocks`
checks that from the HLO, evaluating each slice's offset for every device of the groups, and
records for each all-reduce that a dynamic-slice reads either the dimension it scatters along or
why it is no such scatter. A plan's "scatter" bucket (:mod:`disco.plans.check`) takes only the first.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from disco.ir.replica_groups import replica_group_lists

if TYPE_CHECKING:
    from disco.ir.hlo_module import Instruction


class ScatterBlock(NamedTuple):
    """An all-reduce that a dynamic-slice reads, and whether it is a reduce-scatter.

    Attributes:
      all_reduce: its graph name.
      dim: the dimension every user takes this device's block along; None when it is no scatter.
      slices: the graph names of its dynamic-slice users.
      why: for ``dim=None``, what is not a block scatter ("" otherwise).
    """

    all_reduce: str
    dim: int | None
    slices: tuple[str, ...] = ()
    why: str = ""

    def to_dict(self) -> dict:
        return {"all_reduce": self.all_reduce, "dim": self.dim, "slices": list(self.slices), "why": self.why}

    @classmethod
    def from_dict(cls, data: object, where: str) -> ScatterBlock:
        """Reads :meth:`to_dict`'s output. Raises ValueError naming ``where`` and what is wrong."""
        if (not isinstance(data, dict) or set(data) != {"all_reduce", "dim", "slices", "why"}
                or not isinstance(data["all_reduce"], str) or not isinstance(data["why"], str)
                or not (data["dim"] is None or (isinstance(data["dim"], int) and not isinstance(data["dim"], bool)
                                                 and data["dim"] >= 0))
                or not isinstance(data["slices"], list) or not all(isinstance(s, str) for s in data["slices"])):
            raise ValueError(f"graph JSON field {where!r}: expected an object with all_reduce (str), dim (int >= 0 "
                             f"or null), slices (list of str) and why (str), got {str(data)[:80]!r}")
        return cls(data["all_reduce"], data["dim"], tuple(data["slices"]), data["why"])


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
               groups: list[tuple[int, ...]]) -> tuple[int | None, str]:
    """(the dimension ``ds`` takes this device's block of ``ar`` along, "") or (None, why not)."""
    full, shard = _dims(ar.shape), _dims(ds.shape)
    if full is None or shard is None or len(full) != len(shard):
        return None, f"its dynamic-slice {ds.name!r} has shape {ds.shape}, the all-reduce {ar.shape}"
    if ds.operands[0] != ar.name:
        return None, f"it is an offset of the dynamic-slice {ds.name!r}, not the sliced array"
    cut = [i for i, (f, s) in enumerate(zip(full, shard)) if f != s]
    if len(cut) != 1:
        return None, (f"its dynamic-slice {ds.name!r} keeps {ds.shape} of {ar.shape}: "
                      f"{'the whole array' if not cut else 'blocks along several dimensions'}, not one block "
                      "along one dimension")
    dim = cut[0]
    p = len(groups[0])
    if any(len(g) != p for g in groups):
        return None, "its replica groups differ in size"
    if full[dim] != p * shard[dim]:
        return None, (f"its dynamic-slice {ds.name!r} keeps {shard[dim]} of {full[dim]} along dimension {dim}, but "
                      f"its replica groups hold {p} devices (a reduce-scatter's block would be "
                      f"{full[dim] / p:g}): the slice is taken over other devices than the reduction's")
    if len(ds.operands) != 1 + len(full):
        return None, f"its dynamic-slice {ds.name!r} does not give one offset per dimension"
    for g in groups:
        for pos, device in enumerate(g):
            try:
                got = _evaluate(scope, ds.operands[1 + dim], device, {})
            except _Unknown as e:
                return None, (f"the offset of its dynamic-slice {ds.name!r} along dimension {dim} is computed by "
                              f"{e}, which disco does not evaluate")
            start = min(max(got[0], 0), full[dim] - shard[dim]) if len(got) == 1 else None
            if start != pos * shard[dim]:
                return None, (f"its dynamic-slice {ds.name!r} gives device {device} (position {pos} of its replica "
                              f"group {list(g)}) the offset {got} along dimension {dim}, expected "
                              f"{pos * shard[dim]}: the offset table does not follow the replica groups' order")
    return dim, ""


def scatter_blocks(ordered: Sequence[Instruction], names: Mapping[tuple[str, str], str]) -> tuple[ScatterBlock, ...]:
    """One :class:`ScatterBlock` per all-reduce of ``ordered`` that a dynamic-slice reads.

    Args:
      ordered: a graph's instructions (its computations' instructions, in program order).
      names: (computation, instruction name) -> the graph's name of it.
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
        dim: int | None = None
        why = ""
        if ins.shape.startswith("("):
            why = "it reduces several arrays"
        elif ins.is_root:
            why = "its result is the computation's result"
        elif others:
            why = f"its result also feeds {others[0].opcode} {others[0].name!r}, not only dynamic-slices"
        elif not groups:
            why = f"its replica groups {ins.attrs.get('replica_groups')!r} are not read as lists of devices"
        else:
            scope = scopes[ins.computation]
            for ds in slices:
                d, why = _block_dim(ins, ds, scope, groups)
                if d is None or (dim is not None and d != dim):
                    why = why or f"its dynamic-slices take blocks along dimensions {dim} and {d}"
                    dim = None
                    break
                dim = d
        out.append(ScatterBlock(gname, dim if not why else None, snames, why))
    return tuple(out)

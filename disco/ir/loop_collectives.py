"""All-reduces moved out of ``while`` loops (pure Python text surgery on HLO).

XLA's SPMD partitioner puts a gradient's all-reduce where the gradient is computed. In a step
that loops (``lax.scan`` over layers, a recurrent cell over time steps, gradient accumulation
over micro-batches) that is inside the loop's body: one all-reduce per gradient per iteration,
out of the reach of disco's buckets, and each paying its per-message cost every iteration. XLA has
a pass for the accumulate pattern below (``while-loop-all-reduce-code-motion``); XLA:CPU's compile
leaves these all-reduces in the loop (its compiled modules, jax 0.10.2), XLA:GPU's moves them out
(deviceless for H100s, jax 0.11.2).

:func:`hoist` moves such an all-reduce out of the loop when the loop only carries its result
into the loop's output, through two patterns:

* **accumulate**: the carry ``k`` is ``carry_k + f(all-reduce(x))``: the loop then sums the
  local ``f(x)`` and one all-reduce of the final carry follows the loop. A sum's terms are then
  added in another order (rounding-level differences, as XLA's pass makes them).
* **write**: the carry ``k`` is ``dynamic-update-slice(carry_k, f(all-reduce(x)), i...)`` (what
  the transpose of ``lax.scan`` writes each layer's gradient with): each slice is reduced once
  after the loop instead of inside it, the same sums.

``f`` is a chain of ``transpose``, ``reshape``, ``bitcast``, ``copy``, ``slice`` and ``broadcast``
(each moves or copies elements, and a sum of moved elements is the moved sum), of
``dynamic-update-slice`` into zeros (the gradient of ``params[i]``: the same), and of ``reduce``
sums from zero (a sum of sums; over more than one element, in another order); an all-reduce may
feed several carries (one slice each). A carry qualifies only if its initial value is zeros (the reduction of the
final carry then adds nothing else), nothing else in the body or the loop condition reads it,
and the all-reduce sums (its reduction computation is one ``add``). After the loop, each use of
the carry reads the new all-reduce (same replica groups, a new channel id), named as the loop's
``get-tuple-element`` was, so its users keep their operand names. Loops the patterns do not
cover are left as they were.

Example:
  >>> from disco.ir.loop_collectives import hoist
  >>> moved = hoist(text)          # doctest: +SKIP
  >>> moved.text, moved.moved      # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from disco.ir.hlo_module import Computation, Instruction, Module
from disco.ir.hlo_parse import parse_module

# Ops that move or copy elements without combining them: a sum over devices commutes with each.
MOVES = frozenset({"transpose", "reshape", "bitcast", "copy", "slice", "broadcast"})
_CHANNEL_RE = re.compile(r"channel_id=(\d+)")
_ZERO_RE = re.compile(r"^\s*\{?[\s{}]*(-?0(\.0*)?(e[+-]?\d+)?[\s,{}]*)+\}?\s*$", re.I)
SUFFIX = ".disco_local"


class Moved(NamedTuple):
    """One all-reduce moved out of a loop.

    Attributes:
      all_reduce: its name in the loop's body (gone from the text).
      loop: the ``while`` it was in.
      carries: the loop's tuple indices it reached, and whether each accumulates (True) or is
        written slice by slice (False).
      after: the all-reduces that now follow the loop (named as the loop's get-tuple-elements).
    """

    all_reduce: str
    loop: str
    carries: tuple[tuple[int, bool], ...]
    after: tuple[str, ...]


class Hoisted(NamedTuple):
    """The module text with the all-reduces moved, and what moved (empty: the text unchanged)."""

    text: str
    moved: tuple[Moved, ...]


class _Scope(NamedTuple):
    """A computation with its instructions by name and each one's users, built once per computation."""

    comp: Computation
    names: dict[str, Instruction]
    users: dict[str, list[Instruction]]


def _scope(comp: Computation) -> _Scope:
    users: dict[str, list[Instruction]] = {ins.name: [] for ins in comp.instructions}
    for ins in comp.instructions:
        for op in dict.fromkeys(ins.operands):
            users.setdefault(op, []).append(ins)
    return _Scope(comp, comp.by_name(), users)


def _is_sum(module: Module, ins: Instruction) -> bool:
    """An all-reduce of one array whose reduction computation adds its two parameters."""
    if ins.opcode != "all-reduce" or len(ins.operands) != 1 or len(ins.arrays) != 1 or ins.shape.startswith("("):
        return False
    return _adds(module, ins)


def _adds(module: Module, ins: Instruction) -> bool:
    """``ins``'s reduction computation (``to_apply``) adds its two parameters."""
    name = ins.attrs.get("to_apply", "").lstrip("%")
    try:
        red = module.computation(name)
    except (KeyError, ValueError):
        return False
    params = [i.name for i in red.instructions if i.opcode == "parameter"]
    root = red.root
    return root.opcode == "add" and len(params) == 2 and sorted(root.operands) == sorted(params)


def _is_zero(names: Mapping[str, Instruction], name: str) -> bool:
    """``name`` (of a computation whose instructions are ``names``) is zeros: a constant of zeros, or
    a broadcast of one (copies looked through)."""
    ins = names.get(name)
    while ins is not None and ins.opcode == "copy":
        ins = names.get(ins.operands[0])
    if ins is None:
        return False
    if ins.opcode == "broadcast":
        return _is_zero(names, ins.operands[0])
    return ins.opcode == "constant" and bool(_ZERO_RE.match(ins.raw_operands))


def _carry_reads(comp: Computation) -> dict[int, list[Instruction]] | None:
    """Per tuple index, the get-tuple-elements of ``comp``'s parameter (its only one); None when
    the parameter is read otherwise too (whole, by a call or a tuple), so any element may be."""
    params = [i for i in comp.instructions if i.opcode == "parameter"]
    if len(params) != 1:
        return None
    reads: dict[int, list[Instruction]] = {}
    for ins in comp.instructions:
        if params[0].name not in ins.operands:
            continue
        if ins.opcode != "get-tuple-element" or ins.operands != (params[0].name,):
            return None
        reads.setdefault(int(ins.attrs.get("index", "-1")), []).append(ins)
    return reads


def _whole_line(line: str | None, ins: Instruction) -> bool:
    """``line`` holds all of ``ins`` (brackets balanced), so it can be replaced alone."""
    return line is not None and f"%{ins.name} " in line and all(
        line.count(a) == line.count(b) for a, b in ("()", "{}", "[]"))


def _sums(module: Module, names: Mapping[str, Instruction], ins: Instruction, source: str) -> bool:
    """``ins`` sums ``source`` over some of its dimensions from zero (a ``reduce`` with an add)."""
    return (ins.opcode == "reduce" and len(ins.operands) == 2 and ins.operands[0] == source
            and ins.operands[1] != source and _is_zero(names, ins.operands[1]) and _adds(module, ins))


def _placed(names: Mapping[str, Instruction], ins: Instruction, source: str) -> bool:
    """``ins`` writes ``source`` into zeros (a ``dynamic-update-slice`` of a zero array, at indices
    that do not read ``source``): the gradient of an indexed read, ``params[i]``."""
    return (ins.opcode == "dynamic-update-slice" and len(ins.operands) >= 3 and ins.operands[1] == source
            and source not in (ins.operands[0], *ins.operands[2:]) and _is_zero(names, ins.operands[0]))


def _reach(module: Module, body: _Scope, reads: Mapping[int, list[Instruction]], start: Instruction
           ) -> dict[int, bool] | None:
    """The carries ``start`` (an all-reduce in the loop's body) reaches, each accumulated (True)
    or written (False); None when any path from it leads elsewhere. ``reads``: the body's
    :func:`_carry_reads`."""
    root, users = body.comp.root, body.users
    carries: dict[int, bool] = {}
    stack = [start]
    while stack:
        ins = stack.pop()
        for user in users.get(ins.name, []):
            if (user.opcode in MOVES and len(user.operands) == 1) or _sums(module, body.names, user, ins.name) \
                    or _placed(body.names, user, ins.name):
                stack.append(user)
                continue
            slots = [k for k, op in enumerate(root.operands) if op == user.name]
            if len(slots) != 1 or len(users.get(user.name, [])) != 1:  # the root alone reads it, once
                return None
            k = slots[0]
            carry = reads.get(k, [])
            if len(carry) != 1 or len(users.get(carry[0].name, [])) != 1:  # the carry feeds this op alone
                return None
            if user.opcode == "add" and sorted(user.operands) == sorted((carry[0].name, ins.name)) \
                    and carry[0].name != ins.name:
                accumulate = True
            elif user.opcode == "dynamic-update-slice" and user.operands[:2] == (carry[0].name, ins.name) \
                    and ins.name not in user.operands[2:]:
                accumulate = False
            else:
                return None
            if k in carries:
                return None
            carries[k] = accumulate
    return carries or None


def _loop_plan(module: Module, parent: _Scope, loop: Instruction, callers: Mapping[str, int]
               ) -> list[tuple[Instruction, dict[int, bool]]]:
    """The all-reduces of ``loop``'s body (``loop`` in ``parent``) that can move after it, with the
    carries each reaches."""
    body_name = loop.attrs.get("body", "").lstrip("%")
    cond_name = loop.attrs.get("condition", "").lstrip("%")
    if callers.get(body_name, 0) != 1 or len(loop.operands) != 1:
        return []
    init = parent.names.get(loop.operands[0])
    if init is None or init.opcode != "tuple":
        return []
    if any(u.opcode != "get-tuple-element" for u in parent.users.get(loop.name, [])):
        return []
    body = _scope(module.computation(body_name))
    reads = _carry_reads(body.comp)
    cond_reads = _carry_reads(module.computation(cond_name)) if cond_name else {}
    if body.comp.root.opcode != "tuple" or reads is None or cond_reads is None:
        return []
    taken: set[int] = set()
    out = []
    for ins in body.comp.instructions:
        if not _is_sum(module, ins):
            continue
        carries = _reach(module, body, reads, ins)
        if not carries or set(carries) & (set(cond_reads) | taken):
            continue
        if not all(k < len(init.operands) and _is_zero(parent.names, init.operands[k]) for k in carries):
            continue
        taken |= set(carries)
        out.append((ins, carries))
    return out


def _rename(line: str, old: str, new: str) -> str:
    """``line`` with each operand reference ``%old`` read as ``%new``."""
    return re.sub(rf"%{re.escape(old)}(?![\w.\-])", f"%{new}", line)


def hoist(text: str, module: Module | None = None) -> Hoisted:
    """``text`` with every all-reduce the module docstring's patterns cover moved after its loop.

    Loops are taken one level at a time, innermost last: an all-reduce moved out of an inner loop
    lands in the outer loop's body, where a second call can move it again.
    """
    module = module or parse_module(text)
    callers: dict[str, int] = {}
    for comp in module.computations:
        for ins in comp.instructions:
            for called in ins.called:
                callers[called] = callers.get(called, 0) + 1
    lines: list[str | None] = list(text.split("\n"))  # None: a line taken out
    channel = max((int(c) for c in _CHANNEL_RE.findall(text)), default=0)
    moved: list[Moved] = []
    inserts: dict[int, list[str]] = {}  # 0-based line -> lines to put after it
    for comp in module.computations:
        loops = [i for i in comp.instructions if i.opcode == "while"]
        if not loops:
            continue
        parent = _scope(comp)
        for loop in loops:
            plan = _loop_plan(module, parent, loop, callers)
            if not plan:
                continue
            body = module.computation(loop.attrs["body"].lstrip("%"))
            outs = parent.users.get(loop.name, [])
            if not all(_whole_line(lines[i.line - 1], i) for i in [ar for ar, _ in plan] + outs):
                continue  # an instruction written over several lines: left as it is
            body_lines = range(min(i.line for i in body.instructions) - 1, max(i.line for i in body.instructions))
            for ar, carries in plan:
                source = ar.operands[0]
                lines[ar.line - 1] = None
                for j in body_lines:
                    if lines[j] is not None:
                        lines[j] = _rename(lines[j], ar.name, source)
                attrs = [f"{k}={v}" for k, v in ar.attrs.items()
                         if k in ("replica_groups", "use_global_device_ids", "to_apply")]
                after = []
                for gte in outs:
                    if int(gte.attrs.get("index", "-1")) not in carries:
                        continue
                    ids = []
                    if "channel_id" in ar.attrs:  # a cross-partition all-reduce; without one, cross-replica
                        channel += 1
                        ids = [f"channel_id={channel}"]
                    local = gte.name + SUFFIX
                    line = str(lines[gte.line - 1]).replace(f"%{gte.name} =", f"%{local} =", 1)
                    indent = line[:len(line) - len(line.lstrip())]
                    root = "ROOT " if gte.is_root else ""
                    lines[gte.line - 1] = line.replace("ROOT ", "", 1) if root else line
                    inserts.setdefault(gte.line - 1, []).append(
                        f"{indent}{root}%{gte.name} = {gte.shape} all-reduce(%{local}), " + ", ".join(ids + attrs))
                    after.append(gte.name)
                moved.append(Moved(ar.name, loop.name, tuple(sorted(carries.items())), tuple(after)))
    if not moved:
        return Hoisted(text, ())
    out: list[str] = []
    for j, line in enumerate(lines):
        if line is not None:
            out.append(line)
        out.extend(inserts.get(j, ()))
    return Hoisted("\n".join(out), tuple(moved))


def hoist_all(text: str, rounds: int = 4) -> Hoisted:
    """:func:`hoist` repeated until nothing moves (nested loops), at most ``rounds`` times."""
    moved: list[Moved] = []
    for _ in range(rounds):
        step = hoist(text)
        if not step.moved:
            break
        text = step.text
        moved.extend(step.moved)
    return Hoisted(text, tuple(moved))


def summary(moved: Sequence[Moved]) -> dict[str, int]:
    """Counts for a report: all-reduces moved, carries accumulated and written, loops touched."""
    carries = [acc for m in moved for _, acc in m.carries]
    return {"all_reduces": len(moved), "accumulated": sum(carries), "written": len(carries) - sum(carries),
            "loops": len({m.loop for m in moved})}

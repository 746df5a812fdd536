"""Per-instruction flop estimates (pure Python).

Estimates follow the usual counting conventions: a multiply-add is two flops
(dot, convolution), an elementwise op is one flop per output element, a
reduction is one flop per input element. Data movement counts zero flops;
its cost shows up in bytes. A ``while`` counts its body's and condition's flops
once per iteration (:func:`disco.ir.loops.while_trip_count`; once when the trip
count is not known).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from disco.ir import loops
from disco.ir.hlo_module import Instruction, Module
from disco.ir.opcodes import ELEMENTWISE


def _dims_attr(ins: Instruction, key: str) -> tuple[int, ...]:
    val = ins.attrs.get(key, "").strip("{} ")
    return tuple(int(v) for v in val.split(",") if v.strip())


def instruction_flops(
    ins: Instruction,
    operand: Callable[[str], Instruction | None],
    called_flops: Callable[[str], float],
    trip_count: int | None = None,
) -> float:
    """Estimates the flops of one instruction.

    Args:
      ins: the instruction.
      operand: looks up an operand instruction by name (None if unknown).
      called_flops: flops of a called computation by name.
      trip_count: for a ``while``, its trip count: the flops of its body and condition are
        counted that many times (None: unknown, counted once).
    """
    out = sum(a.elements for a in ins.arrays)
    op = ins.opcode
    if op in ELEMENTWISE:
        return float(out)
    if op == "dot":
        lhs = operand(ins.operands[0]) if ins.operands else None
        if lhs is None or not lhs.arrays:
            return 2.0 * out
        dims = lhs.arrays[0].dims
        k = math.prod(dims[d] for d in _dims_attr(ins, "lhs_contracting_dims") if d < len(dims))
        return 2.0 * out * k
    if op == "convolution":
        rhs = operand(ins.operands[1]) if len(ins.operands) > 1 else None
        labels = ins.attrs.get("dim_labels", "")
        if rhs is None or "_" not in labels:
            return 2.0 * out
        kernel_labels = labels.split("_")[1].split("->")[0]
        rdims = rhs.arrays[0].dims
        k = math.prod(d for lab, d in zip(kernel_labels, rdims) if lab != "o")
        return 2.0 * out * k
    if op in ("reduce", "reduce-window", "all-reduce", "reduce-scatter", "select-and-scatter"):
        first = operand(ins.operands[0]) if ins.operands else None
        n_in = first.arrays[0].elements if first is not None and first.arrays else out
        if op == "all-reduce":
            return float(out)
        return float(max(n_in, out))
    if op == "while":
        trips = 1 if trip_count is None else trip_count
        return float(trips * sum(called_flops(c) for c in ins.called))
    if op in ("fusion", "call", "conditional", "map", "sort", "scatter"):
        return float(sum(called_flops(c) for c in ins.called))
    return 0.0


def module_flops(module: Module) -> Mapping[tuple[str, str], float]:
    """Flops per (computation, instruction name) over the whole module (called computations summed in).

    Instruction names are scoped per computation (the same name may appear in two), so
    operands are looked up in their own computation. A ``while``'s flops are its trip
    count times its body's and condition's (:mod:`disco.ir.loops`; once if unknown).
    """
    comps = {c.name: c for c in module.computations}
    trips = loops.trip_counts(module)
    memo: dict[str, float] = {}
    per_ins: dict[tuple[str, str], float] = {}

    def comp_flops(name: str) -> float:
        if name in memo:
            return memo[name]
        memo[name] = 0.0  # guards against recursion
        comp = comps.get(name)
        total = 0.0
        if comp is not None:
            names = comp.by_name()
            for ins in comp.instructions:
                f = instruction_flops(ins, names.get, comp_flops, trips.get((name, ins.name)))
                per_ins[(name, ins.name)] = f
                total += f
        memo[name] = total
        return total

    for c in module.computations:
        comp_flops(c.name)
    return per_ins

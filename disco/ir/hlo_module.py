"""What the HLO parser returns: a module of computations of instructions, with array shapes.

Plain frozen dataclasses, no parsing (:mod:`disco.ir.hlo_parse` builds them from text), and which
of a module's computations make up the step (:func:`step_computations`: the entry and the bodies of
calls inlined into it), which the graph and the fingerprint both read.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re

DTYPE_BYTES: dict[str, float] = {
    "pred": 1, "s1": 0.125, "u1": 0.125, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
    "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e3m4": 1,
    "f8e4m3b11fnuz": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5,
    "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "token": 0, "opaque": 0,
}

# Attributes that name called computations.
CALL_ATTRS = ("to_apply", "calls", "body", "condition", "branch_computations",
              "true_computation", "false_computation", "scatter", "select")


@dataclasses.dataclass(frozen=True)
class ArrayShape:
    """One array of an HLO shape: dtype and dimensions (dynamic bounds as ints)."""

    dtype: str
    dims: tuple[int, ...]

    @functools.cached_property
    def elements(self) -> int:
        return math.prod(self.dims)

    @functools.cached_property
    def nbytes(self) -> int:
        return int(math.ceil(self.elements * DTYPE_BYTES.get(self.dtype, 4)))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction as written in the text (comments left out)."""

    name: str
    opcode: str
    shape: str  # the shape text, e.g. "f32[8,16]{1,0}" or "(f32[2], s32[])"; inferred if omitted
    arrays: tuple[ArrayShape, ...]  # the shape's leaves, in order
    operands: tuple[str, ...]  # operand instruction names (in this instruction's computation)
    attrs: dict[str, str]  # attribute name -> raw value text
    raw_operands: str  # the text between the opcode's parentheses
    computation: str
    is_root: bool = False
    line: int = dataclasses.field(default=0, compare=False)  # 1-based line in the file
    # What the fingerprint reads where it differs from the above (see disco.ir.fingerprint): the
    # attribute list and a literal with XLA's /*index=N*/ markers kept; "" when no different.
    fingerprint_attrs: str = dataclasses.field(default="", compare=False, repr=False)
    fingerprint_literal: str = dataclasses.field(default="", compare=False, repr=False)

    @functools.cached_property
    def called(self) -> tuple[str, ...]:
        """Names of computations this instruction calls."""
        out = []
        for key in CALL_ATTRS:
            if key in self.attrs:
                val = self.attrs[key].strip()
                if val.startswith("{"):
                    val = val[1:-1]
                out.extend(v.strip().lstrip("%") for v in val.split(",") if v.strip())
        return tuple(out)

    @property
    def out_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def op_name(self) -> str | None:
        """The ``metadata={op_name=...}`` string, unescaped, when present."""
        meta = self.attrs.get("metadata")
        if not meta:
            return None
        m = re.search(r'op_name="((?:[^"\\]|\\.)*)"', meta)
        if not m:
            return None
        return re.sub(r"\\(.)", r"\1", m.group(1))


@dataclasses.dataclass(frozen=True)
class Computation:
    name: str
    instructions: tuple[Instruction, ...]
    is_entry: bool = False

    @property
    def root(self) -> Instruction:
        for ins in self.instructions:
            if ins.is_root:
                return ins
        return self.instructions[-1]

    def by_name(self) -> dict[str, Instruction]:
        return {ins.name: ins for ins in self.instructions}


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    computations: tuple[Computation, ...]
    header: str

    @property
    def entry(self) -> Computation:
        for comp in self.computations:
            if comp.is_entry:
                return comp
        # Without an ENTRY marker, XLA treats the last computation as the entry.
        return self.computations[-1]

    def computation(self, name: str) -> Computation:
        for comp in self.computations:
            if comp.name == name:
                return comp
        raise KeyError(f"no computation named {name!r} in module {self.name!r}")


def inlinable(module: Module) -> set[str]:
    """Computations called by exactly one ``call`` instruction (and by nothing else)."""
    uses: collections.Counter[str] = collections.Counter()
    for comp in module.computations:
        for ins in comp.instructions:
            for c in ins.called:
                uses[(c, ins.opcode == "call")] += 1
    return {c for (c, is_call), n in uses.items() if is_call and n == 1 and uses[(c, False)] == 0}


def step_computations(module: Module, entry: Computation | None = None,
                      inline: set[str] | None = None) -> list[Computation]:
    """The entry computation and the computations inlined into it.

    A computation is inlined when a single ``call`` instruction uses it (jax's
    shard_map body); a computation called from several places (a nested
    ``jax.jit``) stays behind its ``call`` nodes, which then count its flops.

    Args:
      module: the module.
      entry: the computation to start from (default the module's entry; a loop body
        for :class:`disco.ir.graph.Loop` graphs).
      inline: ``inlinable(module)``, when the caller has it already.
    """
    comps = {c.name: c for c in module.computations}
    inline = inlinable(module) if inline is None else inline
    out: list[Computation] = []

    def visit(comp: Computation) -> None:
        out.append(comp)
        for ins in comp.instructions:
            if ins.opcode == "call":
                for c in ins.called:
                    if c in comps and c in inline:
                        visit(comps[c])

    visit(module.entry if entry is None else entry)
    return out

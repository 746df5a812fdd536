"""Trip counts of HLO ``while`` loops (pure Python).

A ``while`` runs its body (and its condition) once per iteration, so anything that counts work
inside a loop (flops, kernels, bytes) multiplies by the trip count. The count is read two ways:

1. **XLA's own analysis**, written into the optimised module: XLA's while-loop passes set
   ``backend_config={..."known_trip_count":{"n":"12"}...}`` when they know it.
2. **The induction-variable pattern**, for pre-optimisation HLO (what jax lowers ``lax.scan``,
   ``fori_loop`` and ``nn.scan`` to), after XLA's ``MatchTrivialLoopTripCount``
   (``xla/service/while_loop_analysis.cc``): the condition's root compares one tuple element
   ``i`` of its parameter with an integer constant ``N`` (LT, LE, GT or GE, ``i`` on either
   side); the body's root is a tuple whose element for ``i`` is ``i + k`` (or ``i - k``) with
   an integer constant ``k``; the while's init is a tuple whose element for ``i`` is an integer
   constant. ``copy`` ops and ``get-tuple-element`` of a ``tuple`` are looked through, and a
   compare or add wrapped in a fusion (XLA:CPU's ``wrapped_compare``) is read inside it.

A loop neither form recognises (a data-dependent condition, a bound read from a parameter) has
no known count: :func:`while_trip_count` returns None, and callers count its body once (and
say so: ``HloGraph.summary()["loops_unknown_trips"]``).

Example:
  >>> from disco.ir import hlo_parse, loops
  >>> module = hlo_parse.parse_module(text)  # doctest: +SKIP
  >>> loops.trip_counts(module)               # doctest: +SKIP
  {('main.3', 'while.5'): 7}
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from disco.ir.hlo_module import Computation, Instruction, Module

_KNOWN_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(-?\d+)"?')
_INT_RE = re.compile(r"-?\d+")
# Comparison directions with the induction variable on the left; on the right they mirror.
_MIRROR = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}


def known_trip_count(ins: Instruction) -> int | None:
    """The trip count XLA wrote into a while's ``backend_config`` (optimised HLO), else None."""
    m = _KNOWN_TRIP_RE.search(ins.attrs.get("backend_config", ""))
    return max(0, int(m.group(1))) if m else None


def while_trip_count(module: Module, ins: Instruction) -> int | None:
    """How many times ``ins`` (a ``while`` of ``module``) runs its body, when that is static.

    Args:
      module: the parsed module holding ``ins``.
      ins: a ``while`` instruction of one of ``module``'s computations.

    Returns:
      The trip count (0 or more), or None when neither XLA's ``known_trip_count`` nor the
      induction-variable pattern (module docstring) gives it.

    Raises:
      ValueError: if ``ins`` is not a ``while``.
    """
    return _Analysis(module).trip_count(ins)


def trip_counts(module: Module) -> dict[tuple[str, str], int | None]:
    """Every ``while`` of ``module``: (computation name, instruction name) -> trip count or None."""
    analysis = _Analysis(module)
    return {(c.name, ins.name): analysis.trip_count(ins)
            for c in module.computations for ins in c.instructions if ins.opcode == "while"}


class _Analysis:
    """Per-module lookups shared by the trip counts of all its loops."""

    def __init__(self, module: Module):
        self.comps: dict[str, Computation] = {c.name: c for c in module.computations}
        self._scopes: dict[str, Mapping[str, Instruction]] = {}

    def scope(self, comp: str) -> Mapping[str, Instruction]:
        s = self._scopes.get(comp)
        if s is None:
            c = self.comps.get(comp)
            s = self._scopes[comp] = c.by_name() if c is not None else {}
        return s

    def trip_count(self, ins: Instruction) -> int | None:
        if ins.opcode != "while":
            raise ValueError(f"while_trip_count: expected a 'while' instruction, got {ins.opcode!r} ({ins.name!r})")
        known = known_trip_count(ins)
        if known is not None:
            return known
        cond = self.comps.get(ins.attrs.get("condition", "").strip().lstrip("%"))
        body = self.comps.get(ins.attrs.get("body", "").strip().lstrip("%"))
        if cond is None or body is None or not ins.operands:
            return None
        compared = self._compare(cond.root)
        if compared is None:
            return None
        direction, lhs, rhs = compared
        lhs_index, rhs_index = self._tuple_index(lhs), self._tuple_index(rhs)
        lhs_const, rhs_const = self._int_constant(lhs), self._int_constant(rhs)
        if lhs_index is not None and rhs_const is not None:
            index, bound = lhs_index, rhs_const
        elif rhs_index is not None and lhs_const is not None:
            index, bound, direction = rhs_index, lhs_const, _MIRROR.get(direction, "")
        else:
            return None
        step = self._step(body, index)
        init = self._init(ins, index)
        if step is None or init is None or direction not in _MIRROR:
            return None
        return _count(init, bound, step, direction)

    # -- pattern pieces ---------------------------------------------------------------------
    def _trace(self, ins: Instruction) -> Instruction:
        """Looks through copies and get-tuple-element of a tuple (XLA's TraceThroughCopyAndGteTupleChain)."""
        scope = self.scope(ins.computation)
        for _ in range(64):
            if ins.opcode == "copy" and ins.operands and ins.operands[0] in scope:
                ins = scope[ins.operands[0]]
            elif ins.opcode == "get-tuple-element" and ins.operands and ins.operands[0] in scope:
                src = scope[ins.operands[0]]
                index = _int_attr(ins, "index")
                if src.opcode != "tuple" or index is None or index >= len(src.operands) \
                        or src.operands[index] not in scope:
                    return ins
                ins = scope[src.operands[index]]
            else:
                return ins
        return ins

    def _tuple_index(self, ins: Instruction) -> int | None:
        """N when ``ins`` is ``get-tuple-element(parameter(0), index=N)`` (after tracing)."""
        ins = self._trace(ins)
        if ins.opcode != "get-tuple-element" or not ins.operands:
            return None
        src = self.scope(ins.computation).get(ins.operands[0])
        if src is None or src.opcode != "parameter" or src.raw_operands.strip() != "0":
            return None
        return _int_attr(ins, "index")

    def _int_constant(self, ins: Instruction) -> int | None:
        """The value of a scalar integer constant (after tracing), else None."""
        ins = self._trace(ins)
        if ins.opcode != "constant" or len(ins.arrays) != 1 or ins.arrays[0].elements != 1:
            return None
        if not ins.arrays[0].dtype.startswith(("s", "u")):
            return None
        text = ins.raw_operands.strip().strip("{}").strip()
        return int(text) if _INT_RE.fullmatch(text) else None

    def _binary(self, ins: Instruction, opcodes: tuple[str, ...]) -> tuple[str, Instruction, Instruction] | None:
        """(opcode, lhs, rhs) of a binary op among ``opcodes``, looking into a fusion that wraps one."""
        scope = self.scope(ins.computation)
        if ins.opcode in opcodes and len(ins.operands) == 2 and all(o in scope for o in ins.operands):
            return ins, scope[ins.operands[0]], scope[ins.operands[1]]
        if ins.opcode == "fusion" and len(ins.called) == 1 and ins.called[0] in self.comps:
            fused = self.comps[ins.called[0]]
            root = fused.root
            inner = self.scope(fused.name)
            if root.opcode not in opcodes or len(root.operands) != 2:
                return None
            outer = []
            for name in root.operands:
                p = inner.get(name)
                if p is None or p.opcode != "parameter" or not _INT_RE.fullmatch(p.raw_operands.strip()):
                    return None
                k = int(p.raw_operands)
                if k >= len(ins.operands) or ins.operands[k] not in scope:
                    return None
                outer.append(scope[ins.operands[k]])
            return root, outer[0], outer[1]
        return None

    def _compare(self, root: Instruction) -> tuple[str, Instruction, Instruction] | None:
        found = self._binary(root, ("compare",))
        if found is None:
            return None
        op, lhs, rhs = found
        return op.attrs.get("direction", "").strip(), lhs, rhs

    def _step(self, body: Computation, index: int) -> int | None:
        """k when the body's root tuple sets element ``index`` to ``i + k`` (``i - k``: -k)."""
        root = body.root
        scope = self.scope(body.name)
        if root.opcode != "tuple" or index >= len(root.operands) or root.operands[index] not in scope:
            return None
        found = self._binary(self._trace(scope[root.operands[index]]), ("add", "subtract"))
        if found is None:
            return None
        op, lhs, rhs = found
        if self._tuple_index(lhs) == index and (k := self._int_constant(rhs)) is not None:
            return k if op.opcode == "add" else -k
        if op.opcode == "add" and self._tuple_index(rhs) == index and (k := self._int_constant(lhs)) is not None:
            return k
        return None

    def _init(self, ins: Instruction, index: int) -> int | None:
        """The induction variable's initial value: element ``index`` of the while's init tuple."""
        scope = self.scope(ins.computation)
        init = scope.get(ins.operands[0])
        if init is None:
            return None
        init = self._trace(init)
        if init.opcode != "tuple" or index >= len(init.operands) or init.operands[index] not in scope:
            return None
        return self._int_constant(scope[init.operands[index]])


def _int_attr(ins: Instruction, key: str) -> int | None:
    val = ins.attrs.get(key, "").strip()
    return int(val) if val.isdigit() else None


def _count(init: int, bound: int, step: int, direction: str) -> int | None:
    """Iterations of ``for (i = init; i DIR bound; i += step)``; None when it never ends."""
    if step == 0:
        return None
    if direction in ("LT", "LE"):
        if step < 0:
            return None if _holds(init, bound, direction) else 0
        span = bound - init + (1 if direction == "LE" else 0)
        return max(0, -(-span // step))
    if step > 0:  # GT, GE counting up: never ends if it starts true
        return None if _holds(init, bound, direction) else 0
    span = init - bound + (1 if direction == "GE" else 0)
    return max(0, -(-span // -step))


def _holds(i: int, bound: int, direction: str) -> bool:
    return {"LT": i < bound, "LE": i <= bound, "GT": i > bound, "GE": i >= bound}[direction]

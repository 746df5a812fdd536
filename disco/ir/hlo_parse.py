"""A parser for XLA's HLO text format (pure Python, no jax import).

It reads what ``lowered.as_text(dialect="hlo")``, ``compiled.as_text()`` and the
files written by ``--xla_dump_to`` contain: a ``HloModule`` header, optional
debug tables (``FileNames``, ``StackFrames``, ...), then computations made of
one instruction per line::

    [ROOT] [%]name = SHAPE opcode(OPERANDS), attr=value, ...

Only the structure disco needs is kept: names, opcodes, shapes, operand names,
called computations and raw attributes.
"""

from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES: dict[str, float] = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
    "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e3m4": 1,
    "f8e8m0fnu": 1, "f4e2m1fn": 0.5,
    "bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "token": 0, "opaque": 0,
}

# Attributes that name called computations.
_CALL_ATTRS = ("to_apply", "calls", "body", "condition", "branch_computations",
               "true_computation", "false_computation", "scatter", "select")

_HEADER_RE = re.compile(r"^\s*HloModule\s+([^\s,]+)")
_COMP_RE = re.compile(r"^\s*(ENTRY\s+)?%?([^\s(]+)\s*(\(.*\)\s*->\s*.*)?\{\s*$")
_INSTR_RE = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_ARRAY_RE = re.compile(r"^([a-z][a-z0-9]*)\[([^\]]*)\](\{[^}]*\})?")


class HloParseError(ValueError):
    """The text is not HLO that this parser understands."""


@dataclasses.dataclass(frozen=True)
class ArrayShape:
    """One array of an HLO shape: dtype and dimensions (dynamic bounds as ints)."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return int(math.ceil(self.elements * DTYPE_BYTES.get(self.dtype, 4)))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction as written in the text."""

    name: str
    opcode: str
    shape: str  # the shape text, e.g. "f32[8,16]{1,0}" or "(f32[2], s32[])"
    arrays: tuple[ArrayShape, ...]  # the shape's leaves, in order
    operands: tuple[str, ...]  # operand instruction names
    attrs: dict[str, str]  # attribute name -> raw value text
    raw_operands: str  # the text between the opcode's parentheses
    computation: str
    is_root: bool = False

    @property
    def called(self) -> tuple[str, ...]:
        """Names of computations this instruction calls."""
        out = []
        for key in _CALL_ATTRS:
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


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Splits on ``sep`` outside (), [], {}, <> and double-quoted strings."""
    parts: list[str] = []
    depth = 0
    in_str = False
    start = 0
    i = 0
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            # '->' in a signature is not a closing bracket.
            if not (c == ">" and i > 0 and text[i - 1] == "-"):
                depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def replica_group_size(replica_groups: str | None) -> int | None:
    """Devices per replica group in an HLO ``replica_groups`` attribute, or None when unknown.

    Reads the explicit form ``{{0,1,2,3},{4,5,6,7}}`` (every group the same size) and the iota
    form ``[2,4]<=[8]`` (groups x size). ``{}`` (all replicas, size known only at run time),
    groups of unequal size and anything else give None.

    >>> replica_group_size("{{0,1,2,3,4,5,6,7}}"), replica_group_size("[2,4]<=[8]")
    (8, 4)
    """
    if not replica_groups:
        return None
    text = replica_groups.strip()
    m = re.fullmatch(r"\[(\d+),(\d+)\]<=\[[\d,]+\](?:T\([\d,]+\))?", text)
    if m:
        return int(m.group(2))
    m = re.fullmatch(r"\{(\{[\d,\s]*\}(?:\s*,\s*\{[\d,\s]*\})*)\}", text)
    if not m:
        return None
    sizes = {len([d for d in g.split(",") if d.strip()]) for g in re.findall(r"\{([^{}]*)\}", m.group(1))}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size or None


def _matching(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start``."""
    open_c = text[start]
    close_c = {"(": ")", "[": "]", "{": "}"}[open_c]
    depth = 0
    in_str = False
    i = start
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise HloParseError(f"unbalanced {open_c!r} in: {text[:200]!r}")


def parse_shape(text: str) -> tuple[ArrayShape, ...]:
    """Parses a shape such as ``f32[8,16]{1,0}`` or ``(f32[2], (s32[], pred[]))``."""
    text = re.sub(r"/\*.*?\*/", "", text).strip()
    if not text:
        raise HloParseError("empty shape")
    if text.startswith("("):
        inner = text[1:_matching(text, 0)]
        out: list[ArrayShape] = []
        for part in split_top_level(inner):
            out.extend(parse_shape(part))
        return tuple(out)
    m = _ARRAY_RE.match(text)
    if not m:
        raise HloParseError(f"cannot parse shape {text!r}; expected e.g. 'f32[8,16]{{1,0}}'")
    dims = []
    for d in m.group(2).split(","):
        d = d.strip().lstrip("<=")
        if d:
            dims.append(int(d) if d != "?" else 1)
    return (ArrayShape(m.group(1), tuple(dims)),)


def _split_shape(rest: str) -> tuple[str, str]:
    """Splits ``SHAPE opcode(...)...`` into the shape text and the remainder."""
    rest = rest.strip()
    if rest.startswith("("):
        end = _matching(rest, 0)
        return rest[: end + 1], rest[end + 1:].strip()
    m = _ARRAY_RE.match(rest)
    if not m:
        raise HloParseError(f"cannot find a shape at the start of {rest[:120]!r}")
    return m.group(0), rest[m.end():].strip()


def _operand_name(token: str) -> str | None:
    token = token.strip()
    if not token:
        return None
    # "f32[2]{0} %x" (operand shapes printed) or "%x" or "x".
    last = token.split()[-1]
    if last.startswith("%"):
        return last[1:]
    if re.fullmatch(r"[A-Za-z_][\w.\-]*", last):
        return last
    return None


def parse_instruction(line: str, computation: str) -> Instruction:
    m = _INSTR_RE.match(line)
    if not m:
        raise HloParseError(f"cannot parse instruction line {line.strip()[:200]!r}")
    is_root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
    shape_text, rest = _split_shape(rest)
    om = re.match(r"([a-z][a-z0-9\-_]*)\(", rest)
    if not om:
        raise HloParseError(f"cannot find the opcode of {name!r} in {rest[:120]!r}")
    opcode = om.group(1)
    open_idx = om.end() - 1
    close_idx = _matching(rest, open_idx)
    raw_operands = rest[open_idx + 1: close_idx]
    tail = rest[close_idx + 1:].strip()
    operands: tuple[str, ...] = ()
    if opcode not in ("constant", "parameter", "iota", "rng-get-and-update-state"):
        names = (_operand_name(t) for t in split_top_level(re.sub(r"/\*.*?\*/", "", raw_operands)))
        operands = tuple(n for n in names if n is not None)
    attrs: dict[str, str] = {}
    if tail.startswith(","):
        for part in split_top_level(tail[1:]):
            key, eq, val = part.partition("=")
            attrs[key.strip()] = val.strip() if eq else ""
    return Instruction(
        name=name, opcode=opcode, shape=shape_text, arrays=parse_shape(shape_text),
        operands=operands, attrs=attrs, raw_operands=raw_operands,
        computation=computation, is_root=is_root,
    )


def parse_module(text: str) -> Module:
    """Parses an HLO module text.

    Raises:
      HloParseError: if the text is not an HLO module (the message quotes the
        offending line and says what was expected).
    """
    if not isinstance(text, str) or not text.strip():
        raise HloParseError("empty HLO text; expected a module starting with 'HloModule <name>'")
    lines = text.splitlines()
    header = ""
    mod_name = None
    for line in lines:
        if line.strip():
            m = _HEADER_RE.match(line)
            if not m:
                raise HloParseError(
                    f"HLO text must start with 'HloModule <name>', got {line.strip()[:120]!r}")
            mod_name, header = m.group(1), line.strip()
            break
    comps: list[Computation] = []
    current: str | None = None
    is_entry = False
    instrs: list[Instruction] = []
    for lineno, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("//") or s.startswith("HloModule"):
            continue
        if current is None:
            cm = _COMP_RE.match(line)
            if cm and "=" not in s.split("{", 1)[0].split("(", 1)[0]:
                current, is_entry, instrs = cm.group(2), bool(cm.group(1)), []
            continue  # debug tables (FileNames, StackFrames, ...) and their rows
        if s == "}":
            if not instrs:
                raise HloParseError(f"line {lineno}: computation {current!r} has no instructions")
            comps.append(Computation(current, tuple(instrs), is_entry))
            current = None
            continue
        try:
            instrs.append(parse_instruction(line, current))
        except HloParseError as e:
            raise HloParseError(f"line {lineno}: {e}") from None
    if current is not None:
        raise HloParseError(f"computation {current!r} is not closed with '}}'")
    if not comps:
        raise HloParseError("no computations found; expected 'ENTRY <name> { ... }' blocks")
    return Module(name=mod_name or "module", computations=tuple(comps), header=header)

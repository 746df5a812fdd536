"""A parser for XLA's HLO text format (pure Python, no jax import).

It reads HLO as XLA writes it: what ``lowered.as_text(dialect="hlo")``,
``compiled.as_text()`` and ``--xla_dump_to`` files contain, and the modules in
XLA's own tests. A module is a ``HloModule`` header, optional debug tables
(``FileNames``, ``StackFrames``, ...), then computations made of instructions::

    [ROOT] [%]name = [SHAPE] opcode(OPERANDS), attr=value, ...

Whitespace and line breaks between tokens do not matter (an instruction may
span several lines); ``//`` and ``/* */`` comments may appear anywhere outside
strings; ``} // name`` may close a computation. Names are scoped per
computation. A file may hold several modules (``// -----`` separated, or
several ``HloModule`` headers): :func:`parse_module` takes the one named, and
refuses to guess. What is not supported is listed in docs/guides/hlo-parser.md ("HLO the
parser does not read") and each such form gives a one-line
:class:`HloParseError` naming the line.

Only the structure disco needs is kept: names, opcodes, shapes, operand names,
called computations and raw attributes.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from disco.ir.hlo_module import ArrayShape, Computation, Instruction, Module
from disco.ir.opcodes import LITERAL_OPERAND_OPCODES as _LITERAL_OPCODES
from disco.ir.opcodes import SAME_SHAPE_AS_FIRST as _SAME_SHAPE_AS_FIRST
from disco.ir.opcodes import SAME_SHAPE_AS_SECOND as _SAME_SHAPE_AS_SECOND

# Shape inference for an omitted shape (XLA's parser infers it too).
_INFERABLE = _SAME_SHAPE_AS_FIRST | _SAME_SHAPE_AS_SECOND | {"compare", "tuple", "get-tuple-element"}

# -- lexical pieces (Python 3.11 possessive quantifiers keep the nested patterns linear) -------
_STR = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_NAME = r"[A-Za-z_][\w.\-]*+"


def _balanced(depth: int) -> str:
    """A bracketed group ((), [] or {}) nested up to ``depth`` deep, strings skipped.

    Bracket kinds are not matched against each other (XLA's own printer always balances
    them); ``<`` and ``>`` are no brackets (``<=`` in shapes and replica groups, ``->``).
    """
    inner = r'[^()\[\]{}"]++|' + _STR
    group = r"[(\[{](?:" + inner + r")*+[)\]}]"
    for _ in range(depth - 1):
        group = r"[(\[{](?:" + inner + "|" + group + r")*+[)\]}]"
    return group


_GROUP = _balanced(24)
_INNER = r'(?:[^()\[\]{}"]++|' + _STR + "|" + _GROUP + r")*+"  # the inside of a group
# A replica-group list over a mesh: mesh[a=2,b=4] {b}, with device_ids=(...) when not iota.
_MESH = r"(?:maximal_)?mesh\[[^\]]*+\](?:\s*+,\s*+device_ids=" + _GROUP + r")?(?:\s*+\{[^{}]*+\})?"
_VALUE = r"(?:" + _MESH + r'|(?:[^()\[\]{}",\s]++|' + _STR + "|" + _GROUP + r")++)"
_ARRAY_SHAPE = r"[a-z][a-z0-9]*+\[[^\]]*+\](?:\{[^{}]*+\})?"
_SHAPE = r"(?:\(" + _INNER + r"\)|b\(" + _INNER + r"\)|" + _ARRAY_SHAPE + ")"
_ATTRS = r"(?:\s*+,\s*+[\w.\-]++(?:\s*+=\s*+" + _VALUE + r")?)*+"

_INSTR_RE = re.compile(
    r"(ROOT\s++)?%?(" + _NAME + r")\s*+=\s*+(?:(" + _SHAPE + r")\s*+)?"
    r"([a-z][a-z0-9\-_]*+)\s*+\((" + _INNER + r")\)(" + _ATTRS + ")")
_ATTR_RE = re.compile(r"\s*+,\s*+([\w.\-]++)(?:\s*+=\s*+(" + _VALUE + "))?")
_COMP_RE = re.compile(
    r"(ENTRY\s++)?%?(" + _NAME + r")\s*+(?:\((" + _INNER + r")\)\s*+->\s*+(" + _SHAPE + r")\s*+)?\{")
_COMP_TAIL_RE = re.compile(_ATTRS)  # "}, execution_thread=..." after a computation
_HEADER_RE = re.compile(r"HloModule\s++([^\s,]++)(" + _ATTRS + ")")
_TABLE_LINE_RE = re.compile(r"(?:[A-Z][A-Za-z]*+|\d++[ \t][^\n]*+)[ \t]*+(?:\n|$)")
_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")
_COMMENT_RE = re.compile(r"(" + _STR + r")|//[^\n]*+|/\*.*?\*/", re.S)
_SEPARATOR_RE = re.compile(r"^[ \t]*//[ \t]*-----[^\n]*$", re.M)
_MODULE_START_RE = re.compile(r"^[ \t]*HloModule\b", re.M)
_SPACE_RE = re.compile(r"\s*+")
_INDEX_MARKER_RE = re.compile(r"/\*index=\d+\*/")
_NOT_NEWLINE_RE = re.compile(r"[^\n]")
_GROUP_RE = re.compile(_GROUP)
# An operand may name a tuple element as "x#1" (XLA's printer since jaxlib 0.11 writes its
# --xla_dump_to files that way, without the get-tuple-element instructions); "x#1#0" nests.
_OPERAND = _NAME + r"(?:#\d++)*+"
_BARE_OPERANDS_RE = re.compile(r"\s*+(?:%?" + _OPERAND + r"\s*+(?:,\s*+%?" + _OPERAND + r"\s*+)*+)?")
_OPERAND_TOKEN_RE = re.compile(r"(?:" + _SHAPE + r"\s++)?%?(" + _OPERAND + ")")


class HloParseError(ValueError):
    """The text is not HLO that this parser understands."""


# -- small readers (also used by xla_hooks) -----------------------------------------------------
def is_scheduled(text: str) -> bool:
    """Whether the first ``HloModule`` header of ``text`` says ``is_scheduled=true``: XLA writes it
    on every compiled (optimised) module, never on the text jax lowers before optimisation."""
    m = _MODULE_START_RE.search(text)
    if m is None:
        return False
    end = text.find("\n", m.start())
    return "is_scheduled=true" in (text[m.start():] if end < 0 else text[m.start():end])


# Fields only one backend's compiler writes into an instruction's backend_config: XLA:GPU's
# GpuBackendConfig (every kernel of a compiled GPU module carries one) and XLA:CPU's
# CpuBackendConfig (a compiled CPU module's fusions and dots). Measured on the compiled modules
# of tests/data (jax 0.10.2 on CPU, 0.11.2 on an H100): none holds the other backend's field.
_BACKEND_MARKERS = {"gpu": '"operation_queue_id"', "cpu": '"outer_dimension_partitions"'}


def compiled_backend(text: str) -> str | None:
    """The backend (``"gpu"`` or ``"cpu"``) whose compiler wrote the optimised module ``text``, read
    from the backend_config fields only that backend writes; None when it carries neither (a
    module before optimisation, or a small CPU module without backend configs)."""
    found = [backend for backend, marker in _BACKEND_MARKERS.items() if marker in text]
    return found[0] if len(found) == 1 else None


def split_top_level(text: str, sep: str = ",", *, angle_brackets: bool = False) -> list[str]:
    """Splits on ``sep`` outside (), [], {} and double-quoted strings; parts stripped, empty ones dropped.

    ``<`` and ``>`` are not brackets: HLO writes them only in ``<=`` (bounded
    dynamic dimensions, iota replica groups) and ``->``. ``angle_brackets=True``
    counts them as brackets all the same (the ``>`` of ``->`` excepted): the split
    graph fingerprints were first computed with, which they keep
    (``disco.ir.fingerprint._fingerprint_attrs``).
    """
    opens, closes = ("([{<", ")]}>") if angle_brackets else ("([{", ")]}")
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
        elif c in opens:
            depth += 1
        elif c in closes:
            if not (c == ">" and i > 0 and text[i - 1] == "-"):
                depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_shape(text: str) -> tuple[ArrayShape, ...]:
    """Parses a shape such as ``f32[8,16]{1,0}``, ``(f32[2], (s32[], pred[]))`` or ``b(f32[4])``."""
    text = re.sub(r"/\*.*?\*/", "", text).strip()
    if not text:
        raise HloParseError("empty shape")
    if text.startswith("(") or text.startswith("b("):
        start = text.index("(")
        end = _close(text, start)
        if text[end + 1:].strip():
            raise HloParseError(f"cannot parse shape {text!r}: text after the closing ')'")
        out: list[ArrayShape] = []
        for part in split_top_level(text[start + 1:end]):
            out.extend(parse_shape(part))
        return tuple(out)
    m = _ARRAY_RE.fullmatch(text)
    if not m:
        raise HloParseError(f"cannot parse shape {text!r}; expected e.g. 'f32[8,16]{{1,0}}'")
    dims = []
    for d in m.group(2).split(","):
        d = d.strip().removeprefix("<=")
        if d:
            if d == "?":
                dims.append(1)
            elif d.isdigit():
                dims.append(int(d))
            else:
                raise HloParseError(f"cannot parse dimension {d!r} of shape {text!r}")
    return (ArrayShape(m.group(1), tuple(dims)),)


def _close(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``start`` (strings skipped)."""
    m = _GROUP_RE.match(text, start)
    if not m:
        raise HloParseError(f"unbalanced {text[start]!r} in: {text[:200]!r}")
    return m.end() - 1


@functools.lru_cache(maxsize=4096)
def _parse_shape_cached(text: str) -> tuple[ArrayShape, ...]:
    return parse_shape(text)


def _tuple_elements(shape: str) -> list[str]:
    """The top-level element shapes of a tuple shape's text."""
    shape = shape.strip()
    if not shape.startswith("("):
        raise HloParseError(f"expected a tuple shape, got {shape!r}")
    return split_top_level(shape[1:_close(shape, 0)])


def _operand_name(token: str) -> str:
    """The name in an operand token: "%x", "x", or with its shape printed, "f32[2]{0} %x"."""
    m = _OPERAND_TOKEN_RE.fullmatch(token.strip())
    if m is None:
        raise HloParseError(
            f"operand {token.strip()[:80]!r} is not an instruction name (optionally after its "
            "shape); nested instructions such as 'add(sqrt(x), y)' are not supported")
    return m.group(1)


def _operand_shape(token: str) -> str | None:
    """The shape printed before an operand's name, if any ("f32[2]{0} %x")."""
    token = token.strip()
    m = re.match(_SHAPE, token)
    return m.group(0) if m and token[m.end():].strip() else None


def _operands(raw: str) -> tuple[tuple[str, ...], list[str]]:
    """Operand names and their tokens, from the text between an opcode's parentheses."""
    if _BARE_OPERANDS_RE.fullmatch(raw):  # "a, b" or "%a, %b": the common case, one regex
        tokens = [t for t in (p.strip() for p in raw.split(",")) if t]
        return tuple(t.lstrip("%") for t in tokens), tokens
    tokens = split_top_level(raw)
    return tuple(_operand_name(t) for t in tokens), tokens


def _infer_shape(name: str, opcode: str, tokens: list[str], operands: tuple[str, ...],
                 attrs: dict[str, str], known: dict[str, Instruction]) -> str:
    """The shape of an instruction written without one, as XLA's parser infers it."""

    def shape_of(i: int) -> str:
        if i < len(tokens):
            printed = _operand_shape(tokens[i])
            if printed:
                return printed
        if i >= len(operands) or operands[i] not in known:
            raise HloParseError(
                f"cannot find a shape for {name!r}: operand {i} is not defined before it")
        return known[operands[i]].shape

    if opcode in _SAME_SHAPE_AS_FIRST and operands:
        return shape_of(0)
    if opcode in _SAME_SHAPE_AS_SECOND and len(operands) > 1:
        return shape_of(1)
    if opcode == "compare" and operands:
        arr = _ARRAY_RE.match(shape_of(0).strip())
        if arr:
            return f"pred[{arr.group(2)}]"
    if opcode == "tuple":
        return "(" + ", ".join(shape_of(i) for i in range(len(operands))) + ")"
    if opcode == "get-tuple-element" and operands and attrs.get("index", "").isdigit():
        elements = _tuple_elements(shape_of(0))
        index = int(attrs["index"])
        if index < len(elements):
            return elements[index]
    raise HloParseError(_no_shape(name, opcode))


def _no_shape(name: str, opcode: str) -> str:
    return (f"cannot find a shape for {name!r}: opcode {opcode!r} needs one written here "
            f"(e.g. '{name} = f32[8] {opcode}(...)'); a shape is inferred only for elementwise "
            "ops, select, clamp, compare, tuple and get-tuple-element")


def _clean(text: str) -> str:
    """``text`` with its comments removed (strings kept)."""
    if "/*" in text or "//" in text:
        return _COMMENT_RE.sub(_drop_comment, text).strip()
    return text.strip()


def _keep_index_markers(text: str) -> str:
    """``text`` with its comments removed, except XLA's ``/*index=N*/`` markers."""
    return _COMMENT_RE.sub(_drop_comment_but_index, text).strip()


def _drop_comment(m: re.Match) -> str:
    return m.group(1) if m.group(1) is not None else ""


def _drop_comment_but_index(m: re.Match) -> str:
    if m.group(1) is not None or _INDEX_MARKER_RE.fullmatch(m.group(0)):
        return m.group(0)
    return ""


def parse_instruction(line: str, computation: str) -> Instruction:
    """Parses one instruction's text (it may span lines and hold comments)."""
    source = line.strip()
    text = _blank_comments(source)
    m = _INSTR_RE.match(text)
    if not m or m.end() != len(text.rstrip()):
        raise HloParseError(f"cannot parse instruction {_clean(source)[:200]!r}")
    return _instruction(m, source, computation, {}, 0)


def _instruction(m: re.Match, source: str, computation: str, known: dict[str, Instruction],
                 line: int) -> Instruction:
    """Builds an instruction from a match on the comment-blanked text (``source``: the original)."""
    root, name, shape, opcode, raw, attr_text = m.groups()
    attrs: dict[str, str] = {}
    fp_attr_text = ""
    if attr_text:
        start = m.start(6)
        original = source[start:m.end(6)]
        commented = original != attr_text
        pairs = []
        for am in _ATTR_RE.finditer(attr_text):
            if am.group(2) is None:
                attrs[am.group(1)] = ""
                pairs.append(am.group(1))
                continue
            value = am.group(2)
            if commented:
                value = source[start + am.start(2):start + am.end(2)]
                pairs.append(f"{am.group(1)}={_keep_index_markers(value)}")
                value = _clean(value)
            else:
                pairs.append(f"{am.group(1)}={value}")
            attrs[am.group(1)] = value
        if "<" in attr_text or "/*index=" in original:
            fp_attr_text = ", ".join(pairs)
    if shape is None and opcode not in _INFERABLE:
        raise HloParseError(_no_shape(name, opcode))
    operands: tuple[str, ...] = ()
    tokens: list[str] = []
    literal_text = ""
    if opcode in _LITERAL_OPCODES:
        original = source[m.start(5):m.end(5)]
        if original != raw:
            raw = _clean(original)
            literal_text = _keep_index_markers(original)
    else:
        operands, tokens = _operands(raw)
    if shape is None:
        shape = _infer_shape(name, opcode, tokens, operands, attrs, known)
    elif source[m.start(3):m.end(3)] != shape:
        shape = _clean(source[m.start(3):m.end(3)])
    return Instruction(
        name=name, opcode=opcode, shape=shape, arrays=_parse_shape_cached(shape),
        operands=operands, attrs=attrs, raw_operands=raw, computation=computation,
        is_root=root is not None, line=line, fingerprint_attrs=fp_attr_text,
        fingerprint_literal=literal_text)


# -- modules --------------------------------------------------------------------------------
def _blank_comments(text: str) -> str:
    """``text`` with every ``//`` and ``/* */`` comment outside strings turned into spaces.

    The result has the same length and line breaks, so positions in it are positions in
    ``text``.
    """
    if "//" not in text and "/*" not in text:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if "//" in line or "/*" in line:
            if line.count("/*") != line.count("*/"):  # a block comment across lines
                return _COMMENT_RE.sub(_blank_comment, text)
            lines[i] = _COMMENT_RE.sub(_blank_comment, line)
    return "\n".join(lines)


def _blank_comment(m: re.Match) -> str:
    if m.group(1) is not None:
        return m.group(1)  # a string: kept
    return _NOT_NEWLINE_RE.sub(" ", m.group(0))


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """One module's text (comments removed) and the line its first character is on."""

    name: str
    text: str  # comments blanked out
    source: str  # as written, same length
    first_line: int


def _module_chunks(text: str) -> list[_Chunk]:
    if not isinstance(text, str):
        hint = " (decode bytes first: data.decode())" if isinstance(text, (bytes, bytearray)) else ""
        raise HloParseError(f"HLO text: expected a str, got {type(text).__name__}{hint}")
    if not text.strip():
        raise HloParseError("empty HLO text; expected a module starting with 'HloModule <name>'")
    pieces: list[tuple[str, int]] = []
    start, line = 0, 1
    for m in _SEPARATOR_RE.finditer(text):
        pieces.append((text[start:m.start()], line))
        line += text.count("\n", start, m.end())
        start = m.end()
    pieces.append((text[start:], line))
    chunks: list[_Chunk] = []
    for piece, first in pieces:
        source, piece = piece, _blank_comments(piece)
        if not piece.strip():
            continue
        starts = [m.start() for m in _MODULE_START_RE.finditer(piece)]
        lead = piece[:starts[0]] if starts else piece
        if lead.strip():
            bad = lead.strip().splitlines()[0]
            where = first + piece.count("\n", 0, piece.index(bad))
            raise HloParseError(
                f"line {where}: HLO text must start with 'HloModule <name>', got {bad[:120]!r}")
        for i, s in enumerate(starts):
            body = piece[s:starts[i + 1]] if i + 1 < len(starts) else piece[s:]
            hm = _HEADER_RE.match(body.lstrip())
            lineno = first + piece.count("\n", 0, s)
            if not hm:
                raise HloParseError(f"line {lineno}: cannot read the module header {body.strip()[:120]!r}")
            end = starts[i + 1] if i + 1 < len(starts) else len(piece)
            chunks.append(_Chunk(hm.group(1), body, source[s:end], lineno))
    return chunks


def module_names(text: str) -> list[str]:
    """The names of the modules in an HLO text, in file order (without parsing them)."""
    return [c.name for c in _module_chunks(text)]


def parse_modules(text: str) -> tuple[Module, ...]:
    """Parses every module of an HLO text (``// -----`` separated or several headers)."""
    return tuple(_parse_chunk(c) for c in _module_chunks(text))


def parse_module(text: str, module: str | None = None) -> Module:
    """Parses one HLO module from a text.

    Args:
      text: HLO text holding one module, or several (``// -----`` separated, or several
        ``HloModule`` headers), which are never merged.
      module: the name of the module to take when there are several (``#2`` takes the
        second, for files that reuse a name); None when the text holds one module.

    Raises:
      HloParseError: if the text is not HLO this parser reads (the message names the
        line and says what was expected), or holds several modules and ``module`` does
        not name exactly one of them (the message lists them).
    """
    chunks = _module_chunks(text)
    listing = ", ".join(f"#{i} {c.name}" for i, c in enumerate(chunks, 1))
    if module is None:
        if len(chunks) > 1:
            raise HloParseError(
                f"the text holds {len(chunks)} HLO modules ({listing}); name one "
                "(module=NAME, or '#N' for the N-th; --module NAME of `disco graph` and `disco predict-kernels`)")
        return _parse_chunk(chunks[0])
    pos = re.fullmatch(r"#(\d+)", module)
    if pos:
        index = int(pos.group(1))
        if not 1 <= index <= len(chunks):
            raise HloParseError(f"no module {module!r}: the text holds {len(chunks)} ({listing})")
        return _parse_chunk(chunks[index - 1])
    matches = [c for c in chunks if c.name == module]
    if len(matches) != 1:
        what = "no module" if not matches else f"{len(matches)} modules"
        raise HloParseError(
            f"{what} named {module!r}; the text holds {listing}"
            + ("; name one by position ('#N')" if matches else ""))
    return _parse_chunk(matches[0])


class _LineCounter:
    """Line numbers of positions in a text, counted incrementally (positions mostly increase)."""

    def __init__(self, text: str, first_line: int):
        self.text, self.first, self.pos, self.line = text, first_line, 0, first_line

    def __call__(self, pos: int) -> int:
        if pos < self.pos:
            return self.first + self.text.count("\n", 0, pos)
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def _parse_chunk(chunk: _Chunk) -> Module:
    text, source = chunk.text, chunk.source
    line_of = _LineCounter(text, chunk.first_line)

    def snippet(pos: int) -> str:
        end = text.find("\n", pos)
        return text[pos:end if end >= 0 else len(text)].strip()[:120]

    pos = _SPACE_RE.match(text).end()
    hm = _HEADER_RE.match(text, pos)
    header = _clean(source[pos:hm.end()])
    pos = hm.end()
    comps: list[Computation] = []
    n = len(text)
    while True:
        pos = _SPACE_RE.match(text, pos).end()
        if pos >= n:
            break
        cm = _COMP_RE.match(text, pos)
        if cm is None:
            tm = _TABLE_LINE_RE.match(text, pos)
            if tm and not text.startswith("ENTRY", pos):
                pos = tm.end()  # debug tables (FileNames, StackFrames, ...) and their rows
                continue
            raise HloParseError(
                f"line {line_of(pos)}: expected a computation ('[ENTRY] name {{' or "
                f"'name (params) -> shape {{'), got {snippet(pos)!r}")
        name, is_entry = cm.group(2), cm.group(1) is not None
        comp_line = line_of(pos)
        pos = cm.end()
        instrs: list[Instruction] = []
        known: dict[str, Instruction] = {}
        while True:
            pos = _SPACE_RE.match(text, pos).end()
            if pos >= n:
                raise HloParseError(f"line {comp_line}: computation {name!r} is not closed with '}}'")
            if text[pos] == "}":
                pos = _COMP_TAIL_RE.match(text, pos + 1).end()
                break
            im = _INSTR_RE.match(text, pos)
            line = line_of(pos)
            if im is None:
                raise HloParseError(f"line {line}: cannot parse instruction {snippet(pos)!r}"
                                    + _hint(text, pos))
            try:
                ins = _instruction(im, source, name, known, line)
                for element in _tuple_element_operands(ins, known):
                    known[element.name] = element
                    instrs.append(element)
            except HloParseError as e:
                raise HloParseError(f"line {line}: {e}") from None
            if ins.name in known:
                raise HloParseError(
                    f"line {line}: instruction name {ins.name!r} appears twice in computation {name!r}")
            known[ins.name] = ins
            instrs.append(ins)
            pos = im.end()
        if not instrs:
            raise HloParseError(f"line {comp_line}: computation {name!r} has no instructions")
        comps.append(Computation(name, tuple(instrs), is_entry))
    if not comps:
        raise HloParseError(
            f"line {chunk.first_line}: module {chunk.name!r} has no computations; "
            "expected 'ENTRY <name> { ... }' blocks")
    return Module(name=chunk.name, computations=tuple(comps), header=header)


def _tuple_element_operands(ins: Instruction, known: dict[str, Instruction]) -> list[Instruction]:
    """The get-tuple-element instructions behind ``ins``'s "x#i" operands that are not in ``known``.

    XLA's printer since jaxlib 0.11 writes a tuple element as ``%x#i`` in its dumps instead of a
    ``get-tuple-element`` instruction; each one becomes that instruction here, named ``x#i``
    (no HLO name holds a ``#``), placed before its first user, without metadata.
    """
    made: dict[str, Instruction] = {}
    for operand in ins.operands:
        parts = operand.split("#")
        for depth in range(1, len(parts)):
            tuple_name, element_name = "#".join(parts[:depth]), "#".join(parts[:depth + 1])
            if element_name in known or element_name in made:
                continue
            producer = known.get(tuple_name) or made.get(tuple_name)
            if producer is None:
                raise HloParseError(
                    f"operand {operand!r} of {ins.name!r}: {tuple_name!r} is not defined before it")
            index = int(parts[depth])
            elements = _tuple_elements(producer.shape) if producer.shape.lstrip().startswith("(") else []
            if index >= len(elements):
                raise HloParseError(
                    f"operand {operand!r} of {ins.name!r}: {tuple_name!r} has shape {producer.shape!r}, "
                    f"which has no tuple element {index}")
            shape = elements[index]
            made[element_name] = Instruction(
                name=element_name, opcode="get-tuple-element", shape=shape,
                arrays=_parse_shape_cached(shape), operands=(tuple_name,), attrs={"index": str(index)},
                raw_operands=tuple_name, computation=ins.computation, line=ins.line)
    return list(made.values())


def _hint(text: str, pos: int) -> str:
    """Why an instruction did not parse, when a common cause is visible."""
    end = text.find("\n", pos)
    line = text[pos:end if end >= 0 else len(text)]
    if "=" not in line:
        return "; expected '[ROOT] name = [shape] opcode(operands), attr=value, ...'"
    rest = line.split("=", 1)[1].strip()
    if not re.match(r"[a-z(]", rest) and not rest.startswith("b("):
        return f"; cannot find a shape or opcode at {rest[:40]!r}"
    if not re.search(r"[a-z][a-z0-9\-_]*\s*\(", rest):
        return "; cannot find the opcode and its '(operands)'"
    return ""

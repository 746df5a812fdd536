"""A ``jax.jit`` step with shardings (GSPMD), rewritten as the shard_map step XLA makes of it.

A GSPMD step has no collective before XLA's SPMD partitioner runs: the partitioner inserts
one all-reduce per gradient (later merged by XLA's all-reduce combiner). disco plans
against the partitioned module instead: the per-device program XLA dumps after its
``spmd-partitioning`` pass, placed as the body of a fully manual computation (the form
``jax.shard_map`` lowers to), with the step's own parameters, shardings and outputs around
it. XLA compiles that module to the same program (bitwise equal results, measured on CPU),
and every gradient's all-reduce is a node a plan can bucket, cut or fuse around.

This module is the text surgery (pure Python): which parameters the step has and how they
are sharded (:func:`entry_parameters`), and the splice of the partitioned body into a
wrapper module (:func:`manual_module`). :mod:`disco.ir.extractor` does the compiles.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from disco.ir.hlo_parse import parse_module, split_top_level
from disco.ir.opcodes import COLLECTIVES
from disco.ir.replica_groups import explicit_replica_groups

# HLO dtype names -> numpy dtype names, for the wrapper's argument structs.
_NUMPY_DTYPES = {"pred": "bool", "bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64",
                 "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64", "u8": "uint8", "u16": "uint16",
                 "u32": "uint32", "u64": "uint64", "c64": "complex64", "c128": "complex128"}
_MESHES_RE = re.compile(r"xla\.sdy\.meshes=\{(.*?)\}(?:,|\s*$)", re.M)
_MESH_AXES_RE = re.compile(r'"([^"]+)"\s*=\s*(\d+)')
_SDY_SHARDING_RE = re.compile(r'xla\.sdy\.sharding="#sdy\.sharding<@([\w.]+),\s*\[(.*)\]>"')
_STACK_FRAME_RE = re.compile(r"\s*\bstack_frame_id=\d+")
_MANUAL_BODY_RE = re.compile(r"to_apply=%?(xla\.sdy\.manual_computation_body[\w.\-]*)")
# XLA 0.12's dumps read a tuple's element in place as ``%top_k.12#1``, which its own HLO parser
# refuses: such a use becomes a get-tuple-element.
_ELEMENT_USE_RE = re.compile(r"%([\w.\-]+)#(\d+)\b")
_DEFINITION_RE = re.compile(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\(.*?\))\s+[\w\-]+\(")
# device_ids explicit (``[0,2,1,3]``) or an iota (``([2,4]T(1,0))``, a 2-D mesh's transposed axes)
_REPLICA_GROUPS_RE = re.compile(
    r"replica_groups=(mesh\[[^\]]*\](?:,\s*device_ids=(?:\[[\d,\s]*\]|\(\[[\d,\s]*\](?:<=\[[\d,\s]*\])?"
    r"(?:T\([\d,\s]*\))?\)))?\s*\{[^{}]*\})")


class GspmdError(ValueError):
    """The step cannot be read as a GSPMD step disco can plan (the message says why)."""


class Parameter(NamedTuple):
    """One entry parameter of the pre-partitioning module.

    Attributes:
      number: its ``parameter(N)`` index.
      dims: the global shape.
      dtype: the numpy dtype name.
      spec: per dimension, the mesh axes it is split over (``()`` for none): a PartitionSpec's
        entries; None where the module leaves it to the partitioner.
    """

    number: int
    dims: tuple[int, ...]
    dtype: str
    spec: tuple[tuple[str, ...], ...] | None


def mesh_axes(text: str) -> dict[str, int]:
    """The sdy mesh's axes (name -> size) in a module header; {} without one.

    Raises:
      GspmdError: the header declares several meshes (one is what disco wraps).
    """
    header = text.split("\n", 1)[0]
    m = _MESHES_RE.search(header)
    if not m:
        return {}
    # an empty mesh (``empty_mesh = #sdy.mesh<[]>``, which jax declares beside the step's for a typed
    # rng key or an unspecified sharding) has no axes to partition over
    declared = re.findall(r"([\w.]+)\s*=\s*#sdy\.mesh<\[(.*?)\]", m.group(1))
    meshes = [axes for _, axes in declared if axes.strip()]
    if not meshes:
        return {}
    if len(meshes) != 1:
        shown = ", ".join(f"{name} [{axes}]" for name, axes in declared if axes.strip())
        raise GspmdError(f"the step's arguments or shardings are on {len(meshes)} meshes ({shown}); disco wraps a "
                         "step over one mesh: place every argument and sharding constraint on the same mesh")
    return {name: int(size) for name, size in _MESH_AXES_RE.findall(meshes[0])}


def is_unpartitioned(text: str) -> bool:
    """True for a pre-partitioning module over several devices that has no collective yet
    (a GSPMD step), False for a shard_map or pmap step (its collectives are written) or a
    single-device one."""
    axes = mesh_axes(text)
    size = 1
    for n in axes.values():
        size *= n
    if size <= 1:
        return False
    module = parse_module(text)
    return not any(ins.opcode in COLLECTIVES for comp in module.computations for ins in comp.instructions)


def _spec(attr: str, number: int) -> tuple[tuple[str, ...], ...] | None:
    """The PartitionSpec-like entries of a parameter's ``xla.sdy.sharding``; None where it has none
    (the jit left it to the partitioner: ``in_shardings`` None for it)."""
    if "xla.sdy.sharding" not in attr:
        return None
    m = _SDY_SHARDING_RE.search(attr.replace('\\"', '"'))
    if not m:
        raise GspmdError(f"entry parameter {number} has an sdy sharding disco does not read ({attr[:120]!r})")
    dims = []
    for dim in re.findall(r"\{([^{}]*)\}", m.group(2)):
        axes = tuple(a.strip().strip('"') for a in dim.split(",") if a.strip() and a.strip() != "?")
        if any(not re.fullmatch(r"[\w.]+", a) for a in axes):
            raise GspmdError(f"entry parameter {number}: a sharding disco does not read ({dim!r})")
        dims.append(axes)
    return tuple(dims)


def entry_parameters(text: str) -> list[Parameter]:
    """The entry parameters of a pre-partitioning module, by parameter number.

    Raises:
      GspmdError: a parameter is a tuple, has an unknown dtype, or carries no sdy sharding.
    """
    module = parse_module(text)
    out = []
    for ins in module.entry.instructions:
        if ins.opcode != "parameter":
            continue
        number = int(ins.raw_operands)
        if len(ins.arrays) != 1 or ins.shape.lstrip().startswith("("):
            raise GspmdError(f"entry parameter {number} is a tuple ({ins.shape}); expected arrays")
        array = ins.arrays[0]
        if array.dtype not in _NUMPY_DTYPES:
            raise GspmdError(f"entry parameter {number} has dtype {array.dtype}, which disco does not wrap")
        spec = _spec(ins.attrs.get("frontend_attributes", ""), number)
        if spec is not None and len(spec) != len(array.dims):
            raise GspmdError(f"entry parameter {number}: its sharding has {len(spec)} dimensions, its shape "
                             f"{len(array.dims)}")
        out.append(Parameter(number, tuple(array.dims), _NUMPY_DTYPES[array.dtype], spec))
    return sorted(out, key=lambda p: p.number)


_ALIAS_RE = re.compile(r"\binput_output_alias=\{(.*?)\}\s*(?:,\s*\w+=|$)")
_DONOR_RE = re.compile(r"\bbuffer_donor=\{(.*?)\}\s*(?:,\s*\w+=|$)")


def donated_parameters(text: str) -> frozenset[int]:
    """The entry parameters a module's header donates: aliased to an output
    (``input_output_alias={ {0}: (2, {}, may-alias), ... }``) or donated without one
    (``buffer_donor={ (3, {}), ... }``)."""
    header = text.split("\n", 1)[0]
    out: set[int] = set()
    m = _ALIAS_RE.search(header)
    if m:
        out |= {int(n) for n in re.findall(r":\s*\((\d+)\s*,", m.group(1))}
    m = _DONOR_RE.search(header)
    if m:
        out |= {int(n) for n in re.findall(r"\((\d+)\s*,", m.group(1))}
    return frozenset(out)


def _strip_attr(line: str, key: str) -> str:
    """``line`` without its ``, key=...`` attribute (a braced value read to its closing brace)."""
    marker = f", {key}="
    while True:
        i = line.find(marker)
        if i < 0:
            return line
        j = i + len(marker)
        if j < len(line) and line[j] == "{":
            depth = 0
            for k in range(j, len(line)):
                depth += {"{": 1, "}": -1}.get(line[k], 0)
                if depth == 0:
                    break
            line = line[:i] + line[k + 1:]
        else:
            m = re.match(r"[^,]*", line[j:])
            line = line[:i] + line[j + m.end():]


def _blocks(text: str) -> list[list[str]]:
    """The computations of a module's text, each as its lines (header line to closing brace)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if current is None:
            if line.rstrip().endswith("{") and not line.startswith(("HloModule", " ", "\t")):
                current = [line]
        else:
            current.append(line)
            if line.strip() == "}":
                blocks.append(current)
                current = None
    return blocks


def _block_name(header: str) -> str:
    m = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)", header)
    return m.group(1) if m else ""


def _explicit_groups(line: str) -> str:
    def sub(m: re.Match) -> str:
        groups = explicit_replica_groups(m.group(1))
        if groups is None:
            raise GspmdError(f"replica groups disco cannot expand: {m.group(1)!r}")
        return f"replica_groups={groups}"

    return _REPLICA_GROUPS_RE.sub(sub, line)


def manual_module(wrapper_text: str, partitioned_text: str, name: str | None = None) -> str:
    """The wrapper module with the partitioned program as its manual computation's body.

    Args:
      wrapper_text: the pre-optimisation HLO of a ``jax.shard_map`` over all mesh axes that
        takes the step's parameters with their shardings and returns its outputs with theirs
        (its body is a placeholder of the right shapes).
      partitioned_text: XLA's module after ``spmd-partitioning``: its entry computation becomes
        the body (sharding annotations dropped: inside a manual computation every value is per
        device), its other computations are added; mesh-form replica groups are written as
        explicit lists (the sdy importer reads a mesh form as axes of the step's mesh, which it is not).
      name: the module's name (the step's); default the wrapper's.

    Raises:
      GspmdError: the wrapper has no manual computation, the body's parameters or result do not
        match it, or a computation name is taken twice.
    """
    m = _MANUAL_BODY_RE.search(wrapper_text)
    if not m:
        raise GspmdError("the wrapper module has no manual computation body")
    body_name = m.group(1)
    wrapper = _blocks(wrapper_text)
    old_body = next((b for b in wrapper if _block_name(b[0]) == body_name), None)
    if old_body is None:
        raise GspmdError(f"the wrapper module has no computation {body_name!r}")
    partitioned = _blocks(partitioned_text)
    taken = {_block_name(b[0]) for b in wrapper if b is not old_body}
    clash = sorted(taken & {_block_name(b[0]) for b in partitioned if not b[0].startswith("ENTRY")})
    if clash:
        raise GspmdError(f"computation names {clash} are in both the wrapper and the partitioned module")
    body_params = _parameter_shapes(old_body)
    comps = []
    for block in partitioned:
        lines = _element_uses_as_gtes([_explicit_groups(_STACK_FRAME_RE.sub("", ln)) for ln in block])
        if block[0].startswith("ENTRY"):
            lines[0] = re.sub(r"^ENTRY\s+%?[\w.\-]+", "%" + body_name, lines[0])
            lines = [lines[0]] + [_strip_attr(ln, "sharding") for ln in lines[1:]]
            if _parameter_shapes(lines) != body_params:
                raise GspmdError("the partitioned program's parameters do not match the step's shards "
                                 f"({_parameter_shapes(lines)[:3]}... against {body_params[:3]}...)")
            if _root_shape(lines) != _root_shape(old_body):
                raise GspmdError("the partitioned program's result does not match the step's output shards")
        comps.append("\n".join(lines))
    header = wrapper_text.split("\n", 1)[0]
    if name:
        header = re.sub(r"^HloModule\s+[\w.\-]+", f"HloModule {name}", header)
    rest = ["\n".join(b) for b in wrapper if b is not old_body]
    return "\n\n".join([header, *comps, *rest]) + "\n"


def _element_uses_as_gtes(block: list[str]) -> list[str]:
    """``block`` with each ``%name#i`` use read through a get-tuple-element defined after ``%name``."""
    uses = {(m.group(1), int(m.group(2))) for ln in block for m in _ELEMENT_USE_RE.finditer(ln)}
    if not uses:
        return block
    out = []
    for ln in block:
        out.append(_ELEMENT_USE_RE.sub(lambda m: f"%{m.group(1)}.disco_gte{m.group(2)}", ln))
        d = _DEFINITION_RE.match(ln)
        if d is None:
            continue
        name = d.group(1)
        elements = [re.sub(r"/\*.*?\*/", "", e).strip() for e in split_top_level(d.group(2)[1:-1])]
        for i in sorted(i for n, i in uses if n == name):
            if i >= len(elements):
                raise GspmdError(f"%{name}#{i}: {name} has {len(elements)} elements")
            out.append(f"  %{name}.disco_gte{i} = {elements[i]} get-tuple-element(%{name}), index={i}")
    return out


def _parameter_shapes(block: list[str]) -> list[tuple[int, str]]:
    out = []
    for ln in block[1:]:
        m = re.match(r"\s*%?[\w.\-]+\s*=\s*(.+?)\s+parameter\((\d+)\)", ln)
        if m:
            out.append((int(m.group(2)), re.sub(r"\{[^{}]*\}", "", m.group(1)).replace(" ", "")))
    return sorted(out)


def _root_shape(block: list[str]) -> str:
    for ln in block[1:]:
        m = re.match(r"\s*ROOT\s+%?[\w.\-]+\s*=\s*(.+?)\s+[\w\-]+\(", ln)
        if m:
            return re.sub(r"/\*.*?\*/|\{[^{}]*\}|\s", "", m.group(1))
    return ""

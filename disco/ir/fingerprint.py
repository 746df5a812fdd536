"""The fingerprint of a step: a hash of its canonical program, the key plans and samples are stored by.

Names, metadata, channel ids and layouts do not count (plans are written against the
pre-optimisation program, whose layouts are XLA's defaults): the same step traced twice, or by
two programs, has one fingerprint. Fingerprints already stored (plan service, datasets) must stay
valid, so the attribute split the first parser made is kept here (:func:`_fingerprint_attrs`).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence

from disco.ir import hlo_module, hlo_parse

_BRACES_RE = re.compile(r"\{[^{}]*\}")
_BLOCK_COMMENT_RE = re.compile(r"/\*.*?\*/")
_CANON_DROP_ATTRS = frozenset({"metadata", "channel_id", "origin", "statistics"})
# Where jax traced an instruction from: metadata fields that the legacy attribute split can leave
# inside another attribute's value (see _fingerprint_attrs), and that must not count.
_LOCATION_FIELD_RE = re.compile(
    r'\s*\b(?:stack_frame_id|source_line|source_end_line|source_column|source_end_column)=\d+'
    r'|\s*\bsource_file="(?:[^"\\]|\\.)*"')


@functools.lru_cache(maxsize=8192)
def strip_layout(shape: str) -> str:
    """A shape's text without its layouts, comments and spaces: ``f32[8,16]{1,0}`` -> ``f32[8,16]``."""
    return _BRACES_RE.sub("", _BLOCK_COMMENT_RE.sub("", shape)).replace(" ", "")


def computation_hashes(module: hlo_module.Module) -> dict[str, str]:
    """Each computation's hash by name: its canonical lines, a called computation by its own hash."""
    memo: dict[str, str] = {}
    comps = {c.name: c for c in module.computations}

    def h(name: str) -> str:
        if name in memo:
            return memo[name]
        memo[name] = "rec"
        comp = comps.get(name)
        memo[name] = _hash_lines(_canonical_lines(comp.instructions, h)) if comp else "missing"
        return memo[name]

    for c in module.computations:
        h(c.name)
    return memo


def _canonical_lines(instrs: Iterable[hlo_module.Instruction], comp_hash) -> list[str]:
    idx: dict[str, int] = {}
    lines = []
    for i, ins in enumerate(instrs):
        idx[ins.name] = i
        attrs = []
        raw_attrs = _fingerprint_attrs(ins)
        for k in sorted(raw_attrs):
            if k in _CANON_DROP_ATTRS:
                continue
            v = raw_attrs[k]
            if k in hlo_module.CALL_ATTRS:
                v = ",".join(comp_hash(c) for c in ins.called)
            attrs.append(f"{k}={v}")
        ops = ",".join(str(idx.get(o, "?")) for o in ins.operands)
        lit = (ins.fingerprint_literal or ins.raw_operands) if ins.opcode in ("constant", "parameter", "iota") else ""
        lines.append(f"{ins.opcode}|{strip_layout(ins.shape)}|{ops}|{lit}|{';'.join(attrs)}|{int(ins.is_root)}")
    return lines


def _fingerprint_attrs(ins: hlo_module.Instruction) -> dict[str, str]:
    """The attributes as the fingerprint reads them: as the first parser split them.

    That parser counted the ``<`` of ``<=`` (``sharding={devices=[2,1]<=[2]}``) as an
    opening bracket, so an attribute list holding one read as fewer, longer attributes
    (the later ones, metadata included, inside the earlier one's value), and it kept
    XLA's ``/*index=N*/`` markers in values. Fingerprints already stored (plan service,
    datasets) were computed that way, so the fingerprint keeps reading attributes that
    way (other comments, and line breaks between attributes, do not count);
    ``Instruction.attrs`` holds the correct split, comment-free.

    Source locations inside such a value are dropped: the metadata that lands there can carry a
    ``stack_frame_id`` (jax 0.8.3 gives the ``Sharding`` custom-calls of a ``shard_map`` step
    one), which depends on the Python call stack that traced the step, so the same step traced
    from two programs would otherwise get two fingerprints (measured: the coordinator and the
    workers of ``disco.runtime.multiprocess``). No zoo step of jax 0.10.2 has one there, so their
    fingerprints are unchanged.
    """
    if not ins.fingerprint_attrs:
        return ins.attrs
    out: dict[str, str] = {}
    for part in hlo_parse.split_top_level(ins.fingerprint_attrs, angle_brackets=True):
        key, eq, val = part.partition("=")
        out[key.strip()] = _LOCATION_FIELD_RE.sub("", val.strip()) if eq else ""
    return out


def _hash_lines(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def fingerprint(module: hlo_module.Module) -> str:
    """A hash of the canonical step program: names, metadata and channel ids left out.

    Layouts do not count: two modules that differ only in the ``{1,0}`` layouts of their
    shapes (or in the module header's ``entry_computation_layout``) have the same
    fingerprint, because plans are written against the pre-optimisation program, whose
    layouts are XLA's defaults; a non-default layout is kept on the node (``Node.layout``).
    Comments and line breaks between tokens do not count either, with one exception kept
    for compatibility with fingerprints already stored: XLA's ``/*index=N*/`` markers
    inside attribute values and literals count, and an attribute list holding ``<=`` is
    split as the first parser split it (see ``_fingerprint_attrs``), which puts the metadata
    after such an attribute inside that attribute's value: there metadata does count, so the
    same step's text with and without ``debug_info`` can differ in fingerprint (a shard_map
    step's sharding custom-calls; measured on mlp tiny). Compare texts printed the same way,
    as ``disco.extract`` and ``xla_hooks.apply`` (both with ``debug_info``) do.
    """
    return fingerprint_of(computation_hashes(module), hlo_module.step_computations(module))


def fingerprint_of(comp_hashes: dict[str, str], step: Iterable[hlo_module.Computation]) -> str:
    """The fingerprint of the step made of ``step``'s computations (:func:`computation_hashes` given)."""
    return _hash_lines([f"computation {comp_hashes[comp.name]}" for comp in step])[:32]

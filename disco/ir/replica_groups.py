"""The size of an HLO collective's replica groups, from its ``replica_groups`` attribute text.

XLA prints replica groups in three forms (explicit lists, iota, mesh axes); a collective's
group size decides what a bucket's all-reduce becomes (a reduce-scatter plus all-gather needs a
known size) and what the simulator prices.
"""

from __future__ import annotations

import re

_IOTA_GROUPS_RE = re.compile(r"\[(\d+),(\d+)\]<=\[[\d,]+\](?:T\([\d,]+\))?")
_EXPLICIT_GROUPS_RE = re.compile(r"\{(\{[\d,\s]*\}(?:\s*,\s*\{[\d,\s]*\})*)\}")
_MESH_GROUPS_RE = re.compile(
    r"mesh\[([^\]]*)\](?:\s*,\s*device_ids=.*?)?\s*\{([^{}]*)\}", re.S)


def replica_group_size(replica_groups: str | None) -> int | None:
    """Devices per replica group in an HLO ``replica_groups`` attribute, or None when unknown.

    Reads every form XLA writes: explicit ``{{0,1,2,3},{4,5,6,7}}`` (every group the same
    size), iota ``[2,4]<=[8]`` or ``[2,4]<=[4,2]T(1,0)`` (groups x size), and mesh axes
    ``mesh[a=2,b=4] {b}`` (the product of the named axes' sizes; ``b:(2)2`` is a sub-axis
    of size 2). ``{}`` (all replicas, known only at run time), groups of unequal size and
    anything else give None.

    >>> replica_group_size("{{0,1,2,3,4,5,6,7}}"), replica_group_size("[2,4]<=[8]")
    (8, 4)
    >>> replica_group_size("mesh['x'=2,'y'=4] {'y'}")
    4
    """
    if not replica_groups:
        return None
    text = replica_groups.strip()
    m = _IOTA_GROUPS_RE.fullmatch(text)
    if m:
        return int(m.group(2))
    m = _MESH_GROUPS_RE.fullmatch(text)
    if m:
        return _mesh_group_size(m.group(1), m.group(2))
    m = _EXPLICIT_GROUPS_RE.fullmatch(text)
    if not m:
        return None
    sizes = {len([d for d in g.split(",") if d.strip()]) for g in re.findall(r"\{([^{}]*)\}", m.group(1))}
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size or None


def _mesh_group_size(axes_text: str, group_text: str) -> int | None:
    axes: dict[str, int] = {}
    for part in axes_text.split(","):
        name, eq, size = part.partition("=")
        if not eq or not size.strip().isdigit():
            return None
        axes[name.strip().strip("'\"")] = int(size)
    total = 1
    for ref in group_text.split(","):
        ref = ref.strip()
        if not ref:
            continue
        name, _, sub = ref.partition(":")
        name = name.strip().strip("'\"")
        if sub:  # a sub-axis, "(pre_size)size"
            ms = re.fullmatch(r"\(\d+\)(\d+)", sub.strip())
            if not ms:
                return None
            total *= int(ms.group(1))
        elif name in axes:
            total *= axes[name]
        else:
            return None
    return total

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


_MESH_FORM_RE = re.compile(
    r"mesh\[([^\]]*)\](?:\s*,\s*device_ids=\[([\d,\s]*)\])?\s*\{([^{}]*)\}", re.S)


def explicit_replica_groups(replica_groups: str) -> str | None:
    """A mesh-form ``replica_groups`` (``mesh['a'=2,'b'=4] {'b'}``) as the explicit list it means.

    The devices (``device_ids``, else 0..n-1) are laid out row-major over the mesh axes; each
    group holds the devices that differ only along the named axes (in the order named), one group
    per position on the other axes. None for a form this does not expand (sub-axes, unknown axes).

    >>> explicit_replica_groups("mesh['x'=2,'y'=2] {'y'}")
    '{{0,1},{2,3}}'
    >>> explicit_replica_groups("mesh['x'=2,'y'=2] {'x'}")
    '{{0,2},{1,3}}'
    """
    import itertools

    m = _MESH_FORM_RE.fullmatch(replica_groups.strip())
    if not m:
        return None
    axes: list[tuple[str, int]] = []
    for part in m.group(1).split(","):
        name, eq, size = part.partition("=")
        if not eq or not size.strip().isdigit():
            return None
        axes.append((name.strip().strip("'\""), int(size)))
    names = [a for a, _ in axes]
    group_axes = [ref.strip().strip("'\"") for ref in m.group(3).split(",") if ref.strip()]
    if any(a not in names for a in group_axes) or len(set(group_axes)) != len(group_axes):
        return None
    sizes = dict(axes)
    total = 1
    for _, size in axes:
        total *= size
    ids = [int(d) for d in m.group(2).split(",") if d.strip()] if m.group(2) is not None else list(range(total))
    if len(ids) != total:
        return None
    strides, stride = {}, 1
    for name, size in reversed(axes):
        strides[name] = stride
        stride *= size
    others = [a for a in names if a not in group_axes]
    groups = []
    for outer in itertools.product(*(range(sizes[a]) for a in others)):
        base = sum(i * strides[a] for a, i in zip(others, outer))
        members = [ids[base + sum(i * strides[a] for a, i in zip(group_axes, inner))]
                   for inner in itertools.product(*(range(sizes[a]) for a in group_axes))]
        groups.append("{" + ",".join(map(str, members)) + "}")
    return "{" + ",".join(groups) + "}"

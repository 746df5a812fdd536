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
    r"mesh\[([^\]]*)\](?:\s*,\s*device_ids=(\[[\d,\s]*\]|\(\[[\d,\s]*\](?:<=\[[\d,\s]*\])?(?:T\([\d,\s]*\))?\)))?"
    r"\s*\{([^{}]*)\}", re.S)
_IOTA_LIST_RE = re.compile(r"\[([\d,\s]+)\](?:<=\[([\d,\s]+)\])?(?:T\(([\d,\s]+)\))?")


def _iota(text: str) -> list[int] | None:
    """The device ids of an iota list ``[2,4]T(1,0)`` or ``[2,4]<=[4,2]T(1,0)``, flattened (as
    XLA's IotaTileAssignment: ``iota(prod).reshape(reshape_dims).transpose(perm).reshape(dims)``);
    None for another form."""
    m = _IOTA_LIST_RE.fullmatch(text.strip())
    if not m:
        return None
    dims = [int(d) for d in m.group(1).split(",") if d.strip()]
    reshape = [int(d) for d in m.group(2).split(",") if d.strip()] if m.group(2) else dims
    perm = [int(d) for d in m.group(3).split(",") if d.strip()] if m.group(3) else list(range(len(reshape)))
    total = 1
    for d in dims:
        total *= d
    size = 1
    for d in reshape:
        size *= d
    if size != total or sorted(perm) != list(range(len(reshape))):
        return None
    strides, stride = [0] * len(reshape), 1
    for k in reversed(range(len(reshape))):
        strides[k] = stride
        stride *= reshape[k]
    out_dims = [reshape[k] for k in perm]
    ids = []
    for flat in range(total):  # row-major over the transposed dims
        rem, idx = flat, [0] * len(out_dims)
        for k in reversed(range(len(out_dims))):
            idx[k] = rem % out_dims[k]
            rem //= out_dims[k]
        ids.append(sum(idx[k] * strides[perm[k]] for k in range(len(perm))))
    return ids


def replica_group_lists(replica_groups: str | None) -> list[tuple[int, ...]] | None:
    """The device ids of each replica group, from every form XLA prints (explicit, iota, mesh axes
    with explicit or iota ``device_ids``); None for ``{}`` (all replicas) and forms not read.

    >>> replica_group_lists("[2,4]<=[4,2]T(1,0)")
    [(0, 2, 4, 6), (1, 3, 5, 7)]
    >>> replica_group_lists("mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}")
    [(0, 1, 2, 3), (4, 5, 6, 7)]
    """
    if not replica_groups:
        return None
    text = replica_groups.strip()
    m = _IOTA_GROUPS_RE.fullmatch(text)
    if m:
        n_groups, size = int(m.group(1)), int(m.group(2))
        ids = _iota(text.split("<=", 1)[1])
        if ids is None or len(ids) != n_groups * size:
            return None
        return [tuple(ids[g * size:(g + 1) * size]) for g in range(n_groups)]
    if text.startswith("mesh["):
        expanded = explicit_replica_groups(text)
        return replica_group_lists(expanded) if expanded else None
    m = _EXPLICIT_GROUPS_RE.fullmatch(text)
    if not m:
        return None
    groups = [tuple(int(d) for d in g.split(",") if d.strip()) for g in re.findall(r"\{([^{}]*)\}", m.group(1))]
    return groups if groups and all(groups) else None


def explicit_replica_groups(replica_groups: str) -> str | None:
    """A mesh-form ``replica_groups`` (``mesh['a'=2,'b'=4] {'b'}``) as the explicit list it means.

    The devices (``device_ids``: an explicit list or an iota such as ``([2,4]T(1,0))``, else
    0..n-1) are laid out row-major over the mesh axes; each group holds the devices that differ
    only along the named axes (in the order named), one group per position on the other axes. None
    for a form this does not expand (sub-axes, unknown axes).

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
    device_ids = m.group(2)
    if device_ids is None:
        ids = list(range(total))
    elif device_ids.startswith("("):
        ids = _iota(device_ids[1:-1])
        if ids is None:
            return None
    else:
        ids = [int(d) for d in device_ids[1:-1].split(",") if d.strip()]
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

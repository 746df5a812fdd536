"""A plan's patch in pieces, so that a plan one move away is re-patched only where the move touched it.

:meth:`disco.sim.patch.Patcher.patch` turns a whole plan into the units it removes from and adds to
its mode's base units. The pieces of that patch are independent: each *region* (the groups and cuts
that touch the same base fusions, re-fused together in "extend" mode), each group (in "off" mode)
and each bucket adds and removes its own units; so does each gather bucket, compared with the
neighbour's on the all-gathers either plan buckets. :class:`Pieces` keeps them by piece, and
:func:`repatch` finds, for a plan and the pieces of a neighbour, only the units that differ: the
pieces the changed groups and buckets touch are re-made (from the patcher's caches, so a unit that
did not change is the same object), the others are left as they are. Its cost follows the change,
not the plan: about what the groups and buckets it touches cost (and a comparison of the two
plans' group and bucket tuples, by identity between their common prefix and suffix, which moves
keep where they change nothing).

Where it does not apply (another fusion mode, cuts or bucketing kind than the neighbour's; compile
options that couple the streams otherwise or re-bucket XLA's combiner; a cut beside a changed group; anything the full patch would reject) :func:`repatch`
returns None and the caller patches the plan whole.
"""

from __future__ import annotations

import itertools
import operator
from typing import TYPE_CHECKING

import numpy as np

from disco.sim.patch import Cut, Group, Patcher, regions

if TYPE_CHECKING:
    from disco.plans.plan import FusionPlan
    from disco.sim.units import Mode, Unit

# Groups with their name tuples.
KeyedGroups = list[tuple[tuple[str, ...], Group]]
# How many plans' group parts build() keeps in its cache.
_GROUP_CACHE = 8
_NO_OWNER = np.full(0, -1, np.int32)
# A region: its groups and cuts, and (base units removed, units added, kernel-time change).
Region = tuple[tuple[Group, ...], tuple[list[int], list["Unit"], float]]


class Pieces:
    """One plan's patch by piece (internal; see the module docstring).

    Attributes:
      mode: the plan's fusion mode.
      blocking: collectives hold the compute stream.
      threshold: XLA:GPU's combine threshold (bytes; None on CPU), which prices ``buckets=None``.
      owner: per node, the serial (``Group.serial``) of the plan's group holding it, or -1 (read only:
        shared with neighbours).
      regions: ("extend") base fusion -> the region that re-fuses it.
      buckets: id of each of the plan's buckets -> (its all-reduces, its unit).
      ar_owner: all-reduce -> id of the bucket holding it.
    """

    __slots__ = ("mode", "blocking", "threshold", "owner", "regions", "buckets", "ar_owner", "_parent", "_change")

    def __init__(self, mode: Mode, blocking: bool, threshold: int | None):
        self.mode = mode
        self.blocking = blocking
        self.threshold = threshold
        self.owner: np.ndarray = _NO_OWNER
        self.regions: dict[int, Region] = {}
        self.buckets: dict[int, tuple[tuple[int, ...], Unit]] = {}
        self.ar_owner: dict[int, int] = {}
        self._parent: Pieces | None = None
        self._change: tuple | None = None

    def materialise(self) -> None:
        """Fills the maps of pieces made by :func:`repatch` (its neighbour's, changed)."""
        parent = self._parent
        if parent is None:
            return
        parent.materialise()
        rem_g, add_g, old_regions, new_regions, rem_b, add_b = self._change  # type: ignore[misc]
        owner = parent.owner  # (shared while unchanged: never changed in place)
        if rem_g or add_g:
            owner = owner.copy()
            if rem_g:  # (a valid neighbour's removed groups own all their members)
                owner[_members(rem_g)] = -1
            if add_g:
                owner[_members(add_g)] = np.repeat(np.array([g.serial for _, g in add_g], np.int32),
                                                   [len(g.members) for _, g in add_g])
        regs = parent.regions
        if old_regions or new_regions:
            regs = dict(regs)
            for r in old_regions:
                for it in r[0]:
                    for c in it.touched:
                        regs.pop(c, None)
            for r in new_regions:
                for it in r[0]:
                    for c in it.touched:
                        regs[c] = r
        buckets, ar_owner = parent.buckets, parent.ar_owner
        if rem_b or add_b:
            buckets, ar_owner = dict(buckets), dict(ar_owner)
            for k, (members, _) in rem_b:
                del buckets[k]
                for m in members:
                    if ar_owner.get(m) == k:
                        del ar_owner[m]
            for k, entry in add_b:
                buckets[k] = entry
                for m in entry[0]:
                    ar_owner[m] = k
        self.owner, self.regions, self.buckets, self.ar_owner = owner, regs, buckets, ar_owner
        self._parent = None
        self._change = None


def _included_cuts(patcher: Patcher, plan: FusionPlan, groups: list[Group]) -> list[Cut]:
    """The plan's cuts that take part in re-fusion (as :meth:`Patcher.patch` includes them)."""
    near = {c for g in groups for c in g.touched}
    out = []
    for ci, cut in enumerate(patcher.cuts_of(plan)):
        k = patcher.cut(ci, cut)
        if k is not None and (len(k.touched) == 1 or near.intersection(k.touched)):
            out.append(k)
    return out


def build(patcher: Patcher, plan: FusionPlan, cache: dict | None = None) -> Pieces:
    """The pieces of a plan that :meth:`Patcher.patch` accepted (the same caches, the same units).

    Args:
      cache: where to keep the group part (owner, regions) by the plan's fusion mode, groups
        and cuts (their values), for plans that share them (a search's start plans: one fusion with
        each bucketing); its values are never changed. None: none kept.
    """
    mode = patcher.mode(plan.xla_fusion)
    pc = Pieces(mode, *patcher.options(plan.compile_options))
    cuts = patcher.cuts_of(plan)
    key = (plan.xla_fusion, plan.groups, cuts)
    hit = cache.get(key) if cache is not None else None
    if hit is None:
        group = patcher.group
        groups = [group(gi, names) for gi, names in enumerate(plan.groups)]
        pc.owner = owner = np.full(len(mode.unit_of), -1, np.int32)
        if groups:
            owner[np.fromiter(itertools.chain.from_iterable(g.members for g in groups), np.int64)] = np.repeat(
                np.array([g.serial for g in groups], np.int32), [len(g.members) for g in groups])
        if mode.fusion == "extend":
            items = groups + (_included_cuts(patcher, plan, groups) if cuts else [])
            regs = pc.regions
            for comp in regions(items):
                r = _region(patcher, mode, comp)
                for it in comp:
                    for c in it.touched:
                        regs[c] = r
        if cache is not None:
            while len(cache) >= _GROUP_CACHE:
                del cache[next(iter(cache))]
            cache[key] = (pc.owner, pc.regions)
    else:
        pc.owner, pc.regions = hit
    if plan.buckets:
        bucket_members, bucket_unit = patcher.bucket_members, patcher.bucket_unit
        members = [bucket_members(bi, b.members) for bi, b in enumerate(plan.buckets)]
        keys = list(map(id, plan.buckets))
        pc.buckets = {k: (ms, bucket_unit(mode, ms, b.build)) for k, ms, b in zip(keys, members, plan.buckets)}
        pc.ar_owner = {m: k for k, ms in zip(keys, members) for m in ms}
    return pc


def _region(patcher: Patcher, mode: Mode, comp: list[Group]) -> Region:
    """The region of ``comp`` (groups and cuts re-fused together, "extend"); a group's alone is one
    tuple, kept on the group, for every plan that holds it (no new objects per plan)."""
    if len(comp) == 1:
        g = comp[0]
        r = g.solo_region
        if r is None:
            r = g.solo_region = ((g,), patcher.region(mode, comp))
        return r
    return (tuple(comp), patcher.region(mode, comp))


def _members(keyed: KeyedGroups) -> np.ndarray:
    """The members of the groups, one after another."""
    return np.fromiter(itertools.chain.from_iterable(g.members for _, g in keyed), np.int64)


def _window(old: tuple, new: tuple) -> tuple[tuple, tuple]:
    """The parts of two tuples between their longest common prefix and suffix (by identity).

    The entries outside are the same objects at the same places, so a diff of the two windows by
    identity is the diff of the tuples (for tuples without repeated entries, as a plan's groups
    and buckets are: a plan with one twice overlaps itself). Found at C speed, so a move's
    re-patch does not hash every group of the plan.
    """
    n = min(len(old), len(new))
    lo = next(itertools.compress(itertools.count(), map(operator.is_not, old, new)), n)
    hi = next(itertools.compress(itertools.count(), map(operator.is_not, reversed(old), reversed(new))), n)
    hi = min(hi, n - lo)
    return old[lo:len(old) - hi], new[lo:len(new) - hi]


def _diff(old: dict[int, Unit], new: dict[int, Unit], removed: list[Unit], added: list[Unit]) -> None:
    removed += [u for k, u in old.items() if k not in new]
    added += [u for k, u in new.items() if k not in old]


def repatch(patcher: Patcher, base: Pieces, base_plan: FusionPlan,
            plan: FusionPlan) -> tuple[Pieces, list[Unit], list[Unit]] | None:
    """The pieces of ``plan`` from its neighbour's, and the units removed and added.

    Args:
      patcher: the patcher that made ``base``.
      base: the neighbour's pieces.
      base_plan: the neighbour.
      plan: the plan.

    Returns:
      (pieces, removed, added): the units of ``base_plan`` that ``plan`` does not run and those it
      runs instead; None where only a whole patch applies (see the module docstring).
    """
    if plan.xla_fusion != base_plan.xla_fusion or (plan.buckets is None) != (base_plan.buckets is None):
        return None
    blocking, threshold = patcher.options(plan.compile_options)
    if blocking != base.blocking or (plan.buckets is None and threshold != base.threshold):
        return None  # the options couple the streams differently, or re-bucket XLA's combiner
    base.materialise()
    mode = base.mode
    removed: list[Unit] = []
    added: list[Unit] = []
    # Groups: the name tuples that are not the neighbour's (in the window where the tuples differ).
    rem_g: KeyedGroups = []
    add_g: KeyedGroups = []
    old_regions: list[Region] = []
    new_regions: list[Region] = []
    if plan.groups is not base_plan.groups and plan.groups != base_plan.groups:  # (==: at C speed)
        old_w, new_w = _window(base_plan.groups, plan.groups)
        before, after = set(old_w), set(new_w)
        group = patcher.group  # (the neighbour's groups are in the patcher's cache: no error)
        rem_g = [(k, group(0, k)) for k in before - after]
        try:
            add_g = [(k, group(0, k)) for k in after - before]
        except ValueError:
            return None
        if add_g:
            members = _members(add_g)
            held = base.owner[members]
            if rem_g:
                held = held[~np.isin(held, [g.serial for _, g in rem_g])]
            if (held >= 0).any() or len(np.unique(members)) != len(members):
                return None  # overlapping groups: the whole patch raises
    if mode.fusion == "extend":
        if (rem_g or add_g or patcher.cuts_of(plan) != patcher.cuts_of(base_plan)) and not _reregion(
                patcher, base, base_plan, plan, rem_g, add_g, old_regions, new_regions, removed, added):
            return None
    elif rem_g or add_g:
        _off_groups(patcher, mode, rem_g, add_g, removed, added)
    rem_b: list[tuple[int, tuple[tuple[int, ...], Unit]]] = []
    add_b: list[tuple[int, tuple[tuple[int, ...], Unit]]] = []
    if plan.buckets is not None and plan.buckets is not base_plan.buckets:
        old_wb, new_wb = _window(base_plan.buckets, plan.buckets)
        now_b = dict(zip(map(id, new_wb), new_wb))
        before_b = set(map(id, old_wb))
        rem_b = [(k, base.buckets[k]) for k in before_b - now_b.keys()]
        try:
            for k in now_b.keys() - before_b:
                b = now_b[k]
                members = patcher.bucket_members(0, b.members)
                add_b.append((k, (members, patcher.bucket_unit(mode, members, b.build))))
        except (ValueError, KeyError):
            return None
        chain = itertools.chain.from_iterable
        taken = list(chain(ms for _, (ms, _u) in add_b))
        in_members = set(taken)
        owners = set(map(base.ar_owner.get, in_members))
        owners.discard(None)
        if len(in_members) != len(taken) or not owners.issubset(k for k, _ in rem_b):
            return None  # an all-reduce in two of the plan's buckets: the whole patch raises
        ar_base = mode.ar_unit
        units = mode.units
        old: dict[int, Unit] = {}
        new: dict[int, Unit] = {}
        out_members = set(chain(ms for _, (ms, _u) in rem_b))
        for _, (_ms, u) in rem_b:
            old[id(u)] = u
        for _, (_ms, u) in add_b:
            new[id(u)] = u
        for m in in_members - out_members:  # an all-reduce in no bucket before: its own unit
            u = units[ar_base[m]]
            old[id(u)] = u
        for m in out_members - in_members:
            u = units[ar_base[m]]
            new[id(u)] = u
        _diff(old, new, removed, added)
    if plan.gather_buckets is not base_plan.gather_buckets and plan.gather_buckets != base_plan.gather_buckets:
        try:
            _regather(patcher, mode, base_plan, plan, removed, added)
        except ValueError:
            return None  # the whole patch raises
    child = Pieces(mode, blocking, threshold)
    child._parent = base
    child._change = (rem_g, add_g, old_regions, new_regions, rem_b, add_b)
    return child, removed, added


def _off_groups(patcher: Patcher, mode: Mode, rem_g: KeyedGroups, add_g: KeyedGroups,
                removed: list[Unit], added: list[Unit]) -> None:
    """The units a change of groups swaps in "off" mode: each group one kernel, each other op one."""
    old: dict[int, Unit] = {}
    new: dict[int, Unit] = {}
    virtual, units, unit_of = mode.virtual, mode.units, mode.unit_of
    out_members = {m for _, g in rem_g for m in g.members if not virtual[m]}
    in_members = {m for _, g in add_g for m in g.members if not virtual[m]}
    for _, g in rem_g:
        u = patcher.off_unit(mode, g)
        if u is not None:
            old[id(u)] = u
    for _, g in add_g:
        u = patcher.off_unit(mode, g)
        if u is not None:
            new[id(u)] = u
    for m in in_members - out_members:
        u = units[unit_of[m]]
        old[id(u)] = u
    for m in out_members - in_members:
        u = units[unit_of[m]]
        new[id(u)] = u
    _diff(old, new, removed, added)


def _reregion(patcher: Patcher, base: Pieces, base_plan: FusionPlan, plan: FusionPlan,
              rem_g: KeyedGroups, add_g: KeyedGroups, old_regions: list[Region],
              new_regions: list[Region], removed: list[Unit], added: list[Unit]) -> bool:
    """Re-fuses the regions that a change of groups and cuts touches ("extend"); False where a cut
    does not resolve (the whole patch raises)."""
    mode = base.mode
    near_changed = {c for _, g in rem_g for c in g.touched}
    near_changed.update(c for _, g in add_g for c in g.touched)
    gone_g = {id(g) for _, g in rem_g}

    def near_now(c: int) -> bool:  # some group of the plan touches base fusion c
        if c not in near_changed:
            r = base.regions.get(c)
            return r is not None and any(type(it) is Group and c in it.touched for it in r[0])
        r = base.regions.get(c)
        if r is not None and any(type(it) is Group and id(it) not in gone_g and c in it.touched for it in r[0]):
            return True
        return any(c in g.touched for _, g in add_g)

    def included_before(k: Cut) -> bool:
        r = base.regions.get(k.touched[0])
        return r is not None and any(it is k for it in r[0])

    out_items: list[Group] = [g for _, g in rem_g]
    in_items: list[Group] = [g for _, g in add_g]
    try:
        before = {cut: patcher.cut(ci, cut) for ci, cut in enumerate(patcher.cuts_of(base_plan))}
        now = {cut: patcher.cut(ci, cut) for ci, cut in enumerate(patcher.cuts_of(plan))}
    except ValueError:
        return False
    for cut, k in before.items():
        if k is not None and (cut not in now or near_changed.intersection(k.touched)) and included_before(k):
            out_items.append(k)
    for cut, k in now.items():
        if k is not None and (cut not in before or near_changed.intersection(k.touched)) and (
                len(k.touched) == 1 or any(near_now(c) for c in k.touched)):
            in_items.append(k)
    affected = {c for it in out_items for c in it.touched}
    affected.update(c for it in in_items for c in it.touched)
    if not affected:
        return True
    seen: set[int] = set()
    for c in affected:
        r = base.regions.get(c)
        if r is not None and id(r) not in seen:
            seen.add(id(r))
            old_regions.append(r)
    gone = {id(it) for it in out_items}
    items = [it for r in old_regions for it in r[0] if id(it) not in gone]
    items += [it for it in in_items if id(it) not in {id(x) for x in items}]
    new_regions += [_region(patcher, mode, comp) for comp in regions(items)]
    clusters = set(affected)
    for r in old_regions:
        for it in r[0]:
            clusters.update(it.touched)
    units, unit_of, mclusters = mode.units, mode.unit_of, mode.clusters
    old: dict[int, Unit] = {}
    new: dict[int, Unit] = {}
    old_dead: set[int] = set()
    new_dead: set[int] = set()
    for r in old_regions:
        old_dead.update(r[1][0])
        for u in r[1][1]:
            old[id(u)] = u
    for r in new_regions:
        new_dead.update(r[1][0])
        for u in r[1][1]:
            new[id(u)] = u
    for c in clusters:
        b = unit_of[mclusters[c][0]]
        if b not in old_dead:
            old[id(units[b])] = units[b]
        if b not in new_dead:
            new[id(units[b])] = units[b]
    _diff(old, new, removed, added)
    return True


def _regather(patcher: Patcher, mode: Mode, base_plan: FusionPlan, plan: FusionPlan, removed: list[Unit],
              added: list[Unit]) -> None:
    """The units a change of gather buckets swaps: on each all-gather that a bucket of several holds
    in either plan, the bucket's unit or its own base unit.

    Raises:
      ValueError: for gather buckets the whole patch refuses.
    """
    before, _ = patcher.gather_units(mode, base_plan.gather_buckets)
    now, _ = patcher.gather_units(mode, plan.gather_buckets)
    units, unit_of = mode.units, mode.unit_of
    old: dict[int, Unit] = {}
    new: dict[int, Unit] = {}
    for m in before.keys() | now.keys():
        u = before.get(m) or units[unit_of[m]]
        old[id(u)] = u
        u = now.get(m) or units[unit_of[m]]
        new[id(u)] = u
    _diff(old, new, removed, added)

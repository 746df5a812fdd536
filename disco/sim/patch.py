"""Plan patching: what one plan changes in a fusion mode's base units.

A plan is a patch of its mode's base units (:mod:`disco.sim.units`): its groups (with
``xla_fusion="off"`` each group is one kernel; with ``"extend"`` each set of base fusions its groups
touch is re-fused by the backend's fusion emulation with the groups pre-fused, cached per set of
groups), its buckets (one collective per bucket; ``buckets=None`` models XLA's combiner: all
all-reduces in one bucket, or one per all-reduce *level* where one bucket would deadlock) and its
gather buckets (one all-gather per bucket of several: the members' summed gathered bytes, ready when
every member's inputs are, releasing every member's readers; all-gathers in none, and every one under
``gather_buckets=None``, stay one collective each) replace some base units. A plan's cuts re-fuse
the base fusions they touch with the cut edges forbidden (like a group without members). On a GPU
cluster the plan's compile options are priced too: XLA:GPU's combiner closes a bucket at
``xla_gpu_all_reduce_combine_threshold_bytes`` (XLA's default when unset), and collectives overlap
kernels only with ``xla_gpu_enable_latency_hiding_scheduler`` on (``Patch.blocking``). A plan's
gather anchors (``gather_after``) add a dependency from each anchor to its all-gather: the units at
its two ends (whatever the groups and buckets made them) are replaced by copies that also wait and
release (:meth:`Patcher.wait_patch`). :meth:`Patcher.arrays` then gives the scheduler flat per-unit arrays.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from disco.plans import options as plan_options
from disco.sim import scheduler
from disco.sim.units import (BUILD_UNIT, COLL, KERNEL, REBUILT_UNITS, UNIT_COLL, FusionEmulation, Mode, Unit,
                             UnitBuilder, build_mode, waited)

if TYPE_CHECKING:
    from disco.plans.plan import FusionPlan

Arrays = tuple[list, list, list, list, list, list, list[int], list[int]]


class Group:
    """A planned group resolved against the graph (cached by its names)."""

    __slots__ = ("names", "members", "serial", "unit_off", "kmembers_ext", "touched", "solo", "solo_region")

    def __init__(self, names: tuple[str, ...], members: tuple[int, ...], serial: int = -1):
        self.names = names
        self.members = members
        self.serial = serial  # its number among its patcher's groups (-1: a cut)
        self.unit_off: Unit | None = None
        self.kmembers_ext: tuple[int, ...] = ()
        self.touched: tuple[int, ...] = ()
        self.solo: tuple[list[int], list[Unit], float] | None = None  # re-fusion when alone
        self.solo_region: tuple | None = None  # ((self,), solo): its region when alone (disco.sim.pieces)


class Cut(Group):
    """A plan cut resolved against "extend" mode: the fusion edges it forbids (cached by its pair).

    It takes part in re-fusion like a group without members: the base fusions it touches are
    re-fused with its edges forbidden.
    """

    __slots__ = ("pairs",)

    def __init__(self, names: tuple[str, ...], pairs: frozenset[tuple[int, int]], touched: tuple[int, ...]):
        super().__init__(names, ())
        self.pairs = pairs
        self.touched = touched


def regions(groups: Sequence[Group]) -> list[list[Group]]:
    """The groups that touch base fusions, in sets that touch the same ones: each set is re-fused together."""
    # The common case: every group lies inside one XLA fusion.
    by_cluster: dict[int, list[Group]] = {}
    for g in groups:
        t = g.touched
        if len(t) != 1:
            if t:
                break
            continue
        lst = by_cluster.get(t[0])
        if lst is None:
            by_cluster[t[0]] = [g]
        else:
            lst.append(g)
    else:
        return list(by_cluster.values())
    owner: dict[int, int] = {}
    comps: list[list[Group] | None] = []
    for g in groups:
        if not g.touched:
            continue
        hit = {owner[c] for c in g.touched if c in owner}
        if not hit:
            ci = len(comps)
            comps.append([g])
        else:
            ci = min(hit)
            comp = comps[ci]
            comp.append(g)  # type: ignore[union-attr]
            for cj in hit - {ci}:
                other = comps[cj]
                comp.extend(other)  # type: ignore[union-attr,arg-type]
                comps[cj] = None
                for h in other:  # type: ignore[union-attr]
                    for c in h.touched:
                        owner[c] = ci
        for c in g.touched:
            owner[c] = ci
    return [comp for comp in comps if comp is not None]


class Patch:
    """What one plan changes in a mode's base units: units removed and units added."""

    __slots__ = ("mode", "dead", "new", "compute", "comm", "buckets", "blocking", "gathers", "waited")

    def __init__(self, mode: Mode, dead: list[int], new: list[Unit], buckets: list[Unit] | None,
                 compute: float, comm: float, blocking: bool = False,
                 gathers: Sequence[tuple[int, Unit]] = (), waited: Sequence[tuple[Unit, Unit]] = ()):
        self.mode = mode
        self.dead = dead
        self.new = new
        self.buckets = buckets  # the plan's bucket units in plan order (None: the combiner's)
        self.compute = compute
        self.comm = comm
        self.blocking = blocking  # collectives hold the compute stream (no overlap)
        self.gathers = gathers  # (gather bucket index, its unit) of each gather bucket of several
        self.waited = waited  # (unit, its waited copy) for each unit a gather anchor's dependency ends at


class Patcher:
    """Turns plans into patches of one graph's base units, caching groups, buckets and re-fusions.

    Args:
      builder: makes (and caches) the graph's units.
      kind: per node, :func:`disco.sim.units.node_kinds`.
      ars: the all-reduce nodes, in program order.
      emulation: the backend's fusion emulation for ``xla_fusion="extend"``.
      gpu: the cluster is a GPU cluster (its compile options are priced).
      body_gathers: the all-gathers of the graph's loop bodies by name -> the while node holding each.
      loop_unit: ``(mode, while node, gather buckets of its body) -> its unit`` with them (required with
        ``body_gathers``).
    """

    def __init__(self, builder: UnitBuilder, kind: Sequence[int], ars: list[int], emulation: FusionEmulation,
                 gpu: bool = False, body_gathers: Mapping[str, int] | None = None,
                 loop_unit: Callable[[Mode, int, tuple[tuple[str, ...], ...]], Unit] | None = None):
        self.builder = builder
        self._body_gathers = dict(body_gathers or {})
        self._loop_unit = loop_unit
        self._loop_units: dict[tuple, Unit] = {}
        self.graph = builder.graph
        self._n = len(kind)
        self._index = self.graph.index()
        self._kind = kind
        self._ars = ars
        self._ar_set = frozenset(ars)
        self._emulation = emulation
        self._group_cache: dict[tuple[str, ...], Group] = {}
        self._bucket_names: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._gather_names: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._region_cache: dict[tuple[tuple[str, ...], ...], tuple[list[int], list[Unit], float]] = {}
        self._combined: dict[tuple[str, int | None], list[Unit]] = {}
        self._gpu = gpu
        self._cut_cache: dict[tuple[str, str], Cut | None] = {}
        self._wait_edges: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[tuple[int, int], ...]] = {}
        self._waited: dict[tuple, Unit] = {}
        self._anchor_cuts: dict[tuple, tuple[tuple[str, str], ...]] = {}
        self._option_cache: dict[tuple[tuple[str, str], ...], tuple[bool, int | None]] = {}
        self._modes: dict[str, Mode] = {}
        self._levels = self._ar_levels_graph()
        self.mode("extend")  # the backend's own fusion of the unplanned graph, once

    def mode(self, fusion: str) -> Mode:
        mode = self._modes.get(fusion)
        if mode is None:
            if fusion not in ("extend", "off"):
                raise ValueError(f"plan.xla_fusion: expected 'extend' or 'off', got {fusion!r}")
            mode = self._modes[fusion] = build_mode(self.builder, fusion, self._kind, self._ar_set,
                                                    self._emulation if fusion == "extend" else None)
        return mode

    def _resolve(self, names: Sequence[str], what: str) -> tuple[int, ...]:
        idx = self._index
        try:
            return tuple(sorted({idx[nm] for nm in names}))
        except KeyError as e:
            raise ValueError(f"{what}: instruction {e.args[0]!r} is not in the graph {self.graph.name!r}") from None
        except TypeError:
            raise ValueError(f"{what}: expected a sequence of instruction names, got {names!r}") from None

    def _group(self, gi: int, names: tuple[str, ...]) -> Group:
        g = self._group_cache.get(names)
        if g is not None:
            return g
        members = self._resolve(names, f"group {gi}")
        if not members:
            raise ValueError(f"group {gi} is empty; expected at least one instruction name")
        bad = [self.graph.nodes[m].name for m in members if self._kind[m] == COLL]
        if bad:
            raise ValueError(f"group {gi}: {bad[0]!r} is a collective; groups hold compute ops")
        g = Group(names, members, len(self._group_cache))
        off = self._modes.get("off")
        if off is not None:
            self._group_off(off, g)
        ext = self._modes["extend"]
        g.kmembers_ext = tuple(m for m in members if not ext.virtual[m])
        g.touched = tuple(sorted({ext.cluster_of[m] for m in g.kmembers_ext}))
        self._group_cache[names] = g
        return g

    def _group_off(self, mode: Mode, g: Group) -> None:
        km = tuple(m for m in g.members if not mode.virtual[m])
        g.unit_off = self.builder.kernel_unit(mode, km, (g.names,)) if km else None

    def _bucket_members(self, bi: int, names: tuple[str, ...]) -> tuple[int, ...]:
        members = self._bucket_names.get(names)
        if members is None:
            members = self._resolve(names, f"bucket {bi}")
            bad = [self.graph.nodes[m].name for m in members if m not in self._ar_set]
            if bad or not members:
                raise ValueError(f"bucket {bi}: expected all-reduce instruction names, got "
                                 f"{bad[:3] if bad else 'none'}")
            self._bucket_names[names] = members
        return members

    def gather_members(self, bi: int, names: tuple[str, ...]) -> tuple[int, ...]:
        """Gather bucket ``bi``'s all-gathers (node indices, sorted; cached by its names).

        Raises:
          ValueError: for names not in the graph, not all-gathers, or none.
        """
        members = self._gather_names.get(names)
        if members is None:
            members = self._resolve(names, f"gather bucket {bi}")
            nodes = self.graph.nodes
            bad = [nodes[m].name for m in members if nodes[m].opcode != "all-gather"]
            if bad or not members:
                raise ValueError(f"gather bucket {bi}: expected all-gather instruction names, got "
                                 f"{bad[:3] if bad else 'none'}")
            self._gather_names[names] = members
        return members

    def gather_units(self, mode: Mode, gather_buckets: Sequence[tuple[str, ...]] | None
                     ) -> tuple[dict[int, Unit], list[tuple[int, Unit]]]:
        """(all-gather node -> the unit that runs it, (bucket index, unit) per bucket) for each gather
        bucket of several members: one all-gather of their summed gathered bytes. A bucket of one is
        the all-gather's own base unit, as in the compiled step (the rewrite leaves it alone). Buckets of a
        loop body's all-gathers change the loop instead: its while node -> its unit with them (a kernel
        unit, ``loop_unit``), once per loop, under the index of its first such bucket.

        Raises:
          ValueError: for a bucket :meth:`gather_members` refuses, or an all-gather in two buckets.
        """
        owner: dict[int, Unit] = {}
        units: list[tuple[int, Unit]] = []
        seen: dict[int, int] = {}
        in_loops: dict[int, list[tuple[int, tuple[str, ...]]]] = {}
        for bi, names in enumerate(gather_buckets or ()):
            loop = self._body_loop(names)
            if loop is not None:
                in_loops.setdefault(loop, []).append((bi, names))
                continue
            members = self.gather_members(bi, names)
            for m in members:
                if m in seen:
                    raise ValueError(f"gather bucket {bi}: all-gather {self.graph.nodes[m].name!r} is already in "
                                     f"gather bucket {seen[m]}")
                seen[m] = bi
            if len(members) < 2:
                continue
            u = (self.builder.unit_cache.get((mode.fusion, UNIT_COLL, members))
                 or self.builder.coll_unit(mode, members, "all-gather"))
            units.append((bi, u))
            for m in members:
                owner[m] = u
        for loop, buckets in in_loops.items():
            if all(len(names) < 2 for _, names in buckets):
                continue  # buckets of one: the loop as it was
            key = (mode.fusion, loop, tuple(names for _, names in buckets))
            u = self._loop_units.get(key)
            if u is None:
                u = self._loop_units[key] = self._loop_unit(mode, loop, key[2])
            units.append((buckets[0][0], u))
            owner[loop] = u
        return owner, units

    def _body_loop(self, names: tuple[str, ...]) -> int | None:
        """The while node whose body holds every all-gather of ``names``, or None (a bucket outside loops,
        or one :meth:`gather_members` refuses)."""
        loops = {self._body_gathers.get(nm) for nm in names} if self._body_gathers else {None}
        return next(iter(loops)) if len(loops) == 1 else None

    def _ar_levels_graph(self) -> dict[int, int]:
        """Per all-reduce, the number of all-reduces on the longest chain above it."""
        lvl = [0] * self._n
        ar = self._ar_set
        for i, preds in enumerate(self.builder.kernels.preds):
            best = 0
            for p in preds:
                v = lvl[p] + (1 if p in ar else 0)
                if v > best:
                    best = v
            lvl[i] = best
        return {a: lvl[a] for a in self._ars}

    def _combiner(self, mode: Mode, levels: dict[int, int] | None = None,
                  threshold: int | None = None) -> list[Unit]:
        """XLA's combiner: all all-reduces in one bucket, split by all-reduce level if needed;
        with a ``threshold`` (XLA:GPU's), each level's all-reduces in program order are cut
        into buckets of at most that many bytes (one larger all-reduce alone) and 256 operands."""
        key = (mode.fusion, threshold)
        if levels is None and key in self._combined:
            return self._combined[key]
        by_level: dict[int, list[int]] = collections.defaultdict(list)
        for a in self._ars:
            by_level[(levels or self._levels)[a]].append(a)
        runs: list[list[int]] = []
        cbytes = self.builder.cbytes
        for lv in sorted(by_level):
            if threshold is None:
                runs.append(by_level[lv])
                continue
            cur: list[int] = []
            size = 0
            for a in by_level[lv]:
                if cur and (size + cbytes[a] > threshold or len(cur) >= 256):
                    runs.append(cur)
                    cur, size = [], 0
                cur.append(a)
                size += cbytes[a]
            runs.append(cur)
        out = [self.builder.coll_unit(mode, tuple(r), "all-reduce", variadic=threshold is None or len(r) > 1)
               for r in runs]
        if levels is None:
            self._combined[key] = out
        return out

    def _options(self, options: tuple[tuple[str, str], ...]) -> tuple[bool, int | None]:
        """(collectives hold the compute stream, XLA:GPU's combine threshold or None) for a plan's
        compile options on this cluster."""
        hit = self._option_cache.get(options)
        if hit is None:
            overlap = self.builder.cluster.overlap
            if self._gpu:
                sched = plan_options.as_bool(plan_options.value(options, plan_options.SCHEDULER, "gpu"))
                thr = int(plan_options.value(options, plan_options.THRESHOLD, "gpu"))
                hit = (not (overlap and sched), thr)
            else:
                hit = (not overlap, None)
            self._option_cache[options] = hit
        return hit

    def _cut(self, ci: int, cut: tuple[str, str]) -> Cut | None:
        """The cut's forbidden fusion edges in "extend" mode, or None when it changes no fusion
        decision (a producer that is no kernel, or a consumer that is no kernel)."""
        if cut in self._cut_cache:
            return self._cut_cache[cut]
        if not (isinstance(cut, tuple) and len(cut) == 2):
            raise ValueError(f"cut {ci}: expected a (producer, consumer) pair of instruction names, got {cut!r}")
        p, c = self._resolve(cut[:1], f"cut {ci}")[0], self._resolve(cut[1:], f"cut {ci}")[0]
        ext = self._modes["extend"]
        out = None
        if not ext.virtual[p]:
            cons: set[int] = set()
            todo = [c]
            while todo:  # through duplicated producers (virtual kernels) to the users they feed
                x = todo.pop()
                if self._kind[x] != KERNEL:
                    continue
                if ext.virtual[x]:
                    todo += self.builder.kernels.succs[x]
                else:
                    cons.add(x)
            touched = sorted({ext.cluster_of[x] for x in (p, *cons) if ext.cluster_of[x] >= 0})
            if cons and touched:
                out = Cut(("<cut>", *cut), frozenset((p, x) for x in cons), tuple(touched))
        self._cut_cache[cut] = out
        return out

    def patch(self, plan: FusionPlan, levels: dict[int, int] | None = None) -> Patch:
        """The units ``plan`` removes from and adds to its mode's base units.

        Its three parts, :meth:`group_patch`, :meth:`bucket_patch` then :meth:`wait_patch`, in that order.

        Raises:
          ValueError: for names not in the graph, overlapping groups or overlapping buckets.
        """
        mode = self.mode(plan.xla_fusion)
        dead, new, compute = self.group_patch(plan, mode)
        loops = len(new)
        buckets, comm, blocking, gathers = self.bucket_patch(plan, mode, dead, new, levels)
        # the loops whose body's all-gathers the plan buckets: their time is compute
        compute += sum(u.dur - mode.dur[mode.unit_of[u.members[0]]] for u in new[loops:] if not u.is_coll)
        pairs: list[tuple[Unit, Unit]] = []
        if plan.gather_after:
            pairs = self.wait_patch(plan, mode, dead, new)
            swap = {id(u): w for u, w in pairs}
            gathers = [(bi, swap.get(id(u), u)) for bi, u in gathers]
            if buckets is not None:
                buckets = [swap.get(id(u), u) for u in buckets]
        return Patch(mode, dead, new, buckets, compute, comm, blocking, gathers, pairs)

    def cuts_of(self, plan: FusionPlan) -> tuple[tuple[str, str], ...]:
        """The fusion cuts the plan makes: its own, and for each gather anchor one from the anchor to each of
        its readers (the barrier reads the anchor's value, so XLA's fusion keeps it a fusion's output and
        never fuses it with what waits for the gather); cached."""
        if not plan.gather_after:
            return plan.cuts
        key = (plan.cuts, plan.gather_after)
        hit = self._anchor_cuts.get(key)
        if hit is None:
            have = set(plan.cuts)
            extra: list[tuple[str, str]] = []
            nodes, succs, index = self.graph.nodes, self.builder.kernels.succs, self._index
            for a in dict.fromkeys(a for _, a in plan.gather_after):
                if a not in index:
                    continue  # wait_edges names it
                for u in dict.fromkeys(succs[index[a]]):
                    cut = (a, nodes[u].name)
                    if cut not in have:
                        have.add(cut)
                        extra.append(cut)
            hit = self._anchor_cuts[key] = plan.cuts + tuple(extra)
        return hit

    def wait_edges(self, plan: FusionPlan, mode: Mode) -> tuple[tuple[int, int], ...]:
        """The plan's gather anchors as (real node, all-gather) dependencies in ``mode``: an anchor the
        mode folds away (a duplicated producer) waits for the real nodes it passes on; cached.

        Raises:
          ValueError: for a pair that is not two instruction names of the graph.
        """
        key = (mode.fusion, plan.gather_after)
        hit = self._wait_edges.get(key)
        if hit is None:
            edges: set[tuple[int, int]] = set()
            for pi, pair in enumerate(plan.gather_after):
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise ValueError(f"gather anchor {pi}: expected an (all-gather, anchor) pair of instruction names, "
                                     f"got {pair!r}")
                g, a = self._resolve(pair[:1], f"gather anchor {pi}")[0], self._resolve(pair[1:], f"gather anchor {pi}")[0]
                if mode.virtual[g]:
                    raise ValueError(f"gather anchor {pi}: {pair[0]!r} is no collective; expected an all-gather")
                edges.update((r, g) for r in (mode.through[a] if mode.virtual[a] else (a,)) if r != g)
            hit = self._wait_edges[key] = tuple(sorted(edges))
        return hit

    def waits(self, mode: Mode, edges: Sequence[tuple[int, int]],
              holder: Callable[[int], Unit]) -> list[tuple[Unit, Unit]]:
        """(unit, its waited copy) for each unit at an end of ``edges`` (:meth:`wait_edges`), each node's unit
        given by ``holder``; a dependency inside one unit adds nothing. Copies are cached by what they are."""
        preds: dict[int, list[int]] = {}
        succ: dict[int, dict[int, int]] = {}
        units: dict[int, Unit] = {}
        for r, g in edges:
            ur, ug = holder(r), holder(g)
            if ur is ug:
                continue
            units[id(ur)], units[id(ug)] = ur, ug
            preds.setdefault(id(ug), []).append(r)
            out = succ.setdefault(id(ur), {})
            out[g] = out.get(g, 0) + 1
        pairs = []
        for k, u in units.items():
            p = tuple(preds.get(k, ()))
            s = tuple(sorted(succ.get(k, {}).items()))
            key = (mode.fusion, u.is_coll, u.members, u.dur, u.groups, p, s)
            w = self._waited.get(key)
            if w is None:
                w = self._waited[key] = waited(u, p, s)
            pairs.append((u, w))
        return pairs

    def wait_patch(self, plan: FusionPlan, mode: Mode, dead: list[int], new: list[Unit]) -> list[tuple[Unit, Unit]]:
        """The last part of ``plan``'s patch: the units at the ends of its gather anchors' dependencies
        (after its groups and buckets) replaced by their waited copies in ``dead`` and ``new``.

        Returns:
          (unit, its waited copy) per replaced unit.

        Raises:
          ValueError: as :meth:`wait_edges`.
        """
        edges = self.wait_edges(plan, mode)
        if not edges:
            return []
        held = {m: u for u in new for m in u.members}
        units, unit_of = mode.units, mode.unit_of

        def holder(x: int) -> Unit:
            u = held.get(x)
            return u if u is not None else units[unit_of[x]]

        pairs = self.waits(mode, edges, holder)
        gone = {id(u) for u, _ in pairs}
        added = {id(u) for u in new}  # (a re-fusion may add a base unit's own object again)
        new[:] = [u for u in new if id(u) not in gone]
        for u, w in pairs:
            if id(u) not in added:  # an alive base unit
                dead.append(unit_of[u.members[0]])
            new.append(w)
        return pairs

    def group_patch(self, plan: FusionPlan, mode: Mode, *, summed: bool = True) -> tuple[list[int], list[Unit], float]:
        """The part of ``plan``'s patch its groups and cuts make: (base units removed, units added,
        the plan's summed kernel time). It depends on the plan's fusion mode, groups and cuts only.

        Args:
          plan: the plan.
          mode: its fusion mode's base units (:meth:`mode`).
          summed: sum the kernel time; False: the third value is not the plan's (the units are).

        Raises:
          ValueError: for names not in the graph, an empty group, a collective in a group, overlapping
            groups or a cut that is not a pair of instruction names.
        """
        cache_get = self._group_cache.get
        groups: list[Group] = []
        for gi, names in enumerate(plan.groups):
            groups.append(cache_get(names) or self._group(gi, names))
        if groups:
            count = sum(len(g.members) for g in groups)
            if len(set().union(*[g.members for g in groups])) != count:
                self._raise_overlap(plan)
        cuts = self.cuts_of(plan)
        if cuts and mode.fusion == "extend":
            # A cut re-fuses the base fusions it touches: always when its producer and consumer
            # share one, else only beside a group that touches them (it may grow across the cut).
            near = {c for g in groups for c in g.touched}
            for ci, cut in enumerate(cuts):
                k = self._cut(ci, cut)
                if k is not None and (len(k.touched) == 1 or near.intersection(k.touched)):
                    groups.append(k)
        dead: list[int] = []
        new: list[Unit] = []
        compute = mode.kernel_total
        dur = mode.dur
        if groups:
            if mode.fusion == "off":
                unit_of = mode.unit_of
                for g in groups:
                    if g.unit_off is None:
                        self._group_off(mode, g)
                    u = g.unit_off
                    if u is None:
                        continue
                    new.append(u)
                    if summed:
                        gone = [unit_of[m] for m in u.members]
                        dead += gone
                        compute += u.dur - sum(dur[d] for d in gone)
                    else:
                        dead += map(unit_of.__getitem__, u.members)
            else:
                compute += self._extend_groups(mode, groups, dead, new)
        return dead, new, compute

    def bucket_patch(self, plan: FusionPlan, mode: Mode, dead: list[int], new: list[Unit],
                     levels: dict[int, int] | None = None
                     ) -> tuple[list[Unit] | None, float, bool, list[tuple[int, Unit]]]:
        """The rest of ``plan``'s patch: its buckets (or XLA's combiner), gather buckets and compile
        options. Appends the base units they remove to ``dead`` and the units they add to ``new``.

        Args:
          plan: the plan.
          mode: its fusion mode's base units (:meth:`mode`).
          dead, new: the lists to extend.
          levels: all-reduce levels for XLA's combiner (None: the graph's).

        Returns:
          (the bucket units in plan order or None for the combiner's, the summed collective time,
          whether collectives hold the compute stream, (gather bucket index, unit) per gather bucket of
          several), as :class:`Patch` holds them.

        Raises:
          ValueError: for names not in the graph, overlapping buckets, or gather buckets
            :meth:`gather_units` refuses.
        """
        blocking, threshold = self._options(plan.compile_options)
        comm = mode.comm_total
        dur = mode.dur
        ar_unit = mode.ar_unit
        if plan.buckets is None:
            buckets = None
            if self._ars:
                dead += ar_unit.values()
                combined = self._combiner(mode, levels, threshold)
                new += combined
                comm += sum(u.dur for u in combined) - sum(dur[d] for d in ar_unit.values())
        else:
            buckets = []
            seen: set[int] = set()
            count = 0
            bucket_get = self._bucket_names.get
            coll_get = self.builder.unit_cache.get
            fusion = mode.fusion
            for bi, b in enumerate(plan.buckets):
                members = bucket_get(b.members) or self._bucket_members(bi, b.members)
                seen.update(members)
                count += len(members)
                unit = BUILD_UNIT[b.build]
                u = coll_get((fusion, unit, members)) or self.builder.coll_unit(mode, members, "all-reduce", unit=unit)
                buckets.append(u)
                if len(members) > 1 or unit in REBUILT_UNITS:
                    gone = [ar_unit[m] for m in members]
                    dead += gone
                    new.append(u)
                    comm += u.dur - sum(dur[d] for d in gone)
            if len(seen) != count:
                self._raise_overlap(plan)
        gathers: list[tuple[int, Unit]] = []
        if plan.gather_buckets:
            _, gathers = self.gather_units(mode, plan.gather_buckets)
            unit_of = mode.unit_of
            for _, u in gathers:
                gone = [unit_of[m] for m in u.members]
                dead += gone
                new.append(u)
                if u.is_coll:  # (a loop's unit is compute: its collectives run serially in its iterations)
                    comm += u.dur - sum(dur[d] for d in gone)
            gathers = [(bi, u) for bi, u in gathers if u.is_coll]
        return buckets, comm, blocking, gathers

    def _extend_groups(self, mode: Mode, groups: list[Group], dead: list[int], new: list[Unit]) -> float:
        """Planned groups grown by XLA's fusion: each set of base fusions that groups touch is re-fused.

        Appends to ``dead`` and ``new``; returns the change in summed kernel time. A region's
        re-fusion is cached: on the group when it is alone, else by the region's group names.
        """
        delta = 0.0
        for comp in regions(groups):
            hit = self.region(mode, comp)
            dead += hit[0]
            new += hit[1]
            delta += hit[2]
        return delta

    def region(self, mode: Mode, comp: list[Group]) -> tuple[list[int], list[Unit], float]:
        """(base units removed, units added, kernel-time change) of one region (groups and cuts that
        touch the same base fusions, :func:`regions`) in "extend" mode; cached: on the group when
        it is alone, else by the region's group names."""
        if len(comp) == 1:
            hit = comp[0].solo
            if hit is None:
                hit = comp[0].solo = self._refuse(mode, comp)
            return hit
        key = tuple(sorted(g.names for g in comp))
        hit = self._region_cache.get(key)
        if hit is None:
            hit = self._region_cache[key] = self._refuse(mode, comp)
        return hit

    def group(self, gi: int, names: tuple[str, ...]) -> Group:
        """Plan group ``gi`` resolved (cached by its names).

        Raises:
          ValueError: for names not in the graph, an empty group or a collective in it.
        """
        return self._group_cache.get(names) or self._group(gi, names)

    def cut(self, ci: int, cut: tuple[str, str]) -> Cut | None:
        """Plan cut ``ci`` resolved in "extend" mode (None where it changes no fusion decision).

        Raises:
          ValueError: for a cut that is not a pair of instruction names in the graph.
        """
        return self._cut(ci, cut)

    def off_unit(self, mode: Mode, g: Group) -> Unit | None:
        """Group ``g``'s one kernel in "off" mode (None for a group of zero-cost ops only)."""
        if g.unit_off is None:
            self._group_off(mode, g)
        return g.unit_off

    def bucket_unit(self, mode: Mode, members: tuple[int, ...], build: str) -> Unit:
        """The collective a bucket of ``members`` built ``build`` runs as: its own unit, or for a
        "concat" bucket of one all-reduce the base unit (such a bucket changes nothing)."""
        unit = BUILD_UNIT[build]
        if len(members) == 1 and unit not in REBUILT_UNITS:
            return mode.units[mode.ar_unit[members[0]]]
        return (self.builder.unit_cache.get((mode.fusion, unit, members))
                or self.builder.coll_unit(mode, members, "all-reduce", unit=unit))

    def bucket_members(self, bi: int, names: tuple[str, ...]) -> tuple[int, ...]:
        """Plan bucket ``bi``'s all-reduces (node indices, sorted; cached by its names).

        Raises:
          ValueError: for names not in the graph or not all-reduces.
        """
        return self._bucket_names.get(names) or self._bucket_members(bi, names)

    def options(self, options: tuple[tuple[str, str], ...]) -> tuple[bool, int | None]:
        """(collectives hold the compute stream, XLA:GPU's combine threshold or None) of a plan's
        compile options on this cluster."""
        return self._options(options)

    def _refuse(self, mode: Mode, comp: list[Group]) -> tuple[list[int], list[Unit], float]:
        """(base units removed, units added, kernel-time change) when ``comp``'s groups are pre-fused."""
        touched = sorted({c for g in comp for c in g.touched})
        region = sorted(m for c in touched for m in mode.clusters[c])
        ordered = sorted((g for g in comp if not isinstance(g, Cut)), key=lambda g: g.kmembers_ext)
        cuts = frozenset().union(*(g.pairs for g in comp if isinstance(g, Cut)))
        clusters = self._emulation.clusters(region, [g.kmembers_ext for g in ordered], cuts)
        where = {m: g.names for g in comp for m in g.kmembers_ext}
        units = []
        for c in clusters:
            inside = tuple(dict.fromkeys(where[m] for m in c if m in where))
            units.append(self.builder.kernel_unit(mode, c, inside))
        gone = [mode.unit_of[mode.clusters[c][0]] for c in touched]
        return gone, units, sum(u.dur for u in units) - sum(mode.dur[d] for d in gone)

    def _raise_overlap(self, plan: FusionPlan) -> None:
        owner: dict[str, str] = {}
        parts = [(f"group {gi}", names) for gi, names in enumerate(plan.groups)]
        parts += [(f"bucket {bi}", b.members) for bi, b in enumerate(plan.buckets or ())]
        for where, names in parts:
            for name in names:
                if name in owner:
                    raise ValueError(f"{where}: instruction {name!r} is already in {owner[name]}; "
                                     "groups and buckets must be disjoint")
                owner[name] = where
        raise ValueError("plan has overlapping groups or buckets")  # pragma: no cover

    def arrays(self, patch: Patch) -> Arrays:
        """Per-plan unit arrays: the mode's base arrays with the patch applied.

        Returns:
          (unit_of, indeg, dur, key, succ, coll, ready_k, ready_c): node -> unit id, and per unit
          (base ids, then the patch's new units) as :func:`disco.sim.scheduler.schedule` takes them;
          ``indeg`` is a fresh list, the others may be the mode's own (read only).
        """
        mode = patch.mode
        new = patch.new
        nb = len(mode.dur)
        unit_of = mode.unit_of[:]
        indeg = mode.indeg + [u.indeg for u in new]
        for d in patch.dead:
            indeg[d] = scheduler.DEAD
        ready_k = [u for u in mode.ready_k if indeg[u] == 0]
        ready_c = [u for u in mode.ready_c if indeg[u] == 0]
        for k, u in enumerate(new):
            uid = nb + k
            for m in u.members:
                unit_of[m] = uid
            if u.indeg == 0:
                (ready_c if u.is_coll else ready_k).append(uid)
        if new:
            dur = mode.dur + [u.dur for u in new]
            key = mode.key + [u.prio for u in new]
            succ = mode.succ + [u.succ for u in new]
            coll = mode.coll + [u.is_coll for u in new]
        else:
            dur, key, succ, coll = mode.dur, mode.key, mode.succ, mode.coll
        return unit_of, indeg, dur, key, succ, coll, ready_k, ready_c

    def all_units(self, patch: Patch) -> list[Unit]:
        dead = set(patch.dead)
        return [u for ui, u in enumerate(patch.mode.units) if ui not in dead] + patch.new

    def toposort(self, patch: Patch) -> list[int]:
        """Alive unit ids (base ids, then the patch's new units) in a topological order.

        Raises:
          ValueError: naming units on a cycle.
        """
        unit_of, indeg, dur, key, succ, coll, ready_k, ready_c = self.arrays(patch)
        order = scheduler.toposort(unit_of, indeg, key, succ, ready_k + ready_c)
        if len(order) + len(patch.dead) != len(dur):
            units = patch.mode.units + patch.new
            names = self.graph.nodes
            stuck = sorted({names[m].name for u in range(len(dur)) if indeg[u] > 0 for m in units[u].members})
            raise ValueError(f"contracting the plan forms a cycle through {stuck[:6]}; "
                             "check the plan with disco.plans.check.validate")
        return order

    def contracted_levels(self, patch: Patch) -> dict[int, int]:
        """All-reduce levels on the graph with the plan's kernels and gather buckets contracted
        (all-reduces single)."""
        mode = patch.mode
        dead = set(patch.dead)
        kernels = [u for ui, u in enumerate(mode.units) if ui not in dead and not u.is_coll]
        kernels += [u for u in patch.new if not u.is_coll]
        swap = {id(u): w for u, w in patch.waited}
        singles = [swap.get(id(u), u) for u in (mode.units[mode.ar_unit[a]] for a in self._ars)]
        others = [u for ui, u in enumerate(mode.units)
                  if u.is_coll and u.members[0] not in self._ar_set and ui not in dead]
        others += [u for _, u in patch.gathers]
        held = {id(u) for u in others}
        others += [w for u, w in patch.waited if w.is_coll and w.members[0] not in self._ar_set and id(w) not in held]
        units = kernels + singles + others
        unit_of = [-1] * self._n
        for ui, u in enumerate(units):
            for m in u.members:
                unit_of[m] = ui
        indeg = [u.indeg for u in units]
        heap = [(u.prio, ui) for ui, u in enumerate(units) if u.indeg == 0]
        heapq.heapify(heap)
        lvl = [0] * len(units)
        ar = self._ar_set
        while heap:
            _, ui = heapq.heappop(heap)
            u = units[ui]
            up = lvl[ui] + (1 if u.is_coll and u.members[0] in ar else 0)
            for s, c in u.succ:
                w = unit_of[s]
                if up > lvl[w]:
                    lvl[w] = up
                indeg[w] -= c
                if indeg[w] == 0:
                    heapq.heappush(heap, (units[w].prio, w))
        return {a: lvl[unit_of[a]] for a in self._ars}

    def labels(self, plan: FusionPlan, patch: Patch) -> dict[int, str]:
        labels: dict[int, str] = {}
        nb = len(patch.mode.dur)
        gindex = {names: gi for gi, names in enumerate(plan.groups)}
        combined = 0
        bucket_index = {id(u): bi for bi, u in enumerate(patch.buckets or ())}
        gather_index = {id(u): bi for bi, u in patch.gathers}
        base_units = {id(u) for u in patch.mode.units}
        for k, u in enumerate(patch.new):
            if u.orig is not None and id(u.orig) in base_units and not u.groups and id(u) not in gather_index:
                continue  # a base unit that waits for a gather anchor: its own name
            if u.groups:
                labels[nb + k] = f"fusion.{min(gindex[g] for g in u.groups)}"
            elif id(u) in gather_index:
                labels[nb + k] = f"gather_bucket.{gather_index[id(u)]}"
            elif u.is_coll:
                if patch.buckets is None:
                    labels[nb + k] = f"combined.{combined}"
                    combined += 1
                else:
                    labels[nb + k] = f"bucket.{bucket_index[id(u)]}"
        if patch.buckets is not None:  # single-member buckets keep their base unit
            for bi, u in enumerate(patch.buckets):
                if len(u.members) == 1:
                    labels[patch.mode.ar_unit[u.members[0]]] = f"bucket.{bi}"
        return labels

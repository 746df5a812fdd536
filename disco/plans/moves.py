"""Moves over the joint space of op-fusion groups and gradient buckets.

Each move is a pure function ``move(plan, ctx, rng) -> FusionPlan | None``: it
returns a new plan one step away from ``plan``, or None when it does not apply
(no group to split, no adjacent bucket, every try broke a rule). ``ctx`` is a
:class:`~disco.plans.move_context.MoveContext`, the plan-independent precomputation for one
graph (:func:`~disco.plans.move_context.context`, re-exported here), and ``rng`` a
:class:`random.Random`.

Moves keep a valid plan valid (``plan.validate(graph)`` passes) without calling
the full validation: every rule is checked incrementally on what the move
changed.

- Fusible opcodes, one computation, default layouts: a move only joins fusible ops
  (constants excluded: they cost nothing and fusing them gains nothing) along an
  edge of the same computation, and only ops that plan_check's layout rules allow
  in a group (default layout, no input with a layout or from a convolution).
- Exactly one output: counted on the groups the move changed.
- No cycle after contraction: a group with one output cannot be part of a cycle on
  its own (every member reaches the output inside the group), so only buckets can
  close one; bucket moves check the changed buckets with precomputed reachability
  between all-reduces (bitsets), group moves need no check.
- Buckets: only buckets of the same class (computation, reduction, replica
  groups, dtype) merge, so every all-reduce stays in exactly one bucket; a bucket
  made by a merge or a split is built "concat", and ``switch_build`` turns one
  into "rs_ag" (reduce-scatter + all-gather) or back, or a bucket of gradient scatters only into
  "scatter" (one reduce-scatter) or back; the dynamic-slices a "scatter" bucket replaces are in no
  fusible pair, so no group move takes one. A "tuple" bucket of several
  dtypes (a start plan may hold one) is left as it is: "concat" needs one dtype.
- Cuts: ``add_cut`` cuts an operand edge between two fusible ops (an array-shaped
  producer, a computation plans may touch) that no group holds both ends of;
  ``remove_cut`` drops one. Group moves never join the two ends of a cut.
- Compile options (the backend's table, :mod:`disco.plans.options`): ``flip_option`` flips
  a boolean option or switches a choice option (CPU: YNNPACK's fusion types), ``step_option``
  steps a size option to the next value of its table up or down; a value equal to XLA's
  default is left out.
- Gather buckets (a step with sharded parameters; only where ``ctx.gather_class`` holds its
  parameter all-gathers): ``merge_gather_buckets`` merges a gather bucket, or a parameter
  all-gather in none, with the next one of its class (computation, replica groups, dtype) in program
  order; ``split_gather_bucket`` splits one in two at a point of program order (a part of one
  all-gather is no bucket); ``reset_gather_buckets`` leaves the all-gathers to XLA again
  (``gather_buckets=None``). No gather bucket they make can wait on its own result: its members
  have no collective above them, so no path of the contracted plan enters one but from the
  parameters. Gather buckets holding other all-gathers (a start plan's) are left as they are. On a
  graph without parameter all-gathers :func:`random_move` draws from :data:`DEFAULT_WEIGHTS`
  alone, the same moves in the same order for a seed as before these moves existed.
- Gather anchors (``FusionPlan.gather_after``; only where ``ctx.anchors`` holds candidates):
  ``shift_anchor`` moves one parameter all-gather's anchor to the previous or the next candidate
  (``ctx.anchors``: the parameter gathers' first uses in program order), earlier (more prefetch,
  more memory held; before the first one: no anchor, the step's start) or later (less), or gives an
  unanchored gather the first one. An anchor stays before every first reader of its gather's bucket,
  so it cannot be downstream of the bucket, and a cycle through anchors would need positions that
  decrease around it; ``merge_gather_buckets`` refuses a merge that breaks that rule, and group moves
  never leave an anchor inside a group other than as its output. Where an anchor is downstream of an
  all-reduce (``ctx.anchors_below_reduce``) a bucket move's result is checked whole for a cycle.
- Backend: a context for "gpu" has no fusible pairs, so no move makes a group (XLA:GPU
  cannot take them; ``disco.plans.check.GPU_GROUPS_REASON``).

Plans come out canonical (:func:`canonical`): group members, bucket members and gather bucket
members in program order, groups, buckets and gather buckets ordered by their first member, no
gather bucket of one all-gather (the compiled step's all-gather itself), cuts in program
order of (producer, consumer), compile options sorted by key, no one-op
groups (a one-op group is the same kernel as no group), so equal plans have equal
digests.

Example:
  >>> ctx = context(graph)                                    # doctest: +SKIP
  >>> child = fuse(canonical(plan, ctx), ctx, random.Random(0))  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import collections
import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from disco.plans import check as plan_check
from disco.plans import options as plan_options
from disco.plans.move_context import MoveContext, context
from disco.plans.plan import Bucket, FusionPlan

__all__ = [
    "Move", "MoveContext", "context", "fuse", "split_group", "move_op", "toggle_xla_fusion", "merge_buckets",
    "split_bucket", "shift_gradient", "switch_build", "add_cut", "remove_cut", "flip_option", "step_option",
    "merge_gather_buckets", "split_gather_bucket", "reset_gather_buckets", "shift_anchor",
    "MOVES", "DEFAULT_WEIGHTS", "GATHER_WEIGHTS", "random_move", "canonical",
]

Move = Callable[[FusionPlan, MoveContext, random.Random], "FusionPlan | None"]
_NONE = -1  # cluster id of a node in no group or bucket
_TRIES = 4
_VIEWS_KEPT = 4
_MEMBERS_KEPT = 1 << 16  # group and bucket tuples whose node indices a context keeps (then starts over)


# ---------------------------------------------------------------------------------------------
class _View:
    """A plan as node indices: clusters (groups first, then buckets) and node -> cluster.

    A child plan keeps most of its parent's group and bucket tuples (the same objects), so each
    tuple's node indices are kept by the tuple (``ctx.memo["members"]``, at most
    :data:`_MEMBERS_KEPT`): making a view costs a lookup per group and bucket (and the node ->
    cluster map, for the moves that ask), not a name lookup per member, which had been a third of
    a search's time at 9.2k nodes (measured on CPU).
    """

    __slots__ = ("plan", "clusters", "n_groups", "_n", "_cid", "_firsts", "_bucket_of")

    def __init__(self, plan: FusionPlan, ctx: MoveContext):
        kept = ctx.memo.get("members")
        if kept is None or len(kept) > _MEMBERS_KEPT:
            kept = ctx.memo["members"] = {}
        index = ctx.index.__getitem__

        def members(names: tuple[str, ...]) -> tuple[int, ...]:
            hit = kept.get(names)
            if hit is None:
                hit = kept[names] = tuple(sorted(map(index, names)))
            return hit

        clusters = [members(g) for g in plan.groups]
        self.n_groups = len(clusters)
        clusters += [members(b.members) for b in plan.buckets or ()]
        self.plan = plan
        self.clusters = clusters
        self._n = len(ctx.names)
        self._cid: np.ndarray | None = None
        self._firsts: list[int] | None = None
        self._bucket_of: dict[int, int] | None = None

    def firsts(self) -> list[int]:
        """Each cluster's first member, -1 for an empty one (made on first use)."""
        f = self._firsts
        if f is None:
            f = self._firsts = [m[0] if m else -1 for m in self.clusters]
        return f

    def bucket_of(self, ctx: MoveContext) -> dict[int, int]:
        """All-reduce bit (``ctx.ar_bit``) -> the index of the bucket holding it (made on first use)."""
        owner = self._bucket_of
        if owner is None:
            bit = ctx.ar_bit.__getitem__
            owner = self._bucket_of = {}
            for j in range(self.n_groups, len(self.clusters)):
                owner.update(zip(map(bit, self.clusters[j]), itertools.repeat(j)))
        return owner

    def cluster_of(self, node: int) -> int:
        """The index of the cluster holding ``node``, or -1 (the map is made on first use, at C
        speed: bucket moves never ask)."""
        cid = self._cid
        if cid is None:
            clusters = self.clusters
            sizes = np.fromiter(map(len, clusters), np.int64, len(clusters))
            cid = self._cid = np.full(self._n, _NONE, np.int64)
            cid[np.fromiter(itertools.chain.from_iterable(clusters), np.int64, int(sizes.sum()))] = np.repeat(
                np.arange(len(clusters)), sizes)
        return int(cid[node])


def _view(plan: FusionPlan, ctx: MoveContext) -> _View:
    """The plan's view, kept for the last :data:`_VIEWS_KEPT` plans (a search's children each start
    from their parent, several moves apart: the parent's view outlives the moves between)."""
    views = ctx.memo.setdefault("views", {})
    hit = views.pop(id(plan), None)
    if hit is None or hit.plan is not plan:
        hit = _View(plan, ctx)
        while len(views) >= _VIEWS_KEPT:
            del views[next(iter(views))]
    views[id(plan)] = hit  # most recently used last
    return hit


class _Edit:
    """Changes to a view: removed clusters (left empty, their indices in ``removed``), added groups
    and buckets (after the view's clusters)."""

    __slots__ = ("view", "clusters", "new_groups", "removed")

    def __init__(self, view: _View):
        self.view = view
        self.clusters = list(view.clusters)
        self.new_groups: set[int] = set()
        self.removed: list[int] = []

    def remove(self, c: int) -> None:
        if c < len(self.view.clusters) and self.clusters[c]:
            self.removed.append(c)
        self.clusters[c] = ()

    def _add(self, members: Sequence[int]) -> int:
        self.clusters.append(tuple(sorted(members)))
        return len(self.clusters) - 1

    def add_group(self, members: Sequence[int]) -> int:
        """Adds a group; a one-op group is no group (its op stays unfused, its id is empty)."""
        if len(members) < 2:
            self.clusters.append(())
            return len(self.clusters) - 1
        k = self._add(members)
        self.new_groups.add(k)
        return k

    def add_bucket(self, members: Sequence[int]) -> int:
        return self._add(members)


def _n_outputs(ctx: MoveContext, members: Sequence[int]) -> int:
    """Members whose value is used outside ``members`` (or by nobody)."""
    mset = set(members)
    succ = ctx.succ
    out = 0
    for m in members:
        us = succ[m]
        if not us:
            out += 1
            continue
        for u in us:
            if u not in mset:
                out += 1
                break
    return out


def _on_cycle(ctx: MoveContext, ed: _Edit, k: int) -> bool:
    """Whether contracting the edited plan forms a cycle through bucket ``k``.

    Groups are left out on purpose: a group with exactly one output is entered at some
    member and left from its output, and every member reaches the output inside the
    group, so a path through a group is a path of the graph. Only buckets jump (enter
    at one all-reduce, leave from another), so a cycle needs a bucket, and whether one
    forms depends on the buckets alone. Follows reachability between all-reduces as
    bitsets: the buckets reachable from ``k``, until one reaches ``k`` again.
    """
    members = ed.clusters[k]
    if not members:
        return False
    bit, reach = ctx.ar_bit, ctx.ar_reach
    base = ed.view.bucket_of(ctx)  # the view's buckets, and the edit's added buckets over them
    added: dict[int, int] = {}
    for j in range(len(ed.view.clusters), len(ed.clusters)):
        if j not in ed.new_groups:
            added.update(zip(map(bit.__getitem__, ed.clusters[j]), itertools.repeat(j)))

    def owner(b: int) -> int:
        j = added.get(b)
        return base[b] if j is None else j

    mask_k = 0
    seen = 0
    for m in members:
        mask_k |= 1 << bit[m]
        seen |= reach[m]
    if seen & mask_k:
        return True
    done = {k}
    todo = seen
    while todo:
        low = todo & -todo
        todo ^= low
        j = owner(low.bit_length() - 1)
        if j in done:
            continue
        done.add(j)
        r = 0
        for m in ed.clusters[j]:
            r |= reach[m]
        if r & mask_k:
            return True
        todo |= r & ~seen
        seen |= r
    return False


def _finish(ed: _Edit, ctx: MoveContext) -> FusionPlan:
    """The edited view as a canonical plan (unchanged groups and buckets reuse their tuples).

    The plan's groups and buckets without the removed ones, in their order, with the added ones
    put in place by their first member (:func:`_placed`): its cost follows the edit, not the plan.
    """
    view = ed.view
    plan = view.plan
    names = ctx.names
    ng, n_old = view.n_groups, len(view.clusters)
    new_groups: list[tuple[int, tuple[str, ...]]] = []
    new_buckets: list[tuple[int, Bucket]] = []
    for k in range(n_old, len(ed.clusters)):
        m = ed.clusters[k]
        if not m:
            continue
        if k in ed.new_groups:
            new_groups.append((m[0], tuple(map(names.__getitem__, m))))
        else:
            new_buckets.append((m[0], Bucket(tuple(map(names.__getitem__, m)), "concat")))
    gone = sorted(ed.removed)
    split = bisect.bisect_left(gone, ng)
    firsts = view.firsts()
    groups = _placed(plan.groups, firsts[:ng], gone[:split], new_groups, 0)
    buckets = None if plan.buckets is None else _placed(plan.buckets, firsts[ng:], gone[split:], new_buckets, ng)
    return plan.derive(groups=groups, buckets=buckets)


def _placed(old: tuple, firsts: list[int], gone: list[int], new: list[tuple[int, object]], offset: int) -> tuple:
    """``old`` (whose entries' first members are ``firsts``) without the entries at indices ``gone``
    (ascending, from ``offset``), with the ``new`` (first member, entry) pairs placed by their first
    member: every entry in order of its first member where ``old`` was (a canonical plan's are).
    Where ``old`` was not, all of them sorted (members are disjoint: no two share a first member),
    and entries without members (first member -1) left out."""
    if firsts != sorted(firsts) or (firsts and firsts[0] < 0):
        dropped = set(gone)
        items = [(f, x) for k, (f, x) in enumerate(zip(firsts, old)) if k + offset not in dropped and f >= 0]
        return tuple(x for _, x in sorted(items + new, key=lambda t: t[0]))
    if not gone and not new:
        return old
    out, keys = list(old), list(firsts)
    for k in reversed(gone):
        del out[k - offset]
        del keys[k - offset]
    for f, x in sorted(new, key=lambda t: t[0]):
        j = bisect.bisect_left(keys, f)
        out.insert(j, x)
        keys.insert(j, f)
    return tuple(out)


def _joins_a_cut(plan: FusionPlan, ctx: MoveContext, members: Sequence[int]) -> bool:
    """Whether a group of ``members`` would hold both ends of one of the plan's cuts, or a gather
    anchor that is not its output (the barrier reads an anchor from outside its group)."""
    if not plan.cuts and not plan.gather_after:
        return False
    mset = {ctx.names[i] for i in members}
    if any(p in mset and c in mset for p, c in plan.cuts):
        return True
    if plan.gather_after:
        inside = set(members)
        for _, a in plan.gather_after:
            if a in mset:
                users = ctx.succ[ctx.index[a]]
                if users and all(u in inside for u in users):
                    return True
    return False


# -- op-fusion moves ---------------------------------------------------------------------------
def _group_members(view: _View, node: int) -> tuple[int, ...]:
    c = view.cluster_of(node)
    return view.clusters[c] if 0 <= c < view.n_groups else (node,)


def fuse(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Fuses two adjacent fusible groups, a fusible op into an adjacent group, or two adjacent ops."""
    if not ctx.fusible_nodes:
        return None
    view = _view(plan, ctx)
    for _ in range(_TRIES):
        x = rng.choice(ctx.fusible_nodes)
        y = rng.choice(ctx.fusible_nbrs[x])
        cx, cy = view.cluster_of(x), view.cluster_of(y)
        if cx >= 0 and cx == cy:
            continue
        merged = sorted({*_group_members(view, x), *_group_members(view, y)})
        if _n_outputs(ctx, merged) != 1 or _joins_a_cut(plan, ctx, merged):
            continue
        ed = _Edit(view)
        for c in (cx, cy):
            if c >= 0:
                ed.remove(c)
        ed.add_group(merged)  # one output: no cycle possible (see _on_cycle)
        return _finish(ed, ctx)
    return None


def split_group(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Splits a group at a topological cut (each part keeps one output); sometimes dissolves it."""
    view = _view(plan, ctx)
    if not view.n_groups:
        return None
    for _ in range(_TRIES):
        c = rng.randrange(view.n_groups)
        m = view.clusters[c]
        ed = _Edit(view)
        ed.remove(c)
        if len(m) == 2 or rng.random() < 0.15:
            return _finish(ed, ctx)
        k = rng.randrange(1, len(m))
        a, b = m[:k], m[k:]
        if (len(a) > 1 and _n_outputs(ctx, a) != 1) or (len(b) > 1 and _n_outputs(ctx, b) != 1):
            continue
        if _joins_a_cut(plan, ctx, a) or _joins_a_cut(plan, ctx, b):  # an anchor left inside a part
            continue
        ed.add_group(a)  # one output each: no cycle possible (see _on_cycle)
        ed.add_group(b)
        return _finish(ed, ctx)
    return None


def move_op(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Moves an op on a group's boundary into the adjacent group (or pairs it with an adjacent op)."""
    view = _view(plan, ctx)
    if not view.n_groups:
        return None
    for _ in range(_TRIES):
        a = rng.randrange(view.n_groups)
        src = view.clusters[a]
        x = rng.choice(src)
        outside = [y for y in ctx.fusible_nbrs[x] if view.cluster_of(y) != a]
        if not outside:
            continue
        y = rng.choice(outside)
        cy = view.cluster_of(y)
        rest = tuple(i for i in src if i != x)
        dst = sorted((*_group_members(view, y), x))
        if len(rest) > 1 and (_n_outputs(ctx, rest) != 1 or _joins_a_cut(plan, ctx, rest)):
            continue
        if _n_outputs(ctx, dst) != 1 or _joins_a_cut(plan, ctx, dst):
            continue
        ed = _Edit(view)
        ed.remove(a)
        if cy >= 0:
            ed.remove(cy)
        ed.add_group(rest)  # one output each: no cycle possible (see _on_cycle)
        ed.add_group(dst)
        return _finish(ed, ctx)
    return None


def toggle_xla_fusion(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan:
    """Switches XLA's own fusion pass between "extend" (runs after the plan's) and "off"."""
    return plan.derive(xla_fusion="off" if plan.xla_fusion == "extend" else "extend")


# -- bucket moves ------------------------------------------------------------------------------
def _one_class(ctx: MoveContext, members: Sequence[int]) -> bool:
    """Whether ``members`` are all of one bucket class. A start plan may hold a "tuple" bucket of
    several dtypes (valid); a merge or a split rebuilds buckets "concat", which needs one dtype, so
    bucket moves leave such a bucket as it is."""
    cls = ctx.ar_class
    return all(cls[m] == cls[members[0]] for m in members)


def _bucket_neighbours(view: _View, ctx: MoveContext) -> list[tuple[int, int]]:
    """(bucket cluster, next bucket cluster of the same class in production order) pairs
    (buckets of several classes left out: see :func:`_one_class`)."""
    by_class: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for k in range(view.n_groups, len(view.clusters)):
        m = view.clusters[k]
        if _one_class(ctx, m):
            by_class[ctx.ar_class[m[0]]].append((m[0], k))
    pairs = []
    for items in by_class.values():
        items.sort()
        pairs += [(a[1], b[1]) for a, b in zip(items, items[1:])]
    return pairs


def _draw_neighbours(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> Iterator[tuple[_View, int, int]]:
    """Up to ``_TRIES`` draws, without replacement, of (view, bucket, next bucket of its class)."""
    if plan.buckets is None:
        return
    view = _view(plan, ctx)
    pairs = _bucket_neighbours(view, ctx)
    for _ in range(_TRIES):
        if not pairs:
            return
        a, b = pairs.pop(rng.randrange(len(pairs)))
        yield view, a, b


def merge_buckets(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Merges a bucket with the next bucket of its class in production order."""
    for view, a, b in _draw_neighbours(plan, ctx, rng):
        ed = _Edit(view)
        ed.remove(a)
        ed.remove(b)
        k = ed.add_bucket(view.clusters[a] + view.clusters[b])
        if _on_cycle(ctx, ed, k):
            continue
        return _checked(_finish(ed, ctx), ctx)
    return None


def split_bucket(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Splits a bucket of several all-reduces in two, at a random point of production order."""
    if plan.buckets is None:
        return None
    view = _view(plan, ctx)
    many = [k for k in range(view.n_groups, len(view.clusters))
            if len(view.clusters[k]) > 1 and _one_class(ctx, view.clusters[k])]
    if not many:
        return None
    for _ in range(_TRIES):
        c = rng.choice(many)
        m = view.clusters[c]
        cut = rng.randrange(1, len(m))
        ed = _Edit(view)
        ed.remove(c)
        ka, kb = ed.add_bucket(m[:cut]), ed.add_bucket(m[cut:])
        if _on_cycle(ctx, ed, ka) or _on_cycle(ctx, ed, kb):
            continue
        return _checked(_finish(ed, ctx), ctx)
    return None


def shift_gradient(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Moves the last all-reduce of a bucket into the next bucket of its class, or the first back."""
    for view, a, b in _draw_neighbours(plan, ctx, rng):
        ma, mb = view.clusters[a], view.clusters[b]
        forward = rng.random() < 0.5
        if forward and len(ma) < 2 or not forward and len(mb) < 2:
            forward = not forward
            if forward and len(ma) < 2 or not forward and len(mb) < 2:
                continue
        if forward:
            na, nb, recv = ma[:-1], (ma[-1], *mb), 1
        else:
            na, nb, recv = (*ma, mb[0]), mb[1:], 0
        ed = _Edit(view)
        ed.remove(a)
        ed.remove(b)
        ka, kb = ed.add_bucket(na), ed.add_bucket(nb)
        donor = ka if forward else kb
        if _on_cycle(ctx, ed, kb if recv else ka) or _on_cycle(ctx, ed, donor):
            continue
        return _checked(_finish(ed, ctx), ctx)
    return None


def switch_build(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Switches a bucket between "concat" (one all-reduce) and "rs_ag" (reduce-scatter + all-gather),
    or, for a bucket of gradient scatters only (``ctx.ar_scatterable``) that scatter alike
    (``ctx.ar_scatter_way``), between "concat" and "scatter" (one reduce-scatter; on a data x fsdp
    mesh's gradients reduced over both axes, then an all-reduce of the shard over "data").

    "tuple" buckets are left alone (inside a shard_map body jaxlib cannot export them), and only
    buckets whose replica groups have a known size may become "rs_ag". A "concat" bucket that may
    become either is switched to "scatter" or "rs_ag" with equal odds. On a graph without gradient
    scatters the move draws as before.
    """
    if not plan.buckets:
        return None
    idx = ctx.index
    scatterable = ctx.ar_scatterable
    grouped = {idx[n] for g in plan.groups for n in g} if scatterable and plan.groups else set()

    def scatters(b: Bucket) -> bool:
        return (bool(scatterable) and all(idx[m] in scatterable and grouped.isdisjoint(scatterable[idx[m]])
                                          for m in b.members)
                and len({ctx.ar_scatter_way[idx[m]] for m in b.members}) == 1)

    ok = [i for i, b in enumerate(plan.buckets)
          if b.build in ("rs_ag", "scatter")
          or (b.build == "concat" and (idx[b.members[0]] in ctx.ar_splittable or scatters(b)))]
    if not ok:
        return None
    i = rng.choice(ok)
    b = plan.buckets[i]
    if b.build != "concat":
        build = "concat"
    elif not scatters(b):
        build = "rs_ag"
    elif idx[b.members[0]] not in ctx.ar_splittable:
        build = "scatter"
    else:
        build = "scatter" if rng.random() < 0.5 else "rs_ag"
    new = Bucket(b.members, build)
    return plan.derive(buckets=plan.buckets[:i] + (new,) + plan.buckets[i + 1:])


# -- cuts --------------------------------------------------------------------------------------
def _cut_key(ctx: MoveContext, cut: tuple[str, str]) -> tuple[int, int]:
    return ctx.index[cut[0]], ctx.index[cut[1]]


def add_cut(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Cuts one more operand edge between two fusible ops (not inside one planned group)."""
    if not ctx.cut_edges:
        return None
    have = set(plan.cuts)
    names = ctx.names
    for _ in range(_TRIES):
        p, c = rng.choice(ctx.cut_edges)
        cut = (names[p], names[c])
        if cut in have or c in _group_members(_view(plan, ctx), p):
            continue
        return plan.derive(cuts=tuple(sorted((*plan.cuts, cut), key=lambda k: _cut_key(ctx, k))))
    return None


def remove_cut(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Drops one of the plan's cuts."""
    if not plan.cuts:
        return None
    i = rng.randrange(len(plan.cuts))
    return plan.derive(cuts=plan.cuts[:i] + plan.cuts[i + 1:])


# -- gather buckets ----------------------------------------------------------------------------
def _gather_clusters(plan: FusionPlan, ctx: MoveContext) -> tuple[list[tuple[int, ...]], list[tuple[str, ...]]]:
    """(movable, kept): the plan's gather buckets of parameter all-gathers and each parameter
    all-gather in none (alone), as sorted node indices; and the buckets moves leave as they are
    (holding an all-gather outside ``ctx.gather_class``, or several classes, or a loop body's)."""
    idx, cls = ctx.index, ctx.gather_class
    movable: list[tuple[int, ...]] = []
    kept: list[tuple[str, ...]] = []
    held: set[int] = set()
    for names in plan.gather_buckets or ():
        if any(nm not in idx for nm in names):  # a loop body's all-gathers (kept as they are)
            kept.append(names)
            continue
        m = tuple(sorted(idx[nm] for nm in names))
        held.update(m)
        if all(i in cls for i in m) and len({cls[i] for i in m}) == 1:
            movable.append(m)
        else:
            kept.append(names)
    movable += [(i,) for i in cls if i not in held]
    return movable, kept


def _with_gathers(plan: FusionPlan, ctx: MoveContext, movable: Sequence[tuple[int, ...]],
                  kept: Sequence[tuple[str, ...]], made: Sequence[tuple[int, ...]]) -> FusionPlan | None:
    """``plan`` with these gather buckets, canonical: members in program order, buckets by their
    first member, none of one all-gather; None where a bucket the move ``made`` breaks a rule of
    :func:`disco.plans.check.check_gather_buckets` (a move within one class never does; the rules
    stay in that one place)."""
    names = ctx.names
    try:
        plan_check.check_gather_buckets(tuple(tuple(names[i] for i in m) for m in made if len(m) > 1), ctx.graph,
                                        ctx.index, {})  # all-gathers are in no group
    except ValueError:  # pragma: no cover
        return None
    buckets = [tuple(names[i] for i in m) for m in movable if len(m) > 1] + list(kept)
    end = len(names)  # (a loop body's buckets after the graph's own, in the plan's order)
    buckets.sort(key=lambda b: min(ctx.index.get(n, end) for n in b))
    return plan.derive(gather_buckets=tuple(buckets))


def merge_gather_buckets(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Merges a gather bucket (or a parameter all-gather in none) with the next one of its class
    in program order."""
    if not ctx.gather_class:
        return None
    movable, kept = _gather_clusters(plan, ctx)
    by_class: dict[int, list[tuple[int, ...]]] = collections.defaultdict(list)
    for m in movable:
        by_class[ctx.gather_class[m[0]]].append(m)
    pairs = []
    for items in by_class.values():
        items.sort()
        pairs += list(zip(items, items[1:]))
    if not pairs:
        return None
    for _ in range(_TRIES):
        if not pairs:
            return None
        a, b = pairs.pop(rng.randrange(len(pairs)))
        merged = tuple(sorted(a + b))
        if plan.gather_after and not _anchors_fit(plan, ctx, merged):
            continue  # an anchor of one part waits for the other part's use: the bucket would wait on itself
        rest = [m for m in movable if m != a and m != b]
        return _checked(_with_gathers(plan, ctx, [*rest, merged], kept, [merged]), ctx)
    return None


def split_gather_bucket(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Splits a gather bucket of parameter all-gathers in two at a random point of program order."""
    if not ctx.gather_class or not plan.gather_buckets:
        return None
    movable, kept = _gather_clusters(plan, ctx)
    many = [m for m in movable if len(m) > 1]
    if not many:
        return None
    m = rng.choice(many)
    cut = rng.randrange(1, len(m))
    rest = [x for x in movable if x != m]
    return _with_gathers(plan, ctx, [*rest, m[:cut], m[cut:]], kept, [m[:cut], m[cut:]])


# -- gather anchors ----------------------------------------------------------------------------
def _anchors_of(plan: FusionPlan, ctx: MoveContext) -> dict[int, list[int]]:
    """Per all-gather node, its anchors' nodes (memoised for the last plan)."""
    hit = ctx.memo.get("anchors")
    if hit is not None and hit[0] is plan:
        return hit[1]
    out: dict[int, list[int]] = collections.defaultdict(list)
    for g, a in plan.gather_after:
        out[ctx.index[g]].append(ctx.index[a])
    ctx.memo["anchors"] = (plan, out)
    return out


def _limit(ctx: MoveContext, members: Sequence[int]) -> int:
    """The program position an anchor of any of ``members`` (one gather bucket) must stay below: their
    first reader's (then no anchor is downstream of the bucket)."""
    n = len(ctx.names)
    return min(ctx.first_read.get(m, n) for m in members)


def _anchors_fit(plan: FusionPlan, ctx: MoveContext, members: Sequence[int]) -> bool:
    """Whether every anchor of ``members`` (one gather bucket) is before the bucket's first reader."""
    anchors = _anchors_of(plan, ctx)
    limit = _limit(ctx, members)
    return all(a < limit for m in members for a in anchors.get(m, ()))


def _checked(plan: FusionPlan | None, ctx: MoveContext) -> FusionPlan | None:
    """``plan``, or None where an anchor downstream of an all-reduce (``ctx.anchors_below_reduce``) lets
    its contraction form a cycle (checked whole: bucket moves' all-reduce reachability has no anchors)."""
    if plan is None or not plan.gather_after or not ctx.anchors_below_reduce:
        return plan
    return None if plan_check.contraction_cycle(plan, ctx.graph) is not None else plan


def _bucket_of(plan: FusionPlan, ctx: MoveContext, g: int) -> tuple[int, ...]:
    for names in plan.gather_buckets or ():
        members = tuple(ctx.index.get(n, -1) for n in names)
        if g in members:
            return members
    return (g,)


def shift_anchor(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Moves one parameter all-gather's anchor to the previous candidate of ``ctx.anchors`` (earlier:
    more prefetch; before the first, no anchor) or the next one (later: less prefetch, the gathered
    parameter held for less of the step), or anchors an unanchored gather on the first or the last
    candidate before its bucket's first reader."""
    if not ctx.anchors or not ctx.gather_class:
        return None
    nodes, names = ctx.graph.nodes, ctx.names
    gathers = sorted(ctx.gather_class)
    anchors = _anchors_of(plan, ctx)
    view = _view(plan, ctx)
    for _ in range(_TRIES):
        g = rng.choice(gathers)
        limit = _limit(ctx, _bucket_of(plan, ctx, g))
        comp = nodes[g].computation
        cands = [a for a in ctx.anchors if a < limit and nodes[a].computation == comp]
        have = anchors.get(g, [])
        if not cands and not have:
            continue
        old = rng.choice(have) if have else None
        if old is None:
            new: int | None = cands[0] if rng.random() < 0.5 else cands[-1]
        else:
            earlier = [a for a in cands if a < old]
            later = [a for a in cands if a > old]
            go_early = rng.random() < 0.5 if later else True
            new = (earlier[-1] if earlier else None) if go_early else later[0]
        if new is not None and new in have:
            continue
        if new is not None:
            c = view.cluster_of(new)
            if 0 <= c < view.n_groups and _joins_a_cut(plan.derive(gather_after=((names[g], names[new]),)), ctx,
                                                        view.clusters[c]):
                continue  # it is inside a group, not its output
        pairs = [p for p in plan.gather_after if old is None or p != (names[g], names[old])]
        if new is not None:
            pairs.append((names[g], names[new]))
        pairs.sort(key=lambda p: (ctx.index[p[0]], ctx.index[p[1]]))
        child = _checked(plan.derive(gather_after=tuple(pairs)), ctx)
        if child is not None:
            return child
    return None


def reset_gather_buckets(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Leaves every all-gather to XLA again (``gather_buckets=None``)."""
    if plan.gather_buckets is None:
        return None
    return plan.derive(gather_buckets=None)


# -- compile options ---------------------------------------------------------------------------
def with_option(plan: FusionPlan, opt: plan_options.CompileOption, value: str) -> FusionPlan:
    """``plan`` with ``opt`` set to ``value`` (left out when it is XLA's default), options sorted."""
    opts = {k: v for k, v in plan.compile_options if k != opt.key}
    if value != opt.default:
        opts[opt.key] = value
    return plan.derive(compile_options=tuple(sorted(opts.items())))


def flip_option(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Flips one boolean compile option of the backend's table, or switches a choice option to
    another of its values."""
    flips = [o for o in ctx.options if o.kind in ("bool", "choice")]
    if not flips:
        return None
    opt = rng.choice(flips)
    now = plan_options.value(plan.compile_options, opt.key, ctx.backend)
    if opt.kind == "choice":
        return with_option(plan, opt, rng.choice([v for v in opt.values if v != now]))
    return with_option(plan, opt, str(not plan_options.as_bool(now)))


def step_option(plan: FusionPlan, ctx: MoveContext, rng: random.Random) -> FusionPlan | None:
    """Steps one size option of the backend's table to the next value of its table, up or down."""
    sizes = [o for o in ctx.options if o.kind == "bytes"]
    if not sizes:
        return None
    opt = rng.choice(sizes)
    now = int(plan_options.value(plan.compile_options, opt.key, ctx.backend))
    vals = [int(v) for v in opt.values]
    up = rng.random() < 0.5
    if up and now >= vals[-1] or not up and now <= vals[0]:
        up = not up
    nxt = min((v for v in vals if v > now), default=None) if up else max((v for v in vals if v < now), default=None)
    if nxt is None:
        return None
    return with_option(plan, opt, str(nxt))


MOVES: dict[str, Move] = {
    "fuse": fuse,
    "split_group": split_group,
    "move_op": move_op,
    "merge_buckets": merge_buckets,
    "split_bucket": split_bucket,
    "shift_gradient": shift_gradient,
    "toggle_xla_fusion": toggle_xla_fusion,
    "switch_build": switch_build,
    "add_cut": add_cut,
    "remove_cut": remove_cut,
    "flip_option": flip_option,
    "step_option": step_option,
    "merge_gather_buckets": merge_gather_buckets,
    "split_gather_bucket": split_gather_bucket,
    "reset_gather_buckets": reset_gather_buckets,
    "shift_anchor": shift_anchor,
}

# Relative frequencies for random_move: fusion moves dominate since there are far more ops
# than gradients; toggling XLA's fusion is one bit. Moves that do not apply (no group to
# split, no size option on CPU) are redrawn.
DEFAULT_WEIGHTS: dict[str, float] = {
    "fuse": 4.0, "split_group": 1.0, "move_op": 1.0, "merge_buckets": 1.5, "split_bucket": 1.0,
    "shift_gradient": 1.5, "toggle_xla_fusion": 0.2, "switch_build": 0.3,
    "add_cut": 0.5, "remove_cut": 0.3, "flip_option": 0.3, "step_option": 0.5,
}
# Added to DEFAULT_WEIGHTS where the graph has parameter all-gathers (``ctx.gather_class``): as often
# as the all-reduce bucket moves; going back to XLA's all-gathers is one bit, as toggling its fusion.
GATHER_WEIGHTS: dict[str, float] = {
    "merge_gather_buckets": 1.5, "split_gather_bucket": 1.0, "reset_gather_buckets": 0.2, "shift_anchor": 1.0,
}
_WITH_GATHERS = {**DEFAULT_WEIGHTS, **GATHER_WEIGHTS}


def random_move(plan: FusionPlan, ctx: MoveContext, rng: random.Random,
                weights: Mapping[str, float] | None = None, tries: int = 8) -> FusionPlan | None:
    """Applies one move drawn by ``weights`` (default :data:`DEFAULT_WEIGHTS`, and
    :data:`GATHER_WEIGHTS` after them where ``ctx`` has parameter all-gathers); None if none applied.

    Raises:
      ValueError: for a weight naming no move.
    """
    if weights is None:
        weights = _WITH_GATHERS if ctx.gather_class else DEFAULT_WEIGHTS
    unknown = sorted(set(weights) - set(MOVES))
    if unknown:
        raise ValueError(f"move weights name unknown moves {unknown}; expected some of {sorted(MOVES)}")
    names = [k for k, w in weights.items() if w > 0]
    cum = []
    total = 0.0
    for k in names:
        total += weights[k]
        cum.append(total)
    if not names:
        return None
    for _ in range(tries):
        name = names[bisect.bisect_right(cum, rng.random() * total)]
        child = MOVES[name](plan, ctx, rng)
        if child is not None:
            return child
    return None


def _canonical_in_loops(gathers: tuple[tuple[str, ...], ...], ctx: MoveContext) -> tuple[tuple[str, ...], ...]:
    """The gather buckets of loop bodies' all-gathers (after the graph's own), members and buckets in
    (loop, body position) order."""
    inside = [b for b in gathers if len(b) > 1 and b[0] not in ctx.index]
    if not inside:
        return ()
    pos = {n.name: (k, i) for k, lp in enumerate(ctx.graph.loops) for i, n in enumerate(lp.body.nodes)}
    return tuple(sorted((tuple(sorted(b, key=pos.__getitem__)) for b in inside), key=lambda b: pos[b[0]]))


def canonical(plan: FusionPlan, ctx: MoveContext) -> FusionPlan:
    """``plan`` in the canonical form moves produce (same meaning, comparable digests)."""
    idx, names = ctx.index, ctx.names
    groups = sorted((tuple(sorted(idx[n] for n in g)) for g in plan.groups if len(g) > 1),
                    key=lambda m: m[0])
    buckets = None
    if plan.buckets is not None:
        bs = sorted((tuple(sorted(idx[n] for n in b.members)) for b in plan.buckets), key=lambda m: m[0])
        builds = {tuple(sorted(idx[n] for n in b.members)): b.build for b in plan.buckets}
        buckets = tuple(Bucket(tuple(names[i] for i in m), builds[m]) for m in bs)
    cuts = tuple(sorted(dict.fromkeys(plan.cuts), key=lambda k: _cut_key(ctx, k)))
    gathers = plan.gather_buckets
    if gathers is not None:
        gs = sorted((tuple(sorted(idx[n] for n in b)) for b in gathers if len(b) > 1 and b[0] in idx),
                    key=lambda m: m[0])
        gathers = tuple(tuple(names[i] for i in m) for m in gs) + _canonical_in_loops(gathers, ctx)
    after = tuple(sorted(dict.fromkeys(plan.gather_after), key=lambda p: (idx[p[0]], idx[p[1]])))
    return plan.replace(groups=tuple(tuple(names[i] for i in m) for m in groups), buckets=buckets, cuts=cuts,
                        compile_options=tuple(sorted(plan.compile_options)), gather_buckets=gathers,
                        gather_after=after)

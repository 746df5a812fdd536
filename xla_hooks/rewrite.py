"""Rewriting pre-optimisation HLO text so that it carries a plan (pure Python).

* Each fusion group becomes one ``fusion(...), kind=kLoop`` instruction calling a
  new fused computation; a group with several outputs returns a tuple read back
  with ``get-tuple-element``.
* Each bucket becomes one all-reduce: ``tuple`` builds a variadic all-reduce;
  ``concat`` reshapes every member to 1-D, concatenates, reduces once and
  slices the result back; ``rs_ag`` does the same with a reduce-scatter and an
  all-gather in place of the all-reduce, the concatenation ending with zeros up to
  a multiple of the replica group size; ``scatter`` (gradient scatters only) lays each
  member out as rows by block, concatenates them and reduce-scatters once (then, where two or
  more devices keep each block, as on a data x fsdp mesh, all-reduces the shard over them), each
  member's block replacing its dynamic-slices.

* Each gather bucket becomes one all-gather: every member's operand (its shard) is
  reshaped to 1-D and concatenated, gathered along dimension 0 over the members' replica
  groups, and each member's piece of every device's row is sliced back out of the result
  (``[devices, total]``), reshaped to ``[devices, *shard]`` and moved into place along the
  member's own gather dimension.

* Each gather anchor (all-gather, anchor) makes the all-gather read its shard through an
  ``opt-barrier`` of the tuple ``(shard, anchor, ...)`` (element 0: the shard; the anchors of
  one all-gather share one barrier), so the gather cannot start before the anchor's value exists.
  It is applied before the gather buckets, so a bucket's concatenation reads the barrier.

* Each cut (producer, consumer) makes the consumer read the producer through an
  ``opt-barrier``: XLA does not fuse across a barrier (XLA:CPU only with
  ``cse_barrier_expander`` off, which ``FusionPlan.compiler_options`` arranges). Cuts of
  one producer share one barrier.

Users of a rewritten instruction keep referring to its original name (a
get-tuple-element, slice or reshape now carries it), except single-output
fusions, whose users are renamed to the fusion. Every touched computation is
re-emitted in a topological order.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

from disco.ir.hlo_module import Computation, Instruction, Module
from disco.ir.hlo_parse import parse_module
from disco.ir.scatter_blocks import ScatterBlock, scatter_blocks
from disco.ir.opcodes import LITERAL_OPERAND_OPCODES
from disco.plans.plan import FusionPlan

PREFIX = "disco"


@dataclasses.dataclass
class _Line:
    """A mutable instruction being emitted."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: list[tuple[str, str]]
    literal: str | None = None  # raw operand text for constant/parameter/iota
    is_root: bool = False
    order: float = 0.0  # position hint for the topological emission

    def text(self) -> str:
        body = self.literal if self.literal is not None else ", ".join(f"%{o}" for o in self.operands)
        attrs = "".join(f", {k}={v}" if v != "" else f", {k}" for k, v in self.attrs)
        root = "ROOT " if self.is_root else ""
        return f"  {root}%{self.name} = {self.shape} {self.opcode}({body}){attrs}"


def _line(ins: Instruction, order: float) -> _Line:
    return _Line(
        name=ins.name, shape=ins.shape, opcode=ins.opcode, operands=list(ins.operands),
        attrs=list(ins.attrs.items()),
        literal=ins.raw_operands if ins.opcode in LITERAL_OPERAND_OPCODES else None,
        is_root=ins.is_root, order=order)


def _topological(lines: list[_Line]) -> list[_Line]:
    """Kahn's algorithm, ties broken by the original position."""
    by_name = {ln.name: ln for ln in lines}
    indeg = {ln.name: 0 for ln in lines}
    users: dict[str, list[str]] = collections.defaultdict(list)
    for ln in lines:
        for op in set(ln.operands):
            if op in by_name:
                indeg[ln.name] += 1
                users[op].append(ln.name)
    heap = [(ln.order, ln.name) for ln in lines if indeg[ln.name] == 0]
    heapq.heapify(heap)
    out: list[_Line] = []
    while heap:
        _, name = heapq.heappop(heap)
        out.append(by_name[name])
        for u in users[name]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (by_name[u].order, u))
    if len(out) != len(lines):
        stuck = sorted(n for n, d in indeg.items() if d > 0)[:5]
        raise ValueError(f"the rewritten computation has a cycle through {stuck}; the plan must be validated first")
    return out


def _shape_without_layout(shape: str) -> str:
    import re

    return re.sub(r"\{[^{}]*\}", "", shape)


def _group_size(name: str, attrs: list[tuple[str, str]]) -> int:
    from disco.ir.replica_groups import replica_group_size

    p = replica_group_size(dict(attrs).get("replica_groups"))
    if p is None:  # plan validation rejects this; guard the text all the same
        raise ValueError(f"bucket {name}: rs_ag needs replica groups of one known size")
    return p


def _zero_tail(name: str, dtype: str, n: int, order: float) -> list[_Line]:
    """``n`` zeros of ``dtype``, named ``name``.tail: the padding an ``rs_ag`` bucket's
    concatenation ends with, so that no pad copies the whole buffer once more."""
    zero = f"{name}.zero"
    return [_Line(zero, f"{dtype}[]", "constant", [], [], literal="0", order=order),
            _Line(f"{name}.tail", f"{dtype}[{n}]", "broadcast", [zero], [("dimensions", "{}")], order=order)]


def _scatter_gather(name: str, cat: str, dtype: str, padded: int, p: int, attrs: list[tuple[str, str]],
                    order: float) -> list[_Line]:
    """An all-reduce of ``cat`` (``dtype[padded]``, ``padded`` a multiple of the replica group
    size ``p``) as reduce-scatter + all-gather, result named ``name`` (``dtype[padded]``).

    Each device reduces one ``1/p`` slice and the all-gather rebuilds the whole buffer. The
    reduce-scatter keeps the all-reduce's attributes (channel, groups, reduction); the all-gather
    drops ``to_apply``.
    """
    dims = [("dimensions", "{0}")]
    scattered = f"{name}.scatter"
    return [_Line(scattered, f"{dtype}[{padded // p}]", "reduce-scatter", [cat], attrs + dims, order=order),
            _Line(name, f"{dtype}[{padded}]", "all-gather", [scattered],
                  [(key, v) for key, v in attrs if key != "to_apply"] + dims, order=order)]


def _rewrite_buckets(lines: list[_Line], buckets: Sequence[Sequence[str]], builds: Sequence[str],
                     start_id: int, blocks: Mapping[str, ScatterBlock] | None = None,
                     channels: Iterator[int] | None = None) -> list[_Line]:
    """The buckets' all-reduces rewritten; ``blocks`` (by all-reduce name, :func:`scatter_blocks` of
    the computation) says how a "scatter" bucket's members scatter, ``channels`` gives the channel
    ids of the all-reduces a "scatter" bucket adds (where two or more devices keep each block)."""
    by_name = {ln.name: ln for ln in lines}
    out = [ln for ln in lines]
    for k, (members, build) in enumerate(zip(buckets, builds), start=start_id):
        ars = [by_name[m] for m in members]
        if len(members) == 1 and (build == "tuple" or ars[0].shape.startswith("(")):
            continue  # a bucket of one is the all-reduce itself (a tuple-shaped one has no flat buffer)
        first = ars[0]
        attrs = [(key, v) for key, v in first.attrs if key != "metadata"]
        attrs.append(("metadata", f'{{op_name="{PREFIX}_bucket_{k}"}}'))
        order = max(a.order for a in ars) + 0.001
        removed = set(members)
        out = [ln for ln in out if ln.name not in removed]
        bname = f"{PREFIX}.bucket.{k}"
        if build == "scatter":
            if blocks is None or ars[0].name not in blocks or blocks[ars[0].name].dim is None:
                raise ValueError(f"bucket {k}: {ars[0].name!r} is no gradient scatter of this computation; "
                                 "the plan must be validated first")
            out = _scatter_bucket(out, bname, ars, attrs, order, blocks[ars[0].name],
                                  channels if channels is not None else itertools.count(1 << 20))
        elif build == "tuple":
            shape = "(" + ", ".join(a.shape for a in ars) + ")"
            out.append(_Line(bname, shape, "all-reduce", [a.operands[0] for a in ars], attrs, order=order))
            for j, a in enumerate(ars):
                out.append(_Line(a.name, a.shape, "get-tuple-element", [bname], [("index", str(j))],
                                 order=order + 1e-6 * (j + 1)))
        else:
            import math
            import re

            def dims(shape: str) -> tuple[str, list[int]]:
                m = re.match(r"([a-z0-9]+)\[([^\]]*)\]", shape)
                return m.group(1), [int(d) for d in m.group(2).split(",") if d.strip()]

            dtype = dims(first.shape)[0]
            flats, offsets, total = [], [], 0
            for j, a in enumerate(ars):
                n = math.prod(dims(a.shape)[1])
                fname = f"{PREFIX}.bucket.{k}.flat.{j}"
                out.append(_Line(fname, f"{dtype}[{n}]", "reshape", [a.operands[0]], [], order=order))
                flats.append(fname)
                offsets.append((total, n))
                total += n
            cat = f"{PREFIX}.bucket.{k}.concat"
            p = _group_size(bname, attrs) if build == "rs_ag" else 1
            size = -(-total // p) * p  # rs_ag: zeros up to a multiple of the group size end the concatenation
            if size != total:
                out.extend(_zero_tail(bname, dtype, size - total, order))
                flats.append(f"{bname}.tail")
            out.append(_Line(cat, f"{dtype}[{size}]", "concatenate", flats, [("dimensions", "{0}")], order=order))
            if build == "rs_ag":
                out.extend(_scatter_gather(bname, cat, dtype, size, p, attrs, order))
            else:
                out.append(_Line(bname, f"{dtype}[{total}]", "all-reduce", [cat], attrs, order=order))
            for j, (a, (off, n)) in enumerate(zip(ars, offsets)):
                sname = f"{PREFIX}.bucket.{k}.slice.{j}"
                out.append(_Line(sname, f"{dtype}[{n}]", "slice", [bname], [("slice", f"{{[{off}:{off + n}]}}")],
                                 order=order))
                out.append(_Line(a.name, a.shape, "reshape", [sname], [], order=order + 1e-6 * (j + 1)))
    return out


def _scatter_bucket(lines: list[_Line], bname: str, ars: Sequence[_Line], attrs: list[tuple[str, str]],
                    order: float, block: ScatterBlock, channels: Iterator[int]) -> list[_Line]:
    """A "scatter" bucket: ``ars`` (all-reduces whose every user is a dynamic-slice keeping this device's
    block, all scattering as ``block`` says, as plan validation checks) as one reduce-scatter, then
    (where two or more devices keep each block) one all-reduce of the shard, their dynamic-slices replaced.

    Member ``j`` of ``n_j`` elements, cut into ``k`` blocks along dimension ``d_j``: its operand with
    ``d_j`` moved to the front (a transpose, unless ``d_j`` is 0) reshaped to ``[k, n_j / k]`` puts block
    ``b`` in row ``b``. The rows are concatenated along dimension 1 (``[k, total]``) and reduce-scattered
    along dimension 0 over ``block.scatter_groups`` (each listing one device per block in block order, so
    the ``b``-th device gets row ``b``; the all-reduce's own groups when they are those) with the
    all-reduce's reduction and channel (``[1, total]``). Over ``block.across_groups``, the devices keeping
    the same block, the row is then all-reduced (a new channel from ``channels``): each device holds its
    block reduced over the whole replica group, as the all-reduce and the dynamic-slice gave it. Member
    ``j``'s columns are reshaped (and transposed) back to the shard's shape, under the name of each of
    its dynamic-slices.
    """
    import math

    k = block.blocks
    dtype = _dims(ars[0].shape)[0]
    members = {a.name for a in ars}
    slices = {a.name: [ln for ln in lines if ln.opcode == "dynamic-slice" and ln.operands[:1] == [a.name]]
              for a in ars}
    replaced = {ln.name for sl in slices.values() for ln in sl}
    out = [ln for ln in lines if ln.name not in replaced and ln.name not in members]
    rows, pieces, total = [], [], 0
    for j, a in enumerate(ars):
        full = _dims(a.shape)[1]
        shard = _dims(slices[a.name][0].shape)[1]
        dim = next(i for i, (f, s) in enumerate(zip(full, shard)) if f != s)
        perm = [dim, *(i for i in range(len(full)) if i != dim)]
        m = math.prod(full) // k
        src = a.operands[0]
        if dim:
            moved = f"{bname}.front.{j}"
            out.append(_Line(moved, _shape(dtype, [full[i] for i in perm]), "transpose", [src],
                             [("dimensions", "{" + ",".join(map(str, perm)) + "}")], order=order))
            src = moved
        row = f"{bname}.rows.{j}"
        out.append(_Line(row, f"{dtype}[{k},{m}]", "reshape", [src], [], order=order))
        rows.append(row)
        pieces.append((a, shard, perm, total, m))
        total += m
    cat = f"{bname}.concat"
    out.append(_Line(cat, f"{dtype}[{k},{total}]", "concatenate", rows, [("dimensions", "{1}")], order=order))
    from disco.ir.replica_groups import replica_group_lists

    groups_text = _groups_attr(block.scatter_groups)
    own = dict(attrs).get("replica_groups")
    rs_attrs = [(key, v if key != "replica_groups" or replica_group_lists(own) == list(block.scatter_groups)
                 else groups_text) for key, v in attrs]
    scattered = f"{bname}.scatter" if block.across_groups else bname
    out.append(_Line(scattered, f"{dtype}[1,{total}]", "reduce-scatter", [cat], rs_attrs + [("dimensions", "{0}")],
                     order=order))
    if block.across_groups:
        ar_attrs = [(key, _groups_attr(block.across_groups) if key == "replica_groups"
                     else f"{next(channels)}" if key == "channel_id" else v) for key, v in attrs]
        out.append(_Line(bname, f"{dtype}[1,{total}]", "all-reduce", [scattered], ar_attrs, order=order))
    for j, (a, shard, perm, off, m) in enumerate(pieces):
        at = order + 1e-6 * (j + 1)
        piece = f"{bname}.piece.{j}"
        out.append(_Line(piece, f"{dtype}[1,{m}]", "slice", [bname], [("slice", f"{{[0:1], [{off}:{off + m}]}}")],
                         order=at))
        blk = f"{bname}.block.{j}"
        out.append(_Line(blk, _shape(dtype, [shard[i] for i in perm]), "reshape", [piece], [], order=at))
        src = blk
        if perm[0]:
            back = f"{bname}.back.{j}"
            inverse = [perm.index(i) for i in range(len(perm))]
            out.append(_Line(back, _shape(dtype, shard), "transpose", [blk],
                             [("dimensions", "{" + ",".join(map(str, inverse)) + "}")], order=at))
            src = back
        for ds in slices[a.name]:
            out.append(_Line(ds.name, ds.shape, "reshape", [src], [], is_root=ds.is_root, order=max(ds.order, at)))
    return out


def _groups_attr(groups: Sequence[Sequence[int]]) -> str:
    """Replica groups as HLO's explicit ``{{0,1},{2,3}}``."""
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def _dims(shape: str) -> tuple[str, list[int]]:
    import re

    m = re.match(r"([a-z0-9]+)\[([^\]]*)\]", shape)
    if m is None:
        raise ValueError(f"expected an array shape, got {shape!r}")
    return m.group(1), [int(d) for d in m.group(2).split(",") if d.strip()]


def _shape(dtype: str, dims: Sequence[int]) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


def _rewrite_gather_buckets(lines: list[_Line], buckets: Sequence[Sequence[str]], start_id: int) -> list[_Line]:
    """Each bucket of all-gathers as one all-gather of the members' concatenated shards.

    The all-gather of ``[total]`` over groups of ``p`` devices is ``[p * total]``: device ``d``'s
    concatenation at ``[d * total, (d + 1) * total)``. Reshaped to ``[p, total]``, member ``j``'s
    shards are the columns ``[off_j, off_j + n_j)`` of every row: ``[p, *shard_j]``. A member
    gathered along dimension ``k`` is that with the device axis moved before dimension ``k`` and
    merged into it (a transpose, unless ``k`` is 0, then a reshape).
    """
    import math

    by_name = {ln.name: ln for ln in lines}
    out = list(lines)
    for k, members in enumerate(buckets, start=start_id):
        if len(members) < 2:
            continue  # a bucket of one is the all-gather itself
        ags = [by_name[m] for m in members]
        first = ags[0]
        p = _group_size(f"gather bucket {k}", first.attrs)
        attrs = [(key, v) for key, v in first.attrs if key not in ("metadata", "dimensions")]
        attrs += [("dimensions", "{0}"), ("metadata", f'{{op_name="{PREFIX}_gather_bucket_{k}"}}')]
        order = min(a.order for a in ags) - 0.001  # where its first member was: gathers are wanted early
        out = [ln for ln in out if ln.name not in set(members)]
        name = f"{PREFIX}.gather.{k}"
        dtype = _dims(first.shape)[0]
        flats, pieces, total = [], [], 0
        for j, a in enumerate(ags):
            shard = _dims(by_name[a.operands[0]].shape)[1] if a.operands[0] in by_name else None
            full = _dims(a.shape)[1]
            dim = int(dict(a.attrs)["dimensions"].strip("{} "))
            if shard is None:  # the operand is a parameter of another computation: derive the shard
                shard = [d // p if i == dim else d for i, d in enumerate(full)]
            n = math.prod(shard)
            flat = f"{name}.flat.{j}"
            out.append(_Line(flat, f"{dtype}[{n}]", "reshape", [a.operands[0]], [], order=order))
            flats.append(flat)
            pieces.append((a, shard, dim, total, n))
            total += n
        cat = f"{name}.concat"
        out.append(_Line(cat, f"{dtype}[{total}]", "concatenate", flats, [("dimensions", "{0}")], order=order))
        out.append(_Line(f"{name}.flat", f"{dtype}[{p * total}]", "all-gather", [cat], attrs, order=order))
        rows = f"{name}.rows"
        out.append(_Line(rows, f"{dtype}[{p},{total}]", "reshape", [f"{name}.flat"], [], order=order))
        for j, (a, shard, dim, off, n) in enumerate(pieces):
            at = order + 1e-6 * (j + 1)
            piece = f"{name}.piece.{j}"
            out.append(_Line(piece, f"{dtype}[{p},{n}]", "slice", [rows],
                             [("slice", f"{{[0:{p}], [{off}:{off + n}]}}")], order=at))
            devices_first = f"{name}.shards.{j}"
            out.append(_Line(devices_first, _shape(dtype, [p, *shard]), "reshape", [piece], [], order=at))
            src = devices_first
            if dim:
                perm = [*range(1, dim + 1), 0, *range(dim + 1, len(shard) + 1)]
                moved = f"{name}.moved.{j}"
                out.append(_Line(moved, _shape(dtype, [shard[i - 1] if i else p for i in perm]), "transpose",
                                 [devices_first], [("dimensions", "{" + ",".join(map(str, perm)) + "}")], order=at))
                src = moved
            out.append(_Line(a.name, a.shape, "reshape", [src], [], is_root=a.is_root, order=at))
    return out


def _rewrite_cuts(lines: list[_Line], cuts: Sequence[tuple[str, str]]) -> list[_Line]:
    """The consumer of each cut reads its producer through one ``opt-barrier`` per producer."""
    by_name = {ln.name: ln for ln in lines}
    barrier: dict[str, str] = {}
    out = list(lines)
    for prod, cons in cuts:
        name = barrier.get(prod)
        if name is None:
            p = by_name[prod]
            name = barrier[prod] = f"{PREFIX}.cut.{prod}"
            out.append(_Line(name, p.shape, "opt-barrier", [prod], [], order=p.order + 1e-4))
        c = by_name[cons]
        c.operands = [name if o == prod else o for o in c.operands]
    return out


def _rewrite_gather_after(lines: list[_Line], pairs: Sequence[tuple[str, str]]) -> list[_Line]:
    """Each all-gather of ``pairs`` reads its shard as element 0 of ``opt-barrier((shard, anchor, ...))``."""
    by_name = {ln.name: ln for ln in lines}
    anchors: dict[str, list[str]] = collections.defaultdict(list)
    for gather, anchor in pairs:
        anchors[gather].append(anchor)
    out = list(lines)
    for gather, names in anchors.items():
        g = by_name[gather]
        shard = g.operands[0]
        held = [by_name[a] for a in names]
        src = by_name.get(shard)
        shapes = [src.shape if src is not None else _operand_shape(g), *(a.shape for a in held)]
        order = max([a.order for a in held] + ([src.order] if src is not None else [])) + 1e-4
        base = f"{PREFIX}.after.{gather}"
        shape = "(" + ", ".join(shapes) + ")"
        out.append(_Line(f"{base}.tuple", shape, "tuple", [shard, *names], [], order=order))
        out.append(_Line(f"{base}.barrier", shape, "opt-barrier", [f"{base}.tuple"], [], order=order))
        out.append(_Line(f"{base}.shard", shapes[0], "get-tuple-element", [f"{base}.barrier"], [("index", "0")],
                         order=order))
        g.operands = [f"{base}.shard", *g.operands[1:]]
    return out


def _operand_shape(gather: _Line) -> str:
    """The shard an all-gather reads, from its own result and its groups (its operand is a parameter
    of another computation)."""
    p = _group_size(gather.name, gather.attrs)
    dtype, full = _dims(gather.shape)
    dim = int(dict(gather.attrs)["dimensions"].strip("{} "))
    return _shape(dtype, [d // p if i == dim else d for i, d in enumerate(full)])


def _rewrite_groups(comp: Computation, lines: list[_Line], groups: Sequence[Sequence[str]],
                    start_id: int) -> tuple[list[_Line], list[str]]:
    """Returns the parent's lines and the text of the new fused computations."""
    by_name = {ln.name: ln for ln in lines}
    users: dict[str, set[str]] = collections.defaultdict(set)
    for ln in lines:
        for op in ln.operands:
            users[op].add(ln.name)
    fused_texts: list[str] = []
    rename: dict[str, str] = {}
    out = list(lines)
    for k, group in enumerate(groups, start=start_id):
        members = [by_name[n] for n in sorted(group, key=lambda n: by_name[n].order)]
        gset = set(group)
        inputs: list[str] = []
        for m in members:
            for op in m.operands:
                if op not in gset and op not in inputs:
                    inputs.append(op)
        outputs = [m for m in members if m.is_root or (users[m.name] - gset)]
        if not outputs:
            outputs = [members[-1]]
        fname = f"{PREFIX}.fusion.{k}"
        cname = f"{PREFIX}.fused_computation.{k}"
        inner = {m.name: f"{PREFIX}.f{k}.{m.name}" for m in members}
        params = {op: f"{PREFIX}.f{k}.param.{i}" for i, op in enumerate(inputs)}
        body: list[str] = []
        for i, op in enumerate(inputs):
            body.append(f"  %{params[op]} = {by_name[op].shape} parameter({i})")
        for m in members:
            ops = [inner.get(o) or params[o] for o in m.operands]
            ln = dataclasses.replace(m, name=inner[m.name], operands=ops, is_root=False)
            body.append(ln.text())
        if len(outputs) == 1:
            root_name, root_shape = inner[outputs[0].name], outputs[0].shape
            # A single output is fed by every other member, so it is the last line.
            idx = len(inputs) + members.index(outputs[0])
            body[idx] = body[idx].replace(f"  %{root_name} =", f"  ROOT %{root_name} =", 1)
        else:
            root_shape = "(" + ", ".join(o.shape for o in outputs) + ")"
            body.append(f"  ROOT %{PREFIX}.f{k}.tuple = {root_shape} tuple("
                        + ", ".join(f"%{inner[o.name]}" for o in outputs) + ")")
        sig = ", ".join(f"{params[op]}: {by_name[op].shape}" for op in inputs)
        fused_texts.append(f"%{cname} ({sig}) -> {root_shape} {{\n"
                           + "\n".join(body) + "\n}\n")
        order = max(m.order for m in members)
        out = [ln for ln in out if ln.name not in gset]
        fusion = _Line(fname, root_shape, "fusion", inputs,
                       [("kind", "kLoop"), ("calls", f"%{cname}"),
                        ("metadata", f'{{op_name="{PREFIX}.fusion.{k}"}}')], order=order)
        out.append(fusion)
        if len(outputs) == 1:
            rename[outputs[0].name] = fname
            fusion.is_root = outputs[0].is_root
        else:
            for j, o in enumerate(outputs):
                out.append(_Line(o.name, o.shape, "get-tuple-element", [fname], [("index", str(j))],
                                 is_root=o.is_root, order=order + 1e-6 * (j + 1)))
    for ln in out:
        ln.operands = [rename.get(o, o) for o in ln.operands]
    return out, fused_texts


def apply_plan_to_text(text: str, plan: FusionPlan, module: Module | None = None) -> str:
    """Returns HLO text with the plan's fusion groups and buckets applied.

    The plan must have been validated against the graph of ``text``.
    """
    module = module or parse_module(text)
    where: dict[str, str] = {}
    for comp in module.computations:
        for ins in comp.instructions:
            where[ins.name] = comp.name
    groups_by_comp: dict[str, list[Sequence[str]]] = collections.defaultdict(list)
    for g in plan.groups:
        groups_by_comp[where[g[0]]].append(g)
    buckets_by_comp: dict[str, list[tuple[Sequence[str], str]]] = collections.defaultdict(list)
    for b in plan.buckets or ():
        buckets_by_comp[where[b.members[0]]].append((b.members, b.build))
    gathers_by_comp: dict[str, list[Sequence[str]]] = collections.defaultdict(list)
    for members in plan.gather_buckets or ():
        gathers_by_comp[where[members[0]]].append(members)
    cuts_by_comp: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for cut in plan.cuts:
        cuts_by_comp[where[cut[1]]].append(cut)
    after_by_comp: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for pair in plan.gather_after:
        after_by_comp[where[pair[0]]].append(pair)
    touched = set(groups_by_comp) | set(buckets_by_comp) | set(cuts_by_comp) | set(gathers_by_comp) | set(after_by_comp)
    if not touched:
        return text
    new_comps: dict[str, str] = {}
    extra: dict[str, list[str]] = {}
    next_group, next_bucket, next_gather = 0, 0, 0
    channels = itertools.count(1 + max((int(ins.attrs["channel_id"]) for comp in module.computations
                                        for ins in comp.instructions if ins.attrs.get("channel_id", "").isdigit()),
                                       default=0))
    for comp in module.computations:
        if comp.name not in touched:
            continue
        lines = [_line(ins, i) for i, ins in enumerate(comp.instructions)]
        lines = _rewrite_cuts(lines, cuts_by_comp.get(comp.name, []))
        lines = _rewrite_gather_after(lines, after_by_comp.get(comp.name, []))
        bks = buckets_by_comp.get(comp.name, [])
        blocks = ({b.all_reduce: b for b in scatter_blocks(comp.instructions, {})}
                  if any(b == "scatter" for _, b in bks) else None)
        lines = _rewrite_buckets(lines, [m for m, _ in bks], [b for _, b in bks], next_bucket, blocks, channels)
        next_bucket += len(bks)
        gbs = gathers_by_comp.get(comp.name, [])
        lines = _rewrite_gather_buckets(lines, gbs, next_gather)
        next_gather += len(gbs)
        grs = groups_by_comp.get(comp.name, [])
        lines, fused = _rewrite_groups(comp, lines, grs, next_group)
        next_group += len(grs)
        lines = _topological(lines)
        header = _computation_header(text, comp)
        new_comps[comp.name] = header + "\n" + "\n".join(ln.text() for ln in lines) + "\n}\n"
        extra[comp.name] = fused
    return _splice(text, module, new_comps, extra)


def _computation_header(text: str, comp: Computation) -> str:
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("{") and "=" not in s.split("(")[0]:
            head = s[len("ENTRY "):] if s.startswith("ENTRY ") else s
            name = head.split()[0].split("(")[0].lstrip("%")
            if name == comp.name:
                return line
    raise ValueError(f"computation {comp.name!r} not found in the HLO text")


def _splice(text: str, module: Module, new_comps: dict[str, str], extra: dict[str, list[str]]) -> str:
    """Replaces the touched computations' blocks, inserting fused computations before them."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        name = None
        if s.endswith("{") and "=" not in s.split("(")[0] and not s.startswith("HloModule"):
            head = s[len("ENTRY "):] if s.startswith("ENTRY ") else s
            name = head.split()[0].split("(")[0].lstrip("%")
        if name in new_comps:
            out.extend(extra[name])
            out.append(new_comps[name])
            while lines[i].strip() != "}":
                i += 1
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def copies_as_reshapes(text: str) -> str:
    """``text`` with each ``copy`` of an array written as a ``reshape`` to the same shape.

    Both are the identity on values before layout assignment. jaxlib's HLO -> MLIR conversion
    turns a copy into ``mhlo.copy``, which has no StableHLO form: the GPU's PJRT plugin, which
    takes StableHLO, refused a partitioned GSPMD step for it ("failed to legalize operation
    'mhlo.copy'", deviceless XLA:GPU, jax 0.11.2), where XLA:CPU compiles it.
    """
    module = parse_module(text)
    lines = text.split("\n")
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode == "copy" and not ins.shape.startswith("(") and ins.line:
                lines[ins.line - 1] = lines[ins.line - 1].replace(" copy(", " reshape(", 1)
    return "\n".join(lines)


def count_ops(text: str, opcodes: Iterable[str]) -> dict[str, int]:
    """Counts instructions by opcode in a module text (all computations)."""
    wanted = set(opcodes)
    module = parse_module(text)
    c: collections.Counter[str] = collections.Counter()
    for comp in module.computations:
        for ins in comp.instructions:
            if ins.opcode in wanted:
                c[ins.opcode] += 1
    return {op: c.get(op, 0) for op in wanted}

"""An emulation of XLA:GPU's fusion (priority fusion plus multi-output fusion) on disco's graph.

The simulator contracts the pre-optimisation graph into the kernels XLA would compile. On a
CPU cluster it follows XLA:CPU's loop fusion (``disco.sim.simulator``); on a GPU cluster
(``ClusterSpec.is_gpu``) it follows this module, which approximates what XLA:GPU's pipeline
does (``xla/service/gpu/transforms/priority_fusion.cc``, ``multi_output_fusion.cc``,
``gpu_fusible.cc``, the cuBLAS/cuDNN rewriters and Triton's gemm and normalisation fusions):

- **Duplicated producers** (never a kernel of their own; recomputed inside every consumer):
  ``reshape`` and ``bitcast-convert`` (bitcasts on GPU), ``broadcast``, ``iota``,
  ``partition-id`` and ``replica-id`` whose users are all kernels, and cheap unary elementwise
  ops (``convert``, ``negate``, ``copy``, ...) whose users all fuse. Priority fusion fuses a producer into *all* its consumers at once,
  duplicating it where it has several.
- **Heroes.** ``dot`` and ``convolution`` are library calls (cuBLAS, cuDNN) or Triton gemm
  fusions: each is a kernel that absorbs at most a small elementwise epilogue of the same
  size, claimed before the fusion pass as XLA's gemm/cuDNN rewriters do (the bias add and
  activation of cuBLASLt/cuDNN epilogues, Triton's epilogue fusion)
  and single-user ``transpose``/``convert``/``copy`` producers (folded into the operand
  layout or a Triton prologue). ``reduce`` is the hero of an input fusion: elementwise
  producers fuse into it, and it fuses into a consumer over its input's or its output's
  element count (Triton's softmax/normalisation diamonds, reduction epilogues); several
  reductions of one iteration space share a kernel.
- **Never fused:** ``scatter``, ``select-and-scatter``, ``sort``, ``custom-call``, ``while``,
  ``conditional``, ``rng*``, ``fft``, ``triangular-solve``, ``cholesky`` (each its own kernel).
- **Producer-consumer (multi-output) fusion.** Producers are visited consumers-first
  (descending program position; a planned group at its last member). A fusible producer
  joins its users' fusion when all its kernel users are in that one fusion and the fusion
  accepts it (rules above). When its users are in several fusions, or a value is also needed
  outside (a step output, a collective), it joins the fusion of its earliest kernel user as
  an extra output provided every other reader, a collective too, comes after all of that
  fusion's members (so the contraction cannot form a cycle: XLA's multi-output fusion checks
  the same); otherwise it roots a fusion of its own.
- **Sibling multi-output fusion.** Afterwards, fusions whose hero is a reduction and that
  read the same producer (not an effective scalar) with the same iteration space merge (e.g.
  a layer norm's mean and mean of squares), when no path joins them in the contracted graph
  (through a collective or another fusion too).

What is not modelled: XLA's cost-model vetoes (priority fusion refuses fusions its
performance model says are slower), dot merging (XLA concatenates sibling dots that share an
operand, e.g. the Q/K/V projections), layout assignment's transposes and copies. A ``while`` loop is one
unit here; the simulator prices it as its trip count times one iteration of its body's and
condition's graphs, each contracted by this same emulation (``HloGraph.loops``). The lab notebook
(docs/archive/lab-notebook.md, "XLA:GPU fusion emulation vs the compiled kernels") compares the emulation's kernels with XLA:GPU's compiled modules (scripts/tools/gpu_sim_tables.py).

Everything here is a pure function of plain per-node arrays, so the simulator computes them
once per graph (:func:`make_context`) and calls :func:`clusters` for the whole graph and for
each region a plan's groups touch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from disco.ir.opcodes import ELEMENTWISE
from disco.ir.opcodes import XLA_GPU_BITCASTS as BITCASTS
from disco.ir.opcodes import XLA_GPU_CHEAP_UNARY as CHEAP_UNARY
from disco.ir.opcodes import XLA_GPU_FREE_DUPLICATES as FREE_DUPLICATES
from disco.ir.opcodes import XLA_GPU_MATRIX_OPCODES as MATRIX_OPCODES
from disco.ir.opcodes import XLA_GPU_MATRIX_PROLOGUE as MATRIX_PROLOGUE
from disco.ir.opcodes import XLA_GPU_REDUCE_OPCODES as REDUCE_OPCODES
from disco.ir.opcodes import XLA_GPU_UNFUSIBLE_OPCODES as UNFUSIBLE_OPCODES
from disco.sim.units import group_producers

# How many epilogue ops a matrix hero takes (bias add + activation): a convolution (cuDNN's
# conv-bias-activation) or a small dot (a Triton gemm fusion, which fuses elementwise work freely).
MAX_MATRIX_EPILOGUE = 2
# A dot with at least this many output elements runs as a cuBLASLt call, whose only epilogue XLA
# forms on these models is ``BIAS`` (one ``add``; the compiled zoo modules at preset paper hold
# epilogues ``DEFAULT`` and ``BIAS`` only: activations stay loop fusions).
LARGE_GEMM_ELEMENTS = 1 << 20


def _epilogue_ops(opcode: str, out_elements: int) -> tuple[int, frozenset[str] | None]:
    """(most epilogue ops, the opcodes allowed or None for any elementwise) of a matrix hero."""
    if opcode == "dot" and out_elements >= LARGE_GEMM_ELEMENTS:
        return 1, frozenset({"add"})
    return MAX_MATRIX_EPILOGUE, None


def is_fusible(opcode: str) -> bool:
    """True for ops XLA:GPU fuses with producers and consumers (elementwise, data movement, reduce)."""
    return opcode not in UNFUSIBLE_OPCODES and opcode not in MATRIX_OPCODES


@dataclasses.dataclass(frozen=True)
class GpuFusionContext:
    """Per-graph inputs of the emulation (plan-independent; built by :func:`make_context`).

    Attributes:
      opcodes: each node's opcode.
      out_elements: each node's output elements.
      in_elements: each node's first operand's elements (its iteration space for a reduce).
      users: each real kernel node's kernel users (through duplicated producers), sorted.
      outside: whether a node's value is also read by a non-kernel (a step output, a collective)
        or by nobody.
      first_outside: each node's earliest non-kernel reader (program position, through
        duplicated producers; the node count for none).
      preds: each node's real kernel producers (through duplicated ones), for sibling fusion.
      readers: each node's readers of any kind (graph edges), for sibling fusion's paths.
      layout_bound: nodes whose value XLA:GPU must write in another layout than a cuBLAS/cuDNN
        output has: a ``transpose`` of rank 3 or more (it moves batch dimensions, which a GEMM's
        operand strides cannot express, so it is no matrix prologue), and a value some dot reads
        with its batch dimensions not leading (:func:`layout_bound`). Neither joins a matrix
        hero's epilogue.
    """

    opcodes: tuple[str, ...]
    out_elements: tuple[int, ...]
    in_elements: tuple[int, ...]
    users: tuple[tuple[int, ...], ...]
    outside: tuple[bool, ...]
    first_outside: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]
    readers: tuple[tuple[int, ...], ...]
    layout_bound: frozenset[int] = frozenset()


def _dims(shape: str) -> tuple[int, ...] | None:
    """The dimensions of an array shape text such as ``f32[48,128,768]`` (None for a tuple)."""
    if shape.startswith("(") or "[" not in shape:
        return None
    inner = shape[shape.index("[") + 1:shape.rindex("]")]
    try:
        return tuple(int(d) for d in inner.split(",") if d)
    except ValueError:
        return None


def layout_bound(opcodes: Sequence[str], shapes: Sequence[str], preds: Sequence[Sequence[int]],
                 dup: set[int]) -> frozenset[int]:
    """The nodes whose values XLA:GPU writes in a layout no GEMM produces (see :class:`GpuFusionContext`).

    A batched dot's operand is read batch-dimensions-major by cuBLAS. The pre-optimisation HLO
    carries no dot dimension numbers here, so a dot of rank-r output is taken to read an operand
    of rank k <= r transposed when the operand's leading ``k - 2`` dimensions differ from the
    output's (jax's attention ``dot_general`` with batch dimensions (0, 2) of a ``[b, s, h, d]``
    operand); XLA's layout assignment then materialises the transpose, fused into the operand's
    producer fusion (``input_transpose_fusion``) or, after a GEMM, as a kernel of its own. Read
    through duplicated producers (a bitcast between is still the same buffer).

    Args:
      opcodes, shapes: per node.
      preds: each node's operands.
      dup: the duplicated producers.
    """
    dims = [_dims(s) for s in shapes]
    out: set[int] = set()
    for i, op in enumerate(opcodes):
        d = dims[i]
        if d is None:
            continue
        if op == "transpose" and len(d) >= 3:
            out.add(i)
        if op != "dot" or len(d) < 3:
            continue
        for p in preds[i]:
            stack, seen = [p], set()
            while stack:  # through duplicated producers to the value's real producer
                q = stack.pop()
                if q in seen:
                    continue
                seen.add(q)
                if q in dup and opcodes[q] in BITCASTS:
                    stack.extend(preds[q])
                    continue
                dq = dims[q]
                if dq is not None and 3 <= len(dq) <= len(d) and dq[:len(dq) - 2] != d[:len(dq) - 2]:
                    out.add(q)
    return frozenset(out)


def duplicated(opcodes: Sequence[str], is_kernel: Sequence[bool], succs: Sequence[Sequence[int]],
               preds: Sequence[Sequence[int]], out_elements: Sequence[int]) -> set[int]:
    """The producers XLA:GPU recomputes inside each consumer (see the module docstring).

    A one-operand ``custom-call`` of its operand's size is a sharding annotation in jax's
    pre-optimisation HLO (``Sharding``, ``xla.sdy.FuncResultSharding``, ...), which XLA removes:
    it is treated as free wherever its value goes.

    Args:
      opcodes: each node's opcode.
      is_kernel: whether each node is a compute op (not zero-cost, not a collective).
      succs: each node's readers.
      preds: each node's operands.
      out_elements: each node's output elements.

    Returns:
      The indices of duplicated nodes.
    """
    dup: set[int] = set()
    for i in range(len(opcodes) - 1, -1, -1):
        op = opcodes[i]
        if not is_kernel[i]:
            continue
        if op in BITCASTS or (op == "custom-call" and len(preds[i]) == 1
                              and out_elements[preds[i][0]] == out_elements[i]):
            dup.add(i)
            continue
        if not succs[i]:
            continue
        if op in FREE_DUPLICATES:
            if all(s in dup or is_kernel[s] for s in succs[i]):
                dup.add(i)
        elif op in CHEAP_UNARY:
            if all(s in dup or (is_kernel[s] and is_fusible(opcodes[s])) for s in succs[i]):
                dup.add(i)
    return dup


def make_context(opcodes: Sequence[str], out_elements: Sequence[int], in_elements: Sequence[int],
                 is_kernel: Sequence[bool], dup: set[int], succs: Sequence[Sequence[int]],
                 preds: Sequence[Sequence[int]], bound: frozenset[int] = frozenset()) -> GpuFusionContext:
    """Builds the emulation's per-graph arrays.

    Args:
      opcodes, out_elements, in_elements: per node.
      is_kernel: whether each node is a compute op.
      dup: the duplicated producers (:func:`duplicated`).
      succs, preds: each node's readers and operands (graph edges, node order topological).
      bound: the layout-bound nodes (:func:`layout_bound`).
    """
    n = len(opcodes)
    users: list[tuple[int, ...]] = [()] * n
    outside = [False] * n
    first = [n] * n
    for i in range(n - 1, -1, -1):
        acc: set[int] = set()
        out = not succs[i]
        fst = n
        for s in succs[i]:
            if s in dup:
                acc |= set(users[s])
                out = out or outside[s]
                fst = min(fst, first[s])
            elif not is_kernel[s]:
                out = True
                fst = min(fst, s)
            else:
                acc.add(s)
        users[i] = tuple(sorted(acc))
        outside[i] = out
        first[i] = fst
    rpreds: list[tuple[int, ...]] = [()] * n
    for i in range(n):
        acc2: set[int] = set()
        for p in preds[i]:
            if p in dup:
                acc2 |= set(rpreds[p])
            elif is_kernel[p]:
                acc2.add(p)
        rpreds[i] = tuple(sorted(acc2))
    return GpuFusionContext(opcodes=tuple(opcodes), out_elements=tuple(out_elements),
                            in_elements=tuple(in_elements), users=tuple(users), outside=tuple(outside),
                            first_outside=tuple(first), preds=tuple(rpreds),
                            readers=tuple(tuple(s) for s in succs), layout_bound=bound)


class _Fusion:
    """One growing fusion: members, iteration space, hero kind."""

    __slots__ = ("members", "lo", "hi", "elems", "matrix", "reduce", "closed", "epilogue", "bound")

    def __init__(self, pos: int, elems: int):
        self.members: list[int] = []
        self.lo = pos
        self.hi = pos
        self.elems = elems
        self.matrix = False
        self.reduce = False
        self.closed = False
        self.epilogue = 0  # elementwise ops in it (for a matrix hero's epilogue limit)
        self.bound = False  # holds a layout-bound node: no GEMM epilogue


def _accepts(ctx: GpuFusionContext, f: _Fusion, mem: Sequence[int], is_group: bool, all_inside: bool) -> bool:
    """Whether fusion ``f`` takes producer ``mem`` (one node, or a planned group)."""
    if f.closed:
        return False
    if is_group:  # a planned group is a loop fusion: it fuses like an elementwise producer
        return not f.matrix
    op = ctx.opcodes[mem[0]]
    i = mem[0]
    if op in MATRIX_OPCODES:
        most, allowed = _epilogue_ops(op, ctx.out_elements[i])
        return (all_inside and not f.matrix and not f.reduce and not f.bound and f.epilogue <= most
                and ctx.out_elements[i] == f.elems
                and (allowed is None or all(ctx.opcodes[x] in allowed for x in f.members)))
    if op in REDUCE_OPCODES:
        return not f.matrix and f.elems in (ctx.in_elements[i], ctx.out_elements[i])
    if f.matrix:
        return all_inside and op in MATRIX_PROLOGUE and len(ctx.users[i]) == 1 and i not in ctx.layout_bound
    return True


def clusters(ctx: GpuFusionContext, region: Sequence[int], groups: Sequence[tuple[int, ...]],
             cuts: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[int, ...]]:
    """XLA:GPU's fusion over ``region`` (sorted real compute nodes), ``groups`` pre-fused.

    Args:
      ctx: the graph's arrays (:func:`make_context`).
      region: the real (not duplicated) compute nodes to partition, sorted.
      groups: planned groups (sorted node tuples inside ``region``), each kept whole.
      cuts: (producer, user) node pairs a plan's optimization barrier separates: the producer
        never fuses into that user's fusion (nor into a matrix epilogue across it).

    Returns:
      The fusions, each a sorted tuple of node indices, sorted; every node of ``region``
      is in exactly one.
    """
    in_region = set(region)
    gid, items = group_producers(groups)
    claimed = _matrix_epilogues(ctx, region, in_region, gid, cuts)
    chains: dict[int, list[int]] = {}
    for m, hero in claimed.items():
        chains.setdefault(hero, []).append(m)
    items += [(max(c), tuple(sorted(c)), False) for c in chains.values()]
    items += [(m, (m,), False) for m in region if m not in gid and m not in claimed]
    items.sort(reverse=True)
    fusion_of: dict[int, _Fusion] = {}
    fusions: list[_Fusion] = []
    opcodes = ctx.opcodes
    for pos, mem, is_group in items:
        target: _Fusion | None = None
        fusible = is_group or is_fusible(opcodes[pos]) or opcodes[pos] in MATRIX_OPCODES
        if fusible:
            inside = set(mem)
            targets: dict[int, _Fusion] = {}
            ok = True
            for m in mem:
                for s in ctx.users[m]:
                    if s in inside:
                        continue
                    f = fusion_of.get(s)
                    if f is None or s not in in_region or (cuts and (m, s) in cuts):
                        ok = False
                        break
                    targets[id(f)] = f
                if not ok:
                    break
            outside = any(ctx.outside[m] for m in mem)
            if ok and targets:
                if len(targets) == 1 and not outside:
                    f = next(iter(targets.values()))
                    if _accepts(ctx, f, mem, is_group, True):
                        target = f
                elif not any(opcodes[m] in MATRIX_OPCODES or opcodes[m] in REDUCE_OPCODES for m in mem):
                    # Multi-output: join the earliest consumer fusion when every other reader,
                    # kernel or not (a collective), comes after all of its members.
                    first = min(targets.values(), key=lambda f: f.lo)
                    others_after = all(
                        s in inside or fusion_of[s] is first or s > first.hi
                        for m in mem for s in ctx.users[m])
                    outside_after = all(ctx.first_outside[m] > first.hi for m in mem)
                    if others_after and outside_after and _accepts(ctx, first, mem, is_group, False):
                        target = first
        if target is None:
            elems = ctx.in_elements[pos] if opcodes[pos] in REDUCE_OPCODES else ctx.out_elements[pos]
            target = _Fusion(pos, elems)
            target.closed = not fusible
            fusions.append(target)
        target.members.extend(mem)
        target.lo = min(target.lo, min(mem))
        target.hi = max(target.hi, max(mem))
        for m in mem:
            fusion_of[m] = target
            target.bound = target.bound or m in ctx.layout_bound
            op = opcodes[m]
            if op in MATRIX_OPCODES and not is_group:
                target.matrix = True
            elif op in REDUCE_OPCODES:
                target.reduce = True
            elif op in ELEMENTWISE:
                target.epilogue += 1
    merged = _siblings(ctx, fusions, fusion_of, in_region)
    return sorted(tuple(sorted(f.members)) for f in merged)


def _matrix_epilogues(ctx: GpuFusionContext, region: Sequence[int], in_region: set[int],
                      gid: dict[int, int], cuts: frozenset[tuple[int, int]] = frozenset()) -> dict[int, int]:
    """Each dot/convolution's epilogue claimed before fusion (XLA's gemm and cuDNN rewriters run
    before priority fusion): up to ``MAX_MATRIX_EPILOGUE`` single-user elementwise ops of the
    hero's size whose only real operand is the chain (a bias add, an activation).

    Returns:
      node -> its hero, for heroes with an epilogue (the hero maps to itself).
    """
    claimed: dict[int, int] = {}
    opcodes = ctx.opcodes
    for m in region:
        if m in gid or opcodes[m] not in MATRIX_OPCODES:
            continue
        chain, cur = [m], m
        most, allowed = _epilogue_ops(opcodes[m], ctx.out_elements[m])
        for _ in range(most):
            us = ctx.users[cur]
            if len(us) != 1 or ctx.outside[cur]:
                break
            s = us[0]
            if (s not in in_region or s in gid or s in claimed or (cur, s) in cuts or opcodes[s] not in ELEMENTWISE
                    or s in ctx.layout_bound or (allowed is not None and opcodes[s] not in allowed)
                    or ctx.out_elements[s] != ctx.out_elements[m] or any(p != cur for p in ctx.preds[s])):
                break
            chain.append(s)
            cur = s
        if len(chain) > 1:
            for c in chain:
                claimed[c] = m
    return claimed


def _siblings(ctx: GpuFusionContext, fusions: list[_Fusion], fusion_of: dict[int, _Fusion],
              in_region: set[int]) -> list[_Fusion]:
    """Sibling multi-output fusion of reduction fusions that read one producer.

    As XLA's ``FuseSiblings``, a producer that is an effective scalar (one element) is no shared
    operand worth fusing for (``IsProfitableOperand``), and two fusions merge only when no path
    joins them (:func:`_connected`).
    """
    alive = {id(f): f for f in fusions}
    redirect: dict[int, _Fusion] = {}
    merged_hi = -1  # the last member of any merged fusion (bounds the path search)

    def find(f: _Fusion) -> _Fusion:
        while id(f) in redirect:
            f = redirect[id(f)]
        return f

    for p in sorted({p for f in fusions if f.reduce for m in f.members for p in ctx.preds[m]}):
        if ctx.out_elements[p] == 1:
            continue
        readers: dict[int, _Fusion] = {}
        for s in ctx.users[p]:
            if s in in_region and s in fusion_of:
                f = find(fusion_of[s])
                own = fusion_of.get(p)
                if own is not None and find(own) is f:
                    continue
                if f.reduce and not f.matrix and not f.closed:
                    readers[id(f)] = f
        if len(readers) < 2:
            continue
        by_space: dict[int, list[_Fusion]] = {}
        for f in readers.values():
            by_space.setdefault(f.elems, []).append(f)
        for same in by_space.values():
            same.sort(key=lambda f: f.lo)
            base = same[0]
            for other in same[1:]:
                if not _connected(ctx, base, other, fusion_of, find, merged_hi):
                    base.members.extend(other.members)
                    base.lo, base.hi = min(base.lo, other.lo), max(base.hi, other.hi)
                    redirect[id(other)] = base
                    alive.pop(id(other), None)
                    merged_hi = max(merged_hi, base.hi)
    return list(alive.values())


def _connected(ctx: GpuFusionContext, a: _Fusion, b: _Fusion, fusion_of: dict[int, _Fusion],
               find: Callable[[_Fusion], _Fusion], merged_hi: int) -> bool:
    """True when a path leads from either fusion to the other in the graph with the fusions
    contracted, as XLA's reachability map sees it: through any reader (a collective too) and
    through another fusion (from any of its members once the path enters it).

    Every edge out of a fusion that producer-consumer fusion formed (a planned group aside) goes
    to a node after its last member (a lone node's to a later node), so the search skips those
    after the target's last member and after every merged fusion's (``merged_hi``): no path
    leads back from them.
    """
    for src, dst in ((a, b), (b, a)):
        limit = max(dst.hi, merged_hi)
        entered = {id(src)}
        seen: set[int] = set()
        stack = [s for m in src.members for s in ctx.readers[m]]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            f = fusion_of.get(v)
            if f is None:
                if v <= limit:
                    stack.extend(ctx.readers[v])
                continue
            f = find(f)
            if f is dst:
                return True
            if id(f) not in entered and f.hi <= limit:
                entered.add(id(f))
                stack.extend(s for m in f.members for s in ctx.readers[m])
    return False


class GpuFusion:
    """XLA:GPU's fusion over one graph: the :class:`disco.sim.units.FusionEmulation` of a GPU cluster.

    Args:
      nodes: the graph's nodes, in topological order.
      is_kernel: whether each node is a compute op (not zero-cost, not a collective).
      succs: each node's readers.
      preds: each node's operands.
      index: instruction name -> node index.

    Attributes:
      duplicated: the producers XLA:GPU recomputes inside each consumer (:func:`duplicated`).
    """

    def __init__(self, nodes: Sequence[Any], is_kernel: Sequence[bool], succs: Sequence[Sequence[int]],
                 preds: Sequence[Sequence[int]], index: Mapping[str, int]):
        opcodes = [nd.opcode for nd in nodes]
        out_el = [nd.out_elements for nd in nodes]
        dup = duplicated(opcodes, is_kernel, succs, preds, out_el)
        in_el = [out_el[index[nd.operands[0]]] if nd.operands and nd.operands[0] in index else out_el[i]
                 for i, nd in enumerate(nodes)]
        self.duplicated = frozenset(dup)
        bound = layout_bound(opcodes, [nd.shape for nd in nodes], preds, dup)
        self._ctx = make_context(opcodes, out_el, in_el, is_kernel, dup, succs, preds, bound)

    def clusters(self, region: list[int], groups: list[tuple[int, ...]],
                 cuts: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[int, ...]]:
        """XLA:GPU's fusions of ``region`` (sorted real compute nodes), ``groups`` pre-fused."""
        return clusters(self._ctx, region, groups, cuts)

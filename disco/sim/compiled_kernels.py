"""Compiled kernels: every kernel an optimised HLO module launches, as a cost model's Kernel.

One reader for both backends: :func:`module_kernels` reads an optimised module (``Compiled.as_text()``
of XLA:GPU or XLA:CPU, compiled on a device or deviceless) and returns one :class:`KernelSpec` per
instruction that launches device work: fusions (their fused computation), custom-calls (cuBLAS GEMMs,
cuDNN convolutions), copies and any other op outside a fusion that is not plumbing (parameters, tuples,
bitcasts, control flow) or a collective. Each becomes a :class:`disco.sim.costs.Kernel` (its nodes,
bytes in and out), the same type the simulator builds for a planned fusion group, so one model prices
both. Instructions inside while bodies count once per execution (``executions``: the product of the
enclosing loops' ``known_trip_count``). Bytes are what a kernel moves: a buffer it only slices or
gathers from counts the slices read (static, dynamic or gathered), and a dynamic-update-slice or
scatter (in place on XLA: ``disco.ir.opcodes.IN_PLACE_UPDATE_OPERAND``) reads none of its buffer and
writes only its update.

It lives in the simulator's layer so that the compiled tier (:mod:`disco.sim.compiled`) and the
per-kernel GNN's features (:mod:`gnn.kernel_features`, which re-exports it) read a module the same way.

Example:
  >>> kernels = module_kernels(compiled.as_text())  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from disco.ir import flops as _flops
from disco.ir import hlo_module, hlo_parse
from disco.ir import loops as _loops
from disco.ir.graph import Node
from disco.ir.opcodes import (COLLECTIVE_KIND, COLLECTIVES, CONTROL_FLOW_OPCODES, IN_PLACE_UPDATE_OPERAND,
                               SLICE_READ_OPCODES, ZERO_COST_OPCODES, in_place_update)
from disco.sim.costs import Kernel

# Control flow launches nothing itself; its called computations are walked instead.
_CONTROL = CONTROL_FLOW_OPCODES
_CUDNN_CONV = re.compile(r"__cudnn\$conv(Forward|BackwardInput|BackwardFilter|BiasActivationForward)")
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
# Ops that touch part of operand 0: slice reads and in-place updates (disco.ir.opcodes).
_SLICE_USERS = SLICE_READ_OPCODES | {"slice"} | IN_PLACE_UPDATE_OPERAND.keys()
# XLA prints an async op as ``<op>-start``, ``<op>-update``, ``<op>-done`` (``copy-done``, ``fusion-done``,
# ``reduce-scatter-done``, ...): the -update and -done halves only wait for the start and launch nothing,
# and a collective's start runs on the network, not as a compute kernel.
_ASYNC_WAITS = ("-update", "-done")
_ASYNC_COLLECTIVES = frozenset(f"{c}-start" for c in (*COLLECTIVES, "ragged-all-to-all"))


def _updated_in_place(ins: hlo_module.Instruction) -> bool:
    """Whether ``ins`` updates its operand 0 in place (a dynamic-update-slice, a one-buffer scatter)."""
    return in_place_update(ins.opcode, len(ins.operands)) is not None


def _slice_reads(buffer: str, users: dict[str, list[hlo_module.Instruction]], depth: int = 0) -> int | None:
    """Bytes of ``buffer`` a fused computation reads when every use of it touches only part of it
    (:func:`_partial_use`), directly or through a chain of bitcasts (how XLA:GPU feeds a gather a
    reshaped table); None when some use reads it whole, or nothing uses it."""
    us = users.get(buffer, [])
    if not us or depth > 16:
        return None
    total = 0
    for u in us:
        if u.opcode == "bitcast" and u.operands == (buffer,):
            inner = _slice_reads(u.name, users, depth + 1)
            if inner is None:
                return None
            total += inner
        elif _partial_use(u, buffer):
            total += 0 if _updated_in_place(u) else u.out_bytes
        else:
            return None
    return total


def _partial_use(user: hlo_module.Instruction, buffer: str) -> bool:
    """Whether ``user`` touches only part of ``buffer``: slices or gathers from it, or updates it in place."""
    if user.opcode not in _SLICE_USERS or not user.operands or user.operands[0] != buffer:
        return False
    return user.opcode not in IN_PLACE_UPDATE_OPERAND or _updated_in_place(user)


class KernelSpec(NamedTuple):
    """One kernel-launching instruction of a module.

    Attributes:
      name: the instruction's name (what the profiler reports as ``hlo_op``).
      kernel: its work as a :class:`disco.sim.costs.Kernel`.
      executions: launches per module execution (loop trip counts multiplied; 1 outside loops).
      xla_kind: the fusion kind XLA printed (``kLoop``, ``kInput``, ``kCustom``, ...), the
        custom-call target, or the opcode.
    """

    name: str
    kernel: Kernel
    executions: int
    xla_kind: str


def _layout_text(shape: str) -> str:
    """The minor-to-major layouts of ``shape`` joined by ``;`` if any is not the default one, else ''
    (the form of :attr:`disco.ir.graph.Node.layout`)."""
    layouts = re.findall(r"\]\{([0-9,]*)", shape)
    for text in layouts:
        dims = [int(d) for d in text.split(",") if d]
        if dims != sorted(dims, reverse=True):
            return ";".join(layouts)
    return ""



def _node(ins: hlo_module.Instruction, flops: float, opcode: str | None = None,
          arrays: Sequence[hlo_module.ArrayShape] | None = None) -> Node:
    arrays = tuple(ins.arrays if arrays is None else arrays)
    shape = ",".join(str(a) for a in arrays) if len(arrays) == 1 else f"({','.join(str(a) for a in arrays)})"
    return Node(name=ins.name, opcode=opcode or ins.opcode, computation=ins.computation, shape=shape,
                dtype=arrays[0].dtype if arrays else "token", out_bytes=sum(a.nbytes for a in arrays),
                out_elements=sum(a.elements for a in arrays), flops=float(flops), operands=ins.operands,
                layout=_layout_text(ins.shape))


def _result_arrays(ins: hlo_module.Instruction) -> tuple[hlo_module.ArrayShape, ...]:
    """A custom-call's results without its scratch workspace (a trailing s8/u8 buffer)."""
    arrays = ins.arrays
    if ins.opcode == "custom-call" and len(arrays) > 1 and arrays[-1].dtype in ("s8", "u8"):
        return arrays[:-1]
    return arrays


def _dims(config: dict, key: str) -> list[int]:
    return [int(d) for d in config.get(key, [])]


def _custom_call_node(ins: hlo_module.Instruction, names: dict[str, hlo_module.Instruction]) -> Node:
    """A cuBLAS GEMM as a ``dot`` node, a cuDNN convolution as a ``convolution`` node, with their flops."""
    target = ins.attrs.get("custom_call_target", "").strip('"')
    out = _result_arrays(ins)
    try:
        config = json.loads(ins.attrs.get("backend_config", "{}") or "{}")
    except json.JSONDecodeError:
        config = {}
    ops = [names.get(o) for o in ins.operands]
    shapes = [o.arrays[0] if o is not None and o.arrays else None for o in ops]
    if target in _GEMM_TARGETS and shapes and shapes[0] is not None:
        dnums = config.get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
        k = math.prod(shapes[0].dims[d] for d in _dims(dnums, "lhs_contracting_dimensions")
                      if d < len(shapes[0].dims))
        return _node(ins, 2.0 * out[0].elements * k, "dot", out)
    m = _CUDNN_CONV.search(target)
    labels = ins.attrs.get("dim_labels", "")
    if m and len(shapes) >= 2 and "_" in labels and None not in shapes[:2]:
        # The forward convolution's output and filter, whichever of operands/result they are here.
        fwd_out, filt = {"BackwardInput": (shapes[0], shapes[1]), "BackwardFilter": (shapes[1], out[0])}.get(
            m.group(1), (out[0], shapes[1]))
        kernel_labels = labels.split("_")[1].split("->")[0]
        k = math.prod(d for lab, d in zip(kernel_labels, filt.dims) if lab != "o")
        return _node(ins, 2.0 * fwd_out.elements * k, "convolution", out)
    return _node(ins, 0.0, None, out)


def module_kernels(hlo: str | hlo_module.Module, *, backend: str | None = None) -> list[KernelSpec]:
    """Every kernel-launching instruction of an optimised module, in program order.

    On XLA:GPU a ``while`` whose trip count XLA knows (``known_trip_count``) runs its body that
    many times and never its condition (its ``WhileThunk`` loops on the count; no condition kernel
    appears in any H100 profile of ``../shared/data/h100_kernels``), so that condition's kernels are
    left out; elsewhere, and for a loop of unknown count, the condition's kernels count once per trip.

    Args:
      hlo: the module text (``Compiled.as_text()``) or a parsed module.
      backend: ``"gpu"`` or ``"cpu"``, the compiler that wrote the module; None reads it from the
        text (:func:`disco.ir.hlo_parse.compiled_backend`; a parsed module without it counts as CPU).

    Returns:
      One KernelSpec per instruction, entry computation first, then loop bodies as reached.

    Raises:
      ValueError: if the text is not HLO (:class:`disco.ir.hlo_parse.HloParseError`).
    """
    if backend is None and isinstance(hlo, str):
        backend = hlo_parse.compiled_backend(hlo)
    if backend not in (None, "gpu", "cpu"):
        raise ValueError(f"module_kernels: backend {backend!r}; expected 'gpu', 'cpu' or None")
    module = hlo if isinstance(hlo, hlo_module.Module) else hlo_parse.parse_module(hlo)
    comps = {c.name: c for c in module.computations}
    scoped = {c.name: c.by_name() for c in module.computations}  # names are scoped per computation
    per_ins = _flops.module_flops(module)

    def flops_of(i: hlo_module.Instruction) -> float:
        return per_ins.get((i.computation, i.name), 0.0)

    def operand(ins: hlo_module.Instruction, name: str) -> hlo_module.Instruction | None:
        return scoped.get(ins.computation, {}).get(name)
    out: list[KernelSpec] = []
    seen: set[str] = set()
    step_bytes = step_input_bytes(module)

    def fused(ins: hlo_module.Instruction) -> Kernel:
        body = comps.get(ins.called[0]) if ins.called else None
        if body is None:
            return Kernel(nodes=(_node(ins, flops_of(ins)),), in_bytes=_in_bytes(ins), out_bytes=ins.out_bytes)
        nodes = tuple(_node(i, flops_of(i)) for i in body.instructions)
        return Kernel(nodes=nodes, in_bytes=_fused_in_bytes(ins, body), out_bytes=_fused_out_bytes(ins, body))

    def _in_bytes(ins: hlo_module.Instruction) -> int:
        partial = ins.opcode in SLICE_READ_OPCODES or _updated_in_place(ins)
        ops = ins.operands[1:] if partial else ins.operands
        total = sum(o.out_bytes for o in (operand(ins, n) for n in dict.fromkeys(ops)) if o is not None)
        if ins.opcode in SLICE_READ_OPCODES or ins.opcode == "slice":  # reads only the slice (an update writes in place)
            total = ins.out_bytes if ins.opcode == "slice" else total + ins.out_bytes
        return total

    def _fused_in_bytes(ins: hlo_module.Instruction, body: hlo_module.Computation) -> int:
        users: dict[str, list[hlo_module.Instruction]] = {}
        for i in body.instructions:
            for o in i.operands:
                users.setdefault(o, []).append(i)
        total, read = 0, set()
        for p in body.instructions:
            if p.opcode != "parameter":
                continue
            sliced = _slice_reads(p.name, users)
            if sliced is not None:
                # a buffer only sliced from (slice, dynamic-slice, gather) or updated in place
                # (dynamic-update-slice, scatter), directly or through bitcasts: the kernel reads the
                # slices (at most the buffer once)
                total += min(p.out_bytes, sliced)
                continue
            idx = int(p.raw_operands) if p.raw_operands.strip().isdigit() else -1
            operand = ins.operands[idx] if 0 <= idx < len(ins.operands) else p.name
            if operand not in read:  # an operand passed twice is read once
                read.add(operand)
                total += p.out_bytes
        return total

    def _fused_out_bytes(ins: hlo_module.Instruction, body: hlo_module.Computation) -> int:
        by = body.by_name()
        root = body.root
        outs = [by[o] for o in root.operands if o in by] if root.opcode == "tuple" else [root]
        total = 0
        for o in outs:
            update = in_place_update(o.opcode, len(o.operands))
            if update is not None and o.operands[update] in by:
                total += by[o.operands[update]].out_bytes  # in place: only the update is written
            else:
                total += o.out_bytes
        return total

    def visit(comp: hlo_module.Computation, times: int) -> None:
        if comp.name in seen:  # a computation called twice is walked once (its first multiplier)
            return
        seen.add(comp.name)
        for ins in comp.instructions:
            op = ins.opcode
            if op in _CONTROL:
                known = _loops.known_trip_count(ins) if op == "while" else None
                n = 1 if known is None else known
                skipped = None  # XLA:GPU never runs the condition of a loop of known count
                if backend == "gpu" and known is not None:
                    skipped = ins.attrs.get("condition", "").strip().lstrip("%")
                for c in ins.called:
                    if c in comps and c != skipped:
                        visit(comps[c], times * n)
                continue
            if op in ZERO_COST_OPCODES or op in COLLECTIVE_KIND or op in COLLECTIVES:
                continue
            if op.endswith(_ASYNC_WAITS) or op in _ASYNC_COLLECTIVES:
                continue
            if op in ("fusion", "fusion-start"):  # an async fusion (XLA:GPU's copies on extra streams)
                kernel, kind = fused(ins), ins.attrs.get("kind", "fusion")
            elif op == "custom-call":
                node = _custom_call_node(ins, scoped.get(ins.computation, {}))
                kernel = Kernel(nodes=(node,), in_bytes=_in_bytes(ins), out_bytes=node.out_bytes)
                kind = ins.attrs.get("custom_call_target", "custom-call").strip('"')
            else:
                out_bytes = ins.out_bytes
                at = in_place_update(op, len(ins.operands))
                update = operand(ins, ins.operands[at]) if at is not None else None
                if update is not None:
                    out_bytes = update.out_bytes
                kernel = Kernel(nodes=(_node(ins, flops_of(ins)),), in_bytes=_in_bytes(ins),
                                out_bytes=out_bytes)
                kind = op
            out.append(KernelSpec(ins.name, dataclasses.replace(kernel, step_bytes=step_bytes), times, kind))

    visit(module.entry, 1)
    return out


def step_input_bytes(module: hlo_module.Module) -> int:
    """Bytes of the entry computation's parameters: the step's inputs (:attr:`Kernel.step_bytes`)."""
    return sum(i.out_bytes for i in module.entry.instructions if i.opcode == "parameter")

"""Kernel features: every kernel an optimised HLO module launches, as a small graph.

One feature function for both backends: :func:`module_kernels` reads an optimised module
(``Compiled.as_text()`` of XLA:GPU or XLA:CPU) and returns one :class:`KernelSpec` per
instruction that launches device work: fusions (their fused computation), custom-calls
(cuBLAS GEMMs, cuDNN convolutions), copies and any other op outside a fusion that is not
plumbing (parameters, tuples, bitcasts, control flow) or a collective. Each becomes a
:class:`disco.sim.costs.Kernel` (its nodes, bytes in and out), the same type the simulator
builds for a planned fusion group, so one model prices both. Instructions inside while
bodies count once per execution (``executions``: the product of the enclosing loops'
``known_trip_count``). Bytes are what a kernel moves: a buffer it only slices or gathers from counts
the slices read (static, dynamic or gathered), and a dynamic-update-slice or scatter (in place on XLA:
``disco.ir.opcodes.IN_PLACE_UPDATE_OPERAND``) reads none of its buffer and writes only its update.

:func:`kernel_graph` turns a Kernel into arrays: per node the opcode id (the one vocabulary,
``disco.ir.opcodes.opcode_id``) and :data:`NODE_FEATURES`; edges between working nodes (folded
through bitcasts and other plumbing); per kernel :data:`TOTAL_FEATURES` (bytes in and out,
flops, matrix flops, node count, the roofline terms of a device, the kernel's class
:data:`KINDS`, derived from its nodes so a simulator kernel gets the same value as a compiled one,
and one piece of context: the step's input bytes, :attr:`disco.sim.costs.Kernel.step_bytes`, the
entry computation's parameters, which a simulator graph and its compiled module share).
:func:`batch` packs graphs jraph-style (nodes, senders, receivers, per-graph totals) padded to
power-of-two size buckets, so jit compiles once per bucket. :func:`fingerprint` names a kernel by its
graph without the context (:data:`CONTEXT_TOTALS`): the same kernel in another step has the same one.

Example:
  >>> kernels = module_kernels(compiled.as_text())  # doctest: +SKIP
  >>> b = batch([kernel_graph(k.kernel) for k in kernels])  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from disco.ir import flops as _flops
from disco.ir import loops as _loops
from disco.ir import hlo_module, hlo_parse
from disco.ir.graph import Node
from disco.ir.opcodes import (COLLECTIVE_KIND, COLLECTIVES, CONTROL_FLOW_OPCODES, DATA_MOVEMENT_OPCODES,
                               IN_PLACE_UPDATE_OPERAND, OPCODES, SLICE_READ_OPCODES, XLA_GPU_MATRIX_OPCODES,
                               ZERO_COST_OPCODES, in_place_update, opcode_id)
from disco.sim.costs import Kernel, is_kernel_node

FEATURE_VERSION = 6  # 6: a gather reads its rows, a scatter writes its update (were the whole buffer)
NODE_FEATURES = ("log_out_elements", "log_out_bytes", "log_flops", "rank", "dtype_bytes", "is_root",
                 "layout_permuted", "log_minor_dim", "log_in_ratio", "reduces_minor")
KINDS = ("gemm", "conv", "reduce", "transpose", "copy", "loop")
TOTAL_FEATURES = ("log_in_bytes", "log_out_bytes", "log_flops", "log_matrix_flops", "log_nodes",
                  *(f"kind_{k}" for k in KINDS),
                  "log_max_elements", "log_outputs", "log_inputs", "log_mm_batch", "log_mm_m", "log_mm_n",
                  "log_mm_k", "log_reduce_len", "reduce_minor", "log_step_bytes")
# Totals that describe the kernel's step, not the kernel: left out of its fingerprint.
CONTEXT_TOTALS = ("log_step_bytes",)
N_OPCODES = len(OPCODES) + 1  # + the unknown opcode
MATRIX_OPCODES = XLA_GPU_MATRIX_OPCODES

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


class KernelGraph(NamedTuple):
    """One kernel as arrays.

    Attributes:
      opcodes: int32 [n] opcode ids.
      nodes: float32 [n, len(NODE_FEATURES)].
      senders: int32 [e] producer node of each edge.
      receivers: int32 [e] consumer node of each edge.
      totals: float32 [len(TOTAL_FEATURES)].
    """

    opcodes: np.ndarray
    nodes: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    totals: np.ndarray


class GraphBatch(NamedTuple):
    """Kernel graphs packed jraph-style and padded: the last graph holds every padding node and edge.

    Attributes:
      opcodes: int32 [N]; nodes: float32 [N, F]; senders, receivers: int32 [E];
      node_graph: int32 [N] the graph of each node; totals: float32 [G, T];
      node_mask: float32 [N] and graph_mask: float32 [G], 1 for real entries.
    """

    opcodes: np.ndarray
    nodes: np.ndarray
    senders: np.ndarray
    receivers: np.ndarray
    node_graph: np.ndarray
    totals: np.ndarray
    node_mask: np.ndarray
    graph_mask: np.ndarray


# ---------------------------------------------------------------------------------------------
def _layout_text(shape: str) -> str:
    """The minor-to-major layouts of ``shape`` joined by ``;`` if any is not the default one, else ''
    (the form of :attr:`disco.ir.graph.Node.layout`)."""
    layouts = re.findall(r"\]\{([0-9,]*)", shape)
    for text in layouts:
        dims = [int(d) for d in text.split(",") if d]
        if dims != sorted(dims, reverse=True):
            return ";".join(layouts)
    return ""


def minor_dim(node: Node) -> int:
    """The size of the node's first array's minor (contiguous) dimension: from its layout when the
    node has a non-default one, else the last dimension (1 for a scalar)."""
    dims = _first_dims(node)
    if not dims:
        return 1
    first = node.layout.split(";")[0].split(",")[0] if node.layout else ""
    if first.strip().isdigit() and int(first) < len(dims):
        return dims[int(first)]
    return dims[-1]


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


# ---------------------------------------------------------------------------------------------
def kernel_kind(kernel: Kernel) -> str:
    """The kernel's class (:data:`KINDS`) from its working nodes: the first that applies."""
    ops = {n.opcode for n in kernel.nodes if is_kernel_node(n)}
    if "dot" in ops:
        return "gemm"
    if "convolution" in ops:
        return "conv"
    if ops & {"reduce", "reduce-window", "scatter", "select-and-scatter"}:
        return "reduce"
    if ops & {"transpose", "copy"} and any(n.layout for n in kernel.nodes) or "transpose" in ops:
        return "transpose"
    if ops <= DATA_MOVEMENT_OPCODES:
        return "copy"
    return "loop"


def matrix_flops(kernel: Kernel) -> float:
    """Flops of the kernel's matrix work (dots and convolutions)."""
    return sum(n.flops for n in kernel.nodes if n.opcode in MATRIX_OPCODES)


def kernel_graph(kernel: Kernel) -> KernelGraph:
    """The arrays of one kernel (deterministic: nodes in the kernel's order).

    Raises:
      ValueError: for a kernel without working nodes (nothing to price).
    """
    work = [n for n in kernel.nodes if is_kernel_node(n)]
    if not work:
        raise ValueError(f"kernel_graph: kernel of {[n.opcode for n in kernel.nodes]} has no working node")
    index = {n.name: i for i, n in enumerate(work)}
    by_name = {n.name: n for n in kernel.nodes}
    root_names = _roots(kernel)

    def producers(name: str, depth: int = 0) -> list[int]:
        if name in index:
            return [index[name]]
        n = by_name.get(name)
        if n is None or depth > 64:
            return []
        return [p for o in n.operands for p in producers(o, depth + 1)]

    senders, receivers = [], []
    for j, n in enumerate(work):
        for s in dict.fromkeys(p for o in n.operands for p in producers(o)):
            senders.append(s)
            receivers.append(j)
    feats = np.zeros((len(work), len(NODE_FEATURES)), np.float32)
    ratio = [_in_ratio(n, by_name) for n in work]
    minor_reduced = [_reduces_minor(n, by_name) for n in work]
    for i, n in enumerate(work):
        arrays = hlo_parse.parse_shape(n.shape) if n.shape else ()
        rank = max((len(a.dims) for a in arrays), default=0)
        feats[i] = (math.log1p(n.out_elements), math.log1p(n.out_bytes), math.log1p(n.flops), rank,
                    hlo_module.DTYPE_BYTES.get(n.dtype, 4), float(n.name in root_names), float(bool(n.layout)),
                    math.log(minor_dim(n)), math.log(ratio[i]), float(minor_reduced[i]))
    kind = kernel_kind(kernel)
    reduces = [i for i, n in enumerate(work) if n.opcode in _REDUCING]
    big_reduce = max(reduces, key=lambda i: (ratio[i], -i), default=None)
    totals = np.array([math.log1p(kernel.in_bytes), math.log1p(kernel.out_bytes), math.log1p(kernel.flops),
                       math.log1p(matrix_flops(kernel)), math.log1p(len(work)),
                       *(float(kind == k) for k in KINDS),
                       math.log1p(max(n.out_elements for n in work)),
                       math.log1p(sum(n.name in root_names for n in work)),
                       math.log1p(_inputs(kernel, by_name)),
                       *(math.log(d) for d in _matrix_dims(work)),
                       math.log(ratio[big_reduce]) if big_reduce is not None else 0.0,
                       float(minor_reduced[big_reduce]) if big_reduce is not None else 0.0,
                       math.log1p(kernel.step_bytes)], np.float32)
    return KernelGraph(np.array([opcode_id(n.opcode) for n in work], np.int32), feats,
                       np.array(senders, np.int32), np.array(receivers, np.int32), totals)


def fingerprint(graph: KernelGraph) -> str:
    """16 hex digits naming the kernel a graph describes: its opcodes, edges, node features and totals
    except :data:`CONTEXT_TOTALS`, floats rounded to 4 decimals (so a last-bit difference of ``log``
    between platforms does not change it). Equal graphs of different steps share it."""
    keep = [i for i, k in enumerate(TOTAL_FEATURES) if k not in CONTEXT_TOTALS]
    h = hashlib.sha256()
    for a in (graph.opcodes.astype(np.int32), graph.senders.astype(np.int32), graph.receivers.astype(np.int32),
              _rounded(graph.nodes), _rounded(graph.totals[keep])):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _rounded(a: np.ndarray) -> np.ndarray:
    return np.round(a.astype(np.float64), 4) + 0.0  # + 0.0: -0.0 becomes 0.0


_REDUCING = frozenset({"reduce", "reduce-window"})


def _first_dims(node: Node) -> tuple[int, ...]:
    arrays = hlo_parse.parse_shape(node.shape) if node.shape else ()
    return arrays[0].dims if arrays else ()


def _in_ratio(node: Node, by_name: dict[str, Node]) -> float:
    """The largest operand's elements over the node's own (>1: a reduction or slice, <1: a broadcast);
    1 when no operand is a node of the kernel (a simulator group's inputs from outside)."""
    sizes = [by_name[o].out_elements for o in node.operands if o in by_name and by_name[o].out_elements > 0]
    if not sizes or node.out_elements <= 0:
        return 1.0
    return max(sizes) / node.out_elements


def _reduces_minor(node: Node, by_name: dict[str, Node]) -> bool:
    """A reduce whose operand's minor (contiguous) dimension is reduced away (a row reduction)."""
    if node.opcode not in _REDUCING or not node.operands or node.operands[0] not in by_name:
        return False
    src = by_name[node.operands[0]]
    if len(_first_dims(node)) == 0:
        return True
    return minor_dim(src) != minor_dim(node)


def _inputs(kernel: Kernel, by_name: dict[str, Node]) -> int:
    """The kernel's distinct inputs: its parameters and the operands produced outside it."""
    params = sum(n.opcode == "parameter" for n in kernel.nodes)
    outside = {o for n in kernel.nodes for o in n.operands if o not in by_name}
    return params + len(outside)


def _matrix_dims(work: Sequence[Node]) -> tuple[float, float, float, float]:
    """(batch, m, n, k) of the kernel's largest dot or convolution, read from its output shape
    (the last two dimensions as m and n, the rest as batch; k = flops / (2 x output elements));
    all 1 for a kernel without matrix work."""
    mats = [n for n in work if n.opcode in MATRIX_OPCODES and n.out_elements > 0]
    if not mats:
        return (1.0, 1.0, 1.0, 1.0)
    n = max(mats, key=lambda x: x.flops)
    dims = _first_dims(n) or (1,)
    dims = (1, *dims) if len(dims) == 1 else dims
    k = max(n.flops / (2.0 * n.out_elements), 1.0)
    return (float(max(math.prod(dims[:-2]), 1)), float(max(dims[-2], 1)), float(max(dims[-1], 1)), k)


def _roots(kernel: Kernel) -> set[str]:
    """Names of nodes no other node of the kernel reads (the kernel's outputs)."""
    used = {o for n in kernel.nodes for o in n.operands}
    return {n.name for n in kernel.nodes if n.name not in used}


# ---------------------------------------------------------------------------------------------
def bucket(n: int, minimum: int = 8) -> int:
    """The padded size for ``n`` entries: the next power of two, at least ``minimum``."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def batch(graphs: Sequence[KernelGraph], *, n_node: int | None = None, n_edge: int | None = None,
          n_graph: int | None = None) -> GraphBatch:
    """Packs graphs into one padded batch (sizes default to the buckets of :func:`bucket`).

    One extra graph (the last) holds every padding node and edge, so padding never reaches a
    real graph's sums; real graphs keep their order.

    Raises:
      ValueError: for no graphs, or explicit sizes too small for them.
    """
    if not graphs:
        raise ValueError("batch: expected at least one kernel graph, got none")
    nn = sum(len(g.opcodes) for g in graphs)
    ne = sum(len(g.senders) for g in graphs)
    n_node = bucket(nn + 1, 16) if n_node is None else n_node
    n_edge = bucket(ne + 1, 16) if n_edge is None else n_edge
    n_graph = bucket(len(graphs) + 1) if n_graph is None else n_graph
    if n_node < nn + 1 or n_edge < ne or n_graph < len(graphs) + 1:
        raise ValueError(f"batch: sizes (nodes {n_node}, edges {n_edge}, graphs {n_graph}) cannot hold "
                         f"{nn} nodes, {ne} edges and {len(graphs)} graphs plus one padding node and graph")
    nf, tf = graphs[0].nodes.shape[1], graphs[0].totals.shape[0]
    opcodes = np.zeros(n_node, np.int32)
    nodes = np.zeros((n_node, nf), np.float32)
    node_graph = np.full(n_node, n_graph - 1, np.int32)
    node_mask = np.zeros(n_node, np.float32)
    senders = np.full(n_edge, nn, np.int32)  # padding edges: padding node -> itself
    receivers = np.full(n_edge, nn, np.int32)
    totals = np.zeros((n_graph, tf), np.float32)
    graph_mask = np.zeros(n_graph, np.float32)
    i = e = 0
    for j, g in enumerate(graphs):
        k, m = len(g.opcodes), len(g.senders)
        opcodes[i:i + k], nodes[i:i + k], node_graph[i:i + k], node_mask[i:i + k] = g.opcodes, g.nodes, j, 1.0
        senders[e:e + m], receivers[e:e + m] = g.senders + i, g.receivers + i
        totals[j], graph_mask[j] = g.totals, 1.0
        i, e = i + k, e + m
    return GraphBatch(opcodes, nodes, senders, receivers, node_graph, totals, node_mask, graph_mask)

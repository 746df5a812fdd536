"""Kernel features: every kernel an optimised HLO module launches, as a small graph.

One feature function for both backends: :func:`module_kernels` (from
:mod:`disco.sim.compiled_kernels`, re-exported here) reads an optimised module
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
:func:`batch` packs graphs into the one container of both GNN families, :class:`gnn.graph.GraphsTuple`
(totals as its globals), padded to power-of-two size buckets, so jit compiles once per bucket.
:func:`fingerprint` names a kernel by its graph without the context (:data:`CONTEXT_TOTALS`): the
same kernel in another step has the same one.

Example:
  >>> kernels = module_kernels(compiled.as_text())  # doctest: +SKIP
  >>> b = batch([kernel_graph(k.kernel) for k in kernels])  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from disco.ir import hlo_module, hlo_parse
from disco.ir.graph import Node
from disco.ir.opcodes import DATA_MOVEMENT_OPCODES, OPCODES, XLA_GPU_MATRIX_OPCODES, opcode_id
from disco.sim.compiled_kernels import KernelSpec, module_kernels, step_input_bytes  # noqa: F401 (re-exported)
from disco.sim.costs import Kernel, is_kernel_node
from gnn import graph as G

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


# ---------------------------------------------------------------------------------------------
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
def graphs_tuple(graph: KernelGraph) -> G.GraphsTuple:
    """One kernel graph as the shared container: its totals as globals, no edge features."""
    f32, i32 = (lambda a: a.astype(np.float32, copy=False)), (lambda a: a.astype(np.int32, copy=False))
    return G.single(nodes=f32(graph.nodes), opcodes=i32(graph.opcodes),
                    edges=np.zeros((len(graph.senders), 0), np.float32), senders=i32(graph.senders),
                    receivers=i32(graph.receivers), globals=f32(graph.totals))


def batch(graphs: Sequence[KernelGraph], *, n_node: int | None = None, n_edge: int | None = None,
          n_graph: int | None = None) -> G.GraphsTuple:
    """Kernel graphs as one padded :class:`gnn.graph.GraphsTuple`: :func:`gnn.graph.batch` then
    :func:`gnn.graph.pad` (sizes default to its buckets); real graphs keep their order.

    Raises:
      ValueError: for no graphs, or explicit sizes too small for them.
    """
    return G.pad(G.batch([graphs_tuple(g) for g in graphs]), n_node=n_node, n_edge=n_edge, n_graph=n_graph)

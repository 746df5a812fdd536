"""The one opcode vocabulary: every set of XLA opcode names disco reasons about, each defined once.

Names are spelt as XLA prints them (``HloOpcodeString``, the ``HLO_OPCODE_LIST`` table in
``xla/hlo/ir/hlo_opcode.h``): ``count-leading-zeros`` (not "clz"), ``opt-barrier`` (not
"optimization-barrier"), ``topk`` (not "top-k"). ``tests/disco/ir/test_opcodes.py`` checks every name here
against the opcodes XLA printed for the zoo (pre- and post-optimisation HLO on XLA:CPU) and for the
H100 records in ``tests/data/xla_opcodes.json`` (``scripts/tools/collect_xla_opcodes.py`` regenerates it),
plus a commented allow-list, checked against ``hlo_opcode.h``, of opcodes the corpus never printed.

The sets, by what they mean:

* :data:`ELEMENTWISE_UNARY`, :data:`ELEMENTWISE_BINARY`, :data:`ELEMENTWISE`: elementwise ops that
  compute (one flop per output element in :mod:`disco.ir.flops`). :data:`XLA_ELEMENTWISE` adds
  ``copy``: XLA's ``HloInstruction::IsElementwise``, which counts a copy as elementwise though it
  only moves data.
* :data:`COLLECTIVES`: cross-device communication ops, async halves included.
* :data:`ALL_REDUCE_OPCODES`: the ops a gradient all-reduce appears as (sync, or the start of an
  async pair).
* :data:`COLLECTIVE_KIND`: collective opcode -> the collective kind that prices it
  (:mod:`disco.sim.collectives`); the ``-done`` halves are in :data:`ZERO_COST_OPCODES` instead.
* :data:`ZERO_COST_OPCODES`: ops that never become kernels (parameters, constants, tuple plumbing,
  bitcasts, inlined calls, barriers, the ``-done`` halves of async collectives).
* :data:`LITERAL_OPERAND_OPCODES`: ops whose parenthesised text is a literal, not operand names.
* :data:`SAME_SHAPE_AS_FIRST`, :data:`SAME_SHAPE_AS_SECOND`: ops whose omitted result shape the
  parser infers from an operand.
* :data:`FUSIBLE_OPCODES`: what disco may put into an injected kLoop fusion (measured, see below).
* :data:`LAYOUT_SENSITIVE_PRODUCERS`: producers an injected fusion may not read directly.
* :data:`XLA_CPU_LOOP_OPCODES`, :data:`XLA_CPU_DUPLICATED_OPCODES`: what XLA:CPU's loop fusion
  fuses and duplicates (used by :mod:`disco.sim.cpu_fusion`).
* ``XLA_GPU_*``: the opcode classes of XLA:GPU's fusion (used by :mod:`disco.sim.gpu_fusion`, whose
  docstring says what each rule does).
* :data:`SLICE_READ_OPCODES`, :data:`IN_PLACE_UPDATE_OPERAND`: ops that touch only part of their
  operand 0 (what a kernel's bytes count: :mod:`disco.sim.costs`, :mod:`gnn.kernel_features`).
* :data:`OPCODES`, :func:`opcode_id`: the fixed opcode vocabulary of array features.
"""

from __future__ import annotations

from collections.abc import Mapping

# Elementwise ops that compute, by arity (HLO_OPCODE_LIST arities 1 and 2; copy left out).
ELEMENTWISE_UNARY: frozenset[str] = frozenset({
    "abs", "cbrt", "ceil", "convert", "cosine", "count-leading-zeros", "erf", "exponential",
    "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one", "logistic",
    "negate", "not", "popcnt", "real", "reduce-precision", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "sign", "sine", "sqrt", "tan", "tanh", "bitcast-convert",
    "stochastic-convert",
})
ELEMENTWISE_BINARY: frozenset[str] = frozenset({
    "add", "and", "atan2", "compare", "complex", "divide", "maximum", "minimum", "multiply",
    "or", "power", "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical",
    "subtract", "xor",
})
ELEMENTWISE: frozenset[str] = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | {"select", "clamp"}
# XLA's HloInstruction::IsElementwise: the above plus copy.
XLA_ELEMENTWISE: frozenset[str] = ELEMENTWISE | {"copy"}

COLLECTIVES: frozenset[str] = frozenset({
    "all-reduce", "all-reduce-start", "all-reduce-done", "all-gather", "all-gather-start",
    "all-gather-done", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-permute-start", "collective-permute-done", "collective-broadcast",
})
ALL_REDUCE_OPCODES: frozenset[str] = frozenset({"all-reduce", "all-reduce-start"})
# Ops that run other computations as control flow: not kernels themselves (their bodies' ops are).
CONTROL_FLOW_OPCODES: frozenset[str] = frozenset({"while", "conditional", "call"})

# Collective opcode -> the collective kind that prices it (disco.sim.collectives.COLLECTIVE_KINDS).
COLLECTIVE_KIND: Mapping[str, str] = {
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce",
    "all-gather": "all-gather", "all-gather-start": "all-gather",
    "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all",
    "collective-permute": "collective-permute", "collective-permute-start": "collective-permute",
}

# Ops that never become kernels: they take no time and only pass dependencies through.
ZERO_COST_OPCODES: frozenset[str] = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "call", "after-all",
    "opt-barrier", "all-reduce-done", "all-gather-done", "collective-permute-done",
})

# Ops whose parenthesised text is a literal (a constant's value, a parameter's number), not operands.
LITERAL_OPERAND_OPCODES: frozenset[str] = frozenset({"constant", "parameter", "iota", "rng-get-and-update-state"})

# Shape inference for an omitted result shape (disco.ir.hlo_parse; XLA's parser infers it too): ops
# whose result has the shape of their first operand (elementwise ops: XLA requires equal shapes;
# copy; opt-barrier returns its operand), and ops whose result has the shape of their second
# (select's and clamp's first operand is the predicate or the lower bound).
SAME_SHAPE_AS_FIRST: frozenset[str] = frozenset({
    "abs", "cbrt", "ceil", "cosine", "count-leading-zeros", "erf", "exponential",
    "exponential-minus-one", "floor", "is-finite", "log", "log-plus-one", "logistic", "negate",
    "not", "popcnt", "reduce-precision", "round-nearest-afz", "round-nearest-even", "rsqrt",
    "sign", "sine", "sqrt", "tan", "tanh", "copy", "opt-barrier",
    "add", "and", "atan2", "divide", "maximum", "minimum", "multiply", "or", "power",
    "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract", "xor",
})
SAME_SHAPE_AS_SECOND: frozenset[str] = frozenset({"select", "clamp"})

# Opcodes disco puts into an injected kLoop fusion. XLA:CPU (jaxlib 0.10.2) aborts the
# whole process (a CHECK failure, not an exception) on some injected fusions, e.g. a
# reshape inside one ("Check failed: output_shape.has_layout()"), so only opcodes
# measured safe are listed; scripts/tools/measure_fusible.py re-measures them, each compile
# in a child process, and docs/fusible_opcodes.md records the result.
FUSIBLE_OPCODES: frozenset[str] = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "constant", "convert",
    "copy", "cosine", "divide", "dynamic-slice", "dynamic-update-slice", "erf", "exponential",
    "exponential-minus-one", "floor", "iota", "is-finite", "log", "log-plus-one", "maximum",
    "minimum", "multiply", "negate", "not", "or", "pad", "power", "reduce", "reduce-precision",
    "reduce-window", "remainder", "reverse", "round-nearest-afz", "round-nearest-even", "rsqrt",
    "select", "sign", "sine", "slice", "sqrt", "subtract", "tan", "tanh", "xor",
})

# Producers whose results XLA:CPU's layout assignment may give a layout that an injected
# fusion cannot absorb (measured: a group fed by two convolutions aborted the process with
# "Check failed: has_layout()" on resnet50).
LAYOUT_SENSITIVE_PRODUCERS: frozenset[str] = frozenset({"convolution"})

# What XLA:CPU's loop fusion fuses (CpuInstructionFusion: elementwise ops plus CanBeLoopFused),
# and every opcode a planned group may hold.
XLA_CPU_LOOP_OPCODES: frozenset[str] = XLA_ELEMENTWISE | FUSIBLE_OPCODES | frozenset({
    "broadcast", "concatenate", "dynamic-slice", "dynamic-update-slice", "gather", "iota", "pad", "reduce",
    "reshape", "reverse", "slice", "transpose",
})
# Cheap producers XLA:CPU duplicates into every consumer instead of writing them out.
XLA_CPU_DUPLICATED_OPCODES: frozenset[str] = frozenset({"broadcast"})

# XLA:GPU's fusion (disco.sim.gpu_fusion; xla/service/gpu/transforms/priority_fusion.cc, gpu_fusible.cc).
# Heroes that are library calls (cuBLAS, cuDNN) or Triton gemm fusions.
XLA_GPU_MATRIX_OPCODES: frozenset[str] = frozenset({"dot", "convolution"})
# The hero of an input (reduction) fusion.
XLA_GPU_REDUCE_OPCODES: frozenset[str] = frozenset({"reduce"})
# Ops that are kernels of their own on XLA:GPU and take no producer or consumer.
XLA_GPU_UNFUSIBLE_OPCODES: frozenset[str] = frozenset({
    "scatter", "select-and-scatter", "sort", "custom-call", "while", "conditional", "rng",
    "rng-bit-generator", "rng-get-and-update-state", "fft", "triangular-solve", "cholesky",
    "batch-norm-training", "batch-norm-grad", "batch-norm-inference", "topk",
})
# Layout-only or free producers: values recomputed per element (partition-id too: fused into one consumer,
# it would order every other user of the device's shard offset after that consumer, as XLA's does not).
XLA_GPU_FREE_DUPLICATES: frozenset[str] = frozenset({"broadcast", "iota", "partition-id", "replica-id"})
# Ops that are bitcasts on GPU (default layouts): never a kernel, wherever their value goes.
XLA_GPU_BITCASTS: frozenset[str] = frozenset({"reshape", "bitcast-convert"})
# Cheap unary elementwise ops priority fusion duplicates into every (fusible) consumer.
XLA_GPU_CHEAP_UNARY: frozenset[str] = frozenset({"convert", "negate", "copy", "abs", "not", "sign"})
# Producers a matrix hero absorbs (operand layout / Triton prologue).
XLA_GPU_MATRIX_PROLOGUE: frozenset[str] = frozenset({"transpose", "convert", "copy"})
# A kernel made only of these moves data and computes nothing (the H100 kernel model's cheaper
# launch, disco.sim.costs.device_costs; the GNN's ``copy`` kernel class, gnn.kernel_features).
DATA_MOVEMENT_OPCODES: frozenset[str] = frozenset({
    "copy", "dynamic-slice", "dynamic-update-slice", "slice", "concatenate", "pad", "reshape"})

# Ops that read only part of their operand 0 (the buffer): as many bytes of it as they output.
# ``slice`` (static) reads its output's bytes too; it is left out because a static slice is
# usually a bitcast or fused away, and kernel_features counts it on its own.
SLICE_READ_OPCODES: frozenset[str] = frozenset({"dynamic-slice", "gather"})
# Ops that update their operand 0 in place (XLA aliases the result with that buffer): they read
# nothing of it and write only their update, the operand at this index. A scatter's combiner also
# reads the elements it updates (at most the update's bytes again); that read is left out.
IN_PLACE_UPDATE_OPERAND: Mapping[str, int] = {"dynamic-update-slice": 1, "scatter": 2}


def in_place_update(opcode: str, operands: int) -> int | None:
    """The index of the update operand of an in-place update with ``operands`` operands, else None.

    A variadic scatter (several buffers, ``2 * n + 1`` operands) is not treated as in place.

    Example:
      >>> in_place_update("scatter", 3), in_place_update("scatter", 5), in_place_update("add", 2)
      (2, None, None)
    """
    i = IN_PLACE_UPDATE_OPERAND.get(opcode)
    if i is None or operands <= i or (opcode == "scatter" and operands != 3):
        return None
    return i

# A fixed vocabulary so array features mean the same thing for every graph. An opcode's id is
# its position in this sorted tuple, so saved feature models depend on it: a new name shifts the
# ids after it.
OPCODES: tuple[str, ...] = tuple(sorted(ELEMENTWISE | COLLECTIVES | {
    "after-all", "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast",
    "broadcast", "call", "cholesky", "concatenate", "conditional", "constant", "convolution",
    "copy", "copy-start", "copy-done", "custom-call", "domain", "dot", "dynamic-reshape",
    "dynamic-slice", "dynamic-update-slice", "fft", "fusion", "gather", "get-dimension-size",
    "get-tuple-element", "infeed", "iota", "map", "opt-barrier", "outfeed", "pad",
    "parameter", "partition-id", "recv", "recv-done", "reduce", "reduce-window", "replica-id",
    "reshape", "reverse", "rng", "rng-bit-generator", "rng-get-and-update-state", "scatter",
    "select-and-scatter", "send", "send-done", "set-dimension-size", "slice", "sort",
    "transpose", "triangular-solve", "tuple", "while", "async-start", "async-done",
    "async-update", "topk", "ragged-all-to-all", "ragged-dot",
}))
OPCODE_INDEX: Mapping[str, int] = {op: i for i, op in enumerate(OPCODES)}
UNKNOWN_OPCODE = len(OPCODES)  # the id of every opcode outside the vocabulary


def opcode_id(opcode: str) -> int:
    """The feature id of ``opcode``: its index in :data:`OPCODES`, else :data:`UNKNOWN_OPCODE`."""
    return OPCODE_INDEX.get(opcode, UNKNOWN_OPCODE)

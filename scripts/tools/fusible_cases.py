"""The trials of scripts/tools/measure_fusible.py: one op under test per case, between two markers.

Each case computes the op from ``p = expm1(x)``; measure_fusible wraps it as ``sin(OP(...))``
and injects {expm1 -> OP -> sin} as one planned kLoop fusion.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

ROWS = 8  # local rows per device (and rows of the plain-jit input)
COLS = 16
PRODUCER, CONSUMER = "exponential-minus-one", "sine"  # markers around the op under test


@dataclasses.dataclass(frozen=True)
class Case:
    """One trial: ``body(p, y, i)`` computes the op under test from ``p = expm1(x)``.

    Attributes:
      name: the case's label (an opcode, or opcode-variant).
      opcode: the HLO opcode under test; the planned group must contain it.
      body: builds the op; ``y`` is a second f32 input like ``x``, ``i`` an s32 scalar.
      pull: opcodes outside the producer->consumer paths to pull into the group when all
        their users are in it (e.g. an iota or a constant that has no operand).
      subst: (opcode, new opcode): rewrite the one instruction with that opcode in the
        pre-optimisation text (for opcodes jax does not emit, e.g. copy, bitcast).
      drop: "producer" or "consumer": leave that marker out of the group, so the op
        reads a fusion parameter ("@input" variants) or is the fusion's root ("@root").
      note: shown in the table.
    """

    name: str
    opcode: str
    body: Callable[..., Any]
    pull: tuple[str, ...] = ()
    subst: tuple[str, str] | None = None
    drop: str = ""
    note: str = ""


def cases() -> list[Case]:
    """Every trial, with the edge variants (``@root``, ``@input``) of :data:`EDGE_VARIANTS`."""
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    f32, s32 = jnp.float32, jnp.int32
    gt = lambda a, v: a > jnp.asarray(v, a.dtype)  # noqa: E731 - compare with a broadcast constant
    rows = lambda p: p.shape[0]  # noqa: E731

    def scatter_add(p: Any) -> Any:
        dn = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,),
                                         scatter_dims_to_operand_dims=(0,))
        idx = jnp.array([[1], [3]], s32)
        return lax.scatter_add(p, idx, jnp.ones((2, p.shape[1]), f32), dn)

    c = Case
    unary = [
        ("abs", lax.abs), ("negate", lax.neg), ("exponential", lax.exp), ("log", lax.log),
        ("log-plus-one", lax.log1p),
        ("tanh", lax.tanh), ("sqrt", lax.sqrt), ("rsqrt", lax.rsqrt), ("cbrt", lax.cbrt), ("erf", lax.erf),
        ("floor", lax.floor), ("ceil", lax.ceil), ("sign", lax.sign), ("cosine", lax.cos),
        ("tan", lax.tan),
        ("round-nearest-afz", lambda p: lax.round(4 * p, lax.RoundingMethod.AWAY_FROM_ZERO)),
        ("round-nearest-even", lambda p: lax.round(4 * p, lax.RoundingMethod.TO_NEAREST_EVEN)),
    ]
    binary = [
        ("add", lax.add), ("subtract", lax.sub), ("multiply", lax.mul), ("divide", lax.div),
        ("maximum", lax.max), ("minimum", lax.min), ("power", lax.pow), ("atan2", lax.atan2),
        ("remainder", lax.rem),
    ]
    out = [c("markers", PRODUCER, lambda p, y, i: p,
             note=f"group is only the {PRODUCER} and {CONSUMER} markers every case uses")]
    out += [c(op, op, (lambda fn: lambda p, y, i: fn(p))(fn)) for op, fn in unary]
    out += [c(op, op, (lambda fn: lambda p, y, i: fn(p, y))(fn)) for op, fn in binary]
    out += [
        c("compare", "compare", lambda p, y, i: lax.convert_element_type(p > y, f32),
          note="compare -> convert"),
        c("select", "select", lambda p, y, i: lax.select(gt(p, 1.0), p, y)),
        c("convert", "convert",
          lambda p, y, i: lax.convert_element_type(lax.convert_element_type(p, jnp.float16), f32),
          note="f32 -> f16 -> f32"),
        c("convert-int", "convert",
          lambda p, y, i: lax.convert_element_type(lax.convert_element_type(p * 8, s32), f32),
          note="f32 -> s32 -> f32"),
        c("clamp", "clamp", lambda p, y, i: lax.clamp(jnp.float32(0.3), p, jnp.float32(1.0))),
        c("is-finite", "is-finite", lambda p, y, i: lax.select(lax.is_finite(p), p, y)),
        c("and", "and", lambda p, y, i: lax.select(lax.bitwise_and(gt(p, 1.0), gt(y, 1.0)), p, y)),
        c("or", "or", lambda p, y, i: lax.select(lax.bitwise_or(gt(p, 1.0), gt(y, 1.0)), p, y)),
        c("xor", "xor", lambda p, y, i: lax.select(lax.bitwise_xor(gt(p, 1.0), gt(y, 1.0)), p, y)),
        c("not", "not", lambda p, y, i: lax.bitcast_convert_type(
            lax.bitwise_not(lax.bitcast_convert_type(p, s32)), f32), note="on s32 (bitcast-converts around it)"),
        c("logistic", "logistic", lambda p, y, i: lax.tanh(p), subst=("tanh", "logistic"),
          note="jax emits 1/(1+exp(-x)); a tanh rewritten to logistic in the HLO text"),
        c("reduce-precision", "reduce-precision",
          lambda p, y, i: lax.reduce_precision(p, exponent_bits=5, mantissa_bits=10)),
        c("bitcast-convert", "bitcast-convert",
          lambda p, y, i: lax.bitcast_convert_type(lax.bitcast_convert_type(p, s32) + 1, f32),
          note="f32 -> s32, add 1, -> f32"),
        c("bitcast-convert-narrow", "bitcast-convert",
          lambda p, y, i: lax.bitcast_convert_type(lax.bitcast_convert_type(p, jnp.uint16), f32),
          note="f32 -> u16[8,16,2] -> f32 (changes rank)"),
        c("broadcast", "broadcast",
          lambda p, y, i: lax.broadcast_in_dim(p, (*p.shape, 4), (0, 1)), note="[8,16] -> [8,16,4]"),
        c("broadcast-transposing", "broadcast",
          lambda p, y, i: lax.broadcast_in_dim(p, (COLS, p.shape[0], 4), (1, 0)),
          note="[8,16] -> [16,8,4], dimensions={1,0}"),
        c("broadcast-scalar", "broadcast", lambda p, y, i: p * jnp.float32(2.5),
          pull=("constant", "broadcast"), note="constant f32[] + broadcast pulled into the group"),
        c("broadcast-row", "broadcast",
          lambda p, y, i: p + lax.broadcast_in_dim(y[0], p.shape, (1,)), pull=("broadcast",),
          note="broadcast of an outside [16] operand"),
        c("reshape-split", "reshape", lambda p, y, i: p.reshape(2, rows(p) // 2, COLS),
          note="[8,16] -> [2,4,16]"),
        c("reshape-merge", "reshape", lambda p, y, i: p.reshape(rows(p) * 2, COLS // 2),
          note="[8,16] -> [16,8]"),
        c("reshape-flatten", "reshape", lambda p, y, i: p.reshape(-1), note="[8,16] -> [128]"),
        c("reshape-unit-dim", "reshape", lambda p, y, i: p.reshape(rows(p), COLS, 1),
          note="[8,16] -> [8,16,1] (bitcast-like)"),
        c("reshape-4d-unit", "reshape", lambda p, y, i: p.reshape(2, rows(p) // 2, COLS, 1),
          note="[8,16] -> [2,4,16,1]"),
        c("transpose", "transpose", lambda p, y, i: lax.transpose(p, (1, 0))),
        c("slice", "slice", lambda p, y, i: lax.slice(p, (1, 0), (5, COLS), (1, 2)),
          note="[1:5, ::2]"),
        c("concatenate", "concatenate", lambda p, y, i: lax.concatenate([p, y], 1)),
        c("pad", "pad", lambda p, y, i: lax.pad(p, jnp.float32(0), [(1, 2, 0), (0, 3, 1)]),
          note="edge and interior padding"),
        c("pad-negative", "pad", lambda p, y, i: lax.pad(p, jnp.float32(0), [(-1, 2, 0), (2, -3, 0)]),
          note="negative (cropping) edge padding"),
        c("iota", "iota", lambda p, y, i: p + lax.broadcasted_iota(f32, p.shape, 1),
          pull=("iota", "broadcast"), note="jax emits iota f32[16] + broadcast; both pulled in"),
        c("constant", "constant",
          lambda p, y, i: p + np.arange(p.size, dtype=np.float32).reshape(p.shape) / 100,
          pull=("constant",), note="a non-scalar literal (shard_map passes it into the body as "
          "an argument, so only the jit setting has it in the group)"),
        c("constant-scalar", "constant", lambda p, y, i: p * jnp.float32(2.5),
          pull=("constant", "broadcast"), note="constant f32[] -> broadcast -> multiply"),
        c("reverse", "reverse", lambda p, y, i: lax.rev(p, (0,))),
        c("reverse-both", "reverse", lambda p, y, i: lax.rev(p, (0, 1))),
        c("copy", "copy", lambda p, y, i: lax.neg(p), subst=("negate", "copy"),
          note="a negate rewritten to copy in the HLO text"),
        c("dynamic-slice", "dynamic-slice", lambda p, y, i: lax.dynamic_slice(p, (i, 0), (4, COLS))),
        c("dynamic-update-slice", "dynamic-update-slice",
          lambda p, y, i: lax.dynamic_update_slice(p, y[:2], (i, 0))),
        c("gather", "gather", lambda p, y, i: p[jnp.array([1, 3, 5], s32)]),
        c("scatter", "scatter", lambda p, y, i: scatter_add(p)),
        c("reduce", "reduce", lambda p, y, i: lax.reduce(p, jnp.float32(0), lax.add, (1,)),
          note="sum over the last axis"),
        c("reduce-axis0", "reduce", lambda p, y, i: lax.reduce(p, jnp.float32(0), lax.add, (0,)),
          note="sum over the first (major) axis"),
        c("reduce-window", "reduce-window",
          lambda p, y, i: lax.reduce_window(p, -jnp.inf, lax.max, (2, 1), (2, 1), "VALID")),
        c("reduce-window-2d", "reduce-window",
          lambda p, y, i: lax.reduce_window(p, jnp.float32(0), lax.add, (2, 3), (1, 2),
                                            [(0, 1), (1, 1)]),
          note="sum, window 2x3, stride 1x2, padded"),
        c("dot", "dot", lambda p, y, i: lax.dot_general(p, y, (((1,), (1,)), ((), ())))),
        c("sort", "sort", lambda p, y, i: lax.sort(p, dimension=1)),
    ]
    # Non-elementwise ops again at the edges of the group: as the fusion's root (its
    # result leaves the fusion) and reading a fusion parameter directly.
    variants = []
    for case in out:
        if case.name in EDGE_VARIANTS:
            variants.append(dataclasses.replace(case, name=case.name + "@root", drop="consumer"))
            variants.append(dataclasses.replace(case, name=case.name + "@input", drop="producer"))
    return out + variants


EDGE_VARIANTS = frozenset({
    "convert", "bitcast-convert", "broadcast", "broadcast-transposing", "broadcast-row", "reshape-split", "reshape-merge",
    "reshape-flatten", "reshape-unit-dim", "reshape-4d-unit", "transpose", "slice",
    "concatenate", "pad", "reverse", "copy", "dynamic-slice", "dynamic-update-slice", "gather",
    "reduce", "iota", "broadcast-scalar"})

"""XLA compile options as a plan axis: per backend, the options that matter and their values.

A plan's ``compile_options`` reach XLA per compile (``Lowered.compile(compiler_options=...)``),
so they pass the GPU's PJRT plugin where an injected ``mhlo.fusion`` cannot. This module is the
one table of the options a search may set, per backend:

* ``gpu``: XLA:GPU's all-reduce combine threshold (XLA's default 30 MiB + 7 bytes; NVIDIA's
  JAX-Toolbox advises sweeping it by powers of two) and the latency-hiding scheduler (off by
  default; JAX-Toolbox turns it on); both accepted by jax 0.11.2's GPU compile (measured on an
  H100, docs/archive/lab-notebook.md, "Bucket, cut and compile-option plans on an H100"). Pipelined all-reduce is not in the table: that compile rejects
  ``xla_gpu_enable_pipelined_all_reduce`` ("No such compile option", measured there). With them,
  for a step with sharded parameters (FSDP), the all-gather and reduce-scatter combiners' thresholds
  (``xla_gpu_all_gather_combine_threshold_bytes``, ``xla_gpu_reduce_scatter_combine_threshold_bytes``;
  XLA's default 30 MiB + 7 bytes as the all-reduce one's): a per-compile key XLA accepts
  (/work/shared/XLA_NOTES.md, "Per-compile options"); not yet compiled on an H100. XLA:CPU has neither
  combiner (its compiled modules keep every all-gather and it writes no reduce-scatter), so
  :func:`check` refuses them on CPU, as it refuses ``optimization_level``, rather than let a plan
  claim what does nothing there.
* ``cpu``: which ops XLA:CPU hands to YNNPACK (``xla_cpu_experimental_ynn_fusion_type``, a
  comma-separated list of ``DebugOptions.LibraryFusionType`` names). jaxlib 0.10.2's default
  sends dots, convolutions and reductions there (the explicit list below compiles the same
  module as leaving it unset, measured on unet tiny); the search's one other value keeps the
  reductions in XLA's own loop fusions, which is what the fusion groups that won on CPU did
  (docs/archive/lab-notebook.md, "Reductions out of YNNPACK as a CPU compile option"). Per compile the option takes the full enum names only:
  XLA_FLAGS' short forms ("-reduce", "individual_dot") are rejected there (measured). The GPU
  options are accepted by the CPU compile but do nothing there, and XLA:CPU's all-reduce
  combiner has no threshold flag (it merges every all-reduce; the plan's buckets replace it).

Outside the tables, ``optimization_level`` (jax's ``jax_optimization_level``, an effort level of
XLA's build options that jax passes per compile): at ``O1`` and above XLA:GPU turns on what it
otherwise leaves off (``xla/service/gpu/flag_utils.h``, ``IsPassEnabledAtOptimizationEffort``): the
latency-hiding scheduler, the collective pipeliner (data-parallel all-reduces, all-gathers and
reduce-scatters moved across loop iterations), double-buffered ``while`` loops (unrolled by two),
and, on Hopper and Blackwell, the speed-of-light latency estimator for the schedule
(``SolLatencyEstimator::IsSupportedForModule``). A deviceless compile for an H100 with ``O1``
unrolled a 4-trip loop holding an all-reduce into 2 trips of two (measured with jax 0.12.0.1;
the latency-hiding scheduler alone kept 4 trips). XLA:CPU has none of these passes: a plan carrying
it is refused on CPU (:func:`check`).

Outside the tables too, XLA:GPU's loop passes, each one switch of what ``O1`` turns on together
(:data:`LOOP_PASSES`): the collective pipeliner per collective (``xla_gpu_pipeline_all_reduce``,
``..._all_gather``, ``..._reduce_scatter``: a collective in a ``while`` loop's body moved to the
iteration before or after, so it overlaps the next iteration's compute; in jax 0.11.2 an enum,
``COLLECTIVE_PIPELINING_MODE_DEFAULT`` follows the optimization effort, ``_OFF``, ``_ON``; its
``_EXPLICIT`` needs frontend attributes a plan does not write, so it is not offered) and
double-buffered loops (``xla_gpu_enable_while_loop_double_buffering``: the body unrolled by two).
jax 0.11.2's compile rejects the boolean generation MaxText's older scripts set
(``xla_gpu_enable_pipelined_all_gather``, "No such compile option"; measured deviceless for an H100,
2026-12-02); the enum generation is what it takes: a deviceless compile of a 4-trip loop whose body
all-reduces a dot into a ``dynamic-update-slice`` of the loop's output kept 4 trips by default, 3
(one iteration peeled: the pipeliner) with ``xla_gpu_pipeline_all_reduce=..._ON``, and 2 with double
buffering. They change where a loop's collectives run, never what they sum. The emulated tier does
not model them (it prices the step as if they were unset), so only the compiled tier prices a plan
carrying one (:data:`COMPILED_ONLY`); XLA:CPU has none of these passes, so :func:`check` refuses
them on CPU.

Values are strings, as XLA parses them (booleans "True"/"False", sizes in bytes, choices
one of the option's ``values``).

Example:
  >>> [o.key for o in table("gpu")][:1]
  ['xla_gpu_all_reduce_combine_threshold_bytes']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

Backend = Literal["cpu", "gpu"]
BACKENDS: tuple[str, ...] = ("cpu", "gpu")

THRESHOLD = "xla_gpu_all_reduce_combine_threshold_bytes"
SCHEDULER = "xla_gpu_enable_latency_hiding_scheduler"
GATHER_THRESHOLD = "xla_gpu_all_gather_combine_threshold_bytes"
SCATTER_THRESHOLD = "xla_gpu_reduce_scatter_combine_threshold_bytes"
CPU_HAS_NO_GATHER_COMBINER = (
    "XLA:CPU has no all-gather or reduce-scatter combiner for this threshold to set (its compiled modules "
    "keep every all-gather, and it writes a gradient's return to its shard as an all-reduce and a slice); "
    "expected a GPU backend (a GPU cluster such as h100-sxm-8, or a run on a GPU); on CPU, gather buckets "
    "(FusionPlan.gather_buckets) merge all-gathers")
# Rejected by jax 0.11.2's GPU compile ("No such compile option", on an H100): kept to name it.
PIPELINED_ALL_REDUCE = "xla_gpu_enable_pipelined_all_reduce"
YNN_FUSION_TYPE = "xla_cpu_experimental_ynn_fusion_type"
OPTIMIZATION_LEVEL = "optimization_level"  # jax_optimization_level; GPU only (module docstring)
OPTIMIZATION_LEVELS: tuple[str, ...] = ("O0", "O1", "O2", "O3")
# XLA's ExecutionOptions.EffortLevel numbers: what a compile is given (jax 0.10.2 takes only the number,
# "O1" fails there; 0.12.0.1 takes both; measured on CPU).
EFFORT_LEVEL_NUMBERS = {"O0": 9, "O1": 19, "O2": 29, "O3": 39}
CPU_HAS_NO_OPTIMIZATION_LEVEL = (
    "jax's optimization level is XLA:GPU's: at O1 it turns on the latency-hiding scheduler, collective "
    "pipelining, double-buffered loops and (Hopper, Blackwell) the speed-of-light latency estimator, and "
    "XLA:CPU has none of these passes; expected a GPU backend (a GPU cluster such as h100-sxm-8, priced "
    "through deviceless XLA:GPU, or a run on a GPU)")
PIPELINE_ALL_REDUCE = "xla_gpu_pipeline_all_reduce"
PIPELINE_ALL_GATHER = "xla_gpu_pipeline_all_gather"
PIPELINE_REDUCE_SCATTER = "xla_gpu_pipeline_reduce_scatter"
PIPELINE_KEYS: tuple[str, ...] = (PIPELINE_ALL_REDUCE, PIPELINE_ALL_GATHER, PIPELINE_REDUCE_SCATTER)
_MODE = "COLLECTIVE_PIPELINING_MODE_"
PIPELINE_DEFAULT, PIPELINE_OFF, PIPELINE_ON = _MODE + "DEFAULT", _MODE + "OFF", _MODE + "ON"
PIPELINE_MODES: tuple[str, ...] = (PIPELINE_DEFAULT, PIPELINE_OFF, PIPELINE_ON)  # jax 0.11.2's enum, less EXPLICIT
DOUBLE_BUFFERING = "xla_gpu_enable_while_loop_double_buffering"
# XLA:GPU's loop passes a plan may switch one by one (module docstring): key -> the values it takes.
LOOP_PASSES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(PIPELINE_KEYS, PIPELINE_MODES), DOUBLE_BUFFERING: ("False", "True")}
# The options only the compiled tier prices: the emulated tier models none of the passes they turn on.
COMPILED_ONLY: tuple[str, ...] = (OPTIMIZATION_LEVEL, *LOOP_PASSES)
CPU_HAS_NO_LOOP_PASSES = (
    "XLA:GPU's collective pipeliner and double-buffered loops move a while loop's collectives across its "
    "iterations, and XLA:CPU runs neither pass; expected a GPU backend (a GPU cluster such as h100-sxm-8, "
    "priced through deviceless XLA:GPU, or a run on a GPU)")
_LIB = "LIBRARY_FUSION_TYPE_"
YNN_FUSION_TYPES: tuple[str, ...] = tuple(_LIB + t for t in (
    "DOT", "ELTWISE", "REDUCE", "INDIVIDUAL_DOT", "INDIVIDUAL_CONVOLUTION"))  # jaxlib 0.10.2's enum
YNN_DEFAULT = ",".join(_LIB + t for t in ("INDIVIDUAL_DOT", "INDIVIDUAL_CONVOLUTION", "REDUCE"))
YNN_NO_REDUCE = ",".join(_LIB + t for t in ("INDIVIDUAL_DOT", "INDIVIDUAL_CONVOLUTION"))
MB = 1 << 20
XLA_DEFAULT_THRESHOLD = 30 * MB + 7  # xla/debug_options_flags.cc (late 2025)


class CompileOption(NamedTuple):
    """One XLA option a plan may set.

    Attributes:
      key: the XLA debug-option name, as ``compiler_options`` takes it.
      kind: "bool" (a move flips it), "bytes" (a move steps it along ``values``) or "choice"
        (a move switches it to another of ``values``).
      default: XLA's own value when the plan leaves it unset.
      values: the values a search steps through, in order.
      what: one line on what it changes.
    """

    key: str
    kind: Literal["bool", "bytes", "choice"]
    default: str
    values: tuple[str, ...]
    what: str


_GPU: tuple[CompileOption, ...] = (
    CompileOption(THRESHOLD, "bytes", str(XLA_DEFAULT_THRESHOLD),
                  tuple(str(1 << k) for k in range(20, 31)),  # 1 MiB .. 1 GiB
                  "all-reduces XLA's combiner merges, up to this many bytes each"),
    CompileOption(SCHEDULER, "bool", "False", ("False", "True"),
                  "the latency-hiding scheduler: collectives overlap independent compute"),
    CompileOption(GATHER_THRESHOLD, "bytes", str(XLA_DEFAULT_THRESHOLD),
                  tuple(str(1 << k) for k in range(20, 31)),  # 1 MiB .. 1 GiB
                  "all-gathers (a sharded step's parameters) XLA's combiner merges, up to this many bytes each"),
    CompileOption(SCATTER_THRESHOLD, "bytes", str(XLA_DEFAULT_THRESHOLD),
                  tuple(str(1 << k) for k in range(20, 31)),
                  "reduce-scatters (a sharded step's gradients) XLA's combiner merges, up to this many bytes each"),
)
_GPU_ONLY = {GATHER_THRESHOLD: CPU_HAS_NO_GATHER_COMBINER, SCATTER_THRESHOLD: CPU_HAS_NO_GATHER_COMBINER}
_CPU: tuple[CompileOption, ...] = (
    CompileOption(YNN_FUSION_TYPE, "choice", YNN_DEFAULT, (YNN_DEFAULT, YNN_NO_REDUCE),
                  "the ops XLA:CPU hands to YNNPACK; without REDUCE, reductions stay in XLA's loop fusions"),
)
_TABLES: dict[str, tuple[CompileOption, ...]] = {"cpu": _CPU, "gpu": _GPU}
# Options outside the tables that a plan may still carry, because they change how the step is
# scheduled or compiled and never what it computes beyond rounding (None: any value; else the values
# that keep the results). Every other key is refused: XLA's debug options include ones that change
# results (xla_cpu_enable_fast_min_max=True returned 3.0 for the max of an array holding NaN, measured).
_KEEP_RESULTS: dict[str, tuple[str, ...] | None] = {
    PIPELINED_ALL_REDUCE: None,  # scripts/tools/check_gpu.py tries it; jax 0.11.2's GPU compile rejects it
    "xla_cpu_enable_fast_math": ("false", "False"),  # XLA's default; plans of the early random generator set it
}


def normalize(backend: str) -> str:
    """``"cpu"`` or ``"gpu"`` for a jax platform name ("cuda" and "rocm" are GPUs).

    Raises:
      ValueError: for a platform that is neither.
    """
    b = str(backend).lower()
    if b in ("gpu", "cuda", "rocm"):
        return "gpu"
    if b == "cpu":
        return "cpu"
    raise ValueError(f"backend: expected 'cpu' or 'gpu' (or a jax platform: cuda, rocm), got {backend!r}")


def table(backend: str) -> tuple[CompileOption, ...]:
    """The options a search may set on ``backend`` (see the module docstring)."""
    return _TABLES[normalize(backend)]


def spec(key: str, backend: str) -> CompileOption | None:
    """The table entry for ``key`` on ``backend``, or None when the table does not list it."""
    return next((o for o in table(backend) if o.key == key), None)


def value(options: Mapping[str, str] | tuple[tuple[str, str], ...], key: str, backend: str) -> str | None:
    """The value ``key`` takes: the plan's own, else XLA's default (None for an unlisted key left unset)."""
    opts = dict(options)
    if key in opts:
        return opts[key]
    o = spec(key, backend)
    return None if o is None else o.default


def as_bool(text: str) -> bool:
    """XLA's reading of a boolean option value ("True"/"true"/"1" are true).

    Raises:
      ValueError: for a value that is no boolean.
    """
    t = str(text).strip().lower()
    if t in ("true", "1"):
        return True
    if t in ("false", "0"):
        return False
    raise ValueError(f"expected a boolean option value (True or False), got {text!r}")


def check(options: tuple[tuple[str, str], ...], backend: str) -> None:
    """Checks ``options`` for ``backend``: the values of its table's options; the other backend's
    table options (accepted and inert, e.g. the GPU options on XLA:CPU); and that any other key is
    one known to keep what the step computes (``_KEEP_RESULTS``), so that a plan never changes the
    step's results; ``optimization_level``, the loop passes (:data:`LOOP_PASSES`) and the all-gather /
    reduce-scatter thresholds only on GPU (XLA:CPU has none of their passes).

    Raises:
      ValueError: naming the option, the value received and what was expected.
    """
    for key, val in options:
        if key == OPTIMIZATION_LEVEL:
            _check_optimization_level(val, backend)
            continue
        if key in LOOP_PASSES:
            _check_loop_pass(key, val, backend)
            continue
        if key in _GPU_ONLY and normalize(backend) == "cpu":
            raise ValueError(f"compile option {key}={val!r} on cpu: {_GPU_ONLY[key]}")
        o = spec(key, backend)
        if o is None:
            _check_outside_table(key, val, backend)
            continue
        if o.kind == "bool":
            try:
                as_bool(val)
            except ValueError:
                raise ValueError(f"compile option {key}: expected True or False, got {val!r}") from None
        elif o.kind == "choice":
            if o.key == YNN_FUSION_TYPE:
                bad = [t for t in str(val).split(",") if t and t not in YNN_FUSION_TYPES]
                if bad or " " in str(val):
                    raise ValueError(f"compile option {key}: expected a comma-separated list (no spaces) of "
                                     f"{', '.join(YNN_FUSION_TYPES)}, got {val!r}")
            elif val not in o.values:
                raise ValueError(f"compile option {key}: expected one of {', '.join(o.values)}, got {val!r}")
        elif not (str(val).isdigit() and int(val) > 0):
            raise ValueError(f"compile option {key}: expected a positive number of bytes, got {val!r}")


def _check_optimization_level(val: str, backend: str) -> None:
    """Refuses ``optimization_level`` on CPU (with the reason) and a value that is no effort level."""
    if normalize(backend) == "cpu":
        raise ValueError(f"compile option {OPTIMIZATION_LEVEL}={val!r} on cpu: {CPU_HAS_NO_OPTIMIZATION_LEVEL}")
    if val not in OPTIMIZATION_LEVELS:
        raise ValueError(f"compile option {OPTIMIZATION_LEVEL}: expected one of {', '.join(OPTIMIZATION_LEVELS)}, "
                         f"got {val!r}")


def _check_loop_pass(key: str, val: str, backend: str) -> None:
    """Refuses a loop pass's option on CPU (with the reason) and a value it does not take."""
    if normalize(backend) == "cpu":
        raise ValueError(f"compile option {key}={val!r} on cpu: {CPU_HAS_NO_LOOP_PASSES}")
    if key == DOUBLE_BUFFERING:
        try:
            as_bool(val)
        except ValueError:
            raise ValueError(f"compile option {key}: expected True or False, got {val!r}") from None
    elif val not in LOOP_PASSES[key]:
        hint = (f" (XLA_FLAGS' {val!r} is written {_MODE}{val.upper()} per compile)"
                if _MODE + str(val).upper() in LOOP_PASSES[key] else "")
        raise ValueError(f"compile option {key}: expected one of {', '.join(LOOP_PASSES[key])}, got {val!r}{hint}")


def compiled_only(options: Mapping[str, str] | tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The keys of ``options`` that only the compiled tier prices (:data:`COMPILED_ONLY`)."""
    return tuple(k for k in dict(options) if k in COMPILED_ONLY)


def _check_outside_table(key: str, val: str, backend: str) -> None:
    """Refuses an option outside ``backend``'s table unless another backend's table lists it or it
    keeps the step's results (``_KEEP_RESULTS``)."""
    if any(o.key == key for table_ in _TABLES.values() for o in table_):
        return
    allowed = _KEEP_RESULTS.get(key, ())
    if key in _KEEP_RESULTS and (allowed is None or str(val) in allowed):
        return
    if allowed:
        raise ValueError(f"compile option {key}: expected {' or '.join(allowed)}, got {val!r} (other values "
                         "change what the step computes)")
    known = sorted({o.key for table_ in _TABLES.values() for o in table_} | set(_KEEP_RESULTS) | set(COMPILED_ONLY))
    raise ValueError(f"compile option {key}={val!r}: not one a plan may carry; plans carry only options "
                     f"that keep what the step computes: {', '.join(known)}")

"""Per-op times of a compiled step from jax's profiler, mapped back to a disco plan.

``profile(fn, args)`` warms the step, times untraced steps, then runs ``steps``
steps under ``jax.profiler.trace`` and reads the ``*.xplane.pb`` it writes with
``jax.profiler.ProfileData`` (no TensorBoard). Every trace event that carries an
``hlo_op`` stat is one execution of one compiled HLO instruction on one device
(``device_ordinal``); an op's time is the sum of its events divided by the steps
and averaged over the devices.

Each compiled op is mapped back to the plan and the pre-optimisation graph
through its ``metadata={op_name=...}``:

* ``.../disco.fusion.K``: the rewriter's fusion K, i.e. a planned group;
* ``.../disco_bucket_K``: the rewriter's bucket all-reduce K (``bucket_part="all-reduce"``,
  all-reduce ops only: XLA also gives that name to a bitcast of its result fused into a
  consumer); ``.../disco.bucket.K.*`` and those other ops are the flatten/concatenate/slice
  work around it (``bucket_part="pack"``) when that is all they do: an op that fuses it into
  other work (a slice into the optimizer's update) is that work's, not the bucket's;
* otherwise ``<call>/<instruction name>`` (what the HLO -> StableHLO round trip
  leaves) names the pre-optimisation instruction; a fusion covers every
  instruction named inside its fused computation. A step compiled by XLA's
  default path (no plan) keeps jax's own op names, which name no instruction,
  so its ops map to no nodes.

Caveats, measured on XLA:CPU with jax 0.10.2:

* tracing changes the step time by a factor that varies with the step and the run
  (``traced_step_s`` over ``step_s``: 0.5x to 4.4x over the zoo's tiny steps on 2 devices
  and 2 shared cores, where the per-op sum ``total_op_s`` reached 2.3x ``step_s``): per-op
  times are good for comparing kernels, not for predicting the step time;
* an all-reduce event includes the wait for the slowest device thread to reach
  the rendezvous, so collective times are upper bounds on the transfer itself;
* ops inside while/conditional bodies are reported too (``top_level=False``); the
  parent op's own event does not reliably span them (a gpt2 tiny step's while: 39 of its
  body's 140 events inside it in one run, more than the body's time in another), so
  ``ProfileResult.total_op_s`` sums the leaf ops (every op but while/conditional/call).

Example::

  res = profile(train_step, (state, batch), plan=plan, graph=graph)
  res.by_group(), res.by_bucket()       # plan group / bucket index -> seconds per step
  TableCosts.from_records(res.kernel_records())
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import numbers
import os
import re
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from disco.ir.graph import HloGraph
from disco.ir.opcodes import ALL_REDUCE_OPCODES, CONTROL_FLOW_OPCODES
from disco.plans.plan import FusionPlan

_TRACE_LOCK = threading.Lock()  # jax's profiler is process-wide: one trace at a time

_GROUP_RE = re.compile(r"(?:^|/)disco\.fusion\.(\d+)$")
_BUCKET_AR_RE = re.compile(r"disco_bucket_(\d+)")
_BUCKET_PACK_RE = re.compile(r"disco\.bucket\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class OpProfile:
    """One compiled HLO instruction's time.

    Attributes:
      name: the compiled instruction name (the trace's ``hlo_op``).
      opcode: its opcode ("" if the compiled text did not name it).
      seconds: time per step, summed over its events and averaged over devices.
      count: events per step per device.
      top_level: True for ops of the entry computation (not nested in a while body).
      op_name: its metadata op_name, if any.
      group: index into ``plan.groups`` of the planned group it implements, or None.
      bucket: index into ``plan.buckets`` of the bucket it belongs to, or None.
      bucket_part: "all-reduce" or "pack" (flatten/concatenate/slice) for bucket ops.
      nodes: pre-optimisation instruction names it covers.
      kernel_key: ``disco.sim.costs.kernel_key`` of those nodes ("" when unknown).
    """

    name: str
    opcode: str
    seconds: float
    count: float
    top_level: bool = True
    op_name: str | None = None
    group: int | None = None
    bucket: int | None = None
    bucket_part: str | None = None
    nodes: tuple[str, ...] = ()
    kernel_key: str = ""

    def __repr__(self) -> str:
        where = (f", group {self.group}" if self.group is not None else "") + (
            f", bucket {self.bucket} {self.bucket_part}" if self.bucket is not None else "")
        return (f"OpProfile({self.name[:60]!r}, {self.opcode or '?'}, {self.seconds * 1e6:.1f} us x {self.count:g}"
                f"{where}, {len(self.nodes)} nodes)")


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """What :func:`profile` measured.

    Attributes:
      step_s: median wall time of untraced steps (seconds).
      step_samples_s: the untraced samples.
      traced_step_s: wall time per step while tracing (not ``step_s``: see the module's caveats).
      steps: traced steps.
      devices: device ordinals seen in the trace.
      module: the compiled HLO module's name.
      ops: per compiled op, slowest first.
      fallback_reason: why the requested plan was not applied (then the ops are XLA's default
        compile's, mapped to no group or bucket), or None.
    """

    step_s: float
    step_samples_s: tuple[float, ...]
    traced_step_s: float
    steps: int
    devices: int
    module: str
    ops: tuple[OpProfile, ...]
    fallback_reason: str | None = None

    def __repr__(self) -> str:
        fell = "" if self.fallback_reason is None else ", fell back"
        return (f"ProfileResult({self.module[:60]!r}, {self.step_s * 1e3:.3f} ms/step, {self.devices} devices, "
                f"{self.steps} steps traced, {len(self.ops)} ops{fell})")

    @property
    def total_op_s(self) -> float:
        """Sum of the leaf ops' times per step (devices averaged): every op, nested in a loop
        body or not, but the control-flow ops whose bodies' ops are counted themselves."""
        return sum(o.seconds for o in self.ops if o.opcode not in CONTROL_FLOW_OPCODES)

    def by_group(self) -> dict[int, float]:
        """Plan group index -> seconds per step of the compiled fusion(s) implementing it."""
        out: dict[int, float] = collections.defaultdict(float)
        for o in self.ops:
            if o.group is not None:
                out[o.group] += o.seconds
        return dict(sorted(out.items()))

    def by_bucket(self, part: str | None = "all-reduce") -> dict[int, float]:
        """Plan bucket index -> seconds per step (``part=None`` adds the pack/unpack ops)."""
        out: dict[int, float] = collections.defaultdict(float)
        for o in self.ops:
            if o.bucket is not None and (part is None or o.bucket_part == part):
                out[o.bucket] += o.seconds
        return dict(sorted(out.items()))

    def kernel_records(self) -> list[tuple[str, float]]:
        """(kernel key, seconds) for :meth:`disco.sim.costs.TableCosts.from_records`.

        Compiled ops covering the same pre-optimisation nodes are summed into one
        record (XLA can split one instruction into several kernels); collectives,
        ops that map to no node and ops in loop bodies (``top_level=False``: their time
        per step is the trip count's multiple of a kernel's) are left out.
        """
        acc: dict[tuple[str, ...], list] = {}
        for o in self.ops:
            if not o.kernel_key or o.bucket_part == "all-reduce" or not o.top_level:
                continue
            rec = acc.setdefault(o.nodes, [o.kernel_key, 0.0])
            rec[1] += o.seconds
        return [(k, s) for k, s in acc.values()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_ms": self.step_s * 1e3, "traced_step_ms": self.traced_step_s * 1e3,
            "step_samples_ms": [s * 1e3 for s in self.step_samples_s], "steps": self.steps,
            "devices": self.devices, "module": self.module, "total_op_ms": self.total_op_s * 1e3,
            "fallback_reason": self.fallback_reason,
            "ops": [{**dataclasses.asdict(o), "nodes": list(o.nodes)} for o in self.ops],
        }


# -- mapping compiled ops to the plan ------------------------------------------------------------
def plan_ids_from_rewritten(hlo: str) -> tuple[dict[int, frozenset[str]], dict[int, frozenset[str]]]:
    """The rewriter's numbering in a rewritten pre-optimisation text.

    Returns:
      (fusion K -> member names, bucket K -> member all-reduce names), read from the
      names the rewriter gives (``disco.f{K}.{member}`` inside fused computations,
      members re-created from ``disco.bucket.{K}.slice.{j}`` or ``disco.bucket.{K}``).
    """
    from disco.ir.hlo_parse import parse_module

    groups: dict[int, set[str]] = collections.defaultdict(set)
    buckets: dict[int, set[str]] = collections.defaultdict(set)
    inner = re.compile(r"^disco\.f(\d+)\.(?!param\.\d+$)(?!tuple$)(.+)$")
    slice_ = re.compile(r"^disco\.bucket\.(\d+)(?:\.slice\.\d+)?$")
    for comp in parse_module(hlo).computations:
        for ins in comp.instructions:
            m = inner.match(ins.name)
            if m and ins.opcode != "parameter":
                groups[int(m.group(1))].add(m.group(2))
            if ins.opcode in ("reshape", "get-tuple-element") and len(ins.operands) == 1:
                m = slice_.match(ins.operands[0])
                if m and not ins.name.startswith("disco."):
                    buckets[int(m.group(1))].add(ins.name)
    return ({k: frozenset(v) for k, v in groups.items()}, {k: frozenset(v) for k, v in buckets.items()})


def _plan_index(ids: dict[int, frozenset[str]], parts: Sequence[Sequence[str]]) -> dict[int, int]:
    """Rewriter id -> index of the plan part with the same members."""
    where = {frozenset(p): i for i, p in enumerate(parts)}
    return {k: where[v] for k, v in ids.items() if v in where}


def _resolve(op_name: str | None, index: dict[str, int]) -> str | None:
    """The pre-optimisation instruction an op_name "<call>/.../<instruction>" names, if any."""
    if not op_name:
        return None
    parts = op_name.split("/")
    if parts[0] not in index:  # jax's own names ("jit(f)/shard_map/...") name no instruction
        return None
    for p in reversed(parts[1:] if len(parts) > 1 else parts):
        if p in index:
            return p
    return None


def _op_map(compiled_text: str, plan: FusionPlan | None, rewritten: str | None,
            graph: HloGraph | None) -> tuple[str, dict[str, dict[str, Any]]]:
    """Compiled op name -> {opcode, top_level, op_name, group, bucket, bucket_part, nodes, kernel_key}."""
    from disco.sim.costs import kernel_key
    from disco.ir.hlo_parse import parse_module

    module = parse_module(compiled_text)
    comps = {c.name: c for c in module.computations}
    index = graph.index() if graph is not None else {}
    g_ids, b_ids = plan_ids_from_rewritten(rewritten) if rewritten else ({}, {})
    g_map = _plan_index(g_ids, plan.groups) if plan is not None else {}
    b_map = _plan_index(b_ids, [b.members for b in plan.buckets or ()]) if plan is not None else {}
    # A one-member tuple bucket is not rewritten: its all-reduce keeps the member's name.
    single_ar = {b.members[0]: i for i, b in enumerate(plan.buckets or ()) if len(b.members) == 1} if plan else {}

    def inner_op_names(ins: Any, seen: set[str]) -> list[str | None]:
        out = [ins.op_name]
        if ins.opcode == "fusion":
            for c in ins.called:
                if c in comps and c not in seen:
                    seen.add(c)
                    for sub in comps[c].instructions:
                        if sub.opcode != "parameter":
                            out.extend(inner_op_names(sub, seen))
        return out

    info: dict[str, dict[str, Any]] = {}
    for comp in module.computations:
        top = comp.name == module.entry.name
        for ins in comp.instructions:
            rec: dict[str, Any] = {"opcode": ins.opcode, "top_level": top, "op_name": ins.op_name,
                                   "group": None, "bucket": None, "bucket_part": None}
            nodes: set[str] = set()
            compute = False  # names something other than a bucket's own work
            for on in inner_op_names(ins, set()):
                if not on:
                    continue
                m = _GROUP_RE.search(on)
                if m and rec["group"] is None and int(m.group(1)) in g_map:
                    rec["group"] = g_map[int(m.group(1))]
                    nodes.update(plan.groups[rec["group"]])
                    compute = True
                    continue
                m = _BUCKET_AR_RE.search(on)
                if m and int(m.group(1)) in b_map:
                    # XLA names what it folds the unpacking into (a bitcast of the all-reduce's
                    # result, fused into a consumer) after the all-reduce: only the all-reduce
                    # itself is the bucket's communication, the rest is its pack work.
                    if ins.opcode in ALL_REDUCE_OPCODES:
                        rec["bucket"], rec["bucket_part"] = b_map[int(m.group(1))], "all-reduce"
                    elif rec["bucket"] is None:
                        rec["bucket"], rec["bucket_part"] = b_map[int(m.group(1))], "pack"
                    continue
                m = _BUCKET_PACK_RE.search(on)
                if m and int(m.group(1)) in b_map:
                    if rec["bucket"] is None:
                        rec["bucket"], rec["bucket_part"] = b_map[int(m.group(1))], "pack"
                    continue
                compute = True
                node = _resolve(on, index)
                if node is not None:
                    nodes.add(node)
                    if node in single_ar and ins.opcode in ALL_REDUCE_OPCODES:
                        rec["bucket"], rec["bucket_part"] = single_ar[node], "all-reduce"
            if rec["bucket_part"] == "pack" and compute:
                # a bucket's slices fused into the optimizer's update (or its concatenate into a
                # gradient's producer): compute, with the pack work free inside it, not the bucket's
                rec["bucket"] = rec["bucket_part"] = None
            order = sorted(nodes, key=lambda n: index[n]) if index else sorted(nodes)
            rec["nodes"] = tuple(order)
            rec["kernel_key"] = kernel_key(graph.nodes[index[n]] for n in order) if index and order else ""
            info[ins.name] = rec
    return module.name, info


# -- running the trace ---------------------------------------------------------------------------
@contextlib.contextmanager
def _trace(fn: Callable[..., Any], args: Sequence[Any], steps: int, prefix: str) -> Iterator[tuple[Any, float]]:
    """Runs ``steps`` calls of ``fn(*args)`` under one jax trace.

    Yields the trace's ``jax.profiler.ProfileData`` and the traced seconds per step; the trace
    lock is held until the ``with`` block ends.

    Raises:
      RuntimeError: if the trace wrote no ``*.xplane.pb`` file.
    """
    import jax

    with _TRACE_LOCK, tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        with jax.profiler.trace(tmp):
            t0 = time.perf_counter()
            out = None
            for _ in range(steps):
                out = fn(*args)
            jax.block_until_ready(out)
            per_step = (time.perf_counter() - t0) / steps
        files = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
        if not files:
            raise RuntimeError(f"jax.profiler.trace wrote no *.xplane.pb under {tmp}; expected one")
        yield jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime)), per_step


def _op_events(data: Any, module: str) -> list[tuple[Any, Any, str, dict[str, Any]]]:
    """(line, event, hlo_op, stats) of every event with an ``hlo_op`` stat (of ``module`` when given).

    Read with DeprecationWarnings ignored: on Python 3.12 jaxlib's nanobind warns when it first
    builds the type of an event's stats, and where that warning is an error (pytest's
    ``filterwarnings = error``) it aborts the process (measured with jaxlib 0.8.3 and 0.11.2)."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for plane in data.planes:
            for line in plane.lines:
                for ev in line.events:
                    stats = dict(ev.stats)
                    op = stats.get("hlo_op")
                    if op is None:
                        continue
                    mod = stats.get("hlo_module")
                    if module and mod is not None and mod != module:
                        continue
                    out.append((line, ev, str(op), stats))
    return out


def _events(data: Any, module: str) -> tuple[dict[str, list[float]], set[int]]:
    """hlo_op -> durations in seconds (all devices), and the device ordinals seen."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    devices: set[int] = set()
    for _, ev, op, stats in _op_events(data, module):
        out[op].append(ev.duration_ns * 1e-9)
        if "device_ordinal" in stats:
            devices.add(int(stats["device_ordinal"]))
    return out, devices


def profile(
    fn: Callable[..., Any],
    args: Sequence[Any],
    steps: int = 3,
    plan: FusionPlan | None = None,
    graph: HloGraph | None = None,
    *,
    rounds: int = 5,
) -> ProfileResult:
    """Profiles a compiled step per HLO op and maps the ops back to ``plan`` and ``graph``.

    Args:
      fn: an :class:`xla_hooks.AppliedStep`, or a plain/jitted step (then ``plan`` is
        applied with :func:`xla_hooks.apply`, XLA's default when None).
      args: the step's arguments (``fn(*args)``; not donated).
      steps: steps run under the tracer.
      plan: the plan; defaults to ``fn.plan`` for an AppliedStep.
      graph: the step's pre-optimisation graph, needed to map ops to nodes and kernel
        keys; extracted from ``fn`` when it is a plain step (a graph given must be that one).
      rounds: untraced single steps timed for ``step_s``.

    Returns:
      A :class:`ProfileResult`; its ``fallback_reason`` says when the plan could not be applied
      (XLA's default compile was profiled instead, after a :class:`xla_hooks.PlanFallbackWarning`).

    Raises:
      TypeError: for ``steps`` or ``rounds`` that is not an int, or a ``plan`` that is not a FusionPlan.
      ValueError: for ``steps`` or ``rounds`` below 1, a ``plan`` other than the one an
        AppliedStep ``fn`` was compiled with, or a ``graph`` of another step (its fingerprint
        differs from the plain step's, or from the one the AppliedStep's plan was made for).
      RuntimeError: if the trace wrote no ``*.xplane.pb`` file, or jax's profiler is already
        running (``jax.profiler.start_trace`` elsewhere: one trace at a time per process).
    """
    if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in (steps, rounds)):
        raise TypeError(f"steps and rounds: expected ints >= 1, got steps={steps!r}, rounds={rounds!r}")
    if steps < 1 or rounds < 1:
        raise ValueError(f"steps and rounds must be >= 1, got steps={steps}, rounds={rounds}")
    if plan is not None and not isinstance(plan, FusionPlan):
        raise TypeError(f"plan: expected a disco FusionPlan or None, got {type(plan).__name__}")
    from xla_hooks.apply_plan import AppliedStep, apply
    from xla_hooks.measure import measure

    if isinstance(fn, AppliedStep):
        if plan is not None and plan.digest() != fn.requested.digest():
            raise ValueError(f"plan {plan.name or plan.digest()!r} is not the plan "
                             f"{fn.requested.name or fn.requested.digest()!r} the AppliedStep was compiled with; "
                             "expected plan=None (or that plan), or the plain step to apply the plan to")
        made_for = fn.requested.graph_fingerprint  # checked against the step when it was applied
        if graph is not None and made_for is not None and graph.fingerprint != made_for:
            raise ValueError(f"graph: {graph.fingerprint} is not the graph of the AppliedStep's step ({made_for}); "
                             "expected that step's graph (disco.extract(step, *args)) or None")
    else:
        from disco.ir import extractor

        own = HloGraph.from_hlo_text(extractor.hlo_text(fn, *args))
        if graph is not None and graph.fingerprint != own.fingerprint:
            raise ValueError(f"graph: {graph.fingerprint} is not the graph of this step and these arguments "
                             f"({own.fingerprint}: another model, preset, batch or device count?); expected "
                             "disco.extract(fn, *args) or None")
        graph = own
        fn = apply(plan, fn, *args)
    plan = plan if plan is not None and fn.applied else fn.plan
    module, info = _op_map(fn.compiled_text(), plan, fn.hlo if fn.applied else None, graph)
    untraced = measure(fn, args, rounds=rounds, steps=1)  # includes a warm-up call
    with _trace(fn, args, steps, "disco_profile_") as (data, traced):
        events, devices = _events(data, module)
    n_dev = max(1, len(devices))
    ops = []
    for name, durs in events.items():
        rec = info.get(name) or {"opcode": "", "top_level": True, "op_name": None, "group": None,
                                 "bucket": None, "bucket_part": None, "nodes": (), "kernel_key": ""}
        ops.append(OpProfile(name=name, seconds=sum(durs) / steps / n_dev, count=len(durs) / steps / n_dev,
                             **rec))
    ops.sort(key=lambda o: -o.seconds)
    return ProfileResult(step_s=statistics.median(untraced.samples), step_samples_s=untraced.samples,
                         traced_step_s=traced, steps=steps, devices=len(devices), module=module,
                         ops=tuple(ops), fallback_reason=fn.fallback_reason)


# -- per-kernel device times (the H100 kernel dataset's format) ---------------------------------
@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One kernel of a trace: its device time per step, summed over its launches.

    Attributes:
      stream: the trace line it ran on (a GPU stream, or a CPU thread).
      kernel: the event's name (the CUDA kernel name on GPU, the op on CPU).
      hlo_op: the compiled HLO instruction that launched it.
      ns_per_step: nanoseconds per step.
      launches_per_step: events per step.
    """

    stream: str
    kernel: str
    hlo_op: str
    ns_per_step: float
    launches_per_step: float

    def __repr__(self) -> str:
        return (f"KernelTime({self.kernel[:60]!r}, {self.hlo_op[:40]!r}, {self.ns_per_step:.0f} ns x "
                f"{self.launches_per_step:g}, {self.stream[:30]!r})")


def trace_kernels(fn: Callable[..., Any], args: Sequence[Any], steps: int = 5,
                  module: str = "") -> tuple[KernelTime, ...]:
    """Runs ``steps`` calls of ``fn(*args)`` under the profiler; per (stream, kernel, hlo_op) times.

    Only events carrying an ``hlo_op`` stat count (of ``module`` when given). On GPU, compile
    with command buffers off (``xla_gpu_enable_command_buffer=""``), or kernels inside a CUDA
    graph report ``hlo_op=command_buffer_N``.

    Raises:
      TypeError: for ``steps`` that is not an int.
      ValueError: for ``steps`` below 1.
      RuntimeError: if the trace wrote no ``*.xplane.pb`` file.
    """
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
        raise TypeError(f"steps: expected an int >= 1, got {steps!r}")
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    acc: dict[tuple[str, str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    with _trace(fn, args, steps, "disco_kernels_") as (data, _):
        for line, ev, op, _ in _op_events(data, module):
            rec = acc[(str(line.name), str(ev.name), op)]
            rec[0] += ev.duration_ns
            rec[1] += 1
    return tuple(KernelTime(stream=s, kernel=k, hlo_op=o, ns_per_step=v[0] / steps, launches_per_step=v[1] / steps)
                 for (s, k, o), v in sorted(acc.items()))

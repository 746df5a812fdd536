"""The compiled tier: price the module XLA really built, in XLA's own order.

The fast tier (:mod:`disco.sim.simulator`) emulates which kernels XLA forms for a plan. This tier
reads an optimised, scheduled module (``Compiled.as_text()`` of XLA:CPU, or of XLA:GPU compiled
deviceless for a GPU cluster: :mod:`xla_hooks.deviceless`) and prices what is there:

* kernels: every kernel-launching instruction (:func:`disco.sim.compiled_kernels.module_kernels`:
  fusions, cuBLAS/cuDNN custom-calls, copies, ...), each priced by the device's cost model
  (``kernel_time``: the per-kernel GNN on an H100, or a roofline);
* collectives: every all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute,
  synchronous or an async ``-start``/``-done`` pair, with its bytes and replica group size, priced
  on the cluster's links (:func:`disco.sim.collectives.collective_time`);
* the schedule: one compute stream runs the entry computation's instructions in the module's
  order (a scheduled module prints them in schedule order); a ``while`` runs its body (and, unless
  XLA:GPU knows its trip count, its condition) once per trip (:func:`disco.ir.loops.while_trip_count`;
  1 when unknown); ``call`` and ``conditional`` run their computations (every branch of a conditional
  once: an upper bound). A synchronous collective holds the compute stream; an async ``-start`` hands the
  collective to one network stream and the compute stream goes on until the matching ``-done``,
  which waits for it: the overlap XLA's latency-hiding schedule arranged.

Every result says ``kernels_from="compiled"`` (this tier) as the fast tier says ``"emulated"``.

Example:
  >>> r = price(compiled_text, analytic("h100"), preset("h100-sxm-8"))  # doctest: +SKIP
  >>> r.step_time_s, r.compute_s, len(r.collectives)                   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from disco.ir import hlo_module, hlo_parse, loops
from disco.ir.opcodes import COLLECTIVE_KIND, CONTROL_FLOW_OPCODES
from disco.ir.replica_groups import replica_group_lists, replica_group_size
from disco.sim import collectives
from disco.sim.compiled_kernels import KernelSpec, module_kernels

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.sim.costs import CostModel

KERNELS_FROM = "compiled"


class Collective(NamedTuple):
    """One collective of the compiled module.

    Attributes:
      name: its instruction (the ``-start`` of an async pair).
      kind: the collective kind that prices it (``all-reduce``, ...).
      nbytes: bytes per device, the full buffer (:mod:`disco.sim.collectives`' convention).
      group: devices per replica group (None: unknown, priced over the whole cluster).
      is_async: a ``-start``/``-done`` pair.
      executions: runs per step (loop trip counts multiplied).
      groups: the device ids of each replica group, where read (priced over one of them where
        there are several: :func:`disco.sim.collectives.over_group`); None: not read.
    """

    name: str
    kind: str
    nbytes: int
    group: int | None
    is_async: bool
    executions: int
    groups: tuple[tuple[int, ...], ...] | None = None


class Event(NamedTuple):
    """One item of the schedule as the compute stream reaches it."""

    kind: str  # "kernel", "collective", "start", "done"
    name: str
    executions: int


class CompiledStep(NamedTuple):
    """A compiled module, priced.

    Attributes:
      backend: the compiler that wrote it (``gpu``, ``cpu``).
      kernels: every kernel-launching instruction (:class:`KernelSpec`) with seconds per launch.
      collectives: every collective.
      compute_s: the kernels' device time per step (each launch's time times its launches, summed):
        what a profiler's kernel sum measures.
      comm_s: the collectives' time per step, summed.
      step_time_s: the simulated step: one compute stream in the module's order, one network stream.
      exposed_comm_s: ``step_time_s - compute_s``: communication the schedule did not hide.
    """

    backend: str
    kernels: tuple[tuple[KernelSpec, float], ...]
    collectives: tuple[Collective, ...]
    compute_s: float
    comm_s: float
    step_time_s: float

    @property
    def exposed_comm_s(self) -> float:
        return max(0.0, self.step_time_s - self.compute_s)

    def summary(self) -> dict[str, Any]:
        """The JSON-ready figures (milliseconds), with which tier priced them."""
        launches = sum(k.executions for k, _ in self.kernels)
        return {"kernels_from": KERNELS_FROM, "backend": self.backend,
                "step_time_ms": round(self.step_time_s * 1e3, 4), "compute_time_ms": round(self.compute_s * 1e3, 4),
                "comm_time_ms": round(self.comm_s * 1e3, 4), "exposed_comm_ms": round(self.exposed_comm_s * 1e3, 4),
                "kernels": len(self.kernels), "kernel_launches": launches,
                "collectives": len(self.collectives),
                "async_collectives": sum(c.is_async for c in self.collectives),
                "all_reduce_bytes": sum(c.nbytes * c.executions for c in self.collectives if c.kind == "all-reduce")}


def _operand_bytes(ins: hlo_module.Instruction, scope: dict[str, hlo_module.Instruction]) -> int:
    return sum(scope[o].out_bytes for o in ins.operands if o in scope)


def collective_bytes(ins: hlo_module.Instruction, scope: dict[str, hlo_module.Instruction]) -> int:
    """Bytes per device of a collective, the full buffer: the operands of an all-reduce,
    reduce-scatter, all-to-all or permute; the result of an all-gather (an async start's result
    tuple holds its operands first)."""
    kind = COLLECTIVE_KIND[ins.opcode]
    operands = _operand_bytes(ins, scope)
    if kind == "all-gather":
        return ins.out_bytes - operands if ins.opcode.endswith("-start") else ins.out_bytes
    if ins.opcode.endswith("-start") and kind == "collective-permute":
        return operands
    return operands or ins.out_bytes


def _backend(text: str, backend: str | None) -> str:
    b = backend or hlo_parse.compiled_backend(text) or "cpu"
    if b not in ("cpu", "gpu"):
        raise ValueError(f"compiled tier: backend {b!r}; expected 'cpu' or 'gpu'")
    return b


def read(text: str, *, backend: str | None = None) -> tuple[hlo_module.Module, str, list[KernelSpec],
                                                           list[Event], dict[str, Collective]]:
    """The module, its backend, kernels, schedule events and collectives.

    Raises:
      ValueError: for text that is not an optimised HLO module (not scheduled: XLA prints
        ``is_scheduled=true`` on every compiled module), naming what was received.
    """
    if not isinstance(text, str) or "HloModule" not in text:
        raise ValueError(f"compiled tier: expected an HLO module's text, got {str(text)[:60]!r}")
    if not hlo_parse.is_scheduled(text):
        raise ValueError("compiled tier: expected an optimised, scheduled module (is_scheduled=true, as "
                         "Compiled.as_text() prints it); got a module without a schedule: compile it first")
    b = _backend(text, backend)
    module = hlo_parse.parse_module(text)
    specs = module_kernels(module, backend=b)
    by_name = {s.name: s for s in specs}
    comps = {c.name: c for c in module.computations}
    analysis_cache: dict[tuple[str, str], int | None] = {}
    colls: dict[str, Collective] = {}
    events: list[Event] = []

    def trips(ins: hlo_module.Instruction) -> tuple[int, bool]:
        known = loops.known_trip_count(ins)
        if known is not None:
            return known, True
        key = (ins.computation, ins.name)
        if key not in analysis_cache:
            analysis_cache[key] = loops.while_trip_count(module, ins)
        n = analysis_cache[key]
        return (1 if n is None else n), False

    def walk(comp: hlo_module.Computation, times: int, depth: int = 0) -> Iterator[Event]:
        if depth > 32:
            raise ValueError(f"compiled tier: computations nested deeper than 32 at {comp.name!r}")
        scope = comp.by_name()
        for ins in comp.instructions:
            op = ins.opcode
            if op in CONTROL_FLOW_OPCODES:
                if op == "while":
                    n, known = trips(ins)
                    body = ins.attrs.get("body", "").strip().lstrip("%")
                    cond = ins.attrs.get("condition", "").strip().lstrip("%")
                    for c, k in ((cond, n + 1), (body, n)):
                        if c in comps and not (c == cond and b == "gpu" and known):
                            yield from walk(comps[c], times * k, depth + 1)
                else:  # call, conditional (every branch once: an upper bound), async wrappers
                    for c in ins.called:
                        if c in comps:
                            yield from walk(comps[c], times, depth + 1)
                continue
            if op in COLLECTIVE_KIND:
                is_async = op.endswith("-start")
                groups = replica_group_lists(ins.attrs.get("replica_groups"))
                colls[ins.name] = Collective(ins.name, COLLECTIVE_KIND[op], collective_bytes(ins, scope),
                                             replica_group_size(ins.attrs.get("replica_groups")), is_async, times,
                                             None if groups is None else tuple(groups))
                yield Event("start" if is_async else "collective", ins.name, times)
            elif op.endswith("-done") and ins.operands and ins.operands[0] in colls:
                yield Event("done", ins.operands[0], times)
            elif ins.name in by_name and not by_name[ins.name].kernel.is_empty:
                yield Event("kernel", ins.name, times)

    events = list(walk(module.entry, 1))
    return module, b, specs, events, colls


def price(text: str, cost_model: CostModel, cluster: ClusterSpec, *, backend: str | None = None) -> CompiledStep:
    """Prices a compiled module's kernels with ``cost_model`` and its collectives on ``cluster``,
    and simulates its schedule.

    Raises:
      ValueError: for text that is not an optimised module (:func:`read`).
    """
    _, b, specs, events, colls = read(text, backend=backend)
    per_launch = {s.name: cost_model.kernel_time(s.kernel) for s in specs if not s.kernel.is_empty}
    launches: dict[str, int] = {}
    for e in events:
        if e.kind == "kernel":
            launches[e.name] = launches.get(e.name, 0) + e.executions
    kernels = tuple((s._replace(executions=launches.get(s.name, 0)), per_launch[s.name]) for s in specs
                    if s.name in per_launch)

    def coll_time(c: Collective) -> float:
        if c.group == 1:
            return 0.0
        return collectives.collective_time(c.kind, c.nbytes, collectives.over_group(cluster, c.groups))

    coll_s = {n: coll_time(c) for n, c in colls.items()}
    compute = net = 0.0
    t = 0.0
    ends: dict[str, float] = {}
    for e in events:
        if e.kind == "kernel":
            dt = per_launch[e.name] * e.executions
            t += dt
            compute += dt
        elif e.kind == "collective":
            start = max(t, net)
            t = net = start + coll_s[e.name] * e.executions
        elif e.kind == "start":
            start = max(t, net)
            net = ends[e.name] = start + coll_s[e.name] * e.executions
        else:  # done: the compute stream waits for its collective
            t = max(t, ends.get(e.name, t))
    step = max(t, net)
    comm = sum(coll_s[n] * c.executions for n, c in colls.items())
    return CompiledStep(b, kernels, tuple(colls.values()), compute, comm, step)

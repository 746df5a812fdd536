"""The cost-model interface (:class:`CostModel`), the kernels it prices, and the analytic and table
models (:mod:`disco.sim.costs`'s module doc says more)."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from disco.ir.opcodes import COLLECTIVE_KIND, SLICE_READ_OPCODES, ZERO_COST_OPCODES, in_place_update
from disco.sim import collectives

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.ir.graph import HloGraph, Node

SCHEMA = "disco.costs/1"  # the file format's name; tables written by earlier versions carry it too

def is_kernel_node(node: Node) -> bool:
    """True when ``node`` runs as (part of) a compute kernel."""
    return node.opcode not in ZERO_COST_OPCODES and node.opcode not in COLLECTIVE_KIND


# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel: graph nodes fused together and the memory traffic it causes.

    Attributes:
      nodes: the fused graph nodes (one for an unfused op).
      in_bytes: bytes of the distinct values produced outside the kernel that it reads.
      out_bytes: bytes of its nodes' results used outside it (or by nobody: graph outputs).
      step_bytes: context, not work: bytes of the inputs of the step the kernel belongs to (its
        entry computation's parameters: model, optimizer state, batch; the same for every kernel
        of a step, in a loop body too), 0 when unknown. The per-kernel GNN reads it
        (``gnn.kernel_features``); analytic models ignore it.
    """

    nodes: tuple[Node, ...]
    in_bytes: int
    out_bytes: int
    step_bytes: int = 0

    @property
    def flops(self) -> float:
        return sum(n.flops for n in self.nodes if is_kernel_node(n))

    @property
    def is_empty(self) -> bool:
        """True when no node does work (only zero-cost ops or collectives)."""
        return not any(is_kernel_node(n) for n in self.nodes)

    def key(self) -> str:
        """The lookup key: sorted ``opcode:shape`` of its working nodes, joined by "|"."""
        return kernel_key(self.nodes)


def kernel_key(nodes: Iterable[Node]) -> str:
    """The table key of a kernel made of ``nodes``, e.g. ``"add:f32[8]|exponential:f32[8]"``."""
    return "|".join(sorted(f"{n.opcode}:{n.shape}" for n in nodes if is_kernel_node(n)))


class GraphKernels:
    """A graph's adjacency, precomputed once, for building :class:`Kernel` objects fast."""

    def __init__(self, graph: HloGraph, step_bytes: int | None = None):
        self.graph = graph
        n = len(graph.nodes)
        preds: list[set[int]] = [set() for _ in range(n)]
        succs: list[set[int]] = [set() for _ in range(n)]
        for s, d in graph.edges:
            preds[d].add(s)
            succs[s].add(d)
        self.preds: tuple[tuple[int, ...], ...] = tuple(tuple(sorted(p)) for p in preds)
        self.succs: tuple[tuple[int, ...], ...] = tuple(tuple(sorted(s)) for s in succs)
        # Every kernel's Kernel.step_bytes, unless the caller knows the step's (a while body's
        # parameters are the loop's state): the entry's parameters, those without producers
        # (an inlined call's parameters have the call's operands).
        self.step_bytes = (sum(node.out_bytes for node, p in zip(graph.nodes, self.preds, strict=True)
                               if node.opcode == "parameter" and not p)
                           if step_bytes is None else step_bytes)
        self._bytes = [node.out_bytes for node in graph.nodes]
        # Slice reads and in-place updates: node -> the producer of its operand 0 (the stack it
        # slices or updates), when that producer is no other operand of the node.
        self._slice_of: dict[int, int] = {}
        self._update_bytes: dict[int, int] = {}  # in-place update -> bytes of its update
        index = None
        for i, node in enumerate(graph.nodes):
            update = in_place_update(node.opcode, len(node.operands))
            if node.operands and (update is not None or node.opcode in SLICE_READ_OPCODES):
                index = graph.index() if index is None else index
                src = index.get(node.operands[0])
                if src is None or node.operands[0] in node.operands[1:]:
                    continue
                self._slice_of[i] = src
                if update is not None:
                    upd = index.get(node.operands[update])
                    self._update_bytes[i] = self._bytes[upd] if upd is not None else node.out_bytes

    def kernel(self, indices: Iterable[int], inlined: Iterable[int] = ()) -> Kernel:
        """The kernel made of the nodes at ``indices``.

        Args:
          indices: the fused nodes.
          inlined: cheap producers (e.g. broadcasts) duplicated into this kernel: they are part
            of it (their inputs are its inputs, their work its work), but their results are
            never written out, since each consumer recomputes them.

        Raises:
          ValueError: for an empty set or an index outside the graph.
        """
        members = set(indices)
        n = len(self._bytes)
        if not members:
            raise ValueError("kernel: expected at least one node index, got none")
        inl = set(inlined) - members
        bad = [i for i in members | inl if not (isinstance(i, int) and 0 <= i < n)]
        if bad:
            raise ValueError(f"kernel: node indices {sorted(bad)[:5]} are outside the graph of {n} nodes")
        body = members | inl if inl else members
        inputs = {p for i in body for p in self.preds[i] if p not in body}
        if self._slice_of:
            in_bytes = self._sliced_in_bytes(body, inputs)
        else:
            in_bytes = sum(self._bytes[p] for p in inputs)
        succs = self.succs
        if inl:
            leaks: dict[int, bool] = {}

            def leaky(d: int) -> bool:  # an inlined node whose value is needed outside the kernel
                if d not in leaks:
                    leaks[d] = False
                    leaks[d] = any(s not in body or (s in inl and leaky(s)) for s in succs[d])
                return leaks[d]

            written = [i for i in members
                       if not succs[i] or any(s not in body or (s in inl and leaky(s)) for s in succs[i])]
        else:
            written = [i for i in members if not succs[i] or any(s not in members for s in succs[i])]
        updates = self._update_bytes
        if updates:  # an in-place update of an outside buffer writes its update, not the whole buffer
            out_bytes = sum(updates[i] if i in updates and self._slice_of[i] not in body else self._bytes[i]
                            for i in written)
        else:
            out_bytes = sum(self._bytes[i] for i in written)
        order = sorted(body)
        return Kernel(nodes=tuple(self.graph.nodes[i] for i in order), in_bytes=in_bytes, out_bytes=out_bytes,
                      step_bytes=self.step_bytes)

    def _sliced_in_bytes(self, body: set[int], inputs: set[int]) -> int:
        """Bytes read from ``inputs``: a stack read only by slices and in-place updates costs the slices."""
        sliced: dict[int, int] = {}  # input -> bytes its slices read
        full: set[int] = set()
        for i in body:
            src = self._slice_of.get(i)
            for p in self.preds[i]:
                if p not in inputs:
                    continue
                if p == src:
                    if i not in self._update_bytes:  # a slice read reads its output's bytes
                        sliced[p] = sliced.get(p, 0) + self._bytes[i]
                    else:
                        sliced.setdefault(p, 0)  # updated in place: nothing of it is read
                else:
                    full.add(p)
        return sum(self._bytes[p] if p in full or p not in sliced else min(sliced[p], self._bytes[p])
                   for p in inputs)


def kernel_of(graph: HloGraph, indices: Iterable[int]) -> Kernel:
    """One-off :meth:`GraphKernels.kernel` (builds the adjacency each call; use GraphKernels in loops)."""
    return GraphKernels(graph).kernel(indices)


# ---------------------------------------------------------------------------------------------
class CostModel(abc.ABC):
    """The interface of every cost model.

    Attributes:
      name: the model's kind, e.g. "analytic"; ``load_costs`` dispatches on it.
      version: the format/semantics version of the model's parameters.
    """

    name: str = "abstract"
    version: str = "1"

    @abc.abstractmethod
    def kernel_time(self, kernel: Kernel) -> float:
        """Seconds for one launch of ``kernel`` on the profiled device (0.0 for an empty kernel)."""

    def collective_time(self, kind: str, nbytes: int, cluster: ClusterSpec) -> float:
        """Seconds for one collective of ``kind`` over ``nbytes`` on ``cluster`` (alpha-beta model).

        Raises:
          ValueError: for an unknown kind or a negative byte count.
        """
        return collectives.collective_time(kind, nbytes, cluster)

    @abc.abstractmethod
    def params(self) -> dict[str, Any]:
        """The model's parameters as JSON-able data (the inverse of ``from_params``)."""

    @classmethod
    @abc.abstractmethod
    def from_params(cls, params: Mapping[str, Any]) -> CostModel:
        """Rebuilds the model from ``params()``.

        Raises:
          ValueError: naming the wrong or missing parameter.
        """

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "name": self.name, "version": self.version, "params": self.params()}

    def digest(self) -> str:
        """A stable hash of the model (kind, version and parameters)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the model as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        """Reads a model saved by ``save``; on a subclass, checks the file holds that kind.

        Raises:
          ValueError: for a file that is not a saved cost model (of this kind).
        """
        model = load_costs(path)
        if cls is not CostModel and not isinstance(model, cls):
            raise ValueError(f"{Path(path).name}: expected a {cls.name!r} cost model, got {model.name!r}")
        return model


def require_cost_model(value: Any, where: str = "costs", *, or_none: bool = False) -> CostModel | None:
    """``value`` when it is a cost model (anything with a callable ``kernel_time``; or None, where
    ``or_none``); the one check the entry points that take a cost model make.

    Raises:
      TypeError: naming ``where`` and what was given.
    """
    if callable(getattr(value, "kernel_time", None)) or (or_none and value is None):
        return value
    raise TypeError(f"{where}: expected a disco.sim.costs.CostModel{' or None' if or_none else ''}, "
                    f"got {type(value).__name__} {value!r:.60}")


@dataclasses.dataclass(frozen=True)
class AnalyticConfig:
    """Roofline parameters. The defaults are CPU-ish (one XLA:CPU virtual device on a shared core).

    Attributes:
      peak_flops: floating-point operations per second.
      mem_bandwidth: bytes per second to and from memory.
      launch_overhead: seconds of fixed cost per kernel.
    """

    peak_flops: float = 5e10
    mem_bandwidth: float = 1e10
    launch_overhead: float = 1e-6

    def __post_init__(self) -> None:
        for field in ("peak_flops", "mem_bandwidth"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"AnalyticConfig.{field}: expected a positive number, got {v!r}")
        v = self.launch_overhead
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise ValueError(f"AnalyticConfig.launch_overhead: expected a non-negative number, got {v!r}")


class AnalyticCosts(CostModel):
    """Roofline kernel costs: ``max(flops / peak_flops, (in_bytes + out_bytes) / mem_bandwidth) + launch``."""

    name = "analytic"
    version = "1"

    def __init__(self, config: AnalyticConfig | None = None):
        self.config = config or AnalyticConfig()
        self._inv_flops = 1.0 / self.config.peak_flops
        self._inv_bw = 1.0 / self.config.mem_bandwidth

    def kernel_time(self, kernel: Kernel) -> float:
        if kernel.is_empty:
            return 0.0
        return (max(kernel.flops * self._inv_flops, (kernel.in_bytes + kernel.out_bytes) * self._inv_bw)
                + self.config.launch_overhead)

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AnalyticCosts:
        if not isinstance(params, Mapping):
            raise ValueError(f"analytic cost params: expected an object, got {params!r}")
        known = {f.name for f in dataclasses.fields(AnalyticConfig)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"analytic cost params: unknown keys {unknown}; expected some of {sorted(known)}")
        return cls(AnalyticConfig(**params))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnalyticCosts) and other.config == self.config

    def __hash__(self) -> int:
        return hash(self.config)

    def __repr__(self) -> str:
        return f"AnalyticCosts({self.config!r})"


class TableCosts(CostModel):
    """Profiled kernel times by ``kernel_key``, with an analytic fallback for misses.

    Args:
      table: kernel key -> measured seconds.
      fallback: the model for kernels not in the table (default ``AnalyticCosts()``).

    Raises:
      ValueError: for a non-string key or a negative or non-finite time.
    """

    name = "table"
    version = "1"

    def __init__(self, table: Mapping[str, float], fallback: AnalyticCosts | None = None):
        clean: dict[str, float] = {}
        for k, v in table.items():
            if not isinstance(k, str):
                raise ValueError(f"TableCosts: keys must be kernel-key strings, got {k!r}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"TableCosts[{k!r}]: expected a non-negative number of seconds, got {v!r}")
            clean[k] = float(v)
        self.table: dict[str, float] = clean
        self.fallback = fallback or AnalyticCosts()
        self.hits = 0
        self.misses = 0

    @classmethod
    def from_records(cls, records: Iterable[tuple[str | Kernel, float]],
                     fallback: AnalyticCosts | None = None) -> TableCosts:
        """Builds a table from (kernel or key, seconds) measurements; repeated keys keep the median.

        Raises:
          ValueError: as the constructor.
        """
        samples: dict[str, list[float]] = {}
        for key, seconds in records:
            k = key.key() if isinstance(key, Kernel) else key
            samples.setdefault(k, []).append(seconds)
        return cls({k: statistics.median(v) for k, v in samples.items()}, fallback)

    def update(self, records: Iterable[tuple[str | Kernel, float]]) -> TableCosts:
        """A new table with ``records`` added (a new measurement of a key replaces the old one)."""
        new = TableCosts.from_records(records, self.fallback)
        return TableCosts({**self.table, **new.table}, self.fallback)

    def kernel_time(self, kernel: Kernel) -> float:
        if kernel.is_empty:
            return 0.0
        t = self.table.get(kernel.key())
        if t is None:
            self.misses += 1
            return self.fallback.kernel_time(kernel)
        self.hits += 1
        return t

    def params(self) -> dict[str, Any]:
        return {"table": dict(sorted(self.table.items())), "fallback": self.fallback.params()}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TableCosts:
        if not isinstance(params, Mapping) or not isinstance(params.get("table"), Mapping):
            raise ValueError(f"table cost params: expected an object with a 'table' object, got {params!r}")
        fb = params.get("fallback")
        return cls(params["table"], AnalyticCosts.from_params(fb) if fb is not None else None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableCosts) and other.table == self.table and other.fallback == self.fallback

    def __hash__(self) -> int:
        return hash((self.digest(),))

    def __repr__(self) -> str:
        return f"TableCosts({len(self.table)} entries, fallback={self.fallback!r})"


_MODELS: dict[str, type[CostModel]] = {"analytic": AnalyticCosts, "table": TableCosts}


def costs_from_dict(data: Any, where: str = "cost model") -> CostModel:
    """Rebuilds a model from ``CostModel.to_dict()`` output.

    Raises:
      ValueError: naming the field that is missing or wrong.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{where}: field 'schema': expected {SCHEMA!r}, got {data.get('schema')!r}")
    kind = data.get("name")
    model = _MODELS.get(kind)
    if model is None:
        raise ValueError(f"{where}: field 'name': expected one of {sorted(_MODELS)}, got {kind!r}")
    if data.get("version") != model.version:
        raise ValueError(f"{where}: field 'version': expected {model.version!r} for {kind!r}, "
                         f"got {data.get('version')!r}")
    return model.from_params(data.get("params", {}))


def load_costs(path: str | os.PathLike[str]) -> CostModel:
    """Reads any cost model written by ``CostModel.save``.

    Raises:
      ValueError: for invalid JSON or a file that is not a saved cost model.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p.name}: not valid JSON: {e}") from None
    return costs_from_dict(data, p.name)


def node_kernel_times(graph: HloGraph, costs: CostModel, kernels: GraphKernels | None = None) -> list[float]:
    """Each node's time as an unfused kernel of one (0.0 for zero-cost ops and collectives)."""
    gk = kernels or GraphKernels(graph)
    return [costs.kernel_time(gk.kernel((i,))) if is_kernel_node(n) else 0.0
            for i, n in enumerate(graph.nodes)]

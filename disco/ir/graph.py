"""The HLO graph disco reasons about: nodes, data-dependency edges, features.

The graph holds the *step computation*: the module's entry computation with
every ``call`` inlined (jax's ``shard_map`` lowers its body to a called
computation). Fusion bodies, reduction regions and loop bodies stay inside the
instruction that calls them; their flops are summed into that node, a ``while``'s
once per iteration (:mod:`disco.ir.loops`). Each ``while`` node also keeps what one
iteration runs, its body and condition as graphs of their own, with its trip count
(:class:`Loop`, ``HloGraph.loops``), so the simulator can price the loop's kernels.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import re
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from disco.ir import flops as _flops
from disco.ir import loops as _loops
from disco.ir import opcodes as _opcodes
from disco.ir.loop_collectives import SUFFIX as LOCAL_SUFFIX
from disco.ir.opcodes import ALL_REDUCE_OPCODES
from disco.ir import hlo_module, hlo_parse
from disco.ir.fingerprint import computation_hashes, fingerprint_of, strip_layout
from disco.ir.gradients import dataflow_gradients
from disco.ir.gspmd import GspmdError, mesh_axes
from disco.ir import scatter_blocks as _scatter_blocks
from disco.ir import sharded as _sharded

if TYPE_CHECKING:
    import networkx as nx
    import numpy as np

SCHEMA = "disco.graph/1"  # the file format's name; graphs written by earlier versions carry it too
_GRAD_RE = re.compile(r"disco_grad\[(.*)\]")
_LAYOUT_RE = re.compile(r"\]\{([0-9,]*)")


@dataclasses.dataclass(frozen=True)
class Node:
    """One HLO instruction of the step computation."""

    name: str
    opcode: str
    computation: str
    shape: str  # the shape text without layouts, e.g. "f32[8,16]" or "(f32[2], s32[])"
    dtype: str  # the first array's dtype
    out_bytes: int
    out_elements: int
    flops: float
    operands: tuple[str, ...] = ()
    grad_bytes: int = 0  # all-reduce nodes: bytes reduced
    # all-reduce nodes: the parameter whose gradient it reduces (or scatters), if known; all-gather
    # nodes: the parameter whose shard it gathers (disco.ir.sharded)
    param_path: str | None = None
    replica_groups: str | None = None  # collective nodes: replica groups text
    reduction: str | None = None  # all-reduce nodes: the reduction's binary opcode
    layout: str = ""  # the layout text when it is not the default (major-to-minor) one

    def __repr__(self) -> str:
        """One short line: name, opcode, shape and operand count (the service's program identity
        hashes every field itself, :func:`service.programs.program_identity`)."""
        grad = f", gradient of {self.param_path[:40]!r}" if self.param_path is not None else ""
        return (f"Node({self.name[:60]!r}, {self.opcode}, {self.shape[:40]}, "
                f"{len(self.operands)} operand{'' if len(self.operands) == 1 else 's'}{grad})")

    @property
    def is_all_reduce(self) -> bool:
        """An all-reduce: synchronous, or the start of an async pair (its ``-done`` is not one)."""
        return self.opcode in ALL_REDUCE_OPCODES

    @property
    def is_collective(self) -> bool:
        """A collective; an async pair (``*-start``/``*-done``) counts once, at its start."""
        return self.opcode in _opcodes.COLLECTIVES and not self.opcode.endswith("-done")

    @property
    def is_gradient(self) -> bool:
        return self.is_all_reduce and self.param_path is not None


class GraphArrays(NamedTuple):
    """An array form for learning: one row of features per node, edges as index pairs."""

    node_features: np.ndarray  # float32 [n_node, n_features]
    opcode_ids: np.ndarray  # int32 [n_node]
    senders: np.ndarray  # int32 [n_edge]
    receivers: np.ndarray  # int32 [n_edge]
    edge_bytes: np.ndarray  # float32 [n_edge]

    def __repr__(self) -> str:
        return (f"GraphArrays({len(self.opcode_ids)} nodes x {self.node_features.shape[-1]} features, "
                f"{len(self.senders)} edges)")


class Loop(NamedTuple):
    """A ``while`` node of a graph and what one of its iterations runs.

    Attributes:
      node: the while node's name in the graph that holds it.
      trip_count: its iterations (:func:`disco.ir.loops.while_trip_count`); None when not
        known statically (its body's work is then counted once).
      body: the body computation as a graph (calls inlined as in the step; its own loops nested).
      condition: the condition computation as a graph.
    """

    node: str
    trip_count: int | None
    body: HloGraph
    condition: HloGraph

    def __repr__(self) -> str:
        trips = "unknown trips" if self.trip_count is None else f"{self.trip_count} trips"
        return (f"Loop({self.node[:60]!r}, {trips}, body of {len(self.body.nodes)} nodes, condition of "
                f"{len(self.condition.nodes)})")

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "trip_count": self.trip_count,
                "body": self.body.to_dict(), "condition": self.condition.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Loop:
        """Reads ``to_dict``'s output. Raises ValueError naming the wrong field."""
        if not isinstance(data, dict) or not {"node", "trip_count", "body", "condition"} <= data.keys():
            raise ValueError(f"graph JSON field {where!r}: expected an object with node, trip_count, "
                             f"body and condition, got {str(data)[:80]!r}")
        trips = data["trip_count"]
        if trips is not None and (isinstance(trips, bool) or not isinstance(trips, int) or trips < 0):
            raise ValueError(f"graph JSON field '{where}.trip_count': expected a non-negative integer "
                             f"or null, got {trips!r}")
        graphs = []
        for key in ("body", "condition"):
            try:
                graphs.append(HloGraph.from_dict(data[key]))
            except ValueError as e:
                raise ValueError(f"graph JSON field '{where}.{key}': {e}") from None
        return cls(node=data["node"], trip_count=trips, body=graphs[0], condition=graphs[1])


NODE_FEATURES = ("log_out_elements", "log_out_bytes", "log_flops", "is_all_reduce",
                 "n_operands", "is_elementwise")


@dataclasses.dataclass(frozen=True, eq=True)
class HloGraph:
    """A DAG of HLO instructions.

    Attributes:
      name: the HLO module's name.
      nodes: the instructions, in program (text) order, which is a topological order.
      edges: (producer index, consumer index) pairs of data dependencies.
      fingerprint: a hash of the canonical program (independent of instruction names).
      loops: one :class:`Loop` per ``while`` node (body and condition graphs, trip count),
        in node order.
      mesh: the sdy mesh the module declares, as (axis, size) pairs in mesh order (``()`` without
        one); what :meth:`collective_roles` reads a collective's mesh axes against. Not compared:
        a graph read from a file written before it was kept equals the graph of its text.
      scatter_blocks: per all-reduce a dynamic-slice reads, whether it is a reduce-scatter (every
        user keeps this device's block, by its position in the replica group) and along which
        dimension (:mod:`disco.ir.scatter_blocks`); what a plan's "scatter" bucket may hold. Not
        compared, as the mesh.
    """

    name: str
    nodes: tuple[Node, ...]
    edges: tuple[tuple[int, int], ...]
    fingerprint: str
    loops: tuple[Loop, ...] = ()
    mesh: tuple[tuple[str, int], ...] = dataclasses.field(default=(), compare=False)
    scatter_blocks: tuple[_scatter_blocks.ScatterBlock, ...] = dataclasses.field(default=(), compare=False)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_hlo_text(cls, text: str, module: str | None = None) -> HloGraph:
        """Builds the graph from HLO module text (jax, XLA dumps, XLA's tests, other frameworks).

        Args:
          text: HLO text as XLA writes it (see :mod:`disco.ir.hlo_parse`).
          module: which module to take when the text holds several (a name, or ``#N``
            for the N-th); several modules are never merged.

        Raises:
          ValueError: if the text cannot be parsed as HLO (the message names the line), or
            holds several modules and ``module`` does not pick one (the message lists them).
        """
        return from_module(hlo_parse.parse_module(text, module=module))

    # -- views --------------------------------------------------------------------------------
    def __repr__(self) -> str:
        """One line of counts (the default printed every node: 185 kB for the zoo's mlp)."""
        loops = f", {len(self.loops)} loops" if self.loops else ""
        return (f"HloGraph({self.name[:60]!r}, {len(self.nodes)} nodes, {len(self.edges)} edges, "
                f"{len(self.all_reduces())} all-reduces{loops}, fingerprint {self.fingerprint[:8]})")

    def __len__(self) -> int:
        return len(self.nodes)

    def index(self) -> dict[str, int]:
        """Instruction name -> node index (a new dict; :meth:`name_index` is the graph's own)."""
        return dict(self.name_index())

    def name_index(self) -> Mapping[str, int]:
        """Instruction name -> node index, made once per graph (read only)."""
        return self._maps[0]

    def operands_of(self) -> tuple[tuple[int, ...], ...]:
        """Per node, its producers' indices in edge order, made once per graph."""
        return self._maps[1]

    def users_of(self) -> tuple[tuple[int, ...], ...]:
        """Per node, its consumers' indices in edge order, made once per graph."""
        return self._maps[2]

    def edge_array(self) -> np.ndarray:
        """``edges`` as an (E, 2) int64 array, made once per graph (read only)."""
        return self._edges

    def __getstate__(self) -> dict[str, Any]:
        """The fields, without what is made from them (a pickle holds what makes a graph)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_maps", "_edges")}

    @functools.cached_property
    def _edges(self) -> np.ndarray:
        import numpy as np

        arr = np.array(self.edges, np.int64).reshape(-1, 2)
        arr.flags.writeable = False
        return arr

    @functools.cached_property
    def _maps(self) -> tuple[Mapping[str, int], tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        # (a frozen dataclass: cached_property writes the instance's __dict__, not a field. Plan
        # validation made these per call: half of its time in a 46k-node search, measured on CPU)
        preds: list[list[int]] = [[] for _ in self.nodes]
        users: list[list[int]] = [[] for _ in self.nodes]
        for s, d in self.edges:
            preds[d].append(s)
            users[s].append(d)
        index = types.MappingProxyType({n.name: i for i, n in enumerate(self.nodes)})
        return index, tuple(map(tuple, preds)), tuple(map(tuple, users))

    def all_reduces(self) -> list[Node]:
        """All-reduce nodes; an async ``all-reduce-start``/``-done`` pair is one, its start."""
        return [n for n in self.nodes if n.is_all_reduce]

    def collectives(self) -> list[Node]:
        """Collective nodes (all-reduce, all-gather, ...); an async pair counts once, at its start."""
        return [n for n in self.nodes if n.is_collective]

    def collective_roles(self) -> list[_sharded.Collective]:
        """Each collective labelled by what it does for a step with sharded parameters:
        ``param_gather``, ``grad_scatter``, ``grad_reduce`` or ``other``, with its mesh axes and
        bytes (:func:`disco.ir.sharded.label_collectives`)."""
        return _sharded.label_collectives(self)

    def gradient_bytes(self) -> int:
        return sum(n.grad_bytes for n in self.nodes if n.is_gradient)

    def opcode_histogram(self) -> dict[str, int]:
        return dict(collections.Counter(n.opcode for n in self.nodes).most_common())

    def to_networkx(self) -> nx.DiGraph:
        import networkx as nx

        g = nx.DiGraph(name=self.name, fingerprint=self.fingerprint)
        for n in self.nodes:
            g.add_node(n.name, **{k: v for k, v in dataclasses.asdict(n).items() if k != "name"})
        g.add_edges_from((self.nodes[s].name, self.nodes[d].name) for s, d in self.edges)
        return g

    def to_arrays(self) -> GraphArrays:
        import numpy as np

        feats = np.array([
            [math.log1p(n.out_elements), math.log1p(n.out_bytes), math.log1p(n.flops),
             float(n.is_all_reduce), float(len(n.operands)), float(n.opcode in _opcodes.ELEMENTWISE)]
            for n in self.nodes], dtype=np.float32).reshape(len(self.nodes), len(NODE_FEATURES))
        edges = np.array(self.edges, dtype=np.int32).reshape(-1, 2)
        edge_bytes = np.array([self.nodes[s].out_bytes for s, _ in self.edges], dtype=np.float32)
        return GraphArrays(
            node_features=feats,
            opcode_ids=np.array([_opcodes.opcode_id(n.opcode) for n in self.nodes], dtype=np.int32),
            senders=edges[:, 0].copy(), receivers=edges[:, 1].copy(), edge_bytes=edge_bytes)

    def summary(self) -> dict[str, Any]:
        ars = self.all_reduces()
        grads = [n for n in ars if n.is_gradient]
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "nodes": len(self.nodes),
            "edges": len(self.edges),
            "all_reduces": len(ars),
            "gradient_all_reduces": len(grads),
            "gradient_bytes": sum(n.grad_bytes for n in grads),
            "all_reduce_bytes": sum(n.grad_bytes for n in ars),
            "flops": sum(n.flops for n in self.nodes),
            "while_loops": len(self.loops),
            "loop_trip_counts": {lp.node: lp.trip_count for lp in self.loops},
            "loops_unknown_trips": [lp.node for lp in self.loops if lp.trip_count is None],
            # all-reduces disco.ir.loop_collectives moved after their loops (they read the loop's local sums)
            "all_reduces_after_loops": sum(any(o.endswith(LOCAL_SUFFIX) for o in n.operands) for n in ars),
            # {role: {mesh axes: count}} (disco.ir.sharded): a sharded step's gathers and scatters
            "collectives": _sharded.role_counts(self.collective_roles()),
            "opcodes": self.opcode_histogram(),
        }

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {
            "schema": SCHEMA,
            "name": self.name,
            "fingerprint": self.fingerprint,
            "nodes": [dataclasses.asdict(n) for n in self.nodes],
            "edges": [list(e) for e in self.edges],
        }
        if self.loops:  # absent for a graph without loops: their files are as before
            out["loops"] = [lp.to_dict() for lp in self.loops]
        if self.mesh:  # absent without a mesh, as loops
            out["mesh"] = [[a, n] for a, n in self.mesh]
        if self.scatter_blocks:  # absent without one, as the mesh
            out["scatter_blocks"] = [b.to_dict() for b in self.scatter_blocks]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HloGraph:
        """Reads ``to_dict``'s output. Raises ValueError naming a missing or wrong field."""
        if not isinstance(data, dict):
            raise ValueError(f"graph JSON must be an object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"graph JSON field 'schema': expected {SCHEMA!r}, got {data.get('schema')!r}")
        for key in ("name", "fingerprint", "nodes", "edges"):
            if key not in data:
                raise ValueError(f"graph JSON is missing field {key!r}")
        for key in ("nodes", "edges"):
            if not isinstance(data[key], list):
                raise ValueError(f"graph JSON field {key!r}: expected a list, got {type(data[key]).__name__}")
        fields = {f.name for f in dataclasses.fields(Node)}
        required = [f.name for f in dataclasses.fields(Node) if f.default is dataclasses.MISSING]
        nodes = []
        for i, nd in enumerate(data["nodes"]):
            if not isinstance(nd, dict) or not {"name", "opcode"} <= nd.keys():
                raise ValueError(f"graph JSON field 'nodes[{i}]': expected an object with name and opcode")
            unknown = set(nd) - fields
            if unknown:
                raise ValueError(f"graph JSON field 'nodes[{i}]': unknown keys {sorted(unknown)}")
            missing = [k for k in required if k not in nd]
            if missing:
                raise ValueError(f"graph JSON field 'nodes[{i}]': missing keys {missing}; expected "
                                 f"{', '.join(required)}")
            nd = dict(nd)
            nd["operands"] = tuple(nd.get("operands", ()))
            nodes.append(Node(**nd))
        n = len(nodes)
        edges = []
        for i, e in enumerate(data["edges"]):
            if (not isinstance(e, (list, tuple)) or len(e) != 2
                    or not all(isinstance(v, int) and 0 <= v < n for v in e)):
                raise ValueError(f"graph JSON field 'edges[{i}]': expected [src, dst] node indices < {n}, got {e!r}")
            edges.append((e[0], e[1]))
        raw_loops = data.get("loops", [])
        if not isinstance(raw_loops, list):
            raise ValueError(f"graph JSON field 'loops': expected a list, got {type(raw_loops).__name__}")
        loops = tuple(Loop.from_dict(lp, f"loops[{i}]") for i, lp in enumerate(raw_loops))
        names = {nd.name for nd in nodes}
        for i, lp in enumerate(loops):
            if lp.node not in names:
                raise ValueError(f"graph JSON field 'loops[{i}].node': {lp.node!r} is not a node of the graph")
        raw_mesh = data.get("mesh", [])
        if not isinstance(raw_mesh, list) or not all(
                isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], int)
                and not isinstance(a[1], bool) and a[1] >= 1 for a in raw_mesh):
            raise ValueError(f"graph JSON field 'mesh': expected a list of [axis name, size >= 1] pairs, "
                             f"got {str(raw_mesh)[:80]!r}")
        raw_blocks = data.get("scatter_blocks", [])
        if not isinstance(raw_blocks, list):
            raise ValueError(f"graph JSON field 'scatter_blocks': expected a list, got {type(raw_blocks).__name__}")
        blocks = tuple(_scatter_blocks.ScatterBlock.from_dict(b, f"scatter_blocks[{i}]") for i, b in enumerate(raw_blocks))
        return cls(name=data["name"], nodes=tuple(nodes), edges=tuple(edges),
                   fingerprint=data["fingerprint"], loops=loops, mesh=tuple((a, n) for a, n in raw_mesh),
                   scatter_blocks=blocks)

    @classmethod
    def from_json(cls, text: str) -> HloGraph:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"graph JSON is not valid JSON: {e}") from None
        return cls.from_dict(data)


# ---------------------------------------------------------------------------------------------
def require_graph(value: Any, where: str = "graph") -> HloGraph:
    """``value`` when it is an :class:`HloGraph`; the one check every public entry point that takes
    a graph makes, so that the message says the same everywhere.

    Raises:
      TypeError: naming ``where``, what was given and how to make a graph.
    """
    if not isinstance(value, HloGraph):
        raise TypeError(f"{where}: expected a disco HloGraph (disco.extract(step, *args)), "
                        f"got {type(value).__name__} {value!r:.60}")
    return value


def _nondefault_layout(ins: hlo_module.Instruction) -> str:
    """The instruction's layout text if some array is not in the default layout, else ''."""
    return _nondefault_layout_of(ins.shape)


@functools.lru_cache(maxsize=8192)
def _nondefault_layout_of(shape: str) -> str:
    layouts = _LAYOUT_RE.findall(shape)
    for text in layouts:
        dims = [int(d) for d in text.split(",") if d]
        if dims != sorted(dims, reverse=True):
            return ";".join(layouts)
    return ""


def _grad_path(ins: hlo_module.Instruction) -> str | None:
    name = ins.op_name
    if not name:
        return None
    m = _GRAD_RE.search(name)
    return m.group(1) if m else None


def _reduction_opcode(module: hlo_module.Module, ins: hlo_module.Instruction) -> str | None:
    for c in ins.called:
        try:
            return module.computation(c).root.opcode
        except KeyError:
            return None
    return None


def _ordered_instructions(module: hlo_module.Module, entry: hlo_module.Computation,
                          inline: set[str]) -> list[hlo_module.Instruction]:
    """``entry``'s instructions in text order, each inlined call's body placed just before the call."""
    comps = {c.name: c for c in module.computations}
    out: list[hlo_module.Instruction] = []

    def walk(comp: hlo_module.Computation) -> None:
        for ins in comp.instructions:
            if ins.opcode == "call":
                for c in ins.called:
                    if c in comps and c in inline:
                        walk(comps[c])
            out.append(ins)

    walk(entry)
    return out


def _graph_names(ordered: Sequence[hlo_module.Instruction]) -> dict[tuple[str, str], str]:
    """A graph-wide unique node name per (computation, instruction name).

    HLO scopes names per computation; when an inlined computation reuses a name already
    taken, its node is named ``computation/name`` (jax's output never reuses names, so its
    node names are the instruction names).
    """
    out: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for ins in ordered:
        name = ins.name if ins.name not in taken else f"{ins.computation}/{ins.name}"
        if name in taken:
            raise hlo_parse.HloParseError(
                f"line {ins.line}: instruction name {ins.name!r} appears twice in computation "
                f"{ins.computation!r}")
        taken.add(name)
        out[(ins.computation, ins.name)] = name
    return out


class _ModuleFacts(NamedTuple):
    """What every graph of one module (the step's and its loops') reads: computed once."""

    module: hlo_module.Module
    comps: dict[str, hlo_module.Computation]
    inline: set[str]
    flops: Any  # Mapping[(computation, instruction), float]
    trips: dict[tuple[str, str], int | None]
    comp_hashes: dict[str, str]


def from_module(module: hlo_module.Module) -> HloGraph:
    """Builds an HloGraph from a parsed module (entry computation with calls inlined).

    Each ``while`` node of the graph gets a :class:`Loop` (``HloGraph.loops``): its trip
    count and its body and condition computations as graphs built the same way.
    """
    facts = _ModuleFacts(module=module, comps={c.name: c for c in module.computations},
                         inline=hlo_module.inlinable(module), flops=_flops.module_flops(module),
                         trips=_loops.trip_counts(module),
                         comp_hashes=computation_hashes(module))
    return _graph_of(facts, module.entry, module.name, depth=0)


def _graph_of(facts: _ModuleFacts, entry: hlo_module.Computation, name: str, depth: int) -> HloGraph:
    """The graph of ``entry`` with its calls inlined and a Loop per while node."""
    if depth > 64:
        raise hlo_parse.HloParseError(f"while loops nested more than 64 deep at computation {entry.name!r}")
    module = facts.module
    per_ins_flops = facts.flops
    step = hlo_module.step_computations(module, entry, facts.inline)
    by_comp = {c.name: c for c in step}
    ordered = _ordered_instructions(module, entry, facts.inline)
    names = _graph_names(ordered)
    scopes = {c.name: c.by_name() for c in by_comp.values()}
    nodes: list[Node] = []
    index: dict[tuple[str, str], int] = {}
    for ins in ordered:
        key = (ins.computation, ins.name)
        is_ar = ins.opcode in ALL_REDUCE_OPCODES
        arrays = ins.arrays
        operands = tuple(names.get((ins.computation, op), op) for op in ins.operands)
        index[key] = len(nodes)
        # A call whose body is inlined here has its body's nodes in the graph, which carry the
        # flops; counting them on the call node too would count them twice.
        inlined = ins.opcode == "call" and ins.called and all(c in by_comp for c in ins.called)
        nodes.append(Node(
            name=names[key], opcode=ins.opcode, computation=ins.computation,
            shape=strip_layout(ins.shape), dtype=arrays[0].dtype if arrays else "token",
            out_bytes=ins.out_bytes, out_elements=sum(a.elements for a in arrays),
            flops=0.0 if inlined else float(per_ins_flops.get(key, 0.0)), operands=operands,
            grad_bytes=_reduced_bytes(ins, scopes) if is_ar else 0,
            param_path=_grad_path(ins) if is_ar else None,
            replica_groups=ins.attrs.get("replica_groups") if ins.opcode in _opcodes.COLLECTIVES else None,
            reduction=_reduction_opcode(module, ins) if is_ar else None,
            layout=_nondefault_layout(ins),
        ))
    edges: list[tuple[int, int]] = []
    for ins in ordered:
        dst = index[(ins.computation, ins.name)]
        for op in ins.operands:
            src = index.get((ins.computation, op))
            if src is None or src >= dst:
                raise hlo_parse.HloParseError(
                    f"line {ins.line}: instruction {ins.name!r} uses {op!r}, which is not defined "
                    f"before it in computation {ins.computation!r}")
            edges.append((src, dst))
        if ins.opcode == "call":
            for c in ins.called:
                callee = by_comp.get(c)
                if callee is None:
                    continue
                params = {int(p.raw_operands): p for p in callee.instructions if p.opcode == "parameter"}
                for i, op in enumerate(ins.operands):
                    if i in params:
                        edges.append((index[(ins.computation, op)], index[(c, params[i].name)]))
                edges.append((index[(c, callee.root.name)], dst))
    edges = sorted(set(edges))
    if depth == 0 and not any(n.is_gradient for n in nodes):  # no disco_grad scope: find them by dataflow
        # an all-reduce of an inlined call's body (a shard_map's) is named within the call's scope: jax
        # names the body's ops from the body's own scope (a forward pass's loss psum is "psum_invariant")
        scopes_of = _call_scopes(ordered)
        op_names = {index[(ins.computation, ins.name)]: ins.op_name for ins in ordered if ins.opcode == "parameter"}
        op_names.update({index[(ins.computation, ins.name)]: "/".join(
            s for s in (scopes_of.get(ins.computation), ins.op_name) if s) or None
            for ins in ordered if ins.opcode in ALL_REDUCE_OPCODES})
        numbers = {index[(ins.computation, ins.name)]: int(ins.raw_operands) for ins in ordered
                   if ins.opcode == "parameter" and ins.raw_operands.strip().isdigit()}
        root = index[(entry.name, entry.root.name)]
        for i, path in dataflow_gradients(nodes, edges, root, op_names, numbers).items():
            nodes[i] = dataclasses.replace(nodes[i], param_path=path)
        # a sharded parameter's gathers, and its gradient's scatter back to the shard (disco.ir.sharded)
        tuple_index = {index[(ins.computation, ins.name)]: int(ins.attrs["index"]) for ins in ordered
                       if ins.opcode == "get-tuple-element" and ins.attrs.get("index", "").strip().isdigit()}
        for i, path in _sharded.parameter_paths(nodes, edges, op_names, numbers, tuple_index).items():
            if nodes[i].param_path is None:
                nodes[i] = dataclasses.replace(nodes[i], param_path=path)
    loops = []
    for ins in ordered:
        if ins.opcode != "while":
            continue
        body = facts.comps.get(ins.attrs.get("body", "").strip().lstrip("%"))
        cond = facts.comps.get(ins.attrs.get("condition", "").strip().lstrip("%"))
        if body is None or cond is None:
            continue  # a malformed loop: priced as one node
        key = (ins.computation, ins.name)
        loops.append(Loop(node=names[key], trip_count=facts.trips.get(key),
                          body=_graph_of(facts, body, f"{name}/{body.name}", depth + 1),
                          condition=_graph_of(facts, cond, f"{name}/{cond.name}", depth + 1)))
    return HloGraph(name=name, nodes=tuple(nodes), edges=tuple(edges),
                    fingerprint=fingerprint_of(facts.comp_hashes, step), loops=tuple(loops),
                    mesh=_module_mesh(module) if depth == 0 else (),
                    scatter_blocks=_scatter_blocks.scatter_blocks(ordered, names) if depth == 0 else ())


def _call_scopes(ordered: Sequence[hlo_module.Instruction]) -> dict[str, str]:
    """Inlined computation -> the op_names of the calls that inline it, outermost first, joined by ``/``."""
    caller = {c: ins for ins in ordered if ins.opcode == "call" for c in ins.called}
    out = {}
    for comp in caller:
        parts, c = [], comp
        while c in caller and len(parts) < 64:
            parts.append(caller[c].op_name or "")
            c = caller[c].computation
        out[comp] = "/".join(p for p in reversed(parts) if p)
    return out


def _module_mesh(module: hlo_module.Module) -> tuple[tuple[str, int], ...]:
    """The module header's sdy mesh as (axis, size) pairs; () without one or with several."""
    try:
        return tuple(mesh_axes(module.header).items())
    except GspmdError:
        return ()


def _reduced_bytes(ins: hlo_module.Instruction, scopes: dict[str, dict[str, hlo_module.Instruction]]) -> int:
    """Bytes an all-reduce reduces: its output; for an async start, its operands' bytes.

    (An ``all-reduce-start`` may be written with a tuple shape holding its buffers twice.)
    """
    if ins.opcode == "all-reduce":
        return ins.out_bytes
    comp = scopes[ins.computation]
    ops = [comp[o] for o in ins.operands if o in comp]
    return sum(o.out_bytes for o in ops) if len(ops) == len(ins.operands) and ops else ins.out_bytes

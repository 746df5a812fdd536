"""What identifies a posted program, and the check of posted HLO text (run in a child process).

The service never takes a program's identity from the client: :func:`program_identity`
hashes the graph the server itself built (from HLO text, or from graph JSON it validated),
and that digest is what a plan key is made of. Two requests share a plan only if their
graphs are the same, node for node.

:func:`check_hlo` parses HLO text and enforces :mod:`service.limits` on it. The service
runs it in a child process (``python -m service.programs``, the text on stdin, one JSON
object on stdout) so that a large or hostile text costs the request's server neither its
GIL nor unbounded time or memory: the parent kills the child after ``PARSE_TIMEOUT_S``,
and the child limits its own address space. This module imports disco's IR only (no
Flask, no jax).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from service import limits

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph


def program_identity(kind: str, graph: HloGraph) -> str:
    """A digest of everything the planner reads from ``graph`` (32 hex characters).

    Args:
      kind: "hlo" (``graph.fingerprint`` is the server's HLO fingerprint and is included)
        or "graph" (graph JSON: its fingerprint field is not the client's to set and is left out).
      graph: the graph the server built.
    """
    if kind not in ("hlo", "graph"):
        raise ValueError(f"kind: expected 'hlo' or 'graph', got {kind!r}")
    h = hashlib.sha256()
    h.update(f"{kind}\n{graph.fingerprint if kind == 'hlo' else ''}\n{graph.name}\n".encode())
    for n in graph.nodes:
        h.update(node_text(n).encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    h.update(repr(graph.edges).encode())
    return h.hexdigest()[:32]


def node_text(node: Any) -> str:
    """Every field of a :class:`disco.ir.graph.Node` as text: ``Node(name='add.1', opcode='add', ...)``,
    the form the dataclass's generated repr had, which plan keys were first made of (``repr(node)``
    is one short line now; the identity must not change)."""
    fields = ", ".join(f"{f.name}={getattr(node, f.name)!r}" for f in dataclasses.fields(node))
    return f"{type(node).__qualname__}({fields})"


def _big(v: int) -> str:
    s = str(v)
    return s if len(s) <= 24 else f"{s[:12]}... ({len(s)} digits)"


def check_hlo(text: str) -> dict[str, Any]:
    """Parses ``text`` and checks it against the limits.

    Returns:
      ``{"fingerprint", "identity", "nodes", "edges"}`` of the step graph.

    Raises:
      ValueError: what is wrong, for the client (the caller prefixes the field name).
    """
    from disco.ir import graph as graph_mod
    from disco.ir import hlo_parse

    lines = text.count("\n") + 1
    if lines > limits.MAX_HLO_LINES:
        raise ValueError(f"{lines} lines; the service accepts at most {limits.MAX_HLO_LINES}")
    try:
        module = hlo_parse.parse_module(text)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
    for comp in module.computations:
        for ins in comp.instructions:
            for a in ins.arrays:
                for d in a.dims:
                    if d > limits.MAX_DIM:
                        raise ValueError(f"instruction {ins.name!r} has a dimension of {_big(d)}; "
                                         f"at most {limits.MAX_DIM} (2^40) is accepted")
                if a.elements > limits.MAX_ELEMENTS:
                    raise ValueError(f"instruction {ins.name!r} has an array of {_big(a.elements)} elements; "
                                     f"at most {limits.MAX_ELEMENTS} (2^48) is accepted")
    try:
        graph = graph_mod.from_module(module)
    except OverflowError as e:
        raise ValueError(f"a size or flop count does not fit a float: {e}") from None
    except RecursionError:  # calls or while loops nested too deeply for the graph builder (flop counts)
        raise ValueError("calls or while loops are nested too deeply to build its graph") from None
    check_graph_limits(graph)
    return {"fingerprint": graph.fingerprint, "identity": program_identity("hlo", graph),
            "nodes": len(graph.nodes), "edges": len(graph.edges)}


def _graphs(graph: HloGraph) -> list[HloGraph]:
    """``graph`` and the body and condition graphs of its while loops, nested ones too."""
    out, todo = [], [graph]
    while todo:
        g = todo.pop()
        out.append(g)
        for lp in g.loops:
            todo += (lp.body, lp.condition)
    return out


def check_graph_limits(graph: HloGraph) -> None:
    """Raises ValueError if ``graph`` is past a limit of :mod:`service.limits`.

    The nodes and edges of its while loops' bodies and conditions count too: the simulator
    prices each loop's graphs, so a few while loops over one large body would otherwise hold
    many times the node limit in a text far below the line limit.
    """
    graphs = _graphs(graph)
    nodes = sum(len(g.nodes) for g in graphs)
    edges = sum(len(g.edges) for g in graphs)
    looped = f" ({nodes - len(graph.nodes)} of them in while loops)" if len(graphs) > 1 else ""
    if nodes > limits.MAX_GRAPH_NODES:
        raise ValueError(f"the step graph has {nodes} instructions{looped}; "
                         f"the service accepts at most {limits.MAX_GRAPH_NODES}")
    if edges > limits.MAX_GRAPH_EDGES:
        raise ValueError(f"the step graph has {edges} edges; "
                         f"the service accepts at most {limits.MAX_GRAPH_EDGES}")
    for n in (n for g in graphs for n in g.nodes):
        if n.out_bytes > limits.MAX_BYTES or n.grad_bytes > limits.MAX_BYTES:
            raise ValueError(f"instruction {n.name!r} has {_big(max(n.out_bytes, n.grad_bytes))} output bytes; "
                             f"at most {limits.MAX_BYTES} (2^50) is accepted")
        if not math.isfinite(n.flops) or n.flops > limits.MAX_FLOPS:
            raise ValueError(f"instruction {n.name!r} has {n.flops:g} flops; at most {limits.MAX_FLOPS:g} is accepted")
        if len(n.operands) > limits.MAX_OPERANDS:
            raise ValueError(f"instruction {n.name!r} has {len(n.operands)} operands; "
                             f"at most {limits.MAX_OPERANDS} is accepted")


def main() -> int:
    """The child process: HLO text on stdin, ``{"ok": true, ...}`` or ``{"ok": false, "message"}`` on stdout."""
    import resource

    memory = int(sys.argv[1]) if len(sys.argv) > 1 else limits.PARSE_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
        out: dict[str, Any] = {"ok": True, **check_hlo(text)}
    except MemoryError:
        out = {"ok": False, "message": f"parsing it needs more than {memory} bytes of memory"}
    except ValueError as e:  # HloParseError is a ValueError
        out = {"ok": False, "message": str(e)}
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Validation of a FusionPlan against an HloGraph."""

from __future__ import annotations

import collections
import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from disco.ir.graph import HloGraph, Loop, Node, require_graph
from disco.ir.replica_groups import replica_group_size
from disco.ir.opcodes import COLLECTIVE_KIND, FUSIBLE_OPCODES, LAYOUT_SENSITIVE_PRODUCERS, ZERO_COST_OPCODES
from disco.ir.step_checks import GUIDE_POINTER, double_reductions
from disco.plans import options as plan_options

if TYPE_CHECKING:
    from disco.plans.plan import FusionPlan


def _cluster_of(plan: FusionPlan, index: Mapping[str, int]) -> tuple[list[int], list[str]]:
    """Maps every node to a cluster id (its group, its bucket, or itself)."""
    n = len(index)
    cluster = list(range(n))
    labels = [f"node {name!r}" for name in index]
    next_id = n
    for gi, group in enumerate(plan.groups):
        for name in group:
            cluster[index[name]] = next_id
        labels.append(f"group {gi}")
        next_id += 1
    for bi, bucket in enumerate(plan.buckets or ()):
        for name in bucket.members:
            cluster[index[name]] = next_id
        labels.append(f"bucket {bi}")
        next_id += 1
    for bi, members in enumerate(plan.gather_buckets or ()):
        for name in members:
            if name in index:  # (a loop body's all-gathers: that body's own check, check_gather_buckets)
                cluster[index[name]] = next_id
        labels.append(f"gather bucket {bi}")
        next_id += 1
    return cluster, labels


def _has_cycle(cluster: list[int], graph: HloGraph, extra: list[tuple[int, int]]) -> bool:
    """Whether the graph with ``extra`` edges, each node contracted into its ``cluster``, has a cycle:
    a strongly connected component of two or more clusters (scipy's, in C). :func:`contraction_cycle`
    runs its search in Python only to name a cycle's path: for a plan without one on a 15k-node
    step it took ~90 ms, now ~11 ms (on CPU, profiled; most of the rest is :func:`_cluster_of`)."""
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    edges = graph.edge_array()
    if extra:
        edges = np.concatenate((edges, np.array(extra, np.int64).reshape(-1, 2)))
    of = np.asarray(cluster, np.int64)
    src, dst = of[edges[:, 0]], of[edges[:, 1]]
    cross = src != dst
    if not cross.any():
        return False
    n = int(of.max()) + 1
    # (int32 ones: a duplicate edge sums into its entry, which must not wrap to 0)
    adj = coo_matrix((np.ones(int(cross.sum()), np.int32), (src[cross], dst[cross])), shape=(n, n)).tocsr()
    count, _ = connected_components(adj, directed=True, connection="strong")
    return count < n


def contraction_cycle(plan: FusionPlan, graph: HloGraph) -> list[str] | None:
    """The node path of a cycle that contracting the plan's groups and buckets forms, or None.

    The path starts and ends in the same group or bucket, e.g. ``[a, x, b]`` for
    group {a, b} with a -> x -> b and x outside the group. A gather anchor
    (``plan.gather_after``) is an edge from the anchor to the all-gather.
    """
    index = graph.name_index()
    n_nodes = len(index)
    cluster, _ = _cluster_of(plan, index)
    anchors = [(index[a], index[g]) for g, a in plan.gather_after if a in index and g in index]
    if not _has_cycle(cluster, graph, anchors):
        return None
    succ: dict[int, set[int]] = collections.defaultdict(set)
    witness: dict[tuple[int, int], tuple[int, int]] = {}
    for s, d in (*graph.edges, *anchors):
        cs, cd = cluster[s], cluster[d]
        if cs != cd:
            succ[cs].add(cd)
            witness.setdefault((cs, cd), (s, d))
    # Iterative DFS cycle detection on the contracted graph.
    white, grey, black = 0, 1, 2
    color: dict[int, int] = collections.defaultdict(int)
    parent: dict[int, int] = {}
    for start in set(cluster):
        if color[start] != white:
            continue
        stack = [(start, iter(succ[start]))]
        color[start] = grey
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = black
                stack.pop()
                continue
            if color[nxt] == white:
                color[nxt] = grey
                parent[nxt] = node
                stack.append((nxt, iter(succ[nxt])))
            elif color[nxt] == grey:
                cyc = [nxt]
                cur = node
                while cur != nxt:
                    cyc.append(cur)
                    cur = parent[cur]
                cyc.reverse()  # nxt ... node, then back to nxt
                # start at a group or bucket (ids >= n), so the path leaves it and comes back
                start = next((i for i, c in enumerate(cyc) if c >= n_nodes), 0)
                cyc = cyc[start:] + cyc[:start]
                path: list[str] = []
                for a, b in zip(cyc, cyc[1:] + cyc[:1]):
                    s, d = witness[(a, b)]
                    path += [graph.nodes[s].name, graph.nodes[d].name]
                dedup = [p for i, p in enumerate(path) if i == 0 or p != path[i - 1]]
                return dedup
    return None


MANUAL_BODY_PREFIX = "xla.sdy.manual_computation_body"


def users_of(graph: HloGraph) -> tuple[tuple[int, ...], ...]:
    """Per node, its consumers (the graph's own, read only)."""
    return graph.users_of()


def _group_outputs(graph: HloGraph, index: Mapping[str, int], group,
                   users: Sequence[Sequence[int]] | None = None) -> list[str]:
    """Members of ``group`` whose values are used outside it (or that have no users)."""
    gset = set(group)
    users = users_of(graph) if users is None else users
    out = []
    for name in group:
        us = users[index[name]]
        if not us or any(graph.nodes[u].name not in gset for u in us):
            out.append(name)
    return out


def preds_of(graph: HloGraph) -> tuple[tuple[int, ...], ...]:
    """Per node, its producers (the graph's own, read only)."""
    return graph.operands_of()


def _check_layouts(graph: HloGraph, index: Mapping[str, int], gi: int, group,
                   preds: Sequence[Sequence[int]] | None = None) -> None:
    gset = set(group)
    preds = preds_of(graph) if preds is None else preds
    for name in group:
        node = graph.nodes[index[name]]
        if node.layout:
            raise ValueError(f"group {gi}: {name!r} has the non-default layout {{{node.layout}}}; "
                             "planned fusions are kept to default layouts (a precaution: layout mismatches inside "
                             "injected fusions abort XLA:CPU)")
        for j in preds[index[name]]:
            src = graph.nodes[j]
            op = src.name
            if op in gset:
                continue
            if src.layout:
                raise ValueError(f"group {gi}: input {op!r} of {name!r} has the non-default layout "
                                 f"{{{src.layout}}}; injected fusions need default layouts")
            if src.opcode in LAYOUT_SENSITIVE_PRODUCERS:
                raise ValueError(f"group {gi}: input {op!r} of {name!r} is a {src.opcode}, whose layout "
                                 "XLA:CPU chooses late; injected fusions may not read it directly")


def group_computation_ok(graph: HloGraph, comp: str) -> bool:
    """Planned fusions go in the entry computation or a shard_map body."""
    return comp == graph.nodes[0].computation or comp.startswith(MANUAL_BODY_PREFIX)


def groupable(graph: HloGraph, preds: Sequence[Sequence[int]] | None = None) -> list[bool]:
    """Per node: whether it may be a member of a planned group under every per-node rule
    (fusible opcode, allowed computation, default layout, no layout-sensitive or odd-layout input)."""
    preds = preds_of(graph) if preds is None else preds
    bad_input = [bool(n.layout) or n.opcode in LAYOUT_SENSITIVE_PRODUCERS for n in graph.nodes]
    return [n.opcode in FUSIBLE_OPCODES and not n.layout and group_computation_ok(graph, n.computation)
            and not any(bad_input[p] for p in preds[i]) for i, n in enumerate(graph.nodes)]


# Why a GPU plan may not carry fusion groups (measured on an H100 with jax 0.11.2).
GPU_GROUPS_REASON = (
    "XLA:GPU cannot take planned fusion groups: its PJRT plugin receives the module as a "
    "versioned StableHLO artifact, and the injected mhlo.fusion has no StableHLO form (the "
    "compile fails to legalize it); on GPU use cuts, buckets and compile options")


def check_cuts(plan: FusionPlan, graph: HloGraph, index: Mapping[str, int], owner: dict[str, str]) -> None:
    """Cuts: names in the graph, the producer an operand of the consumer, an array-shaped
    producer in a computation plans may touch, no cut inside a planned group, no duplicates, no end
    on a custom-call or a shard_map call (or a get-tuple-element of one).

    ``owner`` maps instruction names to the group that holds them ("group <i>").

    Raises:
      ValueError: naming the cut and what is wrong with it.
    """
    seen: set[tuple[str, str]] = set()
    boundary: dict[str, str] | None = None
    for ci, cut in enumerate(plan.cuts):
        if not (isinstance(cut, tuple) and len(cut) == 2 and all(isinstance(x, str) for x in cut)):
            raise ValueError(f"cut {ci}: expected a (producer, consumer) pair of instruction names, got {cut!r}")
        prod, cons = cut
        for role, name in (("producer", prod), ("consumer", cons)):
            if name not in index:
                raise ValueError(f"cut {ci}: {role} {name!r} is not in the graph {graph.name!r}")
        if cut in seen:
            raise ValueError(f"cut {ci}: ({prod!r}, {cons!r}) is listed twice")
        seen.add(cut)
        p_node, c_node = graph.nodes[index[prod]], graph.nodes[index[cons]]
        if prod not in c_node.operands:
            raise ValueError(f"cut {ci}: {prod!r} does not feed {cons!r} (its operands: "
                             f"{', '.join(c_node.operands[:6]) or 'none'}); a cut is an operand edge")
        if p_node.shape.startswith("(") or "[" not in p_node.shape:
            raise ValueError(f"cut {ci}: producer {prod!r} has shape {p_node.shape}; a cut needs an array")
        if not group_computation_ok(graph, p_node.computation):
            raise ValueError(f"cut {ci}: {prod!r} is in the nested computation {p_node.computation!r}; cuts go in "
                             "the entry computation or a shard_map body")
        if prod in owner and owner.get(cons) == owner[prod]:
            raise ValueError(f"cut {ci}: {prod!r} and {cons!r} are both in {owner[prod]}; a cut cannot split a "
                             "planned group")
        if boundary is None:
            boundary = _shard_map_boundary(graph)
        for role, name in (("producer", prod), ("consumer", cons)):
            if name in boundary:
                raise ValueError(
                    f"cut {ci}: {role} {name!r} is a {boundary[name]}; cuts cannot go on a custom-call's or a "
                    "shard_map call's operands or results (a barrier there breaks the shard_map XLA reads back: "
                    "XLA:CPU aborted the process on a cut into a shard_map call, 'Check failed: op.use_empty()')")


def parameter_gathers(graph: HloGraph) -> frozenset[str]:
    """The all-gathers (one array each) a gather anchor may hold back: a ``param_gather``'s
    (:mod:`disco.ir.sharded`: its operand an updated parameter's shard)."""
    if not any(n.opcode == "all-gather" for n in graph.nodes):
        return frozenset()  # no all-gather: the labels' dataflow walk is not needed
    index = graph.name_index()
    return frozenset(c.name for c in graph.collective_roles()
                     if c.role == "param_gather" and c.opcode == "all-gather"
                     and not graph.nodes[index[c.name]].shape.startswith("("))


def anchor_problem(node: Node, graph: HloGraph, boundary: dict[str, str]) -> str | None:
    """Why ``node`` cannot be a gather anchor (None: it can): an anchor is a compute op whose
    value is an array (the barrier carries it beside the shard), not a collective, not a zero-cost op
    (a parameter, a constant, tuple plumbing: no point of the compute stream), not a custom-call's or
    a shard_map call's boundary (a barrier there breaks the shard_map XLA reads back)."""
    if node.opcode in COLLECTIVE_KIND:
        return f"is a {node.opcode}; an anchor is a compute op (a point of the compute stream), not a collective"
    if node.opcode in ZERO_COST_OPCODES or node.opcode == "iota":
        return f"is a {node.opcode}, which computes nothing; an anchor is a compute op"
    if node.shape.startswith("(") or "[" not in node.shape:
        return f"has shape {node.shape}; an anchor's value must be an array"
    if node.name in boundary:
        return (f"is a {boundary[node.name]}; a barrier cannot read a custom-call's or a shard_map call's results "
                "(XLA:CPU aborted on a barrier at a shard_map boundary)")
    if not group_computation_ok(graph, node.computation):
        return f"is in the nested computation {node.computation!r}; anchors go in the entry computation or a shard_map body"
    return None


def anchorable(graph: HloGraph, nodes) -> list[int]:
    """The node indices of ``nodes`` that :func:`anchor_problem` accepts as gather anchors, in order."""
    boundary = _shard_map_boundary(graph)
    return [i for i in nodes if anchor_problem(graph.nodes[i], graph, boundary) is None]


def check_gather_after(plan: FusionPlan, graph: HloGraph, index: Mapping[str, int], owner: dict[str, str]) -> None:
    """Gather anchors: each pair a parameter all-gather (:func:`parameter_gathers`) and an anchor
    :func:`anchor_problem` accepts, in the gather's computation, that is not downstream of the gather
    (the gather would wait on its own result), each pair once. An anchor inside a fusion group must
    be the group's output (the barrier reads it from outside the group, and a planned fusion has one
    output).

    Raises:
      ValueError: naming the pair and what is wrong with it.
    """
    gathers = parameter_gathers(graph)
    boundary = _shard_map_boundary(graph)
    seen: set[tuple[str, str]] = set()
    users = users_of(graph)
    groups = {f"group {gi}": g for gi, g in enumerate(plan.groups)}
    for pi, pair in enumerate(plan.gather_after):
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError(f"gather anchor {pi}: expected an (all-gather, anchor) pair of instruction names, got {pair!r}")
        gather, anchor = pair
        for role, name in (("all-gather", gather), ("anchor", anchor)):
            if name not in index:
                raise ValueError(f"gather anchor {pi} ({gather!r} after {anchor!r}): {role} {name!r} is not in the "
                                 f"graph {graph.name!r}")
        if pair in seen:
            raise ValueError(f"gather anchor {pi}: ({gather!r}, {anchor!r}) is listed twice")
        seen.add(pair)
        g_node, a_node = graph.nodes[index[gather]], graph.nodes[index[anchor]]
        if gather not in gathers:
            what = (f"a {g_node.opcode}, not an all-gather" if g_node.opcode != "all-gather"
                    else "an all-gather of no updated parameter's shard (disco.ir.sharded labels it otherwise)")
            raise ValueError(f"gather anchor {pi}: {gather!r} is {what}; an anchor holds back a parameter all-gather")
        why = anchor_problem(a_node, graph, boundary)
        if why is not None:
            raise ValueError(f"gather anchor {pi} ({gather!r} after {anchor!r}): the anchor {why}")
        if a_node.computation != g_node.computation:
            raise ValueError(f"gather anchor {pi}: {anchor!r} is in {a_node.computation!r} and {gather!r} in "
                             f"{g_node.computation!r}; the barrier joins values of one computation")
        where = owner.get(anchor)
        if where is not None and anchor not in _group_outputs(graph, index, groups[where], users):
            raise ValueError(f"gather anchor {pi}: the anchor {anchor!r} is inside {where}, not its output; the barrier "
                             "would read it from outside and give the planned fusion a second output")
    below = _downstream_of(graph, {index[g] for g, _ in plan.gather_after})
    for pi, (gather, anchor) in enumerate(plan.gather_after):
        if below[index[anchor]] >> index[gather] & 1:
            raise ValueError(f"gather anchor {pi}: the anchor {anchor!r} is downstream of {gather!r} (it reads the "
                             "gathered value); the all-gather would wait on its own result")


def _downstream_of(graph: HloGraph, sources: set[int]) -> list[int]:
    """Per node, a bitset (bit = node index) of the ``sources`` it is downstream of (itself included)."""
    preds = preds_of(graph)
    out = [0] * len(graph.nodes)
    for i in range(len(graph.nodes)):  # program order is topological
        r = 1 << i if i in sources else 0
        for p in preds[i]:
            r |= out[p]
        out[i] = r
    return out


def _shard_map_boundary(graph: HloGraph) -> dict[str, str]:
    """Nodes no cut may touch, each with what it is: custom-calls (shardy's ``xla.sdy.*`` markers around
    every shard_map among them), calls of a shard_map body, and get-tuple-elements of either."""
    body_calls = {graph.nodes[d].name for s, d in graph.edges
                  if graph.nodes[d].opcode == "call" and graph.nodes[s].computation.startswith(MANUAL_BODY_PREFIX)
                  and not graph.nodes[d].computation.startswith(MANUAL_BODY_PREFIX)}
    out = {n.name: "custom-call" for n in graph.nodes if n.opcode == "custom-call"}
    out.update((name, "call of a shard_map body") for name in body_calls)
    for n in graph.nodes:
        if n.opcode == "get-tuple-element" and n.operands and n.operands[0] in out:
            out[n.name] = f"get-tuple-element of the {out[n.operands[0]]} {n.operands[0]!r}"
    return out


def bucket_class(n: Node) -> tuple:
    """What all-reduces must share to share a bucket in the plans disco makes: computation,
    reduction, replica groups and dtype (a "tuple" bucket may mix dtypes; baselines and moves build
    "concat"); a tuple-shaped all-reduce shares it with no other (it can only be a bucket of its own)."""
    return ("tuple", n.name) if n.shape.startswith("(") else (n.computation, n.reduction, n.replica_groups, n.dtype)


def gather_class(n: Node) -> tuple:
    """What all-gathers must share to share a gather bucket (:func:`check_gather_buckets`):
    computation, replica groups and dtype."""
    return (n.computation, n.replica_groups, n.dtype)


# id(plan) -> (the plan, the graph, the backend) of a validation that passed, while both live
_PASSED: dict[int, tuple[weakref.ref, weakref.ref, str]] = {}
_PASSED_KEPT = 4096


def validate(plan: FusionPlan, graph: HloGraph, backend: str = "cpu") -> None:
    """Raises ValueError describing the first problem found; returns None for a valid plan.

    Plans and graphs are immutable, so a plan object that passed for a graph object and backend
    passes again: that is remembered while both live (the last :data:`_PASSED_KEPT`), and asking
    again costs a lookup. A search's start plans are validated where they are made and again by
    :func:`disco.search.problem`, each at 46k nodes tens of milliseconds (measured on CPU). A plan
    that fails is checked again each time.

    Args:
      plan: the plan.
      graph: the step's pre-optimisation graph.
      backend: "cpu" or "gpu" (a jax platform name too): on GPU, fusion groups are refused
        (:data:`GPU_GROUPS_REASON`); the backend's compile options are checked.
    """
    require_graph(graph)
    backend = plan_options.normalize(backend)
    key = id(plan)
    hit = _PASSED.get(key)
    if hit is not None and hit[0]() is plan and hit[1]() is graph and hit[2] == backend:
        return
    _validate(plan, graph, backend)
    while len(_PASSED) >= _PASSED_KEPT:
        _PASSED.pop(next(iter(_PASSED)), None)
    _PASSED[key] = (weakref.ref(plan, lambda _, key=key: _PASSED.pop(key, None)), weakref.ref(graph), backend)


def _validate(plan: FusionPlan, graph: HloGraph, backend: str) -> None:
    if backend == "gpu" and plan.groups:
        raise ValueError(f"plan has {len(plan.groups)} fusion group(s) and the backend is GPU: {GPU_GROUPS_REASON}")
    plan_options.check(plan.compile_options, backend)
    index = graph.name_index()
    users, preds = users_of(graph), preds_of(graph)
    owner: dict[str, str] = {}
    for gi, group in enumerate(plan.groups):
        if len(group) < 1:
            raise ValueError(f"group {gi} is empty; expected at least one instruction name")
        comps = set()
        for name in group:
            if name not in index:
                raise ValueError(f"group {gi}: instruction {name!r} is not in the graph {graph.name!r}")
            if name in owner:
                raise ValueError(f"group {gi}: instruction {name!r} is already in {owner[name]}; "
                                 "groups must be disjoint")
            owner[name] = f"group {gi}"
            node = graph.nodes[index[name]]
            if node.opcode not in FUSIBLE_OPCODES:
                raise ValueError(f"group {gi}: instruction {name!r} has opcode {node.opcode!r}, which "
                                 "cannot go into a kLoop fusion; fusible opcodes: "
                                 f"{', '.join(sorted(FUSIBLE_OPCODES))}")
            comps.add(node.computation)
        if len(comps) > 1:
            raise ValueError(f"group {gi} spans computations {sorted(comps)}; a fusion lives in one")
        comp = next(iter(comps))
        if not group_computation_ok(graph, comp):
            raise ValueError(
                f"group {gi} is in the nested computation {comp!r}; planned fusions go in the entry "
                "computation or a shard_map body (XLA:CPU aborted on a fusion injected into a nested "
                "jax.jit body: 'Check failed: has_layout()')")
        _check_layouts(graph, index, gi, group, preds)
        outputs = _group_outputs(graph, index, group, users)
        if len(outputs) > 1:
            raise ValueError(
                f"group {gi} has {len(outputs)} outputs used outside it ({', '.join(outputs[:4])}); "
                "a planned fusion must have exactly one (XLA:CPU aborts on injected multi-output "
                "kLoop fusions, measured with jaxlib 0.10.2)")
    if plan.buckets is not None:
        ars = [n for n in graph.nodes if n.is_all_reduce]
        seen: dict[str, int] = {}
        for bi, bucket in enumerate(plan.buckets):
            if not bucket.members:
                raise ValueError(f"bucket {bi} is empty; expected at least one all-reduce")
            first = None
            for name in bucket.members:
                if name not in index:
                    raise ValueError(f"bucket {bi}: {name!r} is not in the graph {graph.name!r}")
                node = graph.nodes[index[name]]
                if not node.is_all_reduce:
                    raise ValueError(f"bucket {bi}: {name!r} is a {node.opcode}, not an all-reduce")
                if name in seen:
                    raise ValueError(f"bucket {bi}: all-reduce {name!r} is already in bucket {seen[name]}")
                if name in owner:
                    raise ValueError(f"bucket {bi}: {name!r} is also in {owner[name]}")
                seen[name] = bi
                if node.shape.startswith("(") and len(bucket.members) > 1:
                    raise ValueError(f"bucket {bi}: {name!r} is already a tuple all-reduce; it can only be "
                                     "a bucket of its own")
                if first is None:
                    first = node
                    continue
                if (node.reduction, node.replica_groups) != (first.reduction, first.replica_groups):
                    raise ValueError(
                        f"bucket {bi}: {name!r} reduces with {node.reduction!r} over {node.replica_groups}"
                        f" but {first.name!r} with {first.reduction!r} over {first.replica_groups}; "
                        "a bucket merges only all-reduces of the same reduction and replica groups")
                if node.computation != first.computation:
                    raise ValueError(f"bucket {bi}: {name!r} and {first.name!r} are in different computations")
                if bucket.build in ("concat", "rs_ag", "scatter") and node.dtype != first.dtype:
                    raise ValueError(f"bucket {bi}: {bucket.build!r} needs one dtype, got {first.dtype} and "
                                     f"{node.dtype} ({name!r}); use build 'tuple'")
                if bucket.build == "tuple" and node.computation.startswith(MANUAL_BODY_PREFIX):
                    raise ValueError(
                        f"bucket {bi}: build 'tuple' is not supported inside a shard_map body "
                        f"({node.computation!r}): jaxlib 0.10.2 fails to export a variadic all-reduce "
                        "there; use build 'concat'")
            if bucket.build == "rs_ag" and first.shape.startswith("("):
                raise ValueError(f"bucket {bi}: {first.name!r} is a tuple all-reduce; build 'rs_ag' "
                                 "splits one flat buffer")
            if bucket.build == "rs_ag" and replica_group_size(first.replica_groups) is None:
                raise ValueError(
                    f"bucket {bi}: build 'rs_ag' needs replica groups of one known size to split the "
                    f"buffer, but {first.name!r} has replica_groups={first.replica_groups!r}; use build "
                    "'concat'")
        if any(b.build == "scatter" for b in plan.buckets):
            check_scatter_buckets(plan, graph, owner)
        missing = [n.name for n in ars if n.name not in seen]
        if missing:
            raise ValueError(f"buckets leave out all-reduces {missing[:5]}{'...' if len(missing) > 5 else ''}; "
                             "every all-reduce must be in exactly one bucket")
    if plan.gather_buckets is not None:
        check_gather_buckets(plan.gather_buckets, graph, index, owner)
        if graph.loops:
            check_body_cycles(plan, graph)
    if plan.cuts:
        check_cuts(plan, graph, index, owner)
    if plan.gather_after:
        check_gather_after(plan, graph, index, owner)
    cycle = contraction_cycle(plan, graph)
    if cycle is not None:
        _raise_on_a_double_reduction(plan, graph, cycle)
        bucket_of = {m: f"bucket {bi}" for bi, b in enumerate(plan.buckets or ()) for m in b.members}
        bucket_of.update((m, f"gather bucket {bi}") for bi, b in enumerate(plan.gather_buckets or ()) for m in b)
        where = owner.get(cycle[0]) or bucket_of.get(cycle[0], cycle[0])
        raise ValueError(f"{where}: contracting the plan forms a cycle along {' -> '.join(cycle)}")



def scatterable(graph: HloGraph) -> dict[str, tuple[str, ...]]:
    """The all-reduces a "scatter" bucket may hold, each with the dynamic-slices it replaces: a
    ``grad_scatter`` (:mod:`disco.ir.sharded`) whose every user is a dynamic-slice keeping this
    device's block (``graph.scatter_blocks``)."""
    blocks = [b for b in graph.scatter_blocks if b.dim is not None]
    if not blocks:
        return {}
    roles = {c.name: c.role for c in graph.collective_roles()}
    return {b.all_reduce: b.slices for b in blocks if roles.get(b.all_reduce) == "grad_scatter"}


def scatter_groups(graph: HloGraph) -> dict[str, tuple]:
    """Per :func:`scatterable` all-reduce, how it scatters: its (scatter groups, across groups)
    (:class:`disco.ir.scatter_blocks.ScatterBlock`). A "scatter" bucket's members share them."""
    return {b.all_reduce: (b.scatter_groups, b.across_groups) for b in graph.scatter_blocks if b.dim is not None}


def check_scatter_buckets(plan: FusionPlan, graph: HloGraph, owner: dict[str, str]) -> None:
    """Each "scatter" bucket holds only :func:`scatterable` all-reduces that scatter over the same
    groups (:func:`scatter_groups`), and no fusion group holds the dynamic-slices it replaces.

    Raises:
      ValueError: naming the bucket, the member and why it cannot be scattered.
    """
    ok = scatterable(graph)
    roles = None
    blocks = {b.all_reduce: b for b in graph.scatter_blocks}
    for bi, bucket in enumerate(plan.buckets or ()):
        if bucket.build != "scatter":
            continue
        first = None
        for name in bucket.members:
            if name in ok:
                held = [s for s in ok[name] if s in owner]
                if held:
                    raise ValueError(f"bucket {bi}: build 'scatter' replaces {name!r}'s dynamic-slice {held[0]!r}, "
                                     f"which {owner[held[0]]} holds; leave it out of the group")
                b = blocks[name]
                if first is None:
                    first = b
                elif (b.scatter_groups, b.across_groups) != (first.scatter_groups, first.across_groups):
                    raise ValueError(
                        f"bucket {bi}: {name!r} is a reduce-scatter of {b.blocks} blocks over "
                        f"{_groups_text(b.scatter_groups)}{_across_text(b)}, but {first.all_reduce!r} of "
                        f"{first.blocks} over {_groups_text(first.scatter_groups)}{_across_text(first)}; a "
                        "'scatter' bucket merges only gradient scatters over the same groups")
                continue
            if roles is None:
                roles = {c.name: c.role for c in graph.collective_roles()}
            block = blocks.get(name)
            if roles.get(name) != "grad_scatter":
                why = f"it is a {roles.get(name, 'collective')!r} all-reduce, not a 'grad_scatter'"
            elif block is None:
                why = "its result feeds no dynamic-slice"
            else:
                why = block.why
            raise ValueError(f"bucket {bi}: {name!r} cannot be in a 'scatter' bucket: {why}. A 'scatter' bucket "
                             "holds only gradient scatters (all-reduces whose every user is a dynamic-slice "
                             "keeping this device's block); use build 'concat'")


def _groups_text(groups: tuple[tuple[int, ...], ...]) -> str:
    text = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    return text if len(text) <= 60 else text[:57] + "..."


def _across_text(block) -> str:
    return f" then an all-reduce over {_groups_text(block.across_groups)}" if block.across_groups else ""


def check_gather_buckets(gather_buckets: tuple[tuple[str, ...], ...], graph: HloGraph, index: Mapping[str, int],
                         owner: dict[str, str]) -> None:
    """Each gather bucket: all-gathers (one array each) of one :func:`gather_class` (computation,
    replica groups, dtype), each in one bucket at most, of the graph or of one loop body
    (:func:`body_gathers`; :func:`check_body_cycles` then checks that body). All-gathers in no bucket
    stay as they are.

    Raises:
      ValueError: naming the bucket, the member and what is wrong.
    """
    seen: dict[str, int] = {}
    in_bodies: dict[str, tuple[Node, Loop]] | None = None
    for bi, members in enumerate(gather_buckets):
        if not members:
            raise ValueError(f"gather bucket {bi} is empty; expected at least one all-gather")
        first = None
        for name in members:
            if name in index:
                node = graph.nodes[index[name]]
            else:
                in_bodies = body_gathers(graph) if in_bodies is None else in_bodies
                if name not in in_bodies:
                    raise ValueError(f"gather bucket {bi}: {name!r} is not in the graph {graph.name!r} nor an "
                                     "all-gather of one of its loops' bodies")
                node = in_bodies[name][0]
            if node.opcode != "all-gather":
                raise ValueError(f"gather bucket {bi}: {name!r} is a {node.opcode}, not an all-gather")
            if node.shape.startswith("("):
                raise ValueError(f"gather bucket {bi}: {name!r} gathers several arrays; expected an all-gather "
                                 "of one")
            if name in seen:
                raise ValueError(f"gather bucket {bi}: all-gather {name!r} is already in gather bucket {seen[name]}")
            if name in owner:
                raise ValueError(f"gather bucket {bi}: {name!r} is also in {owner[name]}")
            seen[name] = bi
            if first is None:
                first = node
                continue
            if node.computation != first.computation:
                raise ValueError(f"gather bucket {bi}: {name!r} and {first.name!r} are in different computations")
            if node.replica_groups != first.replica_groups:
                raise ValueError(f"gather bucket {bi}: {name!r} gathers over {node.replica_groups} but "
                                 f"{first.name!r} over {first.replica_groups}; a gather bucket merges only "
                                 "all-gathers of the same replica groups")
            if node.dtype != first.dtype:
                raise ValueError(f"gather bucket {bi}: one dtype is concatenated, got {first.dtype} "
                                 f"({first.name!r}) and {node.dtype} ({name!r})")


def body_gathers(graph: HloGraph) -> dict[str, tuple[Node, Loop]]:
    """The all-gathers of the graph's loop bodies (one level deep) by name, each with its loop: a gather
    bucket of them merges them in the body, once per iteration."""
    return {n.name: (n, lp) for lp in graph.loops for n in lp.body.nodes if n.opcode == "all-gather"}


def check_body_cycles(plan: FusionPlan, graph: HloGraph) -> None:
    """Refuses gather buckets of a loop body that contracting forms a cycle in, as outside loops."""
    in_bodies = body_gathers(graph)
    by_loop: dict[str, list[tuple[str, ...]]] = collections.defaultdict(list)
    loops: dict[str, Loop] = {}
    for members in plan.gather_buckets or ():
        if members[0] in in_bodies:
            loop = in_bodies[members[0]][1]
            by_loop[loop.node].append(members)
            loops[loop.node] = loop
    for name, buckets in by_loop.items():
        alone = dataclasses.replace(plan, groups=(), buckets=None, cuts=(), gather_after=(), gather_buckets=tuple(buckets))
        cycle = contraction_cycle(alone, loops[name].body)
        if cycle is not None:
            bi = plan.gather_buckets.index(next(b for b in buckets if cycle[0] in b))
            raise ValueError(f"gather bucket {bi}: contracting it in the body of loop {name!r} forms a cycle "
                             f"along {' -> '.join(cycle)}")


def _raise_on_a_double_reduction(plan: FusionPlan, graph: HloGraph, cycle: list[str]) -> None:
    """Names the cause of a bucket's cycle when it is an all-reduce feeding another in the same
    bucket (a gradient reduced twice), keeping the cycle's path."""
    bucket_of = {m: bi for bi, b in enumerate(plan.buckets or ()) for m in b.members}
    if cycle[0] not in bucket_of:
        return
    for a, b in double_reductions(graph):
        if bucket_of.get(a) == bucket_of[cycle[0]] == bucket_of.get(b):
            raise ValueError(f"bucket {bucket_of[a]}: an all-reduce feeds another all-reduce ({a} -> {b}): "
                             f"reduce each gradient once; {GUIDE_POINTER}; contracting the plan forms a "
                             f"cycle along {' -> '.join(cycle)}")

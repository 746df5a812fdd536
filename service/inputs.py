"""Turning a validated request into disco objects: the graph, the cluster, the stored job inputs.

Nothing from a request is unpickled or evaluated: HLO text goes through disco's
parser (in a child process, see :mod:`service.intake`), graph JSON through its schema
and ``disco.ir.graph.Node``, cluster YAML through ``disco.sim.cluster_spec.parse_yaml`` (a
``yaml.SafeLoader``) and ``ClusterSpec.from_dict`` (never a file path). Every limit of :mod:`service.limits` is
checked here or in the schemas, before a job exists.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from service import limits
from service.errors import ApiError

if TYPE_CHECKING:
    from disco.ir.graph import HloGraph
    from disco.sim.cluster import ClusterSpec
    from service.schemas import GraphJson, PlanRequest


def graph_from_json(graph: GraphJson) -> HloGraph:
    """The graph of a validated graph JSON (its fingerprint still the placeholder "")."""
    from disco.ir.graph import HloGraph, Node

    nodes = tuple(Node(**{**n.model_dump(), "operands": tuple(n.operands), "flops": float(n.flops)})
                  for n in graph.nodes)
    return HloGraph(name=graph.name, nodes=nodes, edges=tuple((s, d) for s, d in graph.edges), fingerprint="",
                    mesh=tuple((str(a), int(n)) for a, n in graph.mesh or ()))


def check_cluster(spec: ClusterSpec, field: str) -> ClusterSpec:
    """Raises ApiError 400 (naming ``field``) if ``spec`` is past a limit of :mod:`service.limits`."""
    def bad(what: str, got: Any, expected: str) -> ApiError:
        return ApiError(400, "invalid_cluster", f"{field}.{what}: expected {expected}, got {got!r}", f"{field}")

    if spec.num_devices > limits.MAX_CLUSTER_DEVICES:
        raise ApiError(400, "invalid_cluster", f"{field}: {spec.nodes} nodes x {spec.devices_per_node} devices = "
                       f"{spec.num_devices} devices; the service accepts at most {limits.MAX_CLUSTER_DEVICES}", field)
    for name in ("intra", "inter"):
        link = getattr(spec, name)
        if not limits.MIN_BANDWIDTH <= link.bandwidth <= limits.MAX_BANDWIDTH:
            raise bad(f"{name}.bandwidth", link.bandwidth,
                      f"{limits.MIN_BANDWIDTH:g} to {limits.MAX_BANDWIDTH:g} bytes/s")
        if link.latency > limits.MAX_LATENCY_S:
            raise bad(f"{name}.latency", link.latency, f"at most {limits.MAX_LATENCY_S:g} s")
    if not limits.MIN_COMPUTE_SPEED <= spec.compute_speed <= limits.MAX_COMPUTE_SPEED:
        raise bad("compute_speed", spec.compute_speed, f"{limits.MIN_COMPUTE_SPEED:g} to {limits.MAX_COMPUTE_SPEED:g}")
    if not (math.isfinite(spec.operand_latency) and spec.operand_latency <= limits.MAX_LATENCY_S):
        raise bad("operand_latency", spec.operand_latency, f"at most {limits.MAX_LATENCY_S:g} s")
    return spec


def parse_cluster(cluster: Any, devices: int | None) -> ClusterSpec:
    """The request's cluster: a preset (``devices`` for "local") or our YAML format.

    Raises:
      ApiError: 400; for an unknown preset the message lists the presets.
    """
    from disco.sim import cluster as dc

    if isinstance(cluster, str):
        if cluster not in dc.PRESETS:
            raise ApiError(400, "unknown_preset",
                           f"unknown cluster preset {cluster!r}; expected one of: {', '.join(dc.PRESETS)} "
                           "(or {\"yaml\": \"...\"})", "cluster")
        try:
            return check_cluster(dc.preset(cluster, devices=devices), "cluster")
        except ValueError as e:
            raise ApiError(400, "invalid_cluster", str(e), "devices") from None
    from disco.sim.cluster_spec import parse_yaml

    try:  # the reader of every cluster file (duplicate keys refused, 5e-1 a number), never a path
        data = parse_yaml(cluster.yaml, "cluster.yaml")
        spec = dc.ClusterSpec.from_dict(data, "cluster.yaml")
    except (ValueError, TypeError, RecursionError) as e:
        msg = str(e).strip()
        msg = msg if msg.startswith("cluster.yaml") else f"cluster.yaml: {msg}"
        raise ApiError(400, "invalid_cluster", msg, "cluster.yaml") from None
    for key in ("name", "description", "label"):  # YAML's "\ud800" escape gives a lone surrogate
        text = getattr(spec, key)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApiError(400, "invalid_cluster", f"cluster.yaml.{key}: expected Unicode text, got a lone surrogate "
                           f"{text[e.start]!r} at character {e.start} (no UTF-8 text holds one)", "cluster.yaml") from None
    check_cluster(spec, "cluster.yaml")
    if devices is not None and devices != spec.num_devices:
        raise ApiError(400, "invalid_cluster",
                       f"devices={devices} does not match the cluster's {spec.num_devices} devices", "devices")
    return spec


def compiled_tier_unavailable(has_text: bool, cluster: ClusterSpec) -> str | None:
    """Why the compiled tier cannot rank plans on ``cluster`` in this process, or None.

    Args:
      has_text: whether the request posted HLO text (the module the tier compiles), not graph JSON.
    """
    from xla_hooks import compile_for

    if not has_text:
        return "the request posts a graph JSON, not hlo_text: the compiled tier compiles the step's HLO module"
    if cluster.device == "cpu":
        return ("the cluster's devices are CPUs: their compiled prices need a correction fitted from "
                "measurements (disco optimize measures them), so the emulated tier ranks CPU plans")
    return compile_for.unavailable(cluster.device)


def planner_options(req: PlanRequest, cluster: ClusterSpec) -> dict[str, Any]:
    """The request's planner options, ``tier`` resolved: "compiled" where it asks for it or for "auto"
    and the compiled tier runs here, else None (emulated: the options a plan key held before tiers
    existed, so the plans stored then keep their keys).

    Raises:
      ApiError: 400 for tier "compiled" where it cannot run, saying why.
    """
    options = req.options.model_dump()
    problem = compiled_tier_unavailable(req.hlo_text is not None, cluster) if options["tier"] != "emulated" else None
    if options["tier"] == "compiled" and problem is not None:
        raise ApiError(400, "invalid_request", f"options.tier: 'compiled' cannot run here: {problem}; "
                       "expected 'auto' or 'emulated' for this request", "options.tier")
    options["tier"] = "compiled" if options["tier"] != "emulated" and problem is None else None
    return options


def stored_request(req: PlanRequest, cluster: ClusterSpec, fingerprint: str,
                   options: dict[str, Any]) -> dict[str, Any]:
    """What a job stores to run (and to be resumed after a restart).

    Args:
      req: the validated request.
      cluster: its cluster.
      fingerprint: the server's fingerprint of the program (stored into a graph JSON).
      options: the planner options (:func:`planner_options`).
    """
    out: dict[str, Any] = {"cluster": cluster.to_dict(), "options": dict(options)}
    if req.environment is not None:  # echoed in the plan's report (service.jobs)
        out["environment"] = req.environment.model_dump()
    if req.hlo_text is not None:
        out["hlo_text"] = req.hlo_text
    else:
        assert req.graph is not None
        graph = req.graph.model_dump(by_alias=True)
        if graph.get("mesh") is None:  # a graph without a mesh is stored as HloGraph.to_dict writes it: without one
            graph.pop("mesh", None)
        out["graph"] = {**graph, "fingerprint": fingerprint}
    return out


def graph_from_stored(request: dict[str, Any]) -> HloGraph:
    """The job's graph: parsed from its HLO text, or its stored graph JSON (server's fingerprint)."""
    from disco.ir.graph import HloGraph

    if "hlo_text" in request:
        return HloGraph.from_hlo_text(request["hlo_text"])
    return HloGraph.from_dict(request["graph"])


def cluster_from_stored(request: dict[str, Any]) -> ClusterSpec:
    from disco.sim.cluster import ClusterSpec

    return ClusterSpec.from_dict(request["cluster"], "stored cluster")

"""Turning a validated request into disco objects: the graph, the cluster, the stored job inputs.

Nothing from a request is unpickled or evaluated: HLO text goes through disco's
parser, graph JSON through ``HloGraph.from_dict``, cluster YAML through
``yaml.safe_load`` and ``ClusterSpec.from_dict`` (never a file path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.errors import ApiError

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec
    from disco.ir.graph import HloGraph
    from service.schemas import PlanRequest


def parse_graph(hlo_text: str | None, graph: dict[str, Any] | None) -> HloGraph:
    """The request's graph.

    Raises:
      ApiError: 400 naming the field (and, for HLO, the line the parser stopped at).
    """
    from disco.ir.graph import HloGraph

    if hlo_text is not None:
        try:
            return HloGraph.from_hlo_text(hlo_text)
        except (ValueError, RecursionError) as e:
            raise ApiError(400, "invalid_hlo", f"hlo_text is not parsable HLO: {e}", "hlo_text") from None
    try:
        g = HloGraph.from_dict(graph)
        if not isinstance(g.fingerprint, str) or not g.fingerprint or not isinstance(g.name, str):
            raise ValueError("graph JSON fields 'name' and 'fingerprint' must be non-empty strings")
        for i, n in enumerate(g.nodes):
            if not isinstance(n.name, str) or not isinstance(n.opcode, str):
                raise ValueError(f"graph JSON field 'nodes[{i}]': name and opcode must be strings")
        return g
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        raise ApiError(400, "invalid_graph", f"graph is not a disco graph: {e}", "graph") from None


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
            return dc.preset(cluster, devices=devices)
        except ValueError as e:
            raise ApiError(400, "invalid_cluster", str(e), "devices") from None
    import yaml

    try:
        data = yaml.safe_load(cluster.yaml)
        spec = dc.ClusterSpec.from_dict(data, "cluster.yaml")
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as e:
        msg = str(e).strip()
        msg = msg if msg.startswith("cluster.yaml") else f"cluster.yaml: {msg}"
        raise ApiError(400, "invalid_cluster", msg, "cluster.yaml") from None
    if devices is not None and devices != spec.num_devices:
        raise ApiError(400, "invalid_cluster",
                       f"devices={devices} does not match the cluster's {spec.num_devices} devices", "devices")
    return spec


def stored_request(req: PlanRequest, cluster: ClusterSpec) -> dict[str, Any]:
    """What a job stores to run (and to be resumed after a restart)."""
    out: dict[str, Any] = {"cluster": cluster.to_dict(), "options": req.options.model_dump()}
    if req.hlo_text is not None:
        out["hlo_text"] = req.hlo_text
    else:
        out["graph"] = req.graph
    return out


def graph_from_stored(request: dict[str, Any]) -> HloGraph:
    from disco.ir.graph import HloGraph

    if "hlo_text" in request:
        return HloGraph.from_hlo_text(request["hlo_text"])
    return HloGraph.from_dict(request["graph"])


def cluster_from_stored(request: dict[str, Any]) -> ClusterSpec:
    from disco.sim.cluster import ClusterSpec

    return ClusterSpec.from_dict(request["cluster"], "stored cluster")

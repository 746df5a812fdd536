"""Cluster files of other systems: SuperScaler-style and AutoDist-style.

Two file formats of other systems are read by :func:`load_cluster`, which
tells them apart by their top-level keys. Since their exact upstream schemas
are not at hand, these are the versions we read:

SuperScaler-style ``resource_pool.yaml``::

    Server:
      host0:
        GPU:
          0:
            links:
              - {dest: /server/host0/GPU/1/, type: NVLink, rate: 2400Gbps, propagation_latency: 5us}
          1:
            links: [...]
      host1: {...}
    Switch:                      # optional: links between servers
      switch0:
        links:
          - {dest: /server/host0/NIC/0/, type: RDMA, rate: 100Gbps, propagation_latency: 15us}

  servers -> ``nodes``; GPUs per server -> ``devices_per_node`` (every server
  must have the same count); links between two GPUs of one server -> ``intra``
  (the slowest rate and the largest latency among them); links whose two ends are
  on different servers, or that leave a ``Switch`` entry -> ``inter`` (again the
  bottleneck). ``rate`` as a bare number is read as Gbps, ``propagation_latency``
  as a bare number as seconds. A ``dest`` path names its server as
  ``/server/<host>/...``.

AutoDist-style ``resource_spec.yml``::

    nodes:
      - address: 10.0.0.1
        gpus: [0, 1, 2, 3]
        chief: true
        network_bandwidth: 100     # Gbps, optional
      - address: 10.0.0.2
        gpus: [0, 1, 2, 3]
        network_bandwidth: 100

  nodes -> ``nodes``; ``len(gpus)`` -> ``devices_per_node`` (equal on all
  nodes); the smallest ``network_bandwidth`` -> inter bandwidth. The format says
  nothing about links inside a node nor about latencies, so ``load_cluster``
  needs ``intra=`` and ``inter_latency=`` for it (and ``inter_bandwidth=`` when no
  node gives ``network_bandwidth``) and raises ValueError naming what is missing.

A one-node cluster has no inter-node traffic; loaders set its ``inter`` link to
the ``intra`` link so that equal clusters compare equal.

Our own format is read as well (:meth:`~disco.sim.cluster_spec.ClusterSpec.from_dict`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from disco.sim.cluster_spec import (Algorithm, ClusterSpec, LinkSpec, parse_bandwidth, parse_latency, parse_yaml,
                                    read_cluster_file, shown)


def load_cluster(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    algorithm: Algorithm = "ring",
    intra: LinkSpec | None = None,
    inter_latency: float | None = None,
    inter_bandwidth: float | None = None,
) -> ClusterSpec:
    """Reads a cluster file in our format, SuperScaler-style or AutoDist-style.

    The format is told apart by its top-level keys: ``Server`` (SuperScaler-style
    ``resource_pool.yaml``), ``nodes`` as a list (AutoDist-style
    ``resource_spec.yml``), otherwise our own format (``nodes`` as an integer).

    Args:
      path: the file.
      name: the cluster's name; default "<nodes>x<devices_per_node>" for the foreign formats.
      algorithm: the all-reduce algorithm (foreign formats do not say which).
      intra: the intra-node link, for formats that do not describe it (AutoDist-style).
      inter_latency: the inter-node latency in seconds, for formats without one (AutoDist-style).
      inter_bandwidth: the inter-node bandwidth in bytes/s, when an AutoDist-style file gives
        no ``network_bandwidth``.

    Returns:
      The ClusterSpec. Its ``label`` says which format it came from.

    Raises:
      ValueError: naming the field that is missing, malformed, or cannot be mapped.
    """
    p = Path(path)
    data = parse_yaml(read_cluster_file(p), p.name)
    if isinstance(data, Mapping) and "Server" in data:
        return _from_superscaler(data, p.name, name=name, algorithm=algorithm)
    if isinstance(data, Mapping) and isinstance(data.get("nodes"), list):
        return _from_autodist(data, p.name, name=name, algorithm=algorithm, intra=intra,
                              inter_latency=inter_latency, inter_bandwidth=inter_bandwidth)
    return ClusterSpec.from_dict(data, p.name)


_DEST_RE = re.compile(r"^/server/([^/]+)/")


def _bottleneck(links: list[tuple[float, float]]) -> LinkSpec:
    return LinkSpec(min(b for b, _ in links), max(lat for _, lat in links))


def _read_links(entry: Any, where: str) -> list[tuple[str, float, float]]:
    """(dest, rate bytes/s, latency s) of an entry's ``links`` list."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping with 'links', got {shown(entry)}")
    links = entry.get("links", [])
    if links is None:
        links = []
    if not isinstance(links, list):
        raise ValueError(f"{where}.links: expected a list of links, got {shown(links)}")
    out = []
    for i, link in enumerate(links):
        lw = f"{where}.links[{i}]"
        if not isinstance(link, Mapping):
            raise ValueError(f"{lw}: expected a mapping with dest, rate and propagation_latency, got {shown(link)}")
        for key in ("dest", "rate", "propagation_latency"):
            if key not in link:
                raise ValueError(f"{lw}: missing field {shown(key)}")
        dest = link["dest"]
        if not isinstance(dest, str) or _DEST_RE.match(dest) is None:
            raise ValueError(f"{lw}.dest: expected a path like '/server/<host>/GPU/<i>/', got {shown(dest)}")
        out.append((dest, parse_bandwidth(link["rate"], f"{lw}.rate", bare_unit=1e9 / 8),
                    parse_latency(link["propagation_latency"], f"{lw}.propagation_latency")))
    return out


def _from_superscaler(data: Mapping[str, Any], fname: str, *, name: str | None,
                      algorithm: Algorithm) -> ClusterSpec:
    servers = data["Server"]
    if not isinstance(servers, Mapping) or not servers:
        raise ValueError(f"{fname}: Server: expected a mapping of host name -> devices, got {shown(servers)}")
    unknown = sorted(set(data) - {"Server", "Switch"})
    if unknown:
        raise ValueError(f"{fname}: unknown top-level keys {shown(unknown)}; expected Server and optionally Switch")
    counts: dict[str, int] = {}
    intra: list[tuple[float, float]] = []
    inter: list[tuple[float, float]] = []
    for host, devices in servers.items():
        hw = f"{fname}: Server.{host}"
        if not isinstance(devices, Mapping):
            raise ValueError(f"{hw}: expected a mapping of device kinds (GPU, CPU, NIC), got {shown(devices)}")
        gpus = devices.get("GPU")
        if not isinstance(gpus, Mapping) or not gpus:
            raise ValueError(f"{hw}.GPU: expected a mapping of GPU index -> links, got {shown(gpus)}")
        counts[str(host)] = len(gpus)
        for kind, entries in devices.items():
            if not isinstance(entries, Mapping):
                raise ValueError(f"{hw}.{kind}: expected a mapping of device index -> links, got {shown(entries)}")
            for idx, entry in entries.items():
                for dest, rate, lat in _read_links(entry or {}, f"{hw}.{kind}.{idx}"):
                    dest_host = _DEST_RE.match(dest).group(1)
                    if dest_host not in servers and dest_host not in {str(h) for h in servers}:
                        raise ValueError(f"{hw}.{kind}.{idx}: link dest {shown(dest)} names an unknown server "
                                         f"{shown(dest_host)}; servers: {shown(sorted(map(str, servers)))}")
                    if dest_host != str(host):
                        inter.append((rate, lat))
                    elif kind == "GPU" and "/GPU/" in dest:
                        intra.append((rate, lat))
    switches = data.get("Switch") or {}
    if not isinstance(switches, Mapping):
        raise ValueError(f"{fname}: Switch: expected a mapping of switch name -> links, got {shown(switches)}")
    for sw, entry in switches.items():
        for _, rate, lat in _read_links(entry or {}, f"{fname}: Switch.{sw}"):
            inter.append((rate, lat))
    if len(set(counts.values())) != 1:
        raise ValueError(f"{fname}: Server.*.GPU: every server must have the same number of GPUs, got {shown(counts)}")
    dpn = next(iter(counts.values()))
    nodes = len(counts)
    if dpn > 1 and not intra:
        raise ValueError(f"{fname}: Server.*.GPU.*.links: no link between two GPUs of one server; "
                         "expected GPU links with a dest on the same server")
    if nodes > 1 and not inter:
        raise ValueError(f"{fname}: no link between servers; expected a Switch entry or a link whose dest "
                         "is on another server")
    if not intra and not inter:  # one server with one GPU: nothing to read a link from
        raise ValueError(f"{fname}: Server: one server with one GPU and no links, so no link costs to read; "
                         "expected at least one link (any link of the GPU), or the cluster in disco's format")
    intra_link = _bottleneck(intra) if intra else _bottleneck(inter)
    inter_link = _bottleneck(inter) if nodes > 1 else intra_link
    return ClusterSpec(name=name or f"{nodes}x{dpn}", nodes=nodes, devices_per_node=dpn,
                       intra=intra_link, inter=inter_link, algorithm=algorithm,
                       label="loaded from SuperScaler-style resource_pool.yaml")


def _from_autodist(data: Mapping[str, Any], fname: str, *, name: str | None, algorithm: Algorithm,
                   intra: LinkSpec | None, inter_latency: float | None,
                   inter_bandwidth: float | None) -> ClusterSpec:
    nodes = data["nodes"]
    if not nodes:
        raise ValueError(f"{fname}: nodes: expected a non-empty list of nodes, got {shown(nodes)}")
    counts: list[int] = []
    bws: list[float] = []
    chiefs = 0
    for i, nd in enumerate(nodes):
        nw = f"{fname}: nodes[{i}]"
        if not isinstance(nd, Mapping):
            raise ValueError(f"{nw}: expected a mapping with address and gpus, got {shown(nd)}")
        if "address" not in nd:
            raise ValueError(f"{nw}: missing field 'address'")
        gpus = nd.get("gpus")
        if (not isinstance(gpus, list) or not gpus
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
                or len(set(gpus)) != len(gpus)):
            raise ValueError(f"{nw}.gpus: expected a list of GPU indices, got {shown(gpus)}")
        counts.append(len(gpus))
        if nd.get("chief", False) is True:
            chiefs += 1
        elif "chief" in nd and not isinstance(nd["chief"], bool):
            raise ValueError(f"{nw}.chief: expected true or false, got {shown(nd['chief'])}")
        if "network_bandwidth" in nd:
            bws.append(parse_bandwidth(nd["network_bandwidth"], f"{nw}.network_bandwidth", bare_unit=1e9 / 8))
    if chiefs > 1:
        raise ValueError(f"{fname}: nodes: expected at most one node with chief: true, got {chiefs}")
    if len(set(counts)) != 1:
        raise ValueError(f"{fname}: nodes[*].gpus: every node must have the same number of GPUs, got {shown(counts)}")
    n, dpn = len(nodes), counts[0]
    if intra is None:
        raise ValueError(f"{fname}: the format does not describe links inside a node; "
                         "pass intra=LinkSpec(bandwidth, latency) to load_cluster, or, where no argument can be "
                         "passed (--cluster), give the cluster in disco's format: nodes, devices_per_node, "
                         "intra and inter links (as `disco calibrate --out` writes)")
    if n == 1:
        inter_link = intra
    else:
        bw = min(bws) if bws else inter_bandwidth
        if bw is None:
            raise ValueError(f"{fname}: nodes[*].network_bandwidth: no node gives one; "
                             "add it or pass inter_bandwidth= (bytes/s)")
        if inter_latency is None:
            raise ValueError(f"{fname}: the format gives no inter-node latency; pass inter_latency= (seconds)")
        inter_link = LinkSpec(bw, inter_latency)
    return ClusterSpec(name=name or f"{n}x{dpn}", nodes=n, devices_per_node=dpn, intra=intra,
                       inter=inter_link, algorithm=algorithm,
                       label="loaded from AutoDist-style resource_spec.yml")


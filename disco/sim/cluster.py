"""Cluster descriptions: how many devices, how they are linked, which collective algorithm.

A :class:`ClusterSpec` is what the simulator needs to price a collective: the
number of nodes, devices per node, an *intra*-node link and an *inter*-node
link (each a bandwidth in bytes/s and a latency in seconds), the all-reduce
algorithm, and the speed of a device relative to the device the kernel costs
were profiled on.

Our own YAML format (``ClusterSpec.to_yaml`` / ``ClusterSpec.from_yaml``)::

    name: 2x8-100gbe
    nodes: 2
    devices_per_node: 8
    intra: {bandwidth: 300GB/s, latency: 5us}   # per device, per direction
    inter: {bandwidth: 100Gbps, latency: 15us}  # per node, per direction
    algorithm: hierarchical                     # ring | tree | hierarchical
    compute_speed: 1.0                          # optional, default 1.0
    operand_latency: 0us                        # optional: per extra operand of a variadic all-reduce
    overlap: true                               # optional: collectives beside compute (false: one stream)
    device: cpu                                 # optional: the device kind that prices kernels (cpu | h100)
    description: ...                            # optional free text
    label: public GPU cluster shape, not measured  # optional

Bandwidths are numbers in bytes/s or strings with a unit (``B/s``, ``KB/s``,
``MB/s``, ``GB/s``, ``GiB/s``, ``bps``, ``Kbps``, ``Mbps``, ``Gbps``, ``Tbps``;
``Gb/s`` is ``Gbps``). Latencies are numbers in seconds or strings with a unit
(``s``, ``ms``, ``us``, ``ns``). ``to_yaml`` writes plain numbers.

Two field formats of other systems are read by :func:`load_cluster`, which
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
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

Algorithm = Literal["ring", "tree", "hierarchical"]
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "hierarchical")
# Device kinds: which fusion emulation and which kernel cost model the simulator uses.
# "cpu" is XLA:CPU (the behaviour of every spec that names no device); "h100" is XLA:GPU on
# an NVIDIA H100 SXM (disco.sim.gpu_fusion, and the H100 cost model).
DEVICES: tuple[str, ...] = ("cpu", "h100")
GPU_DEVICES: frozenset[str] = frozenset({"h100"})

_RATE_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
                  "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_RATE_UNITS = {  # case matters only for b (bits) vs B (bytes) before "/s"
    **{f"{p}b/s": v / 8 for p, v in _RATE_PREFIXES.items()},
    **{f"{p}B/s": v for p, v in _RATE_PREFIXES.items()},
    **{f"{p}bps": v / 8 for p, v in _RATE_PREFIXES.items()},
}
# Sub-second units as divisors, so that "5us" reads as exactly 5e-6 (5 / 1e6, not 5 * 1e-6).
_TIME_UNITS = {"s": 1.0, "ms": -1e3, "us": -1e6, "µs": -1e6, "ns": -1e9}
_QUANTITY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ/]+)\s*$")


# ---------------------------------------------------------------------------------------------
def parse_bandwidth(value: Any, where: str, *, bare_unit: float = 1.0) -> float:
    """Reads a bandwidth as bytes/s.

    Args:
      value: a number (multiplied by ``bare_unit``) or a string such as "100Gbps", "300 GB/s".
      where: the field's name, for error messages.
      bare_unit: bytes/s per unit of a bare number (1.0: bytes/s; 1e9 / 8: Gbps).

    Returns:
      The bandwidth in bytes/s (> 0).

    Raises:
      ValueError: naming ``where`` when the value is not a positive bandwidth.
    """
    out = _parse_quantity(value, where, _RATE_UNITS, bare_unit, "a bandwidth such as 100Gbps or 3e11 (bytes/s)")
    if not out > 0:
        raise ValueError(f"{where}: expected a positive bandwidth, got {value!r}")
    return out


def parse_latency(value: Any, where: str) -> float:
    """Reads a latency as seconds from a number (seconds) or a string such as "5us".

    Raises:
      ValueError: naming ``where`` when the value is not a non-negative duration.
    """
    out = _parse_quantity(value, where, _TIME_UNITS, 1.0, "a latency such as 5us or 5e-6 (seconds)")
    if out < 0:
        raise ValueError(f"{where}: expected a non-negative latency, got {value!r}")
    return out


def _parse_quantity(value: Any, where: str, units: Mapping[str, float], bare: float, expected: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected {expected}, got {value!r}")
    if isinstance(value, (int, float)):
        out = float(value) * bare
    elif isinstance(value, str):
        m = _QUANTITY_RE.match(value)
        if m is None:
            try:
                out = float(value) * bare
            except ValueError:
                raise ValueError(f"{where}: expected {expected}, got {value!r}") from None
        else:
            unit = _normalise_unit(m.group(2))
            if unit not in units:
                raise ValueError(f"{where}: unknown unit {m.group(2)!r} in {value!r}; expected {expected}")
            scale = units[unit]
            out = float(m.group(1)) * scale if scale > 0 else float(m.group(1)) / -scale
    else:
        raise ValueError(f"{where}: expected {expected}, got {value!r}")
    if not math.isfinite(out):
        raise ValueError(f"{where}: expected a finite value, got {value!r}")
    return out


def _normalise_unit(unit: str) -> str:
    """Lower-cases a unit except the b/B that tells bits from bytes in "<prefix>b/s"."""
    if unit.endswith("/s") and len(unit) >= 3:
        return unit[:-3].lower() + unit[-3:]
    return unit.lower()


# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """One kind of link.

    Attributes:
      bandwidth: bytes/s in one direction (intra: per device; inter: per node).
      latency: seconds per message (the alpha of the alpha-beta model).
    """

    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth, (int, float)) and math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"LinkSpec.bandwidth: expected a positive number of bytes/s, got {self.bandwidth!r}")
        if not (isinstance(self.latency, (int, float)) and math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"LinkSpec.latency: expected a non-negative number of seconds, got {self.latency!r}")

    def to_dict(self) -> dict[str, float]:
        return {"bandwidth": float(self.bandwidth), "latency": float(self.latency)}


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous data-parallel cluster.

    Attributes:
      name: a short label, e.g. "dgx-a100-8".
      nodes: number of machines (>= 1).
      devices_per_node: accelerators per machine (>= 1).
      intra: the link between two devices of one node.
      inter: the link between nodes (for one node, conventionally equal to ``intra``).
      algorithm: the all-reduce algorithm, "ring", "tree" or "hierarchical".
      compute_speed: device speed relative to the profiled device (2.0: kernels take half the time).
      operand_latency: seconds each operand after the first adds to a variadic (tuple) all-reduce,
        the form XLA's combiner produces. 0 for the public shapes (not measured there); measured
        by ``disco calibrate`` (XLA:CPU runs a variadic all-reduce operand by operand: about
        0.2 ms per operand on 8 in-process devices, while one concatenated buffer of the same
        bytes costs no more than a single operand).
      overlap: whether a collective runs beside compute (its own stream, as on GPUs with NCCL).
        False for devices whose collectives are run by the same threads that compute (in-process
        virtual CPU devices: measured, one all-reduce per gradient is the slowest plan there), so
        the simulator puts collectives and kernels on one stream.
      description: free text (not compared).
      label: provenance, e.g. "public GPU cluster shape, not measured" (not compared).
      device: the device kind (``DEVICES``): "cpu" (default: XLA:CPU's fusion and the CPU cost
        model) or "h100" (XLA:GPU's priority fusion emulated, kernels priced for an H100).
    """

    name: str
    nodes: int
    devices_per_node: int
    intra: LinkSpec
    inter: LinkSpec
    algorithm: Algorithm = "ring"
    compute_speed: float = 1.0
    operand_latency: float = 0.0
    overlap: bool = True
    description: str = dataclasses.field(default="", compare=False)
    label: str = dataclasses.field(default="", compare=False)
    device: str = "cpu"

    def __post_init__(self) -> None:
        for field in ("nodes", "devices_per_node"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ClusterSpec.{field}: expected an integer >= 1, got {v!r}")
        for field in ("intra", "inter"):
            if not isinstance(getattr(self, field), LinkSpec):
                raise ValueError(f"ClusterSpec.{field}: expected a LinkSpec, got {getattr(self, field)!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"ClusterSpec.algorithm: expected one of {', '.join(ALGORITHMS)}, "
                             f"got {self.algorithm!r}")
        cs = self.compute_speed
        if isinstance(cs, bool) or not isinstance(cs, (int, float)) or not (math.isfinite(cs) and cs > 0):
            raise ValueError(f"ClusterSpec.compute_speed: expected a positive number, got {cs!r}")
        if not isinstance(self.overlap, bool):
            raise ValueError(f"ClusterSpec.overlap: expected true or false, got {self.overlap!r}")
        if self.device not in DEVICES:
            raise ValueError(f"ClusterSpec.device: expected one of {', '.join(DEVICES)}, got {self.device!r}")
        ol = self.operand_latency
        if isinstance(ol, bool) or not isinstance(ol, (int, float)) or not (math.isfinite(ol) and ol >= 0):
            raise ValueError(f"ClusterSpec.operand_latency: expected a non-negative number of seconds, got {ol!r}")

    @property
    def is_gpu(self) -> bool:
        """True when the device kind is a GPU (XLA:GPU's fusion, a GPU cost model)."""
        return self.device in GPU_DEVICES

    @property
    def num_devices(self) -> int:
        """Total devices, ``nodes * devices_per_node``."""
        return self.nodes * self.devices_per_node

    def replace(self, **kw: Any) -> ClusterSpec:
        return dataclasses.replace(self, **kw)

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "nodes": self.nodes, "devices_per_node": self.devices_per_node,
            "intra": self.intra.to_dict(), "inter": self.inter.to_dict(),
            "algorithm": self.algorithm, "compute_speed": float(self.compute_speed),
        }
        if self.operand_latency:
            out["operand_latency"] = float(self.operand_latency)
        if not self.overlap:
            out["overlap"] = False
        if self.device != "cpu":
            out["device"] = self.device
        if self.description:
            out["description"] = self.description
        if self.label:
            out["label"] = self.label
        return out

    def to_yaml(self) -> str:
        """The cluster in our YAML format (see the module docstring)."""
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = "cluster") -> ClusterSpec:
        """Reads our format from a parsed mapping.

        Raises:
          ValueError: naming the field that is missing, unknown or wrong.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping of cluster fields, got {type(data).__name__}")
        known = {"name", "nodes", "devices_per_node", "intra", "inter", "algorithm", "compute_speed",
                 "operand_latency", "overlap", "description", "label", "device"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown}; expected some of {sorted(known)}")
        for key in ("nodes", "devices_per_node", "intra"):
            if key not in data:
                raise ValueError(f"{where}: missing field {key!r}")
        nodes = _int_field(data["nodes"], f"{where}.nodes")
        dpn = _int_field(data["devices_per_node"], f"{where}.devices_per_node")
        intra = _link_field(data["intra"], f"{where}.intra")
        if "inter" in data:
            inter = _link_field(data["inter"], f"{where}.inter")
        elif nodes == 1:
            inter = intra
        else:
            raise ValueError(f"{where}: missing field 'inter' (needed when nodes > 1, got nodes={nodes})")
        algorithm = data.get("algorithm", "ring")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{where}.algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        speed = data.get("compute_speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise ValueError(f"{where}.compute_speed: expected a positive number, got {speed!r}")
        operand_latency = parse_latency(data.get("operand_latency", 0.0), f"{where}.operand_latency")
        overlap = data.get("overlap", True)
        if not isinstance(overlap, bool):
            raise ValueError(f"{where}.overlap: expected true or false, got {overlap!r}")
        for key in ("name", "description", "label"):
            if key in data and not isinstance(data[key], str):
                raise ValueError(f"{where}.{key}: expected a string, got {data[key]!r}")
        device = data.get("device", "cpu")
        if device not in DEVICES:
            raise ValueError(f"{where}.device: expected one of {', '.join(DEVICES)}, got {device!r}")
        return cls(name=data.get("name", f"{nodes}x{dpn}"), nodes=nodes, devices_per_node=dpn,
                   intra=intra, inter=inter, algorithm=algorithm, compute_speed=float(speed),
                   operand_latency=operand_latency, overlap=overlap, device=device,
                   description=data.get("description", ""), label=data.get("label", ""))

    @classmethod
    def from_yaml(cls, path_or_text: str | os.PathLike[str]) -> ClusterSpec:
        """Reads our YAML format from YAML text, or from a file given as an ``os.PathLike``.

        A ``str`` is always parsed as YAML text, never opened as a path, so text from
        a request can be passed here safely; use ``pathlib.Path`` (or
        :func:`load_cluster`) for files.

        Raises:
          ValueError: for YAML that does not parse or a field that is wrong.
        """
        if isinstance(path_or_text, str):
            text, where = path_or_text, "cluster"
        else:
            text, where = _read_text(path_or_text, "cluster")
        return cls.from_dict(_safe_load(text, where), where)


def _int_field(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: expected an integer >= 1, got {v!r}")
    return v


def _link_field(v: Any, where: str) -> LinkSpec:
    if not isinstance(v, Mapping) or set(v) != {"bandwidth", "latency"}:
        raise ValueError(f"{where}: expected a mapping with keys bandwidth and latency, got {v!r}")
    return LinkSpec(parse_bandwidth(v["bandwidth"], f"{where}.bandwidth"),
                    parse_latency(v["latency"], f"{where}.latency"))


def _read_text(path_or_text: str | os.PathLike[str], default_where: str) -> tuple[str, str]:
    if isinstance(path_or_text, os.PathLike):
        p = Path(path_or_text)
        return p.read_text(), p.name
    if isinstance(path_or_text, str):
        if "\n" not in path_or_text and len(path_or_text) < 4096:
            try:
                p = Path(path_or_text)
                if p.is_file():
                    return p.read_text(), p.name
            except OSError:
                pass
        return path_or_text, default_where
    raise ValueError(f"expected a path or YAML text, got {type(path_or_text).__name__}")


def _safe_load(text: str, where: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML: {e}") from None


# ---------------------------------------------------------------------------------------------
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
    text = p.read_text()
    data = _safe_load(text, p.name)
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
        raise ValueError(f"{where}: expected a mapping with 'links', got {entry!r}")
    links = entry.get("links", [])
    if links is None:
        links = []
    if not isinstance(links, list):
        raise ValueError(f"{where}.links: expected a list of links, got {links!r}")
    out = []
    for i, link in enumerate(links):
        lw = f"{where}.links[{i}]"
        if not isinstance(link, Mapping):
            raise ValueError(f"{lw}: expected a mapping with dest, rate and propagation_latency, got {link!r}")
        for key in ("dest", "rate", "propagation_latency"):
            if key not in link:
                raise ValueError(f"{lw}: missing field {key!r}")
        dest = link["dest"]
        if not isinstance(dest, str) or _DEST_RE.match(dest) is None:
            raise ValueError(f"{lw}.dest: expected a path like '/server/<host>/GPU/<i>/', got {dest!r}")
        out.append((dest, parse_bandwidth(link["rate"], f"{lw}.rate", bare_unit=1e9 / 8),
                    parse_latency(link["propagation_latency"], f"{lw}.propagation_latency")))
    return out


def _from_superscaler(data: Mapping[str, Any], fname: str, *, name: str | None,
                      algorithm: Algorithm) -> ClusterSpec:
    servers = data["Server"]
    if not isinstance(servers, Mapping) or not servers:
        raise ValueError(f"{fname}: Server: expected a mapping of host name -> devices, got {servers!r}")
    unknown = sorted(set(data) - {"Server", "Switch"})
    if unknown:
        raise ValueError(f"{fname}: unknown top-level keys {unknown}; expected Server and optionally Switch")
    counts: dict[str, int] = {}
    intra: list[tuple[float, float]] = []
    inter: list[tuple[float, float]] = []
    for host, devices in servers.items():
        hw = f"{fname}: Server.{host}"
        if not isinstance(devices, Mapping):
            raise ValueError(f"{hw}: expected a mapping of device kinds (GPU, CPU, NIC), got {devices!r}")
        gpus = devices.get("GPU")
        if not isinstance(gpus, Mapping) or not gpus:
            raise ValueError(f"{hw}.GPU: expected a mapping of GPU index -> links, got {gpus!r}")
        counts[str(host)] = len(gpus)
        for kind, entries in devices.items():
            if not isinstance(entries, Mapping):
                raise ValueError(f"{hw}.{kind}: expected a mapping of device index -> links, got {entries!r}")
            for idx, entry in entries.items():
                for dest, rate, lat in _read_links(entry or {}, f"{hw}.{kind}.{idx}"):
                    dest_host = _DEST_RE.match(dest).group(1)
                    if dest_host not in servers and dest_host not in {str(h) for h in servers}:
                        raise ValueError(f"{hw}.{kind}.{idx}: link dest {dest!r} names an unknown server "
                                         f"{dest_host!r}; servers: {sorted(map(str, servers))}")
                    if dest_host != str(host):
                        inter.append((rate, lat))
                    elif kind == "GPU" and "/GPU/" in dest:
                        intra.append((rate, lat))
    switches = data.get("Switch") or {}
    if not isinstance(switches, Mapping):
        raise ValueError(f"{fname}: Switch: expected a mapping of switch name -> links, got {switches!r}")
    for sw, entry in switches.items():
        for _, rate, lat in _read_links(entry or {}, f"{fname}: Switch.{sw}"):
            inter.append((rate, lat))
    if len(set(counts.values())) != 1:
        raise ValueError(f"{fname}: Server.*.GPU: every server must have the same number of GPUs, got {counts}")
    dpn = next(iter(counts.values()))
    nodes = len(counts)
    if dpn > 1 and not intra:
        raise ValueError(f"{fname}: Server.*.GPU.*.links: no link between two GPUs of one server; "
                         "expected GPU links with a dest on the same server")
    if nodes > 1 and not inter:
        raise ValueError(f"{fname}: no link between servers; expected a Switch entry or a link whose dest "
                         "is on another server")
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
        raise ValueError(f"{fname}: nodes: expected a non-empty list of nodes, got {nodes!r}")
    counts: list[int] = []
    bws: list[float] = []
    chiefs = 0
    for i, nd in enumerate(nodes):
        nw = f"{fname}: nodes[{i}]"
        if not isinstance(nd, Mapping):
            raise ValueError(f"{nw}: expected a mapping with address and gpus, got {nd!r}")
        if "address" not in nd:
            raise ValueError(f"{nw}: missing field 'address'")
        gpus = nd.get("gpus")
        if (not isinstance(gpus, list) or not gpus
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
                or len(set(gpus)) != len(gpus)):
            raise ValueError(f"{nw}.gpus: expected a list of GPU indices, got {gpus!r}")
        counts.append(len(gpus))
        if nd.get("chief", False) is True:
            chiefs += 1
        elif "chief" in nd and not isinstance(nd["chief"], bool):
            raise ValueError(f"{nw}.chief: expected true or false, got {nd['chief']!r}")
        if "network_bandwidth" in nd:
            bws.append(parse_bandwidth(nd["network_bandwidth"], f"{nw}.network_bandwidth", bare_unit=1e9 / 8))
    if chiefs > 1:
        raise ValueError(f"{fname}: nodes: expected at most one node with chief: true, got {chiefs}")
    if len(set(counts)) != 1:
        raise ValueError(f"{fname}: nodes[*].gpus: every node must have the same number of GPUs, got {counts}")
    n, dpn = len(nodes), counts[0]
    if intra is None:
        raise ValueError(f"{fname}: the format does not describe links inside a node; "
                         "pass intra=LinkSpec(bandwidth, latency)")
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


# ---------------------------------------------------------------------------------------------
PUBLIC_LABEL = "public GPU cluster shape, not measured"
LOCAL_LABEL = "this machine's virtual CPU devices; placeholder link costs until `disco calibrate`"
PRESETS: tuple[str, ...] = ("local", "dgx-a100-8", "2x8-100gbe", "16x8-ib", "h100-1", "h100-sxm-8", "h100-2x8-ib")

# 8x H100 SXM on NVLink 4 / NVSwitch: NCCL's all-reduce reaches a peak bus bandwidth of about
# 480 GB/s on 8 GPUs (NVLink SHARP, large messages; about 370 GB/s with NCCL_ALGO=RING), as
# NCCL's maintainer states in https://github.com/NVIDIA/nccl-tests/issues/212 (2024-05-06);
# the 8x H200 (same NVLink 4) output in https://github.com/NVIDIA/nccl-tests/issues/272 peaks
# at 475 GB/s. With the ring formula (``2 (p-1)/p n / bandwidth``) a link bandwidth equal to
# the bus bandwidth reproduces that time. The 1 us per step latency is our estimate, not from
# those sources (14 us for a small all-reduce on 8 GPUs).
H100_NVLINK_BUSBW = 480e9
H100_NVLINK_LATENCY = 1e-6
# 400 Gb/s InfiniBand (NDR, one ConnectX-7 per GPU, as in DGX H100): 8 x 400 Gb/s per node.
H100_IB_PER_GPU = 400e9 / 8
H100_IB_LATENCY = 5e-6

# Placeholders for XLA:CPU's in-process collectives (shared memory plus a rendezvous):
# a few GB/s and tens of microseconds. `disco calibrate` replaces them with measurements.
LOCAL_BANDWIDTH = 5e9
LOCAL_LATENCY = 20e-6
LOCAL_DEVICES = 8
_CALIBRATION_KEYS = frozenset({"bandwidth", "latency", "compute_speed", "operand_latency"})


def preset(name: str, devices: int | None = None, calibration: Mapping[str, float] | None = None) -> ClusterSpec:
    """A named cluster.

    Presets:
      local: this machine's ``devices`` virtual CPU devices (default 8, as the tests'
        ``--xla_force_host_platform_device_count=8``), one node; link costs are
        placeholders (5 GB/s, 20 us) unless ``calibration`` gives measured
        ``bandwidth`` (bytes/s), ``latency`` (s) and/or ``compute_speed``.
      dgx-a100-8: 1 node x 8 GPUs, NVLink 300 GB/s per direction, 5 us; ring.
      2x8-100gbe: 2 nodes x 8 GPUs, NVLink inside, 100 Gb/s Ethernet between (15 us); hierarchical.
      16x8-ib: 16 nodes x 8 GPUs, NVLink inside, 8 x 200 Gb/s InfiniBand per node (200 GB/s, 5 us);
        hierarchical.
      h100-1: one NVIDIA H100 (device "h100"): no collectives, kernels priced for the H100.
      h100-sxm-8: 8 H100 SXM on NVLink/NVSwitch (device "h100"): 480 GB/s NCCL all-reduce bus
        bandwidth (``H100_NVLINK_BUSBW``, published figure, see its comment), 1 us; ring.
      h100-2x8-ib: 2 nodes x 8 H100 SXM (device "h100"), NVLink inside, 400 Gb/s InfiniBand per
        GPU (8 x 400 Gb/s = 400 GB/s per node, 5 us); hierarchical.
    The GPU presets are public cluster shapes, not measurements. The first four keep the CPU
    device kind (kernels priced by the CPU model), as before device kinds existed.

    Args:
      name: one of ``PRESETS``.
      devices: for "local", the number of devices; for the others, if given, must equal
        the preset's device count.
      calibration: for "local" only, measured values overriding the placeholders.

    Returns:
      The ClusterSpec.

    Raises:
      ValueError: for an unknown preset (listing the presets) or arguments it does not take.
    """
    nvlink = LinkSpec(300e9, 5e-6)
    if name == "local":
        n = LOCAL_DEVICES if devices is None else devices
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"preset 'local': devices: expected an integer >= 1, got {devices!r}")
        cal = dict(calibration or {})
        unknown = sorted(set(cal) - _CALIBRATION_KEYS)
        if unknown:
            raise ValueError(f"preset 'local': calibration: unknown keys {unknown}; "
                             f"expected some of {sorted(_CALIBRATION_KEYS)}")
        link = LinkSpec(float(cal.get("bandwidth", LOCAL_BANDWIDTH)), float(cal.get("latency", LOCAL_LATENCY)))
        measured = bool(cal)
        return ClusterSpec(name="local", nodes=1, devices_per_node=n, intra=link, inter=link,
                           algorithm="ring", compute_speed=float(cal.get("compute_speed", 1.0)),
                           operand_latency=float(cal.get("operand_latency", 0.0)),
                           overlap=False,  # the device threads that compute also reduce
                           description=f"{n} virtual CPU devices of this machine",
                           label="calibrated on this machine" if measured else LOCAL_LABEL)
    if calibration is not None:
        raise ValueError(f"preset {name!r}: calibration applies only to 'local', got {dict(calibration)}")
    if name == "dgx-a100-8":
        spec = ClusterSpec(name=name, nodes=1, devices_per_node=8, intra=nvlink, inter=nvlink,
                           algorithm="ring", description="one DGX A100: 8 GPUs on NVLink/NVSwitch",
                           label=PUBLIC_LABEL)
    elif name == "2x8-100gbe":
        spec = ClusterSpec(name=name, nodes=2, devices_per_node=8, intra=nvlink,
                           inter=LinkSpec(100e9 / 8, 15e-6), algorithm="hierarchical",
                           description="2 nodes x 8 GPUs, NVLink inside, 100 Gb/s Ethernet between",
                           label=PUBLIC_LABEL)
    elif name == "16x8-ib":
        spec = ClusterSpec(name=name, nodes=16, devices_per_node=8, intra=nvlink,
                           inter=LinkSpec(8 * 200e9 / 8, 5e-6), algorithm="hierarchical",
                           description="16 nodes x 8 GPUs, NVLink inside, 8x200 Gb/s HDR InfiniBand per node",
                           label=PUBLIC_LABEL)
    elif name in ("h100-1", "h100-sxm-8", "h100-2x8-ib"):
        spec = _h100_preset(name)
    else:
        raise ValueError(f"unknown cluster preset {name!r}; expected one of {', '.join(PRESETS)}")
    if devices is not None and devices != spec.num_devices:
        raise ValueError(f"preset {name!r} has {spec.num_devices} devices, got devices={devices!r}")
    return spec


def resolve(value: str | None, devices: int | None = None) -> ClusterSpec:
    """The cluster a ``--cluster`` argument names: a cluster file when the path exists (read
    by :func:`load_cluster`), else a preset; ``None`` is ``local``. ``devices`` is passed to
    ``local`` only (the other presets fix their own device count).

    Raises:
      ValueError: when ``value`` is neither an existing file nor a preset (listing the presets).
    """
    if value is None:
        return preset("local", devices=devices)
    if os.path.exists(value):
        return load_cluster(value)
    if value in PRESETS:
        return preset(value, devices=devices if value == "local" else None)
    raise ValueError(f"--cluster {value!r} is neither a file nor a preset; expected a path or one of: "
                     f"{', '.join(PRESETS)}")


def _h100_preset(name: str) -> ClusterSpec:
    nvlink = LinkSpec(H100_NVLINK_BUSBW, H100_NVLINK_LATENCY)
    if name == "h100-1":
        return ClusterSpec(name=name, nodes=1, devices_per_node=1, intra=nvlink, inter=nvlink,
                           algorithm="ring", device="h100", description="one NVIDIA H100 80GB HBM3",
                           label=PUBLIC_LABEL)
    if name == "h100-sxm-8":
        return ClusterSpec(name=name, nodes=1, devices_per_node=8, intra=nvlink, inter=nvlink,
                           algorithm="ring", device="h100",
                           description="8x H100 SXM on NVLink 4 / NVSwitch (480 GB/s NCCL all-reduce busbw)",
                           label=PUBLIC_LABEL)
    return ClusterSpec(name=name, nodes=2, devices_per_node=8, intra=nvlink,
                       inter=LinkSpec(8 * H100_IB_PER_GPU, H100_IB_LATENCY), algorithm="hierarchical",
                       device="h100",
                       description="2 nodes x 8 H100 SXM, NVLink inside, 400 Gb/s InfiniBand per GPU",
                       label=PUBLIC_LABEL)

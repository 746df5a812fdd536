"""The cluster data model: :class:`ClusterSpec`, :class:`LinkSpec`, and our YAML format.

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
    rs_ag_scale: 1.0                            # optional: an rs_ag bucket's time over what the links price
    overlap: true                               # optional: collectives beside compute (false: one stream)
    device: cpu                                 # optional: the device kind that prices kernels (cpu | h100)
    device_memory: 80GiB                        # optional: one device's memory (default: unknown)
    description: ...                            # optional free text
    label: public GPU cluster shape, not measured  # optional

Bandwidths are numbers in bytes/s or strings with a unit (``B/s``, ``KB/s``,
``MB/s``, ``GB/s``, ``GiB/s``, ``bps``, ``Kbps``, ``Mbps``, ``Gbps``, ``Tbps``;
``Gb/s`` is ``Gbps``, bits; ``GBps`` is ``GB/s``, bytes: only the case of that b/B
matters). Latencies are numbers in seconds or strings with a unit (``s``, ``ms``,
``us`` or ``µs``, ``ns``). Memory is a number of bytes or a string with a unit (``B``, ``KB``,
``MB``, ``GB``, ``TB``, ``KiB``, ``MiB``, ``GiB``, ``TiB``; any case, always bytes). ``to_yaml`` writes plain numbers. A spec holds at least 1 byte/s
per link, at most an hour of latency, a ``compute_speed`` of at least 1e-6 and at most 2**31
devices (``MIN_BANDWIDTH``, ``MAX_LATENCY``, ``MIN_COMPUTE_SPEED``, ``MAX_DEVICES``).

Files of other systems are read by :mod:`disco.sim.cluster_files`; the named clusters
are in :mod:`disco.sim.cluster_presets`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import reprlib
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


def backend_of(device: str) -> str:
    """The compiler a device kind's modules come from: "gpu" for a GPU kind (XLA:GPU), else "cpu"."""
    return "gpu" if device in GPU_DEVICES else "cpu"
# What a spec may hold, wide enough for any real cluster and narrow enough that the simulator's
# times stay finite (a bandwidth of 1e-320 B/s made every collective infinite and the scheduler
# fail; 10**400 devices overflowed a float). The service's limits (service/limits.py) are narrower.
MIN_BANDWIDTH = 1.0  # bytes/s of a link
MAX_LATENCY = 3600.0  # seconds per message of a link, and operand_latency
MIN_COMPUTE_SPEED = 1e-6  # relative to the profiled device
MAX_RS_AG_SCALE = 1000.0  # a reduce-scatter plus all-gather over what the links price for them
MAX_DEVICES = 2**31  # nodes * devices_per_node
# Bytes of a cluster file: a SuperScaler-style file of a thousand servers is a few MB; more is the
# wrong file (a checkpoint, /dev/zero, a JSON data set: JSON is YAML, which PyYAML reads at about 150 kB/s).
MAX_FILE_BYTES = 16 * 2**20

_RATE_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
                  "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_RATE_UNITS = {  # case matters only for b (bits) vs B (bytes) before "/s" or "ps"
    **{f"{p}b/s": v / 8 for p, v in _RATE_PREFIXES.items()},
    **{f"{p}B/s": v for p, v in _RATE_PREFIXES.items()},
    **{f"{p}bps": v / 8 for p, v in _RATE_PREFIXES.items()},
    **{f"{p}Bps": v for p, v in _RATE_PREFIXES.items()},
}
# Sub-second units as divisors, so that "5us" reads as exactly 5e-6 (5 / 1e6, not 5 * 1e-6).
# Both micro signs: U+00B5 (MICRO SIGN) and U+03BC (GREEK SMALL LETTER MU), which keyboards also type.
_SIZE_UNITS = {f"{p}b": v for p, v in _RATE_PREFIXES.items()}  # lower-cased: "GB", "gb", "GiB" are bytes
_TIME_UNITS = {"s": 1.0, "ms": -1e3, "us": -1e6, "\u00b5s": -1e6, "\u03bcs": -1e6, "ns": -1e9}
# The number "5", "5.5" or ".5" spelled so that one reading fits a string ("[0-9]*\.?[0-9]+" let the
# regex try every split of a run of digits: 60,000 digits and a "!" took minutes).
_QUANTITY_RE = re.compile(r"^\s*((?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z\u00b5\u03bc/]+)\s*$")


_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
(_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxset, _SHOWN.maxstring, _SHOWN.maxlong,
 _SHOWN.maxother) = (3, 6, 6, 6, 6, 60, 40, 60)


def shown(value: Any) -> str:
    """``repr(value)`` cut short (at most a few dozen characters and levels) for an error message:
    a value read from a file may be megabytes long, or expand to gigabytes through YAML aliases."""
    out = _SHOWN.repr(value)
    return out if len(out) <= 120 else out[:117] + "..."


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
        raise ValueError(f"{where}: expected a positive bandwidth, got {shown(value)}")
    if out < MIN_BANDWIDTH:
        raise ValueError(f"{where}: expected a bandwidth of at least {MIN_BANDWIDTH:g} byte/s, got {shown(value)}")
    return out


def parse_latency(value: Any, where: str) -> float:
    """Reads a latency as seconds from a number (seconds) or a string such as "5us".

    Raises:
      ValueError: naming ``where`` when the value is not a non-negative duration.
    """
    out = _parse_quantity(value, where, _TIME_UNITS, 1.0, "a latency such as 5us or 5e-6 (seconds)")
    if out < 0:
        raise ValueError(f"{where}: expected a non-negative latency, got {shown(value)}")
    if out > MAX_LATENCY:
        raise ValueError(f"{where}: expected a latency of at most {MAX_LATENCY:g} s, got {shown(value)}")
    return out


def parse_bytes(value: Any, where: str) -> int:
    """Reads a size in bytes from a number (bytes) or a string such as "2GB", "80GiB", "512 MiB".

    Raises:
      ValueError: naming ``where`` when the value is not a positive size of at least one byte.
    """
    out = _parse_quantity(value, where, _SIZE_UNITS, 1.0, "a size such as 2GB, 80GiB or 2e9 (bytes)")
    if not out >= 1:
        raise ValueError(f"{where}: expected a size of at least 1 byte, got {shown(value)}")
    return int(out)


def _parse_quantity(value: Any, where: str, units: Mapping[str, float], bare: float, expected: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected {expected}, got {shown(value)}")
    if isinstance(value, (int, float)):
        out = _as_float(value) * bare
    elif isinstance(value, str):
        m = _QUANTITY_RE.match(value)
        if m is None:
            try:
                out = float(value) * bare
            except ValueError:
                raise ValueError(f"{where}: expected {expected}, got {shown(value)}") from None
        else:
            unit = _normalise_unit(m.group(2))
            if unit not in units:
                raise ValueError(f"{where}: unknown unit {shown(m.group(2))} in {shown(value)}; expected {expected}")
            scale = units[unit]
            out = float(m.group(1)) * scale if scale > 0 else float(m.group(1)) / -scale
    else:
        raise ValueError(f"{where}: expected {expected}, got {shown(value)}")
    if not math.isfinite(out):
        raise ValueError(f"{where}: expected a finite value, got {shown(value)}")
    return out


def _as_float(value: int | float) -> float:
    """``float(value)``, or inf for an integer too large for a float (``float(10**400)`` raises
    OverflowError), so that the callers' finiteness checks refuse it with a message."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _normalise_unit(unit: str) -> str:
    """Lower-cases a unit except the b/B that tells bits from bytes in "<prefix>b/s" and
    "<prefix>bps" ("GBps" is gigabytes per second, "Gbps" gigabits)."""
    if unit[-2:].lower() in ("/s", "ps") and len(unit) >= 3 and unit[-3] in "bB":
        return unit[:-3].lower() + unit[-3] + unit[-2:].lower()
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
        bw, lat = self.bandwidth, self.latency
        if not (isinstance(bw, (int, float)) and math.isfinite(_as_float(bw)) and bw > 0):
            raise ValueError(f"LinkSpec.bandwidth: expected a positive number of bytes/s, got {shown(bw)}")
        if bw < MIN_BANDWIDTH:
            raise ValueError(f"LinkSpec.bandwidth: expected at least {MIN_BANDWIDTH:g} byte/s, got {shown(bw)}")
        if not (isinstance(lat, (int, float)) and math.isfinite(_as_float(lat)) and lat >= 0):
            raise ValueError(f"LinkSpec.latency: expected a non-negative number of seconds, got {shown(lat)}")
        if lat > MAX_LATENCY:
            raise ValueError(f"LinkSpec.latency: expected at most {MAX_LATENCY:g} s, got {shown(lat)}")

    def to_dict(self) -> dict[str, float]:
        return {"bandwidth": float(self.bandwidth), "latency": float(self.latency)}


def check_rs_ag_scale(value: Any, where: str) -> float:
    """``value`` as an ``rs_ag_scale``: a finite number in (0, ``MAX_RS_AG_SCALE``].

    Raises:
      ValueError: naming ``where``, what was given and what was expected.
    """
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (math.isfinite(_as_float(value)) and 0 < value <= MAX_RS_AG_SCALE)):
        raise ValueError(f"{where}: expected a number > 0 and at most {MAX_RS_AG_SCALE:g} (a reduce-scatter plus "
                         f"all-gather over what the links price for them), got {shown(value)}")
    return float(value)


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
        by ``disco calibrate`` (XLA:CPU runs a variadic all-reduce operand by operand, while one
        concatenated buffer of the same bytes costs about one operand; docs/archive/lab-notebook.md, "Calibration: all-reduce
        alpha/beta of this machine").
      rs_ag_scale: an ``rs_ag`` bucket's time (a reduce-scatter and an all-gather of its buffer)
        over what the links price for the pair (on a ring, what they price for one all-reduce of
        the buffer). 1.0 for the public shapes (not measured there); measured by ``disco calibrate``
        as the pair's time over one all-reduce's, side by side (1.13x over 8 in-process CPU devices
        at 4 MiB; docs/archive/lab-notebook.md, "The measurements against themselves"). It scales
        the fast tier's ``rs_ag`` buckets; the compiled tier prices each collective of a compiled
        module by its kind, unscaled.
      overlap: whether a collective runs beside compute (its own stream, as on GPUs with NCCL).
        False for devices whose collectives are run by the same threads that compute (in-process
        virtual CPU devices: measured, one all-reduce per gradient is the slowest plan there), so
        the simulator puts collectives and kernels on one stream.
      description: free text (not compared).
      label: provenance, e.g. "public GPU cluster shape, not measured" (not compared).
      device: the device kind (``DEVICES``): "cpu" (default: XLA:CPU's fusion and the CPU cost
        model) or "h100" (XLA:GPU's priority fusion emulated, kernels priced for an H100).
      device_memory_bytes: one device's memory in bytes, or None (unknown: the CPU's virtual
        devices share the host's). ``optimize`` never chooses a plan whose compiled step's peak
        device memory is above it (nor above its ``memory_limit``).
    """

    name: str
    nodes: int
    devices_per_node: int
    intra: LinkSpec
    inter: LinkSpec
    algorithm: Algorithm = "ring"
    compute_speed: float = 1.0
    operand_latency: float = 0.0
    rs_ag_scale: float = 1.0
    overlap: bool = True
    description: str = dataclasses.field(default="", compare=False)
    label: str = dataclasses.field(default="", compare=False)
    device: str = "cpu"
    device_memory_bytes: int | None = None

    def __repr__(self) -> str:
        """One line: name, shape, links and what differs from the defaults (not the description)."""
        def link(spec: LinkSpec) -> str:
            return f"{spec.bandwidth / 1e9:.4g} GB/s {spec.latency * 1e6:.4g} us"

        extra = [f"{f}={getattr(self, f)!r}" for f, default in
                 (("algorithm", "ring"), ("compute_speed", 1.0), ("operand_latency", 0.0), ("rs_ag_scale", 1.0),
                  ("overlap", True))
                 if getattr(self, f) != default]
        links = f"link {link(self.intra)}" + ("" if self.inter == self.intra else f", inter {link(self.inter)}")
        return (f"ClusterSpec({self.name[:40]!r}, {self.nodes} x {self.devices_per_node} {self.device}, {links}"
                f"{''.join(', ' + e for e in extra)})")

    def __post_init__(self) -> None:
        for field in ("nodes", "devices_per_node"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ClusterSpec.{field}: expected an integer >= 1, got {shown(v)}")
        if self.nodes * self.devices_per_node > MAX_DEVICES:
            raise ValueError(f"ClusterSpec: expected at most {MAX_DEVICES:,d} devices, got nodes x devices_per_node "
                             f"= {shown(self.nodes)} x {shown(self.devices_per_node)}")
        for field in ("intra", "inter"):
            if not isinstance(getattr(self, field), LinkSpec):
                raise ValueError(f"ClusterSpec.{field}: expected a LinkSpec, got {shown(getattr(self, field))}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"ClusterSpec.algorithm: expected one of {', '.join(ALGORITHMS)}, "
                             f"got {shown(self.algorithm)}")
        cs = self.compute_speed
        if isinstance(cs, bool) or not isinstance(cs, (int, float)) or not (math.isfinite(_as_float(cs)) and cs > 0):
            raise ValueError(f"ClusterSpec.compute_speed: expected a positive number, got {shown(cs)}")
        if cs < MIN_COMPUTE_SPEED:
            raise ValueError(f"ClusterSpec.compute_speed: expected at least {MIN_COMPUTE_SPEED:g}, got {shown(cs)}")
        if not isinstance(self.overlap, bool):
            raise ValueError(f"ClusterSpec.overlap: expected true or false, got {shown(self.overlap)}")
        if self.device not in DEVICES:
            raise ValueError(f"ClusterSpec.device: expected one of {', '.join(DEVICES)}, got {shown(self.device)}")
        ol = self.operand_latency
        if isinstance(ol, bool) or not isinstance(ol, (int, float)) or not (math.isfinite(_as_float(ol)) and ol >= 0):
            raise ValueError(f"ClusterSpec.operand_latency: expected a non-negative number of seconds, got {shown(ol)}")
        if ol > MAX_LATENCY:
            raise ValueError(f"ClusterSpec.operand_latency: expected at most {MAX_LATENCY:g} s, got {shown(ol)}")
        check_rs_ag_scale(self.rs_ag_scale, "ClusterSpec.rs_ag_scale")
        mem = self.device_memory_bytes
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int) or mem < 1):
            raise ValueError(f"ClusterSpec.device_memory_bytes: expected an integer >= 1 (bytes) or None, "
                             f"got {shown(mem)}")

    @property
    def is_gpu(self) -> bool:
        """True when the device kind is a GPU (XLA:GPU's fusion, a GPU cost model)."""
        return backend_of(self.device) == "gpu"

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
        if self.rs_ag_scale != 1.0:
            out["rs_ag_scale"] = float(self.rs_ag_scale)
        if not self.overlap:
            out["overlap"] = False
        if self.device != "cpu":
            out["device"] = self.device
        if self.device_memory_bytes is not None:
            out["device_memory"] = int(self.device_memory_bytes)
        if self.description:
            out["description"] = self.description
        if self.label:
            out["label"] = self.label
        return out

    def to_yaml(self) -> str:
        """The cluster in our YAML format (see the module docstring)."""
        import yaml

        return yaml.dump(self.to_dict(), Dumper=_yaml_classes()[1], sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = "cluster") -> ClusterSpec:
        """Reads our format from a parsed mapping.

        Raises:
          ValueError: naming the field that is missing, unknown or wrong.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping of cluster fields, got {type(data).__name__}")
        known = {"name", "nodes", "devices_per_node", "intra", "inter", "algorithm", "compute_speed",
                 "operand_latency", "rs_ag_scale", "overlap", "description", "label", "device", "device_memory"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown fields {shown(unknown)}; expected some of {sorted(known)}")
        for key in ("nodes", "devices_per_node", "intra"):
            if key not in data:
                raise ValueError(f"{where}: missing field {shown(key)}")
        nodes = _int_field(data["nodes"], f"{where}.nodes")
        dpn = _int_field(data["devices_per_node"], f"{where}.devices_per_node")
        if nodes * dpn > MAX_DEVICES:
            raise ValueError(f"{where}: expected at most {MAX_DEVICES:,d} devices, got nodes x devices_per_node = "
                             f"{shown(nodes)} x {shown(dpn)}")
        intra = _link_field(data["intra"], f"{where}.intra")
        if "inter" in data:
            inter = _link_field(data["inter"], f"{where}.inter")
        elif nodes == 1:
            inter = intra
        else:
            raise ValueError(f"{where}: missing field 'inter' (needed when nodes > 1, got nodes={shown(nodes)})")
        algorithm = data.get("algorithm", "ring")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{where}.algorithm: expected one of {', '.join(ALGORITHMS)}, got {shown(algorithm)}")
        speed = data.get("compute_speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise ValueError(f"{where}.compute_speed: expected a positive number, got {shown(speed)}")
        if not MIN_COMPUTE_SPEED <= _as_float(speed) < math.inf:
            raise ValueError(f"{where}.compute_speed: expected a finite number >= {MIN_COMPUTE_SPEED:g}, "
                             f"got {shown(speed)}")
        operand_latency = parse_latency(data.get("operand_latency", 0.0), f"{where}.operand_latency")
        rs_ag_scale = check_rs_ag_scale(data.get("rs_ag_scale", 1.0), f"{where}.rs_ag_scale")
        overlap = data.get("overlap", True)
        if not isinstance(overlap, bool):
            raise ValueError(f"{where}.overlap: expected true or false, got {shown(overlap)}")
        for key in ("name", "description", "label"):
            if key in data and not isinstance(data[key], str):
                raise ValueError(f"{where}.{key}: expected a string, got {shown(data[key])}")
        device = data.get("device", "cpu")
        if device not in DEVICES:
            raise ValueError(f"{where}.device: expected one of {', '.join(DEVICES)}, got {shown(device)}")
        memory = data.get("device_memory")
        memory = None if memory is None else parse_bytes(memory, f"{where}.device_memory")
        return cls(name=data.get("name", f"{nodes}x{dpn}"), nodes=nodes, devices_per_node=dpn,
                   intra=intra, inter=inter, algorithm=algorithm, compute_speed=float(speed),
                   operand_latency=operand_latency, rs_ag_scale=rs_ag_scale, overlap=overlap, device=device,
                   description=data.get("description", ""), label=data.get("label", ""),
                   device_memory_bytes=memory)

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
        return cls.from_dict(parse_yaml(text, where), where)


def require_cluster(value: Any, where: str = "cluster", *, or_none: bool = False) -> ClusterSpec | None:
    """``value`` when it is a :class:`ClusterSpec` (or None, where ``or_none``); the one check the
    entry points that take a cluster make.

    Raises:
      TypeError: naming ``where``, what was given and how to make a cluster.
    """
    if isinstance(value, ClusterSpec) or (or_none and value is None):
        return value
    raise TypeError(f"{where}: expected a ClusterSpec{' or None' if or_none else ''}, got {type(value).__name__} "
                    f"{value!r:.60} (disco.sim.cluster.preset(name) or load_cluster(path) makes one)")


def _int_field(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: expected an integer >= 1, got {shown(v)}")
    return v


def _link_field(v: Any, where: str) -> LinkSpec:
    if not isinstance(v, Mapping) or set(v) != {"bandwidth", "latency"}:
        raise ValueError(f"{where}: expected a mapping with keys bandwidth and latency, got {shown(v)}")
    return LinkSpec(parse_bandwidth(v["bandwidth"], f"{where}.bandwidth"),
                    parse_latency(v["latency"], f"{where}.latency"))


def read_cluster_file(p: Path) -> str:
    """The UTF-8 text of a cluster file (newlines as ``Path.read_text`` gives them); ValueError naming
    it when it is not a readable text file of at most ``MAX_FILE_BYTES``."""
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:  # a directory, a file without read permission, ...
        raise ValueError(f"cluster file {str(p)!r}: {e.strerror}; expected a readable cluster YAML file") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{p.name}: more than {MAX_FILE_BYTES:,d} bytes; expected a cluster YAML file "
                         "(a few kB)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p.name}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                         f"expected cluster YAML") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as read_text


def _read_text(path_or_text: str | os.PathLike[str], default_where: str) -> tuple[str, str]:
    if isinstance(path_or_text, os.PathLike):
        p = Path(path_or_text)
        return read_cluster_file(p), p.name
    if isinstance(path_or_text, str):
        if "\n" not in path_or_text and len(path_or_text) < 4096:
            try:
                p = Path(path_or_text)
                if p.is_file():
                    return read_cluster_file(p), p.name
            except OSError:
                pass
        return path_or_text, default_where
    raise ValueError(f"expected a path or YAML text, got {type(path_or_text).__name__}")


def parse_yaml(text: str, where: str) -> Any:
    """Parses YAML text; ValueError naming ``where`` when it does not parse.

    Stricter than ``yaml.safe_load`` in one way and closer to JSON in another: a key given
    twice in one mapping is an error (PyYAML keeps the last one silently, so a second ``inter:``
    would overrule the first unseen), and ``5e-1`` is a number as in JSON and YAML 1.2 (PyYAML
    follows YAML 1.1, where a float needs a dot, and reads it as the string "5e-1").
    """
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_classes()[0])  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{where}: not valid YAML (JSON is YAML too){at}: {problem}") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise ValueError(f"{where}: a value that cannot be read ({e}); expected a cluster file") from None
    except RecursionError:  # "[[[[...]]]]" thousands deep: no cluster file nests like that
        raise ValueError(f"{where}: YAML nested too deeply to read; expected a cluster file "
                         "(mappings and lists a few levels deep)") from None


# JSON's and YAML 1.2's floats without a dot ("1e3", "5e-1"), which YAML 1.1 reads as strings.
_EXPONENT_FLOAT = r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"


@functools.cache
def _yaml_classes() -> tuple[Any, Any]:
    """(loader, dumper) of cluster files: ``yaml.SafeLoader`` refusing duplicate keys and reading
    ``_EXPONENT_FLOAT`` as floats, and ``yaml.SafeDumper`` that quotes strings of that form, so
    that what ``to_yaml`` writes reads back the same. Built on first use (yaml is imported lazily)."""
    import yaml

    class ClusterLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" may be overruled
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        duplicate = key in seen
                        seen.add(key)
                    except TypeError:  # unhashable: SafeConstructor names it
                        continue
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"found duplicate key {shown(key)}", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    class ClusterDumper(yaml.SafeDumper):
        pass

    for cls, base in ((ClusterLoader, yaml.SafeLoader), (ClusterDumper, yaml.SafeDumper)):
        # A copy of every list, so that adding a resolver leaves yaml's own classes alone.
        cls.yaml_implicit_resolvers = {ch: list(rs) for ch, rs in base.yaml_implicit_resolvers.items()}
        cls.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_EXPONENT_FLOAT), list("-+0123456789."))
    return ClusterLoader, ClusterDumper

"""XLA:GPU's autotuning results as data: read a results file, and key it for a deviceless target.

XLA:GPU picks a kernel for every GEMM (a Triton tiling, or a cuBLAS call) and convolution by
timing candidates on the device. A device compile can write those choices
(``--xla_gpu_dump_autotune_results_to=FILE.textproto``) and a compile can read them back
(``xla_gpu_load_autotune_results_from``); a deviceless compile, which has no device to time on,
otherwise takes the first candidate that compiles. This module is the one reader of such files:

* the format is XLA's ``AutotuneResults`` textproto (``autotune_results.proto``, version 3)::

      version: 3
      results {
        device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s, L2 cache: 50 MB, DNN version: 9.8.0"
        hlo: "{\\n  tmp_0 = f32[8,64,128]{2,1,0} parameter(0)\\n ...}"
        result { triton { block_m: 64 ... } }      # or gemm { algorithm: ... } (cuBLAS), algorithm { ... } (cuDNN),
                                                   # other { name: "BLOCK_LEVEL_EMITTER" config { [type...] { ... } } }
      }

  Each entry is keyed by ``device`` (the device's description) and ``hlo`` (the canonical text of
  the instruction's fused computation, as XLA prints it for the autotuner). Only the text form is
  read (the binary form needs XLA's proto classes, which jaxlib does not ship).
* the device key of a deviceless compile is not the device's: XLA (jax 0.11.2 and 0.12.0.1) builds it from
  the target config but with ``DNN version: 0.0.0`` (measured: the compile logs its cache misses
  with ``TF_CPP_VMODULE=autotuner_cache=2``), so results written on a real H100 (its cuDNN version in
  the key) never match. :func:`for_target` rewrites every entry's ``device`` to the deviceless
  target's key (:func:`target_device_key`); a file holding results of more than one device is
  refused (which device's choices to keep is not a guess to make silently).

:mod:`xla_hooks.deviceless` loads the rewritten text in its child with the options of
:func:`load_options`.

Example:
  >>> results = read("h100_autotune.textproto")                 # doctest: +SKIP
  >>> text = for_target(results, TARGETS["h100"].read_text())   # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import os
import re
from collections import Counter
from pathlib import Path
from typing import NamedTuple

FORMAT_VERSION = 3  # xla/service/gpu/autotuning/autotuner_cache.cc's kVersion (jax 0.11.2 to 0.12.0.1)
# The name the deviceless child gives the file it loads: XLA reads a name ending so as text, others as binary.
TEXT_SUFFIX = ".textproto"
# The result kinds of an AutotuneResult (autotuning.proto) and what picks the kernel for each.
RESULT_KINDS = {"triton": "Triton GEMM tiling", "gemm": "cuBLAS GEMM algorithm", "algorithm": "cuDNN algorithm",
                "cuda_conv_plan": "cuDNN plan", "custom_kernel_fusion": "custom kernel", "other": "other backend"}
LOAD_OPTION = "xla_gpu_load_autotune_results_from"
DUMP_OPTION = "xla_gpu_dump_autotune_results_to"
# jax 0.12.0.1's XLA autotunes with a new cache (xla.autotuner.AutotuneCache) by default; a file in the
# AutotuneResults format is then loaded into the old cache, which that compile never reads (measured:
# the results are "loaded" and change nothing). With this option off the compile reads the old cache.
NEW_CACHE_FORMAT_OPTION = "xla_gpu_use_new_autotune_cache_format"
DESCRIBE = ("XLA's AutotuneResults textproto (version 3, as --xla_gpu_dump_autotune_results_to=FILE.textproto "
            "writes it; binary files are not read)")


class Entry(NamedTuple):
    """One autotuning result: the device it was tuned on, the canonical HLO it is keyed by, which
    kind of choice it holds (a key of :data:`RESULT_KINDS`), and the key's version when the entry
    states one (jax 0.11.2's XLA keys with version 52, 0.12.0.1's with 56, and each reads an entry without
    one as its own; an entry of another version never matches, and each version's XLA forms other fusions)."""

    device: str
    hlo: str
    kind: str
    version: int | None = None


class AutotuneResults(NamedTuple):
    """A results file, read and checked.

    Attributes:
      path: the file.
      text: its text, as read.
      entries: its results, in file order.
    """

    path: str
    text: str
    entries: tuple[Entry, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        """The distinct device keys of the entries, in order of first appearance."""
        return tuple(dict.fromkeys(e.device for e in self.entries))

    def counts(self) -> dict[str, int]:
        """Entries per result kind."""
        return dict(Counter(e.kind for e in self.entries))

    def versions(self) -> dict[int | None, int]:
        """Entries per key version (None: the entry states none)."""
        return dict(Counter(e.version for e in self.entries))


_STRING_FIELD = re.compile(r'^(?P<indent>\s*)(?P<key>device|hlo):\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*$')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "?": "?"}


def _unescape(s: str, where: str) -> str:
    r"""A textproto string literal's content (C escapes: ``\n``, ``\"``, ``\\``, octal ``\303``,
    hex ``\xc3``; bytes decoded as UTF-8)."""
    out = bytearray()
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        if i + 1 >= len(s):
            raise ValueError(f"{where}: a string ends in a lone backslash")
        n = s[i + 1]
        if n in _ESCAPES:
            out += _ESCAPES[n].encode()
            i += 2
        elif n in "01234567":
            m = re.match(r"[0-7]{1,3}", s[i + 1:])
            out.append(int(m.group(0), 8) & 0xFF)
            i += 1 + len(m.group(0))
        elif n == "x" and re.match(r"[0-9a-fA-F]{1,2}", s[i + 2:]):
            m = re.match(r"[0-9a-fA-F]{1,2}", s[i + 2:])
            out.append(int(m.group(0), 16))
            i += 2 + len(m.group(0))
        else:
            raise ValueError(f"{where}: unknown escape \\{n} in a string")
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{where}: a string is not UTF-8") from None


def _escape(s: str) -> str:
    """``s`` as a textproto string literal's content."""
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def _structure(text: str, where: str) -> tuple[int | None, list[dict[str, object]]]:
    """The file's ``version`` and its ``results`` blocks (each: line numbers of its string fields and
    the field names directly inside its ``result`` block), read line by line as XLA prints a textproto
    (one field per line, ``name {`` opens a message, ``}`` closes it; ``#`` comments allowed).

    Raises:
      ValueError: for unbalanced braces, a top-level field other than ``version`` and ``results``,
        or a line this reader does not understand, naming the line.
    """
    version: int | None = None
    blocks: list[dict[str, object]] = []
    stack: list[str] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith(("device:", "hlo:")) else raw.strip()
        if not line:
            continue
        at = f"{where}, line {no}"
        if line == "}":
            if not stack:
                raise ValueError(f"{at}: '}}' closes nothing")
            stack.pop()
            if not stack:
                blocks[-1]["end"] = no
            continue
        # a message field, or an Any's expansion ("[type.googleapis.com/xla.autotuner.BackendConfig] {",
        # as jax 0.11.2's XLA writes an "other" result's config)
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|\[[A-Za-z0-9_.]+(?:/[A-Za-z0-9_.]+)*\])\s*:?\s*\{$", line)
        if m:
            name = m.group(1)
            if not stack and name != "results":
                raise ValueError(f"{at}: top-level message {name!r}; expected only 'version' and 'results' "
                                 f"(is this {DESCRIBE}?)")
            if not stack:
                blocks.append({"fields": {}, "result": [], "line": no})
            elif len(stack) == 2 and stack == ["results", "result"]:
                blocks[-1]["result"].append(name)
            stack.append(name)
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.+)$", line)
        if not m:
            raise ValueError(f"{at}: cannot read {raw.strip()[:60]!r} (expected 'field: value', 'name {{' or '}}')")
        key, value = m.group(1), m.group(2)
        if not stack:
            if key != "version":
                raise ValueError(f"{at}: top-level field {key!r}; expected only 'version' and 'results'")
            if not value.isdigit():
                raise ValueError(f"{at}: version {value!r}; expected an integer")
            version = int(value)
        elif stack == ["results"]:
            if key == "version" and value.isdigit():
                blocks[-1]["fields"]["version"] = (no, int(value))
            elif key in ("device", "hlo"):
                f = _STRING_FIELD.match(raw)
                if not f:
                    raise ValueError(f"{at}: {key} is not one quoted string")
                blocks[-1]["fields"][key] = (no, _unescape(f.group("value"), at))
        elif stack == ["results", "result"]:
            blocks[-1]["result"].append(key)
    if stack:
        raise ValueError(f"{where}: the file ends inside '{' '.join(stack)}' (unbalanced braces)")
    return version, blocks


def parse(text: str, *, where: str = "autotune results") -> tuple[Entry, ...]:
    """The entries of an AutotuneResults textproto, checked.

    Raises:
      ValueError: for a missing or wrong ``version``, no results, or a result without ``device``,
        ``hlo`` or a ``result`` of a known kind; the message names the place and what was expected.
    """
    version, blocks = _structure(text, where)
    if version is None:
        raise ValueError(f"{where}: no 'version' field; expected {DESCRIBE}")
    if version != FORMAT_VERSION:
        raise ValueError(f"{where}: version {version}; expected {FORMAT_VERSION} (the AutotuneResults format "
                         "jax 0.11.2 to 0.12.0.1 write and read)")
    if not blocks:
        raise ValueError(f"{where}: no 'results' entries (an empty file loads nothing; XLA dumps one without "
                         "entries when the compile autotuned nothing, e.g. a deviceless compile)")
    entries = []
    for i, b in enumerate(blocks, 1):
        fields, kinds = b["fields"], [k for k in b["result"] if k in RESULT_KINDS]
        missing = [k for k in ("device", "hlo") if k not in fields]
        if missing:
            raise ValueError(f"{where}: results entry {i} (line {b['line']}) has no {' or '.join(missing)}")
        if len(kinds) != 1:
            raise ValueError(f"{where}: results entry {i} (line {b['line']}) holds "
                             f"{'no result' if not kinds else 'results ' + ', '.join(kinds)}; expected one "
                             f"'result {{ ... }}' with one of: {', '.join(RESULT_KINDS)}")
        entries.append(Entry(fields["device"][1], fields["hlo"][1], kinds[0],
                             fields["version"][1] if "version" in fields else None))
    keys = Counter((e.device, e.hlo) for e in entries)
    dup = next((k for k, n in keys.items() if n > 1), None)
    if dup is not None:
        raise ValueError(f"{where}: two results for one key (device {dup[0]!r}); XLA refuses duplicates")
    return tuple(entries)


def read(path: str | os.PathLike[str]) -> AutotuneResults:
    """Reads and checks an AutotuneResults textproto (gzipped when the name ends in ``.gz``).

    Raises:
      ValueError: for a missing file, a name XLA would read as binary, or a malformed file (:func:`parse`).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"autotune results {str(path)!r}: no such file; expected {DESCRIBE}")
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, EOFError) as e:  # a damaged .gz
        raise ValueError(f"autotune results {str(path)!r}: cannot gunzip ({e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"autotune results {str(path)!r}: not UTF-8 text (a binary AutotuneResults?); "
                         f"expected {DESCRIBE}") from None
    return AutotuneResults(str(p), text, parse(text, where=f"autotune results {str(path)!r}"))


def _target_config_fields(text: str) -> dict[str, str]:
    """The scalar fields of a GpuTargetConfig textproto that the autotune key reads, by name."""
    out: dict[str, str] = {}
    for key in ("core_count", "clock_rate_ghz", "memory_bandwidth", "l2_cache_size"):
        m = re.search(rf"^\s*{key}:\s*([0-9.eE+-]+)\s*$", text, re.MULTILINE)
        if m:
            out[key] = m.group(1)
    cc = re.search(r"cuda_compute_capability\s*\{([^}]*)\}", text)
    for key in ("major", "minor"):
        m = re.search(rf"\b{key}:\s*(\d+)", cc.group(1)) if cc else None
        out[f"cc_{key}"] = m.group(1) if m else "0"
    return out


def _num(x: float) -> str:
    """A number as absl::StrCat prints a double (up to 6 significant digits, no trailing zeros)."""
    return f"{x:.6g}"


def target_device_key(target_config: str) -> str:
    """The device part of the autotune cache key in a deviceless compile for the GpuTargetConfig
    textproto ``target_config`` (:data:`xla_hooks.deviceless.TARGETS`' files): XLA's
    ``AutotuneCacheKey::DeviceDescriptionToCacheKey`` over it, with ``DNN version: 0.0.0`` (what the
    deviceless compile uses, measured with jax 0.12.0.1; see the module docstring).

    Raises:
      ValueError: for a target config without the fields the key reads.
    """
    f = _target_config_fields(target_config)
    missing = [k for k in ("core_count", "clock_rate_ghz", "memory_bandwidth", "l2_cache_size") if k not in f]
    if missing:
        raise ValueError(f"target config: no {', '.join(missing)} (the autotune key reads them)")
    return (f"CUDA: {f['cc_major']}.{f['cc_minor']}, Cores: {int(f['core_count'])}, "
            f"GPU clock: {_num(float(f['clock_rate_ghz']))} GHz, "
            f"Memory bandwidth: {_num(round(float(f['memory_bandwidth']) / 1e9))} GB/s, "
            f"L2 cache: {_num(float(f['l2_cache_size']) / (1 << 20))} MB, DNN version: 0.0.0")


def for_target(results: AutotuneResults, target_config: str) -> str:
    """The results' text with every entry's ``device`` set to the deviceless key of the target
    ``target_config`` describes (:func:`target_device_key`), so that its deviceless compile finds them.

    Raises:
      ValueError: for results of more than one device (naming them), or a target config without
        the fields the key reads.
    """
    if len(results.devices) > 1:
        raise ValueError(f"autotune results {results.path!r} hold results of {len(results.devices)} devices "
                         f"({'; '.join(results.devices)}); expected one device's (write one file per device)")
    key = target_device_key(target_config)
    _, blocks = _structure(results.text, results.path)
    device_lines = {b["fields"]["device"][0] for b in blocks}
    lines = results.text.splitlines()
    for no in device_lines:
        indent = _STRING_FIELD.match(lines[no - 1]).group("indent")
        lines[no - 1] = f'{indent}device: "{_escape(key)}"'
    return "\n".join(lines) + "\n"


def merge(*results: AutotuneResults) -> str:
    """One AutotuneResults text holding every entry of ``results`` once: an entry whose key (device,
    HLO, version) an earlier one has is dropped (a device compile dumps every result of its process,
    so two dumps of one session overlap), the others keep their text as written.

    Raises:
      ValueError: for no results, or results of more than one device (naming them).
    """
    if not results:
        raise ValueError("merge: no autotune results given")
    devices = tuple(dict.fromkeys(d for r in results for d in r.devices))
    if len(devices) > 1:
        raise ValueError(f"merge: results of {len(devices)} devices ({'; '.join(devices)}); expected one device's")
    seen: set[tuple[str, str, int | None]] = set()
    out = [f"version: {FORMAT_VERSION}"]
    for r in results:
        lines = r.text.splitlines()
        _, blocks = _structure(r.text, r.path)
        for entry, b in zip(r.entries, blocks):
            if (entry.device, entry.hlo, entry.version) not in seen:
                seen.add((entry.device, entry.hlo, entry.version))
                out.extend(lines[b["line"] - 1:b["end"]])
    return "\n".join(out) + "\n"


def load_options(path: str) -> dict[str, object]:
    """The compile options that make a deviceless compile read the results file at ``path``."""
    return {LOAD_OPTION: path, NEW_CACHE_FORMAT_OPTION: False}

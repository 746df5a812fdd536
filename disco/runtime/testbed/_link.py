"""The shape of an emulated link: rate, delay, jitter and loss, read from a spec string.

    rate=10gbit,delay=50us[,jitter=5us][,loss=0.1%]

``rate`` takes tc's bit units (``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit``) or the units of
disco's cluster files (:func:`disco.sim.cluster.parse_bandwidth`: ``Gbps`` and ``Gb/s`` are
bits, ``GB/s`` bytes; note that tc itself would read ``bps`` as bytes). ``delay`` and ``jitter``
take ``s``, ``ms``, ``us`` or ``ns`` (:func:`disco.sim.cluster.parse_latency`); ``loss`` is a
fraction (``0.001``) or a percentage (``0.1%``). ``loopback`` (or an empty spec) means no
emulated link: the workers talk over 127.0.0.1.

Semantics (the emulator in :mod:`disco.runtime.testbed._switch` implements them): every worker has one
full-duplex link of ``rate`` to a switch. A packet from worker i to worker j is serialised on
i's uplink at ``rate`` (first come, first served), arrives ``delay`` (+ a jitter drawn
uniformly from ``[-jitter, +jitter]``, order kept) later, and leaves j's downlink no earlier
than the downlink's previous packet plus its own serialisation (contention only: with one
sender per receiver the downlink adds nothing). So ``delay`` is the one-way latency between
two workers and ``rate`` the bandwidth of each direction of each worker's link; a packet is
lost with probability ``loss``.
"""

from __future__ import annotations

import dataclasses
import math
import re

from disco.sim.cluster import parse_bandwidth, parse_latency

LOOPBACK = "loopback"
_TC_BITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TC_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]+)\s*$")
_KEYS = ("rate", "delay", "jitter", "loss")
_EXAMPLE = "rate=10gbit,delay=50us[,jitter=5us,loss=0.1%]"


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """One emulated link per worker (module doc: semantics).

    Attributes:
      rate_bps: bits per second in each direction (> 0).
      delay_s: one-way latency between two workers, seconds (>= 0).
      jitter_s: half-width of the uniform jitter added to ``delay_s``, seconds (0 <= jitter <= delay).
      loss: probability that a packet is dropped, in [0, 1).
    """

    rate_bps: float
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if not (_finite(self.rate_bps) and self.rate_bps > 0):
            raise ValueError(f"LinkSpec.rate_bps: expected a positive number of bits/s, got {self.rate_bps!r}")
        if not (_finite(self.delay_s) and self.delay_s >= 0):
            raise ValueError(f"LinkSpec.delay_s: expected seconds >= 0, got {self.delay_s!r}")
        if not (_finite(self.jitter_s) and 0 <= self.jitter_s <= self.delay_s):
            raise ValueError(f"LinkSpec.jitter_s: expected seconds in [0, delay_s={self.delay_s!r}], "
                             f"got {self.jitter_s!r}")
        if not (_finite(self.loss) and 0 <= self.loss < 1):
            raise ValueError(f"LinkSpec.loss: expected a probability in [0, 1), got {self.loss!r}")

    @property
    def bytes_per_s(self) -> float:
        return self.rate_bps / 8

    def seconds_for(self, nbytes: float) -> float:
        """Serialisation time of ``nbytes`` at this link's rate."""
        return nbytes * 8 / self.rate_bps

    def describe(self) -> str:
        """The canonical spec string (``parse_link(spec.describe()) == spec``)."""
        parts = [f"rate={self.rate_bps!r}bit", f"delay={self.delay_s!r}s"]
        if self.jitter_s:
            parts.append(f"jitter={self.jitter_s!r}s")
        if self.loss:
            parts.append(f"loss={self.loss!r}")
        return ",".join(parts)

    def label(self) -> str:
        """A short human label, e.g. ``1 Gbit/s + 100 us``."""
        out = f"{_si(self.rate_bps)}bit/s + {self.delay_s * 1e6:g} us"
        if self.jitter_s:
            out += f" (jitter {self.jitter_s * 1e6:g} us)"
        if self.loss:
            out += f", loss {self.loss * 100:g}%"
        return out

    def to_dict(self) -> dict[str, float | str]:
        return {"spec": self.describe(), "rate_bps": self.rate_bps, "delay_s": self.delay_s,
                "jitter_s": self.jitter_s, "loss": self.loss}


def is_loopback(text: str | None) -> bool:
    """Whether a ``--link`` value means plain 127.0.0.1: None, empty, or ``loopback`` in any case."""
    return text is None or text.strip().lower() in ("", LOOPBACK)


def parse_link(text: str | None) -> LinkSpec | None:
    """Reads ``rate=...,delay=...[,jitter=...,loss=...]``; ``None``, ``""`` or ``loopback`` give None.

    Raises:
      ValueError: naming the spec, the key and what was expected (unknown or repeated key, a
        missing rate, a value that is not a rate/duration/probability, jitter above delay).
    """
    if is_loopback(text):
        return None
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or not value.strip():
            raise ValueError(f"--link {text!r}: expected key=value items, e.g. {_EXAMPLE}; got {item.strip()!r}")
        if key not in _KEYS:
            raise ValueError(f"--link {text!r}: unknown key {key!r}; expected some of {', '.join(_KEYS)} "
                             f"(e.g. {_EXAMPLE}) or '{LOOPBACK}'")
        if key in fields:
            raise ValueError(f"--link {text!r}: {key!r} given twice")
        fields[key] = value.strip()
    if "rate" not in fields:
        raise ValueError(f"--link {text!r}: missing rate; expected e.g. {_EXAMPLE}")
    rate = _rate(fields["rate"], text)
    delay = parse_latency(fields.get("delay", "0"), f"--link {text!r}: delay")
    jitter = parse_latency(fields.get("jitter", "0"), f"--link {text!r}: jitter")
    loss = _loss(fields.get("loss", "0"), text)
    if jitter > delay:
        raise ValueError(f"--link {text!r}: jitter {fields['jitter']} exceeds delay {fields.get('delay', '0')}; "
                         "expected jitter <= delay (the delay of a packet is never negative)")
    return LinkSpec(rate, delay, jitter, loss)


def _rate(value: str, text: str) -> float:
    m = _TC_RE.match(value)
    if m and m.group(2).lower() in _TC_BITS:
        bps = float(m.group(1)) * _TC_BITS[m.group(2).lower()]
    else:
        try:
            bps = parse_bandwidth(value, f"--link {text!r}: rate") * 8
        except ValueError as e:
            raise ValueError(f"{e}; tc's units kbit, mbit, gbit are read too") from None
    if not (_finite(bps) and bps > 0):
        raise ValueError(f"--link {text!r}: rate: expected a positive rate such as 10gbit, got {value!r}")
    return bps


def _loss(value: str, text: str) -> float:
    pct = value.endswith("%")
    try:
        x = float(value[:-1] if pct else value) / (100 if pct else 1)
    except ValueError:
        raise ValueError(f"--link {text!r}: loss: expected a fraction such as 0.001 or a percentage such "
                         f"as 0.1%, got {value!r}") from None
    if not (_finite(x) and 0 <= x < 1):
        raise ValueError(f"--link {text!r}: loss: expected a probability in [0, 1), got {value!r}")
    return x


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _si(x: float) -> str:
    for div, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:g} {p}"
    return f"{x:g} "

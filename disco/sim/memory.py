"""A compiled step's device memory, read from XLA's buffer assignment (``memory_analysis()``).

What a step holds on one device while it runs: its arguments, its outputs (less those aliased to a
donated argument, which share its buffer) and XLA's temporaries, one allocation that lives through
the whole execution. :func:`peak_memory` adds them up; it is the figure a plan over the device's
memory would exceed.

XLA's own ``peak_memory_in_bytes`` (jax 0.10.2 reports it beside the sizes) is kept beside it but is
not the peak: XLA:CPU's counts the arguments and outputs (less aliases) and leaves the temporaries
out (measured on CPU with jax 0.10.2, transformer_lm tiny on 8 devices: 66,684 bytes against
arguments 32,996, outputs 33,672 and temporaries 227,896).

No jax import: it reads any object with ``memory_analysis()`` (a ``jax.stages.Compiled``, or an
``xla_hooks.AppliedStep`` through its ``compiled``), or the stats object itself.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class PeakMemory(NamedTuple):
    """One device's memory of a compiled step, in bytes.

    Attributes:
      arguments: the step's arguments (this device's shards).
      outputs: its outputs.
      aliased: outputs that reuse a donated argument's buffer.
      temporaries: XLA's temporary buffers (one allocation for the whole execution).
      peak: ``arguments + outputs - aliased + temporaries``: all of it live at once.
      xla_peak: XLA's ``peak_memory_in_bytes`` where reported (on CPU it leaves the temporaries
        out, see the module's docstring); None where the stats have none.
    """

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    peak: int
    xla_peak: int | None = None


def peak_memory(compiled: Any) -> PeakMemory:
    """The device memory ``compiled`` needs while it runs (:class:`PeakMemory`).

    Args:
      compiled: a ``jax.stages.Compiled``, an object holding one as ``compiled`` (an
        ``xla_hooks.AppliedStep``), or what ``memory_analysis()`` returned.

    Raises:
      ValueError: the executable reports no memory analysis (``memory_analysis()`` gave None),
        or its stats lack the sizes read here.
      TypeError: ``compiled`` is none of the above.
    """
    stats = compiled
    if not hasattr(stats, "temp_size_in_bytes"):
        inner = getattr(stats, "compiled", None)
        if not hasattr(stats, "memory_analysis") and inner is not None and hasattr(inner, "memory_analysis"):
            stats = inner
        if not hasattr(stats, "memory_analysis"):
            raise TypeError(f"peak_memory: expected a jax Compiled, an AppliedStep or its memory_analysis(), "
                            f"got {type(compiled).__name__}")
        stats = stats.memory_analysis()
    if stats is None:
        raise ValueError("peak_memory: the executable reports no memory analysis (memory_analysis() is None)")
    try:
        args, outs = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
        alias, temp = int(stats.alias_size_in_bytes), int(stats.temp_size_in_bytes)
    except AttributeError as e:
        raise ValueError(f"peak_memory: the memory analysis lacks a size ({e}); expected argument, output, "
                         "alias and temp sizes in bytes") from None
    xla_peak = getattr(stats, "peak_memory_in_bytes", None)
    return PeakMemory(arguments=args, outputs=outs, aliased=alias, temporaries=temp, peak=args + outs - alias + temp,
                      xla_peak=None if xla_peak is None else int(xla_peak))


def peak_bytes(compiled: Any) -> int | None:
    """:func:`peak_memory`'s ``peak`` in bytes, or None where ``compiled`` reports no memory analysis
    (a runner's step that is no jax executable, an executable without the stats): what a table of
    plans shows beside each measured row."""
    try:
        return peak_memory(compiled).peak
    except (TypeError, ValueError):
        return None


def bytes_text(n: int | None) -> str:
    """``n`` bytes in a few characters for a table ("33.0 KiB", "1.20 MiB", "-" for None)."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"


def bytes_short(n: int | None) -> str:
    """``n`` bytes in a few characters for a narrow column ("74K", "7.4M", "80G", "512B"; "-" for None):
    binary units (K = KiB)."""
    if n is None:
        return "-"
    for unit, size in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 9.95 else f"{value:.0f}{unit}"
    return f"{n}B"

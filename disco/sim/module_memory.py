"""A compiled module's device memory estimated from its text, where no memory analysis came with it.

:func:`disco.sim.memory.peak_memory` reads XLA's own buffer assignment of an executable. A module's
text alone (a compile whose executable was not kept, a cached module written before its memory was)
has no buffer assignment, so :func:`estimate` rebuilds the four figures from the scheduled entry
computation:

* arguments: the entry's parameters; outputs: its root's arrays;
* aliased: the outputs the header's ``input_output_alias`` gives a parameter's buffer (donation);
* temporaries: the largest set of buffers live at once when the entry's instructions run in the
  module's order (a scheduled module prints them in schedule order), each buffer live from the
  instruction that writes it to its last reader. Instructions that write no buffer of their own
  (``get-tuple-element``, ``tuple``, ``bitcast``, ``parameter``, ``constant``, ``-done`` halves of
  async pairs) pass their operands' buffers on: a read of them keeps those live. Outputs and
  parameters are counted once, above, not as temporaries.

It is an estimate, not XLA's figure: XLA reuses a dead buffer's space for another of another size
(fragmentation is not modelled), and buffers inside called computations (a ``while``'s body) are
left out. Every result says so by its name: :data:`SOURCE`.

Example:
  >>> estimate(compiled_text).peak  # doctest: +SKIP
"""

from __future__ import annotations

import re

from disco.ir import hlo_parse
from disco.sim.memory import PeakMemory

SOURCE = "module-estimate"
# instructions whose result is (a view of) their operands' buffers, or no device buffer at all
_NO_BUFFER = frozenset({"get-tuple-element", "tuple", "bitcast", "parameter", "constant", "after-all",
                        "partition-id", "replica-id", "opt-barrier", "optimization-barrier"})
_ALIAS = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)")


def _forwards(opcode: str) -> bool:
    return opcode in _NO_BUFFER or opcode.endswith("-done")


def _aliased_outputs(header: str) -> set[int]:
    """The output leaf indices that ``input_output_alias={ {i}: (p, {}, may-alias), ... }`` aliases."""
    m = re.search(r"input_output_alias=\{(.*?)\}\s*(?:,\s*\w+=|$)", header, flags=re.S)
    if not m:
        return set()
    out = set()
    for idx, _ in _ALIAS.findall(m.group(1) + "}"):
        first = idx.replace(" ", "").split(",")[0]
        out.add(int(first) if first else 0)
    return out


def estimate(text: str) -> PeakMemory:
    """One device's memory of the compiled module ``text`` (the module doc's estimate).

    Raises:
      ValueError: for text that is not an HLO module.
    """
    if not isinstance(text, str) or "HloModule" not in text:
        raise ValueError(f"module_memory.estimate: expected an HLO module's text, got {str(text)[:60]!r}")
    module = hlo_parse.parse_module(text)
    entry = module.entry
    ins = entry.instructions
    root = entry.root
    arguments = sum(i.out_bytes for i in ins if i.opcode == "parameter")
    leaves = root.arrays
    outputs = sum(a.nbytes for a in leaves)
    aliased = sum(leaves[k].nbytes for k in _aliased_outputs(module.header) if k < len(leaves))
    index = {i.name: n for n, i in enumerate(ins)}
    by_name = entry.by_name()

    def owners(name: str, seen: set[str] | None = None) -> set[str]:
        """The instructions whose own buffers ``name``'s result is made of."""
        i = by_name.get(name)
        if i is None:
            return set()
        if not _forwards(i.opcode):
            return {name}
        seen = seen if seen is not None else set()
        if name in seen:
            return set()
        seen.add(name)
        out: set[str] = set()
        for o in i.operands:
            out |= owners(o, seen)
        return out

    last = {i.name: index[i.name] for i in ins}
    for n, i in enumerate(ins):
        for o in i.operands:
            for owner in owners(o):
                last[owner] = max(last[owner], n)
    kept = owners(root.name)  # the outputs: counted once, as outputs
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for i in ins:
        if _forwards(i.opcode) or i.name in kept:
            continue
        starts[index[i.name]] = starts.get(index[i.name], 0) + i.out_bytes
        ends[last[i.name]] = ends.get(last[i.name], 0) + i.out_bytes
    live = peak = 0
    for n in range(len(ins)):
        live += starts.get(n, 0)
        peak = max(peak, live)
        live -= ends.get(n, 0)
    return PeakMemory(arguments=arguments, outputs=outputs, aliased=aliased, temporaries=peak,
                      peak=arguments + outputs - aliased + peak)

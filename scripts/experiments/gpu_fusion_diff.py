"""Diffs disco's XLA:GPU fusion emulation against XLA:GPU's compiled kernels, for one dataset record.

For a ``default`` record of ../shared/data/h100_kernels (per_instruction.jsonl.gz), two kernel lists:

- **emulated**: what ``disco.sim.gpu_fusion`` forms on the record's pre-optimisation HLO
  (the simulator on cluster ``h100-1``, plan ``xla_default``), each kernel as the
  :class:`disco.sim.costs.Kernel` the simulator prices; a while loop's body and condition
  kernels count trip-count times.
- **compiled**: every kernel-launching instruction of the record's compiled module
  (``gnn.kernel_features.module_kernels``: fusions, cuBLAS/cuDNN custom-calls, copies, ...),
  loop bodies times their ``known_trip_count``, with each one's measured device time.

Printed per side, by kernel class (``gnn.kernel_features.kernel_kind``: gemm, conv, reduce,
transpose, copy, loop): launches, bytes read and written, flops, the shipped H100 analytic
model's seconds (``device_costs.analytic("h100")``) and, compiled side, the measured seconds.
Then the top differences: kernels grouped by a signature (class, sorted compute opcodes,
largest element count) that one side has more of than the other, ranked by the analytic
seconds of the surplus; and the compute opcodes that sit in kernels of a different class on
the two sides (e.g. a ``multiply`` XLA put in a gemm's epilogue that the emulation made a loop
kernel).

Usage::

  PYTHONPATH=. python scripts/experiments/gpu_fusion_diff.py --model bert [--preset paper] [--top 15] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any, NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from disco.ir.graph import HloGraph  # noqa: E402
from disco.ir.opcodes import COLLECTIVE_KIND  # noqa: E402
from disco.sim import cluster as dcluster  # noqa: E402
from disco.sim.costs import device_costs  # noqa: E402
from disco.sim.costs import Kernel, is_kernel_node  # noqa: E402
from disco.sim.simulator import Simulator  # noqa: E402
from gnn import kernel_data  # noqa: E402
from gnn import kernel_features as KF  # noqa: E402
from scripts.tools.gpu_sim_tables import DEFAULT_DATA, _record_graph, read_records  # noqa: E402

# Ops that move or reinterpret data; a signature lists the others (the kernel's compute).
_LAYOUT = frozenset({"parameter", "constant", "bitcast", "reshape", "broadcast", "transpose", "copy", "tuple",
                     "get-tuple-element", "convert", "iota", "bitcast-convert", "slice", "concatenate", "pad",
                     "dynamic-slice", "dynamic-update-slice", "custom-call"})


class Row(NamedTuple):
    """One kernel of either side: its Kernel, launches per step, and measured seconds (compiled only)."""

    name: str
    kernel: Kernel
    executions: int
    measured_s: float | None


def emulated(graph: HloGraph, times: int = 1) -> list[Row]:
    """The emulated kernels of ``graph`` under ``xla_default`` on h100-1, loop bodies ``trip count`` times."""
    sim = Simulator(graph, device_costs.analytic("h100"), dcluster.preset("h100-1"))
    mode = sim._patcher.mode("extend")  # the plan without groups: the emulation of the whole graph
    nodes = graph.nodes
    loops = {lp.node: lp for lp in graph.loops}
    out: list[Row] = []
    for u in mode.units:
        if u.is_coll:
            continue
        if len(u.members) == 1 and nodes[u.members[0]].name in loops:
            lp = loops[nodes[u.members[0]].name]
            trips = 1 if lp.trip_count is None else lp.trip_count
            out += emulated(lp.body, times * trips) + emulated(lp.condition, times * trips)
            continue
        inl = sorted({d for m in u.members for d in mode.inline[m]})
        k = sim.kernels.kernel(u.members, inl)
        if not k.is_empty:
            out.append(Row(u.name, k, times, None))
    return out


def compiled(rec: dict[str, Any]) -> list[Row]:
    """The compiled module's kernels with their measured seconds per launch-step (None when unprofiled)."""
    labels, _ = kernel_data.labels_of(rec)
    return [Row(s.name, s.kernel, s.executions, labels[s.name].seconds if s.name in labels else None)
            for s in KF.module_kernels(rec["compiled_hlo"]) if not s.kernel.is_empty]


def signature(k: Kernel) -> tuple:
    compute = tuple(sorted(n.opcode for n in k.nodes if is_kernel_node(n) and n.opcode not in _LAYOUT))
    big = max((n.out_elements for n in k.nodes if is_kernel_node(n)), default=0)
    return (KF.kernel_kind(k), compute, big)


def summary(rows: list[Row], costs) -> dict[str, dict[str, float]]:
    """Per kernel class: launches, bytes in/out, flops, analytic and measured seconds (per step)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        d = out.setdefault(KF.kernel_kind(r.kernel), collections.defaultdict(float))
        e = r.executions
        d["launches"] += e
        d["in_mb"] += e * r.kernel.in_bytes / 1e6
        d["out_mb"] += e * r.kernel.out_bytes / 1e6
        d["gflop"] += e * r.kernel.flops / 1e9
        d["analytic_ms"] += e * costs.kernel_time(r.kernel) * 1e3
        if r.measured_s is not None:
            d["measured_ms"] += r.measured_s * 1e3
    total: dict[str, float] = collections.defaultdict(float)
    for d in out.values():
        for key, v in d.items():
            total[key] += v
    out["TOTAL"] = total
    return {k: dict(v) for k, v in sorted(out.items())}


def top_differences(emu: list[Row], comp: list[Row], costs, top: int) -> list[dict[str, Any]]:
    """Signatures one side launches more often than the other, by the analytic seconds of the surplus."""
    def tally(rows):
        n: collections.Counter = collections.Counter()
        sec: dict[tuple, float] = {}
        meas: dict[tuple, float] = collections.defaultdict(float)
        for r in rows:
            s = signature(r.kernel)
            n[s] += r.executions
            sec[s] = costs.kernel_time(r.kernel)
            if r.measured_s is not None:
                meas[s] += r.measured_s
        return n, sec, meas
    ne, se, _ = tally(emu)
    nc, sc, mc = tally(comp)
    diffs = []
    for s in set(ne) | set(nc):
        d = ne[s] - nc[s]
        if d == 0:
            continue
        per = se.get(s) if d > 0 else sc.get(s)
        diffs.append({"side": "emulated-only" if d > 0 else "compiled-only", "launches": abs(d),
                      "class": s[0], "ops": " ".join(f"{op}x{c}" if c > 1 else op
                                                     for op, c in sorted(collections.Counter(s[1]).items())),
                      "elements": s[2], "analytic_ms": abs(d) * per * 1e3,
                      "measured_ms_per_launch": (mc[s] / nc[s] * 1e3) if nc[s] and s in mc else None})
    diffs.sort(key=lambda d: -d["analytic_ms"])
    return diffs[:top]


def op_homes(rows: list[Row]) -> dict[str, collections.Counter]:
    """opcode -> Counter of the kernel classes its nodes sit in (weighted by launches)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        kind = KF.kernel_kind(r.kernel)
        for n in r.kernel.nodes:
            if is_kernel_node(n) and n.opcode not in _LAYOUT and n.opcode not in COLLECTIVE_KIND:
                out[n.opcode][kind] += r.executions
    return out


def diff(rec: dict[str, Any], graph: HloGraph, top: int = 15) -> dict[str, Any]:
    """The whole comparison of one record (see the module docstring)."""
    costs = device_costs.analytic("h100")
    emu, comp = emulated(graph), compiled(rec)
    he, hc = op_homes(emu), op_homes(comp)
    moved = []
    for op in sorted(set(he) | set(hc)):
        if he[op] != hc[op]:
            moved.append({"op": op, "emulated": dict(he[op]), "compiled": dict(hc[op])})
    moved.sort(key=lambda m: -sum(abs(m["emulated"].get(k, 0) - m["compiled"].get(k, 0))
                                   for k in set(m["emulated"]) | set(m["compiled"])))
    _, step = kernel_data.labels_of(rec)
    return {"model": rec["model"], "preset": rec["preset"], "measured_step_ms": step * 1e3,
            "emulated": summary(emu, costs), "compiled": summary(comp, costs),
            "top_differences": top_differences(emu, comp, costs, top), "op_classes": moved[:top]}


def _print(d: dict[str, Any]) -> None:
    print(f"## {d['model']} {d['preset']}: measured device time {d['measured_step_ms']:.3f} ms (GPU)")
    print()
    print("| side | class | launches | MB in | MB out | GFLOP | analytic ms | measured ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for side in ("emulated", "compiled"):
        for kind, v in d[side].items():
            meas = f"{v['measured_ms']:.3f}" if "measured_ms" in v else ""
            print(f"| {side} | {kind} | {v['launches']:.0f} | {v['in_mb']:.1f} | {v['out_mb']:.1f} | "
                  f"{v['gflop']:.1f} | {v['analytic_ms']:.3f} | {meas} |")
    print()
    print("| surplus on | launches | class | compute ops | max elements | analytic ms | measured ms/launch |")
    print("|---|---:|---|---|---:|---:|---:|")
    for t in d["top_differences"]:
        m = "" if t["measured_ms_per_launch"] is None else f"{t['measured_ms_per_launch']:.4f}"
        print(f"| {t['side']} | {t['launches']} | {t['class']} | {t['ops'][:70]} | {t['elements']} | "
              f"{t['analytic_ms']:.3f} | {m} |")
    print()
    print("| opcode | emulated: kernel classes (launches) | compiled: kernel classes (launches) |")
    print("|---|---|---|")
    for m in d["op_classes"]:
        print(f"| {m['op']} | {m['emulated']} | {m['compiled']} |")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--model", required=True, help="zoo model name, or 'all'")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--cache", default=None, help="a directory to keep parsed graphs in (pickles)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    recs = [r for r in read_records(args.data) if r["variant"] == "default" and r["preset"] == args.preset
            and args.model in ("all", r["model"])]
    if not recs:
        raise SystemExit(f"no default record for model {args.model!r} at preset {args.preset!r} in {args.data}")
    out = [diff(r, _record_graph(r, args.cache), args.top) for r in recs]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for d in out:
            _print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())

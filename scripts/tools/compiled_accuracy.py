"""The compiled tier against the H100 measurements: deviceless XLA:GPU compiles priced kernel by kernel.

For every zoo model with H100 data at ``--preset`` (default ``paper``; the records of
``../shared/data/h100_kernels/per_instruction.jsonl.gz`` and ``gnn/data/h100_kernels_*.jsonl.gz``):

1. **h100-1, three fusion variants**: the ``default`` record's ``pre_optimization_hlo`` compiled
   deviceless for one H100 (:func:`xla_hooks.deviceless.compile_hlo`) with each variant's
   ``compile_options`` (XLA's default, ``priority-fusion`` off, ``multi_output_fusion`` off), priced by
   the compiled tier (:func:`disco.sim.compiled.price`) with the per-kernel GNN (``gnn``), the GNN
   without its table of measured kernels (``gnn_nc``: the network alone) and the H100 roofline
   (``device_costs.analytic("h100")``), each against the record's measured device time (every kernel
   of both traces summed, averaged: :func:`gnn.kernel_data.labels_of`). Also: the kernels of the
   deviceless module against those of the module XLA built on the H100 (count of kernel-launching
   instructions), and the GNN's price of the device-built module itself (what the compile's fidelity
   costs). Whether the GNN orders each model's variants as measured.
2. **h100-sxm-8**: the model's GSPMD training step lowered for 8 devices and compiled deviceless
   (:func:`xla_hooks.deviceless.compile_zoo_step`), priced with the GNN on ``h100-sxm-8``: XLA's
   combined all-reduces, their bytes, the schedule's exposed communication (simulated; nothing
   measured on 8 GPUs).
3. **fusion match** (``--fusion-match``, slow): the emulated kernels (:mod:`disco.sim.gpu_fusion`)
   against the deviceless and the device-built modules' kernels, by signature
   (``scripts/tools/gpu_sim_tables.py``'s ``fusion_match``), and the emulated tier's GNN prediction.

Writes a JSON file (``--out``) after every model and prints markdown tables.

Usage::

  PYTHONPATH=. python scripts/tools/compiled_accuracy.py [--models mlp,gpt2] [--out /tmp/compiled_accuracy.json]
      [--no-8] [--fusion-match] [--autotune-results FILE] [--lomo-dir DIR]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from disco.sim import cluster as dcluster  # noqa: E402
from disco.sim import compiled  # noqa: E402
from disco.sim.costs import device_costs  # noqa: E402
from gnn import kernel_costs, kernel_data  # noqa: E402
from xla_hooks import deviceless  # noqa: E402

_ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEFAULT_DATA = [p for p in (os.path.join(_ROOT, "..", "shared", "data", "h100_kernels", "per_instruction.jsonl.gz"),
                            *sorted(glob.glob(os.path.join(_ROOT, "gnn", "data", "h100_kernels_*.jsonl.gz"))))
                if os.path.isfile(p)]
VARIANTS = ("default", "no_priority_fusion", "no_multi_output_fusion")


def read(paths: list[str], preset: str) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> variant -> record, for ``preset`` (the first file holding a model wins)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for p in paths:
        seen: dict[str, dict[str, dict[str, Any]]] = {}
        with gzip.open(p, "rt") as f:
            for line in f:
                r = json.loads(line)
                if r["preset"] == preset and r["variant"] in VARIANTS:
                    seen.setdefault(r["model"], {})[r["variant"]] = r
        for m, v in seen.items():
            out.setdefault(m, v)
    return out


def h100_rows(model: str, recs: dict[str, dict[str, Any]], costs: dict[str, Any],
              variants: tuple[str, ...] = VARIANTS, autotune: str | None = None) -> list[dict[str, Any]]:
    spec = dcluster.preset("h100-1")
    pre = recs["default"]["pre_optimization_hlo"]
    rows = []
    for variant in variants:
        rec = recs.get(variant)
        if rec is None:
            continue
        t0 = time.perf_counter()
        text = deviceless.compile_hlo(pre, target="h100", devices=1, options=rec["compile_options"],
                                      autotune_results=autotune)
        compile_s = time.perf_counter() - t0
        _, measured = kernel_data.labels_of(rec)
        row = {"model": model, "variant": variant, "measured_ms": measured * 1e3, "compile_s": round(compile_s, 1)}
        for name, cm in costs.items():
            r = compiled.price(text, cm, spec)
            row[f"{name}_ms"] = r.compute_s * 1e3
            row[f"{name}_err"] = r.compute_s / measured - 1.0
        row["kernels_deviceless"] = len(compiled.price(text, costs["roofline"], spec).kernels)
        dev = compiled.price(rec["compiled_hlo"], costs["gnn"], spec)
        row["kernels_device"] = len(dev.kernels)
        row["gnn_on_device_module_err"] = dev.compute_s / measured - 1.0
        rows.append(row)
        print(f"  {model}/{variant}: measured {measured * 1e3:.3f} ms, gnn {row['gnn_err']:+.1%}, gnn_nc "
              f"{row['gnn_nc_err']:+.1%}, roofline {row['roofline_err']:+.1%}, kernels {row['kernels_deviceless']} "
              f"deviceless / {row['kernels_device']} device (compile {compile_s:.1f} s)", flush=True)
    return rows


def sxm8_row(model: str, preset: str, gnn: Any, autotune: str | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    _, text = deviceless.compile_zoo_step(model, preset, target="h100", devices=8, autotune_results=autotune)
    compile_s = time.perf_counter() - t0
    r = compiled.price(text, gnn, dcluster.preset("h100-sxm-8"))
    s = r.summary()
    ars = [c for c in r.collectives if c.kind == "all-reduce"]
    return {"model": model, "compile_s": round(compile_s, 1), "step_ms": s["step_time_ms"],
            "compute_ms": s["compute_time_ms"], "comm_ms": s["comm_time_ms"], "exposed_ms": s["exposed_comm_ms"],
            "all_reduces": len(ars), "async": sum(c.is_async for c in ars),
            "all_reduce_mib": sum(c.nbytes * c.executions for c in ars) / 2**20}


def fusion_rows(model: str, recs: dict[str, dict[str, Any]], autotune: str | None = None) -> dict[str, Any]:
    from scripts.tools.gpu_sim_tables import _record_graph, compiled_signatures, fusion_match, prediction

    rec = recs["default"]
    text = deviceless.compile_hlo(rec["pre_optimization_hlo"], target="h100", devices=1,
                                  options=rec["compile_options"], autotune_results=autotune)
    import collections

    vs_device = fusion_match(rec)
    vs_deviceless = fusion_match({**rec, "compiled_hlo": text})
    a, b = collections.Counter(compiled_signatures(text)), collections.Counter(compiled_signatures(rec["compiled_hlo"]))
    emu = prediction(rec, _record_graph(rec, None), "gnn")
    return {"model": model, "emulated": vs_device["emulated"], "device": vs_device["compiled"],
            "deviceless": vs_deviceless["compiled"], "emulated_exact_vs_device": vs_device["exact"],
            "emulated_exact_vs_deviceless": vs_deviceless["exact"],
            "deviceless_exact_vs_device": sum((a & b).values()) / max(1, sum(b.values())),
            "emulated_gnn_err": emu["error"]}


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", help="a per-kernel dataset file (repeatable)")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--models", help="comma list (default: every model in the data)")
    ap.add_argument("--out", default="/tmp/compiled_accuracy.json")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: all three)")
    ap.add_argument("--no-8", dest="eight", action="store_false", help="skip the h100-sxm-8 compiles")
    ap.add_argument("--fusion-match", action="store_true")
    ap.add_argument("--lomo-dir", metavar="DIR", default=None,
                    help="price each model with DIR/without_<model>.msgpack (scripts/tools/kernel_lomo.py --save-dir: "
                         "the GNN that never saw the model) instead of the shipped GNN: held-out figures")
    ap.add_argument("--autotune-results", metavar="FILE", default=None,
                    help="XLA's autotuning results from the device (xla_hooks.autotune_results) for every compile")
    args = ap.parse_args(argv)
    if not deviceless.available():
        print(f"deviceless XLA:GPU is not available: {deviceless.INSTALL_HINT}", file=sys.stderr)
        return 2
    data = read(args.data or DEFAULT_DATA, args.preset)
    models = args.models.split(",") if args.models else sorted(data)
    gnn = kernel_costs.load_for_device("h100")
    costs = {"gnn": gnn, "gnn_nc": kernel_costs.KernelCosts(gnn.model, device="h100", corrections={}),
             "roofline": device_costs.analytic("h100")}
    out: dict[str, Any] = {"preset": args.preset, "data": args.data or DEFAULT_DATA, "gnn": gnn.describe(),
                           "lomo_dir": args.lomo_dir,
                           "autotune_results": args.autotune_results, "deviceless_jax": deviceless.child_jax_version(
                               deviceless.gpu_python()),
                           "h100_1": [], "h100_sxm_8": [], "fusion": [], "order": {}}
    for m in models:
        if m not in data or "default" not in data[m]:
            print(f"{m}: no default record at preset {args.preset}", file=sys.stderr)
            continue
        if args.lomo_dir:  # the fold's GNN: never trained on m (its table of measured kernels neither)
            held = kernel_costs.KernelCosts.load(os.path.join(args.lomo_dir, f"without_{m}.msgpack"))
            costs = {**costs, "gnn": held, "gnn_nc": kernel_costs.KernelCosts(held.model, device="h100", corrections={})}
        rows = h100_rows(m, data[m], costs, tuple(args.variants.split(",")), args.autotune_results)
        out["h100_1"] += rows
        by_meas = [r["variant"] for r in sorted(rows, key=lambda r: r["measured_ms"])]
        by_gnn = [r["variant"] for r in sorted(rows, key=lambda r: r["gnn_ms"])]
        by_roof = [r["variant"] for r in sorted(rows, key=lambda r: r["roofline_ms"])]
        out["order"][m] = {"measured": by_meas, "gnn": by_gnn, "roofline": by_roof}
        if args.eight:
            try:
                out["h100_sxm_8"].append(sxm8_row(m, args.preset, costs["gnn"], args.autotune_results))
                print(f"  {m} h100-sxm-8: {out['h100_sxm_8'][-1]}", flush=True)
            except deviceless.DevicelessUnavailable as e:
                print(f"  {m} h100-sxm-8: failed: {str(e)[-300:]}", flush=True)
        if args.fusion_match:
            out["fusion"].append(fusion_rows(m, data[m], args.autotune_results))
            print(f"  {m} fusion: {out['fusion'][-1]}", flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    d = [r for r in out["h100_1"] if r["variant"] == "default"]
    print("\n## h100-1, default variant\n")
    print(_table(d, ["model", "measured_ms", "gnn_ms", "gnn_err", "gnn_nc_err", "roofline_ms", "roofline_err",
                     "gnn_on_device_module_err", "kernels_deviceless", "kernels_device"]))
    for name in ("gnn", "gnn_nc", "roofline"):
        errs = [abs(r[f"{name}_err"]) for r in d]
        if errs:
            print(f"\n{name}: mean |error| {sum(errs) / len(errs):.1%}, within 10%: "
                  f"{sum(e <= 0.10 for e in errs)}/{len(errs)}")
    print("\n## variants\n")
    print(_table(out["h100_1"], ["model", "variant", "measured_ms", "gnn_ms", "gnn_err", "roofline_err"]))
    agree = {k: (v["measured"] == v["gnn"], v["measured"] == v["roofline"]) for k, v in out["order"].items()}
    print(f"\nvariant order as measured: gnn {sum(a for a, _ in agree.values())}/{len(agree)}, roofline "
          f"{sum(b for _, b in agree.values())}/{len(agree)}")
    if out["h100_sxm_8"]:
        print("\n## h100-sxm-8\n")
        print(_table(out["h100_sxm_8"], ["model", "step_ms", "compute_ms", "comm_ms", "exposed_ms", "all_reduces",
                                         "async", "all_reduce_mib", "compile_s"]))
    if out["fusion"]:
        print("\n## fusion match\n")
        print(_table(out["fusion"], list(out["fusion"][0].keys())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

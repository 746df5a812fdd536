"""Prints how well the simulator's GPU side matches the H100 dataset (../shared/data/h100_kernels).

Two tables, from the dataset's ``default`` records (XLA's default compile, command buffers off):

1. **Fusion match**: the pre-optimisation HLO of each record, contracted by disco's XLA:GPU
   fusion emulation (``disco.sim.gpu_fusion`` through the simulator, cluster ``h100-1``), next
   to the kernels of the compiled module (entry computation only; kernels inside while bodies
   are not counted on either side, though the simulator prices them: trip count x body). Instruction names cannot be matched: the pre-optimisation
   text has no ``op_name`` metadata and XLA renumbers instructions, so kernels are compared by
   a signature: matrix kernels (cuBLAS/cuDNN custom calls, Triton gemm fusions; emulated
   kernels holding a dot or convolution) by their output elements; other kernels by the
   multiset of their compute opcodes (layout and data-movement ops left out) and their
   largest element count. ``exact`` is the fraction of compiled kernels whose signature an
   emulated kernel reproduces (multiset intersection).
2. **h100-1 prediction**: the simulated step of each model at a preset on ``h100-1`` with each
   cost model ``--cost-model`` names (a comma list of registry names or files, built by
   ``disco.sim.costs.registry.make(name, device="h100")`` as ``disco simulate`` does; default
   ``analytic,gnn``), next to the measured device time (kernels summed, mean of the two traces). With ``--zoo`` the
   graph is extracted from the zoo here (what ``disco simulate --cluster h100-1`` does);
   without, from the record's own pre-optimisation HLO.

Usage::

  PYTHONPATH=. python scripts/tools/gpu_sim_tables.py [--data DIR] [--preset paper] [--cost-model analytic,gnn] [--zoo] [--json]
  PYTHONPATH=. python scripts/tools/gpu_sim_tables.py --fit [--form v1|v2] [--no-loops]

``--fit`` fits the parameters of the H100 analytic model (``disco.sim.costs.device_costs.SummedCosts``)
to the ``default`` records and prints them with each record's in-sample and leave-one-model-out
error; ``--form v1`` fits the 4-parameter form it had before (for the comparison).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from disco.ir.graph import HloGraph  # noqa: E402
from disco.ir.hlo_parse import parse_module  # noqa: E402
from disco.plans import baselines  # noqa: E402
from disco.sim import cluster as dcluster  # noqa: E402
from disco.sim.costs import device_costs, registry  # noqa: E402
from disco.sim.simulator import Simulator, iteration_graphs  # noqa: E402

# ../shared beside the checkout (/work/main), or beside the worktrees' folder (/work/wt/NAME).
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DEFAULT_DATA = next((p for p in (os.path.join(_ROOT, *up, "shared", "data", "h100_kernels") for up in (("..",), ("..", "..")))
                     if os.path.isdir(p)), os.path.join(_ROOT, "..", "shared", "data", "h100_kernels"))
_LAYOUT = frozenset({"parameter", "constant", "bitcast", "reshape", "broadcast", "transpose", "copy", "tuple",
                     "get-tuple-element", "convert", "iota", "bitcast-convert", "slice", "concatenate", "pad"})
_NO_KERNEL = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
                        "call", "after-all", "opt-barrier", "optimization-barrier", "partition-id", "replica-id"})


def read_records(data: str) -> list[dict[str, Any]]:
    with gzip.open(os.path.join(data, "per_instruction.jsonl.gz"), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def measured_ms(rec: dict[str, Any]) -> float:
    a = sum(k["ns_per_step"] for k in rec["kernels_trace_a"])
    b = sum(k["ns_per_step"] for k in rec["kernels_trace_b"])
    return (a + b) / 2 / 1e6


def compiled_signatures(text: str) -> list[tuple]:
    """One signature per kernel-launching instruction of the compiled module's entry."""
    module = parse_module(text)
    comps = {c.name: c for c in module.computations}
    out = []
    for ins in module.entry.instructions:
        if ins.opcode in _NO_KERNEL:
            continue
        if ins.opcode == "custom-call":
            out.append(("matrix", ins.arrays[0].elements if ins.arrays else 0))
            continue
        if ins.opcode != "fusion":
            out.append((ins.opcode, ins.arrays[0].elements if ins.arrays else 0))
            continue
        body = [x for c in ins.called if c in comps for x in comps[c].instructions]
        ops = [x.opcode for x in body]
        if "dot" in ops or "convolution" in ops:
            out.append(("matrix", max(a.elements for a in ins.arrays)))
            continue
        compute = tuple(sorted(op for op in ops if op not in _LAYOUT))
        big = max((a.elements for x in body if x.opcode not in ("parameter", "constant") for a in x.arrays), default=0)
        out.append(("fusion", compute, big))
    return out


def emulated_signatures(graph: HloGraph, kernels: list[tuple[str, ...]]) -> list[tuple]:
    index = graph.index()
    out = []
    for names in kernels:
        nodes = [graph.nodes[index[n]] for n in names]
        mats = [n for n in nodes if n.opcode in ("dot", "convolution")]
        if mats:
            out.append(("matrix", max(n.out_elements for n in mats)))
        elif len(nodes) == 1 and nodes[0].opcode in ("copy", "scatter", "sort", "custom-call", "select-and-scatter"):
            out.append((nodes[0].opcode, nodes[0].out_elements))
        else:
            out.append(("fusion", tuple(sorted(n.opcode for n in nodes if n.opcode not in _LAYOUT)),
                        max(n.out_elements for n in nodes)))
    return out


def _record_graph(rec: dict[str, Any], cache: str | None) -> HloGraph:
    if cache is None:
        return HloGraph.from_hlo_text(rec["pre_optimization_hlo"])
    import pickle

    path = os.path.join(cache, f"{rec['model']}_{rec['preset']}.graph.pkl")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    graph = HloGraph.from_hlo_text(rec["pre_optimization_hlo"])
    os.makedirs(cache, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(graph, f)
    return graph


def fusion_match(rec: dict[str, Any], cache: str | None = None) -> dict[str, Any]:
    graph = _record_graph(rec, cache)
    sim = Simulator(graph, device_costs.analytic("h100"), dcluster.preset("h100-1"))
    kernels = [k for k in sim.fusions(baselines.make("xla_default", graph))
               if not any(graph.nodes[graph.index()[n]].opcode == "while" for n in k)]
    emu = collections.Counter(emulated_signatures(graph, kernels))
    comp = collections.Counter(compiled_signatures(rec["compiled_hlo"]))
    n_emu, n_comp = sum(emu.values()), sum(comp.values())
    exact = sum((emu & comp).values())
    mat_e = sum(v for k, v in emu.items() if k[0] == "matrix")
    mat_c = sum(v for k, v in comp.items() if k[0] == "matrix")
    mat_x = sum(v for k, v in (emu & comp).items() if k[0] == "matrix")
    return {"model": rec["model"], "preset": rec["preset"], "compiled": n_comp, "emulated": n_emu,
            "ratio": n_emu / n_comp if n_comp else float("nan"), "exact": exact / n_comp if n_comp else 0.0,
            "matrix_compiled": mat_c, "matrix_emulated": mat_e, "matrix_exact": mat_x,
            "fusion_exact": (exact - mat_x) / max(1, n_comp - mat_c)}


def _costs(name: str):
    """The model ``name`` prices H100 kernels with (``gnn`` registered here, as the CLI does)."""
    from gnn.registration import ENTRY

    registry.register(ENTRY)
    return registry.make(name, device="h100")


def prediction(rec: dict[str, Any], graph: HloGraph, cost_model: str) -> dict[str, Any]:
    sim = Simulator(graph, _costs(cost_model), dcluster.preset("h100-1"))
    res = sim.result(baselines.make("xla_default", graph))
    meas = measured_ms(rec)
    pred = res.step_time * 1e3
    return {"model": rec["model"], "preset": rec["preset"], "measured_ms": meas, "predicted_ms": pred,
            "error": pred / meas - 1.0, "cost_model": sim.costs.name}


class _Recorder:
    """Wraps the H100 analytic model and keeps the terms (the fit's features) of each priced kernel
    made of ``graph``'s own nodes (a loop body's kernels, priced once per loop, are left to the caller)."""

    def __init__(self, graph: HloGraph) -> None:
        self.model = device_costs.analytic("h100")
        self.kernels: list[device_costs.KernelTerms] = []
        self._own = {id(n) for n in graph.nodes}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def kernel_time(self, kernel) -> float:
        t = self.model.terms(kernel)
        if kernel.nodes and id(kernel.nodes[0]) in self._own and (t.launches or t.copy_launches):
            self.kernels.append(t)
        return self.model.kernel_time(kernel)


def record_terms(graph: HloGraph, times: int = 1) -> list[tuple[int, device_costs.KernelTerms]]:
    """(executions per step, terms) of every emulated kernel of xla_default; a while loop's kernels
    execute once per iteration (once if the count is unknown), those of the graphs the simulator
    prices a GPU iteration with (``disco.sim.simulator.iteration_graphs``)."""
    rec = _Recorder(graph)
    Simulator(graph, rec, dcluster.preset("h100-1")).result(baselines.make("xla_default", graph))
    out = [(times, t) for t in rec.kernels]
    for loop in graph.loops:
        trips = 1 if loop.trip_count is None else loop.trip_count
        for part in iteration_graphs(loop, gpu=True):
            out += record_terms(part, times * trips)
    return out


# The forms --fit knows. Each: features of one kernel's terms given a knee, the knees to try, the
# lower bounds of the coefficients, and the SummedConfig fields from the coefficients and the knee.
# v1: launch + dot/dot_rate + conv/conv_rate + bytes/bandwidth (non-negative least squares).
# v2 (shipped): data-movement kernels' own launch, a dot rate that rises beyond a knee of dot flops
# per kernel, matrix rates bounded by the TF32 peak.
_KNEES = (1e9, 3e9, 1e10, 2e10, 3e10, 5e10, 1e11)


def _features(form: str, t: device_costs.KernelTerms, knee: float) -> list[float]:
    if form == "v1":
        return [t.launches + t.copy_launches, t.dot_flops, t.conv_flops, t.nbytes]
    return [t.launches, t.copy_launches, min(t.dot_flops, knee), max(t.dot_flops - knee, 0.0), t.conv_flops,
            t.nbytes]


def _config(form: str, theta, knee: float) -> dict[str, float]:
    def rate(x: float) -> float:
        return 1 / x if x > 0 else float("inf")
    if form == "v1":
        return {"launch": theta[0], "dot_rate": rate(theta[1]), "conv_rate": rate(theta[2]),
                "bandwidth": rate(theta[3])}
    return {"launch": theta[0], "copy_launch": theta[1], "dot_rate": rate(theta[2]), "dot_knee": knee,
            "dot_rate_large": rate(theta[3]), "conv_rate": rate(theta[4]), "bandwidth": rate(theta[5])}


def fit(rows: list[tuple[str, list[tuple[int, device_costs.KernelTerms]], float]], form: str = "v2") -> dict[str, Any]:
    """Least squares of relative errors, (model, kernel terms, measured s) -> the form's SummedConfig
    fields, with in-sample and leave-one-model-out (refit without the model's records) errors per row.

    Raises:
      ValueError: for an unknown form.
    """
    import numpy as np
    from scipy.optimize import lsq_linear

    if form not in ("v1", "v2"):
        raise ValueError(f"form {form!r}: expected 'v1' or 'v2'")
    knees = (float("inf"),) if form == "v1" else _KNEES
    inv_peak = 1 / device_costs.H100_TF32_PEAK
    lower = np.zeros(4) if form == "v1" else np.array([0, 0, inv_peak, inv_peak, inv_peak, 0])
    y = np.array([m for _, _, m in rows])
    feats = {k: np.array([np.sum([e * np.array(_features(form, t, k)) for e, t in terms], axis=0)
                          for _, terms, _ in rows]) for k in knees}

    def solve(idx):
        best = None
        for k in knees:
            a = feats[k][idx] / y[idx, None]
            theta = lsq_linear(a, np.ones(len(idx)), bounds=(lower, np.inf)).x
            loss = float(np.sum((a @ theta - 1) ** 2))
            if best is None or loss < best[0]:
                best = (loss, k, theta)
        return best[1], best[2]

    everything = np.arange(len(rows))
    knee, theta = solve(everything)
    out: dict[str, Any] = {"form": form, **_config(form, theta, knee), "rows": []}
    models = [m for m, _, _ in rows]
    lomo = {m: solve(np.array([i for i in everything if models[i] != m])) for m in sorted(set(models))}
    for i, m in enumerate(models):
        k, th = lomo[m]
        out["rows"].append({"model": m, "in_sample": float(feats[knee][i] @ theta / y[i] - 1),
                            "leave_one_model_out": float(feats[k][i] @ th / y[i] - 1)})
    return out


def _zoo_graph(model: str, preset: str) -> HloGraph:
    import trax_models
    from disco.ir import extractor

    step, args = trax_models.make_train_step(model, preset=preset, devices=1, optimizer="adamw")
    return HloGraph.from_hlo_text(extractor.hlo_text(step, *args))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--preset", default="paper", help="paper | small | all (default paper)")
    ap.add_argument("--zoo", action="store_true", help="extract graphs from the zoo here for the prediction table")
    ap.add_argument("--cost-model", default="analytic,gnn",
                    help="comma list of registry names or saved models (default analytic,gnn)")
    ap.add_argument("--fit", action="store_true", help="fit the H100 analytic model to the default records and stop")
    ap.add_argument("--form", default="v2", choices=("v1", "v2"),
                    help="with --fit, the model's form: v1 (4 parameters, before 2026-11-23's form change) "
                         "or v2 (shipped; device_costs.SummedCosts)")
    ap.add_argument("--no-loops", action="store_true",
                    help="with --fit, leave out the records whose graphs hold while loops (rnnlm), as the "
                         "interim model of 2026-11-23 was fitted; the shipped constants keep them")
    ap.add_argument("--cache", default=None, help="a directory to keep parsed graphs in (pickles)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.fit:
        recs = [r for r in read_records(args.data) if r["variant"] == "default"]
        graphs = [_record_graph(r, args.cache) for r in recs]
        keep = [(r, g) for r, g in zip(recs, graphs)
                if not args.no_loops or not any(n.opcode == "while" for n in g.nodes)]
        recs = [r for r, _ in keep]
        rows = [(r["model"], record_terms(g), measured_ms(r) / 1e3) for r, g in keep]
        res = fit(rows, args.form)
        print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
        for (model, _, _), r, rec in zip(rows, res["rows"], recs):
            print(f"{model:15s} {rec['preset']:6s} in-sample {r['in_sample']:+.1%}  "
                  f"leave-one-model-out {r['leave_one_model_out']:+.1%}")
        for preset in sorted({rec["preset"] for rec in recs}):
            sel = [r for r, rec in zip(res["rows"], recs) if rec["preset"] == preset]
            ins = [abs(r["in_sample"]) for r in sel]
            out = [abs(r["leave_one_model_out"]) for r in sel]
            print(f"preset {preset}: in-sample {sum(e <= 0.10 for e in ins)}/{len(ins)} within 10%, mean |error| "
                  f"{sum(ins) / len(ins):.1%}; leave-one-model-out {sum(e <= 0.10 for e in out)}/{len(out)}, "
                  f"mean |error| {sum(out) / len(out):.1%}")
        return 0
    recs = [r for r in read_records(args.data) if r["variant"] == "default"
            and (args.preset == "all" or r["preset"] == args.preset)]
    match = [fusion_match(r, args.cache) for r in recs]
    names = [n.strip() for n in args.cost_model.split(",") if n.strip()]
    preds = []
    for r in recs:
        graph = _zoo_graph(r["model"], r["preset"]) if args.zoo else _record_graph(r, args.cache)
        preds += [{**prediction(r, graph, name), "cost_model_arg": name} for name in names]
    if args.json:
        print(json.dumps({"fusion_match": match, "prediction": preds}, indent=1))
        return 0
    print("| model | preset | compiled kernels | emulated kernels | ratio | exact (all) | matrix compiled/emulated/exact | exact (non-matrix) |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for m in match:
        print(f"| {m['model']} | {m['preset']} | {m['compiled']} | {m['emulated']} | {m['ratio']:.2f} | "
              f"{m['exact']:.0%} | {m['matrix_compiled']}/{m['matrix_emulated']}/{m['matrix_exact']} | "
              f"{m['fusion_exact']:.0%} |")
    print()
    print("| model | preset | measured ms (GPU) | " + " | ".join(f"{n} ms (simulated) | {n} error" for n in names) + " |")
    print("|---|---|---:|" + "---:|---:|" * len(names))
    for i in range(0, len(preds), len(names)):
        row = preds[i:i + len(names)]
        print(f"| {row[0]['model']} | {row[0]['preset']} | {row[0]['measured_ms']:.3f} | "
              + " | ".join(f"{p['predicted_ms']:.3f} | {p['error']:+.1%}" for p in row) + " |")
    print()
    for n in names:
        errs = [abs(p["error"]) for p in preds if p["cost_model_arg"] == n]
        print(f"{n} ({preds[names.index(n)]['cost_model']}): {sum(e <= 0.10 for e in errs)}/{len(errs)} within 10%, "
              f"mean |error| {sum(errs) / len(errs):.1%}, worst {max(errs):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

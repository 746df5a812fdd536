"""Applies bucket, cut and compile-option plans on a real GPU (a manual check: CI has no GPU).

    python scripts/tools/check_gpu.py [--models transformer_lm,resnet50] [--preset paper] [--out DIR]
        [--only ROWS] [--precision highest] [--deterministic-ops] [--numerics-steps N] [--dump-modules]

Runs with the jax the machine has (the GPU image's 0.11.2) and no extra flags. Per model, on
one device, through ``xla_hooks.apply`` exactly as a user's step gets them:

* ``xla_default``, and ``xla_default_rt`` (the same module through disco's HLO-text path: the
  reference for counting fusions, and a second compile of the same program for the noise);
* bucket plans ``per_tensor`` and ``ddp``, and ``ddp+lhs`` (ddp's buckets with the latency-hiding
  scheduler on: the GPU search's ``+lhs`` start plans combine the two);
* ``cuts``: two cuts, each between an elementwise producer and its only user inside one
  fusion of the simulator's emulation (the barrier splits a fusion on XLA:GPU);
* compile options: the ``xla_tuned`` sweep (JAX-Toolbox: latency-hiding scheduler on, the
  all-reduce combine threshold by powers of two from 16 MiB); ``xla_o1`` (jax's optimization level
  O1: ``disco.plans.baselines``); ``pipelined_all_reduce``
  (``xla_gpu_enable_pipelined_all_reduce``, not in disco's option table: jax 0.11.2's GPU
  compile rejected it) only with ``--pipelined``;
* ``groups``: a random plan with fusion groups, which must be refused up front on GPU;
* ``auto_pgle``: jax's automatic profile-guided latency estimator (``JAX_ENABLE_PGLE=1``), compiled
  after ``--pgle-runs`` profiled runs of XLA's default (:func:`xla_hooks.pgle.compile_auto_pgle`).

``--only ROWS`` keeps only those rows (comma list; ``xla_tuned`` names the whole sweep) beside the
two references, to fit a short GPU lease; ``scripts/tools/gpu_truth.py`` runs it that way.

Reports per plan: applied or fell back (with the reason), compiled fusion and all-reduce
counts, step-time medians over interleaved rounds, and its numbers after 3 SGD steps
(``--numerics-steps``) against two references, ``xla_default`` and ``xla_default_rt``: the largest relative leaf error and the
tolerance ratio, the largest abs error over the test suite's allowance (``tests/support/equivalence.py``:
max |a - b| <= 1e-5 * max |b| + 1e-7, so <= 1 is within tolerance), with its leaf. A GPU's
reference moves by itself, so per model it also reports the same program's spread (ratio of
xla_default's executable run twice, and of its recompile); a plan counts as changing the numbers
only when it is outside the tolerance against both references by more than 10x that spread.
``--precision highest`` (no TF32) and ``--deterministic-ops`` remove those sources of spread.
One GPU has no collectives to overlap: what it shows of cuts and options is their compute-side
effect only. Writes ``gpu_check.json``; exits 1 on a fallback other than the refused groups, or
on numbers changed beyond the spread. Prints a table of every row at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

RTOL, FLOOR = 1e-5, 1e-7  # tests/support/equivalence.py's assert_close
# A plan's numbers count as changed only when its tolerance ratio exceeds this many times the same
# program's own (run twice, or recompiled): on a GPU the reference itself moves (autotuned GEMM and
# convolution algorithms, TF32, atomics); on CPU the text path's recompile can fuse differently.
SPREAD_FACTOR = 10.0
# Cut ends: elementwise ops, which XLA fuses producer-into-consumer on CPU and GPU (the CPU
# emulation also fuses a reduce into its consumer, which XLA does not: such a cut splits nothing).
# The rows --only may name (beside the references xla_default and xla_default_rt); xla_tuned: the sweep.
ROWS = ("per_tensor", "ddp", "ddp+lhs", "cuts", "xla_tuned", "xla_o1", "pipelined_all_reduce", "groups", "auto_pgle")
# Rows refused off a GPU (with their reasons) in a --allow-cpu dry run: XLA:CPU has no O1 passes, and no
# PGLE profile without device kernels.
CPU_REFUSED = ("xla_o1", "auto_pgle")
ELEMENTWISE = frozenset({"add", "subtract", "multiply", "divide", "exponential", "tanh", "negate", "maximum",
                         "minimum", "sqrt", "rsqrt", "log", "select", "compare", "convert", "abs", "power"})


def effective_cuts(graph, sim, k: int = 2) -> list[tuple[str, str]]:
    """``k`` cuts, each inside a different emulated fusion, between an elementwise producer and its
    only (elementwise) user."""
    from disco.plans import moves
    from disco.plans.plan import FusionPlan

    kernel_of = {m: ki for ki, kern in enumerate(sim.fusions(FusionPlan())) for m in kern}
    users: dict[int, set[int]] = {}
    for s, d in graph.edges:
        users.setdefault(s, set()).add(d)
    out, used = [], set()
    for p, c in moves.context(graph).cut_edges:
        pn, cn = graph.nodes[p].name, graph.nodes[c].name
        kp = kernel_of.get(pn)
        if (kp is not None and kp == kernel_of.get(cn) and kp not in used and users.get(p) == {c}
                and graph.nodes[p].opcode in ELEMENTWISE and graph.nodes[c].opcode in ELEMENTWISE):
            used.add(kp)
            out.append((pn, cn))
            if len(out) == k:
                break
    return out


def leaf_errors(final, ref) -> list[dict]:
    """Per leaf of two pytrees of one structure: its path, max |a - b|, max |b| (its scale), the
    relative error (abs error over scale; the abs error where the scale is 0) and the tolerance ratio,
    abs error over the test suite's allowance (``tests/support/equivalence.py``: 1e-5 * scale + 1e-7; within
    tolerance iff <= 1)."""
    import jax
    import numpy as np

    out = []
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(final), jax.tree.leaves(ref), strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = float(np.max(np.abs(a64 - b64), initial=0.0))
        scale = float(np.max(np.abs(b64), initial=0.0))
        out.append({"leaf": jax.tree_util.keystr(path), "abs_err": err, "scale": scale,
                    "rel_err": err / scale if scale > 0 else err, "tol_ratio": err / (RTOL * scale + FLOOR)})
    return out


def numerics(final, ref) -> dict:
    """One row's numbers against a reference: the largest relative leaf error, the largest tolerance
    ratio and its leaf (the leaf furthest outside, or least inside, the test tolerance), whether
    every leaf is within the tolerance, and how many are not. A leaf whose true gradient is zero
    (attention key biases) has a relative error near 1-2 from rounding alone but a tiny ratio."""
    errs = leaf_errors(final, ref)
    worst = max(errs, key=lambda e: e["tol_ratio"], default=None)
    ratio = worst["tol_ratio"] if worst else 0.0
    return {"max_rel_leaf_err": max((e["rel_err"] for e in errs), default=0.0), "tolerance_ratio": ratio,
            "worst_leaf": None if not ratio else {k: worst[k] for k in ("leaf", "abs_err", "scale")},
            "within_test_tolerance": ratio <= 1.0,
            "leaves_outside_tolerance": sum(e["tol_ratio"] > 1.0 for e in errs)}


def changed_beyond_spread(rows: dict, spread: float) -> list[str]:
    """The applied plans whose numbers are outside the test tolerance against both references
    (``xla_default`` and its recompile through disco's text path, ``xla_default_rt``, the path
    every plan takes) by more than ``SPREAD_FACTOR`` times the same program's own spread."""
    bar = max(1.0, SPREAD_FACTOR * spread)
    return [name for name, row in rows.items() if row["applied"]
            and min(row["vs_xla_default"]["tolerance_ratio"], row["vs_xla_default_rt"]["tolerance_ratio"]) > bar]


def row_names(names: list[str], only: set[str] | None) -> list[str]:
    """``names`` kept by ``--only`` (``xla_tuned`` keeps the whole sweep); all of them without it."""
    if only is None:
        return names
    return [n for n in names if n in only or ("xla_tuned" in only and n.startswith("xla_tuned_"))]


def check_model(model: str, preset: str, rounds: int, steps: int, pipelined: bool = False,
                only: set[str] | None = None, pgle_runs: int = 3, numerics_steps: int = 3,
                dump_modules: Path | None = None) -> dict:
    import jax
    import numpy as np

    import disco
    import trax_models
    from disco.bench import compiled_counts
    from disco.plans import baselines
    from disco.plans import options as plan_options
    from disco.plans.plan import FusionPlan
    from disco.plans.random_plans import random_plan
    from disco.sim.cluster import preset as cluster_preset
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator
    from xla_hooks import apply_plan, measure, pgle

    t0 = time.perf_counter()
    step, example = trax_models.make_train_step(model, preset, devices=1, optimizer="sgd")
    graph = disco.extract(step, *example)
    sim = Simulator(graph, AnalyticCosts(), cluster_preset("local", devices=1))
    plans = {"xla_default": FusionPlan(name="xla_default"),
             "per_tensor": baselines.make("per_tensor", graph),
             "ddp": baselines.make("ddp", graph)}
    plans["ddp+lhs"] = plans["ddp"].replace(compile_options=((plan_options.SCHEDULER, "True"),), name="ddp+lhs")
    cuts = effective_cuts(graph, sim)
    plans["cuts"] = FusionPlan(cuts=tuple(cuts), name="cuts")
    plans.update(baselines.xla_tuned_sweep(graph))
    plans["xla_o1"] = baselines.make("xla_o1", graph)
    if pipelined:
        plans["pipelined_all_reduce"] = FusionPlan(
            compile_options=((plan_options.PIPELINED_ALL_REDUCE, "True"),), name="pipelined_all_reduce")
    plans["groups"] = random_plan(graph, 0, buckets=False).replace(name="groups")
    plans[pgle.NAME] = None  # not a plan: compiled by xla_hooks.pgle
    kept = ["xla_default", *row_names(list(plans)[1:], only)]
    plans = {name: plans[name] for name in kept}

    def three_steps(fn):  # numerics_steps SGD steps (3 unless --numerics-steps says otherwise)
        state, batch = example
        for _ in range(numerics_steps):
            state, _ = fn(state, batch)
        return jax.tree.map(np.asarray, state)

    rows, fns, refs, spread = {}, {}, {}, {}
    roundtrip = apply_plan.compile_plan(FusionPlan(name="xla_default_rt"), step, *example, roundtrip=True)
    names = list(plans)  # xla_default first; its recompile second, so every later row has both references
    entries = [(names[0], None), ("xla_default_rt", roundtrip)] + [(name, None) for name in names[1:]]
    for name, applied in entries:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if applied is None and name == pgle.NAME:
                applied = pgle.compile_auto_pgle(step, *example, runs=pgle_runs, allow_cpu=True)
            elif applied is None:
                applied = apply_plan.apply(plans[name], step, *example)
        fusions, all_reduces = compiled_counts(applied.compiled_text())
        if dump_modules is not None:  # the module the device built, to diff two rows' (autotuning choices too)
            import gzip

            dump_modules.mkdir(parents=True, exist_ok=True)
            with gzip.open(dump_modules / f"{model}_{name}.hlo.txt.gz", "wt") as f:
                f.write(applied.compiled_text())
        final = three_steps(applied)
        if name == "xla_default":  # the reference, and its own spread: one executable run twice
            refs[name] = final
            spread["same_executable"] = numerics(three_steps(applied), final)["tolerance_ratio"]
        elif name == "xla_default_rt":
            refs[name] = final
        vs = {ref: numerics(final, refs[ref]) for ref in refs}
        if name == "xla_default_rt":
            spread["recompiled"] = vs["xla_default"]["tolerance_ratio"]
        row = {"applied": applied.applied, "fallback_reason": applied.fallback_reason,
               "compile_options": dict(applied.requested.compile_options),
               "cuts": len(applied.requested.cuts),
               "buckets": None if applied.requested.buckets is None else len(applied.requested.buckets),
               "groups": len(applied.requested.groups),
               "compiled_fusions": fusions, "compiled_all_reduces": all_reduces,
               **{f"vs_{ref}": v for ref, v in vs.items()},
               "warnings": [str(w.message)[:300] for w in caught]}
        rows[name] = row
        if applied.applied:
            fns[name] = applied
        print(model, name, json.dumps(row), flush=True)
    beyond = changed_beyond_spread({n: r for n, r in rows.items() if not n.startswith("xla_default")},
                                   max(spread.values()))
    print(f"{model} numerics: the same program's spread (tolerance ratio: 1 = the test tolerance) run twice "
          f"{spread['same_executable']:.3g}, recompiled {spread['recompiled']:.3g}; plans outside the tolerance "
          f"against both and over {SPREAD_FACTOR:g}x that spread: {beyond or 'none'}", flush=True)
    times = measure.measure_interleaved(fns, example, rounds=rounds, steps=steps)
    base = times["xla_default"]
    for name, m in times.items():
        rows[name].update({"median_ms": m.median * 1e3, "min_ms": m.min * 1e3, "max_ms": m.max * 1e3,
                           "paired_speedup_vs_xla_default": measure.paired_speedup(base, m)})
        print(f"{model} {name}: {m.median * 1e3:.3f} ms ({m.min * 1e3:.3f}-{m.max * 1e3:.3f}), "
              f"x{measure.paired_speedup(base, m):.3f} vs xla_default", flush=True)
    return {"model": model, "preset": preset, "nodes": len(graph.nodes), "cuts": cuts,
            "gradient_bytes": sum(n.grad_bytes for n in graph.all_reduces()), "plans": rows,
            "same_program_spread": spread, "beyond_spread": beyond,
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer_lm")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="gpu_check")
    ap.add_argument("--pipelined", action="store_true", help="also try xla_gpu_enable_pipelined_all_reduce")
    ap.add_argument("--allow-cpu", action="store_true", help="run on CPU (a dry run of the script itself)")
    ap.add_argument("--precision", choices=("default", "high", "highest"), default="default",
                    help="jax_default_matmul_precision for every plan ('highest': no TF32 in dots and "
                         "convolutions, to tell a plan's effect on the numbers from TF32's)")
    ap.add_argument("--deterministic-ops", action="store_true",
                    help="XLA_FLAGS += --xla_gpu_exclude_nondeterministic_ops=true (deterministic scatter, "
                         "GEMM and convolution algorithms; XLA refuses select-and-scatter then)")
    ap.add_argument("--only", default=None, metavar="ROWS",
                    help=f"comma list of the rows to measure beside xla_default and xla_default_rt, of: "
                         f"{', '.join(ROWS)}, or one threshold of the sweep, e.g. xla_tuned_16mb (default: all)")
    ap.add_argument("--pgle-runs", type=int, default=3, help="auto_pgle's profiled runs (jax's default 3)")
    ap.add_argument("--numerics-steps", type=int, default=3,
                    help="SGD steps before each row's numbers are compared (default 3)")
    ap.add_argument("--dump-modules", action="store_true",
                    help="write each row's compiled module to OUT/modules/<model>_<row>.hlo.txt.gz")
    args = ap.parse_args(argv)
    if args.numerics_steps < 1:
        ap.error(f"--numerics-steps: expected an int >= 1, got {args.numerics_steps}")
    only = None if args.only is None else {r.strip() for r in args.only.split(",") if r.strip()}
    if only is not None and (not only or {r for r in only if r not in ROWS and not re.fullmatch(r"xla_tuned_\d+mb", r)}):
        ap.error(f"--only {args.only!r}: expected a comma list of {', '.join(ROWS)} (or one xla_tuned_<N>mb)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.deterministic_ops:  # read when the backend starts: before jax is imported
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_exclude_nondeterministic_ops=true").strip()

    import jax

    if args.precision != "default":
        jax.config.update("jax_default_matmul_precision", args.precision)

    from xla_hooks import _jax_private

    report: dict = {"jax": jax.__version__, "jaxlib": __import__("jaxlib").__version__,
                    "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
                    "tested_jax_versions": list(_jax_private.TESTED_JAX_VERSIONS),
                    "precision": args.precision, "xla_flags": os.environ.get("XLA_FLAGS", ""), "models": []}
    print(json.dumps({k: report[k] for k in ("jax", "jaxlib", "backend", "devices")}), flush=True)
    if jax.default_backend() != "gpu" and not args.allow_cpu:
        print("no GPU backend: nothing to check", file=sys.stderr)
        return 2
    gpu = jax.default_backend() == "gpu"
    failed = []
    for model in [m for m in args.models.split(",") if m]:
        res = check_model(model, args.preset, args.rounds, args.steps, args.pipelined, only, args.pgle_runs,
                          args.numerics_steps, out / "modules" if args.dump_modules else None)
        report["models"].append(res)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
        for name, row in res["plans"].items():
            reason = row["fallback_reason"]
            if name == "groups" and gpu:  # validation refuses fusion groups on GPU: anything else is news
                if row["applied"] or "fusion group" not in str(reason):
                    failed.append(f"{model}/groups: expected refused on GPU, got "
                                  + ("applied" if row["applied"] else f"a fallback: {reason}"))
            elif not row["applied"] and not (not gpu and name in CPU_REFUSED):
                failed.append(f"{model}/{name}: fell back: {reason}")  # on CPU groups apply like every other plan
        failed += [f"{model}/{name}: numbers changed beyond the same program's spread: {res['plans'][name]['vs_xla_default']['worst_leaf']}"
                   for name in res["beyond_spread"]]
    print_table(report)
    print("unexpected (a fallback, groups not refused on GPU, or numbers changed):", failed or "none", flush=True)
    return 1 if failed else 0


def print_table(report: dict) -> None:
    """One markdown row per model and plan: applied, fusions, all-reduces, step time, speedup, numbers."""
    print(f"\n{report['backend']} {report['devices'][:1]}, jax {report['jax']}, precision {report['precision']}, "
          f"XLA_FLAGS {report['xla_flags'] or '-'}\n")
    print("| model | plan | applied | fusions | all-reduces | median ms (min-max) | x vs xla_default | "
          "tolerance ratio vs xla_default / vs rt |")
    print("|---|---|---|---:|---:|---|---:|---|")
    for res in report["models"]:
        for name, row in res["plans"].items():
            t = (f"{row['median_ms']:.3f} ({row['min_ms']:.3f}-{row['max_ms']:.3f})" if "median_ms" in row else "-")
            x = f"{row['paired_speedup_vs_xla_default']:.3f}" if "paired_speedup_vs_xla_default" in row else "-"
            tol = " / ".join(f"{row[k]['tolerance_ratio']:.3g}" if k in row else "-"
                             for k in ("vs_xla_default", "vs_xla_default_rt"))
            print(f"| {res['model']} | {name} | {'yes' if row['applied'] else 'no: ' + str(row['fallback_reason'])[:60]} | "
                  f"{row['compiled_fusions']} | {row['compiled_all_reduces']} | {t} | {x} | {tol} |")
        print(f"| {res['model']} | (same program's spread: run twice {res['same_program_spread']['same_executable']:.3g}, "
              f"recompiled {res['same_program_spread']['recompiled']:.3g}) | | | | | | |")


if __name__ == "__main__":
    sys.exit(main())

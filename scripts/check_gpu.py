"""Checks disco's XLA:GPU assumptions on a real GPU (a manual check: CI has no GPU).

    python scripts/check_gpu.py [--model mlp] [--preset tiny] [--out DIR] [--allow-untested-jax]

1. Pass names: compiles the zoo step on the GPU in a child process with XLA's pass-pipeline log
   on and lists every HLO pass it ran; reports whether each pass name that ``disco.plans.plan``
   disables on GPU (``FusionPlan.disabled_passes("gpu")``) is one of them. XLA ignores a
   disabled name it does not know, so a wrong name fails silently: this is the check.
2. Compile options: whether the GPU compile accepts the options a plan sets.
3. Plans on the GPU: applies xla_default, per_tensor, ddp and random plans with fusion groups
   through ``xla_hooks.apply`` and reports applied / fell back (with the reason), compiled
   fusion and all-reduce counts, the largest per-leaf difference from xla_default after 3 SGD
   steps, and step-time medians (interleaved rounds).

The XLA hooks are tested with the pinned jax only; ``--allow-untested-jax`` widens
``xla_hooks._jax_private.TESTED_JAX_VERSIONS`` for this process so the rewrite path is tried
(it is said in the output). Writes ``gpu_check.json`` (and the raw pass log) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import sys, jax, trax_models
step, args = trax_models.make_train_step(sys.argv[1], sys.argv[2], devices=1, optimizer="sgd")
jax.jit(step).lower(*args).compile()
"""


def pass_names(model: str, preset: str, log_path: Path) -> list[str]:
    """HLO passes a default GPU compile of the step runs, from XLA's pipeline log (child process)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_MAX_VLOG_LEVEL="0",
               TF_CPP_VMODULE="hlo_pass_pipeline=1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, model, preset], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    log_path.write_text(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the pass-listing compile failed (rc {proc.returncode}); see {log_path}")
    names = re.findall(r"HLO pass ([\w\-.<>]+)", proc.stderr)
    return list(dict.fromkeys(n for n in names if n != "pipeline"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--random", type=int, default=3, help="random plans with fusion groups to apply")
    ap.add_argument("--out", default="gpu_check")
    ap.add_argument("--allow-untested-jax", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import jax
    import numpy as np

    import disco
    import trax_models
    from disco import bench
    from disco.plans import baselines
    from disco.plans.random_plans import random_plan
    from xla_hooks import _jax_private, apply_plan, measure

    report: dict = {"jax": jax.__version__, "backend": jax.default_backend(),
                    "devices": [str(d) for d in jax.devices()], "model": args.model, "preset": args.preset}
    print(json.dumps({k: report[k] for k in ("jax", "backend", "devices")}), flush=True)
    if jax.default_backend() != "gpu":
        print("no GPU backend: nothing to check", file=sys.stderr)
        return 2
    if args.allow_untested_jax and jax.__version__ not in _jax_private.TESTED_JAX_VERSIONS:
        _jax_private.TESTED_JAX_VERSIONS = (*_jax_private.TESTED_JAX_VERSIONS, jax.__version__)
        report["untested_jax_allowed"] = True
        print(f"NOTE: jax {jax.__version__} is untested; the rewrite path is tried anyway", flush=True)

    # 1. pass names
    ran = pass_names(args.model, args.preset, out / "gpu_pass_log.txt")
    wanted = sorted(set(disco.FusionPlan(xla_fusion="off", groups=(), buckets=None).disabled_passes("gpu"))
                    | set(disco.FusionPlan(buckets=()).disabled_passes("gpu")))
    report["passes_run"] = ran
    report["disabled_names"] = {n: n in ran for n in wanted}
    print("GPU pipeline ran", len(ran), "distinct passes; disco's GPU names:", report["disabled_names"], flush=True)
    report["fusion_like_passes_run"] = [n for n in ran if "fusion" in n or "combiner" in n or "reshape" in n]
    print("fusion/combiner/reshape passes run:", report["fusion_like_passes_run"], flush=True)

    # 2 + 3. plans on the GPU
    step, example = trax_models.make_train_step(args.model, args.preset, devices=1, optimizer="sgd")
    graph = disco.extract(step, *example)
    plans = {n: baselines.make(n, graph) for n in ("xla_default", "per_tensor", "ddp")}
    for seed in range(args.random):
        plans[f"random_{seed}"] = random_plan(graph, seed, buckets=False)
    rows, fns = {}, {}
    import warnings

    def three_steps(fn):
        state, batch = example
        for _ in range(3):
            state, _ = fn(state, batch)
        return jax.tree.map(np.asarray, state)

    ref = None
    for name, plan in plans.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            applied = apply_plan.apply(plan, step, *example)
        compiled_text = applied.compiled_text()
        fusions, all_reduces = bench.compiled_counts(compiled_text)
        # planned fused computations are named disco.fused_computation.<k> by the rewrite
        planned_left = len(set(re.findall(r"disco\.fused_computation\.\d+", compiled_text)))
        final = three_steps(applied)
        if ref is None:
            ref = final
        err = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0)
                        / max(float(np.max(np.abs(np.asarray(b, np.float64)), initial=0.0)), 1e-30))
                  for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(ref), strict=True))
        rows[name] = {"groups": len(plan.groups), "xla_fusion": plan.xla_fusion,
                      "buckets": None if plan.buckets is None else len(plan.buckets),
                      "applied": applied.applied, "fallback_reason": applied.fallback_reason,
                      "warnings": [str(w.message)[:300] for w in caught],
                      "compiled_fusions": fusions, "compiled_all_reduces": all_reduces,
                      "planned_computations_in_compiled": planned_left,
                      "max_rel_leaf_diff_vs_xla_default": err}
        fns[name] = applied
        print(name, json.dumps(rows[name]), flush=True)
    times = measure.measure_interleaved(fns, example, rounds=args.rounds, steps=5)
    for name, m in times.items():
        rows[name].update({"median_ms": m.median * 1e3, "min_ms": m.min * 1e3, "max_ms": m.max * 1e3})
        print(f"{name}: {m.median * 1e3:.3f} ms ({m.min * 1e3:.3f}-{m.max * 1e3:.3f})", flush=True)
    report["plans"] = rows
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

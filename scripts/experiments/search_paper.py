"""Search speed on the paper presets' HLO (compile-only sizes): graph size, setup, evals/s.

    python scripts/experiments/search_paper.py --models transformer,bert --devices 8 --budget 120 [--cluster dgx-a100-8]

Lowers each model's paper preset with abstract arguments (nothing is materialised or run),
extracts the graph, builds the simulator (analytic costs; ``--cluster``: a preset or a cluster
file, default ``local``) and runs the
best-first search for ``--budget`` seconds. Reports nodes, extraction and simulator setup time,
evaluations, evaluations per second and the best simulated plan against xla_default. Simulated
only: paper presets are too large to measure on this CPU machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--strategy", default="best_first")
    ap.add_argument("--cluster", default="local",
                    help="cluster preset or file (default local). On 'local' (one stream, no per-operand "
                         "cost) XLA's single combined all-reduce is already the simulator's optimum")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import trax_models
    from disco import search
    from disco.sim import cluster
    from disco.sim import costs
    from disco.ir import extractor
    from disco.sim import simulator
    from disco.ir.graph import HloGraph
    from disco.plans.plan import FusionPlan

    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        step, example = trax_models.make_train_step(name, "paper", devices=args.devices, abstract=True)
        graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
        t_extract = time.perf_counter() - t0
        t0 = time.perf_counter()
        spec = cluster.resolve(args.cluster, args.devices)
        sim = simulator.Simulator(graph, costs.AnalyticCosts(), spec)
        base = sim.step_time(FusionPlan(name="xla_default"))
        t_setup = time.perf_counter() - t0
        res = search.run(search.make(args.strategy), graph, sim.step_time, budget_s=args.budget, seed=0)
        rows.append({"model": name, "cluster": spec.name, "nodes": len(graph.nodes), "all_reduces": len(graph.all_reduces()),
                     "extract_s": round(t_extract, 1), "simulator_setup_s": round(t_setup, 1),
                     "search_s": round(res.elapsed_s, 1), "evals": res.evals,
                     "evals_per_s": round(res.evals_per_s, 1),
                     "xla_default_sim_ms": round(base * 1e3, 3), "best_sim_ms": round(res.best_cost * 1e3, 3)})
        print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The search's answers at a fixed number of evaluations on the zoo, one JSON line per search.

A change to the simulator or the search that must not change what the search finds (issue 62: the
incremental path, exact by construction) is checked by running this on the code before and after
and comparing the two outputs line by line (``diff``): each line holds the best plan's digest, its
estimate, the evaluations made and the top plans' digests. Simulated only; nothing is compiled
for a device or measured.

    PYTHONPATH=. python scripts/tools/search_answers.py --graphs /tmp/zoo-graphs > after.jsonl

``--graphs`` keeps each step's extracted graph (``HloGraph`` JSON) so that a second run, from
another checkout, searches the same graphs without extracting them again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _graph(model: str, preset: str, devices: int, folder: str):
    from disco.ir.graph import HloGraph

    path = os.path.join(folder, f"{model}-{preset}-{devices}.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return HloGraph.from_json(f.read())
    import disco
    import trax_models

    step, args = trax_models.make_train_step(model, preset, devices=devices)
    graph = disco.extract(step, *args)
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(graph.to_json())
    return graph


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", required=True, help="folder of the extracted graphs (made when missing)")
    ap.add_argument("--models", nargs="*", default=None, help="zoo models (default: all)")
    ap.add_argument("--presets", nargs="*", default=["tiny", "small"])
    ap.add_argument("--clusters", nargs="*", default=["2x8-100gbe"])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--incremental", choices=["auto", "on", "off"], default="on",
                    help="the search's incremental pricing (auto: by the graph's size)")
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    import trax_models
    from disco import search
    from disco.sim.cluster import preset
    from disco.sim.costs import AnalyticCosts
    from disco.sim.simulator import Simulator

    strategies = {"best_first": (search.best_first, 300), "annealing": (search.annealing, 200),
                  "greedy": (search.greedy, 200)}
    incremental = {"auto": None, "on": True, "off": False}[args.incremental]
    for model in args.models or trax_models.names():
        for pre in args.presets:
            graph = _graph(model, pre, args.devices, args.graphs)
            for cluster in args.clusters:
                sim = Simulator(graph, AnalyticCosts(), preset(cluster))
                for name, (make, evals) in strategies.items():
                    res = search.run(make(), graph, sim.step_time, max_evals=evals, seed=0,
                                     backend=sim.backend, incremental=incremental)
                    print(json.dumps({"model": model, "preset": pre, "cluster": cluster, "strategy": name,
                                      "nodes": len(graph.nodes), "best": res.best_plan.digest(),
                                      "estimate": res.best_cost, "evals": res.evals,
                                      "top": [p.digest() for _, p in res.top]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

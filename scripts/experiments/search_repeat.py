"""Does a seed's search choose the same plan in every process, and how good is that plan?

    python scripts/experiments/search_repeat.py --models mlp,bert,gpt2,resnet50 --clusters h100-sxm-8,local \
        --seeds 0,1,2 --max-evals 1500 --salts 1,2

For each ``--salts`` value, one fresh Python process with ``PYTHONHASHSEED`` set to it runs the
best-first search with ``--max-evals`` evaluations (no time budget in play). It does this for every
model (preset tiny, ``--devices`` devices, default 8), cluster and seed. Python salts string hashes
per process, so anything in the search that depends on them shows up as a different plan between
the salts. The script prints one JSON line per (model, cluster, seed): the best simulated step time
in each process, whether the plan digests agree, and the best start plan's time. Costs: ``analytic``
on CPU clusters, the shipped per-kernel GNN (``--cost-model gnn``) on GPU ones (``disco optimize``
defaults to ``analytic`` on both). Simulated only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_WORKER = r'''
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + sys.argv[1]
import trax_models
from disco import search
from disco.cli.common import load_cost_model
from disco.ir import extractor
from disco.ir.graph import HloGraph
from disco.sim.cluster_presets import resolve
from disco.sim.simulator import Simulator
devices, models, clusters, seeds, max_evals = (int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(","),
                                               [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5]))
for model in models:
    step, example = trax_models.make_train_step(model, "tiny", devices=devices)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    for name in clusters:
        cluster = resolve(name, devices=devices)
        costs, _ = load_cost_model("gnn" if cluster.device != "cpu" else "analytic", device=cluster.device)
        for seed in seeds:
            sim = Simulator(graph, costs, cluster)
            r = search.run(search.best_first(), graph, sim.step_time, max_evals=max_evals, seed=seed)
            print(json.dumps({"model": model, "cluster": name, "seed": seed, "best_us": r.best_cost * 1e6,
                              "starts_us": min(r.start_costs.values()) * 1e6, "digest": r.best_plan.digest()}),
                  flush=True)
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,bert,gpt2,resnet50")
    ap.add_argument("--clusters", default="h100-sxm-8,local")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--max-evals", type=int, default=1500)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--salts", default="1,2", help="PYTHONHASHSEED of each process")
    args = ap.parse_args(argv)
    runs = []
    for salt in args.salts.split(","):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        r = subprocess.run([sys.executable, "-c", _WORKER, str(args.devices), args.models, args.clusters, args.seeds,
                            str(args.max_evals)], capture_output=True, text=True, env=env, check=False)
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        runs.append([json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")])
    same = 0
    for rows in zip(*runs):
        agree = len({row["digest"] for row in rows}) == 1
        same += agree
        print(json.dumps({"model": rows[0]["model"], "cluster": rows[0]["cluster"], "seed": rows[0]["seed"],
                          "starts_us": round(rows[0]["starts_us"], 3),
                          "best_us": [round(row["best_us"], 3) for row in rows], "same_plan": agree}))
    print(f"same plan in every process: {same}/{len(runs[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

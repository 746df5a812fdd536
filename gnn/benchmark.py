"""Plan evaluations per second with the GNN cost model, as the search uses it.

``python -m gnn.benchmark [--graph GRAPH.json] [--checkpoint CK.msgpack]`` measures, on one
graph (default: the largest graph of tests/data/profiles_small):

* ``search``: :class:`disco.sim.simulator.Simulator` with :class:`gnn.cost_model.GnnCosts` over
  a search-like stream: each plan is the previous one with one group replaced (so most
  kernels are cached, as in local search);
* ``cold``: fresh random plans (every group a new kernel: the per-kernel head runs);
* ``whole_plan``: ``GnnCosts.predict`` (message passing over each plan's fused graph), batched.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any


def run(graph: Any, costs: Any, *, n: int = 400, devices: int = 4, seed: int = 0) -> dict[str, Any]:
    from disco.sim.cluster import preset
    from disco.plans.random_plans import random_groups, random_plan
    from disco.sim.simulator import Simulator

    rng = random.Random(seed)
    t = time.perf_counter()
    sim = Simulator(graph, costs, preset("local", devices))
    setup = time.perf_counter() - t
    pool = [random_plan(graph, seed * 7919 + k, n_groups=24) for k in range(40)]
    # Search-like: start from one plan, replace one group at a time with one from the pool.
    plan = pool[0]
    stream = []
    for _ in range(n):
        other = rng.choice(pool)
        if plan.groups and other.groups:
            k = rng.randrange(len(plan.groups))
            cand = plan.replace(groups=plan.groups[:k] + plan.groups[k + 1:] + (rng.choice(other.groups),))
            used = [nm for g in cand.groups for nm in g]
            plan = cand if len(used) == len(set(used)) else plan
        stream.append(plan)
    valid = []
    for p in stream:
        try:
            sim.step_time(p)
            valid.append(p)
        except ValueError:  # a swap closed a cycle; the search would reject it too
            continue
    sim2 = Simulator(graph, costs, preset("local", devices))
    t = time.perf_counter()
    for p in valid:
        sim2.step_time(p)
    search = len(valid) / (time.perf_counter() - t)
    fresh = []
    for k in range(60):
        g = random_groups(graph, random.Random(10_000 + k), n_groups=24)
        fresh.append(pool[0].replace(groups=g))
    t = time.perf_counter()
    for p in fresh:
        sim2.step_time(p)
    cold = len(fresh) / (time.perf_counter() - t)
    costs.predict(graph, fresh[:16], devices=devices)  # compile
    t = time.perf_counter()
    costs.predict(graph, fresh, devices=devices)
    whole = len(fresh) / (time.perf_counter() - t)
    return {"graph": graph.name, "nodes": len(graph), "simulator_setup_s": round(setup, 3),
            "search_evals_per_s": round(search, 1), "search_plans": len(valid),
            "cold_evals_per_s": round(cold, 1), "whole_plan_evals_per_s": round(whole, 1),
            "kernel_cache": {"hits": costs.hits, "misses": costs.misses}}


def main(argv: list[str] | None = None) -> int:
    from disco.ir.graph import HloGraph
    from gnn.cost_model import GnnCosts, load_default

    p = argparse.ArgumentParser(prog="gnn.benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--graph", help="graph JSON (default: largest in tests/data/profiles_small/graphs)")
    p.add_argument("--checkpoint", help="GNN checkpoint (default: the shipped one)")
    p.add_argument("-n", type=int, default=400)
    args = p.parse_args(argv)
    if args.graph:
        graph = HloGraph.from_json(Path(args.graph).read_text())
    else:
        root = Path(__file__).resolve().parent.parent / "tests" / "data" / "profiles_small" / "graphs"
        graph = max((HloGraph.from_json(f.read_text()) for f in root.glob("*.json")), key=len)
    costs = GnnCosts.load(args.checkpoint) if args.checkpoint else load_default()
    print(json.dumps({**run(graph, costs, n=args.n), "cost_model": costs.describe()["digest"]}, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

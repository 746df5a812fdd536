"""Benchmarks disco.sim.simulator: plan evaluations per second on synthetic training-step graphs.

Builds layered data-parallel step graphs (forward dots and elementwise chains, backward
dots and elementwise chains, one gradient all-reduce per parameter, elementwise optimizer
updates) of about 2,000 / 5,000 / 10,000 / 20,000 nodes, draws random valid plans (small
groups of adjacent elementwise ops, checked with ``disco.plans.check.validate``, and random
contiguous buckets), and times ``Simulator.step_time`` and ``Simulator.run``.

Usage:
  PYTHONPATH=. python scripts/tools/bench_simulator.py [--sizes 2000 5000] [--plans 20] [--seconds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from disco.sim.cluster import preset
from disco.sim.costs import AnalyticCosts
from disco.ir.graph import HloGraph, Node
from disco.ir.opcodes import FUSIBLE_OPCODES
from disco.plans.plan import Bucket, FusionPlan
from disco.plans.check import validate
from disco.sim.simulator import Simulator

_ELEMENTWISE = ("add", "multiply", "tanh", "exponential", "subtract", "maximum", "negate")


def synthetic_step(target_nodes: int, seed: int = 0, width: int = 256) -> HloGraph:
    """A layered forward/backward/update graph of about ``target_nodes`` nodes."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    index: dict[str, int] = {}
    nbytes = 4 * width * width

    def add(opcode: str, operands: tuple[str, ...] = (), *, flops: float = 0.0, size: int = nbytes,
            param_path: str | None = None) -> str:
        name = f"{opcode}.{len(nodes)}"
        index[name] = len(nodes)
        nodes.append(Node(name=name, opcode=opcode, computation="main", shape=f"f32[{width},{width}]",
                          dtype="f32", out_bytes=size, out_elements=size // 4, flops=flops,
                          operands=operands, grad_bytes=size if opcode == "all-reduce" else 0,
                          param_path=param_path, replica_groups="{}" if opcode == "all-reduce" else None,
                          reduction="add" if opcode == "all-reduce" else None))
        return name

    per_layer = 14
    layers = max(1, target_nodes // per_layer)
    dot_flops = 2.0 * width**3
    x = add("parameter")
    lr = add("constant", size=4)
    weights, acts = [], [x]
    for _ in range(layers):
        w = add("parameter")
        weights.append(w)
        h = add("dot", (acts[-1], w), flops=dot_flops)
        for _ in range(rng.randint(2, 4)):
            op = rng.choice(_ELEMENTWISE)
            h = add(op, (h, h) if op in ("add", "multiply", "subtract", "maximum") else (h,), flops=width * width)
        acts.append(h)
    dy = add("negate", (acts[-1],), flops=width * width)
    grads = []
    for layer in reversed(range(layers)):
        for _ in range(rng.randint(2, 4)):
            op = rng.choice(_ELEMENTWISE)
            dy = add(op, (dy, acts[layer + 1]) if op in ("add", "multiply") else (dy,), flops=width * width)
        dw = add("dot", (acts[layer], dy), flops=dot_flops)
        ar = add("all-reduce", (dw,), param_path=f"layer{layer}/w")
        grads.append((layer, ar))
        dy = add("dot", (dy, weights[layer]), flops=dot_flops)
    for layer, ar in grads:
        scaled = add("multiply", (ar, lr), flops=width * width)
        add("subtract", (weights[layer], scaled), flops=width * width)
    edges = tuple(sorted({(index[o], index[n.name]) for n in nodes for o in n.operands}))
    return HloGraph(name=f"synthetic{len(nodes)}", nodes=tuple(nodes), edges=edges, fingerprint=f"syn{seed}")


def random_plan(graph: HloGraph, rng: random.Random, *, group_frac: float = 0.3,
                bucket_count: int | None = None, tries: int = 20, check: bool = True) -> FusionPlan:
    """Random groups of 2-4 adjacent elementwise ops plus random contiguous buckets.

    Groups are valid by construction (single-user chains whose other inputs precede the chain);
    ``check`` also runs ``disco.plans.check.validate``, which is slow on large graphs.
    """
    nodes = graph.nodes
    succ: dict[int, list[int]] = {}
    preds: dict[int, list[int]] = {}
    for s, d in graph.edges:
        succ.setdefault(s, []).append(d)
        preds.setdefault(d, []).append(s)
    fusible = [i for i, n in enumerate(nodes) if n.opcode in FUSIBLE_OPCODES and n.opcode != "constant"]
    ars = [n.name for n in nodes if n.is_all_reduce]
    for _ in range(tries):
        used: set[int] = set()
        groups = []
        for i in rng.sample(fusible, int(len(fusible) * group_frac)):
            if i in used:
                continue
            chain = [i]
            while len(chain) < rng.randint(2, 4):
                # Grow only along edges whose other inputs come before the chain starts: such
                # groups (and any set of them) contract without cycles.
                # The tail must have no other user: a planned fusion has exactly one output.
                users = succ.get(chain[-1], [])
                nxt = [d for d in users if len(users) == 1 and d not in used and d not in chain
                       and nodes[d].opcode in FUSIBLE_OPCODES
                       and all(p in chain or p < chain[0] for p in preds.get(d, ()))]
                if not nxt:
                    break
                chain.append(rng.choice(nxt))
            if len(chain) >= 2:
                used.update(chain)
                groups.append(tuple(nodes[c].name for c in chain))
        k = bucket_count or rng.randint(1, max(1, len(ars)))
        cuts = sorted(rng.sample(range(1, len(ars)), min(k - 1, len(ars) - 1))) if len(ars) > 1 else []
        bounds = [0, *cuts, len(ars)]
        buckets = tuple(Bucket(tuple(ars[a:b])) for a, b in zip(bounds, bounds[1:]) if b > a)
        plan = FusionPlan(groups=tuple(groups), buckets=buckets or None)
        if not check:
            return plan
        try:
            validate(plan, graph)
        except ValueError as e:
            print(f"random plan rejected: {e}", file=sys.stderr)
            continue
        return plan
    return FusionPlan(buckets=tuple(Bucket((a,)) for a in ars) or None)


def _rate(fn, plans: list[FusionPlan], seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    while True:
        for p in plans:
            fn(p)
        n += len(plans)
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


def bench(sizes: list[int], n_plans: int, seconds: float, seed: int = 0,
          validate_max: int = 5000) -> list[dict]:
    rows = []
    for size in sizes:
        graph = synthetic_step(size, seed)
        rng = random.Random(seed)
        t0 = time.perf_counter()
        sim = Simulator(graph, AnalyticCosts(), preset("2x8-100gbe"))
        setup = time.perf_counter() - t0
        # validate() costs O(groups x edges); check every plan only on the smaller graphs.
        plans = [random_plan(graph, rng, check=len(graph.nodes) <= validate_max or k == 0)
                 for k in range(n_plans)]
        for p in plans:  # warm the per-group caches and check both paths agree
            assert abs(sim.step_time(p) - sim.run(p).step_time) <= 1e-12 * max(1.0, sim.step_time(p))
        rows.append({
            "nodes": len(graph.nodes), "edges": len(graph.edges),
            "all_reduces": len(graph.all_reduces()),
            "mean_groups": sum(len(p.groups) for p in plans) / len(plans),
            "setup_s": setup,
            "step_time_per_s": _rate(sim.step_time, plans, seconds),
            "run_per_s": _rate(sim.run, plans, seconds),
            "default_plan_step_time_per_s": _rate(sim.step_time, [FusionPlan()], seconds / 2),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 5000, 10000, 20000])
    ap.add_argument("--plans", type=int, default=20, help="distinct random plans per graph")
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget per measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    rows = bench(args.sizes, args.plans, args.seconds, args.seed)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'nodes':>7} {'edges':>7} {'ARs':>5} {'groups':>7} {'setup s':>8} "
          f"{'step_time/s':>12} {'run/s':>8} {'default/s':>10}")
    for r in rows:
        print(f"{r['nodes']:>7} {r['edges']:>7} {r['all_reduces']:>5} {r['mean_groups']:>7.0f} "
              f"{r['setup_s']:>8.2f} {r['step_time_per_s']:>12.0f} {r['run_per_s']:>8.0f} "
              f"{r['default_plan_step_time_per_s']:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

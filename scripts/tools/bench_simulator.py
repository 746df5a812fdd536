"""Benchmarks disco.sim.simulator: plan evaluations per second on synthetic training-step graphs.

Builds layered data-parallel step graphs (forward dots and elementwise chains, backward
dots and elementwise chains, one gradient all-reduce per parameter, elementwise optimizer
updates) of about 2,000 / 5,000 / 10,000 / 20,000 nodes, draws random valid plans (small
groups of adjacent elementwise ops, checked with ``disco.plans.check.validate``, and random
contiguous buckets), and times ``Simulator.step_time`` and ``Simulator.run``.

It also times the search's own moves: from each of the search's start plans
(``disco.search.default_starts``) a walk of ``--moves`` random moves
(``disco.plans.moves.random_move``; each child becomes the next parent with probability 1/2),
each child priced by a full simulation (``Simulator.step_time``) and incrementally from its parent
(``disco.sim.delta.DeltaSimulator``, fresh for every pass: no trace is reused, though the simulator's
unit caches and unit ids, shared by its delta simulators, are warm; every incremental estimate is
checked ``==`` the full one), and once more cold: over a new simulator, as a search in a fresh
process prices them (``moves_incremental_cold_per_s``, one pass, its start plans priced first).
With ``--search-evals N`` it runs a best-first search of N evaluations on each synthetic graph over a
new simulator and times its own pricing of each child from its parent. With ``--graph`` (an
``HloGraph`` JSON file, e.g. a zoo step at preset paper) it also runs the best-first search for ``--max-evals`` with
incremental pricing and without, and reports each one's plans per second and whether both chose the
same plan.

Every figure but the cold one is a median over ``--repeats`` passes, by the wall clock (``--clock cpu``: this
process's CPU time, steadier on a shared machine). Measured on CPU, in one Python process.

Usage:
  PYTHONPATH=. python scripts/tools/bench_simulator.py [--sizes 2000 5000] [--plans 20] [--seconds 2] [--json]
  PYTHONPATH=. python scripts/tools/bench_simulator.py --sizes 10000 50000 --moves 20 --repeats 3 \
      --graph bert_paper.json --max-evals 400
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
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


_CLOCK = time.perf_counter


def _rate(fn, plans: list[FusionPlan], seconds: float) -> float:
    n = 0
    t0 = _CLOCK()
    while True:
        for p in plans:
            fn(p)
        n += len(plans)
        dt = _CLOCK() - t0
        if dt >= seconds:
            return n / dt


def move_pairs(graph: HloGraph, sim: Simulator, n_moves: int, seed: int) -> list[tuple[FusionPlan, FusionPlan]]:
    """(parent, child) pairs of the search's own moves: a walk of ``n_moves`` random moves from each
    start plan of the search, each child the next parent with probability 1/2."""
    from disco import search
    from disco.plans import moves

    ctx = moves.context(graph, sim.backend)
    rng = random.Random(seed)
    pairs = []
    for start in search.default_starts(graph, sim, ctx):
        cur = moves.canonical(start, ctx)
        for _ in range(n_moves):
            child = moves.random_move(cur, ctx, rng)
            if child is None:
                continue
            pairs.append((cur, child))
            if rng.random() < 0.5:
                cur = child
    return pairs


def bench_moves(sim: Simulator, pairs: list[tuple[FusionPlan, FusionPlan]], repeats: int) -> dict:
    """Full and incremental evaluations per second over ``pairs`` (medians of ``repeats`` passes);
    incremental also with the walks' start plans priced and traced before the clock (as a search
    prices its start plans first, as evaluations of their own)."""
    from disco.sim.delta import DeltaSimulator

    for _, child in pairs:  # warm the simulator's unit caches (both paths share them)
        sim.step_time(child)
    full, incr, started = [], [], []
    stats: dict = {}
    children = {id(child) for _, child in pairs}
    roots = list({id(p): p for p, _ in pairs if id(p) not in children}.values())

    def incremental(delta: DeltaSimulator, ref: list[float], starts: list[FusionPlan]) -> float:
        """``delta``'s rate over every child from its parent, ``starts`` priced and traced first (outside
        the clock); checked ``==`` ``ref``, the full simulation's (never a rate for wrong answers)."""
        for root in starts:
            delta.step_time(root)
            delta.trace(root)
        t0 = _CLOCK()
        got = [delta.step_time(child, parent) for parent, child in pairs]
        rate = len(pairs) / (_CLOCK() - t0)
        if got != ref:
            raise AssertionError("incremental step times differ from the full simulation's")
        return rate

    for _ in range(repeats):
        t0 = _CLOCK()
        ref = [sim.step_time(child) for _, child in pairs]
        full.append(len(pairs) / (_CLOCK() - t0))
        delta = DeltaSimulator(sim, freeze_gc=None)  # as disco.search.run makes it
        incr.append(incremental(delta, ref, []))
        stats = dict(delta.stats)
        # As a search runs: its start plans (the walks' first parents) priced and traced first, as
        # its first evaluations, outside the clock; then every child from its parent.
        started.append(incremental(DeltaSimulator(sim, freeze_gc=None), ref, roots))
    # Cold, as a search in a fresh process meets its moves: a new simulator (no unit cached, no unit
    # id given), its start plans priced and traced first, then every child once from its parent.
    delta = DeltaSimulator(Simulator(sim.graph, sim.costs, sim.cluster), freeze_gc=None)
    cold = incremental(delta, ref, roots)
    delta.release()
    return {"move_pairs": len(pairs), "moves_full_per_s": statistics.median(full),
            "moves_incremental_per_s": statistics.median(incr),
            "moves_incremental_starts_priced_per_s": statistics.median(started),
            "moves_incremental_cold_per_s": cold, "incremental_paths": stats}


def bench_in_search(graph: HloGraph, max_evals: int, seed: int = 0) -> dict:
    """One best-first search of ``max_evals`` with incremental pricing on ``graph``, over a new
    simulator: its plans per second, and its pricing of a child from its parent per second, each
    ``DeltaSimulator.step_time`` call timed (the search's own moves, as it meets them)."""
    from disco import search
    from disco.sim import delta as delta_mod

    spent = {"calls": 0, "seconds": 0.0}
    base = delta_mod.DeltaSimulator

    class Timed(base):  # type: ignore[misc, valid-type]
        def step_time(self, plan, parent=None):
            if parent is None:
                return super().step_time(plan)
            t0 = _CLOCK()
            try:
                return super().step_time(plan, parent)
            finally:
                spent["calls"] += 1
                spent["seconds"] += _CLOCK() - t0

    sim = Simulator(graph, AnalyticCosts(), preset("2x8-100gbe"))
    delta_mod.DeltaSimulator = Timed  # what disco.search.run makes (imported there when it runs)
    try:
        t0 = _CLOCK()
        r = search.run(search.best_first(), graph, sim.step_time, max_evals=max_evals, seed=seed, incremental=True)
        seconds = _CLOCK() - t0
    finally:
        delta_mod.DeltaSimulator = base
    return {"search_evals": r.evals, "search_plans_per_s": r.evals / seconds,
            "search_moves_priced": spent["calls"],
            "search_moves_per_s": spent["calls"] / spent["seconds"] if spent["seconds"] else 0.0}


def bench_search(path: str, max_evals: int, repeats: int, seed: int = 0) -> dict:
    """The best-first search on the graph in ``path`` for ``max_evals``, with incremental pricing and
    without: plans per second (medians of ``repeats`` runs) and whether both chose the same plan."""
    from disco import search

    with open(path) as f:
        graph = HloGraph.from_json(f.read())
    rates: dict[bool, list[float]] = {True: [], False: []}
    digests: dict[bool, set[str]] = {True: set(), False: set()}
    for _ in range(repeats):
        for incremental in (False, True):
            sim = Simulator(graph, AnalyticCosts(), preset("2x8-100gbe"))
            t0 = _CLOCK()
            r = search.run(search.best_first(), graph, sim.step_time, max_evals=max_evals, seed=seed,
                           incremental=incremental)
            rates[incremental].append(r.evals / (_CLOCK() - t0))
            digests[incremental].add(r.best_plan.digest())
    return {"graph": path, "nodes": len(graph.nodes), "max_evals": max_evals,
            "search_full_per_s": statistics.median(rates[False]),
            "search_incremental_per_s": statistics.median(rates[True]),
            "same_plan": len(digests[True] | digests[False]) == 1}


def bench(sizes: list[int], n_plans: int, seconds: float, seed: int = 0,
          validate_max: int = 5000, n_moves: int = 0, repeats: int = 1, search_evals: int = 0) -> list[dict]:
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
        row = {
            "nodes": len(graph.nodes), "edges": len(graph.edges),
            "all_reduces": len(graph.all_reduces()),
            "mean_groups": sum(len(p.groups) for p in plans) / len(plans),
            "setup_s": setup,
            "step_time_per_s": statistics.median(_rate(sim.step_time, plans, seconds) for _ in range(repeats)),
            "run_per_s": _rate(sim.run, plans, seconds),
            "default_plan_step_time_per_s": _rate(sim.step_time, [FusionPlan()], seconds / 2),
        }
        if n_moves:
            row.update(bench_moves(sim, move_pairs(graph, sim, n_moves, seed), repeats))
        if search_evals:
            row.update(bench_in_search(graph, search_evals, seed))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 5000, 10000, 20000])
    ap.add_argument("--plans", type=int, default=20, help="distinct random plans per graph")
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget per measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--moves", type=int, default=20,
                    help="random moves walked from each search start plan (0: no move benchmark)")
    ap.add_argument("--repeats", type=int, default=3, help="passes per figure (the median is reported)")
    ap.add_argument("--graph", action="append", default=[], metavar="FILE",
                    help="an HloGraph JSON file to run the search on (repeatable)")
    ap.add_argument("--max-evals", type=int, default=400, help="the search's evaluation budget (--graph)")
    ap.add_argument("--search-evals", type=int, default=0, metavar="N",
                    help="also run a best-first search of N evaluations on each synthetic graph, over a new "
                         "simulator, and time its pricing of each child from its parent (0: no)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall clock, or this process's CPU time")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    global _CLOCK
    _CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    rows = bench(args.sizes, args.plans, args.seconds, args.seed, n_moves=args.moves, repeats=args.repeats,
                 search_evals=args.search_evals)
    searches = [bench_search(path, args.max_evals, args.repeats, args.seed) for path in args.graph]
    if args.json:
        print(json.dumps({"clock": args.clock, "sizes": rows, "searches": searches}, indent=1))
        return 0
    print(f"{'nodes':>7} {'edges':>7} {'ARs':>5} {'groups':>7} {'setup s':>8} "
          f"{'step_time/s':>12} {'run/s':>8} {'default/s':>10} {'moves full/s':>13} {'incremental/s':>14} {'cold/s':>7}")
    for r in rows:
        print(f"{r['nodes']:>7} {r['edges']:>7} {r['all_reduces']:>5} {r['mean_groups']:>7.0f} "
              f"{r['setup_s']:>8.2f} {r['step_time_per_s']:>12.0f} {r['run_per_s']:>8.0f} "
              f"{r['default_plan_step_time_per_s']:>10.0f} {r.get('moves_full_per_s', 0):>13.0f} "
              f"{r.get('moves_incremental_per_s', 0):>14.0f} {r.get('moves_incremental_cold_per_s', 0):>7.0f}")
    for r in rows:
        if "search_evals" in r:
            print(f"search on {r['nodes']} nodes ({r['search_evals']} evals): {r['search_plans_per_s']:.0f} plans/s; "
                  f"{r['search_moves_priced']} moves priced from their parents at {r['search_moves_per_s']:.0f}/s")
    for r in searches:
        print(f"search {r['graph']} ({r['nodes']} nodes, {r['max_evals']} evals): "
              f"{r['search_full_per_s']:.0f} plans/s full, {r['search_incremental_per_s']:.0f} incremental, "
              f"same plan: {r['same_plan']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

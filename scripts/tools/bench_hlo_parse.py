"""Parse speed of disco.ir.hlo_parse and HloGraph.from_hlo_text (issue 18), for docs/results.md.

Times, for each HLO file given (``.gz`` is read too) and for a synthetic chain of N
instructions: ``parse_module`` and the whole ``HloGraph.from_hlo_text`` (parse + graph +
flops + fingerprint). Best of ``--repeat`` runs, wall and CPU seconds.

Usage::

    PYTHONPATH=. python scripts/tools/bench_hlo_parse.py [--chain 100000] [--repeat 3] FILE...
"""

from __future__ import annotations

import argparse
import gzip
import time

from disco.ir import hlo_parse
from disco.ir.graph import HloGraph


def chain_module(n: int) -> str:
    """A module whose entry is a chain of ``n`` instructions, written as jax writes them."""
    lines = ["HloModule chain, entry_computation_layout={(f32[128,256]{1,0})->f32[128,256]{1,0}}", "",
             "ENTRY %main.1 (p: f32[128,256]) -> f32[128,256] {",
             "  %p = f32[128,256]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}"]
    prev = "p"
    ops = ("add", "multiply", "tanh", "subtract")
    for i in range(n - 2):
        op = ops[i % len(ops)]
        args = f"%{prev}" if op == "tanh" else f"%{prev}, %p"
        lines.append(f"  %{op}.{i} = f32[128,256]{{1,0}} {op}({args}), "
                     f'metadata={{op_name="jit(step)/{op}" source_file="/x/model.py" source_line={i % 997}}}')
        prev = f"{op}.{i}"
    lines += [f"  ROOT %out = f32[128,256]{{1,0}} negate(%{prev})", "}", ""]
    return "\n".join(lines)


def _best(fn, repeat: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--chain", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    texts = [(f"chain of {args.chain:,} instructions", chain_module(args.chain))] if args.chain else []
    for path in args.files:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            texts.append((path.rsplit("/", 1)[-1], f.read()))
    print("| module | MB | instructions | parse_module s (wall / cpu) | from_hlo_text s (wall / cpu) | nodes |")
    print("|---|---|---|---|---|---|")
    for label, text in texts:
        module = hlo_parse.parse_module(text)
        n_ins = sum(len(c.instructions) for c in module.computations)
        pw, pc = _best(lambda: hlo_parse.parse_module(text), args.repeat)
        gw, gc = _best(lambda: HloGraph.from_hlo_text(text), args.repeat)
        nodes = len(HloGraph.from_hlo_text(text).nodes)
        print(f"| {label} | {len(text) / 1e6:.2f} | {n_ins:,} | {pw:.2f} / {pc:.2f} | {gw:.2f} / {gc:.2f} | {nodes:,} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How well per-kernel device times repeat: trace a vs trace b of one executable, per kernel.

Reads a per-kernel dataset (``disco collect --kernels`` output, or the shared
``per_instruction.jsonl.gz``) and prints, per record and over all, the median and 90th
percentile of ``|a - b| / ((a + b) / 2)`` of the per-launch times of the kernels present in both traces.

    PYTHONPATH=. python scripts/experiments/kernel_repeatability.py --kernels DIR/kernels.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np


def rel_diffs(rec: dict) -> np.ndarray:
    """Relative differences of the per-launch times of the kernels timed in both traces.

    Per launch (``ns_per_step / launches_per_step``): in a loop the profiler can attribute a
    kernel's launches to two instructions in different proportions in the two traces (gpt2's
    loop fusions: 1.6 and 2.4 launches per step, then 2.4 and 1.6) at the same time per launch.
    A stream is matched by its number: the activity list in its name ("Stream #14(Memset,Compute)")
    is printed in either order. Entries with a zero time are skipped.
    """
    def key(k: dict) -> tuple:
        return (k["stream"].split("(")[0], k["kernel"], k["hlo_op"])

    def per_launch(k: dict) -> float:
        return k["ns_per_step"] / max(float(k.get("launches_per_step") or 1.0), 1e-9)

    a = {key(k): per_launch(k) for k in rec["kernels_trace_a"]}
    b = {key(k): per_launch(k) for k in rec["kernels_trace_b"]}
    both = [(a[k], b[k]) for k in a.keys() & b.keys() if a[k] + b[k] > 0]
    return np.array([abs(x - y) / ((x + y) / 2) for x, y in both])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", required=True, help="kernels.jsonl or per_instruction.jsonl.gz")
    args = p.parse_args(argv)
    path = Path(args.kernels)
    opener = gzip.open if path.suffix == ".gz" else open
    allr = []
    print("| record | kernels in both traces | median rel. diff | p90 rel. diff |")
    print("|---|---|---|---|")
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            d = rel_diffs(rec)
            if d.size == 0:
                continue
            allr.append(d)
            print(f"| {rec['model']}/{rec['preset']}/{rec['variant']} | {d.size} | {np.median(d):.2%} | "
                  f"{np.percentile(d, 90):.2%} |")
    if not allr:
        print("no record with kernels in both traces", file=sys.stderr)
        return 1
    d = np.concatenate(allr)
    print(f"\nall: {d.size} kernels, median {np.median(d):.2%}, p90 {np.percentile(d, 90):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

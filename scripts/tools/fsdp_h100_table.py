"""Prints the results table of FSDP steps planned for H100 clusters from a CPU machine
(docs/results/fsdp-h100.md) from ``disco optimize --cluster ... --json`` outputs.

Each file is one run of ``disco optimize --model M --preset P --devices N --style fsdp [--mesh DxF]
--cluster C --json`` on a machine without the cluster's GPUs (``disco.optimizer.predict``: nothing
measured). One row per file: the answer, ``maxtext`` and ``xla_default``, each with its predicted
step time (the compiled tier: deviceless XLA:GPU, priced on the cluster) and its predicted peak device
memory (XLA:GPU's memory analysis of the executable), and the rows over the memory limit.

Usage::

  python scripts/tools/fsdp_h100_table.py RUN.json [RUN.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from disco.sim.memory import bytes_text


def _cell(row: dict | None, tier: str) -> str:
    if row is None:
        return "-"
    ms = row["compiled_ms"] if tier == "compiled" else row["emulated_ms"]
    return "-" if ms is None else f"{ms:.3f} ms, {bytes_text(row['peak_memory_bytes'])}"


def table_row(run: dict) -> str:
    """One markdown row of a run's JSON."""
    rows = {r["name"]: r for r in run["rows"]}
    tier, chosen = run["tier"], run["chosen"]
    base, maxtext = rows["xla_default"], rows.get("maxtext")

    def speed(r: dict | None) -> str:
        key = "compiled_ms" if tier == "compiled" else "emulated_ms"
        return f"{base[key] / r[key]:.3f}x" if r and r[key] else "-"

    mesh = run.get("mesh") or ("1x{}".format(run["devices"]) if run.get("style") == "fsdp" else "?")
    label = chosen if len(chosen) <= 28 else chosen[:25] + "..."
    over = len(run.get("over_memory") or [])
    return (f"| {run['model']} {run['preset']} | {run['cluster']} ({run['devices']}, mesh {mesh}) | {tier} | "
            f"`{label}` | {_cell(rows[chosen], tier)} | {speed(rows[chosen])} | {_cell(maxtext, tier)} | "
            f"{speed(maxtext)} | {_cell(base, tier)} | {rows[chosen]['peak_memory_from']} | "
            f"{over} of {len(rows)} | {bytes_text(run['memory_limit_bytes'])} |")


HEADER = ("| step | cluster (devices, mesh) | tier | the answer | answer: step, peak | answer over xla_default | "
          "maxtext: step, peak | maxtext over xla_default | xla_default: step, peak | peak from | rows over the "
          "limit | limit |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="disco optimize --json outputs")
    args = p.parse_args(argv)
    print(HEADER)
    for path in args.runs:
        print(table_row(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

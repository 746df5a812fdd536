"""Deviceless XLA:GPU kernels against the device's, kernel by kernel (issue 44's fidelity measure).

For every record that holds a step's pre-optimisation HLO and the module XLA built from it on an H100
(``--data``: ``../shared/data/h100_kernels/per_instruction.jsonl.gz`` and ``gnn/data/h100_kernels_*.jsonl.gz``
by default, or the ``device_modules.jsonl.gz`` that ``scripts/tools/gpu_truth.py`` writes), this compiles
the pre-optimisation HLO deviceless for one H100 (:func:`xla_hooks.deviceless.compile_hlo`) with the
record's compile options, without autotune results and, with ``--autotune-results FILE``, with them, and
counts how many of the device module's kernel-launching instructions a deviceless one matches by
signature (multisets: :func:`signatures`): XLA's kind of kernel (the fusion kind, or the custom-call
target: ``__cublas$lt$matmul`` is a cuBLAS GEMM, a ``kCustom`` fusion a Triton one), its working ops with
their shapes, and its launches per step. Also the cuBLAS calls on each side.

Prints a markdown table and writes ``--out`` (JSON) after every model.

Usage::

  PYTHONPATH=. python scripts/tools/kernel_match.py [--preset paper] [--models mlp,bert]
      [--data FILE ...] [--autotune-results FILE] [--out /tmp/kernel_match.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from disco.sim.compiled_kernels import module_kernels  # noqa: E402
from xla_hooks import deviceless  # noqa: E402


def signatures(text: str) -> collections.Counter:
    """One signature per kernel-launching instruction of an optimised module (every computation,
    loop bodies included): (XLA's kind, the kernel's working ``opcode:shape`` key, launches per step)."""
    return collections.Counter((k.xla_kind, k.kernel.key(), k.executions) for k in module_kernels(text)
                               if not k.kernel.is_empty)


def cublas(sigs: collections.Counter) -> int:
    """cuBLAS GEMM calls among ``sigs``."""
    return sum(n for s, n in sigs.items() if "cublas" in s[0])


def match(device_text: str, deviceless_text: str) -> dict[str, Any]:
    """How many of the device module's kernels a deviceless kernel matches by signature; also by
    ``scripts/tools/gpu_sim_tables.py``'s coarser one (entry computation only; every GEMM or
    convolution a "matrix" of its size, cuBLAS or not: the figure docs/results.md reported first)."""
    from scripts.tools.gpu_sim_tables import compiled_signatures

    dev, dl = signatures(device_text), signatures(deviceless_text)
    n_dev, common = sum(dev.values()), sum((dev & dl).values())
    coarse_dev = collections.Counter(compiled_signatures(device_text))
    coarse_dl = collections.Counter(compiled_signatures(deviceless_text))
    n_coarse = sum(coarse_dev.values())
    return {"device_kernels": n_dev, "deviceless_kernels": sum(dl.values()), "matched": common,
            "match": round(common / n_dev, 4) if n_dev else None,
            "coarse_match": round(sum((coarse_dev & coarse_dl).values()) / n_coarse, 4) if n_coarse else None,
            "cublas_device": cublas(dev), "cublas_deviceless": cublas(dl),
            # the device's kernels no deviceless one matches, by XLA's kind (kCustom: a Triton fusion)
            "unmatched_by_kind": dict(collections.Counter(s[0] for s in (dev - dl).elements()).most_common(4))}


def records(paths: list[str], preset: str, models: list[str] | None) -> dict[str, dict[str, Any]]:
    """model -> its ``default`` record at ``preset`` (the first file holding a model wins)."""
    from scripts.tools.compiled_accuracy import read

    recs = {m: v["default"] for m, v in read(paths, preset).items() if "default" in v}
    return {m: recs[m] for m in sorted(recs) if models is None or m in models}


def main(argv: list[str] | None = None) -> int:
    from scripts.tools.compiled_accuracy import DEFAULT_DATA

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", default=DEFAULT_DATA)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--models", default=None, help="comma list (default: every model in --data at --preset)")
    ap.add_argument("--autotune-results", default=None, metavar="FILE",
                    help="XLA's autotune results (textproto) to load in the deviceless compiles as well")
    ap.add_argument("--out", default="/tmp/kernel_match.json")
    args = ap.parse_args(argv)
    if not deviceless.available():
        print(f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}", file=sys.stderr)
        return 2
    if args.autotune_results is not None:  # checked before any compile
        from xla_hooks import autotune_results

        loaded = autotune_results.read(args.autotune_results)
        print(f"autotune results {args.autotune_results}: {len(loaded.entries)} entries {loaded.counts()}, "
              f"key versions {loaded.versions()}, devices {list(loaded.devices)}", flush=True)
    recs = records(args.data, args.preset, args.models.split(",") if args.models else None)
    if not recs:
        print(f"no default records at preset {args.preset!r} in {args.data}", file=sys.stderr)
        return 2
    rows = []
    variants = {"no results": None} if args.autotune_results is None else {
        "no results": None, "with results": args.autotune_results}
    for model, rec in recs.items():
        row: dict[str, Any] = {"model": model, "preset": args.preset, "device_jax": rec.get("jax")}
        for label, results in variants.items():
            t0 = time.perf_counter()
            text = deviceless.compile_hlo(rec["pre_optimization_hlo"], target="h100", devices=1,
                                          options=rec.get("compile_options") or {}, autotune_results=results)
            row[label] = {**match(rec["compiled_hlo"], text), "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    heads = " | ".join(f"matched ({v}) | coarse ({v}) | deviceless kernels ({v}) | cuBLAS device/deviceless ({v}) "
                       f"| unmatched by kind ({v})" for v in variants)
    print(f"\n| model | device kernels | {heads} |")
    print("|---|---:|" + "---:|---:|---:|---:|---|" * len(variants))
    for r in rows:
        cells = [f"{r[v]['match']:.1%} | {r[v]['coarse_match']:.1%} | {r[v]['deviceless_kernels']} | "
                 f"{r[v]['cublas_device']}/{r[v]['cublas_deviceless']} | "
                 f"{', '.join(f'{k} {n}' for k, n in r[v]['unmatched_by_kind'].items())}" for v in variants]
        print(f"| {r['model']} | {r['no results']['device_kernels']} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a GNN cost model.

Per-kernel GNN from kernel profiles (writes the shipped checkpoint ``gnn/kernel_h100.msgpack``):

    PYTHONPATH=. python scripts/tools/train_gnn.py --kernels ../shared/data/h100_kernels/per_instruction.jsonl.gz \\
        --kernels gnn/data/h100_kernels_2026-11-24.jsonl.gz \\
        --kernels gnn/data/h100_random_kernels_2026-11-28.jsonl.gz \\
        --device h100 --out gnn/kernel_h100.msgpack --overwrite-shipped

A file shipped in the ``gnn`` package (``--cost-model gnn`` loads it) is written over only with
``--overwrite-shipped``, as in ``disco train-gnn``.

``--kernels`` may be repeated: the command above (the one that wrote the shipped file) reads the 7
original zoo models, the four newer ones and 21 random networks (``trax_models.random_names``), the
last two collected by ``disco collect --kernels``.

Without ``--kernels``: the step-level GNN, exactly as ``disco train-gnn`` (``--data DIR ...``; the
shipped ``gnn/default_checkpoint.msgpack`` is written over only with ``--overwrite-shipped``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import time
from pathlib import Path

from disco.cli.common import CliError


def train_kernels(argv: list[str]) -> int:
    """``--kernels``: trains the per-kernel GNN; returns the exit status (2 for bad input, one line on stderr)."""
    from disco.sim.costs.device_costs import DEVICES

    p = argparse.ArgumentParser(prog="train_gnn --kernels", description="train the per-kernel GNN on kernel profiles")
    p.add_argument("--kernels", required=True, action="append",
                   help="per_instruction.jsonl(.gz) (../shared/data/h100_kernels); repeat to train on several files")
    p.add_argument("--device", required=True, choices=DEVICES,
                   help="device kind of the profiles (every record must have been profiled on it)")
    p.add_argument("--out", required=True, help="checkpoint to write (.msgpack)")
    p.add_argument("--overwrite-shipped", action="store_true",
                   help="allow --out to write over a checkpoint shipped in the gnn package (gnn/kernel_h100.msgpack, "
                        "which --cost-model gnn loads)")
    p.add_argument("--cache", default="/tmp/disco_kernel_cache", help="feature cache directory")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: TrainConfig)")
    p.add_argument("--members", type=int, default=None, help="ensemble members (default: TrainConfig)")
    p.add_argument("--rank-weight", type=float, default=None, help="pairwise ranking loss weight (default: TrainConfig)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        return _train_kernels(args)
    except (CliError, ValueError, OSError, EOFError) as e:
        print(f"train_gnn: error: {e}", file=sys.stderr)
        return 2


def _train_kernels(args: argparse.Namespace) -> int:
    from disco.cli.common import check_output_file
    from disco.cli.train_gnn import check_not_shipped
    from disco.sim.costs.device_costs import roofline_config
    from gnn import kernel_data as KD
    from gnn import kernel_model as KM
    from gnn import kernel_train as KT
    from gnn.kernel_costs import KernelCosts

    t0 = time.perf_counter()
    check_output_file(args.out, "--out")  # before hours of training
    check_not_shipped(Path(args.out), "--out", args.overwrite_shipped)
    cfg = KT.train_config(seed=args.seed, steps=args.steps, members=args.members, rank_weight=args.rank_weight)
    records = [r for path in args.kernels for r in KD.load_records(path, cache_dir=args.cache, device=args.device)]
    if not records:
        raise CliError(f"--kernels {', '.join(args.kernels)}: no records; expected per-kernel profiles "
                       "(disco collect --kernels)")
    base = roofline_config(args.device)
    examples = KT.make_examples(records)
    model, hist = KT.fit(examples, cfg, (base.peak_flops, base.mem_bandwidth, base.launch_overhead),
                         log=lambda s: print(s, file=sys.stderr, flush=True))
    corrections = KT.measured_corrections(KM.weights(model), examples)
    files = [{"file": Path(f).name, "sha256_16": hashlib.sha256(Path(f).read_bytes()).hexdigest()[:16]}
             for f in args.kernels]
    data = files[0] if len(files) == 1 else {"files": files}  # one file: the fields earlier checkpoints have
    meta = {"data": {**data, "records": len(records),
                     "kernels": len(examples), "models": sorted({r.model for r in records})},
            "train_config": dataclasses.asdict(cfg), "final_loss": hist["loss"][-1], "train_seconds": hist["seconds"],
            "measured_kernels": len(corrections)}
    costs = KernelCosts(model, device=args.device, meta=meta, corrections=corrections)
    costs.save(args.out)
    print(f"trained on {len(examples)} kernels of {len(records)} records: {hist['steps']} steps in "
          f"{hist['seconds']:.0f} s (total {time.perf_counter() - t0:.0f} s), final loss {hist['loss'][-1]:.4f}, "
          f"{len(corrections)} measured kernels; "
          f"wrote {args.out} (digest {costs.checkpoint_digest})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--kernels" or a.startswith("--kernels=") for a in argv):
        return train_kernels(argv)
    from disco.cli.train_gnn import main as step_main

    return step_main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""``disco train-gnn``: train the cost GNN on a collector dataset, evaluate it, write a checkpoint.

Steps: load ``--data``; split held-out plans of every model (``plans``) and train/evaluate;
optionally leave each model out in turn (``--lomo``) and train/evaluate once per model;
compare with AnalyticCosts + the simulator on the same held-out samples. The shipped
model is the one trained on the ``plans`` split (best validation epoch); write ``--out``
(msgpack) and the metrics JSON (``--metrics``; default ``gnn/default_metrics.json`` for the
default checkpoint, else ``<out stem>_metrics.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``train-gnn`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("train-gnn", help="train the GNN cost model on profiled samples")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="collector dataset directory (samples.jsonl + graphs/)")
    p.add_argument("--out", default="gnn/default_checkpoint.msgpack",
                   help="checkpoint to write (msgpack; default gnn/default_checkpoint.msgpack)")
    p.add_argument("--metrics", help="metrics JSON to write (default: next to --out)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the initialisation (default 0)")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    p.add_argument("--lomo-epochs", type=int, default=None,
                   help="epochs per leave-one-model-out run (default: --epochs)")
    p.add_argument("--hidden", type=int, default=32, help="node hidden width (default 32)")
    p.add_argument("--edge-hidden", type=int, default=8, help="edge hidden width (default 8)")
    p.add_argument("--layers", type=int, default=3, help="message-passing layers (default 3)")
    p.add_argument("--batch", type=int, default=32, help="graphs per batch (default 32)")
    p.add_argument("--node-budget", type=int, default=16384, help="padded nodes per batch (default 16384)")
    p.add_argument("--lr", type=float, default=2e-3, help="learning rate (default 0.002)")
    p.add_argument("--loss", choices=("rank", "mse", "both"), default="both",
                   help="ranking loss, squared error on log times, or both (default both)")
    p.add_argument("--lomo", action="store_true", help="also evaluate leave-one-model-out per model")
    p.add_argument("--limit", type=int, help="use only the first N samples (default: all)")
    p.add_argument("--no-progress", "--quiet", dest="quiet", action="store_true",
                   help="no progress bar (--quiet is the old spelling)")


def _metrics_path(out: Path, metrics: str | None) -> Path:
    if metrics:
        return Path(metrics)
    if out.name == "default_checkpoint.msgpack":
        return out.with_name("default_metrics.json")
    return out.with_name(out.stem + "_metrics.json")


def _stderr_line(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} train-gnn: {message}", file=sys.stderr, flush=True)


def train_and_report(args: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Runs the whole pipeline for parsed ``args``; returns the metrics written."""
    import dataclasses

    from gnn import checkpoint, evaluate, train
    from gnn.cost_model import GnnCosts

    t0 = time.time()
    ds = train.load_dataset(args.data, limit=args.limit)
    log(f"data: {len(ds.samples)} samples, {len(ds.groups())} groups, models {ds.models()}, "
        f"{ds.skipped} lines skipped, digest {ds.digest()}")
    cfg = train.TrainConfig(hidden=args.hidden, edge_hidden=args.edge_hidden, layers=args.layers,
                            epochs=args.epochs, batch=args.batch, node_budget=args.node_budget, lr=args.lr,
                            loss=args.loss, seed=args.seed)
    # A bar on a terminal; one line per epoch on stderr when redirected (a bar there is noise).
    progress = not args.quiet and sys.stderr.isatty()
    epoch_log = None if args.quiet or progress else _stderr_line
    tr, va, te = train.split(ds, "plans", seed=args.seed)
    model, hist = train.fit(ds, tr, va, cfg, progress=progress, log=epoch_log)
    held = {"gnn": evaluate.evaluate_gnn(model, ds, te), "analytic": evaluate.evaluate_analytic(ds, te),
            "gnn_simulated": evaluate.evaluate_gnn_simulated(GnnCosts(model), ds, te),
            "noise_ceiling_tau": evaluate.noise_ceiling(ds, te)["mean"],
            "history": hist, "sizes": {"train": len(tr), "val": len(va), "test": len(te)}}
    log(f"held-out plans: gnn {evaluate.summary(held['gnn'])}")
    log(f"held-out plans: noise ceiling of tau {held['noise_ceiling_tau']:.3f}")
    log(f"held-out plans: analytic {evaluate.summary(held['analytic'])}")
    log(f"held-out plans: gnn kernels in the simulator {evaluate.summary(held['gnn_simulated'])}")
    lomo: dict[str, Any] = {}
    if args.lomo and len(ds.models()) > 1:
        lcfg = dataclasses.replace(cfg, epochs=args.lomo_epochs or cfg.epochs)
        for m in ds.models():
            ltr, lva, lte = train.split(ds, f"lomo:{m}", seed=args.seed)
            lmodel, lhist = train.fit(ds, ltr, lva, lcfg, progress=progress, log=epoch_log)
            lomo[m] = {"gnn": evaluate.evaluate_gnn(lmodel, ds, lte), "analytic": evaluate.evaluate_analytic(ds, lte),
                       "gnn_simulated": evaluate.evaluate_gnn_simulated(GnnCosts(lmodel), ds, lte),
                       "noise_ceiling_tau": evaluate.noise_ceiling(ds, lte)["mean"],
                       "best_epoch": lhist["best_epoch"], "n": len(lte)}
            log(f"leave out {m}: gnn {evaluate.summary(lomo[m]['gnn'])} | "
                f"analytic {evaluate.summary(lomo[m]['analytic'])} | "
                f"gnn in the simulator {evaluate.summary(lomo[m]['gnn_simulated'])} | "
                f"noise ceiling {lomo[m]['noise_ceiling_tau']:.3f}")
    out = Path(args.out)
    meta = {"train_config": dataclasses.asdict(cfg), "data": {"source": ds.source, "samples": len(ds.samples),
                                                              "digest": ds.digest(), "models": ds.models()},
            "split": "plans", "metrics_summary": {"heldout_plans": evaluate.summary(held["gnn"])}}
    digest = checkpoint.save(out, model, meta)
    metrics = {"checkpoint": str(out), "checkpoint_digest": digest, "model": {"name": "gnn", "version": "1",
               "config": model.config.to_dict()}, **meta, "heldout_plans": held, "leave_one_model_out": lomo,
               "seconds": round(time.time() - t0, 1)}
    mp = _metrics_path(out, args.metrics)
    mp.write_text(json.dumps(metrics, indent=1, sort_keys=True, default=float))
    log(f"wrote {out} (digest {digest}) and {mp} in {metrics['seconds']} s")
    return metrics


def run(args: argparse.Namespace) -> int:
    train_and_report(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train_gnn", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))

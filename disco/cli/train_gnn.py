"""``disco train-gnn``: train the cost GNN on a collector dataset, evaluate it, write a checkpoint.

Steps: check the arguments and the output paths; with ``--trials DB``, append the step times jobs
measured in a plan-service database to ``--data`` (:func:`service.trials.export`); load ``--data``; split held-out plans of every
model (``plans``) and train/evaluate; optionally leave each model out in turn (``--lomo``) and
train/evaluate once per model; compare with AnalyticCosts + the simulator on the same held-out
samples. The model written is the one trained on the ``plans`` split (best validation epoch):
``--out`` (msgpack; default ``gnn_checkpoint.msgpack`` in the current directory) and the
metrics JSON (``--metrics``; default ``<out stem>_metrics.json``, ``default_metrics.json`` next
to a ``default_checkpoint.msgpack``).

With ``--init CHECKPOINT`` (``shipped``: the package's own) the training starts from that
checkpoint's weights and normalisation instead of a fresh model: a fine-tune, e.g. of the shipped
model on the step times jobs measured since (``--trials DB``). Its held-out figures then judge a
model that started from weights trained on data of its own; the log and the metrics name that data.

The files shipped in the ``gnn`` package (the checkpoint ``--cost-model gnn`` loads and its
metrics) are written over only with ``--overwrite-shipped``; retraining the shipped checkpoint::

    disco train-gnn --data DIR --out gnn/default_checkpoint.msgpack --overwrite-shipped \\
        --epochs 12 --lomo --lomo-epochs 4
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from disco.cli.common import CliError, check_output_file, counted

DEFAULT_OUT = "gnn_checkpoint.msgpack"
ARCHITECTURE = {"hidden": 32, "edge_hidden": 8, "layers": 3}  # a fresh model's, where a flag is not given


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``train-gnn`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("train-gnn", help="train the GNN cost model on profiled samples")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="collector dataset directory (samples.jsonl + graphs/)")
    p.add_argument("--trials", metavar="DB",
                   help="first append the step times jobs measured (xla_hooks.jit trials) in this plan-service "
                        "database (SQLite file or postgresql:// URL) to --data (service.trials.export)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"checkpoint to write (msgpack; default {DEFAULT_OUT} in the current directory)")
    p.add_argument("--metrics", help="metrics JSON to write (default: <out stem>_metrics.json next to --out)")
    p.add_argument("--overwrite-shipped", action="store_true",
                   help="allow --out/--metrics to write over files shipped in the gnn package "
                        "(gnn/default_checkpoint.msgpack, which --cost-model gnn loads, and its metrics)")
    p.add_argument("--init", metavar="CHECKPOINT",
                   help="fine-tune: start from this checkpoint's weights (a path, or 'shipped' for "
                        "gnn/default_checkpoint.msgpack) instead of a fresh model; its architecture is kept")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the initialisation (default 0)")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    p.add_argument("--lomo-epochs", type=int, default=None,
                   help="epochs per leave-one-model-out run (default: --epochs)")
    # None: not given (the defaults, or --init's checkpoint's own; ARCHITECTURE)
    p.add_argument("--hidden", type=int, help=f"node hidden width (default {ARCHITECTURE['hidden']})")
    p.add_argument("--edge-hidden", type=int, help=f"edge hidden width (default {ARCHITECTURE['edge_hidden']})")
    p.add_argument("--layers", type=int, help=f"message-passing layers (default {ARCHITECTURE['layers']})")
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


# the integer flags that must be at least 1: flag -> attribute (None, a flag not given, is not checked)
_AT_LEAST_ONE = {"--epochs": "epochs", "--lomo-epochs": "lomo_epochs", "--hidden": "hidden",
                 "--edge-hidden": "edge_hidden", "--layers": "layers", "--batch": "batch",
                 "--node-budget": "node_budget", "--limit": "limit"}


def check_args(args: argparse.Namespace) -> tuple[Path, Path]:
    """Checks the hyperparameters and the output paths before any data is read or trained on;
    returns the checkpoint and metrics paths.

    Raises:
      CliError: naming the flag, the value received and what was expected; for an output path
        that cannot be written; for a file shipped in the gnn package without ``--overwrite-shipped``.
    """
    for flag, attr in _AT_LEAST_ONE.items():
        v = getattr(args, attr)
        if v is not None and v < 1:
            raise CliError(f"{flag} {v}: expected an integer >= 1")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise CliError(f"--lr {args.lr}: expected a finite number > 0 (e.g. 0.002)")
    out = Path(args.out)
    mp = _metrics_path(out, args.metrics)
    check_output_file(str(out), "--out")
    check_output_file(str(mp), "--metrics")
    if out.resolve() == mp.resolve():
        raise CliError(f"--metrics {str(mp)!r} is the checkpoint --out; expected another file")
    for flag, path in (("--out", out), ("--metrics", mp)):
        check_not_shipped(path, flag, args.overwrite_shipped)
    if getattr(args, "init", None) and args.lomo:
        raise CliError("--lomo with --init: every leave-one-model-out run would start from weights trained "
                       "on the model it leaves out; run --lomo without --init")
    return out, mp


class Start(NamedTuple):
    """What ``--init`` starts the training from: the checkpoint's model, where it is, its digest and meta."""

    model: Any
    path: Path
    digest: str
    meta: dict[str, Any]


def start_from(init: str | None, args: argparse.Namespace) -> tuple[Start | None, dict[str, int]]:
    """The checkpoint ``--init`` names (None without it) and the architecture to train: the
    checkpoint's (its opcode embedding width too), or the flags' (:data:`ARCHITECTURE` where one is
    not given).

    Raises:
      CliError: for a checkpoint that is missing or not a disco GNN checkpoint, or an architecture
        flag that differs from the checkpoint's (a fine-tune cannot change the architecture).
    """
    given = {k: getattr(args, k) for k in ARCHITECTURE}
    if not init:
        return None, {k: ARCHITECTURE[k] if v is None else v for k, v in given.items()}
    from gnn import checkpoint, cost_model

    path = cost_model.DEFAULT_CHECKPOINT if init == "shipped" else Path(init)
    if not path.is_file():
        raise CliError(f"--init {init!r}: no such file; expected a checkpoint `disco train-gnn` wrote "
                       f"(.msgpack) or 'shipped' ({cost_model.DEFAULT_CHECKPOINT})")
    try:
        model, meta, digest = checkpoint.load(path)
    except ValueError as e:
        raise CliError(f"--init {init!r}: {e}") from None
    for k, v in given.items():
        have = getattr(model.config, k)
        if v is not None and v != have:
            raise CliError(f"--{k.replace('_', '-')} {v}: the --init checkpoint has {have}; leave the flag out "
                           "(a fine-tune keeps the checkpoint's architecture)")
    return Start(model, path, digest, meta), {k: getattr(model.config, k) for k in (*ARCHITECTURE, "opcode_dim")}


def check_not_shipped(path: Path, flag: str, overwrite_shipped: bool) -> None:
    """Raises CliError for an existing file of the gnn package (a shipped checkpoint, which
    ``--cost-model gnn`` loads, or its metrics) unless ``overwrite_shipped``."""
    from gnn import cost_model

    shipped = cost_model.DEFAULT_CHECKPOINT.parent.resolve()
    if not overwrite_shipped and path.is_file() and path.resolve().is_relative_to(shipped):
        raise CliError(f"{flag} {str(path)!r} is a file shipped in the gnn package (what --cost-model gnn "
                       "loads, or its metrics); write elsewhere, or pass --overwrite-shipped to replace it")


def _stderr_line(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} train-gnn: {message}", file=sys.stderr, flush=True)


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def describe(metrics: dict[str, Any]) -> str:
    """One line of a metrics dict of :mod:`gnn.evaluate`: Kendall tau, then MAPE and regrets in
    percent; a tau that is undefined says why."""
    n = metrics["n"]
    if not n:
        return "no samples"
    if math.isfinite(metrics["tau"]):
        tau = f"tau {metrics['tau']:.3f} (raw {metrics['tau_raw']:.3f})"
    elif not any(g["n"] >= 2 for g in metrics["groups"].values()):
        tau = "tau undefined (no group has 2 or more of these samples)"
    else:
        tau = "tau undefined (predicted or measured times constant within every group)"
    parts = [tau]
    if "mape" in metrics:
        parts.append(f"MAPE {_percent(metrics['mape'])}")
    parts.append(f"top-1 regret {_percent(metrics['top1_regret'])} (worst group {_percent(metrics['top1_regret_max'])})")
    parts.append(f"top-5 regret {_percent(metrics['top5_regret'])}")
    return ", ".join(parts) + f"; {counted(n, 'sample')}"


def _ceiling(tau: float) -> str:
    return f"{tau:.3f}" if math.isfinite(tau) else "undefined (no group has 2 or more of these samples)"


def _report(log: Any, title: str, result: dict[str, Any]) -> None:
    log(f"{title}:")
    log(f"  gnn graph head:                {describe(result['gnn'])}")
    log(f"  gnn kernel head in simulator:  {describe(result['gnn_simulated'])}")
    log(f"  analytic in simulator:         {describe(result['analytic'])}")
    log(f"  noise ceiling of tau:          {_ceiling(result['noise_ceiling_tau'])}")


def train_and_report(args: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Runs the whole pipeline for parsed ``args``; returns the metrics written.

    Raises:
      CliError: for bad arguments or output paths (:func:`check_args`) or a checkpoint ``--init`` cannot
        start from (:func:`start_from`), before any data is read or training done.
    """
    import dataclasses

    from gnn import checkpoint, evaluate, train
    from gnn.cost_model import GnnCosts
    from gnn.params import write_atomic

    out, mp = check_args(args)
    start, arch = start_from(getattr(args, "init", None), args)  # before --trials appends to --data
    t0 = time.time()
    if getattr(args, "trials", None):
        from service.trials import export

        log(f"trials: {counted(export(args.trials, args.data), 'measured sample')} appended from {args.trials}")
    ds = train.load_dataset(args.data, limit=args.limit)
    log(f"data: {len(ds.samples)} samples, {len(ds.groups())} groups, models {', '.join(ds.models())}, "
        f"{counted(ds.skipped, 'line')} skipped, digest {ds.digest()}")
    if start is not None:
        seen = start.meta.get("data", {})
        log(f"init: {start.path} (digest {start.digest}), trained on {seen.get('samples', '?')} samples of "
            f"{', '.join(seen.get('models', [])) or 'unnamed models'}: held-out plans below may be among them")
    cfg = train.TrainConfig(**arch, epochs=args.epochs, batch=args.batch, node_budget=args.node_budget, lr=args.lr,
                            loss=args.loss, seed=args.seed)
    # A bar on a terminal; one line per epoch on stderr when redirected (a bar there is noise).
    progress = not args.quiet and sys.stderr.isatty()
    epoch_log = None if args.quiet or progress else _stderr_line
    tr, va, te = train.split(ds, "plans", seed=args.seed)
    model, hist = train.fit(ds, tr, va, cfg, progress=progress, log=epoch_log,
                            init_model=start.model if start else None)
    held = {"gnn": evaluate.evaluate_gnn(model, ds, te), "analytic": evaluate.evaluate_analytic(ds, te),
            "gnn_simulated": evaluate.evaluate_gnn_simulated(GnnCosts(model), ds, te),
            "noise_ceiling_tau": evaluate.noise_ceiling(ds, te)["mean"],
            "history": hist, "sizes": {"train": len(tr), "val": len(va), "test": len(te)}}
    log("tau: Kendall's tau of predicted against measured times, mean over groups (-1 to 1); "
        "MAPE and regrets in percent")
    _report(log, f"held-out plans ({len(tr)} train / {len(va)} validation / {len(te)} test samples)", held)
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
            _report(log, f"leave out {m} ({len(ltr)} train samples of the other models, {len(lte)} test)", lomo[m])
    meta = {"train_config": dataclasses.asdict(cfg), "data": {"source": ds.source, "samples": len(ds.samples),
                                                              "digest": ds.digest(), "models": ds.models()},
            "split": "plans", "metrics_summary": {"heldout_plans": evaluate.summary(held["gnn"])}}
    if start is not None:  # what the weights started from, and the data that trained them
        meta["init"] = {"checkpoint": str(start.path), "digest": start.digest, "data": start.meta.get("data", {})}
    digest = checkpoint.save(out, model, meta)
    metrics = {"checkpoint": str(out), "checkpoint_digest": digest, "model": {"name": "gnn", "version": "1",
               "config": model.config.to_dict()}, **meta, "heldout_plans": held, "leave_one_model_out": lomo,
               "seconds": round(time.time() - t0, 1)}
    write_atomic(mp, json.dumps(metrics, indent=1, sort_keys=True, default=float).encode())
    log(f"wrote {out} (digest {digest}) and {mp} in {metrics['seconds']} s")
    return metrics


def run(args: argparse.Namespace) -> int:
    train_and_report(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train_gnn", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except (CliError, ValueError) as e:
        print(f"train_gnn: error: {e}", file=sys.stderr)
        return 2

"""Leave-one-model-out for the per-kernel GNN and the analytic roofline, side by side.

For each zoo model in the dataset: train the GNN on the other models' records (all presets and
fusion variants, and every random network's: ``gnn/data/h100_random_kernels_*``, never held out),
refit the analytic model's launch term on them, and judge both on the held-out model's records
(the GNN with its measured corrections, :mod:`gnn.kernel_corrections`, fitted on the fold's
training records as the shipped checkpoint's are, and the network alone): per-kernel
Kendall tau, median and p90 relative error of seconds per launch, each record's step device time
(kernels summed) predicted vs measured, and whether each (model, preset)'s variants are ranked as
measured. Prints a markdown table.

    PYTHONPATH=. python scripts/tools/kernel_lomo.py --kernels ../shared/data/h100_kernels/per_instruction.jsonl.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from disco.cli.common import CliError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", required=True, action="append", help="per_instruction.jsonl(.gz); repeat for several files")
    p.add_argument("--device", default="h100", choices=("cpu", "h100"),
                   help="device kind of the profiles (every record must have been profiled on it; default h100)")
    p.add_argument("--cache", default="/tmp/disco_kernel_cache", help="feature cache directory")
    p.add_argument("--steps", type=int, default=None, help="training steps per fold (default: TrainConfig)")
    p.add_argument("--members", type=int, default=None, help="ensemble members (default: TrainConfig)")
    p.add_argument("--rank-weight", type=float, default=None, help="pairwise ranking loss weight (default: TrainConfig)")
    p.add_argument("--models", help="comma-separated models to hold out (default: every model but the random "
                                    "networks, which train every fold)")
    p.add_argument("--json", help="also write the metrics here")
    p.add_argument("--save-dir", help="also write each fold's GNN here, as without_<model>.msgpack (the checkpoint "
                                      "that never saw <model>: scripts/tools/compiled_accuracy.py --lomo-dir reads them)")
    args = p.parse_args(argv)
    try:
        return _lomo(p, args)
    except (CliError, ValueError, OSError, EOFError) as e:
        print(f"kernel_lomo: error: {e}", file=sys.stderr)
        return 2


def _lomo(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from disco.cli.common import check_output_file
    from disco.sim.costs.device_costs import roofline_config
    from gnn import kernel_corrections as KC
    from gnn import kernel_data as KD
    from gnn import kernel_eval as KE
    from gnn import kernel_model as KM
    from gnn import kernel_train as KT

    check_output_file(args.json, "--json")  # before the folds' training
    if args.save_dir:
        Path(args.save_dir).mkdir(parents=True, exist_ok=True)
    cfg = KT.train_config(steps=args.steps, members=args.members, rank_weight=args.rank_weight)
    records = [r for path in args.kernels for r in KD.load_records(path, cache_dir=args.cache, device=args.device)]
    base = roofline_config(args.device)
    models = sorted({r.model for r in records})
    if len(models) < 2:
        p.error(f"leave-one-model-out needs the records of at least two models; {args.kernels} hold {models}")
    # By default every zoo model is held out in turn; random networks (trax_models.random_names: the
    # corpus drawn for the cost model) are never held out, they train every fold.
    from trax_models import is_random

    held_out = ([m.strip() for m in args.models.split(",") if m.strip()] if args.models
                else [m for m in models if not is_random(m)])
    unknown = sorted(set(held_out) - set(models))
    if unknown or not held_out:
        raise CliError(f"--models {args.models!r}: {unknown or 'none'} not in the records; expected some of "
                       f"{', '.join(models)}")
    out = {"config": dataclasses.asdict(cfg), "folds": {}}
    all_gnn, all_net, all_ana = [], [], []
    covered = [0, 0]  # held-out kernels whose fingerprint the fold's corrections hold, of all
    t_all = time.perf_counter()
    print("| held-out record | kernels | tau gnn / analytic | median err | p90 err | step meas ms | "
          "step gnn ms | step analytic ms | variants ranked as measured gnn / analytic |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for m in held_out:
        train = [r for r in records if r.model != m]
        test = [r for r in records if r.model == m]
        ex = KT.make_examples(train)
        # The analytic baseline: fixed ceilings, the launch term fitted on the training models.
        roof_tr = np.exp(np.concatenate([_roof(r, (base.peak_flops, base.mem_bandwidth, 0.0), labelled=True)
                                         for r in train]))
        meas_tr = np.concatenate([[r.labels[o].per_launch for o in r.profiled_ops()] for r in train])
        launch = KE.fit_launch(roof_tr, meas_tr)
        roofline = (base.peak_flops, base.mem_bandwidth, launch)
        t0 = time.perf_counter()
        model, hist = KT.fit(ex, cfg, roofline)
        secs = time.perf_counter() - t0
        w = KM.weights(model)
        corrections = KT.measured_corrections(w, ex)
        if args.save_dir:
            from gnn.kernel_costs import KernelCosts

            KernelCosts(model, device=args.device, corrections=corrections, meta={
                "data": {"files": [Path(f).name for f in args.kernels], "held_out": m,
                         "models": sorted({r.model for r in train}), "kernels": len(ex)},
                "train_config": dataclasses.asdict(cfg), "train_seconds": secs,
                "measured_kernels": len(corrections)}).save(Path(args.save_dir) / f"without_{m}.msgpack")
        g_ms, n_ms, a_ms = [], [], []
        for r in test:
            net = KT.predict_log_seconds(w, list(r.graphs))
            g_ms.append(KE.record_metrics(r, np.exp(KC.corrected(net, r.graphs, corrections))))
            n_ms.append(KE.record_metrics(r, np.exp(net)))
            a_ms.append(KE.record_metrics(r, np.exp(_roof(r, roofline))))
        all_gnn += g_ms
        all_net += n_ms
        known, total = KE.measured_share(test, corrections)
        covered[0] += known
        covered[1] += total
        all_ana += a_ms
        gv, av = KE.variant_order(g_ms), KE.variant_order(a_ms)
        out["folds"][m] = {"train_seconds": secs, "launch_s": launch, "examples": len(ex),
                           "measured_kernels": len(corrections), "gnn": [_public(x) for x in g_ms],
                           "gnn_network_alone": [_public(x) for x in n_ms], "analytic": [_public(x) for x in a_ms],
                           "order_gnn": gv, "order_analytic": av}
        for g, a in zip(g_ms, a_ms):
            mp = g["record"].rsplit("/", 1)[0]
            print(f"| {g['record']} | {g['kernels']} | {g['tau']:.3f} / {a['tau']:.3f} | "
                        f"{g['median_rel_err']:.1%} / {a['median_rel_err']:.1%} | "
                        f"{g['p90_rel_err']:.1%} / {a['p90_rel_err']:.1%} | {g['step_meas_s'] * 1e3:.2f} | "
                        f"{g['step_pred_s'] * 1e3:.2f} ({g['step_rel_err']:+.1%}) | "
                        f"{a['step_pred_s'] * 1e3:.2f} ({a['step_rel_err']:+.1%}) | "
                        f"{'yes' if gv[mp]['agree'] else 'no'} / {'yes' if av[mp]['agree'] else 'no'} |", flush=True)
        print(f"# held out {m}: trained {hist['steps']} steps on {len(ex)} kernels in {secs:.0f} s, "
              f"analytic launch {launch * 1e6:.2f} us", file=sys.stderr, flush=True)
    for name, ms in (("gnn", all_gnn), ("gnn_network_alone", all_net), ("analytic", all_ana)):
        print("\n" + KE.summary(name, ms).replace(" kernels:", " held-out kernels:", 1))
        out[name] = KE.pooled(ms)
    print(f"\nheld-out kernels with a measured correction: {covered[0]}/{covered[1]} "
          f"({covered[0] / max(covered[1], 1):.1%})")
    out["covered"] = {"kernels": covered[0], "of": covered[1]}
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    return 0


def _roof(r, roofline, labelled: bool = False):  # noqa: ANN001, ANN202
    from gnn import kernel_model as KM

    idx = r.index()
    graphs = [r.graphs[idx[o]] for o in r.profiled_ops()] if labelled else list(r.graphs)
    return KM.roofline_log_seconds(np.stack([g.totals for g in graphs]), np.asarray(roofline, np.float64))


def _public(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("rel_err", "pred", "meas")}


if __name__ == "__main__":
    sys.exit(main())

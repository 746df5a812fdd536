"""Judge a trained per-kernel checkpoint on profiled records it may never have seen.

Prints, per record of ``--kernels``, the per-kernel Kendall tau, median and p90 relative error of
seconds per launch and the step's device time (kernels summed) predicted vs measured; then the
pooled figures with the checkpoint's measured corrections and with the network alone, and how many
of the kernels the corrections hold. Prediction runs wherever this runs (CPU is fine); the labels are
the records' measurements.

    PYTHONPATH=. python scripts/tools/kernel_judge.py --checkpoint gnn/kernel_h100.msgpack \\
        --kernels gnn/data/h100_kernels_2026-11-24.jsonl.gz
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    """Prints the table and the pooled figures; returns the exit status (2 for bad input, one line on stderr)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a per-kernel checkpoint (.msgpack)")
    p.add_argument("--kernels", required=True, action="append", help="per_instruction.jsonl(.gz); repeatable")
    p.add_argument("--cache", default="/tmp/disco_kernel_cache", help="feature cache directory")
    args = p.parse_args(argv)
    try:
        return _judge(args)
    except (ValueError, OSError, EOFError) as e:
        print(f"kernel_judge: error: {e}", file=sys.stderr)
        return 2


def _judge(args: argparse.Namespace) -> int:
    from gnn import kernel_corrections as KC
    from gnn import kernel_data as KD
    from gnn import kernel_eval as KE
    from gnn import kernel_model as KM
    from gnn import kernel_train as KT
    from gnn.kernel_costs import KernelCosts

    try:
        costs = KernelCosts.load(args.checkpoint)
    except FileNotFoundError:
        raise ValueError(f"--checkpoint {args.checkpoint!r}: no such file; expected a per-kernel checkpoint "
                         "(.msgpack)") from None
    except (ValueError, OSError) as e:
        raise ValueError(f"--checkpoint {args.checkpoint!r}: {e}") from None
    w = KM.weights(costs.model)
    # records profiled on another device than the checkpoint's are refused, not judged
    records = [r for path in args.kernels for r in KD.load_records(path, cache_dir=args.cache, device=costs.device)]
    if not records:
        raise ValueError(f"--kernels {', '.join(args.kernels)}: no records; expected per-kernel profiles")
    fixed, alone = [], []
    print("| record | kernels | tau | median err | p90 err | step meas ms | step gnn ms |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        net = KT.predict_log_seconds(w, list(r.graphs))
        m = KE.record_metrics(r, np.exp(KC.corrected(net, r.graphs, costs.corrections)))
        fixed.append(m)
        alone.append(KE.record_metrics(r, np.exp(net)))
        print(f"| {r.key} | {m['kernels']} | {m['tau']:.3f} | {m['median_rel_err']:.1%} | {m['p90_rel_err']:.1%} | "
              f"{m['step_meas_s'] * 1e3:.2f} | {m['step_pred_s'] * 1e3:.2f} ({m['step_rel_err']:+.1%}) |")
    known, total = KE.measured_share(records, costs.corrections)
    print(f"\ncheckpoint {args.checkpoint} (digest {costs.checkpoint_digest}, {len(costs.corrections)} measured "
          f"kernels); kernels with a measured correction: {known}/{total} ({known / max(total, 1):.1%})")
    print(KE.summary("gnn", fixed))
    print(KE.summary("gnn_network_alone", alone))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``disco calibrate``: measure all-reduce latency and bandwidth on CPU devices; write a cluster spec."""

from __future__ import annotations

import argparse
from typing import Any

from disco.cli.common import CliError, check_output_file, print_json, setup_devices


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    p.add_argument("--devices", type=int, default=4, help="CPU devices the all-reduces span (default 4)")
    p.add_argument("--reps", type=int, default=20, help="repetitions per message size (default 20)")
    p.add_argument("--out", metavar="YAML", help="write the calibrated 'local' cluster spec here")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``calibrate`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("calibrate", help="measure all-reduce latency/bandwidth and write a cluster spec")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``disco calibrate``; returns the exit status."""
    if args.reps < 1:
        raise CliError(f"--reps must be >= 1, got {args.reps}")
    check_output_file(args.out, "--out")
    from disco import calibrate as cal
    from disco.sim import cluster

    setup_devices(args.devices)
    c = cal.calibrate(args.devices, reps=args.reps)
    spec = cluster.preset("local", devices=args.devices, calibration=c.as_preset_calibration())
    if args.out:
        with open(args.out, "w") as f:
            f.write(spec.to_yaml())
    out = {**c.to_dict(), "cluster_yaml": args.out}
    if args.json:
        print_json(out)
    else:
        print(f"measured all-reduce on {args.devices} CPU devices (median of {args.reps}):")
        for s, t in zip(c.sizes, c.medians_s):
            print(f"  {s:>10,d} bytes  {t * 1e6:10.1f} us")
        print(f"fit t = {c.fit_a * 1e6:.1f} us + n / {1 / c.fit_b / 1e9:.2f} GB/s; ring link latency "
              f"{c.latency * 1e6:.2f} us, bandwidth {c.bandwidth / 1e9:.2f} GB/s")
        print(f"variadic all-reduce of {cal.OPERANDS} operands ({cal.OPERAND_BYTES:,d} bytes in all) "
              f"{c.variadic_s * 1e6:.1f} us, the same bytes concatenated {c.concat_s * 1e6:.1f} us: "
              f"operand latency {c.operand_latency * 1e6:.1f} us")
        if args.out:
            print(f"wrote {args.out}")
    return 0

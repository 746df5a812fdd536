"""``disco calibrate``: measure all-reduce latency and bandwidth on CPU devices; write a cluster spec."""

from __future__ import annotations

import argparse
from typing import Any

from disco.cli.common import (
    CliError,
    across_processes,
    add_process_args,
    check_output_file,
    check_process_counts,
    note_floors,
    over_label,
    parse_link_arg,
    print_json,
    setup_devices,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    p.add_argument("--devices", type=int, default=4, help="CPU devices the all-reduces span (default 4)")
    p.add_argument("--reps", type=int, default=20, help="repetitions per message size (default 20)")
    p.add_argument("--out", metavar="YAML", help="write the calibrated 'local' cluster spec here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_across_arguments(p)  # --processes, --link, --model


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
    check_process_counts(args)
    if args.model and args.processes < 2:
        raise CliError(f"--model {args.model!r} compares the simulator with measurements across processes: give "
                       "--processes 2 or more (in one process, `disco simulate` and `disco bench` do that)")
    if args.model:  # the comparison runs after the calibration: its arguments are checked before it
        import trax_models

        if args.model not in trax_models.names():
            raise CliError(f"unknown model {args.model!r}; expected one of: {', '.join(trax_models.names())}")
        if args.preset not in trax_models.presets():
            raise CliError(f"unknown preset {args.preset!r}; expected one of: {', '.join(trax_models.presets())}")
        if args.rounds < 1:
            raise CliError(f"--rounds must be >= 1, got {args.rounds}")
    if across_processes(args):  # across processes, maybe over an emulated link
        return run_across(args)
    from disco import calibrate as cal
    from disco.runtime import allreduce_timing as timing

    if args.devices < 2:  # an all-reduce over one device moves nothing: there is no link to measure
        raise CliError(f"--devices must be >= 2 to calibrate all-reduces across devices, got {args.devices}")
    setup_devices(args.devices)
    spec, c = cal.machine_cluster(args.devices, reps=args.reps)
    if args.out:
        with open(args.out, "w") as f:
            f.write(spec.to_yaml())
    out = {**c.to_dict(), "cluster_yaml": args.out}
    note_floors(c.floored)
    if args.json:
        print_json(out)
    else:
        print(f"measured all-reduce on {args.devices} CPU devices (median of {args.reps}):")
        for s, t in zip(c.sizes, c.medians_s):
            print(f"  {s:>10,d} bytes  {t * 1e6:10.1f} us")
        print(f"fit t = {c.fit_a * 1e6:.1f} us + n / {1 / c.fit_b / 1e9:.2f} GB/s; ring link latency "
              f"{c.latency * 1e6:.2f} us, bandwidth {c.bandwidth / 1e9:.2f} GB/s")
        print(f"variadic all-reduce of {timing.OPERANDS} operands ({timing.OPERAND_BYTES:,d} bytes in all) "
              f"{c.variadic_s * 1e6:.1f} us, the same bytes concatenated {c.concat_s * 1e6:.1f} us: "
              f"operand latency {c.operand_latency * 1e6:.1f} us")
        print(rs_ag_line(c))
        if args.out:
            print(f"wrote {args.out}")
    return 0


def rs_ag_line(c: Any) -> str:
    """One line: the all-reduce against the reduce-scatter plus all-gather of the same buffer, and the
    scale an ``rs_ag`` bucket is priced with."""
    if c.rs_ag_s is None:
        return "reduce-scatter plus all-gather: not timed (rs_ag buckets priced as the links price them)"
    from disco.runtime import allreduce_timing as timing

    return (f"all-reduce of {timing.RS_AG_BYTES:,d} bytes per device {c.rs_ag_all_reduce_s * 1e6:.1f} us, a "
            f"reduce-scatter plus all-gather of it {c.rs_ag_s * 1e6:.1f} us: rs_ag scale {c.rs_ag_scale:.3f}")


# -- across processes, maybe over an emulated link ----------------------------------------------
def run_across(args: argparse.Namespace) -> int:
    """``disco calibrate`` across processes: fit, cluster spec, and (with ``--model``) the
    simulator's baselines against measurements."""
    from disco import calibrate

    check_process_counts(args)
    link = parse_link_arg(args)
    runner = calibrate.ProcessRunner(args.processes, args.devices_per_process, link, timeout_s=args.timeout)
    cal = calibrate.calibrate(runner, reps=args.reps)
    spec = calibrate.cluster_spec(cal)
    if args.out:
        with open(args.out, "w") as f:
            f.write(spec.to_yaml())
    out: dict[str, Any] = {**cal.to_dict(), "cluster_yaml": args.out, "cluster": spec.name}
    note_floors(cal.calibration.floored)
    if args.model:
        setup_devices(args.processes * args.devices_per_process)
        out["baselines"] = calibrate.compare_baselines(
            spec, args.processes, args.devices_per_process, link, model=args.model, preset=args.preset,
            rounds=args.rounds, timeout_s=args.timeout)
    if args.json:
        print_json(out)
        return 0
    c = cal.calibration
    print(f"measured all-reduce over {args.processes} processes x {args.devices_per_process} CPU devices over "
          f"{over_label(link)} (slowest process's median of {args.reps}):")
    for s, t in zip(c.sizes, c.medians_s):
        print(f"  {s:>10,d} bytes  {t * 1e6:10.1f} us")
    if cal.chained is not None:
        ch = cal.chained
        print(f"chained all-reduces per call ({'/'.join(map(str, ch.chain))}; ms per call by size):")
        for s, row in zip(ch.sizes, ch.medians_s):
            print(f"  {s:>10,d} bytes  " + "  ".join(f"k={k}: {t * 1e3:8.2f}" for k, t in zip(ch.chain, row)))
        print(f"fit t = {ch.call_s * 1e6:.1f} us + k ({ch.fit_a * 1e6:.1f} us + n / {1 / ch.fit_b / 1e6:.2f} MB/s); "
              f"the lone fit: ring link latency {cal.lone.latency * 1e6:.1f} us, bandwidth "
              f"{cal.lone.bandwidth * 8 / 1e6:.1f} Mbit/s")
    print(("the spec's link (the chained fit's): " if cal.chained is not None else "")
          + f"fit t = {c.fit_a * 1e6:.1f} us + n / {1 / c.fit_b / 1e6:.2f} MB/s; ring link latency "
          f"{c.latency * 1e6:.1f} us, bandwidth {c.bandwidth * 8 / 1e6:.1f} Mbit/s")
    if link is not None:
        print(f"  configured: {link.label()}; fitted bandwidth / rate {c.bandwidth * 8 / link.rate_bps:.3f}"
              + (f", fitted latency / delay {c.latency / link.delay_s:.2f}" if link.delay_s else ""))
    print(f"variadic all-reduce {c.variadic_s * 1e6:.1f} us, concatenated {c.concat_s * 1e6:.1f} us: operand latency "
          f"{c.operand_latency * 1e6:.1f} us")
    print(rs_ag_line(c))
    if "baselines" in out:
        b = out["baselines"]
        f = b["compute_floor"]  # the step with its all-reduces replaced by copies, same rounds
        print(f"{args.model}/{args.preset}: simulated on {spec.name} with the compute scaled to the measured floor "
              f"({f['measured_ms']:.3f} ms vs {f['predicted_ms']:.3f} ms predicted) vs measured (median, slowest "
              f"process); unscaled; latency refitted in the same launch:")
        for r in b["rows"]:
            print(f"  {r['plan']:<12} predicted {r['predicted_ms']:9.3f} ms  measured {r['measured_ms']:9.3f} ms "
                  f"({r['measured_min_ms']:.3f}-{r['measured_max_ms']:.3f})  error {r['error'] * 100:+6.1f}%; "
                  f"unscaled {r['predicted_ms_unscaled']:.3f} ({r['error_unscaled'] * 100:+.1f}%)"
                  + (f"; same launch {r['predicted_ms_same_launch']:.3f} ({r['error_same_launch'] * 100:+.1f}%)"
                     if "predicted_ms_same_launch" in r else ""))
        for key, what in (("", "scaled"), ("_unscaled", "unscaled"), ("_same_launch", "same launch")):
            if f"tau{key}" in b:
                print(f"  {what}: Kendall tau {b[f'tau{key}']:.2f}, mean |error| {b[f'mean_abs_error{key}'] * 100:.1f}%")
        if not b["fingerprints_match"]:
            print("  (the workers compiled a different graph!)")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def add_across_arguments(p: argparse.ArgumentParser) -> None:
    """The flags ``disco calibrate`` takes for a calibration across processes."""
    add_process_args(p)
    p.add_argument("--model", default=None, help="with --processes: also compare the simulator's baselines "
                                                 "of this zoo model with measurements")
    p.add_argument("--preset", default="tiny", help="its preset: tiny | small | paper (default tiny)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the baselines' measurement (default 5)")

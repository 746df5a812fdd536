"""``disco optimize``: search plans for a zoo or real trax model, measure the best, print the verdict.

Registered by :func:`add_parser` (``disco.cli.COMMANDS``). Nothing heavy is imported until
the command runs (``disco --help`` must not import jax).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from disco.cli import _optimize_report as report
from disco.cli.common import (
    CliError,
    across_processes,
    add_cost_model_arg,
    add_model_args,
    add_process_args,
    add_progress_arg,
    check_devices,
    check_output_file,
    check_process_counts,
    device_kind,
    load_cost_model,
    make_step,
    model_label,
    note_device_mismatch,
    note_floors,
    note_placeholder_costs,
    over_label,
    parse_link_arg,
    print_json,
    progress_reporter,
    setup_devices,
    worker_step,
)

STRATEGIES = ("best_first", "annealing", "greedy")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds the ``optimize`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("optimize", help="search fusion and bucketing plans, measure the best, keep the fastest")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments (read by :func:`config_from_args` and :func:`run`)."""
    add_model_args(p)
    p.add_argument("--cluster", default=None, metavar="FILE|PRESET",
                   help="cluster spec file or preset for the simulator (default: this machine: its --devices CPU "
                        "devices with their all-reduces calibrated first, or the H100 preset of that many GPUs; "
                        "with --processes, calibrated across them; 'local': uncalibrated placeholders)")
    add_cost_model_arg(p)
    p.add_argument("--budget", type=float, default=60.0, help="search seconds (default 60)")
    p.add_argument("--max-evals", type=int, default=None, metavar="N",
                   help="also stop the search after N plan evaluations: the same seed then searches the same "
                        "plans on any machine (default: --budget only)")
    p.add_argument("--strategy", default="best_first", choices=STRATEGIES, help="search strategy (default best_first)")
    p.add_argument("--measure-top-k", type=int, default=3,
                   help="plans the model ranks fastest measured in each round of the funnel (default 3)")
    p.add_argument("--measure-rounds", type=int, default=None, metavar="N",
                   help="rounds of the funnel: search on the model, measure its top plans, refit the machine's "
                        "correction (default 3; 2 with --processes, where every round recompiles every plan)")
    p.add_argument("--compiled-top-k", type=int, default=None, metavar="N",
                   help="the funnel's compiled stage: in each round, the N plans the model ranks fastest are "
                        "compiled by XLA and priced by the compiled tier, and that price picks the ones measured "
                        "(CPU devices only; default 0: off). For a cluster whose devices are not here (a GPU cluster from a "
                        "CPU machine) nothing is measured: every candidate is compiled (deviceless XLA:GPU) and "
                        "priced, or with N only the N fastest by the emulated tier and xla_default")
    p.add_argument("--no-learn", dest="learn", action="store_false",
                   help="no correction: the simulator alone ranks the plans of every round")
    p.add_argument("--correction", default=None, metavar="FILE",
                   help="where this machine's correction is kept between runs (default: $DISCO_CORRECTIONS, "
                        "else disco/corrections.json in the per-user cache directory)")
    p.add_argument("--no-keep-correction", dest="keep_correction", action="store_false",
                   help="neither read nor write a kept correction (this run learns from its own measurements only)")
    p.add_argument("--rounds", type=int, default=9, help="interleaved measurement rounds (default 9)")
    p.add_argument("--steps", type=int, default=3, help="steps per round (default 3)")
    p.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    p.add_argument("--finalists", type=int, default=3,
                   help="fastest plans measured again in a run-off before the confirmation (default 3; 1: none)")
    p.add_argument("--confirm-rounds", type=int, default=None,
                   help="rounds of the confirmation run (default 3 x --rounds)")
    p.add_argument("--no-confirm", dest="confirm", action="store_false",
                   help="do not re-measure the chosen plan against xla_default and the best baseline in fresh rounds")
    p.add_argument("--no-bound", dest="bound", action="store_false",
                   help="do not measure the communication-free bound (the step without its all-reduces)")
    p.add_argument("--bucket-sweep", default="2,3,4", metavar="K,K,...",
                   help="bucket counts whose equal-bytes plans (even_K) are measured too (default 2,3,4; "
                        "'' for none)")
    p.add_argument("--memory-limit", default=None, metavar="BYTES",
                   help="bytes per device (2GB, 512MiB, 3e9): a plan whose compiled step's peak memory (XLA's "
                        "memory analysis; for a cluster planned by prediction, predicted: XLA's analysis of the module "
                        "compiled for it) is above it, or above the cluster's device memory, is never chosen")
    p.add_argument("--out", metavar="FILE",
                   help="write the chosen plan as JSON here (default: $DISCO_PLANS/<model>-<preset>-<devices>.json, "
                        "$DISCO_PLANS defaulting to disco/plans in the per-user cache directory)")
    p.add_argument("--details", action="store_true",
                   help="before the answer, every plan measured (the table), the funnel and the diagnostics")
    p.add_argument("--trace", metavar="FILE", help="write the chosen plan's simulated timeline (Chrome trace)")
    p.add_argument("--plot", metavar="FILE", help="draw xla_default's and the chosen plan's timelines (PNG)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--samples", metavar="DIR",
                   help="append the plans measured in the rounds to this dataset directory (disco.samples/1 "
                        "lines, one group per run), training data for `disco train-gnn --data DIR --init shipped`")
    add_progress_arg(p)
    add_process_args(p)  # --processes, --devices-per-process, --timeout, --link


def _bucket_counts(spec: str) -> tuple[int, ...]:
    """``--bucket-sweep`` text ("2,3,4", or "" for none) as bucket counts."""
    items = [t.strip() for t in spec.split(",") if t.strip()]
    try:
        counts = tuple(int(t) for t in items)
    except ValueError:
        raise CliError(f"--bucket-sweep {spec!r}: expected comma-separated bucket counts, e.g. 2,3,4") from None
    return counts  # OptimizeConfig checks them


def _check(args: argparse.Namespace) -> None:
    """What the options of ``optimize`` do not check: the output files (before the search: a bad
    path must not cost the run) and matplotlib for --plot."""
    for flag in ("out", "trace", "plot"):
        check_output_file(getattr(args, flag), f"--{flag}")
    samples = getattr(args, "samples", None)
    if samples and os.path.exists(samples) and not os.path.isdir(samples):
        raise CliError(f"--samples {samples!r} is a file; expected a dataset directory (made when missing)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib, which is not installed; "
                           "`pip install matplotlib` (setup.cfg pins the version)") from None


# the command's flag for each OptimizeConfig field it sets (an error names the flag)
_FLAGS = {"budget_s": "--budget", "max_evals": "--max-evals", "strategy": "--strategy",
          "measure_top_k": "--measure-top-k", "measure_rounds": "--measure-rounds",
          "compiled_top_k": "--compiled-top-k", "learn": "--no-learn",
          "correction_file": "--correction", "seed": "--seed", "rounds": "--rounds", "steps": "--steps",
          "bucket_sweep": "--bucket-sweep", "finalists": "--finalists", "confirm_rounds": "--confirm-rounds",
          "measure_bound": "--no-bound", "confirm": "--no-confirm", "memory_limit": "--memory-limit"}


def config_from_args(args: argparse.Namespace, **fixed: Any) -> Any:
    """The :class:`disco.optimizer.OptimizeConfig` the arguments describe (``fixed``: fields the
    command sets itself). It checks them (without importing jax); its error is reported with the
    flags' names.

    Raises:
      CliError: the config's error, its fields named as the flags.
    """
    import re

    from disco.optimizer import OptimizeConfig

    try:
        return OptimizeConfig(budget_s=args.budget, max_evals=args.max_evals, strategy=args.strategy,
                              measure_top_k=args.measure_top_k, seed=args.seed, rounds=args.rounds, steps=args.steps,
                              measure_bound=args.bound, bucket_sweep=_bucket_counts(args.bucket_sweep),
                              finalists=args.finalists, confirm=args.confirm, confirm_rounds=args.confirm_rounds,
                              memory_limit=getattr(args, "memory_limit", None),
                              **({} if args.compiled_top_k is None else {"compiled_top_k": args.compiled_top_k}),
                              **{"measure_rounds": 3 if args.measure_rounds is None else args.measure_rounds,
                                 "learn": args.learn, "correction_file": correction_file(args), **fixed})
    except ValueError as e:
        fields = "|".join(sorted(_FLAGS, key=len, reverse=True))
        raise CliError(re.sub(rf"\b({fields})\b", lambda m: _FLAGS[m.group(1)], str(e))) from None


def correction_file(args: argparse.Namespace) -> str | None:
    """Where the machine's correction is kept: ``--correction``, else the default
    (:func:`disco.calibrate.kept.default_path`); None with ``--no-keep-correction`` or ``--no-learn``."""
    if not args.learn or not args.keep_correction:
        return None
    if args.correction:
        return args.correction
    from disco.calibrate.kept import default_path

    return default_path()


def run(args: argparse.Namespace) -> int:
    """Runs ``disco optimize``; returns the exit status."""
    _check(args)
    if across_processes(args):  # across processes, maybe over an emulated link
        return run_across(args)
    from disco.sim.cluster import resolve

    check_devices(args.devices)  # before the cluster: --devices 0 is the flag's error, not the preset's
    cluster = resolve(args.cluster, args.devices) if args.cluster else None
    if cluster is not None:
        note_device_mismatch(args.devices, cluster, "disco optimize")
    config = config_from_args(args)  # before the model is built: a bad option must not cost the build
    step, example = make_step(args)  # first: it sets the device count before jax starts
    calibration = None
    if cluster is None:
        cluster, calibration = this_machine(args.devices, "disco optimize")
    from disco.optimizer import measures_here

    if not measures_here(cluster):
        return run_predicted(args, step, example, cluster, config)
    note_placeholder_costs(cluster, "disco optimize")
    costs, cost_info = load_cost_model(args.cost_model, device=cluster.device)
    from disco.optimizer import optimize

    with progress_reporter(not args.no_progress) as progress:
        result = optimize(step, *example, cluster=cluster, costs=costs, config=config, progress=progress)
    plan_file = _write_outputs(args, result, model_label(args))
    _write_samples(args, result, **model_label(args))
    info = {**model_label(args), "device_kind": device_kind(), "cost_model_info": cost_info,
            "cluster_spec": cluster.to_dict(), "calibration": calibration.to_dict() if calibration else None,
            "plan_file": plan_file}
    if args.json:
        print_json({**info, **result.to_dict()})
        return 0
    report.print_measured(result, info, details=args.details)
    return 0


def run_predicted(args: argparse.Namespace, step: Any, example: tuple[Any, ...], cluster: Any, config: Any) -> int:
    """``disco optimize`` for a cluster whose devices are not here (a GPU cluster from a CPU machine):
    the answer chosen by prediction (:func:`disco.optimizer.predict`), nothing measured."""
    import jax

    if args.devices != cluster.num_devices:
        raise CliError(f"--devices {args.devices}: cluster {cluster.name!r} has {cluster.num_devices} devices, and its "
                       f"plans are compiled for them from the step as built (expected --devices {cluster.num_devices})")
    if getattr(args, "samples", None):
        raise CliError(f"--samples: keeps the plans a run measured; cluster {cluster.name!r} is of {cluster.device} "
                       f"devices and this machine runs jax on {jax.default_backend()}, so nothing is measured here "
                       "(xla_hooks.jit(step, service=..., trials=n) measures on the cluster; `disco train-gnn "
                       "--trials DB` trains on those)")
    for flag in ("trace", "plot"):
        if getattr(args, flag):
            raise CliError(f"--{flag}: draws the timelines of a measured run; cluster {cluster.name!r} is of "
                           f"{cluster.device} devices and this machine runs jax on {jax.default_backend()}, so "
                           "nothing is measured here (`disco simulate --cluster ... --trace` draws a plan's)")
    print(f"disco optimize: cluster {cluster.name!r} is of {cluster.device} devices and this machine runs jax on "
          f"{jax.default_backend()}: measuring here would time the wrong devices, so the answer is chosen by "
          "prediction (the compiled tier where it runs, else the emulated one) and nothing is measured; "
          "measure it on the cluster (xla_hooks.jit(step, service=..., trials=n))", file=sys.stderr)
    costs, cost_info = load_cost_model(args.cost_model, device=cluster.device)
    from disco.optimizer import predict

    with progress_reporter(not args.no_progress) as progress:
        result = predict(step, *example, cluster=cluster, costs=costs, config=config, progress=progress)
    plan_file = _write_outputs(args, result, model_label(args))  # --trace and --plot were refused above
    info = {**model_label(args), "style": getattr(args, "style", None), "mesh": getattr(args, "mesh", None),
            "device_kind": device_kind(), "cost_model_info": cost_info, "cluster_spec": cluster.to_dict(),
            "plan_file": plan_file}
    if args.json:
        print_json({**info, **result.to_dict()})
        return 0
    report.print_predicted(result, info, details=args.details)
    return 0


def this_machine(devices: int, command: str) -> tuple[Any, Any]:
    """The cluster plans are priced on when no ``--cluster`` is given (call it after jax's backend
    has started): on CPU, this machine's ``devices`` devices with their all-reduces calibrated
    first (:func:`disco.calibrate.machine_cluster`, a few seconds; one device has none to
    calibrate); on GPUs, the preset of this
    many of jax's device kind (:func:`disco.sim.cluster.machine_preset`).

    Returns:
      (the ClusterSpec, the Calibration on CPU or None).

    Raises:
      CliError: on GPUs no preset describes.
    """
    import jax

    from disco.sim.cluster import PRESETS, machine_preset, preset

    first = jax.devices()[0]
    name = machine_preset(first.platform, first.device_kind, devices)
    if name == "local" and devices < 2:  # no all-reduce crosses devices: nothing to calibrate
        print(f"{command}: one CPU device: no communication to price, so no calibration", file=sys.stderr)
        return preset("local", devices=1), None
    if name == "local":
        from disco.calibrate import machine_cluster

        print(f"{command}: calibrating the all-reduces of this machine's {devices} CPU devices first (a few "
              "seconds; --cluster FILE reuses a `disco calibrate --out FILE`, --cluster local skips it)",
              file=sys.stderr, flush=True)
        spec, cal = machine_cluster(devices)
        note_floors(cal.floored, prefix=f"{command}: ")
        return spec, cal
    if name is None:
        raise CliError(f"no cluster preset describes {devices} x {first.device_kind!r} ({first.platform}): give "
                       f"--cluster FILE (a cluster spec, the format `disco calibrate --out` writes) or one of: "
                       f"{', '.join(PRESETS)}")
    print(f"{command}: pricing plans on preset {name!r} ({devices} x {first.device_kind})", file=sys.stderr)
    return preset(name), None


PLANS_ENV = "DISCO_PLANS"


def default_plan_file(model: str, preset: str, devices: int) -> str:
    """Where ``disco optimize`` writes its answer without ``--out``: ``$DISCO_PLANS`` (a folder),
    else ``disco/plans`` in the per-user cache directory, ``<model>-<preset>-<devices>.json`` there."""
    folder = os.environ.get(PLANS_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "disco", "plans")
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{model}-{preset}-{devices}")
    return os.path.join(folder, name + ".json")


def _write_outputs(args: argparse.Namespace, result: Any, label: dict[str, Any] | None = None) -> str:
    """Writes the answer's plan (``--out``, else :func:`default_plan_file` of ``label``: the model,
    preset and devices), the trace and the plot asked for; returns the plan's file."""
    if not args.out and label is None:
        raise ValueError("_write_outputs: expected --out or the model's label for the default plan file")
    out = args.out or default_plan_file(str(label["model"]), str(label["preset"]), int(label["devices"]))
    try:
        if not args.out:
            os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(result.plan.replace(name=result.chosen).to_json(indent=2) + "\n")
        if args.trace:
            from disco.optimizer import chrome_trace

            with open(args.trace, "w", encoding="utf-8") as f:
                json.dump(chrome_trace(result), f)
    except OSError as e:
        raise CliError(f"cannot write {e.filename!r}: {e.strerror}") from None
    if args.plot:
        report.plot_timelines(result, args.plot)
    return out


def _write_samples(args: argparse.Namespace, result: Any, *, model: str, preset: str, devices: int) -> None:
    """``--samples DIR``: the plans measured in the rounds as training samples (:mod:`disco.data.runs`)."""
    if not getattr(args, "samples", None):
        return
    from disco.data import runs

    try:
        n = runs.export(result, args.samples, model=model, preset=preset, devices=devices)
    except OSError as e:
        raise CliError(f"--samples: cannot write {e.filename!r}: {e.strerror}") from None
    print(f"disco optimize: {n} measured plan{'s' if n != 1 else ''} appended to {args.samples} "
          f"(disco train-gnn --data {args.samples} --init shipped fine-tunes on them)", file=sys.stderr)


# -- across processes, maybe over an emulated link ----------------------------------------------
def run_across(args: argparse.Namespace) -> int:
    """``disco optimize`` across processes: calibrate on the link (unless --cluster), then the same
    pipeline as in one process, measured on the workers (:class:`disco.optimizer.ProcessRunner`)."""
    from disco import calibrate
    from disco.optimizer import ProcessRunner, optimize
    from disco.sim.cluster import resolve

    check_process_counts(args)
    if getattr(args, "trax_model", None):
        raise CliError("--processes runs zoo models only (each worker rebuilds the step by name)")
    for flag in ("trace", "plot"):  # the simulated timelines of the in-process result; none here
        if getattr(args, flag):
            raise CliError(f"--{flag} is written by the optimizer in one process only; with --processes or --link "
                           "the answer is written by --out and the measurements by --json")
    # each row costs a compile in every worker of every launch: no bucket-only projections here
    rounds = {"measure_rounds": 2} if args.measure_rounds is None else {}
    config = config_from_args(args, measure_buckets_only=False, **rounds)
    link = parse_link_arg(args)
    runner = ProcessRunner(args.model, args.preset, args.processes, args.devices_per_process, link,
                           optimizer=args.optimizer, timeout_s=args.timeout, **worker_step(args))
    cal = None
    if args.cluster:  # "local": the devices of all the processes, as in one process
        cluster = resolve(args.cluster, runner.devices)
        if cluster.device != "cpu":
            raise CliError(f"--processes measures plans in CPU worker processes; cluster {cluster.name!r} is of "
                           f"{cluster.device} devices, whose times those are not. Without --processes, disco "
                           "optimize chooses its plan by prediction")
    else:
        cal = calibrate.calibrate(calibrate.ProcessRunner(args.processes, args.devices_per_process, link,
                                                          timeout_s=args.timeout))
        cluster = calibrate.cluster_spec(cal)
        note_floors(cal.calibration.floored, prefix="disco optimize: ")
    setup_devices(runner.devices)  # before anything starts jax's backend
    costs, cost_info = load_cost_model(args.cost_model, device=cluster.device)
    step, example = runner.make_step()
    with progress_reporter(not args.no_progress) as progress:
        result = optimize(step, *example, cluster=cluster, costs=costs, config=config, progress=progress,
                          runner=runner)
    label = {"model": args.model, "preset": args.preset, "devices": runner.devices}
    plan_file = _write_outputs(args, result, label)
    _write_samples(args, result, **label)
    info = {**label, "device_kind": "cpu",
            "processes": args.processes, "devices_per_process": args.devices_per_process,
            "over": over_label(link), "cost_model_info": cost_info, "cluster_spec": cluster.to_dict(),
            "calibration": cal.to_dict() if cal else None, "plan_file": plan_file}
    if args.json:
        print_json({**info, **result.to_dict()})
        return 0
    report.print_measured(result, info, details=args.details)
    return 0

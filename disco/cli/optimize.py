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

from disco.cli.common import (
    CliError,
    Footnotes,
    across_processes,
    add_cost_model_arg,
    add_model_args,
    add_process_args,
    add_progress_arg,
    check_devices,
    check_output_file,
    check_process_counts,
    counted,
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
    print_note,
    progress_reporter,
    setup_devices,
    table_console,
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
    p.add_argument("--out", metavar="FILE", help="write the chosen plan as JSON")
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
          "measure_bound": "--no-bound", "confirm": "--no-confirm"}


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
    _write_outputs(args, result)
    _write_samples(args, result, **model_label(args))
    info = {**model_label(args), "device_kind": device_kind(), "cost_model_info": cost_info,
            "cluster_spec": cluster.to_dict(), "calibration": calibration.to_dict() if calibration else None}
    if args.json:
        print_json({**info, **result.to_dict()})
        return 0
    _print_table(result, info)
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
    _write_outputs(args, result)  # --out only: --trace and --plot were refused above
    info = {**model_label(args), "device_kind": device_kind(), "cost_model_info": cost_info,
            "cluster_spec": cluster.to_dict()}
    if args.json:
        print_json({**info, **result.to_dict()})
        return 0
    _print_predicted(result, info)
    return 0


def _print_predicted(result: Any, info: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=(f"disco optimize {info['model']}/{info['preset']} for cluster {result.cluster!r}"
                     f"{_cluster_note(info)}: predicted with the {_describe_costs(info)} cost model, not measured"))
    for c in ("plan", "from", "emulated ms", "compiled ms", "speedup vs\nxla_default\n(predicted)", "kernels",
              "all-reduces"):
        t.add_column(c, justify="left" if c in ("plan", "from") else "right")
    notes: dict[str, int] = {}
    base = result.row("xla_default").predicted_s(result.tier)
    for r in result.rows:
        origin = r.origin if r.kind == "search" else "baseline"
        mark = f"[{notes.setdefault(origin, len(notes) + 1)}]" if r.kind == "search" else origin
        mine = r.predicted_s(result.tier)
        t.add_row(escape(r.name + (" *" if r.name == result.chosen else "")), escape(mark), f"{r.emulated_s * 1e3:.3f}",
                  "-" if r.compiled_s is None else f"{r.compiled_s * 1e3:.3f}",
                  f"{base / mine:.3f}x" if base and mine else "-",
                  "-" if r.compiled is None else str(r.compiled.get("kernels")),
                  "-" if r.compiled is None else str(r.compiled.get("collectives")))
    console = table_console()
    console.print(t)
    for origin, i in notes.items():
        print_note(console, f"[{i}] {origin}")
    print_note(console, f"* the answer: {result.chosen}, the fastest by the {result.tier} tier")
    if result.tier_note:
        print_note(console, f"ranked by the emulated tier: {result.tier_note}")
    print_note(console, "emulated: the simulator's step time (Python emulation of XLA's fusion); compiled: the module "
                        "the real compiler builds for the cluster's devices, its kernels and collectives priced on the "
                        "cluster; '-': not compiled (or it failed: --json says why)")
    s = result.search
    print_note(console, f"simulated lower bound {result.lower_bound_s * 1e3:.3f} ms; search: {s.strategy}, {s.evals} "
                        f"plans in {s.seconds:.1f} s")
    print_note(console, f"the answer is {result.chosen}, predicted {result.speedup:.3f}x faster than xla_default on "
                        f"{result.cluster!r} ({result.tier} tier); nothing was measured", bold="the answer")
    _print_plan_lines(console, result.chosen, result.rows)


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


def _write_outputs(args: argparse.Namespace, result: Any) -> None:
    try:
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(result.plan.replace(name=result.chosen).to_json(indent=2) + "\n")
        if args.trace:
            from disco.optimizer import chrome_trace

            with open(args.trace, "w", encoding="utf-8") as f:
                json.dump(chrome_trace(result), f)
    except OSError as e:
        raise CliError(f"cannot write {e.filename!r}: {e.strerror}") from None
    if args.plot:
        plot_timelines(result, args.plot)


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


def _cluster_note(info: dict[str, Any]) -> str:
    """" (<label>)" for the table's title: where the cluster's costs come from."""
    label = (info.get("cluster_spec") or {}).get("label")
    return f" ({label})" if label else ""


def _describe_costs(info: dict[str, Any]) -> str:
    c = info["cost_model_info"]
    if c["name"] == "gnn":
        return f"gnn (checkpoint {c['digest']}, {c['source']}, trained on {c.get('trained_on_samples')} samples)"
    return str(c["name"])


# the table's "(by)": where a row's prediction came from (disco.optimizer._accuracy.SOURCES), short
_SHORT_SOURCES = {"emulated": "emu", "corrected": "cor", "compiled": "cmp", "compiled-corrected": "cmp+cor",
                  "profiled": "prof", "gnn": "gnn"}


def _print_table(result: Any, info: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    base_row = result.row("xla_default")
    baseline_rows = [r for r in result.rows if r.kind == "baseline" and r.name != "xla_default" and r.applied]
    best_base = max((r.gain(base_row) for r in baseline_rows), default=None)
    again = result.runoff.speedups if result.runoff is not None else {}
    lb = result.setting.lower_bound_s
    where = (f"{info['processes']} processes x {info['devices_per_process']} CPU devices over {info['over']} "
             "(a round's time: the slowest process's" if info.get("processes") else
             f"{info['devices']} devices ({info['device_kind']}")
    t = Table(title=(f"disco optimize {info['model']}/{info['preset']} on {where}"
                     f"; predicted by the simulator with the {_describe_costs(info)} "
                     "cost model on cluster "
                     f"{result.setting.cluster!r}{_cluster_note(info)}; measured, "
                     f"{counted(result.config.rounds, 'round')} x "
                     f"{counted(result.config.steps, 'step')})"))
    # headers cut over lines by hand, so that the table fits 120 columns (the legend below explains them)
    cols = ["plan", "from", "predicted\nms (by)", "measured ms\nmedian (min-max)", "speedup vs\nxla_default\n(paired)",
            "vs best\nbaseline"]
    cols += ["run-off\nspeedup"] if again else []
    for col in (*cols, "predicted /\nlower bound"):
        # the figures on one line each, the plan's name wrapped if need be; a cell still too wide folds, never cut
        t.add_column(col, overflow="fold", no_wrap=col != "plan")
    notes = Footnotes()  # a searched row's origin, under the table
    for r in result.ordered_rows():
        mark = " *" if r.name == result.chosen else ""
        meas = (f"{r.median_s * 1e3:.3f} ({r.min_s * 1e3:.3f}-{r.max_s * 1e3:.3f})"
                if r.median_s is not None else "-")
        if not r.applied:
            meas += " fell back"
        cells = [escape(r.name) + mark, "baseline" if r.kind != "search" else notes.mark(r.origin), f"{r.predicted_s * 1e3:.3f} {_SHORT_SOURCES.get(r.predicted_by, r.predicted_by)}",
                 meas, f"{r.gain(base_row):.3f}x" if r.median_s else "-",
                 f"{r.gain(base_row) / best_base:.3f}x" if r.median_s and best_base else "-"]
        cells += [f"{again[r.name]:.3f}x" if r.name in again else "-"] if again else []
        t.add_row(*cells, f"{r.predicted_s / lb:.2f}x" if lb > 0 else "-")
    console = table_console()
    console.print(t)
    notes.print(console)
    for line in result.legend():
        print_note(console, line)
    print_note(console, "by: where the prediction came from, made before the plan was measured: emu the simulator "
                        "(emulated fusion, the cost model's kernel times), gnn its GNN kernel times, prof profiled "
                        "kernel times, cor the simulator through this machine's correction fitted from other "
                        "plans' measurements, cmp the compiled tier (the module XLA built for the plan, "
                        "--compiled-top-k), cmp+cor the compiled tier through the correction")
    s = result.search
    print_note(console, f"simulated lower bound {lb * 1e3:.3f} ms; search: {s.strategy}, {s.evals} plans "
                  f"in {s.seconds:.1f} s ({s.evals_per_s:.0f} evaluations/s)")
    print_note(console, result.accuracy.line())
    note = result.learning_note()
    if note:
        print_note(console, note)
    for label, times in (("run-off", result.runoff and result.runoff.times),
                         ("confirmation run", result.confirmation and result.confirmation.times)):
        if times is not None:
            line = ", ".join(f"{k} {v[0] * 1e3:.3f} ({v[1] * 1e3:.3f}-{v[2] * 1e3:.3f})" for k, v in times.items())
            if label == "confirmation run":
                c = result.confirmation
                line += f"; {c.candidate}'s paired speedup there {c.speedup:.3f}x"
                if c.baseline is not None:
                    line += f", the best baseline {c.baseline}'s {c.baseline_speedup:.3f}x"
                if c.vs_baseline is not None and c.vs_baseline_interval is not None:
                    lo, hi = c.vs_baseline_interval
                    line += f"; {c.candidate} {c.vs_baseline:.3f}x of {c.baseline} (90% interval {lo:.3f}-{hi:.3f})"
            print_note(console, f"{label} (ms, median (min-max)): {line}")
    note = result.bound_note()
    if note:
        print_note(console, note)
    _print_verdict(console, result.verdict)
    print_note(console, f"the answer is {result.relation}")
    _print_plan_lines(console, result.chosen, result.rows)


def _print_plan_lines(console: Any, chosen: str, rows: Any) -> None:
    """The answer's plan, and the search's best (disco_1) when it is another, one line each."""
    for r in [next(r for r in rows if r.name == chosen)] + [r for r in rows if r.name == "disco_1" and r.name != chosen]:
        p = r.plan
        opts = ", ".join(f"{k}={v}" for k, v in p.compile_options) or "XLA's defaults"
        print_note(console, f"{'chosen' if r.name == chosen else 'search best'} {r.name}: "
                      f"{counted(len(p.groups), 'fusion group')}, {counted(len(p.cuts), 'cut')}, "
                      f"{'XLA combiner' if p.buckets is None else counted(len(p.buckets), 'bucket')}"
                      f"; compile options: {opts}")


def measured_times(result: Any) -> tuple[str, dict[str, tuple[float, float, float]]]:
    """Where the plot's measured times come from and xla_default's and the answer's (median, min,
    max) seconds there: the confirmation run when there was one, else the first run."""
    if result.confirmation is not None:
        return "confirmation run", {n: tuple(v) for n, v in result.confirmation.times.items()}
    names = dict.fromkeys(("xla_default", result.chosen))
    return "first run", {n: (result.row(n).median_s, result.row(n).min_s, result.row(n).max_s) for n in names
                         if result.row(n).median_s is not None}


def plot_timelines(result: Any, path: str) -> None:
    """Writes :func:`draw_timelines`'s figure to ``path`` (PNG, or what the suffix names).

    Raises:
      CliError: when matplotlib is missing or the file cannot be written.
    """
    fig = draw_timelines(result)  # first: it says when matplotlib is missing
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise CliError(f"cannot write --plot file {path!r}: {e.strerror}") from None
    finally:
        plt.close(fig)


def draw_timelines(result: Any) -> Any:
    """A matplotlib figure: xla_default's and the chosen plan's simulated compute/comm streams, one
    above the other, and below them their measured step times (median, min-max), each labelled right
    of its whisker, with a colour legend above the first panel.

    Raises:
      CliError: when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise CliError("--plot needs matplotlib, which is not installed; `pip install matplotlib`") from None
    from disco.optimizer import chrome_trace

    panels = [("xla_default", chrome_trace(result, "xla_default"))]
    if result.chosen != "xla_default":
        panels.append((result.chosen, chrome_trace(result)))
    source, measured = measured_times(result)
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(12, 2.2 * len(panels) + 2.2),
                             gridspec_kw={"height_ratios": [2] * len(panels) + [1.4]})
    colors = {0: "tab:blue", 1: "tab:orange"}
    for ax, (label, trace) in zip(axes, panels):
        for tid, stream in ((0, "compute"), (1, "comm")):
            spans = [(e["ts"] / 1e3, e["dur"] / 1e3) for e in trace["traceEvents"]
                     if e.get("ph") == "X" and e.get("tid") == tid]
            ax.broken_barh(spans, (1 - tid - 0.4, 0.8), facecolors=colors[tid], edgecolor="white", linewidth=0.3)
        ax.set_yticks([1, 0], ["compute", "comm"])
        step_ms = trace["otherData"]["step_time_s"] * 1e3
        meas = measured.get(label)
        real = f"; measured {meas[0] * 1e3:.3f} ms median ({source})" if meas else ""
        ax.set_title(f"{label}: {step_ms:.3f} ms simulated{real}", fontsize=10, loc="left")
        ax.set_xlabel("ms from the step's start (simulated timeline)", fontsize=8)
    axes[0].legend(handles=[Patch(color=colors[0], label="compute (kernels)"),
                            Patch(color=colors[1], label="communication (all-reduces)")],
                   loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    ax = axes[-1]
    names = list(measured)
    med = [measured[n][0] * 1e3 for n in names]
    err = [[(measured[n][0] - measured[n][1]) * 1e3 for n in names],
           [(measured[n][2] - measured[n][0]) * 1e3 for n in names]]
    ax.barh(names, med, xerr=err, color=["tab:gray" if n == "xla_default" else "tab:green" for n in names],
            capsize=4)
    ends = [measured[n][2] * 1e3 for n in names]  # each label right of its bar's max, clear of the whisker
    for i, (v, end) in enumerate(zip(med, ends)):
        ax.text(end, i, f"  {v:.3f} ms", va="center", fontsize=8)
    ax.set_xlim(0, max(ends) * 1.18)
    ax.invert_yaxis()
    ax.set_xlabel(f"measured step time, ms (median, bars: min-max; {source}; answer {result.chosen}, "
                  f"{result.speedup:.3f}x paired)", fontsize=8)
    fig.tight_layout()
    return fig


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
                           optimizer=args.optimizer, style=args.style, timeout_s=args.timeout)
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
    _write_outputs(args, result)
    _write_samples(args, result, model=args.model, preset=args.preset, devices=runner.devices)
    info = {"model": args.model, "preset": args.preset, "devices": runner.devices, "device_kind": "cpu",
            "processes": args.processes, "devices_per_process": args.devices_per_process,
            "over": over_label(link), "cost_model_info": cost_info, "cluster_spec": cluster.to_dict(),
            "calibration": cal.to_dict() if cal else None}
    if args.json:
        print_json({**info, **result.to_dict()})
        return 0
    _print_table(result, info)
    return 0


# How the stages of a verdict begin after the first (disco.optimizer._choice):
# the run-off, the confirmation, and what was kept.
_VERDICT_STAGES = ("but ", "confirmed ", "the best again ", "keeping ", "the answer is ")


def verdict_stages(verdict: str) -> list[str]:
    """The verdict sentence cut into its stages (first run, run-off, confirmation), one per line.

    Cuts at a ``"; "`` outside parentheses that starts a stage (:data:`_VERDICT_STAGES`); the
    sentence is kept whole in ``--json`` and ``OptimizeResult.verdict``.

    Example:
      >>> for stage in verdict_stages("a measured 1.2x (x; but y); but b was the best in a run-off (b 1.3x); "
      ...                             "confirmed in a second run: 1.1x; the best baseline, c, 1.0x"):
      ...     print(stage)
      a measured 1.2x (x; but y)
      but b was the best in a run-off (b 1.3x)
      confirmed in a second run: 1.1x; the best baseline, c, 1.0x
    """
    parts, depth, start, i = [], 0, 0, 0
    while i < len(verdict):
        c = verdict[i]
        depth += (c == "(") - (c == ")")
        if depth == 0 and verdict.startswith("; ", i) and verdict.startswith(_VERDICT_STAGES, i + 2):
            parts.append(verdict[start:i])
            start = i + 2
        i += 1
    parts.append(verdict[start:])
    return parts


def _print_verdict(console: Any, verdict: str) -> None:
    """``verdict:`` and the verdict's first stage, then each later stage on its own indented line."""
    first, *rest = verdict_stages(verdict)
    print_note(console, f"verdict: {first}", bold="verdict:")
    for stage in rest:
        print_note(console, stage, indent="  ")


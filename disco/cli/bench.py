"""``disco bench``: apply plans and measure them, interleaved (in one process or across several)."""

from __future__ import annotations

import argparse
from typing import Any

from disco.cli.common import (
    CliError,
    Footnotes,
    across_processes,
    add_link_arg,
    add_model_args,
    add_plans_arg,
    add_progress_arg,
    add_strict_arg,
    check_process_counts,
    counted,
    device_kind,
    make_step,
    model_label,
    over_label,
    parse_item,
    parse_link_arg,
    print_json,
    progress_reporter,
    read_text_input,
    resolve_plans,
    table_console,
    worker_step,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    add_model_args(p)
    add_plans_arg(p)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--steps", type=int, default=3, help="steps per round (default 3)")
    p.add_argument("--processes", type=int, default=1,
                   help="run across this many local processes (jax.distributed over 127.0.0.1; default 1)")
    p.add_argument("--devices-per-process", type=int, default=2, help="CPU devices per process (default 2)")
    p.add_argument("--timeout", type=float, default=600, help="with --processes: seconds before hung workers are killed (default 600)")
    add_link_arg(p)
    p.add_argument("--bound", action="store_true",
                   help="also measure the communication-free bound: the step with its all-reduces replaced "
                        "by copies (not a plan; across processes, each round the slowest process's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--details", action="store_true",
                   help="before the answer, the table of every plan (times, intervals, compile seconds, fusions, "
                        "all-reduces, fallbacks)")
    add_strict_arg(p)
    add_progress_arg(p)


def _check(args: argparse.Namespace) -> None:
    """The numbers, before the model is built."""
    if args.rounds < 1 or args.steps < 1:
        raise CliError(f"--rounds and --steps must be >= 1, got {args.rounds} and {args.steps}")
    check_process_counts(args)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``bench`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("bench", help="apply plans and measure them, interleaved")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``disco bench``; returns the exit status."""
    _check(args)
    if across_processes(args):
        return _run_processes(args)

    from disco import bench
    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    step, example = make_step(args)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    plans = resolve_plans(args.plans, graph, strict=args.strict)
    if "xla_default" not in plans:
        plans = {"xla_default": resolve_plans("xla_default", graph)["xla_default"], **plans}
    total = len(plans) + int(args.bound) + args.rounds
    done = [0]
    with progress_reporter(not args.no_progress) as progress:
        def on_bench(msg: str) -> None:
            done[0] += 1
            progress("bench", min(1.0, done[0] / total), msg)

        results = bench.run_bench(step, example, plans, rounds=args.rounds, steps=args.steps,
                                  progress=on_bench, comm_free_bound=args.bound)
    base = next(r for r in results if r.name == "xla_default").measurement
    rows = [r.to_dict(base) for r in results]
    info = {**model_label(args),
            "rounds": args.rounds, "steps_per_round": args.steps, "fingerprint": graph.fingerprint,
            "device_kind": device_kind()}
    if args.json:
        print_json({**info, "results": rows})
        return 0
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"disco bench {info['model']}/{info['preset']} on {args.devices} devices "
                    f"({info['device_kind']}, measured, {counted(args.rounds, 'round')} x {counted(args.steps, 'step')})")
    for col in ("plan", "median\nms", "min\nms", "max\nms", "speedup vs\nxla_default", "paired\n(90% interval)",
                "compile\ns", "fusions", "all-reduce\nops (a\nvariadic\none: 1)", "applied"):
        t.add_column(col, overflow="fold", no_wrap=col != "plan")
    # the figures on one line each, the plan's name wrapped if need be; a cell still too wide folds, never cut
    why = Footnotes()  # the fallback reasons, under the table
    for r in rows:
        t.add_row(escape(r["plan"]), f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                  _speedup(r), _paired(r), f"{r['compile_s']:.2f}", str(r["fusions"]),
                  str(r["all_reduces"]), "bound, not a plan" if r["plan_digest"] is None
                  else "yes" if r["applied"] else f"no {why.mark(r['fallback_reason'])}")
    if args.details:
        console = table_console(120)
        console.print(t)
        why.print(console)
        print()
    title = (f"{info['model']}/{info['preset']} on {args.devices} devices, measured on "
             f"{info['device_kind'].split(':')[0].upper()}")
    for line in answer_lines(rows, title=title, rounds=args.rounds, plans=plans, graph=graph,
                             details=args.details):
        print(line)
    return 0


def answer_lines(rows: list[dict[str, Any]], *, title: str, rounds: int, plans: dict[str, Any] | None = None,
                 graph: Any = None, details: bool = False) -> list[str]:
    """``disco bench``'s answer, a few lines of at most 100 columns: the fastest plan that applied,
    its paired speedup over xla_default with its 90% interval and whether that is beyond noise,
    what it does, and what fell back (``--details``: the table before it)."""
    import textwrap

    from disco.plans.naming import describe

    out: list[str] = []

    def add(text: str, indent: str = "  ") -> None:
        out.extend(textwrap.wrap(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_on_hyphens=False, break_long_words=False))

    add(f"disco bench {title} ({counted(rounds, 'round')}, interleaved):", indent="")
    def is_bound(r: dict[str, Any]) -> bool:  # the communication-free bound's row (one process; processes)
        return ("plan_digest" in r and r["plan_digest"] is None) or r.get("plan_digests") == [None]

    measured = [r for r in rows if not is_bound(r)]
    applied = [r for r in measured if r["applied"] and r["plan"] != "xla_default" and r.get("paired_speedup")]
    best = max(applied, key=lambda r: r["paired_speedup"], default=None)
    if best is None:
        add("no plan other than xla_default applied and was measured")
    else:
        span = best.get("paired_interval")
        noise = ("" if span is None else
                 f" (90% interval {span[0]:.3f}-{span[1]:.3f}: "
                 f"{'beyond noise' if span[0] > 1.0 or span[1] < 1.0 else 'within noise'})")
        verb = "faster" if best["paired_speedup"] >= 1.0 else "the speed of"
        add(f"fastest: {best['plan']}, {best['paired_speedup']:.3f}x {verb} XLA's default, paired{noise}")
        if plans is not None and best["plan"] in plans:
            add(f"what it does: {describe(plans[best['plan']], graph)}")
    bound = next((r for r in rows if is_bound(r)), None)
    if bound is not None and bound.get("paired_speedup"):
        add(f"the communication-free bound (not a plan): {bound['paired_speedup']:.3f}x over XLA's default")
    fell = [r["plan"] for r in measured if not r["applied"]]
    if fell:
        add(f"fell back to XLA's default compile: {', '.join(fell)}" + ("" if details else " (--details: why)"))
    add(f"{counted(len(measured), 'plan')} measured; " + ("--json: everything" if details else
                                                         "--details: the table; --json: everything"))
    return out


def _run_processes(args: argparse.Namespace) -> int:
    """``disco bench --processes N``: every process rebuilds the zoo step; the slowest sets the time."""
    from rich.markup import escape
    from rich.table import Table

    from disco.runtime import multiprocess

    if args.trax_model:
        raise CliError("--processes runs zoo models only (each worker rebuilds the step by name); "
                       "drop --trax-model or --processes")
    if args.strict:  # it did nothing there, without a word
        raise CliError("--strict compares plan files with the step built in this process; with --processes "
                       "only the workers build it (a plan for another graph falls back there, and the table "
                       "says so): drop --strict or --processes")
    names = _process_plans(args.plans)
    if "xla_default" not in names:
        names = ("xla_default",) + names
    spec = multiprocess.WorkerSpec(model=args.model, preset=args.preset, plans=names,
                                   rounds=args.rounds, steps=args.steps, optimizer=args.optimizer,
                                   comm_free_bound=args.bound, **worker_step(args))
    res = multiprocess.launch(args.processes, args.devices_per_process, spec, timeout_s=args.timeout,
                              link=parse_link_arg(args))  # --link
    res.raise_if_failed("multi-process bench")
    rows = multiprocess.combine(res)
    info = {"model": args.model, "preset": args.preset, "processes": args.processes,
            "devices_per_process": args.devices_per_process, "rounds": args.rounds,
            "steps_per_round": args.steps, "fingerprints": sorted({r["fingerprint"] for r in res.results}),
            **res.link_info()}
    if args.json:
        print_json({**info, "results": rows})
        return 0
    t = Table(title=f"disco bench {args.model}/{args.preset}: {args.processes} processes x "
                    f"{args.devices_per_process} CPU devices over {over_label(res.link)}, measured; "
                    "median = slowest process")
    for col in ("plan", "median\nms", "min\nms", "max\nms", "speedup vs\nxla_default", "paired\n(90% interval)",
                "all-reduce\nops (a\nvariadic\none: 1)", "applied"):
        t.add_column(col, overflow="fold", no_wrap=col != "plan")
    why = Footnotes()  # the fallback reasons, under the table (cells as in the table above)
    for r in rows:
        t.add_row(escape(r["plan"]), f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                  _speedup(r), _paired(r), str(r["all_reduces"]), "bound, not a plan" if r["plan_digests"] == [None]
                  else "yes" if r["applied"] else f"no {why.mark(r['fallback_reason'])}")
    if args.details:
        console = table_console(120)
        console.print(t)
        why.print(console)
        print()
    title = (f"{args.model}/{args.preset}: {args.processes} processes x {args.devices_per_process} devices over "
             f"{over_label(res.link)}, measured on CPU (a round: the slowest process)")
    for line in answer_lines(rows, title=title, rounds=args.rounds, details=args.details):
        print(line)
    return 0


def _process_plans(spec: str) -> tuple[str, ...]:
    """The ``--plans`` items for the workers, checked before they start: baselines (``horovod:128``
    sets a value) and readable plan files (passed on by absolute path). The workers build each
    baseline item with :func:`disco.plans.baselines.parse_item`, as one process does; an item whose
    row an earlier one has (``even:02`` after ``even:2``) is left out.

    Raises:
      CliError: for an unknown baseline, a bad value, or a plan file that is not a plan.
    """
    import os

    from disco.plans.plan import FusionPlan

    names: list[str] = []
    rows: set[str] = set()
    for item in dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()):
        if item.endswith(".json"):
            try:
                FusionPlan.from_json(read_text_input(item, "plan file", "a plan's JSON (FusionPlan.to_json)"))
            except ValueError as e:
                raise CliError(f"plan file {item!r}: {e}") from None
            names.append(os.path.abspath(item))
            continue
        row = parse_item(item).row
        if row not in rows:
            rows.add(row)
            names.append(item)
    if not names:
        raise CliError("--plans is empty; expected e.g. xla_default,per_tensor,horovod")
    return tuple(names)


def _speedup(row: dict[str, Any]) -> str:
    """A row's ``speedup_vs_xla_default`` (the ratio of medians) as the tables print it (higher is faster)."""
    v = row["speedup_vs_xla_default"]
    return "-" if v is None else f"{v:.3f}x"


def _paired(row: dict[str, Any]) -> str:
    """A row's ``paired_speedup`` and ``paired_interval`` as the tables print them."""
    v, span = row.get("paired_speedup"), row.get("paired_interval")
    if v is None:
        return "-"
    return f"{v:.3f}x" + ("" if span is None else f" ({span[0]:.3f}-{span[1]:.3f})")

"""``disco graph``: extract a step's HLO graph (or read an HLO dump) and print a summary."""

from __future__ import annotations

import argparse
import os
from typing import Any

from disco.cli.common import (
    CliError,
    add_model_args,
    apply_model_defaults,
    check_output_dir,
    defer_model_defaults,
    make_step,
    model_args_given,
    model_label,
    print_json,
    read_text_input,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    add_model_args(p)
    defer_model_defaults(p)  # --hlo with --model is refused, not silently ignored
    p.add_argument("--hlo", metavar="FILE", help="read an HLO text dump instead of building a zoo model")
    p.add_argument("--module", metavar="NAME",
                   help="with --hlo: the module to read from a file holding several ('#N': the N-th)")
    p.add_argument("--optimized", action="store_true", help="the post-optimisation (compiled) HLO")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dump", metavar="DIR", help="write the HLO text and graph.json to DIR (created if missing)")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``graph`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("graph", help="extract a step's HLO graph and print a summary")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``disco graph``; returns the exit status."""
    import time

    from disco.ir.graph import HloGraph

    check_output_dir(args.dump, "--dump")
    if args.hlo and args.optimized:
        raise CliError("--optimized compiles a zoo model's step; an --hlo file is read as it is "
                       "(give XLA's dump after optimisation itself)")
    given = model_args_given(args)
    if args.hlo and given:
        raise CliError(f"{', '.join(given)} build{'s' if len(given) == 1 else ''} a step; an --hlo file is read as "
                       "it is: expected --hlo FILE or the model options, not both")
    apply_model_defaults(args)
    if args.module and not args.hlo:
        raise CliError("--module selects a module of an --hlo file; expected --hlo FILE with it")
    t0 = time.perf_counter()
    if args.hlo:
        text = read_text_input(args.hlo, "--hlo", "HLO module text")
        source = {"hlo_file": args.hlo}
        optimized_text = None
    else:
        from disco.ir import extractor

        step, example = make_step(args)
        lowered = extractor.lower(step, *example)
        text = extractor.plan_text(lowered, debug_info=True)  # a GSPMD step: its partitioned program
        optimized_text = lowered.compile().as_text() if args.optimized else None
        source = model_label(args)
    try:
        graph = HloGraph.from_hlo_text(optimized_text if optimized_text is not None else text,
                                       module=args.module if args.hlo else None)
    except ValueError as e:
        if not args.hlo:
            raise
        raise CliError(f"--hlo {args.hlo!r}: {e}") from None
    elapsed = time.perf_counter() - t0
    from disco.ir.hlo_parse import is_scheduled

    optimized = is_scheduled(text) if args.hlo else bool(args.optimized)  # a file says itself
    if args.dump:
        try:  # check_output_dir cannot see everything (root passes os.access where /proc refuses)
            os.makedirs(args.dump, exist_ok=True)
            with open(os.path.join(args.dump, "step.pre_opt.hlo.txt"), "w") as f:
                f.write(text)
            if optimized_text is not None:
                with open(os.path.join(args.dump, "step.optimized.hlo.txt"), "w") as f:
                    f.write(optimized_text)
            with open(os.path.join(args.dump, "graph.json"), "w") as f:
                f.write(graph.to_json())
        except OSError as e:
            raise CliError(f"--dump {args.dump!r}: cannot write {e.filename!r}: {e.strerror}") from None
    summary = {**source, "optimized": optimized, **graph.summary(),
               "extract_seconds": round(elapsed, 3)}
    if args.json:
        print_json(summary)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    what = " ".join(f"{k}={v}" for k, v in source.items())
    console.print(f"[bold]disco graph[/bold] {what} ({'post' if optimized else 'pre'}-optimisation HLO)")
    t = Table(show_header=False)
    for key in ("name", "fingerprint", "nodes", "edges", "all_reduces", "gradient_all_reduces",
                "all_reduces_after_loops", "gradient_bytes", "flops", "extract_seconds"):
        val = summary[key]
        t.add_row(key, f"{val:,.0f}" if isinstance(val, float) and key == "flops" else str(val))
    if set(summary["collectives"]) - {"other"}:  # by role and mesh axes (disco.ir.sharded)
        t.add_row("collectives", "; ".join(f"{role} " + ", ".join(f"{n} over {axes}" for axes, n in by.items())
                                           for role, by in summary["collectives"].items()))
    console.print(t)
    hist = Table("opcode", "count", title="opcode histogram (top 15)")
    for op, n in list(summary["opcodes"].items())[:15]:
        hist.add_row(op, str(n))
    console.print(hist)
    if args.dump:
        console.print(f"wrote HLO and graph.json to {args.dump}")
    return 0

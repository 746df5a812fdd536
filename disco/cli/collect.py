"""``disco collect``: measure baselines and random plans per model into a dataset (resumable).

The collecting is :func:`disco.data.collect.collect`; this module parses the command line (for
``disco collect`` and ``scripts/tools/collect_profiles.py``).

Example::

  python scripts/tools/collect_profiles.py --models mlp,transformer_lm --preset tiny \\
      --devices 4 --random 20 --rounds 3 --out /tmp/profiles
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from disco.cli.common import CliError, check_output_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments (read by :func:`config_from_args`)."""
    p.add_argument("--models", required=True, help="comma list of zoo models, e.g. mlp,transformer_lm; with "
                   "--kernels also random:N (N random networks of the cost model's corpus, seeds 0..N-1)")
    p.add_argument("--preset", default="tiny", help="tiny | small | paper (default tiny)")
    p.add_argument("--devices", type=int, default=None,
                   help="data-parallel CPU devices (default 4); with --kernels, default 1 (no all-reduce, as in the shared data)")
    p.add_argument("--random", type=int, default=None, help="random plans per model (default 10)")
    p.add_argument("--out", required=True, metavar="DIR", help="dataset directory (samples.jsonl, graphs/)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds per chunk (default 3; with --kernels: timed rounds for wall_step_ms)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per round (default 3; with --kernels: steps per trace, default 5)")
    p.add_argument("--profile", action="store_true", help="add per-kernel/per-collective times (traced)")
    p.add_argument("--baselines", default=None, help="comma list of baselines (default: all)")
    p.add_argument("--interleave", type=int, default=None,
                   help="plans measured per chunk with the reference (default 3)")
    p.add_argument("--optimizer", default="adamw", help="adamw | adam | sgd (default adamw)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (default: a bar on a terminal, plain lines otherwise)")
    g = p.add_argument_group("per-kernel device times (disco.data.kernel_collect; writes DIR/kernels.jsonl)")
    g.add_argument("--kernels", action="store_true",
                   help="compile each model at --presets under --variants and record every kernel's device time")
    g.add_argument("--presets", default=None, help="with --kernels: comma list of presets (default: --preset)")
    g.add_argument("--variants", default=None,
                   help="with --kernels: comma list of compile-option variants (default: all of the backend's)")
    g.add_argument("--budget-s", type=float, default=None,
                   help="with --kernels: start no record after this many seconds (a rerun resumes)")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``collect`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("collect", help="measure baselines and random plans into a JSONL dataset (resumable)")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def config_from_args(args: argparse.Namespace) -> Any:
    """The :class:`disco.data.collect.CollectConfig` the arguments describe."""
    from disco.data.collect import CollectConfig

    return CollectConfig(
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()), out=args.out,
        preset=args.preset, devices=4 if args.devices is None else args.devices,
        random=10 if args.random is None else args.random,
        rounds=args.rounds, steps=3 if args.steps is None else args.steps,
        profile=args.profile,
        baselines=tuple(b.strip() for b in args.baselines.split(",") if b.strip()) if args.baselines else None,
        interleave=3 if args.interleave is None else args.interleave, optimizer=args.optimizer)


def run(args: argparse.Namespace) -> int:
    """Runs ``disco collect``; prints the summary as one JSON line; returns the exit status."""
    check_output_dir(args.out, "--out")
    _check_mode(args)
    if getattr(args, "kernels", False):
        return _run_kernels(args)
    from disco.data.collect import collect

    try:
        summary = collect(config_from_args(args), show_progress=not args.no_progress)
    except RuntimeError as e:  # another collector holds the directory
        raise CliError(str(e)) from None
    print(json.dumps(dataclasses.asdict(summary), sort_keys=True))
    return 0


def _check_mode(args: argparse.Namespace) -> None:
    """Refuses the options of one mode given to the other (they did nothing there, without a word)."""
    plans = {"--random": args.random, "--profile": args.profile or None, "--baselines": args.baselines,
             "--interleave": args.interleave}
    kernels = {"--presets": getattr(args, "presets", None), "--variants": getattr(args, "variants", None),
               "--budget-s": getattr(args, "budget_s", None)}
    if getattr(args, "kernels", False):
        given = [flag for flag, v in plans.items() if v is not None]
        if given:
            raise CliError(f"{', '.join(given)}: for the plan dataset (disco collect without --kernels); "
                           "--kernels takes --models, --presets, --variants, --devices, --steps and --rounds")
    else:
        given = [flag for flag, v in kernels.items() if v is not None]
        if given:
            raise CliError(f"{', '.join(given)}: for --kernels (what it compiles); expected --kernels with "
                           "them, or --preset for the plan dataset")


def _run_kernels(args: argparse.Namespace) -> int:
    """``disco collect --kernels``: per-kernel device times (:mod:`disco.data.kernel_collect`)."""
    from disco.data import kernel_collect
    from disco.cli.common import setup_devices

    def split(v: str | None) -> tuple[str, ...]:
        return tuple(x.strip() for x in (v or "").split(",") if x.strip())

    # --devices and --steps as given (an explicit --devices 4 was taken as 1, --steps below 5 as 5)
    try:
        cfg = kernel_collect.KernelCollectConfig(
            models=expand_models(split(args.models)), presets=split(args.presets) or (args.preset,), out=args.out,
            variants=split(args.variants) or None, devices=1 if args.devices is None else args.devices,
            steps=5 if args.steps is None else args.steps, rounds=args.rounds, optimizer=args.optimizer,
            budget_s=args.budget_s)
    except ValueError as e:
        raise CliError(str(e)) from None
    setup_devices(cfg.devices)  # virtual CPU devices for --devices above 1, before jax's backend starts
    show = None if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        summary = kernel_collect.collect_kernels(cfg, progress=show)
    except RuntimeError as e:  # another collector holds the directory
        raise CliError(str(e)) from None
    print(json.dumps(dataclasses.asdict(summary), sort_keys=True))
    return 0


def expand_models(models: Sequence[str]) -> tuple[str, ...]:
    """``--models`` with each ``random:N`` replaced by N random networks' names (seeds 0..N-1).

    Raises:
      CliError: for a ``random:`` item whose count is not an int >= 1.
    """
    out: list[str] = []
    for m in models:
        if m.startswith("random:"):
            count = m.partition(":")[2]
            if not count.isdigit() or int(count) < 1:
                raise CliError(f"--models item {m!r}: expected random:N with N an int >= 1 (N random networks)")
            import trax_models

            out += trax_models.random_names(int(count))
        else:
            out.append(m)
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/tools/collect_profiles.py``: the command without the ``disco`` front end."""
    parser = argparse.ArgumentParser(prog="collect_profiles", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, CliError) as e:
        print(f"collect: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

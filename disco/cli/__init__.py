"""The ``disco`` command line: the top layer, the only place that imports every package.

One module per command, each with ``add_parser(sub)`` (and ``add_arguments(p)`` for its
arguments) and ``run(args)``; what several commands share is in :mod:`disco.cli.common`.
:data:`COMMANDS` lists them in the order ``disco --help`` shows. Heavy libraries (jax,
flax, Flask) are imported inside the commands, so ``disco --help`` stays fast and does not
import jax.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from disco import __version__
from disco.cli import bench, calibrate, collect, graph, models, optimize, predict_kernels, simulate, train_gnn
from disco.cli.common import CliError
from disco.runtime.multiprocess import WorkersFailed
from service import cli as service_cli

__all__ = ["COMMANDS", "CliError", "build_parser", "main"]

# name -> the function that adds the subcommand to the subparsers (and sets its ``func``)
COMMANDS: dict[str, Callable[[Any], argparse.ArgumentParser]] = {
    "models": models.add_parser,
    "graph": graph.add_parser,
    "bench": bench.add_parser,
    "calibrate": calibrate.add_parser,
    "simulate": simulate.add_parser,
    "serve": service_cli.add_parser,
    "optimize": optimize.add_parser,
    "train-gnn": train_gnn.add_parser,
    "collect": collect.add_parser,
    "predict-kernels": predict_kernels.add_parser,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``disco`` parser with every command of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="disco",
        description="Joint op fusion and gradient bucketing for data-parallel JAX training steps.")
    parser.add_argument("--version", action="version", version=f"disco {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_parser in COMMANDS.values():
        add_parser(sub)
    return parser


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    """Warnings as ``disco`` prints them: the category and the message, without the source line
    (a ``PlanFallbackWarning`` is news for the user, not a pointer into disco's code)."""
    print(f"warning ({category.__name__}): {message}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``disco``; returns the exit status (2 for a user error, 1 when worker processes failed,
    130 when interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    previous, warnings.showwarning = warnings.showwarning, _one_line_warning
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"disco {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # bad input from the library (unknown names, unparsable HLO, ...)
        print(f"disco {args.command}: error: {e}", file=sys.stderr)
        return 2
    except WorkersFailed as e:  # worker processes timed out or failed: their messages, one line
        print(f"disco {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = previous


if __name__ == "__main__":
    sys.exit(main())

"""``disco models``: list the trax model zoo."""

from __future__ import annotations

import argparse
from typing import Any

from disco.cli.common import print_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    p.add_argument("--json", action="store_true", help="print one JSON object: the models and the presets")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``models`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("models", help="list the trax model zoo")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Prints the zoo's model names (with ``--json``, the presets too)."""
    import trax_models

    if args.json:
        print_json({"models": trax_models.names(), "presets": list(trax_models.presets())})
    else:
        for name in trax_models.names():
            print(name)
    return 0

"""``python -m disco.runtime.testbed --leftovers | --cleanup``: find or remove what testbeds left behind."""

from __future__ import annotations

import argparse
import json
import sys

from disco.runtime.testbed._netns import cleanup, leftovers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m disco.runtime.testbed")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--leftovers", action="store_true", help="list namespaces, devices, files (/etc/netns, the temp dir) and processes left")
    g.add_argument("--cleanup", action="store_true", help="remove them")
    args = ap.parse_args(argv)
    print(json.dumps(leftovers() if args.leftovers else cleanup(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

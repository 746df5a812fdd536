"""``disco predict-kernels``: each kernel of an optimised HLO module and its predicted seconds.

Reads a module as ``Compiled.as_text()`` prints it (XLA:GPU or XLA:CPU), finds every
instruction that launches device work (:func:`gnn.kernel_features.module_kernels`) and prices
each with the cost model named by ``--cost-model`` for ``--device`` (:mod:`disco.sim.costs.registry`).
A kernel inside a while body counts once per execution (its seconds are per launch times the
loop's known trip count). Keys are instruction names, as the profiler reports them in ``hlo_op``.
A module that the other backend's compiler wrote (XLA:GPU's with ``--device cpu``, XLA:CPU's with
``--device h100``; :func:`disco.ir.hlo_parse.compiled_backend`) is refused before any model loads.

    disco predict-kernels --hlo module.txt --device h100 --json
    {"device": "h100", "cost_model": "gnn", "kernels": {"fusion.3": 1.2e-05, ...}, "total_s": 0.0113}

Registered by :func:`add_parser`; nothing heavy is imported until the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DEVICES = ("h100", "cpu")
# The default per device: the per-kernel GNN where one was trained on kernel times (H100); on CPU the
# roofline, since no per-kernel CPU checkpoint is shipped (CPU kernel times did not repeat on this
# project's machine, docs/archive/lab-notebook.md, "Per-kernel times on CPU, re-measured on a quiet machine") and ``gnn`` there is the step-level GNN's kernel part.
DEFAULT_MODEL = {"h100": "gnn", "cpu": "analytic"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    p.add_argument("--hlo", required=True, metavar="FILE", help="optimised module text (Compiled.as_text(); .gz ok)")
    p.add_argument("--module", metavar="NAME",
                   help="the module to read from a file holding several ('#N': the N-th)")
    p.add_argument("--device", required=True, choices=DEVICES, help="the device kind the module was compiled for")
    p.add_argument("--cost-model", default=None, metavar="gnn|analytic|PATH",
                   help="gnn (the checkpoint shipped for the device), analytic (its roofline) or a saved model "
                        f"(default: {', '.join(f'{m} on {d}' for d, m in DEFAULT_MODEL.items())})")
    p.add_argument("--top", type=int, default=20, help="kernels listed in the text output (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``predict-kernels`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("predict-kernels", help="predict the seconds of every kernel of an optimised HLO module")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def predict(hlo: Any, costs: Any, backend: str | None = None) -> dict[str, float]:
    """Instruction name -> predicted seconds per module execution, in program order.

    Args:
      hlo: the optimised module's text, or the module parsed (:func:`disco.ir.hlo_parse.parse_module`).
      costs: the cost model (:mod:`disco.sim.costs.registry`).
      backend: "gpu" or "cpu", the compiler of the module (None: read from the text; see
        :func:`gnn.kernel_features.module_kernels`, which leaves out what XLA:GPU never runs).

    Raises:
      ValueError: for text that is not HLO.
    """
    from gnn.kernel_features import module_kernels

    return {k.name: costs.kernel_time(k.kernel) * k.executions for k in module_kernels(hlo, backend=backend)
            if not k.kernel.is_empty}


def _backend(device: str) -> str:
    """The compiler whose modules ``--device`` prices: "gpu" for a GPU kind, else "cpu"."""
    from disco.sim.cluster_spec import backend_of

    return backend_of(device)


def read_module(path: str, device: str, module: str | None = None) -> Any:
    """The module in file ``path`` (the one named ``module`` of several), parsed, checked against
    ``device`` before any cost model loads.

    Raises:
      CliError: for a file that cannot be read, text that is not HLO, or a module that another
        backend's compiler wrote (an XLA:GPU module with ``--device cpu``, or the other way round).
    """
    from disco.cli.common import CliError, read_text_input
    from disco.ir.hlo_parse import compiled_backend, is_scheduled, parse_module
    from disco.sim.cluster_spec import GPU_DEVICES

    text = read_text_input(path, "--hlo", "optimised HLO module text (Compiled.as_text())")
    try:
        parsed = parse_module(text, module)
    except ValueError as e:
        raise CliError(f"--hlo {path!r}: {e}") from None
    expected = _backend(device)
    backend = compiled_backend(text)
    if backend is not None and backend != expected:
        fits = "cpu" if backend == "cpu" else "/".join(d for d in DEVICES if d in GPU_DEVICES)
        raise CliError(f"--hlo {path!r} is a module compiled by XLA:{backend.upper()} (its backend_config "
                       f"fields say so), but --device {device} prices XLA:{expected.upper()} kernels; expected "
                       f"a module compiled for {device}, or --device {fits}")
    if not is_scheduled(text):
        print("disco predict-kernels: warning: the module's header has no is_scheduled=true: this looks like "
              "HLO before optimisation, whose instructions are not the kernels a device runs; expected "
              "Compiled.as_text() (or XLA's *after_optimizations* dump)", file=sys.stderr)
    return parsed


def run(args: argparse.Namespace) -> int:
    """Prints each kernel's predicted seconds (``--json``: one object) for ``--hlo`` on ``--device``."""
    from disco.cli.common import CliError, load_cost_model

    if args.top < 0:
        raise CliError(f"--top must be >= 0 kernels, got {args.top}")
    module = read_module(args.hlo, args.device, args.module)
    args.cost_model = args.cost_model or DEFAULT_MODEL[args.device]
    if args.cost_model == "gnn" and args.device == "cpu":
        print("disco predict-kernels: note: no per-kernel CPU checkpoint is shipped; gnn on cpu is the step-level "
              "GNN's kernel part, trained on step times, not kernel times (the default on cpu: analytic)",
              file=sys.stderr)
    costs, _ = load_cost_model(args.cost_model, device=args.device)
    kernels = predict(module, costs, _backend(args.device))
    total = sum(kernels.values())
    if args.json:
        print(json.dumps({"device": args.device, "cost_model": args.cost_model, "kernels": kernels,
                          "total_s": total}))
        return 0
    print(f"{len(kernels)} kernel{'' if len(kernels) == 1 else 's'}, predicted {total * 1e3:.3f} ms per execution "
          f"({args.cost_model} on {args.device})")
    for name, s in sorted(kernels.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {s * 1e6:12.2f} us  {name}")
    return 0

"""``disco simulate``: predict step times of plans with the simulator (nothing is measured)."""

from __future__ import annotations

import argparse
from typing import Any

from disco.cli.common import (
    add_cost_model_arg,
    add_model_args,
    add_plans_arg,
    add_strict_arg,
    check_devices,
    load_cost_model,
    make_step,
    model_label,
    note_device_mismatch,
    note_placeholder_costs,
    print_json,
    resolve_plans,
    table_console,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    add_model_args(p)
    add_plans_arg(p)
    p.add_argument("--cluster", help="a cluster YAML file or preset name (default: local with --devices)")
    add_cost_model_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a table)")
    add_strict_arg(p)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds ``simulate`` to the ``disco`` command's subparsers."""
    p = sub.add_parser("simulate", help="predict step times of plans with the simulator")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``disco simulate``; returns the exit status."""
    from disco.ir import extractor
    from disco.ir.graph import HloGraph
    from disco.sim import cluster, simulator

    check_devices(args.devices)
    spec = cluster.resolve(args.cluster, args.devices)  # before the compile: a bad --cluster costs nothing
    note_device_mismatch(args.devices, spec, "disco simulate")
    note_placeholder_costs(spec, "disco simulate")
    step, example = make_step(args)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    plans = resolve_plans(args.plans, graph, strict=args.strict, simulated=True)
    if "xla_default" not in plans:  # the reference of the speedup column, as disco bench adds it
        plans = {"xla_default": resolve_plans("xla_default", graph)["xla_default"], **plans}
    cm, cm_info = load_cost_model(args.cost_model, device=spec.device)  # priced for the cluster's device kind
    cm_info = {**cm_info, "device": spec.device}
    sim = simulator.Simulator(graph, cm, spec)
    rows = []
    for name, plan in plans.items():
        r = sim.run(plan)
        rows.append({"plan": name, **{f"{k}_ms": round(v * 1e3, 4) for k, v in r.summary().items()}})
    base = next((r["step_time_ms"] for r in rows if r["plan"] == "xla_default"), None)
    for r in rows:  # the convention of every table and --json: xla_default's time over the plan's
        r["speedup_vs_xla_default"] = round(base / r["step_time_ms"], 4) if base and r["step_time_ms"] else None
    lb = sim.lower_bound()
    out = {**model_label(args), "cluster": spec.name,
           "cost_model": cm.name, "cost_model_info": cm_info, "simulated": True, "lower_bound_ms": round(lb * 1e3, 4),
           "results": rows}
    if args.json:
        print_json(out)
        return 0
    from rich.table import Table

    t = Table(title=f"simulated (cost model {cm.name}, cluster {spec.name}): {out['model']}/{out['preset']}, "
                    f"lower bound {lb * 1e3:.3f} ms")
    cols = list(rows[0].keys())
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(r[c]) for c in cols])
    table_console(120).print(t)
    return 0

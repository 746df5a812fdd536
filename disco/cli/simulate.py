"""``disco simulate``: predict step times of plans with the simulator (nothing is measured)."""

from __future__ import annotations

import argparse
from typing import Any

from disco.cli.common import (
    CliError,
    add_cost_model_arg,
    add_model_args,
    add_plans_arg,
    add_strict_arg,
    check_devices,
    counted,
    load_cost_model,
    make_step,
    model_label,
    note_device_mismatch,
    note_placeholder_costs,
    print_json,
    resolve_plans,
    setup_devices,
    table_console,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments."""
    add_model_args(p)
    add_plans_arg(p)
    p.add_argument("--cluster", help="a cluster YAML file or preset name (default: local with --devices)")
    add_cost_model_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (default: the answer in a few lines)")
    p.add_argument("--details", action="store_true", help="before the answer, the table of every plan's simulated times")
    add_strict_arg(p)
    p.add_argument("--tier", choices=("emulated", "compiled"), default="emulated",
                   help="emulated: the Python emulation of XLA's fusion (fast); compiled: each plan compiled and "
                        "its real kernels priced: with XLA:CPU on a CPU cluster, with deviceless XLA:GPU on a GPU "
                        "cluster (`make install-gpu`; the step as built for --devices, each plan's buckets and cuts "
                        "written into it, its compile options passed; no fusion groups) (default emulated)")
    g = p.add_argument_group("compiled tier (instead of --model: price the module XLA builds)")
    g.add_argument("--hlo", metavar="FILE",
                   help="a pre-optimisation HLO module (as jax.jit(f).lower(...).as_text(dialect='hlo') prints it), "
                        "or an optimised one (Compiled.as_text()): compiled for --cluster's device (XLA:CPU here, "
                        "deviceless XLA:GPU for an H100 cluster: `make install-gpu`) and priced kernel by kernel")
    g.add_argument("--compile-option", metavar="KEY=VALUE", action="append", default=None,
                   help="an XLA compile option for --hlo (repeatable), e.g. xla_disable_hlo_passes=priority-fusion "
                        "(default: none, XLA's defaults)")
    g.add_argument("--autotune-results", metavar="FILE", default=None,
                   help="XLA's autotuning results (an AutotuneResults textproto, as a GPU compile writes it with "
                        "--xla_gpu_dump_autotune_results_to=FILE.textproto; .gz read too) for the deviceless XLA:GPU "
                        "compile of a GPU cluster (--hlo, or --tier compiled): its GEMMs and convolutions get the "
                        "kernels the device chose. Default: the results shipped for the cluster's "
                        "device (measured on an H100 for the zoo's steps) when the deviceless environment has the jax "
                        "that wrote them; 'none': no results (XLA takes the first candidate that compiles)")


NO_RESULTS = "none"  # --autotune-results none: compile without autotuning results


def autotune_file(arg: str | None, device: str) -> str | None:
    """The autotuning results a deviceless compile for ``device`` loads: the file named, none for
    ``none`` or a CPU, else the ones shipped for the device when they apply
    (:func:`xla_hooks.deviceless.shipped_autotune_results`)."""
    if arg == NO_RESULTS or device == "cpu":
        return None
    if arg is not None:
        return arg
    from xla_hooks import deviceless

    shipped = deviceless.shipped_autotune_results(device)
    return str(shipped) if shipped is not None else None


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

    if args.hlo is not None:
        return run_hlo(args)
    check_devices(args.devices)
    spec = cluster.resolve(args.cluster, args.devices)  # before the compile: a bad --cluster costs nothing
    note_device_mismatch(args.devices, spec, "disco simulate")
    note_placeholder_costs(spec, "disco simulate")
    if args.autotune_results not in (None, NO_RESULTS) and (args.tier != "compiled" or spec.device == "cpu"):
        raise CliError(f"--autotune-results: XLA:GPU's autotuning results are loaded by the deviceless compile of a "
                       f"GPU cluster (--tier compiled); got --tier {args.tier} on cluster {spec.name!r} "
                       f"({spec.device}){' (XLA:CPU does not autotune)' if spec.device == 'cpu' else ''}")
    step, example = make_step(args)
    text = extractor.hlo_text(step, *example)
    graph = HloGraph.from_hlo_text(text)
    plans = resolve_plans(args.plans, graph, strict=args.strict, simulated=True)
    if "xla_default" not in plans:  # the reference of the speedup column, as disco bench adds it
        plans = {"xla_default": resolve_plans("xla_default", graph)["xla_default"], **plans}
    check_plans_for(plans, spec.device, args.tier)
    cm, cm_info = load_cost_model(args.cost_model, device=spec.device)  # priced for the cluster's device kind
    cm_info = {**cm_info, "device": spec.device}
    sim = simulator.Simulator(graph, cm, spec)
    rows = []
    if args.tier == "compiled" and spec.device != "cpu":
        rows += _gpu_compiled_rows(args, text, plans, cm, spec)
    elif args.tier == "compiled":
        from disco.sim import compiled
        from xla_hooks.compile_for import compiled_plan_text

        for name, plan in plans.items():
            r = compiled.price(compiled_plan_text(plan, step, *example), cm, spec, backend="cpu")
            rows.append({"plan": name, **r.summary()})
    for name, plan in plans.items() if args.tier == "emulated" else ():
        r = sim.run(plan)
        rows.append({"plan": name, "kernels_from": "emulated", **{f"{k}_ms": round(v * 1e3, 4) for k, v in r.summary().items()}})
    base = next((r["step_time_ms"] for r in rows if r["plan"] == "xla_default"), None)
    for r in rows:  # the convention of every table and --json: xla_default's time over the plan's
        r["speedup_vs_xla_default"] = round(base / r["step_time_ms"], 4) if base and r["step_time_ms"] else None
    lb = sim.lower_bound()
    autotune = autotune_file(args.autotune_results, spec.device) if args.tier == "compiled" else None
    out = {**model_label(args), "cluster": spec.name, "tier": args.tier, "autotune_results": autotune,
           "cost_model": cm.name, "cost_model_info": cm_info, "simulated": True, "lower_bound_ms": round(lb * 1e3, 4),
           "results": rows}
    if args.json:
        print_json(out)
        return 0
    if args.details:
        _print_table(f"simulated (cost model {cm.name}, cluster {spec.name}): {out['model']}/{out['preset']}, "
                     f"lower bound {lb * 1e3:.3f} ms", rows)
        print()
    for line in answer_lines(rows, plans, graph, title=f"{out['model']}/{out['preset']} on cluster {spec.name!r}",
                             how=f"{args.tier} tier, {cm.name} costs", lower_bound_ms=lb * 1e3,
                             details=args.details):
        print(line)
    return 0


def answer_lines(rows: list[dict[str, Any]], plans: dict[str, Any], graph: Any, *, title: str, how: str,
                 lower_bound_ms: float | None = None, details: bool = False) -> list[str]:
    """``disco simulate``'s answer, a few lines of at most 100 columns: the plan predicted fastest,
    its simulated speedup over xla_default, what it does (``--details``: the table before it)."""
    import textwrap

    from disco.plans.naming import describe

    out: list[str] = []

    def add(text: str, indent: str = "  ") -> None:
        out.extend(textwrap.wrap(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_on_hyphens=False, break_long_words=False))

    add(f"disco simulate {title}: simulated ({how}), nothing measured", indent="")
    timed = [r for r in rows if r.get("step_time_ms")]
    best = min(timed, key=lambda r: r["step_time_ms"], default=None)
    if best is not None:
        gain = best.get("speedup_vs_xla_default")
        vs = ("" if gain is None else f", {gain:.3f}x " + ("faster than" if gain >= 1 else "the speed of")
              + " XLA's default (simulated)")
        if best["plan"] == "xla_default":
            vs = ": no plan priced faster than XLA's default"
        add(f"fastest: {best['plan']}, {best['step_time_ms']:.3f} ms predicted{vs}")
        if best["plan"] in plans:
            add(f"what it does: {describe(plans[best['plan']], graph)}")
    if lower_bound_ms is not None:
        add(f"the simulator's lower bound for this graph: {lower_bound_ms:.3f} ms")
    add(f"{counted(len(rows), 'plan')} priced; " + ("--json: everything" if details else
                                                   "--details: the table; --json: everything"))
    return out


def check_plans_for(plans: dict[str, Any], device: str, tier: str) -> None:
    """Refuses a plan the cluster's backend cannot run (``xla_o1`` on CPU, with the reason) or the
    tier cannot price (XLA:GPU's optimization level and loop passes in the emulated tier, which does not
    model them).

    Raises:
      CliError: naming the plan.
    """
    from disco.plans import options as plan_options
    from disco.sim.cluster_spec import backend_of

    backend = backend_of(device)
    for name, plan in plans.items():
        try:
            plan_options.check(plan.compile_options, backend)
        except ValueError as e:
            raise CliError(f"plan {name!r}: {e}") from None
        unmodelled = plan_options.compiled_only(plan.compile_options) if tier == "emulated" else ()
        if unmodelled:
            raise CliError(f"plan {name!r}: the emulated tier does not model {', '.join(unmodelled)} (XLA:GPU's "
                           "optimization level and loop passes); price it with --tier compiled on a GPU cluster "
                           "(deviceless XLA:GPU)")


def _gpu_compiled_rows(args: argparse.Namespace, text: str, plans: dict[str, Any], cm: Any,
                       spec: Any) -> list[dict[str, Any]]:
    """The compiled tier on a GPU cluster: the step's pre-optimisation ``text`` with each plan applied
    (its buckets and cuts written in, :func:`xla_hooks.compile_for.plan_text_for`) compiled deviceless
    for the cluster's devices with the plan's compile options, and priced.

    Raises:
      CliError: for a step built for another device count than the cluster's, a plan with fusion
        groups (they cannot reach XLA:GPU), or a deviceless compile that is unavailable or fails.
    """
    from disco.sim import compiled
    from xla_hooks import deviceless
    from xla_hooks.compile_for import plan_text_for

    if args.devices != spec.num_devices:
        raise CliError(f"--tier compiled on GPU cluster {spec.name!r} compiles the step as built, for --devices "
                       f"{args.devices}; the cluster has {spec.num_devices} devices (expected --devices "
                       f"{spec.num_devices})")
    for name, plan in plans.items():  # every plan checked before the first compile
        if plan.groups:
            raise CliError(f"plan {name!r}: --tier compiled on GPU cluster {spec.name!r} prices buckets, cuts and "
                           f"compile options; this one has {counted(len(plan.groups), 'fusion group')}, which cannot reach "
                           "XLA:GPU (jax's PJRT plugin takes StableHLO, where mhlo.fusion has no form)")
    results = autotune_file(args.autotune_results, spec.device)
    rows = []
    for name, plan in plans.items():
        try:
            compiled_text = plan_text_for(text, plan, device=spec.device, devices=spec.num_devices,
                                          autotune_results=results)
        except (ValueError, deviceless.DevicelessUnavailable) as e:
            raise CliError(f"--tier compiled, plan {name!r} on {spec.name!r}: {e}") from None
        rows.append({"plan": name, **compiled.price(compiled_text, cm, spec, backend="gpu").summary()})
    return rows


def _print_table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(title=title)
    cols = list(rows[0].keys())
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(r[c]) for c in cols])
    table_console(120).print(t)


def parse_compile_options(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict (a value may be empty: ``xla_gpu_enable_command_buffer=``).

    Raises:
      CliError: for an item without ``=`` or with an empty key.
    """
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CliError(f"--compile-option {item!r}: expected KEY=VALUE, e.g. xla_disable_hlo_passes=priority-fusion")
        out[key.strip()] = value
    return out


def read_hlo_file(path: str) -> str:
    """The text of ``--hlo``'s file.

    Raises:
      CliError: for a missing file, or one that is not HLO text.
    """
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise CliError(f"--hlo {path!r}: no such file; expected a file of HLO text (as "
                       "jax.jit(f).lower(...).as_text(dialect='hlo') prints it)")
    text = p.read_text(encoding="utf-8", errors="replace")
    if "HloModule" not in text:
        raise CliError(f"--hlo {path!r}: not HLO text (no 'HloModule' header; it starts {text[:40]!r}); expected "
                       "a module as jax.jit(f).lower(...).as_text(dialect='hlo') prints it")
    return text


def run_hlo(args: argparse.Namespace) -> int:
    """``disco simulate --hlo FILE``: the module compiled for ``--cluster``'s device and priced (the
    compiled tier), or, for a GPU cluster without the deviceless environment, the emulation with a
    :class:`xla_hooks.deviceless.DevicelessFallbackWarning`."""
    import warnings

    from disco.ir import hlo_parse
    from disco.sim import cluster, compiled
    from disco.sim.cluster_spec import backend_of
    from xla_hooks import deviceless

    options = parse_compile_options(args.compile_option or [])
    text = read_hlo_file(args.hlo)
    spec = cluster.resolve(args.cluster, args.devices if args.cluster in (None, "local") else None)
    if args.autotune_results not in (None, NO_RESULTS) and hlo_parse.is_scheduled(text):
        raise CliError(f"--autotune-results: --hlo {args.hlo} is an optimised module already (XLA chose its "
                       "kernels); expected a pre-optimisation module to compile with the results")
    note_placeholder_costs(spec, "disco simulate")
    cm, cm_info = load_cost_model(args.cost_model, device=spec.device)
    cm_info = {**cm_info, "device": spec.device}
    n = spec.num_devices
    compiled_text = text if hlo_parse.is_scheduled(text) else None
    autotune = autotune_file(args.autotune_results, spec.device) if compiled_text is None else None
    fallback = None
    if compiled_text is None:
        if spec.device == "cpu":
            setup_devices(n)
        try:
            from xla_hooks.compile_for import compile_for

            compiled_text = compile_for(text, device=spec.device, devices=n, options=options,
                                        autotune_results=autotune)
        except deviceless.DevicelessUnavailable as e:
            if deviceless.available():  # the environment is there: the compile itself failed
                raise CliError(f"--hlo {args.hlo}: {e}") from None
            fallback = (f"cluster {spec.name!r} ({spec.device}): deviceless XLA:GPU is not available here, so the "
                        f"kernels are the Python emulation of XLA:GPU's fusion (kernels_from 'emulated'); to price "
                        f"the kernels XLA builds, {deviceless.INSTALL_HINT}")
            warnings.warn(fallback, deviceless.DevicelessFallbackWarning, stacklevel=1)
        except ValueError as e:
            raise CliError(f"--hlo {args.hlo}: {e}") from None
        except Exception as e:  # XLA rejecting the module (jax's JaxRuntimeError), a moved private API
            raise CliError(f"--hlo {args.hlo}: the compile for {spec.device} x{n} failed: "
                           f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        if compiled_text is not None:
            backend = hlo_parse.compiled_backend(compiled_text) or backend_of(spec.device)
            row = {"plan": "xla_default", **compiled.price(compiled_text, cm, spec, backend=backend).summary()}
        else:
            row = _emulated_row(text, cm, spec)
    except ValueError as e:  # hlo_parse.HloParseError among them
        raise CliError(f"--hlo {args.hlo}: {e}") from None
    out = {"hlo": args.hlo, "cluster": spec.name, "devices": n, "compile_options": options,
           "autotune_results": autotune,
           "cost_model": cm.name, "cost_model_info": cm_info, "simulated": True, "results": [row]}
    if fallback:
        out["warning"] = fallback
    if args.json:
        print_json(out)
        return 0
    _print_table(f"simulated (cost model {cm.name}, cluster {spec.name}, kernels {row['kernels_from']}): "
                 f"{args.hlo}", [row])
    return 0


def _emulated_row(text: str, cm: Any, spec: Any) -> dict[str, Any]:
    """The fast tier's row for a pre-optimisation module: XLA's default plan, fusion emulated."""
    from disco.ir.graph import HloGraph
    from disco.sim import simulator

    graph = HloGraph.from_hlo_text(text)
    plan = resolve_plans("xla_default", graph)["xla_default"]
    r = simulator.Simulator(graph, cm, spec).run(plan)
    return {"plan": "xla_default", "kernels_from": "emulated",
            **{f"{k}_ms": round(v * 1e3, 4) for k, v in r.summary().items()}}

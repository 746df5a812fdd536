"""The ``disco`` command line.

Heavy libraries (jax, flax) are imported inside the commands, so ``disco --help``
stays fast and does not import jax.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_MODEL = "transformer_lm"


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2, no traceback."""


def _setup_devices(n: int) -> None:
    """Makes at least ``n`` virtual CPU devices available (before jax's backend starts)."""
    import jax

    if n < 1:
        raise CliError(f"--devices must be at least 1, got {n}")
    try:
        jax.config.update("jax_num_cpu_devices", max(n, 1))
    except RuntimeError:
        pass  # backend already initialised: make_train_step reports a shortage clearly


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"zoo model name (default {DEFAULT_MODEL}; see `disco models`)")
    p.add_argument("--preset", default="tiny", help="tiny | small | paper (default tiny)")
    p.add_argument("--devices", type=int, default=4, help="data-parallel devices (default 4)")
    p.add_argument("--optimizer", default="adamw", help="adamw | adam | sgd (default adamw)")
    g = p.add_argument_group("real trax models (pip install -e '.[trax]'; instead of --model/--preset)")
    g.add_argument("--trax-model", metavar="PATH", default=None,
                   help="a trax layer constructor, e.g. trax.models.TransformerLM")
    g.add_argument("--trax-kwargs", metavar="JSON", default=None,
                   help='its keyword arguments, e.g. \'{"vocab_size": 256, "d_model": 64}\'')
    g.add_argument("--trax-task", default="lm", choices=("lm", "classify"),
                   help="lm: next-token loss on token sequences (needs vocab_size); "
                        "classify: random inputs of --trax-input-shape with random labels")
    g.add_argument("--trax-length", type=int, default=16, help="sequence length for lm (default 16)")
    g.add_argument("--trax-input-shape", default=None, metavar="D,D,...",
                   help="one example's shape for classify, e.g. 32,32,3")
    g.add_argument("--trax-batch", type=int, default=2, help="examples per device (default 2)")


def model_label(args: argparse.Namespace) -> dict[str, Any]:
    """What the step was built from, for tables and JSON: the zoo model and preset, or the trax layer."""
    if getattr(args, "trax_model", None):
        return {"model": args.trax_model, "preset": "trax", "devices": args.devices}
    return {"model": args.model, "preset": args.preset, "devices": args.devices}


def _make_trax_step(args: argparse.Namespace) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import trax_models

    shape = None
    if args.trax_input_shape:
        try:
            shape = tuple(int(d) for d in args.trax_input_shape.split(","))
        except ValueError:
            raise CliError(f"--trax-input-shape {args.trax_input_shape!r} is not a comma list of "
                           "integers; expected e.g. 32,32,3") from None
    _setup_devices(args.devices)
    try:
        return trax_models.make_trax_train_step(
            args.trax_model, args.trax_kwargs, task=args.trax_task, batch_per_device=args.trax_batch,
            length=args.trax_length, input_shape=shape, devices=args.devices, optimizer=args.optimizer)
    except (ImportError, ValueError) as e:
        raise CliError(str(e)) from None


def _make_step(args: argparse.Namespace) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import trax_models

    if getattr(args, "trax_model", None):
        return _make_trax_step(args)
    if args.model not in trax_models.names():
        raise CliError(f"unknown model {args.model!r}; expected one of: {', '.join(trax_models.names())}")
    if args.preset not in trax_models.presets():
        raise CliError(f"unknown preset {args.preset!r}; expected one of: {', '.join(trax_models.presets())}")
    _setup_devices(args.devices)
    return trax_models.make_train_step(args.model, preset=args.preset, devices=args.devices,
                                       optimizer=args.optimizer)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# -- disco models ------------------------------------------------------------------------------
def cmd_models(args: argparse.Namespace) -> int:
    import trax_models

    if args.json:
        _print_json({"models": trax_models.names(), "presets": list(trax_models.presets())})
    else:
        for name in trax_models.names():
            print(name)
    return 0


# -- disco graph -------------------------------------------------------------------------------
def cmd_graph(args: argparse.Namespace) -> int:
    import time

    from disco.ir.graph import HloGraph

    t0 = time.perf_counter()
    if args.hlo:
        try:
            with open(args.hlo, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise CliError(f"cannot read --hlo file {args.hlo!r}: {e.strerror}") from None
        source = {"hlo_file": args.hlo}
        optimized_text = None
    else:
        from disco.ir import extractor

        step, example = _make_step(args)
        lowered = extractor.lower(step, *example)
        text = lowered.as_text(dialect="hlo", debug_info=True)
        optimized_text = lowered.compile().as_text() if args.optimized else None
        source = model_label(args)
    graph = HloGraph.from_hlo_text(optimized_text if optimized_text is not None else text,
                                   module=args.module if args.hlo else None)
    elapsed = time.perf_counter() - t0
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        with open(os.path.join(args.dump, "step.pre_opt.hlo.txt"), "w") as f:
            f.write(text)
        if optimized_text is not None:
            with open(os.path.join(args.dump, "step.optimized.hlo.txt"), "w") as f:
                f.write(optimized_text)
        with open(os.path.join(args.dump, "graph.json"), "w") as f:
            f.write(graph.to_json())
    summary = {**source, "optimized": bool(args.optimized), **graph.summary(),
               "extract_seconds": round(elapsed, 3)}
    if args.json:
        _print_json(summary)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    what = " ".join(f"{k}={v}" for k, v in source.items())
    console.print(f"[bold]disco graph[/bold] {what} ({'post' if args.optimized else 'pre'}-optimisation HLO)")
    t = Table(show_header=False)
    for key in ("name", "fingerprint", "nodes", "edges", "all_reduces", "gradient_all_reduces",
                "gradient_bytes", "flops", "extract_seconds"):
        val = summary[key]
        t.add_row(key, f"{val:,.0f}" if isinstance(val, float) and key == "flops" else str(val))
    console.print(t)
    hist = Table("opcode", "count", title="opcode histogram (top 15)")
    for op, n in list(summary["opcodes"].items())[:15]:
        hist.add_row(op, str(n))
    console.print(hist)
    if args.dump:
        console.print(f"wrote HLO and graph.json to {args.dump}")
    return 0


# -- disco bench -------------------------------------------------------------------------------
def _resolve_plans(spec: str, graph: Any) -> dict[str, Any]:
    from disco.plans import baselines
    from disco.plans.plan import FusionPlan

    plans: dict[str, Any] = {}
    for item in [p.strip() for p in spec.split(",") if p.strip()]:
        if item.endswith(".json"):
            try:
                with open(item, encoding="utf-8") as f:
                    plan = FusionPlan.from_json(f.read())
            except OSError as e:
                raise CliError(f"cannot read plan file {item!r}: {e.strerror}") from None
            plans[plan.name or item] = plan.validate(graph)
            continue
        name, _, arg = item.partition(":")
        kw = {}
        if arg:
            key = {"horovod": "threshold_mb", "ddp": "cap_mb", "xla_threshold": "threshold_bytes",
                   "even": "k"}.get(name)
            if key is None:
                raise CliError(f"plan {item!r}: only horovod:MB, ddp:MB, xla_threshold:BYTES and even:K "
                               "take a value")
            try:
                kw[key] = int(arg) if key in ("threshold_bytes", "k") else float(arg)
            except ValueError:
                raise CliError(f"plan {item!r}: expected a number after ':', got {arg!r}") from None
        if name not in baselines.NAMES:
            raise CliError(f"unknown plan {name!r}; expected a baseline ({', '.join(baselines.NAMES)}) "
                           "or a plan .json file")
        plans[item] = baselines.make(name, graph, **kw)
    if not plans:
        raise CliError("--plans is empty; expected e.g. xla_default,per_tensor,horovod")
    return plans


def cmd_bench_processes(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from disco import multiprocess

    if args.trax_model:
        raise CliError("--processes runs zoo models only (each worker rebuilds the step by name); "
                       "drop --trax-model or --processes")
    names = tuple(p.strip() for p in args.plans.split(",") if p.strip())
    if "xla_default" not in names:
        names = ("xla_default",) + names
    spec = multiprocess.WorkerSpec(model=args.model, preset=args.preset, plans=names,
                                   rounds=args.rounds, steps=args.steps, optimizer=args.optimizer)
    res = multiprocess.launch(args.processes, args.devices_per_process, spec, timeout_s=args.timeout)
    if not res.ok:
        raise CliError("multi-process bench failed: " + "; ".join(res.failures or ("no results",)))
    rows = multiprocess.combine(res)
    info = {"model": args.model, "preset": args.preset, "processes": args.processes,
            "devices_per_process": args.devices_per_process, "rounds": args.rounds,
            "steps_per_round": args.steps, "fingerprints": sorted({r["fingerprint"] for r in res.results})}
    if args.json:
        _print_json({**info, "results": rows})
        return 0
    t = Table(title=f"disco bench {args.model}/{args.preset}: {args.processes} processes x "
                    f"{args.devices_per_process} CPU devices over 127.0.0.1 (gloo), measured; "
                    "median = slowest process")
    for col in ("plan", "median ms", "min ms", "max ms", "vs xla_default", "all-reduces", "applied"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["plan"], f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                  f"{r['ratio_to_xla_default']:.3f}x", str(r["all_reduces"]), "yes" if r["applied"] else "no")
    Console(width=max(120, Console().width)).print(t)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    if args.processes > 1:
        if args.bound:
            raise CliError("--bound is measured in-process only; drop --bound or use --processes 1")
        return cmd_bench_processes(args)

    from disco import bench
    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    step, example = _make_step(args)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    plans = _resolve_plans(args.plans, graph)
    if "xla_default" not in plans:
        plans = {"xla_default": _resolve_plans("xla_default", graph)["xla_default"], **plans}
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as prog:
        task = prog.add_task("bench", total=len(plans) + int(args.bound) + args.rounds)
        results = bench.run_bench(step, example, plans, rounds=args.rounds, steps=args.steps,
                                  progress=lambda msg: prog.update(task, advance=1, description=msg),
                                  comm_free_bound=args.bound)
    base = next(r for r in results if r.name == "xla_default").measurement.median
    rows = [r.to_dict(base) for r in results]
    info = {**model_label(args),
            "rounds": args.rounds, "steps_per_round": args.steps, "fingerprint": graph.fingerprint,
            "device_kind": _device_kind()}
    if args.json:
        _print_json({**info, "results": rows})
        return 0
    from rich.table import Table

    t = Table(title=f"disco bench {info['model']}/{info['preset']} on {args.devices} devices "
                    f"({info['device_kind']}, measured, {args.rounds} rounds x {args.steps} steps)")
    for col in ("plan", "median ms", "min ms", "max ms", "vs xla_default", "compile s", "fusions",
                "all-reduces", "applied"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["plan"], f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}", f"{r['max_ms']:.2f}",
                  f"{r['ratio_to_xla_default']:.3f}x", f"{r['compile_s']:.2f}", str(r["fusions"]),
                  str(r["all_reduces"]), "bound, not a plan" if r["plan_digest"] is None
                  else "yes" if r["applied"] else f"no: {r['fallback_reason']}")
    Console(width=max(120, Console().width)).print(t)
    return 0


def _device_kind() -> str:
    import platform

    import jax

    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')} x{len(jax.devices())} on {platform.machine()}"


# -- disco calibrate / simulate ------------------------------------------------------------------
def cmd_calibrate(args: argparse.Namespace) -> int:
    from disco import calibrate as cal
    from disco.sim import cluster

    _setup_devices(args.devices)
    c = cal.calibrate(args.devices, reps=args.reps)
    spec = cluster.preset("local", devices=args.devices, calibration=c.as_preset_calibration())
    if args.out:
        with open(args.out, "w") as f:
            f.write(spec.to_yaml())
    out = {**c.to_dict(), "cluster_yaml": args.out}
    if args.json:
        _print_json(out)
    else:
        print(f"measured all-reduce on {args.devices} CPU devices (median of {args.reps}):")
        for s, t in zip(c.sizes, c.medians_s):
            print(f"  {s:>10,d} bytes  {t * 1e6:10.1f} us")
        print(f"fit t = {c.fit_a * 1e6:.1f} us + n / {1 / c.fit_b / 1e9:.2f} GB/s; ring link latency "
              f"{c.latency * 1e6:.2f} us, bandwidth {c.bandwidth / 1e9:.2f} GB/s")
        print(f"variadic all-reduce of {cal.OPERANDS} operands ({cal.OPERAND_BYTES:,d} bytes in all) "
              f"{c.variadic_s * 1e6:.1f} us, the same bytes concatenated {c.concat_s * 1e6:.1f} us: "
              f"operand latency {c.operand_latency * 1e6:.1f} us")
        if args.out:
            print(f"wrote {args.out}")
    return 0


DEFAULT_COST_MODEL = "analytic"


def add_cost_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-model", default=DEFAULT_COST_MODEL, metavar="analytic|gnn|FILE",
                   help="analytic (roofline), gnn (the GNN checkpoint shipped in the package), a GNN "
                        f"checkpoint (.msgpack) or a saved cost model (.json) (default {DEFAULT_COST_MODEL})")


def load_cost_model(value: str) -> tuple[Any, dict[str, Any]]:
    """The cost model named by ``--cost-model`` and what to report about it (name, digest, source)."""
    from disco.sim import costs

    try:
        if value == "analytic":
            cm = costs.AnalyticCosts()
        elif value == "gnn" or value.endswith(".msgpack"):
            from gnn.cost_model import GnnCosts, load_default

            cm = load_default() if value == "gnn" else GnnCosts.load(value)
            d = cm.describe()
            return cm, {"name": d["name"], "digest": d["digest"], "source": d["source"],
                        "trained_on_samples": d["trained_on"].get("samples")}
        elif os.path.exists(value):
            cm = costs.load_costs(value)
        else:
            raise CliError(f"--cost-model {value!r}: expected analytic, gnn, a .msgpack GNN checkpoint or "
                           "a cost model .json file")
    except (OSError, ValueError, RuntimeError) as e:
        raise CliError(f"--cost-model {value!r}: {e}") from None
    return cm, {"name": cm.name, "digest": cm.digest(), "source": value if os.path.exists(value) else "built-in"}


def cmd_simulate(args: argparse.Namespace) -> int:
    from disco.ir import extractor
    from disco.sim import simulator
    from disco.ir.graph import HloGraph

    step, example = _make_step(args)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *example))
    plans = _resolve_plans(args.plans, graph)
    from disco.sim import cluster

    spec = cluster.resolve(args.cluster, args.devices)
    cm, cm_info = load_cost_model(args.cost_model)
    if spec.is_gpu and args.cost_model == "analytic":  # the analytic model of the cluster's device kind
        from disco.sim import h100_costs

        cm = h100_costs.for_device(spec.device)
        cm_info = {"name": cm.name, "digest": cm.digest(), "source": "built-in", "device": spec.device}
    sim = simulator.Simulator(graph, cm, spec)
    rows = []
    for name, plan in plans.items():
        r = sim.run(plan)
        rows.append({"plan": name, **{f"{k}_ms": round(v * 1e3, 4) for k, v in r.summary().items()}})
    lb = sim.lower_bound()
    out = {**model_label(args), "cluster": spec.name,
           "cost_model": cm.name, "cost_model_info": cm_info, "simulated": True, "lower_bound_ms": round(lb * 1e3, 4), "results": rows}
    if args.json:
        _print_json(out)
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"simulated (cost model {cm.name}, cluster {spec.name}): {out['model']}/{out['preset']}, "
                    f"lower bound {lb * 1e3:.3f} ms")
    cols = list(rows[0].keys())
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(r[c]) for c in cols])
    Console(width=max(120, Console().width)).print(t)
    return 0


# -- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disco",
        description="Joint op fusion and gradient bucketing for data-parallel JAX training steps.")
    parser.add_argument("--version", action="version", version="disco 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("models", help="list the trax model zoo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("graph", help="extract a step's HLO graph and print a summary")
    _add_model_args(p)
    p.add_argument("--hlo", metavar="FILE", help="read an HLO text dump instead of building a zoo model")
    p.add_argument("--module", metavar="NAME",
                   help="with --hlo: the module to read from a file holding several ('#N': the N-th)")
    p.add_argument("--optimized", action="store_true", help="the post-optimisation (compiled) HLO")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dump", metavar="DIR", help="write the HLO text and graph.json to DIR")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("bench", help="apply plans and measure them, interleaved")
    _add_model_args(p)
    p.add_argument("--plans", default="xla_default,per_tensor,one_bucket,horovod,ddp",
                   help="comma list of baselines (horovod:128 sets a threshold) or plan .json files")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--steps", type=int, default=3, help="steps per round (default 3)")
    p.add_argument("--processes", type=int, default=1,
                   help="run across this many local processes (jax.distributed over 127.0.0.1)")
    p.add_argument("--devices-per-process", type=int, default=2, help="CPU devices per process (default 2)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before hung workers are killed")
    p.add_argument("--bound", action="store_true",
                   help="also measure the communication-free bound: the step with its all-reduces replaced "
                        "by copies (not a plan; in-process only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("calibrate", help="measure all-reduce latency/bandwidth and write a cluster spec")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", metavar="YAML", help="write the calibrated 'local' cluster spec here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("simulate", help="predict step times of plans with the simulator")
    _add_model_args(p)
    p.add_argument("--plans", default="xla_default,per_tensor,one_bucket,horovod,ddp")
    p.add_argument("--cluster", help="a cluster YAML file or preset name (default: local)")
    add_cost_model_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)
    __import__("service.cli", fromlist=["add_parser"]).add_parser(sub)  # disco serve
    __import__("disco.cli.optimize", fromlist=["add_parser"]).add_parser(sub)  # disco optimize
    __import__("gnn.cli", fromlist=["add_parser"]).add_parser(sub)  # disco train-gnn
    __import__("disco.cli.collect", fromlist=["add_parser"]).add_parser(sub)  # disco collect
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"disco {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # bad input from the library (unknown names, unparsable HLO, ...)
        print(f"disco {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

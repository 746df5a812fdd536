"""What several ``disco`` commands share: the error type, model arguments, device setup,
JSON printing, the cost-model and plan arguments, and --processes/--link.

Nothing heavy is imported at module level: ``disco --help`` must not import jax.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

DEFAULT_MODEL = "transformer_lm"
DEFAULT_COST_MODEL = "analytic"
DEFAULT_PLANS = "xla_default,per_tensor,one_bucket,horovod,ddp"


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2, no traceback."""


# -- devices and the step ------------------------------------------------------------------------
MAX_CPU_DEVICES = 4096  # virtual CPU devices jax starts in 1 s here; 100,000 aborted inside XLA (threads)


def check_devices(n: int, flag: str = "--devices") -> None:
    """Raises CliError unless ``n`` virtual CPU devices is a count this machine can start."""
    if not 1 <= n <= MAX_CPU_DEVICES:
        raise CliError(f"{flag} must be 1 to {MAX_CPU_DEVICES:,d} (virtual CPU devices in this process), got {n}")


def setup_devices(n: int) -> None:
    """Makes at least ``n`` virtual CPU devices available (before jax's backend starts).

    Raises:
      CliError: for ``n`` outside 1 to :data:`MAX_CPU_DEVICES`.
    """
    import jax

    check_devices(n)
    try:
        jax.config.update("jax_num_cpu_devices", max(n, 1))
    except RuntimeError:
        pass  # backend already initialised: make_train_step reports a shortage clearly


_MODEL_DEFAULTS = {"model": DEFAULT_MODEL, "preset": "tiny", "devices": 4, "optimizer": "adamw", "style": "shard_map",
                   "mesh": None, "trax_model": None, "trax_kwargs": None, "trax_task": "lm", "trax_length": 16,
                   "trax_input_shape": None, "trax_batch": 2}


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model/--preset/--devices/--optimizer`` and the ``--trax-*`` group (read by :func:`make_step`)."""
    d = _MODEL_DEFAULTS
    p.add_argument("--model", default=d["model"], help=f"zoo model name (default {d['model']}; see `disco models`)")
    p.add_argument("--preset", default=d["preset"], help=f"tiny | small | paper (default {d['preset']})")
    p.add_argument("--devices", type=int, default=d["devices"], help=f"data-parallel devices (default {d['devices']})")
    p.add_argument("--optimizer", default=d["optimizer"], help=f"adamw | adam | sgd (default {d['optimizer']})")
    p.add_argument("--style", default=d["style"],
                   help="how the zoo step is written: shard_map (explicit all-reduces) | pmap (jax.pmap with the "
                        "same pmeans; state and batch with a leading device axis) | gspmd (jax.jit over "
                        "sharded arguments; XLA partitions it) | fsdp (gspmd with the parameters and optimizer "
                        f"state sharded over a data x fsdp mesh) (default {d['style']})")
    p.add_argument("--mesh", default=d["mesh"], metavar="DATAxFSDP",
                   help="--style fsdp only: the data x fsdp mesh, e.g. 2x4 (default 1x<devices>: 1-D FSDP)")
    g = p.add_argument_group("real trax models (pip install -e '.[trax]'; instead of --model/--preset)")
    g.add_argument("--trax-model", metavar="PATH", default=d["trax_model"],
                   help="a trax layer constructor, e.g. trax.models.TransformerLM")
    g.add_argument("--trax-kwargs", metavar="JSON", default=d["trax_kwargs"],
                   help='its keyword arguments, e.g. \'{"vocab_size": 256, "d_model": 64}\'')
    g.add_argument("--trax-task", default=d["trax_task"], choices=("lm", "classify"),
                   help="lm: next-token loss on token sequences (needs vocab_size); classify: random inputs "
                        f"of --trax-input-shape with random labels (default {d['trax_task']})")
    g.add_argument("--trax-length", type=int, default=d["trax_length"],
                   help=f"sequence length for lm (default {d['trax_length']})")
    g.add_argument("--trax-input-shape", default=d["trax_input_shape"], metavar="D,D,...",
                   help="one example's shape for classify, e.g. 32,32,3")
    g.add_argument("--trax-batch", type=int, default=d["trax_batch"],
                   help=f"examples per device (default {d['trax_batch']})")


def defer_model_defaults(p: argparse.ArgumentParser) -> None:
    """For a command that can read a file instead of building a step: the :func:`add_model_args`
    options default to None so that :func:`model_args_given` sees which ones the user gave;
    :func:`apply_model_defaults` puts the documented defaults back before :func:`make_step`."""
    p.set_defaults(**{k: None for k in _MODEL_DEFAULTS})


def model_args_given(args: argparse.Namespace) -> list[str]:
    """The model options given on the command line (as flags), after :func:`defer_model_defaults`."""
    return ["--" + k.replace("_", "-") for k in _MODEL_DEFAULTS if getattr(args, k, None) is not None]


def apply_model_defaults(args: argparse.Namespace) -> None:
    """Fills the model options left at None by :func:`defer_model_defaults` with their defaults."""
    for k, v in _MODEL_DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)


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
    setup_devices(args.devices)
    try:
        return trax_models.make_trax_train_step(
            args.trax_model, args.trax_kwargs, task=args.trax_task, batch_per_device=args.trax_batch,
            length=args.trax_length, input_shape=shape, devices=args.devices, optimizer=args.optimizer)
    except (ImportError, ValueError) as e:
        raise CliError(str(e)) from None


def make_step(args: argparse.Namespace) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The training step and its example arguments named by :func:`add_model_args`' arguments.

    Sets the device count first (before jax's backend starts).

    Raises:
      CliError: for an unknown model or preset, bad devices, or a trax layer that cannot be built.
    """
    import trax_models

    if getattr(args, "trax_model", None):
        return _make_trax_step(args)
    if args.model not in trax_models.names():
        raise CliError(f"unknown model {args.model!r}; expected one of: {', '.join(trax_models.names())}")
    if args.preset not in trax_models.presets():
        raise CliError(f"unknown preset {args.preset!r}; expected one of: {', '.join(trax_models.presets())}")
    style = getattr(args, "style", _MODEL_DEFAULTS["style"])
    if style not in trax_models.STYLES:
        raise CliError(f"unknown --style {style!r}; expected one of: {', '.join(trax_models.STYLES)}")
    mesh_shape = mesh_shape_arg(args)
    setup_devices(args.devices)
    try:
        return trax_models.make_train_step(args.model, preset=args.preset, devices=args.devices,
                                           optimizer=args.optimizer, style=style, mesh_shape=mesh_shape)
    except ValueError as e:
        if mesh_shape is None:
            raise
        raise CliError(str(e)) from None


def mesh_shape_arg(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--mesh DATAxFSDP`` as ``(data, fsdp)``, None when not given; refused with another --style than fsdp."""
    mesh = getattr(args, "mesh", None)
    style = getattr(args, "style", _MODEL_DEFAULTS["style"])
    if mesh is None:
        return None
    if style != "fsdp":
        raise CliError(f"--mesh {mesh!r} is for --style fsdp only, got --style {style}")
    parts = mesh.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise CliError(f"--mesh: expected DATAxFSDP, two ints such as 2x4, got {mesh!r}")
    data, fsdp = (int(p) for p in parts)
    return data, fsdp


def device_kind() -> str:
    """The devices jax runs on, for table titles: ``"cpu:cpu x4 on x86_64"``."""
    import platform

    import jax

    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')} x{len(jax.devices())} on {platform.machine()}"


# -- input -----------------------------------------------------------------------------------------
def read_text_input(path: str, flag: str, expected: str) -> str:
    """The UTF-8 text of input file ``path`` (gzip-compressed where it ends in ``.gz``).

    Args:
      path: the file.
      flag: the option that named it, for the error (e.g. "--hlo").
      expected: what the file should hold, for the error (e.g. "HLO module text").

    Raises:
      CliError: naming the flag, the path, what is wrong and what was expected.
    """
    import gzip

    if os.path.isdir(path):
        raise CliError(f"{flag} {path!r} is a directory; expected a file of {expected}")
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CliError(f"{flag} {path!r}: no such file; expected a file of {expected}") from None
    except UnicodeDecodeError as e:
        raise CliError(f"{flag} {path!r}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                       f"expected {expected}") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise CliError(f"{flag} {path!r}: not a complete gzip file ({e}); expected gzip-compressed {expected} "
                       f"(or drop the .gz suffix)") from None
    except OSError as e:
        raise CliError(f"{flag} {path!r}: cannot read it: {e.strerror or e}") from None


# -- output ----------------------------------------------------------------------------------------
def check_output_file(path: str | None, flag: str) -> None:
    """Checks, before any long work, that ``path`` can be written: its directory exists and is
    writable, and it is not a directory. Nothing is created.

    Raises:
      CliError: naming the flag, the path and what is wrong.
    """
    if not path:
        return
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise CliError(f"{flag} {path!r} is a directory; expected a file path")
    if not os.path.isdir(folder):
        raise CliError(f"{flag} {path!r}: the directory {folder!r} does not exist; create it first")
    if not os.access(folder, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
        raise CliError(f"{flag} {path!r}: not writable (directory {folder!r})")


def check_output_dir(path: str | None, flag: str) -> None:
    """Checks, before any long work, that directory ``path`` exists and is writable, or can be
    created (its nearest existing parent is a writable directory). Nothing is created.

    Raises:
      CliError: naming the flag, the path and what is wrong.
    """
    if not path:
        return
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise CliError(f"{flag} {path!r} is a file; expected a directory")
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise CliError(f"{flag} {path!r}: {existing!r} is a file, so the directory cannot be created")
    if not os.access(existing, os.W_OK):
        raise CliError(f"{flag} {path!r}: not writable ({existing!r} is not writable)")


def add_progress_arg(p: argparse.ArgumentParser) -> None:
    """``--no-progress``: no progress bar (on a terminal) or progress lines (otherwise) on stderr."""
    p.add_argument("--no-progress", dest="no_progress", action="store_true",
                   help="no progress on stderr (default: a bar on a terminal, plain lines otherwise)")


class _Lines:
    """Plain progress lines for a stream that is not a terminal (a log file, a pipe): a line when a
    phase starts or ends, when its message changes, at most one per ``every_s`` in between."""

    def __init__(self, stream: TextIO, every_s: float) -> None:
        self.stream, self.every_s = stream, every_s
        self.last: dict[str, tuple[float, str]] = {}

    def __call__(self, phase: str, fraction: float, message: str) -> None:
        now = time.monotonic()
        seen = self.last.get(phase)
        if seen is not None and fraction < 1.0 and now - seen[0] < self.every_s:
            return
        if seen is not None and seen[1] == message:
            return
        self.last[phase] = (now, message)
        self.stream.write(f"[{time.strftime('%H:%M:%S')}] {phase} {fraction:4.0%}: {message}\n")
        self.stream.flush()


@contextlib.contextmanager
def progress_reporter(enabled: bool = True, every_s: float = 5.0) -> Iterator[Callable[[str, float, str], None]]:
    """A ``progress(phase, fraction, message)`` callable for the duration of the block: a rich bar
    per phase when stderr is a terminal, plain timestamped lines when it is not (``make run >
    log``), nothing when not ``enabled``."""
    if not enabled:
        yield lambda phase, fraction, message: None
        return
    if not sys.stderr.isatty():
        yield _Lines(sys.stderr, every_s)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as prog:
        tasks: dict[str, Any] = {}

        def progress(phase: str, fraction: float, message: str) -> None:
            if phase not in tasks:
                tasks[phase] = prog.add_task(phase, total=1.0)
            prog.update(tasks[phase], completed=fraction, description=f"{phase}: {message}")

        yield progress


def print_json(obj: Any) -> None:
    """Prints one JSON object (indented, sorted keys) on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# -- cost models -----------------------------------------------------------------------------------
def add_cost_model_arg(p: argparse.ArgumentParser) -> None:
    """``--cost-model`` (read by :func:`load_cost_model`)."""
    p.add_argument("--cost-model", default=DEFAULT_COST_MODEL, metavar="analytic|gnn|FILE",
                   help="analytic (the device kind's analytic model), gnn (the GNN shipped for the device kind), a GNN "
                        f"checkpoint (.msgpack) or a saved cost model (.json) (default {DEFAULT_COST_MODEL})")


def load_cost_model(value: str, device: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """The cost model named by ``--cost-model`` for ``device`` (:mod:`disco.sim.costs.registry`) and what
    to report about it (name, digest, source).

    Raises:
      CliError: for a name that is no registered model nor a model file, or a file that cannot be loaded.
    """
    from disco.sim.costs import registry
    from gnn.registration import ENTRY

    registry.register(ENTRY)  # the CLI is the layer that may import gnn; disco resolves names only
    try:
        cm = registry.make(value, device=device)
    except (OSError, ValueError, RuntimeError) as e:
        msg = str(e)
        prefix = f"cost model {value!r}: "  # the registry names the value itself: say it once
        raise CliError(f"--cost-model {value!r}: {msg.removeprefix(prefix)}") from None
    if cm.name == "gnn" and hasattr(cm, "describe"):
        d = cm.describe()
        return cm, {"name": d["name"], "digest": d["digest"], "source": d["source"],
                    "trained_on_samples": d["trained_on"].get("samples")}
    return cm, {"name": cm.name, "digest": cm.digest(), "source": value if os.path.exists(value) else "built-in"}


# -- plans -----------------------------------------------------------------------------------------
def add_plans_arg(p: argparse.ArgumentParser) -> None:
    """``--plans``: a comma list of baselines or plan files (read by :func:`resolve_plans`)."""
    p.add_argument("--plans", default=DEFAULT_PLANS,
                   help=f"comma list of baselines (horovod:128 sets a threshold) or plan .json files "
                        f"(default {DEFAULT_PLANS})")


def add_strict_arg(p: argparse.ArgumentParser) -> None:
    """``--strict``: a plan file made for another graph is an error (read by :func:`resolve_plans`)."""
    p.add_argument("--strict", action="store_true",
                   help="a plan .json made for another graph (its fingerprint differs) is an error, not a warning")


def resolve_plans(spec: str, graph: Any, *, strict: bool = False, simulated: bool = False) -> dict[str, Any]:
    """The plans a ``--plans`` comma list names, by row name: baselines (``horovod:128`` sets a value)
    or plan .json files (validated against ``graph``). A plan file made for another graph (its
    ``graph_fingerprint`` differs) is named in a warning on stderr, or refused when ``strict``;
    kept as it is for a compile (which falls back to XLA's default), or, when ``simulated``,
    replaced by xla_default's plan: what that compile would run.

    A baseline's row is the item as written, but ``even_<k>`` for ``even:K``
    (:func:`disco.plans.baselines.parse_item`); a plan file's row is the plan's name, or the file's
    path where the plan has none or its name is another item's row, ``xla_default`` (the
    reference row the commands add) or ``comm_free_bound`` (``disco bench --bound``'s row): every item keeps a row of its own, and ``xla_default`` is
    always XLA's default. An item written twice is one row.

    Raises:
      CliError: for an unknown baseline, a bad value, an unreadable file, a plan file that does not
        fit ``graph`` (naming the file), an empty list, or (``strict``) a plan file made for another graph.
    """
    from disco.bench import COMM_FREE_BOUND
    from disco.plans import baselines
    from disco.plans.plan import FusionPlan

    plans: dict[str, Any] = {}
    items = list(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()))
    parsed = {i: parse_item(i) for i in items if not i.endswith(".json")}
    # rows a plan file's name may not take: the baselines', the reference and disco bench --bound's
    taken = {"xla_default", COMM_FREE_BOUND, *(b.row for b in parsed.values())}
    for item in items:
        if item.endswith(".json"):
            text = read_text_input(item, "plan file", "a plan's JSON (FusionPlan.to_json)")
            try:
                plan = FusionPlan.from_json(text)
            except ValueError as e:
                raise CliError(f"plan file {item!r}: {e}") from None
            row = plan.name if plan.name and plan.name not in taken else item
            taken.add(row)
            if plan.graph_fingerprint is not None and plan.graph_fingerprint != graph.fingerprint:
                what = (f"plan file {item!r} was made for graph {plan.graph_fingerprint}, but this step's graph is "
                        f"{graph.fingerprint}")
                if strict:
                    raise CliError(f"{what} (--strict)")
                if simulated:
                    print(f"warning: {what}; simulated as XLA's default compile, which applying it would fall "
                          "back to (--strict to refuse it)", file=sys.stderr)
                    plans[row] = baselines.make("xla_default", graph)
                    continue
                print(f"warning: {what}; it will fall back to XLA's default compile (--strict to refuse it)",
                      file=sys.stderr)
                plans[row] = plan
                continue
            try:
                plans[row] = plan.validate(graph)
            except ValueError as e:
                raise CliError(f"plan file {item!r}: {e}") from None
            continue
        try:
            plans[parsed[item].row] = parsed[item].make(graph)
        except ValueError as e:
            raise CliError(f"plan {item!r}: {e}") from None
    if not plans:
        raise CliError("--plans is empty; expected e.g. xla_default,per_tensor,horovod")
    return plans


def parse_item(item: str) -> Any:
    """A ``--plans`` baseline item read by :func:`disco.plans.baselines.parse_item` (its row name and
    the keywords it sets), its ValueError as a CliError."""
    from disco.plans import baselines

    try:
        return baselines.parse_item(item)
    except ValueError as e:
        raise CliError(str(e)) from None


# -- --processes and --link: workers across processes, maybe behind emulated links -------------
LINK_HELP = ("emulated link per worker, e.g. rate=1gbit,delay=100us[,jitter=10us,loss=0.1%%]: each worker in its "
             "own network namespace (needs root; disco.runtime.testbed); 'loopback' or none: 127.0.0.1")


def add_link_arg(p: argparse.ArgumentParser) -> None:
    """``--link SPEC`` (read by :func:`parse_link_arg`)."""
    p.add_argument("--link", default=None, metavar="SPEC", help=LINK_HELP)


def add_process_args(p: argparse.ArgumentParser, *, default_dpp: int = 1) -> None:
    """``--processes``, ``--devices-per-process``, ``--timeout`` and ``--link``."""
    p.add_argument("--processes", type=int, default=1, help="run across this many local worker processes (default 1)")
    p.add_argument("--devices-per-process", type=int, default=default_dpp,
                   help=f"CPU devices per process (default {default_dpp})")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before hung workers are killed (default 1800)")
    add_link_arg(p)


def emulated_link(args: argparse.Namespace) -> bool:
    """Whether ``--link`` names an emulated link: given, and not empty or ``loopback`` (in any case,
    as :func:`disco.runtime.testbed.parse_link` reads it), which mean 127.0.0.1 as no --link does."""
    from disco.runtime.testbed import is_loopback

    return not is_loopback(getattr(args, "link", None))


def across_processes(args: argparse.Namespace) -> bool:
    """Whether the command runs on worker processes: ``--processes`` above 1 or an emulated ``--link``."""
    return args.processes > 1 or emulated_link(args)


def parse_link_arg(args: argparse.Namespace) -> Any:
    """``args.link`` as a :class:`disco.runtime.testbed.LinkSpec`, or None for loopback.

    Raises:
      CliError: a spec that does not parse, or a link where namespaces are not permitted.
    """
    from disco.runtime.testbed import check_permitted, parse_link

    try:
        link = parse_link(getattr(args, "link", None))
    except ValueError as e:
        raise CliError(str(e)) from None
    if link is not None:
        try:
            check_permitted()
        except PermissionError as e:
            raise CliError(f"--link {args.link!r}: {e}") from None
    return link


def check_process_counts(args: argparse.Namespace) -> None:
    """Raises CliError for --processes or --devices-per-process below 1, or a --timeout that is not
    a positive number of seconds."""
    if args.processes < 1 or args.devices_per_process < 1:
        raise CliError(f"--processes and --devices-per-process must be >= 1, got {args.processes} and "
                       f"{args.devices_per_process}")
    if not 0 < args.timeout < float("inf"):
        raise CliError(f"--timeout must be positive seconds, got {args.timeout}")
    if emulated_link(args) and args.processes < 2:
        raise CliError(f"--link {args.link!r} emulates the link between worker processes; with --processes "
                       f"{args.processes} nothing crosses it: give --processes 2 or more")


def worker_step(args: argparse.Namespace) -> dict[str, Any]:
    """How each worker process writes the zoo step: ``{"style": ..., "mesh_shape": ...}`` from --style
    and --mesh, the mesh checked against the devices of all the processes."""
    style = getattr(args, "style", _MODEL_DEFAULTS["style"])
    mesh_shape = mesh_shape_arg(args)
    total = args.processes * args.devices_per_process
    if mesh_shape is not None and mesh_shape[0] * mesh_shape[1] != total:
        raise CliError(f"--mesh {args.mesh}: {mesh_shape[0] * mesh_shape[1]} devices, and --processes "
                       f"{args.processes} x --devices-per-process {args.devices_per_process} are {total}; "
                       "expected a data x fsdp mesh of all of them")
    return {"style": style, "mesh_shape": mesh_shape}


def over_label(link: Any) -> str:
    """What the workers talk over, for table titles."""
    return "127.0.0.1 (gloo)" if link is None else f"an emulated link of {link.label()} per worker (gloo)"


def note_floors(floored: tuple[str, ...], prefix: str = "") -> None:
    """Says on stderr which terms of a calibration's fit are floors rather than measurements."""
    from disco.calibrate import floored_note

    note = floored_note(floored)
    if note:
        print(prefix + note, file=sys.stderr)


def note_device_mismatch(devices: int, spec: Any, command: str) -> None:
    """Says on stderr when the step is built for another device count than the cluster has."""
    if spec.num_devices != devices:
        print(f"{command}: note: the step is built for --devices {devices}, but cluster {spec.name!r} has "
              f"{spec.num_devices} devices; the simulator prices its all-reduces over {spec.num_devices}",
              file=sys.stderr)


def note_placeholder_costs(spec: Any, command: str) -> None:
    """Says on stderr when the cluster is the uncalibrated ``local`` preset, whose link costs are
    placeholders (no per-operand cost: XLA's variadic all-reduces look as cheap as buckets)."""
    from disco.sim.cluster import LOCAL_LABEL

    if spec.name == "local" and spec.label == LOCAL_LABEL:
        print(f"{command}: note: cluster 'local' prices all-reduces with placeholder link costs; "
              "`disco calibrate --out local.yaml` measures this machine's, `--cluster local.yaml` uses them",
              file=sys.stderr)


# The widest line a command's table and notes print: a terminal wider than this, or a file or a
# pipe, still gets lines of at most this many columns (issue 39: the optimize table was 250 wide).
MAX_WIDTH = 120


def table_console(min_width: int = 80) -> Any:
    """A rich Console for a command's table and notes: the terminal's width capped at
    :data:`MAX_WIDTH`, but at least ``min_width`` (a narrower terminal wraps the lines itself), and
    :data:`MAX_WIDTH` into a file or a pipe. Rich wraps text and table cells to fit."""
    from rich.console import Console

    if not sys.stdout.isatty():
        return Console(width=max(min_width, MAX_WIDTH))
    return Console(width=max(min_width, min(MAX_WIDTH, Console().width)))


def print_note(console: Any, text: str, *, indent: str = "", bold: str = "") -> None:
    """Prints plain ``text`` (no markup) cut at spaces to the console's width, each line after the
    first indented two more than ``indent``, so that a long note reads as one item; ``bold``: a
    prefix of ``text`` printed in bold."""
    import textwrap

    from rich.markup import escape

    lines = textwrap.wrap(text, width=console.width, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_on_hyphens=False) or [indent]
    for i, line in enumerate(lines):
        if i == 0 and bold and line.startswith(bold):
            console.print(f"[bold]{escape(bold)}[/bold]{escape(line[len(bold):])}", soft_wrap=True)
        else:
            console.print(escape(line), soft_wrap=True)


class Footnotes:
    """Long cell texts moved under a table, so that the table fits :data:`MAX_WIDTH`: the cell
    holds ``[n]``, and the same text gets the same number."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def mark(self, text: str) -> str:
        """The cell for ``text``: ``[n]``, ``n`` counting the texts from 1 in the order they came."""
        return f"[{self._numbers.setdefault(text, len(self._numbers) + 1)}]"

    def print(self, console: Any) -> None:
        """Prints ``[n] text`` for each text, in order (:func:`print_note`)."""
        for text, n in self._numbers.items():
            print_note(console, f"[{n}] {text}")


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1: "1 bucket", "3 buckets"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


"""The GPU items of issues 40 and 44 in one run of under 9 minutes on one H100.

Autotune results, GPU baselines, numerics, and kernel times of random networks.

    python scripts/tools/gpu_truth.py --out gpu_truth            # on the GPU machine, PYTHONPATH=.

Runs with the jax the GPU machine has, on one device. Each phase stops at its share of ``--budget-s``
(default 480 s after jax starts; a model that would not fit is skipped, and the table says so), in order:

1. ``autotune`` (preset paper, every zoo model): the model's adamw step as ``../shared/data/h100_kernels``
   builds it (``trax_models.make_train_step(model, preset, devices=1, optimizer="adamw")``), compiled on
   the device with command buffers off (``xla_gpu_enable_command_buffer=""``) and XLA's autotuning
   results written (``--xla_gpu_dump_autotune_results_to``: XLA writes every result of the process at
   each compile, so the file ends holding all models'). Writes ``OUT/autotune/h100_zoo.textproto``;
   ``OUT/autotune/device_modules.jsonl.gz`` (per model and preset: the pre-optimisation HLO, the module
   the device built, the compile options, compile seconds: the records ``scripts/tools/kernel_match.py``
   compares deviceless compiles with); ``OUT/autotune/gpu_target_config.pbtxt`` (the device's own target
   config, to check ``xla_hooks/targets/h100.txtpb`` against).
2. ``baselines`` (preset paper; transformer, gpt2, bert, unet): ``scripts/tools/check_gpu.py``'s rows
   ``xla_default`` and ``xla_default_rt`` (the references), ``per_tensor`` and ``ddp`` (disco's bucket
   plans), ``xla_tuned_16mb``, ``xla_o1`` and ``auto_pgle``, in this process (its compiles find phase 1's
   autotuning results in XLA's cache): step times interleaved, and each row's numbers after 3 SGD steps
   against the references (the numerics follow-up "as is").
3. ``numerics`` (preset paper; unet, transformer, gpt2, bert): ``check_gpu.py --precision highest
   --deterministic-ops --only per_tensor,ddp --rounds 1 --steps 1 --numerics-steps 1 --dump-modules`` in a
   child process (the flag is read when jax starts), its JSON, log and the modules each row compiled to
   on the device in ``OUT/numerics/``.
4. ``autotune_small``: phase 1 at preset small, with the time left.
5. ``kernels``: per-kernel device times of random networks (``trax_models.random_names``, preset
   paper, default variant, command buffers off) for the per-kernel GNN's corpus, as
   ``disco collect --kernels --models random:N`` writes them (skipping those
   ``gnn/data/h100_random_kernels_*`` already holds), until its share is spent: ``OUT/kernels/kernels.jsonl``.

Prints a table per phase and writes ``OUT/gpu_truth.json``. Afterwards, on the CPU machine (deviceless
XLA:GPU: ``make install-gpu``), the kernel-signature match per model, without and with the results::

    PYTHONPATH=. python scripts/tools/kernel_match.py --data OUT/autotune/device_modules.jsonl.gz \\
        --autotune-results OUT/autotune/h100_zoo.textproto

``--allow-cpu`` is a dry run of the script on CPU (preset tiny, mlp and transformer_lm in every phase):
XLA:CPU writes no autotuning results and refuses ``xla_o1`` and ``auto_pgle`` (with their reasons).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

PHASES = ("autotune", "baselines", "numerics", "autotune_small", "kernels")
# Each phase's share of the budget (the time a phase leaves unused goes to the next).
SHARES = {"autotune": 0.38, "baselines": 0.40, "numerics": 0.22, "autotune_small": 0.0, "kernels": 0.0}
KERNELS_NETS = 400  # the kernels phase's random networks to try (it stops at its share of the budget)
KERNELS_MARGIN_S = 25.0  # no random network starts with less than this left in the phase (one takes 5-20 s)
BASELINE_ROWS = ("per_tensor", "ddp", "xla_tuned_16mb", "xla_o1", "auto_pgle")
NUMERICS_MODELS = ("unet", "transformer", "gpt2", "bert")
BASELINE_MODELS = ("transformer", "gpt2", "bert", "unet")
DRY_RUN_MODELS = ("mlp", "transformer_lm")  # --allow-cpu: every phase, at preset tiny
COMMAND_BUFFERS_OFF = {"xla_gpu_enable_command_buffer": ""}  # as ../shared/data/h100_kernels' records
# Seconds a model's phase-1 compile may take at most (paper, from the records' compile_s: 3-20 s, plus
# building the step): a model starts only when this much of the phase's time is left.
NEED_S = {"paper": 30.0, "small": 15.0, "tiny": 5.0}
# A baselines model (7 compiles, PGLE's profiled runs, the timed rounds) starts only with this much left.
BASELINE_NEED_S = {"paper": 60.0, "small": 30.0, "tiny": 10.0}
NUMERICS_MIN_S = 60.0  # the numerics child starts only with this much of the run left


class Clock:
    """The run's budget: seconds left overall and in the current phase."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget = time.perf_counter(), budget_s
        self.phase_end = self.start

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def begin(self, share: float, rest: bool = False) -> float:
        """Starts a phase with ``share`` of the budget (or all that is left) plus what earlier ones left."""
        now = time.perf_counter()
        self.phase_end = self.start + self.budget if rest else max(self.phase_end, now) + share * self.budget
        self.phase_end = min(self.phase_end, self.start + self.budget)
        return self.phase_left()

    def phase_left(self) -> float:
        return self.phase_end - time.perf_counter()


def compile_with_dump(lowered: Any, dump: Path) -> tuple[Any, dict[str, Any]]:
    """``lowered`` compiled with command buffers off and XLA's autotuning results written to ``dump``
    (the old AutotuneResults cache, which this reader and disco's loader read: with the option that
    selects it when this jax's XLA knows it)."""
    from xla_hooks import autotune_results as results_file

    opts = {**COMMAND_BUFFERS_OFF, results_file.DUMP_OPTION: str(dump),
            results_file.NEW_CACHE_FORMAT_OPTION: False}
    try:
        return lowered.compile(compiler_options=opts), opts
    except Exception as e:  # an XLA that does not know the option: "No such compile option"
        if "No such compile option" not in str(e):
            raise
        opts.pop(results_file.NEW_CACHE_FORMAT_OPTION)
        return lowered.compile(compiler_options=opts), opts


def dump_entries(dump: Path) -> dict[str, Any]:
    """What the dump holds so far: entries by kind, or why it cannot be read."""
    from xla_hooks import autotune_results as results_file

    if not dump.is_file():
        return {"entries": 0, "error": "not written"}
    try:
        r = results_file.read(dump)
    except ValueError as e:  # the file's start says which format it is (e.g. the new AutotuneCache one)
        return {"entries": 0, "error": str(e)[:300], "head": dump.read_bytes()[:400].decode("utf-8", "replace")}
    return {"entries": len(r.entries), "kinds": r.counts(), "devices": list(r.devices)}


def autotune_phase(models: list[str], preset: str, out: Path, clock: Clock, report: dict) -> None:
    import jax

    import trax_models

    out.mkdir(parents=True, exist_ok=True)
    dump = out / "h100_zoo.textproto"
    rows = report.setdefault("autotune", [])
    with gzip.open(out / "device_modules.jsonl.gz", "at") as records:
        for model in models:
            if clock.phase_left() < NEED_S.get(preset, 30.0):
                rows.append({"model": model, "preset": preset, "skipped": "out of time"})
                continue
            t0 = time.perf_counter()
            try:
                step, example = trax_models.make_train_step(model, preset, devices=1, optimizer="adamw")
                lowered = jax.jit(step).lower(*example)
                pre = lowered.as_text(dialect="hlo")
                t1 = time.perf_counter()
                compiled, opts = compile_with_dump(lowered, dump)
                compile_s = time.perf_counter() - t1
                text = compiled.as_text()
            except Exception as e:  # a model that does not compile: reported, the run goes on
                rows.append({"model": model, "preset": preset, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                print(json.dumps(rows[-1]), flush=True)
                continue
            records.write(json.dumps({"model": model, "preset": preset, "variant": "default",
                                      "compile_options": COMMAND_BUFFERS_OFF, "jax": jax.__version__,
                                      "device_kind": jax.devices()[0].device_kind, "compile_s": round(compile_s, 2),
                                      "pre_optimization_hlo": pre, "compiled_hlo": text}) + "\n")
            rows.append({"model": model, "preset": preset, "compile_s": round(compile_s, 1),
                         "seconds": round(time.perf_counter() - t0, 1),
                         "new_cache_format_off": "xla_gpu_use_new_autotune_cache_format" in opts,
                         **dump_entries(dump)})
            print(json.dumps(rows[-1]), flush=True)
            del step, example, lowered, compiled


def target_config(out: Path, report: dict) -> None:
    """The device's GpuTargetConfig, as XLA dumps it beside a compiled module."""
    import jax
    import jax.numpy as jnp

    tmp = out / "xla_dump"
    try:
        jax.jit(lambda x: jnp.sin(x) * 2).lower(jnp.ones(8)).compile(compiler_options={"xla_dump_to": str(tmp)})
        found = sorted(tmp.glob("*gpu_target_config.pbtxt"))
        if found:
            shutil.copy(found[0], out / "gpu_target_config.pbtxt")
        report["gpu_target_config"] = str(out / "gpu_target_config.pbtxt") if found else "not dumped"
    except Exception as e:
        report["gpu_target_config"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def baselines_phase(models: list[str], preset: str, rounds: int, steps: int, clock: Clock, report: dict) -> None:
    from scripts.tools import check_gpu

    report["baselines"] = {"jax": report["jax"], "backend": report["backend"], "devices": report["devices"],
                           "precision": "default", "xla_flags": os.environ.get("XLA_FLAGS", ""), "models": []}
    for model in models:
        if clock.phase_left() < BASELINE_NEED_S.get(preset, 60.0):
            report["baselines"]["models"].append({"model": model, "skipped": "out of time", "plans": {}})
            continue
        try:
            res = check_gpu.check_model(model, preset, rounds, steps, only=set(BASELINE_ROWS))
        except Exception as e:
            res = {"model": model, "error": f"{type(e).__name__}: {str(e)[:300]}", "plans": {}}
        report["baselines"]["models"].append(res)


def numerics_phase(models: list[str], preset: str, out: Path, clock: Clock, allow_cpu: bool, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if clock.left() < NUMERICS_MIN_S:
        report["numerics"] = {"skipped": f"out of time ({clock.left():.0f} s of the run left)"}
        print(report["numerics"]["skipped"], flush=True)
        return
    cmd = [sys.executable, str(Path(__file__).with_name("check_gpu.py")), "--models", ",".join(models),
           "--preset", preset, "--rounds", "1", "--steps", "1", "--precision", "highest", "--deterministic-ops",
           "--only", "per_tensor,ddp", "--numerics-steps", "1", "--dump-modules",
           "--out", str(out)] + (["--allow-cpu"] if allow_cpu else [])
    timeout = min(max(NUMERICS_MIN_S, clock.phase_left()), clock.left())
    report["numerics"] = {"command": " ".join(cmd[1:]), "timeout_s": round(timeout)}
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        try:
            r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, text=True)
            report["numerics"]["exit"] = r.returncode
        except subprocess.TimeoutExpired:
            report["numerics"]["exit"] = f"stopped after {timeout:.0f} s (the models done are in gpu_check.json)"
    report["numerics"]["seconds"] = round(time.perf_counter() - t0, 1)
    tail = (out / "log.txt").read_text().splitlines()
    start = next((i for i, ln in enumerate(tail) if ln.startswith("| model | plan |")), max(0, len(tail) - 40))
    print("\n".join(tail[max(0, start - 2):]), flush=True)


def recorded_random_networks(preset: str) -> set[str]:
    """The random networks the shipped corpus (``gnn/data/h100_random_kernels_*.jsonl.gz``) already
    holds at ``preset``: the kernels phase profiles others."""
    from disco.data.kernel_collect import read_records

    data = Path(__file__).resolve().parents[2] / "gnn" / "data"
    return {r["model"] for path in sorted(data.glob("h100_random_kernels_*.jsonl.gz"))
            for r in read_records(str(path))[0] if r.get("preset") == preset}


def kernels_phase(preset: str, out: Path, clock: Clock, report: dict) -> None:
    """Per-kernel device times of random networks (the GNN's corpus): ``disco collect --kernels``'s
    records, default variant, until the phase's time is spent."""
    import trax_models
    from disco.data import kernel_collect as KC

    budget = clock.phase_left() - KERNELS_MARGIN_S
    if budget <= 0:
        report["kernels"] = {"skipped": f"out of time ({clock.phase_left():.0f} s of the phase left)"}
        return
    t0 = time.perf_counter()
    written, errors = 0, {}
    have = recorded_random_networks(preset)
    todo = [n for n in trax_models.random_names(KERNELS_NETS) if n not in have]
    for name in todo:  # one at a time: a network that fails is reported, skipped
        spent = time.perf_counter() - t0
        if spent > budget:
            break
        cfg = KC.KernelCollectConfig(models=(name,), presets=(preset,), out=str(out), variants=("default",),
                                     steps=3, rounds=2, round_steps=5)
        try:
            written += KC.collect_kernels(cfg, progress=lambda line: print(line, flush=True)).written
        except Exception as e:  # e.g. out of memory: the next network
            errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
            print(name, errors[name], flush=True)
    report["kernels"] = {"preset": preset, "budget_s": round(budget), "seconds": round(time.perf_counter() - t0, 1),
                         "written": written, "errors": errors, "records": str(out / KC.RECORDS)}


def print_autotune(report: dict) -> None:
    print("\n| model | preset | compile s | dump entries (cumulative) | note |\n|---|---|---:|---:|---|")
    for r in report.get("autotune", []):
        note = r.get("skipped") or r.get("error") or ", ".join(f"{k} {v}" for k, v in (r.get("kinds") or {}).items())
        print(f"| {r['model']} | {r['preset']} | {r.get('compile_s', '-')} | {r.get('entries', '-')} | {note} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_truth")
    ap.add_argument("--budget-s", type=float, default=480.0, help="seconds for all phases after jax starts")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    ap.add_argument("--shares", default="", help="phase=share,... of the budget, over the defaults "
                    + ", ".join(f"{k}={v}" for k, v in SHARES.items()) + " (the last phase gets the rest)")
    ap.add_argument("--models", default=None, help="zoo models of the autotune phases (default: all)")
    ap.add_argument("--baseline-models", default=",".join(BASELINE_MODELS))
    ap.add_argument("--numerics-models", default=",".join(NUMERICS_MODELS))
    ap.add_argument("--rounds", type=int, default=3, help="baselines: interleaved rounds")
    ap.add_argument("--steps", type=int, default=5, help="baselines: steps per round")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="a dry run on CPU: preset tiny, mlp and transformer_lm, the GPU-only rows refused")
    args = ap.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or set(phases) - set(PHASES):
        ap.error(f"--phases {args.phases!r}: expected a comma list of {', '.join(PHASES)}")
    shares = dict(SHARES)
    for item in filter(None, (x.strip() for x in args.shares.split(","))):
        name, _, value = item.partition("=")
        if name not in PHASES:
            ap.error(f"--shares: unknown phase {name!r}")
        try:
            shares[name] = float(value)
        except ValueError:
            ap.error(f"--shares {item!r}: expected phase=fraction, e.g. autotune=0.6")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import jax

    import trax_models

    clock = Clock(args.budget_s)
    report: dict[str, Any] = {"jax": jax.__version__, "backend": jax.default_backend(),
                              "devices": [str(d) for d in jax.devices()],
                              "device_kind": jax.devices()[0].device_kind, "budget_s": args.budget_s,
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(report), flush=True)
    if jax.default_backend() != "gpu" and not args.allow_cpu:
        print("no GPU backend: nothing to measure (--allow-cpu for a dry run)", file=sys.stderr)
        return 2
    cpu = jax.default_backend() != "gpu"
    models = args.models.split(",") if args.models else list(trax_models.names())
    preset, small = ("tiny", "tiny") if cpu else ("paper", "small")
    pick = (lambda ms: list(DRY_RUN_MODELS)) if cpu else list
    for phase in phases:
        clock.begin(shares[phase], rest=phase == phases[-1])
        print(f"\n== {phase}: {clock.phase_left():.0f} s of {clock.left():.0f} s left", flush=True)
        if phase == "autotune":
            autotune_phase(pick(models), preset, out / "autotune", clock, report)
            target_config(out / "autotune", report)
            print_autotune(report)
        elif phase == "autotune_small":
            autotune_phase(pick(models), small, out / "autotune", clock, report)
            print_autotune(report)
        elif phase == "kernels":
            kernels_phase(preset, out / "kernels", clock, report)
            print(json.dumps(report["kernels"]), flush=True)
        elif phase == "baselines":
            baselines_phase(pick(args.baseline_models.split(",")), preset, args.rounds, args.steps, clock, report)
            from scripts.tools.check_gpu import print_table

            print_table({**report["baselines"], "models": [m for m in report["baselines"]["models"] if "error" not in m
                                                           and "skipped" not in m]})
        else:
            numerics_phase(pick(args.numerics_models.split(",")), preset, out / "numerics", clock, args.allow_cpu,
                           report)
        (out / "gpu_truth.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {out / 'gpu_truth.json'}; {clock.budget - clock.left():.0f} s of the {clock.budget:.0f} s budget used",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

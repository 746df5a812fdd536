"""The disco command line: help without jax, graph summary, clear errors."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.cli import run_cli
from tests.support.paths import REPO



def test_help_does_not_import_jax():
    code = ("import sys\nfrom disco import cli\n"
            "for argv in [['--help']] + [[name, '--help'] for name in cli.COMMANDS]:\n"
            "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
            "    heavy = sorted(m for m in ('jax', 'flax', 'flask', 'werkzeug') if m in sys.modules)\n"
            "    assert not heavy, f'disco {\" \".join(argv)} imported {heavy}'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert "graph" in r.stdout and "bench" in r.stdout and "usage: disco collect" in r.stdout


@pytest.mark.fast
def test_the_commands_table_lists_every_subcommand_once():
    import argparse

    from disco import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(cli.COMMANDS) == [
        "models", "graph", "bench", "calibrate", "simulate", "serve", "optimize", "train-gnn", "collect",
        "predict-kernels"]
    for name, p in sub.choices.items():
        assert callable(p.get_default("func")), name


CLI_DIR = REPO / "disco" / "cli"
# besides the commands: common (what several commands share) and a command's private helpers (_<command>_*)
COMMAND_MODULES = sorted(p.stem for p in CLI_DIR.glob("*.py") if p.stem != "common" and not p.stem.startswith("_"))


@pytest.mark.fast
@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_module_imports_no_other_command_module(module):
    import ast
    import importlib

    from disco import cli

    assert module in {f.__module__.rsplit(".", 1)[-1] for f in cli.COMMANDS.values()}, module
    tree = ast.parse((CLI_DIR / f"{module}.py").read_text())
    own = f"_{module.replace('-', '_')}_"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "disco.cli":  # a helper module of its own only
            assert all(a.name.startswith(own) for a in node.names), f"{module} imports {[a.name for a in node.names]}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("disco.cli"):
            assert node.module == "disco.cli.common", f"{module} imports {node.module}"
            assert not [a.name for a in node.names if a.name.startswith("_")], f"{module}: private names"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            raise AssertionError(f"{module} uses __import__")
    mod = importlib.import_module(f"disco.cli.{module}")
    assert callable(mod.add_parser) and callable(mod.add_arguments) and callable(mod.run)


def test_version_comes_from_the_installed_metadata_only():
    import configparser
    import importlib.metadata

    import disco

    try:
        assert disco.__version__ == importlib.metadata.version("disco")
    except importlib.metadata.PackageNotFoundError:
        assert disco.__version__ == "0+unknown"
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    version = cfg["metadata"]["version"]
    copies = [str(p.relative_to(REPO)) for d in ("disco", "gnn", "service", "xla_hooks", "trax_models", "scripts")
              for p in (REPO / d).rglob("*.py") if f'"{version}"' in p.read_text()]
    assert copies == [], f"the version {version} is written in {copies}; expected setup.cfg only"
    r = run_cli("--version", timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"disco {disco.__version__}"


def test_unknown_model_lists_names():
    r = run_cli("graph", "--model", "nosuch")
    assert r.returncode == 2
    assert "unknown model 'nosuch'" in r.stderr
    for name in ("bert", "mlp", "resnet50", "rnnlm", "transformer", "transformer_lm", "vgg19"):
        assert name in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_preset():
    r = run_cli("graph", "--model", "mlp", "--preset", "huge")
    assert r.returncode == 2 and "unknown preset 'huge'" in r.stderr and "tiny" in r.stderr
    assert "Traceback" not in r.stderr


def test_too_few_devices():
    r = run_cli("graph", "--model", "mlp", "--devices", "0")
    assert r.returncode == 2 and "--devices must be 1 to 4,096 (virtual CPU devices in this process), got 0" in r.stderr


def test_unparsable_hlo_file(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("this is not hlo")
    r = run_cli("graph", "--hlo", str(bad))
    assert r.returncode == 2
    assert "HloModule" in r.stderr and "Traceback" not in r.stderr


def test_input_files_that_are_not_text_are_named_with_what_was_expected(tmp_path):
    import gzip

    from disco.cli.common import CliError, read_text_input

    text = "HloModule m\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n"
    (tmp_path / "ok.hlo").write_text(text)
    (tmp_path / "ok.hlo.gz").write_bytes(gzip.compress(text.encode()))
    assert read_text_input(str(tmp_path / "ok.hlo"), "--hlo", "HLO") == text
    assert read_text_input(str(tmp_path / "ok.hlo.gz"), "--hlo", "HLO") == text
    (tmp_path / "binary.hlo").write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff")
    (tmp_path / "plain.gz").write_text(text)
    (tmp_path / "cut.gz").write_bytes(gzip.compress(text.encode() * 50)[:40])
    cases = [(tmp_path, "is a directory"), (tmp_path / "missing.hlo", "no such file"),
             (tmp_path / "binary.hlo", "not UTF-8 text (byte 0xd0 at offset 8)"),
             (tmp_path / "plain.gz", "not a complete gzip file"), (tmp_path / "cut.gz", "not a complete gzip file")]
    for path, message in cases:
        with pytest.raises(CliError, match=r"--hlo '.*'.*expected .*HLO") as err:
            read_text_input(str(path), "--hlo", "HLO")
        assert message in str(err.value)
    r = run_cli("graph", "--hlo", str(tmp_path / "binary.hlo"))
    assert r.returncode == 2 and "not UTF-8 text" in r.stderr and "Traceback" not in r.stderr


def test_graph_json_summary(tmp_path):
    r = run_cli("graph", "--model", "mlp", "--devices", "4", "--json", "--dump", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == "mlp" and out["nodes"] > 0
    assert out["all_reduces"] == out["gradient_all_reduces"] + 1
    assert (tmp_path / "graph.json").exists() and (tmp_path / "step.pre_opt.hlo.txt").exists()
    # the dumped HLO reads back through --hlo with the same fingerprint
    r2 = run_cli("graph", "--hlo", str(tmp_path / "step.pre_opt.hlo.txt"), "--json")
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["fingerprint"] == out["fingerprint"] and not json.loads(r2.stdout)["optimized"]
    # a file says whether it was compiled; --optimized compiles a zoo step, not a file
    r3 = run_cli("graph", "--model", "mlp", "--devices", "4", "--optimized", "--dump", str(tmp_path / "opt"))
    assert r3.returncode == 0 and "(post-optimisation HLO)" in r3.stdout, r3.stderr
    r4 = run_cli("graph", "--hlo", str(tmp_path / "opt" / "step.optimized.hlo.txt"), "--json")
    assert r4.returncode == 0 and json.loads(r4.stdout)["optimized"], r4.stderr
    r5 = run_cli("graph", "--hlo", str(tmp_path / "step.pre_opt.hlo.txt"), "--optimized")
    assert r5.returncode == 2 and "--optimized compiles a zoo model's step; an --hlo file is read as it is" in r5.stderr
    # model options with --hlo are refused by name, not ignored
    r6 = run_cli("graph", "--hlo", str(tmp_path / "step.pre_opt.hlo.txt"), "--model", "mlp", "--devices", "4")
    assert r6.returncode == 2 and "--model, --devices build a step; an --hlo file is read as it is" in r6.stderr


@pytest.mark.fast
def test_deferred_model_defaults_are_the_documented_ones():
    from disco.cli.common import add_model_args, apply_model_defaults, defer_model_defaults, model_args_given

    plain, deferred = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_model_args(plain)
    add_model_args(deferred)
    defer_model_defaults(deferred)
    args = deferred.parse_args(["--preset", "small", "--trax-batch", "3"])
    assert model_args_given(args) == ["--preset", "--trax-batch"]
    apply_model_defaults(args)
    assert vars(args) == vars(plain.parse_args(["--preset", "small", "--trax-batch", "3"]))
    assert model_args_given(deferred.parse_args([])) == []


def test_graph_of_a_gspmd_step_is_its_partitioned_program_the_one_plans_use():
    """It showed jax's text before the partitioner: no all-reduce, and another fingerprint than the
    one plans are made for."""
    r = run_cli("graph", "--model", "rnnlm", "--devices", "4", "--style", "gspmd", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["all_reduces"] > out["all_reduces_after_loops"] > 0  # its loops' gradients, moved out
    import trax_models
    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    step, args = trax_models.make_train_step("rnnlm", "tiny", devices=4, optimizer="adamw", style="gspmd")
    planned = HloGraph.from_hlo_text(extractor.plan_text(extractor.lower(step, *args), debug_info=True))
    assert planned.fingerprint == out["fingerprint"]


def test_graph_table():
    r = run_cli("graph", "--model", "mlp", "--devices", "2")
    assert r.returncode == 0, r.stderr
    assert "fingerprint" in r.stdout and "all_reduces" in r.stdout


def test_simulate_json():
    r = run_cli("simulate", "--model", "mlp", "--devices", "4", "--plans", "xla_default,per_tensor", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["simulated"] is True and out["cost_model"] == "analytic"
    by = {row["plan"]: row for row in out["results"]}
    assert by["per_tensor"]["comm_time_ms"] > by["xla_default"]["comm_time_ms"] > 0
    assert all(row["step_time_ms"] >= out["lower_bound_ms"] for row in out["results"])
    # without xla_default in --plans it is added first, as disco bench does: the speedups' reference
    r = run_cli("simulate", "--model", "mlp", "--devices", "4", "--plans", "per_tensor", "--json")
    rows = json.loads(r.stdout)["results"]
    assert [row["plan"] for row in rows] == ["xla_default", "per_tensor"]
    assert rows[1]["speedup_vs_xla_default"] == pytest.approx(rows[0]["step_time_ms"] / rows[1]["step_time_ms"],
                                                              rel=1e-3)


def test_calibrate_writes_a_loadable_spec(tmp_path):
    out = tmp_path / "local.yaml"
    r = run_cli("calibrate", "--devices", "2", "--reps", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    from disco.calibrate import MIN_FIT_B

    assert (data["fit_b"] == MIN_FIT_B) == ("fit_b" in data["floored"])
    assert ("fitted at or below zero" in r.stderr) == bool(data["floored"])  # a floor is said on stderr
    from disco.sim import cluster

    spec = cluster.load_cluster(str(out))
    assert spec.num_devices == 2 and spec.intra.bandwidth == pytest.approx(data["bandwidth"])
    assert spec.operand_latency == pytest.approx(data["operand_latency"])
    # simulate says when its cluster's link costs are placeholders, and not for a calibrated file
    placeholder = run_cli("simulate", "--model", "mlp", "--devices", "2", "--plans", "xla_default", "--json")
    calibrated = run_cli("simulate", "--model", "mlp", "--devices", "2", "--plans", "xla_default", "--json",
                         "--cluster", str(out))
    assert placeholder.returncode == calibrated.returncode == 0, placeholder.stderr + calibrated.stderr
    assert "cluster 'local' prices all-reduces with placeholder link costs" in placeholder.stderr
    assert "placeholder" not in calibrated.stderr


def test_simulate_names_the_cost_model_it_used():
    r = run_cli("simulate", "--model", "mlp", "--devices", "2", "--plans", "xla_default,ddp", "--cost-model", "gnn",
                "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    info = out["cost_model_info"]
    assert out["cost_model"] == info["name"] == "gnn" and len(info["digest"]) == 16
    assert info["source"].endswith("default_checkpoint.msgpack")
    bad = run_cli("simulate", "--model", "mlp", "--devices", "2", "--cost-model", "nope")
    assert bad.returncode == 2 and "expected analytic, gnn" in bad.stderr


@pytest.mark.slow  # 30 s on the 2-core VM under load: a whole optimize with the GNN
def test_optimize_with_the_gnn_cost_model_on_virtual_devices():
    # loading the GNN imports jax: the device count must be set before that
    r = run_cli("optimize", "--model", "mlp", "--devices", "2", "--cost-model", "gnn", "--budget", "1",
                "--measure-top-k", "0", "--rounds", "1", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["cost_model"] == "gnn" and out["cost_model_info"]["digest"]


def test_optimize_on_one_device_needs_no_calibration():
    """Without --cluster, one CPU device has no all-reduce to calibrate: the search runs (it failed with
    "calibration needs at least 2 devices, got 1")."""
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--devices", "1", "--budget", "1",
                "--measure-top-k", "0", "--measure-rounds", "1", "--bucket-sweep", "", "--rounds", "1", "--steps", "1",
                "--no-confirm", "--no-bound", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    spec = out["cluster_spec"]
    assert out["calibration"] is None and spec["nodes"] * spec["devices_per_node"] == 1, spec
    assert "one CPU device: no communication to price" in r.stderr


@pytest.mark.slow  # 32 s on the 2-core VM under load: a whole optimize across processes
def test_optimize_across_processes_on_the_local_preset_prices_their_devices():
    """--cluster local across 2 processes x 1 device priced plans on local's default 8 devices."""
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--processes", "2", "--cluster", "local",
                "--budget", "0.5", "--measure-top-k", "0", "--bucket-sweep", "2", "--rounds", "1", "--steps", "1",
                "--no-confirm", "--no-progress", "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    spec = json.loads(r.stdout)["cluster_spec"]
    assert spec["name"] == "local" and spec["nodes"] * spec["devices_per_node"] == 2, spec


# -- issue 20: help, early checks, progress without a terminal, the service hint ----------------------
def _subparsers():
    import argparse

    from disco import cli

    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.fast
def test_every_option_with_a_default_shows_it_in_help():
    import argparse

    missing = []
    for name, sub in _subparsers().items():
        for a in sub._actions:
            if a.help == argparse.SUPPRESS or not a.option_strings or isinstance(a, argparse._HelpAction):
                continue
            if a.default in (None, False) or isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                continue
            if "default" not in (a.help or ""):
                missing.append(f"{name} {a.option_strings[0]} (default {a.default!r})")
    assert not missing, f"options whose help does not show their default: {missing}"


@pytest.mark.fast
def test_preset_names_and_progress_spelling_are_the_same_everywhere():
    import trax_models

    subs = _subparsers()
    for name, sub in subs.items():
        opts = {o: a for a in sub._actions for o in a.option_strings}
        if "--preset" in opts:
            assert all(p in opts["--preset"].help for p in trax_models.presets()), name
        if "--devices" in opts and name != "bench":
            # graph defers its defaults (to refuse them beside --hlo), so the help is what is the same
            assert "(default 4)" in opts["--devices"].help and opts["--devices"].default in (4, None), name
    for name in ("optimize", "bench", "collect", "train-gnn"):
        assert "--no-progress" in {o for a in subs[name]._actions for o in a.option_strings}, name
    args = subs["train-gnn"].parse_args(["--data", "d", "--quiet"])
    assert args.quiet is True  # the old spelling still works


def _main_in_a_subprocess(argv, pre=""):
    """Runs ``disco.cli.main(argv)`` in a fresh process; prints whether jax was imported."""
    code = (f"import sys\n{pre}\nfrom disco.cli import main\nrc = main({argv!r})\n"
            "print('jax imported' if 'jax' in sys.modules else 'no jax')\nsys.exit(rc)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)


@pytest.mark.parametrize("argv, message", [
    (["optimize", "--model", "mlp", "--out", "{missing}/plan.json"], "--out '{missing}/plan.json': the directory"),
    (["optimize", "--model", "mlp", "--trace", "{missing}/t.json"], "--trace '{missing}/t.json': the directory"),
    (["optimize", "--model", "mlp", "--plot", "{missing}/p.png"], "--plot '{missing}/p.png': the directory"),
    (["optimize", "--model", "mlp", "--out", "{tmp}"], "--out '{tmp}' is a directory"),
    (["optimize", "--model", "mlp", "--samples", "{file}"], "--samples '{file}' is a file; expected a dataset directory"),
    (["calibrate", "--out", "{missing}/c.yaml"], "--out '{missing}/c.yaml': the directory"),
    (["graph", "--model", "mlp", "--dump", "{file}/sub"], "is a file, so the directory cannot be created"),
    (["collect", "--models", "mlp", "--out", "{file}"], "--out '{file}' is a file; expected a directory"),
    (["bench", "--model", "mlp", "--rounds", "0"], "--rounds and --steps must be >= 1, got 0 and 3"),
    (["optimize", "--model", "mlp", "--max-evals", "0"], "--max-evals: expected an integer >= 1 or None, got 0"),
    (["optimize", "--model", "mlp", "--finalists", "0"], "--finalists: expected an integer >= 1, got 0"),
])
def test_bad_outputs_and_numbers_fail_before_the_model_is_built(tmp_path, argv, message):
    (tmp_path / "file").write_text("x")
    fill = {"missing": str(tmp_path / "nope"), "tmp": str(tmp_path), "file": str(tmp_path / "file")}
    argv = [a.format(**fill) for a in argv]
    r = _main_in_a_subprocess(argv)
    assert r.returncode == 2, r.stderr
    assert message.format(**fill) in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout.strip() == "no jax"  # refused before jax was imported, let alone a compile


def test_an_unwritable_directory_is_named(tmp_path):
    from disco.cli.common import CliError, check_output_file

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    root = os.geteuid() == 0  # root ignores modes: the immutable attribute locks it for root too
    if root and subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is not supported (needed to lock a directory for root)")
    try:
        assert not os.access(locked, os.W_OK)
        with pytest.raises(CliError, match=r"--out '.*locked/p.json': not writable"):
            check_output_file(str(locked / "p.json"), "--out")
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        locked.chmod(0o700)
    check_output_file(str(tmp_path / "p.json"), "--out")  # a writable directory passes, nothing created
    assert not (tmp_path / "p.json").exists()


def test_serve_without_the_service_extra_prints_one_line_naming_the_extra():
    block = "sys.modules['flask'] = None\nsys.modules['werkzeug'] = None\nsys.modules['werkzeug.serving'] = None"
    r = _main_in_a_subprocess(["serve", "--port", "0"], pre=block)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "disco serve: the plan service needs the 'service' extra (Flask, Werkzeug), which is not installed: "
        "pip install -e '.[service]' (missing: flask)"]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_refuses_a_port_out_of_range(port):
    """A port over 65535 was wrapped round by the socket layer (99999 listened on 34463)."""
    pytest.importorskip("flask")
    r = _main_in_a_subprocess(["serve", "--port", port])
    assert r.returncode == 2 and f"--port: expected a TCP port 0-65535 (0: any free port), got {port}" in r.stderr
    assert "listening" not in r.stderr and "Traceback" not in r.stderr


def test_progress_lines_without_a_terminal_and_the_speedup_key(tmp_path):
    r = run_cli("bench", "--model", "mlp", "--preset", "tiny", "--devices", "2", "--plans", "xla_default,one_bucket",
                "--rounds", "2", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()  # stderr is a pipe here: plain lines, no bar
    assert lines[0].endswith("] bench  25%: compiled xla_default"), lines
    assert lines[-1].endswith("bench 100%: round 2/2") and all(ln.startswith("[") for ln in lines)
    assert "\x1b[" not in r.stderr  # no terminal escapes
    rows = {row["plan"]: row for row in json.loads(r.stdout)["results"]}
    assert rows["xla_default"]["speedup_vs_xla_default"] == 1.0 and "ratio_to_xla_default" not in rows["one_bucket"]
    # higher is faster: xla_default's median over the plan's
    base = rows["xla_default"]["median_ms"]
    one = rows["one_bucket"]
    assert one["speedup_vs_xla_default"] == pytest.approx(base / one["median_ms"], rel=2e-3)
    # and paired, as disco optimize reports it: the median of per-round ratios, with its interval
    lo, hi = one["paired_interval"]
    assert lo <= one["paired_speedup"] <= hi and rows["xla_default"]["paired_speedup"] == 1.0


@pytest.mark.fast
def test_progress_reporter_is_quiet_when_asked_and_throttles_lines(capsys):
    from disco.cli.common import _Lines, progress_reporter

    with progress_reporter(False) as progress:
        progress("search", 0.5, "x")
    assert capsys.readouterr().err == ""
    lines = _Lines(sys.stderr, every_s=3600)
    for i in range(5):
        lines("search", i / 10, f"{i} plans")
    lines("search", 1.0, "done")
    lines("measure", 0.1, "compiled xla_default")
    err = capsys.readouterr().err.splitlines()
    assert [ln.split("] ", 1)[1] for ln in err] == ["search   0%: 0 plans", "search 100%: done",
                                                    "measure  10%: compiled xla_default"]


@pytest.mark.fast
def test_a_plan_file_for_another_graph_is_a_warning_or_with_strict_an_error(tmp_path, capsys):
    from disco.cli.common import CliError, resolve_plans
    from disco.ir.graph import HloGraph
    from disco.plans.plan import FusionPlan

    text = "HloModule m\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"
    graph = HloGraph.from_hlo_text(text)
    mine = tmp_path / "mine.json"
    mine.write_text(FusionPlan(name="mine", graph_fingerprint=graph.fingerprint).to_json())
    other = tmp_path / "other.json"
    other.write_text(FusionPlan(name="other", graph_fingerprint="f" * 32).to_json())
    assert list(resolve_plans(f"{mine},{other}", graph)) == ["mine", "other"]
    err = capsys.readouterr().err
    assert f"warning: plan file '{other}' was made for graph {'f' * 32}, but this step's graph is " in err
    assert "mine" not in err
    assert list(resolve_plans(str(mine), graph, strict=True)) == ["mine"]
    with pytest.raises(CliError, match=r"was made for graph f{32}.*\(--strict\)"):
        resolve_plans(str(other), graph, strict=True)
    # disco simulate prices what a compile would run: XLA's default, and says so
    simulated = resolve_plans(f"{other},horovod", graph, simulated=True)
    assert simulated["other"] == FusionPlan(name="xla_default")
    assert "simulated as XLA's default compile" in capsys.readouterr().err
    with pytest.raises(CliError, match=r"^plan 'horovod:-5': baseline 'horovod': threshold_mb expected a positive"):
        resolve_plans("horovod:-5", graph)


@pytest.mark.fast
def test_a_plan_file_that_is_not_a_plan_is_an_error_naming_the_file(tmp_path):
    from disco.cli.common import CliError, resolve_plans
    from disco.ir.graph import HloGraph

    graph = HloGraph.from_hlo_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n")
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x"')
    with pytest.raises(CliError, match=r"plan file '.*broken\.json': plan is not valid JSON"):
        resolve_plans(str(broken), graph)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"name": "x", "buckets": "bad"}')
    with pytest.raises(CliError, match=r"plan file '.*wrong\.json': plan field 'schema_version': Field required"):
        resolve_plans(str(wrong), graph)
    assert broken.read_text() == '{"name": "x"'  # nothing is rewritten
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"name": "\xd0"}')
    with pytest.raises(CliError, match=r"plan file '.*binary\.json': not UTF-8 text \(byte 0xd0 at offset 10\); "
                                       r"expected a plan's JSON"):
        resolve_plans(str(binary), graph)
    with pytest.raises(CliError, match=r"plan file '.*missing\.json': no such file"):
        resolve_plans(str(tmp_path / "missing.json"), graph)


@pytest.mark.parametrize("argv, message", [
    (["optimize", "--model", "mlp", "--devices", "0"], "--devices must be 1 to 4,096 (virtual CPU devices in this "
                                                       "process), got 0"),
    (["optimize", "--model", "mlp", "--devices", "100000"], "--devices must be 1 to 4,096"),
    (["optimize", "--model", "mlp", "--processes", "2", "--trace", "t.json"],
     "--trace is written by the optimizer in one process only; with --processes or --link the answer is written "
     "by --out"),
    (["calibrate", "--processes", "2", "--timeout", "0"], "--timeout must be positive seconds, got 0.0"),
    (["calibrate", "--processes", "0"], "--processes and --devices-per-process must be >= 1, got 0 and 1"),
    (["calibrate", "--devices", "1"], "--devices must be >= 2 to calibrate all-reduces across devices, got 1"),
    (["calibrate", "--processes", "2", "--timeout", "5", "--model", "nosuch"], "unknown model 'nosuch'; expected one of"),
    (["calibrate", "--processes", "2", "--timeout", "5", "--model", "mlp", "--preset", "huge"],
     "unknown preset 'huge'; expected one of: tiny, small, paper"),
    (["calibrate", "--processes", "2", "--timeout", "5", "--model", "mlp", "--rounds", "0"],
     "--rounds must be >= 1, got 0"),
    (["simulate", "--model", "mlp", "--cluster", "/"], "cluster file '/': Is a directory; expected a readable "
                                                       "cluster YAML file"),
])
def test_bad_counts_and_flags_are_refused_before_any_work(argv, message, tmp_path):
    """One line, status 2, before a compile or a launch (--devices 100000 aborted inside XLA; calibrate's --model,
    --preset and --rounds before the calibration across processes, whose workers --timeout 5 would end)."""
    r = run_cli(*[str(tmp_path / a) if a == "t.json" else a for a in argv], timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_workers_that_fail_are_one_line_and_status_1():
    """A calibration whose workers time out (2 s: jax does not even start) ends in their messages."""
    r = run_cli("calibrate", "--processes", "2", "--timeout", "2", timeout=120)
    lines = [ln for ln in r.stderr.strip().splitlines() if "[Gloo]" not in ln]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("disco calibrate: error: calibration across processes failed: process 0: no result "
                               "after 2s; killed")


def test_simulate_says_when_the_cluster_has_other_devices_and_gives_the_speedup():
    r = run_cli("simulate", "--model", "mlp", "--cluster", "h100-sxm-8", "--plans", "xla_default,per_tensor",
                "--json")
    assert r.returncode == 0, r.stderr
    assert "the step is built for --devices 4, but cluster 'h100-sxm-8' has 8 devices" in r.stderr
    rows = {row["plan"]: row for row in json.loads(r.stdout)["results"]}
    assert rows["xla_default"]["speedup_vs_xla_default"] == 1.0
    assert rows["per_tensor"]["speedup_vs_xla_default"] == pytest.approx(
        rows["xla_default"]["step_time_ms"] / rows["per_tensor"]["step_time_ms"], rel=1e-3)


def test_graph_dump_where_the_system_refuses_is_one_line(tmp_path):
    r = run_cli("graph", "--model", "mlp", "--dump", "/proc/disco-cannot-write-here/x")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--dump '/proc/disco-cannot-write-here/x': cannot write" in r.stderr



def test_a_fallback_warning_is_one_line_without_disco_source(tmp_path):
    from disco.plans.plan import FusionPlan

    other = tmp_path / "other.json"
    other.write_text(FusionPlan(name="other", graph_fingerprint="f" * 32, buckets=()).to_json())
    r = run_cli("bench", "--model", "mlp", "--devices", "2", "--plans", f"xla_default,{other}", "--rounds", "1",
                "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert "warning (PlanFallbackWarning): " in r.stderr and ".py:" not in r.stderr, r.stderr


def test_every_plan_item_keeps_a_row_of_its_own_and_xla_default_is_xla_default(tmp_path):
    """A plan file's name taken by a baseline, by another file or by xla_default replaced that row
    silently: `--plans ddp,plan.json` (disco optimize names its answer after the baseline it kept)
    measured one row, and a file named xla_default became the reference of every speedup."""
    from disco.plans import baselines
    from disco.plans.plan import FusionPlan

    graph = _mlp_graph()
    one = baselines.make("one_bucket", graph).replace(name="ddp", graph_fingerprint=graph.fingerprint)
    tensor = baselines.make("per_tensor", graph).replace(graph_fingerprint=graph.fingerprint)
    files = {}
    for stem, plan in [("a", one), ("b", one), ("c", tensor.replace(name="xla_default")), ("d", tensor.replace(name=""))]:
        files[stem] = tmp_path / f"{stem}.json"
        files[stem].write_text(plan.to_json())
    items = ["ddp", str(files["a"]), str(files["b"]), str(files["c"]), str(files["d"]), "ddp", str(files["a"])]
    r = run_cli("bench", "--model", "mlp", "--devices", "2", "--plans", ",".join(items), "--rounds", "1",
                "--steps", "1", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = {row["plan"]: row["plan_digest"] for row in json.loads(r.stdout)["results"]}
    assert list(rows) == ["xla_default", "ddp", str(files["a"]), str(files["b"]), str(files["c"]), str(files["d"])]
    assert rows["xla_default"] == FusionPlan().digest() and rows["ddp"] == baselines.make("ddp", graph).digest()
    assert rows[str(files["a"])] == rows[str(files["b"])] == one.digest()
    assert rows[str(files["c"])] == rows[str(files["d"])] == tensor.digest()


def test_a_plan_file_that_does_not_fit_the_graph_is_named_in_the_error(tmp_path):
    from disco.cli.common import CliError, resolve_plans
    from disco.plans.plan import make_plan

    graph = _mlp_graph()
    names = [n.name for n in graph.all_reduces()]
    for stem, plan, why in [("ghost", make_plan([["nope.1"]]), r"group 0: instruction 'nope\.1' is not in the graph"),
                            ("short", make_plan(buckets=[names[1:]]), r"buckets leave out all-reduces"),
                            ("twice", make_plan(buckets=[names, names[:1]]), r"bucket 1: all-reduce .* already in")]:
        path = tmp_path / f"{stem}.json"
        path.write_text(plan.replace(name=stem).to_json())
        with pytest.raises(CliError, match=rf"^plan file '{path}': {why}"):
            resolve_plans(f"xla_default,{path}", graph)


def _mlp_graph():
    import trax_models
    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    step, args = trax_models.make_train_step("mlp", "tiny", devices=2)
    return HloGraph.from_hlo_text(extractor.hlo_text(step, *args))


@pytest.mark.parametrize("plans, message", [
    ("xla_default,bogus", "unknown plan 'bogus'; expected a baseline (xla_default, no_fusion"),
    ("horovod:-5", "plan 'horovod:-5': baseline 'horovod': threshold_mb expected a positive number of MB, got -5.0"),
    ("even:0", "plan 'even:0': baseline 'even': k is the bucket count, expected an integer >= 1, got 0"),
    ("per_tensor:3", "plan 'per_tensor:3': only horovod:MB, ddp:MB, xla_threshold:BYTES, even:K and prefetch:D take a value"),
    ("ddp:big", "plan 'ddp:big': expected a number after ':', got 'big'"),
    (" , ", "--plans is empty"),
    ("empty.json", "plan file 'empty.json': plan is not valid JSON"),
    ("missing.json", "plan file 'missing.json': no such file"),
])
def test_plans_across_processes_are_checked_before_the_workers_start(plans, message, tmp_path):
    """They were handed to the workers unchecked: an unknown baseline ended in both workers' tracebacks
    and status 1. A bad value is refused as one process refuses it."""
    (tmp_path / "empty.json").write_text("")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "disco", "bench", "--model", "mlp", "--processes", "2", "--plans",
                        plans], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"disco bench: error: {message}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.fast
def test_strict_across_processes_is_refused(capsys):
    """Only the workers build the step there, so --strict compared nothing (silently)."""
    from disco import cli

    assert cli.main(["bench", "--model", "mlp", "--processes", "2", "--plans", "xla_default", "--strict"]) == 2
    assert capsys.readouterr().err.startswith("disco bench: error: --strict compares plan files with the step "
                                              "built in this process; with --processes only the workers build it")


def test_a_workers_plan_file_keeps_a_row_of_its_own(tmp_path):
    from disco.plans import baselines
    from disco.runtime import worker

    graph = _mlp_graph()
    files = []
    for stem, name in [("a", "ddp"), ("b", "ddp"), ("c", "xla_default"), ("d", "even_2"), ("e", "mine")]:
        files.append(str(tmp_path / f"{stem}.json"))
        Path(files[-1]).write_text(baselines.make("one_bucket", graph).replace(name=name).to_json())
    rows = worker._plans(["xla_default", "ddp", "even:2", *files], graph)
    assert list(rows) == ["xla_default", "ddp", "even_2", *files[:4], "mine"]
    assert rows["xla_default"].is_default and rows["ddp"] == baselines.make("ddp", graph)


def test_a_plan_file_named_comm_free_bound_keeps_its_row_next_to_the_bound(tmp_path):
    """disco bench --bound's row replaced a plan file of that name (run_bench keys rows by name)."""
    from disco.plans import baselines

    graph = _mlp_graph()
    path = tmp_path / "b.json"
    path.write_text(baselines.make("ddp", graph).replace(name="comm_free_bound").to_json())
    r = run_cli("bench", "--model", "mlp", "--devices", "2", "--plans", str(path), "--bound", "--rounds", "1",
                "--steps", "1", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = {row["plan"]: row["plan_digest"] for row in json.loads(r.stdout)["results"]}
    assert rows == {"xla_default": rows["xla_default"], str(path): baselines.make("ddp", graph).digest(),
                    "comm_free_bound": None}


@pytest.mark.fast
@pytest.mark.parametrize("link, across", [(None, False), ("loopback", False), ("LOOPBACK", False), (" Loopback ", False),
                                          ("", False), ("rate=1gbit", True)])
def test_loopback_in_any_spelling_is_no_link(link, across):
    """parse_link reads '', 'LOOPBACK' and ' Loopback ' as loopback; the commands took any --link but
    None (and check_process_counts any but 'loopback') for an emulated one."""
    from disco.cli.common import CliError, across_processes, check_process_counts

    args = argparse.Namespace(processes=1, devices_per_process=1, timeout=60.0, link=link)
    assert across_processes(args) is across
    if across:
        with pytest.raises(CliError, match="give --processes 2 or more"):
            check_process_counts(args)
    else:
        check_process_counts(args)


def test_link_loopback_with_one_process_runs_in_process():
    """--link loopback means 127.0.0.1, as no --link does: with --processes 1 calibrate refused ('needs at least
    2 devices in all, got 1 processes x 1 devices') instead of calibrating --devices in this process, and bench
    refused --bound, which it measured in-process only then."""
    r = run_cli("calibrate", "--link", "loopback", "--devices", "2", "--reps", "1", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["devices"] == 2
    r = run_cli("bench", "--model", "mlp", "--preset", "tiny", "--processes", "1", "--link", "LOOPBACK", "--plans",
                "xla_default", "--rounds", "1", "--steps", "1", "--bound", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    assert [row["plan"] for row in json.loads(r.stdout)["results"]] == ["xla_default", "comm_free_bound"]


@pytest.mark.slow
def test_valued_baselines_run_across_processes_with_the_rows_of_one_process(tmp_path):
    """--processes refused every valued item but even:K ("with --processes only even:K (K >= 1) takes a
    value"), and named even:K's row even_K where one process named it even:K. A plan that falls back
    there says why, as in one process (the rows said only applied: false). --bound adds the
    communication-free bound's row last, as in one process (it was refused across processes)."""
    import dataclasses

    from disco.cli.common import resolve_plans
    from disco.plans import baselines

    graph = _mlp_graph()  # 9,384 gradient bytes: a threshold of 0.002 MB or 2,048 bytes cuts them
    items = "horovod:0.002,ddp:1,xla_threshold:2048,even:3"
    expected = {"horovod:0.002": baselines.make("horovod", graph, threshold_mb=0.002),
                "ddp:1": baselines.make("ddp", graph, cap_mb=1.0),
                "xla_threshold:2048": baselines.make("xla_threshold", graph, threshold_bytes=2048),
                "even_3": baselines.make("even", graph, k=3)}
    assert expected["horovod:0.002"].digest() != baselines.make("horovod", graph).digest()
    assert resolve_plans(items, graph) == expected
    stale = tmp_path / "stale.json"  # a plan made for another graph: it falls back in the workers
    stale.write_text(dataclasses.replace(baselines.make("per_tensor", graph), name="stale",
                                         graph_fingerprint="0" * 32).to_json())
    r = run_cli("bench", "--model", "mlp", "--preset", "tiny", "--processes", "2", "--devices-per-process", "1",
                "--plans", f"{items},{stale}", "--rounds", "1", "--steps", "1", "--bound", "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["fingerprints"] == [graph.fingerprint]
    rows = {row["plan"]: row for row in out["results"]}
    assert list(rows) == ["xla_default", *expected, "stale", "comm_free_bound"]
    assert rows["comm_free_bound"]["plan_digests"] == [None] and rows["comm_free_bound"]["all_reduces"] == 0
    for name, plan in expected.items():
        assert rows[name]["applied"] and rows[name]["fallback_reason"] is None, rows[name]
        assert rows[name]["plan_digests"] == [plan.digest()], rows[name]
    assert not rows["stale"]["applied"], rows["stale"]
    assert re.search(r"was made for graph 0{32}, but this step's graph is", rows["stale"]["fallback_reason"])


# -- issue 39: every table and note fits 120 columns, long text as numbered footnotes -------------------
WIDTH = 120


def _too_wide(text):
    return [ln for ln in text.splitlines() if len(ln) > WIDTH]


def test_optimize_prints_within_120_columns_with_the_origins_as_footnotes(tmp_path):
    """The table was about 250 columns wide into a pipe (the `from` column alone 70): the origins are
    footnotes now, and every note is cut to 120 columns; nothing printed is lost. ``--samples DIR``
    keeps the plans measured in the rounds as training data the GNN's loader reads."""
    data = tmp_path / "data"
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--devices", "4", "--cluster", "local",
                "--budget", "1", "--max-evals", "300", "--rounds", "1", "--steps", "1", "--confirm-rounds", "1",
                "--measure-rounds", "1", "--bucket-sweep", "", "--no-bound", "--no-progress", "--details",
                "--samples", str(data))  # one funnel round suffices
    assert r.returncode == 0, r.stderr[-2000:]
    _check_samples(data, r.stderr)
    assert not _too_wide(r.stdout), _too_wide(r.stdout)
    notes = re.findall(r"^\[(\d+)\] (.*)$", r.stdout, re.M)
    assert notes and [int(n) for n, _ in notes] == list(range(1, len(notes) + 1)), r.stdout
    assert any(text.startswith("searched from ") for _, text in notes), notes
    # a searched row's first line (its name, by content, may wrap onto the next line: b1_g42_ then d70693)
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"│ b(\d+|xla)[\w-]* +│", ln)]
    assert rows and all(re.search(r"│ \[\d+\] +│", ln) for ln in rows), rows  # each searched row names its note
    text = " ".join(r.stdout.split())
    assert "verdict: " in text and "speedup vs xla_default: per round" in text
    assert re.search(r"(chosen|search best) \S+: ", text)


def _check_samples(data, stderr):
    """The measured rows of an optimize table as the samples ``--samples`` appended: one group, every
    row of the rounds once (a plan of two names once), each against xla_default in its round."""
    from disco.data import dataset

    samples = dataset.read(dataset.samples_path(data)).samples
    names = {s["plan_name"] for s in samples}
    assert re.search(rf"{len(samples)} measured plans? appended to {re.escape(str(data))}", " ".join(stderr.split()))
    assert "xla_default" in names and any(re.fullmatch(r"b(\d+|xla)\S*_[0-9a-f]{6}", n) for n in names), names
    assert len({s["plan_digest"] for s in samples}) == len(samples)
    assert {dataset.group_key(s) for s in samples} == {dataset.group_key(samples[0])}
    ref = next(s for s in samples if s["plan_name"] == "xla_default")
    assert ref["ratio_to_reference"] == 1.0 and ref["reference_xla_default_median_ms"] == ref["measured"]["median_ms"]
    for s in samples:  # each against xla_default in its own round: its median over its paired speedup
        assert s["measured"]["median_ms"] == pytest.approx(s["ratio_to_reference"] * s["reference_xla_default_median_ms"])
    assert all(s["kind"] == "optimize" and s["predicted_by"] and s["measured"]["min_ms"] <= s["measured"]["median_ms"]
               <= s["measured"]["max_ms"] for s in samples)
    pytest.importorskip("flax")
    from gnn import train

    ds = train.load_dataset(data)  # what `disco train-gnn --data` reads
    assert len(ds.samples) == sum(s["applied"] for s in samples) and len(ds.groups()) == 1


def test_bench_prints_within_120_columns_with_fallback_reasons_as_footnotes(tmp_path):
    from disco.plans.plan import FusionPlan

    other = tmp_path / "other.json"  # made for another graph: it falls back, and the table says why
    other.write_text(FusionPlan(name="other", graph_fingerprint="f" * 32, buckets=()).to_json())
    r = run_cli("bench", "--model", "mlp", "--preset", "tiny", "--devices", "2", "--plans", f"xla_default,{other}",
                "--rounds", "1", "--steps", "1", "--no-progress", "--details")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not _too_wide(r.stdout), _too_wide(r.stdout)
    assert re.search(r"│ no \[1\] +│", r.stdout), r.stdout
    note = re.search(r"^\[1\] (.*)", r.stdout, re.M | re.S).group(1)
    assert "plan 'other' was made for graph ffff" in " ".join(note.split()), r.stdout


@pytest.mark.fast
def test_optimize_across_processes_prints_within_120_columns(capsys):
    """The --processes table (the one printer, on a result built by hand: no workers start)."""
    import dataclasses

    from disco import optimizer as opt
    from disco.cli import _optimize_report as optimize_report
    from tests.support.optimize_results import built_result

    def row(plan, kind, speedup):
        return opt.PlanRow(plan, kind, "searched from horovod" if kind == "search" else plan,
                           FusionPlan(name=plan), 1.234e-3, median_s=1.2345678, min_s=1.2001234, max_s=1.3009876,
                           applied=plan != "per_tensor", speedup=speedup, all_reduces=1)

    from disco.plans.plan import FusionPlan

    rows = (row("xla_default", "baseline", 1.0), row("disco_1_on_even_2", "search", 1.31),
            row("per_tensor", "baseline", 0.5))
    verdict = ("disco_1_on_even_2 measured 1.310x faster than xla_default (1234.568 vs 1617.284 ms median) (in this "
               "run the min-max ranges overlap, so this run alone cannot tell the gain from noise); confirmed in a "
               "second run: 1.250x paired over 27 rounds; 1234.568 vs 1543.210 ms median; the best baseline, ddp, "
               "1.100x")
    res = dataclasses.replace(built_result(), plan=rows[1].plan, chosen="disco_1_on_even_2", verdict=verdict,
                              rows=rows, confirmation=None,
                              runner={"runner": "processes", "processes": 2, "devices_per_process": 4})
    info = {"model": "mlp", "preset": "tiny", "processes": 2, "devices_per_process": 4, "devices": 8,
            "device_kind": "cpu", "over": "127.0.0.1 (gloo)", "cost_model_info": {"name": "analytic"},
            "cluster_spec": {"label": "calibrated-across-2-processes-over-an-emulated-link"}}
    optimize_report.print_table(res, info)
    out = capsys.readouterr().out
    assert not _too_wide(out), _too_wide(out)
    text = " ".join(out.split())
    per_tensor = out[out.index("│ per_tensor"):out.index("└")]  # its row, maybe over two lines
    assert "1234.568 (1200.123-1300.988)" in per_tensor and "fell" in per_tensor and "back" in per_tensor
    # the plan column wraps a long name over lines (as in one process): its cells, joined
    names = "".join(ln.split("│")[1].strip() for ln in out.splitlines() if ln.startswith("│"))
    assert "disco_1_on_even_2 *xla_default" in names and "verdict: disco_1_on_even_2 measured 1.310x" in out
    assert "second run: 1.250x" in text and "ddp, 1.100x" in text
    assert "2 processes x 4 CPU devices over 127.0.0.1 (gloo)" in text and "the answer is " in text
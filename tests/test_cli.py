"""The disco command line: help without jax, graph summary, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "disco", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


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


def test_the_commands_table_lists_every_subcommand_once():
    import argparse

    from disco import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(cli.COMMANDS) == [
        "models", "graph", "bench", "calibrate", "simulate", "serve", "optimize", "train-gnn", "collect"]
    for name, p in sub.choices.items():
        assert callable(p.get_default("func")), name


CLI_DIR = REPO / "disco" / "cli"
COMMAND_MODULES = sorted(p.stem for p in CLI_DIR.glob("*.py") if p.stem not in ("__init__", "common"))


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_module_imports_no_other_command_module(module):
    import ast
    import importlib

    from disco import cli

    assert module in {f.__module__.rsplit(".", 1)[-1] for f in cli.COMMANDS.values()}, module
    tree = ast.parse((CLI_DIR / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("disco.cli"):
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


def test_too_many_devices():
    r = run_cli("graph", "--model", "mlp", "--devices", "0")
    assert r.returncode == 2 and "--devices must be at least 1" in r.stderr


def test_bound_across_processes_is_refused_clearly():
    r = run_cli("bench", "--model", "mlp", "--processes", "2", "--bound")
    assert r.returncode == 2 and "--bound is measured in-process only" in r.stderr
    assert "Traceback" not in r.stderr


def test_unparsable_hlo_file(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("this is not hlo")
    r = run_cli("graph", "--hlo", str(bad))
    assert r.returncode == 2
    assert "HloModule" in r.stderr and "Traceback" not in r.stderr


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
    assert json.loads(r2.stdout)["fingerprint"] == out["fingerprint"]


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


def test_calibrate_writes_a_loadable_spec(tmp_path):
    out = tmp_path / "local.yaml"
    r = run_cli("calibrate", "--devices", "2", "--reps", "3", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["bandwidth"] > 0 and data["latency"] > 0
    from disco.sim import cluster

    spec = cluster.load_cluster(str(out))
    assert spec.num_devices == 2 and spec.intra.bandwidth == pytest.approx(data["bandwidth"])


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


def test_optimize_with_the_gnn_cost_model_on_virtual_devices():
    # loading the GNN imports jax: the device count must be set before that
    r = run_cli("optimize", "--model", "mlp", "--devices", "2", "--cost-model", "gnn", "--budget", "1",
                "--measure-top-k", "0", "--rounds", "1", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["cost_model"] == "gnn" and out["cost_model_info"]["digest"]

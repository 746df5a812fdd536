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
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'jax' not in sys.modules, 'disco --help imported jax'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert "graph" in r.stdout and "bench" in r.stdout


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

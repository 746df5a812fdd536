"""``--style fsdp`` and ``--mesh``: the zoo's sharded steps from the command line."""

from __future__ import annotations

import json
import re

import pytest
from tests.support.cli import run_cli


def test_graph_of_an_fsdp_step_on_a_2x4_mesh_counts_its_collectives_by_role_and_axis():
    r = run_cli("graph", "--model", "mlp", "--devices", "8", "--style", "fsdp", "--mesh", "2x4", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # mlp tiny: 18 parameters, 17 sharded (the classifier's bias of 10 is not split 4 ways)
    assert out["collectives"]["param_gather"] == {"fsdp": 17}
    assert sum(out["collectives"]["grad_scatter"].values()) == 17
    assert out["collectives"]["grad_reduce"]["data"] > 0  # a 2-D mesh: shards reduced over data too
    r = run_cli("graph", "--model", "mlp", "--devices", "8", "--style", "fsdp", "--mesh", "2x4")
    assert r.returncode == 0, r.stderr
    assert "param_gather 17 over fsdp" in r.stdout


@pytest.mark.parametrize(("args", "match"), [
    (("--mesh", "2x4"), "--mesh '2x4' is for --style fsdp only, got --style shard_map"),
    (("--style", "fsdp", "--mesh", "2-4"), "--mesh: expected DATAxFSDP, two ints such as 2x4, got '2-4'"),
    (("--style", "fsdp", "--mesh", "2x2"), r"mesh_shape: expected None or \(data, fsdp\)"),
])
def test_a_bad_mesh_is_refused_by_name(args, match):
    r = run_cli("graph", "--model", "mlp", "--devices", "8", *args)
    assert r.returncode != 0
    assert re.search(match, r.stderr), r.stderr


@pytest.mark.fast
@pytest.mark.parametrize(("fields", "match"), [
    ({"mesh": "2x2"}, r"--mesh 2x2: 4 devices, and --processes 2 x --devices-per-process 4 are 8"),
    ({"mesh": "2x4", "style": "gspmd"}, "--mesh '2x4' is for --style fsdp only, got --style gspmd"),
])
def test_a_mesh_across_processes_is_checked_against_all_their_devices(fields, match):
    import argparse

    from disco.cli.common import CliError, worker_step

    args = argparse.Namespace(**{"style": "fsdp", "processes": 2, "devices_per_process": 4, **fields})
    with pytest.raises(CliError, match=match):
        worker_step(args)


@pytest.mark.fast
def test_a_mesh_across_processes_reaches_the_workers_as_data_x_fsdp():
    import argparse

    from disco.cli.common import worker_step

    args = argparse.Namespace(style="fsdp", mesh="2x4", processes=2, devices_per_process=4)
    assert worker_step(args) == {"style": "fsdp", "mesh_shape": (2, 4)}
    args = argparse.Namespace(style="fsdp", mesh=None, processes=2, devices_per_process=4)
    assert worker_step(args) == {"style": "fsdp", "mesh_shape": None}


@pytest.mark.slow
def test_optimize_an_fsdp_step_on_two_processes_over_an_emulated_link():
    """2 processes x 4 devices on a 2 x 4 mesh behind an emulated 10 Gbit/s + 50 us link: the answer
    applied by every worker, each measured row with its compiled peak memory."""
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--style", "fsdp", "--mesh", "2x4",
                "--processes", "2", "--devices-per-process", "4", "--link", "rate=10gbit,delay=50us",
                "--cluster", "local", "--budget", "2", "--max-evals", "200", "--optimizer", "sgd",
                "--rounds", "2", "--confirm-rounds", "3", "--no-progress", "--json", timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["processes"] == 2 and out["devices_per_process"] == 4 and out["mesh_shape"] == [2, 4]
    rows = {row["name"]: row for row in out["rows"]}
    assert rows[out["chosen"]]["applied"]
    assert all(isinstance(row["peak_memory_bytes"], int) for row in rows.values() if row["applied"]), rows

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

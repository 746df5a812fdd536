"""scripts/tools/replay_corrections.py on a kept corrections file written by disco.calibrate.kept."""

from __future__ import annotations

import json

import pytest

from disco.calibrate import kept
from tests.support.corrections import step_points
from tests.support.paths import REPO, load_script

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def replay():
    return load_script(REPO / "scripts" / "tools" / "replay_corrections.py", "script_replay_corrections")


def test_a_step_priced_unlike_the_others_is_predicted_by_its_own_compute_weight(tmp_path, replay, capsys):
    path = str(tmp_path / "corrections.json")
    kept.save(path, "machine", step_points("a", 4.5, 0, 20) + step_points("b", 1.2, 1, 8))
    assert replay.main([path]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| a") or line.startswith("| b")}
    pooled_b, own_b = (float(cell.split(",")[1].strip().rstrip("%")) for cell in rows["b"].split("|")[2:4])
    assert own_b < 5 < pooled_b, out  # b's own 1.2x, not a's 4.5x
    assert "own: median error within 10% on 2 of 2 steps" in out


def test_the_first_runs_are_replayed_round_by_round(tmp_path, replay):
    points = step_points("a", 4.5, 0, 11) + step_points("b", 1.2, 1, 11)
    path = str(tmp_path / "corrections.json")
    kept.save(path, "machine", points)
    table = replay.first_runs(replay._points(path, None), [[8, 3], [3, 8]])
    assert list(table) == ["a", "b"]
    assert table["a"]["own"] == table["a"]["pooled"]  # one step: the same fit
    # b's first round has none of its own points; its second (8 of its 11) is priced by its own weight
    assert table["b"]["own"][1] < 0.05 < table["b"]["pooled"][1]
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"a": {"learning": {"rounds": [{"measured": ["p"] * 8}]}}}))
    assert replay.main([path, "--runs", str(runs)]) == 2  # one run for two steps: refused, named


def test_bad_input_is_named(tmp_path, replay, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert replay.main([str(bad)]) == 2
    assert "KeyError" in capsys.readouterr().err

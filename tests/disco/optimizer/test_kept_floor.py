"""A run across processes reuses the compute floor kept for its step: its plans are priced at the
scale of the kept points (docs/results.md, "The second run on 2 processes x 1")."""

from __future__ import annotations

import pytest

import disco.optimizer as opt
from disco.calibrate import kept
from disco.optimizer._learn import Keeping
from disco.optimizer._pipeline import with_kept_floor
from tests.support.corrections import step_points

pytestmark = pytest.mark.fast


@pytest.fixture
def where(tmp_path):
    w = Keeping(str(tmp_path / "corrections.json"), "2 x cpu [processes]")
    kept.save(w.path, w.key, tuple(step_points("mlp", 1.2, 0, 3)), {"mlp": 7.95})
    return w


def test_a_process_runner_without_a_floor_takes_the_kept_one(where):
    runner = opt.ProcessRunner("mlp", "tiny", 2, 1)
    given, used = with_kept_floor(runner, where, "mlp")
    assert used and given.compute_floor_ms == 7.95
    assert given.describe() == runner.describe()  # the same machine key: the floor is not part of it


def test_a_floor_is_not_taken_where_there_is_none_or_the_runner_has_its_own(where, tmp_path):
    runner = opt.ProcessRunner("mlp", "tiny", 2, 1)
    assert with_kept_floor(runner, where, "moe") == (runner, False)  # another step: none kept
    assert with_kept_floor(runner, Keeping(None, where.key), "mlp") == (runner, False)  # nothing kept at all
    own = opt.ProcessRunner("mlp", "tiny", 2, 1, compute_floor_ms=5.0)
    assert with_kept_floor(own, where, "mlp") == (own, False)  # given by the caller: it stands
    unscaled = opt.ProcessRunner("mlp", "tiny", 2, 1, scale_compute=False)
    assert with_kept_floor(unscaled, where, "mlp") == (unscaled, False)  # it prices the cluster as given
    in_process = opt.InProcessRunner(scale_compute=False)
    assert with_kept_floor(in_process, where, "mlp") == (in_process, False)  # it scales to no floor


def test_the_learning_line_says_the_floor_was_kept_not_measured():
    import dataclasses

    from tests.support.optimize_results import built_result

    learning = {"learn": True, "kept_points_used": 11, "points": 22, "kept": True, "file": "c.json",
                "rounds": [{"round": 1, "measured": ["a", "b"], "kendall_tau": 0.5}]}
    base = dataclasses.replace(built_result(), learning=learning)
    kept_floor = dataclasses.replace(base, runner={"compute_floor": {"median_ms": 7.95, "kept": True}})
    measured = dataclasses.replace(base, runner={"compute_floor": {"median_ms": 7.95, "predicted_ms": 2.5}})
    assert "floor kept with it (7.950 ms), not measured again" in kept_floor.learning_note()
    assert "floor kept" not in measured.learning_note() and "floor kept" not in base.learning_note()
    assert "compute floor measured for this run (7.950 ms; the cost model priced 2.500 ms)" in measured.learning_note()
    assert "compute floor" not in base.learning_note()

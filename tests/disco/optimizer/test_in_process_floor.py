"""On CPU devices the in-process runner scales the simulator's compute to the step's compute floor
timed on them, as the process runner does across processes (docs/results.md, "The whole zoo in GSPMD
style": rnnlm's first round was priced at 3.6x its measured times without it)."""

from __future__ import annotations

import pytest

from disco import calibrate
from disco import optimizer as opt
from disco.calibrate import kept
from disco.optimizer._learn import Keeping
from disco.optimizer._pipeline import with_kept_floor
from tests.support.corrections import step_points


def _compute_ms(target):
    return calibrate.predicted_compute_s(target.graph, target.cluster, target.costs) * 1e3


def test_fit_prices_xla_default_s_compute_at_the_floor_it_timed(target):
    fitted, info = opt.InProcessRunner().fit(target, opt.OptimizeConfig(rounds=3, steps=2), opt.no_progress)
    floor = info["compute_floor"]
    assert floor["min_ms"] <= floor["median_ms"] <= floor["max_ms"] and floor["median_ms"] > 0
    assert floor["predicted_ms"] == pytest.approx(_compute_ms(target))  # before: the roofline's
    assert _compute_ms(fitted) == pytest.approx(floor["median_ms"], rel=1e-6)
    assert info["compute_speed"] == fitted.cluster.compute_speed != target.cluster.compute_speed
    assert fitted.graph is target.graph and fitted.step_fn is target.step_fn
    assert "compute scaled to the measured compute floor of this step" in fitted.cluster.description


def test_a_given_floor_is_used_without_timing_and_scale_compute_off_leaves_the_target(target, monkeypatch):
    from xla_hooks import bound

    def refuse(*args, **kwargs):
        raise AssertionError("a runner given its floor timed another")

    monkeypatch.setattr(bound, "compile_comm_free", refuse)
    fitted, info = opt.InProcessRunner(compute_floor_ms=12.5).fit(target, opt.OptimizeConfig(), opt.no_progress)
    assert _compute_ms(fitted) == pytest.approx(12.5) and info["compute_floor"]["median_ms"] == 12.5
    assert opt.InProcessRunner(scale_compute=False).fit(target, opt.OptimizeConfig(), opt.no_progress) == (target, {})


def test_a_floor_that_does_not_compile_leaves_the_cluster_as_given_and_says_why(target, monkeypatch):
    from xla_hooks import bound

    def broken(*args, **kwargs):
        raise RuntimeError("no copy for you")

    monkeypatch.setattr(bound, "compile_comm_free", broken)
    with pytest.warns(RuntimeWarning, match=r"compute floor was not timed \(RuntimeError: no copy for you\)"):
        fitted, info = opt.InProcessRunner().fit(target, opt.OptimizeConfig(), opt.no_progress)
    assert fitted is target and info == {"compute_floor": None, "compute_speed": target.cluster.compute_speed}


@pytest.mark.fast
def test_a_scaled_run_keeps_its_points_under_another_machine_key_and_reuses_its_kept_floor(tmp_path):
    scaled, unscaled = opt.InProcessRunner(), opt.InProcessRunner(scale_compute=False)
    assert scaled.describe() == {"runner": "in-process", "compute": "floor"}  # the tests run on CPU devices
    assert unscaled.describe() == {"runner": "in-process"}
    assert kept.machine_key("cpu", 8, scaled.describe(), "analytic", host="h") != \
        kept.machine_key("cpu", 8, unscaled.describe(), "analytic", host="h")
    where = Keeping(str(tmp_path / "corrections.json"), "8 x cpu [in-process, floor]")
    kept.save(where.path, where.key, tuple(step_points("mlp", 1.2, 0, 3)), {"mlp": 31.25})
    given, used = with_kept_floor(scaled, where, "mlp")
    assert used and given == opt.InProcessRunner(compute_floor_ms=31.25)
    assert with_kept_floor(unscaled, where, "mlp") == (unscaled, False)
    assert with_kept_floor(scaled, where, "moe") == (scaled, False)  # no floor kept for that step
    assert repr(given) == "InProcessRunner(compute_floor_ms=31.25)" and repr(scaled) == "InProcessRunner()"

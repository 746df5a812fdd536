"""The per-machine correction: a pure fit over explicit points, and the file that keeps it."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disco.calibrate import correction, kept
from disco.calibrate.correction import FEATURES, Point
from tests.support.corrections import step_points

pytestmark = pytest.mark.fast


def _machine(compute, exposed, comm, n):
    """A machine whose steps take 4.5 x compute + exposed + 0.8 ms per all-reduce (CPU devices: the
    roofline several times too fast, a fixed cost per all-reduce the simulator does not charge)."""
    return 4.5 * compute + exposed + 0.8e-3 * n


def _points(n, seed=0, graph="g"):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        c, e, k = 0.008 + rng.random() * 0.002, rng.random() * 0.004, rng.randint(1, 60)
        out.append(Point(graph, f"p{i}", (c, e, e + 0.001, k * 1e-3), _machine(c, e, e + 0.001, k)))
    return out


def test_without_points_it_predicts_the_simulators_step_time():
    c = correction.init()
    assert c.weights == correction.PRIOR and c.points == () and c.kept == 0
    assert c.predict((0.007, 0.002, 0.005, 0.003)) == pytest.approx(0.009)  # compute + exposed


def test_one_point_fixes_the_scale_and_keeps_the_ranking():
    p = _points(1)[0]
    c = correction.update(correction.init(), [p])
    assert c.predict(p.features) == pytest.approx(p.measured_s, rel=1e-6)
    assert c.weights[2] == pytest.approx(0) and c.weights[3] == pytest.approx(0)  # one point cannot tell them apart
    assert c.weights[1] == pytest.approx(1)  # the communication as simulated, the compute rescaled


def test_two_or_three_points_do_not_explode():
    for n in (2, 3):
        c = correction.update(correction.init(), _points(n))
        assert all(0 <= w < 20 for w in c.weights), c
        for p in _points(5, seed=1):  # other plans of the same machine: within a factor of 2
            assert 0.5 < c.predict(p.features) / p.measured_s < 2


def test_many_points_learn_the_machine_and_fix_the_ranking():
    c = correction.update(correction.init(), _points(30))
    assert c.weights[3] > 0.3  # it found the cost per all-reduce (0.8 ms; compute and it trade off in one graph)
    held_out = _points(10, seed=7)
    errors = [abs(c.predict(p.features) - p.measured_s) / p.measured_s for p in held_out]
    assert max(errors) < 0.10
    from scipy.stats import kendalltau

    tau = kendalltau([c.predict(p.features) for p in held_out], [p.measured_s for p in held_out]).statistic
    sim = kendalltau([p.features[0] + p.features[1] for p in held_out], [p.measured_s for p in held_out]).statistic
    assert tau > 0.9 > sim


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**16))
def test_for_one_graph_its_own_compute_weight_is_the_shared_one(n, seed):
    points = _points(n, seed)
    assert correction.fit(points, graph="g") == correction.fit(points)
    assert correction.init(points, "g").weights == correction.init(points).weights


def test_a_steps_compute_weight_is_its_own_and_the_machines_collectives_are_shared():
    """Another step's many points teach the cost per all-reduce; they do not carry that step's
    compute residual (4.5x) to a step the cost model prices better (1.2x) once it has points of its own."""
    mlp, transformer = step_points("mlp", 4.5, 0, 30), step_points("transformer", 1.2, 1, 6)
    own = correction.init(mlp + transformer[:3], graph="transformer")
    shared = correction.init(mlp + transformer[:3])
    assert own.graph == "transformer" and own.weights[0] == pytest.approx(1.2, rel=0.15), own
    assert own.weights[3] > 0.3  # the cost per all-reduce, learned mostly from mlp's points
    assert shared.weights[0] > 2.5, shared  # one compute weight for both: mostly mlp's
    for p in transformer[3:]:
        assert abs(own.predict(p.features) - p.measured_s) / p.measured_s < 0.05
        assert abs(shared.predict(p.features) - p.measured_s) / p.measured_s > 0.2
    # the graph it prices stays through updates and through leaving a point out
    later = correction.update(own, transformer[3:5])
    assert later.graph == "transformer" and later.kept == len(mlp) + 3
    p = transformer[4]
    assert later.predict(p.features, exclude=p.key) == pytest.approx(
        correction.init(mlp + transformer[:4], "transformer").predict(p.features), rel=1e-9)


def test_a_step_without_points_starts_from_the_other_steps_median_compute_scale():
    """One vote per step: the new step's prior is the median of the other steps' scales, whatever
    their numbers of points."""
    import statistics

    steps = {"a": step_points("a", 2.0, 0, 20), "b": step_points("b", 3.0, 1, 2), "c": step_points("c", 5.0, 2, 2)}
    scale = {g: statistics.median((p.measured_s - p.features[1]) / p.features[0] for p in ps)
             for g, ps in steps.items()}  # each step's own: its compute scale plus its all-reduces' share
    c = correction.init([p for ps in steps.values() for p in ps], graph="new")
    assert c.weights[0] == pytest.approx(scale["b"], rel=1e-6), (c, scale)  # no points of its own: the prior
    assert 3.0 < scale["b"] < 4.0  # b's 3x, not a's 2x, which has most of the points


def test_weights_stay_non_negative():
    # more all-reduces measured *faster*: the fit holds that weight at 0 instead of going negative
    pts = [Point("g", f"p{k}", (0.01, 0.0, 0.0, k * 1e-3), 0.05 - k * 1e-3) for k in range(1, 8)]
    c = correction.update(correction.init(), pts)
    assert min(c.weights) >= 0 and c.weights[3] == 0


def test_a_plans_own_point_is_left_out_of_its_prediction_when_asked():
    pts = _points(6)
    odd = pts[0]._replace(measured_s=pts[0].measured_s * 3)  # an outlier
    c = correction.update(correction.init(), [odd, *pts[1:]])
    without = correction.update(correction.init(), pts[1:])
    assert c.predict(odd.features, exclude=odd.key) == pytest.approx(without.predict(odd.features))
    assert c.predict(odd.features) != pytest.approx(without.predict(odd.features))
    assert c.predict(odd.features, exclude=("g", "other")) == c.predict(odd.features)


def test_a_batch_is_predicted_without_any_of_its_own_points():
    pts = _points(8)
    c = correction.init(pts[:3])
    c = correction.update(c, pts[3:])
    batch = c.without([pts[1].key, pts[5].key, ("g", "not held")])
    rest = [p for i, p in enumerate(pts) if i not in (1, 5)]
    assert batch.points == tuple(rest) and batch.kept == 2 and batch.graph == c.graph
    assert batch.weights == correction.fit(rest)
    assert c.without([("g", "not held")]) is c


def test_a_newer_measurement_replaces_the_older_and_kept_points_are_counted():
    pts = _points(4)
    c = correction.init(pts)
    assert c.kept == 4 and len(c.points) == 4
    c2 = correction.update(c, [pts[0]._replace(measured_s=1.0), *_points(2, graph="h")])
    assert len(c2.points) == 6 and c2.kept == 3
    assert [p.measured_s for p in c2.points if p.key == pts[0].key] == [1.0]
    assert c.points == tuple(pts)  # the state is immutable


@pytest.mark.parametrize("bad, match", [
    (Point("g", "p", (0.1, 0.2), 0.1), "expected 4 features"),
    (Point("g", "p", (0.1, -1, 0, 0), 0.1), "finite features >= 0"),
    (Point("g", "p", (0.1, 0, 0, 0), 0.0), "measured time > 0 s, got 0.0"),
])
def test_bad_points_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        correction.update(correction.init(), [bad])


def test_the_file_round_trips_per_machine(tmp_path):
    path = str(tmp_path / "sub" / "corrections.json")
    pts = tuple(_points(3))
    a = kept.machine_key("cpu", 8, {"runner": "in-process"}, "analytic", host="h")
    b = kept.machine_key("cpu", 8, {"runner": "processes", "processes": 2}, "analytic", host="h")
    assert a != b and "8 x cpu on h" in a
    assert kept.load(path, a) == ()
    kept.save(path, a, pts)
    kept.save(path, b, pts[:1])
    assert kept.load(path, a) == pts and kept.load(path, b) == pts[:1]
    data = json.loads((tmp_path / "sub" / "corrections.json").read_text())
    assert data["format"] == kept.FORMAT and data["version"] == kept.VERSION and set(data["machines"]) == {a, b}


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": "other"}),
                                  json.dumps({"format": kept.FORMAT, "version": 99, "features": list(FEATURES),
                                              "machines": {}}),
                                  json.dumps({"format": kept.FORMAT, "version": kept.VERSION,
                                              "features": list(FEATURES), "machines": {"k": {"points": [[1]]}}})])
def test_an_unreadable_file_is_moved_aside_with_a_warning_never_lost(tmp_path, text):
    path = tmp_path / "corrections.json"
    path.write_text(text)
    with pytest.warns(kept.KeptCorrectionWarning, match="moved to .*unreadable-"):
        assert kept.load(str(path), "k") == ()
    (aside,) = tmp_path.glob("corrections.json.unreadable-*")
    assert aside.read_text() == text and not path.exists()
    kept.save(str(path), "k", tuple(_points(1)))  # and the run starts a fresh file
    assert len(kept.load(str(path), "k")) == 1


def test_the_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(kept.ENV, str(tmp_path / "x.json"))
    assert kept.default_path() == str(tmp_path / "x.json")
    monkeypatch.delenv(kept.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kept.default_path() == str(tmp_path / "disco" / "corrections.json")


def test_saving_merges_what_another_run_kept_meanwhile(tmp_path):
    """Two runs load the same kept points, each measures its own plans and keeps: the file ends with
    both runs' points, and for a plan both measured, the later save's measurement."""
    path = str(tmp_path / "c.json")
    old = tuple(_points(2))
    kept.save(path, "k", old)
    first = old + (correction.Point("g", "p_a", old[0].features, 1.0),)
    second = (old[0], correction.Point(old[1].graph, old[1].plan, old[1].features, 9.0),
              correction.Point("g", "p_b", old[0].features, 2.0))
    kept.save(path, "k", first)
    kept.save(path, "k", second)  # the second run never saw p_a, and re-measured old[1]
    got = kept.load(path, "k")
    assert {(p.plan, p.measured_s) for p in got} == {(old[0].plan, old[0].measured_s), (old[1].plan, 9.0),
                                                     ("p_a", 1.0), ("p_b", 2.0)}
    assert len(got) == 4 and got[-1].plan == "p_b"  # this run's points last: the newest are kept
    many = tuple(correction.Point("g", f"q{i}", old[0].features, 1.0) for i in range(correction.MAX_POINTS))
    assert kept.merged(got, many) == many  # at most MAX_POINTS, the newest


def test_a_machine_entry_damaged_before_saving_is_moved_aside(tmp_path):
    path = tmp_path / "c.json"
    kept.save(str(path), "k", tuple(_points(1)))
    data = json.loads(path.read_text())
    data["machines"]["k"]["points"] = [["only", "three", "fields"]]
    path.write_text(json.dumps(data))
    with pytest.warns(kept.KeptCorrectionWarning, match="machine 'k'.*moved to .*unreadable-"):
        kept.save(str(path), "k", tuple(_points(2)))
    assert len(kept.load(str(path), "k")) == 2 and len(list(tmp_path.glob("c.json.unreadable-*"))) == 1



def test_each_steps_floor_is_kept_beside_its_points(tmp_path):
    """The compute floor a run scaled the simulator to is kept per step, so the next run prices its
    plans at the scale of the points it reads; other steps' and other machines' floors stay."""
    path = str(tmp_path / "corrections.json")
    a = kept.machine_key("cpu", 2, {"runner": "processes", "processes": 2}, "analytic", host="h")
    b = kept.machine_key("cpu", 8, {"runner": "in-process"}, "analytic", host="h")
    assert kept.floor(path, a, "mlp") is None  # no file
    kept.save(path, a, tuple(step_points("mlp", 1.2, 0, 3)), {"mlp": 7.95})
    kept.save(path, b, tuple(step_points("mlp", 2.0, 1, 2)))
    kept.save(path, a, tuple(step_points("moe", 1.1, 2, 3)), {"moe": 90.9})
    assert kept.floor(path, a, "mlp") == 7.95 and kept.floor(path, a, "moe") == 90.9
    assert kept.floor(path, b, "mlp") is None and kept.floor(path, a, "vit") is None
    assert len(kept.load(path, a)) == 6  # the points are kept as before
    kept.save(path, a, (), {"mlp": 8.5})  # a step measured again: its newer floor
    assert kept.floor(path, a, "mlp") == 8.5


@pytest.mark.parametrize("value", [-1.0, 0, "7 ms", True])
def test_a_damaged_floor_is_named_and_not_used(tmp_path, value):
    path = tmp_path / "corrections.json"
    kept.save(str(path), "m", tuple(step_points("mlp", 1.2, 0, 2)), {"mlp": 7.0})
    data = json.loads(path.read_text())
    data["machines"]["m"]["floors"]["mlp"] = value
    path.write_text(json.dumps(data))
    with pytest.warns(kept.KeptCorrectionWarning, match="the floor of mlp is .*expected a positive number of ms"):
        assert kept.floor(str(path), "m", "mlp") is None
    assert len(kept.load(str(path), "m")) == 2  # the points are still read: nothing is lost

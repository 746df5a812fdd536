"""Calibration across real processes (over 127.0.0.1): the chained fit, the compute floor in the
spec, and the simulator's baselines against measurements."""

from __future__ import annotations

import dataclasses
import math

import pytest

from disco import calibrate
from disco.sim.cluster import ClusterSpec, LinkSpec


def _spec(**kw) -> ClusterSpec:
    link = LinkSpec(1e9 / 8, 1e-3)
    return ClusterSpec(name="test-2x1", nodes=2, devices_per_node=1, intra=link, inter=link, algorithm="ring",
                       operand_latency=1e-3, overlap=False, **kw)


@pytest.fixture(scope="module")
def mlp_graph():
    import trax_models

    from disco.ir import extractor
    from disco.ir.graph import HloGraph

    step, example = trax_models.make_train_step("mlp", "tiny", devices=2)
    return HloGraph.from_hlo_text(extractor.hlo_text(step, *example))


@pytest.mark.fast
@pytest.mark.parametrize("kw, match", [
    ({"reps": 0}, r"reps: expected an integer >= 1, got 0"),
    ({"sizes": (1024, 1024), "chain": ()}, r"sizes: expected at least 2 distinct byte counts to fit, got \(1024, 1024\)"),
])
def test_calibrate_refuses_bad_arguments_before_launching(kw, match, monkeypatch):
    """Before any worker starts (both were found after the launch: reps=0 as the workers' failure,
    one size by the fit)."""
    from disco.runtime import multiprocess

    def launched(*a, **k):
        raise AssertionError("launched before the arguments were checked")

    monkeypatch.setattr(multiprocess, "launch", launched)
    with pytest.raises(ValueError, match=match):
        calibrate.calibrate(calibrate.ProcessRunner(2, 1, None, timeout_s=60), **kw)


@pytest.mark.fast
def test_too_few_devices_in_all_are_refused_with_the_runners_shape():
    with pytest.raises(ValueError, match=r"at least 2 devices in all, got 1 processes x 1 devices"):
        calibrate.calibrate(calibrate.ProcessRunner(1, 1))


@pytest.mark.fast
def test_fit_chained_recovers_the_per_all_reduce_cost_apart_from_the_call_overhead():
    sizes, chain = (1 << 10, 1 << 16, 1 << 20), (1, 2, 4, 8)
    call, a, b = 2e-3, 13e-3, 8e-9  # 13 ms per chained all-reduce, 125 MB/s, 2 ms per call
    grid = [[call + k * (a + b * n) for k in chain] for n in sizes]
    f = calibrate.fit_chained(2, sizes, chain, grid)
    assert f.call_s == pytest.approx(call, rel=1e-6)
    assert (f.fit_a, f.fit_b) == (pytest.approx(a, rel=1e-6), pytest.approx(b, rel=1e-6))
    assert f.latency == pytest.approx(a / 2) and f.bandwidth == pytest.approx(1 / b)  # p = 2: ring terms
    assert f.floored == ()
    # times that fall as the chain grows: no per-all-reduce cost to fit, and the fit says so
    falling = calibrate.fit_chained(2, sizes, chain, [[call / k for k in chain] for _ in sizes])
    assert "fit_a" in falling.floored and falling.fit_a == calibrate.MIN_FIT_A
    # a lone all-reduce per call (k = 1) would put the call overhead into the latency
    lone = calibrate.fit(2, sizes, [row[0] for row in grid])
    assert lone.fit_a == pytest.approx(call + a, rel=1e-3)
    with pytest.raises(ValueError, match=r"at least 2 chain lengths and 2 sizes, got chain \(1,\)"):
        calibrate.fit_chained(2, sizes, (1,), [[1.0] for _ in sizes])
    with pytest.raises(ValueError, match=r"expected 3 rows \(sizes\) of 4 \(chain lengths\), got \[4, 4\]"):
        calibrate.fit_chained(2, sizes, chain, grid[:2])


def _floors_recorded(fit: dict) -> bool:
    """Every fitted term either measured above its floor or set to it and named in ``floored``.

    Which it is depends on the machine's noise (a 3-repetition fit on loopback under load can
    floor either term); the fit's arithmetic is checked on synthetic times above."""
    return all((fit[name] == lo) == (name in fit["floored"])
               for name, lo in (("fit_a", calibrate.MIN_FIT_A), ("fit_b", calibrate.MIN_FIT_B)))


def test_the_chained_calibration_across_two_processes_feeds_the_spec():
    cal = calibrate.calibrate(calibrate.ProcessRunner(2, 1, None, timeout_s=400), sizes=(1 << 10, 1 << 16, 1 << 20),
                              chain=(1, 2, 4), reps=3)
    ch = cal.chained
    assert ch is not None and ch.chain == (1, 2, 4) and len(ch.medians_s) == 3
    assert all(t > 0 for row in ch.medians_s for t in row)
    assert _floors_recorded(ch.to_dict()) and ch.call_s >= 0, ch
    c = cal.calibration
    # the spec's link is the chained fit; the lone fit (k = 1 column) is kept beside it
    assert (c.latency, c.bandwidth) == (ch.latency, ch.bandwidth)
    assert cal.lone is not None and cal.lone.medians_s == tuple(row[0] for row in ch.medians_s)
    assert c.variadic_s > 0 and c.floored == ch.floored
    spec = calibrate.cluster_spec(cal)
    assert (spec.inter.latency, spec.inter.bandwidth) == (ch.latency, ch.bandwidth)
    assert "chained 1/2/4 per call" in spec.description
    d = cal.to_dict()
    assert d["fit"] == "chained" and d["chained"]["chain"] == (1, 2, 4)


def test_with_compute_floor_scales_the_compute_to_the_floor(mlp_graph):
    from disco.sim.costs import AnalyticCosts

    spec = _spec()
    pred = calibrate.predicted_compute_s(mlp_graph, spec, AnalyticCosts())
    scaled = calibrate.with_compute_floor(spec, mlp_graph, 4 * pred, AnalyticCosts(), what="mlp/tiny")
    assert scaled.compute_speed == pytest.approx(0.25)
    assert calibrate.predicted_compute_s(mlp_graph, scaled, AnalyticCosts()) == pytest.approx(4 * pred, rel=1e-6)
    assert (scaled.intra, scaled.inter, scaled.operand_latency) == (spec.intra, spec.inter, spec.operand_latency)
    assert "compute floor of mlp/tiny" in scaled.description
    # a spec that already had a speed: the floor decides, not the product of the two
    again = calibrate.with_compute_floor(dataclasses.replace(spec, compute_speed=3.0), mlp_graph, 4 * pred,
                                            AnalyticCosts())
    assert again.compute_speed == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"floor_s: expected a positive number of seconds, got 0"):
        calibrate.with_compute_floor(spec, mlp_graph, 0, AnalyticCosts())


@pytest.mark.slow
def test_compare_baselines_predicts_on_the_spec_scaled_to_the_measured_floor():
    spec = _spec()
    out = calibrate.compare_baselines(spec, 2, 1, None, model="mlp", preset="tiny",
                                         plans=("xla_default", "one_bucket"), rounds=3, steps=1,
                                         chain=(1, 2), chain_sizes=(1 << 10, 1 << 16), chain_reps=3, timeout_s=600)
    rows = {r["plan"]: r for r in out["rows"]}
    assert list(rows) == ["xla_default", "one_bucket"]  # the floor is not a baseline row
    floor = out["compute_floor"]
    assert floor["predicted_ms"] > 0
    scale = floor["measured_ms"] / floor["predicted_ms"]
    assert out["compute_speed"] == pytest.approx(1 / scale)
    assert out["cluster_spec"]["compute_speed"] == pytest.approx(out["compute_speed"])
    for r in rows.values():
        assert 0 < r["predicted_compute_ms"] < r["predicted_ms_unscaled"]
        # one stream (overlap off): the compute is scaled to the floor, the communication stays
        assert r["predicted_ms"] == pytest.approx(
            r["predicted_ms_unscaled"] - r["predicted_compute_ms"] + r["predicted_compute_ms"] * scale, rel=1e-6)
        for key in ("", "_unscaled", "_same_launch"):
            assert r[f"error{key}"] == pytest.approx(r[f"predicted_ms{key}"] / r["measured_ms"] - 1)
    # the headline numbers are the scaled spec's
    assert out["mean_abs_error"] == pytest.approx(sum(abs(r["error"]) for r in rows.values()) / 2)
    same = out["same_launch_fit"]
    assert _floors_recorded(same) and same["chain"] == (1, 2)
    # XLA's combined all-reduce: one variadic all-reduce over 1 ms of operand latency per extra operand
    assert rows["xla_default"]["predicted_ms"] > rows["one_bucket"]["predicted_ms"] + 1.0
    assert out["link"] == "loopback" and out["fingerprints_match"]
    for key in ("", "_unscaled", "_same_launch"):
        assert math.isfinite(out[f"mean_abs_error{key}"]) and math.isfinite(out[f"tau{key}"])

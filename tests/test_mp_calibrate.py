"""The simulator's baselines against measurements across real processes (over 127.0.0.1)."""

from __future__ import annotations

import pytest

from disco import mp_calibrate
from disco.sim.cluster import ClusterSpec, LinkSpec


def test_compare_baselines_splits_the_error_into_the_compute_floor_and_communication():
    link = LinkSpec(1e9 / 8, 1e-3)
    spec = ClusterSpec(name="test-2x1", nodes=2, devices_per_node=1, intra=link, inter=link, algorithm="ring",
                       operand_latency=1e-3, overlap=False)
    out = mp_calibrate.compare_baselines(spec, 2, 1, None, model="mlp", preset="tiny",
                                         plans=("xla_default", "one_bucket"), rounds=3, steps=1, timeout_s=600)
    rows = {r["plan"]: r for r in out["rows"]}
    assert list(rows) == ["xla_default", "one_bucket"]  # the floor is not a baseline row
    floor = out["compute_floor"]
    assert floor["measured_ms"] > 0 and floor["predicted_ms"] > 0
    for r in rows.values():
        assert 0 < r["predicted_compute_ms"] < r["predicted_ms"]
        assert r["error"] == pytest.approx(r["predicted_ms"] / r["measured_ms"] - 1)
        # one stream (overlap off): the compute (xla_default's predicted compute scaled to the
        # measured floor) changes, the communication stays as it was
        scale = floor["measured_ms"] / floor["predicted_ms"]
        assert r["predicted_ms_floor_scaled"] == pytest.approx(
            r["predicted_ms"] - r["predicted_compute_ms"] + r["predicted_compute_ms"] * scale, rel=1e-6)
        assert r["error_floor_scaled"] == pytest.approx(r["predicted_ms_floor_scaled"] / r["measured_ms"] - 1)
    # XLA's combined all-reduce: one variadic all-reduce over 1 ms of operand latency per extra operand
    assert rows["xla_default"]["predicted_ms"] > rows["one_bucket"]["predicted_ms"] + 1.0
    assert out["link"] == "loopback" and out["fingerprints_match"]
    assert 0 <= out["mean_abs_error_floor_scaled"] and -1 <= out["tau_floor_scaled"] <= 1

import pytest

from disco import calibrate, cluster, collectives


def test_fit_recovers_ring_parameters():
    spec = cluster.preset("local", devices=4, calibration={"latency": 30e-6, "bandwidth": 2e9})
    sizes = [1 << k for k in range(10, 24, 2)]
    times = [collectives.allreduce_time(s, spec) for s in sizes]
    c = calibrate.fit(4, sizes, times)
    assert c.latency == pytest.approx(30e-6, rel=1e-6)
    assert c.bandwidth == pytest.approx(2e9, rel=1e-6)


def test_fit_needs_two_devices():
    with pytest.raises(ValueError, match="at least 2 devices, got 1"):
        calibrate.fit(1, [1, 2], [1.0, 2.0])

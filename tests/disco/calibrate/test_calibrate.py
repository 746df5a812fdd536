import dataclasses

import pytest

from disco import calibrate
from disco.sim import cluster
from disco.sim import collectives


@pytest.mark.fast
def test_fit_recovers_ring_parameters():
    spec = cluster.preset("local", devices=4, calibration={"latency": 30e-6, "bandwidth": 2e9})
    sizes = [1 << k for k in range(10, 24, 2)]
    times = [collectives.allreduce_time(s, spec) for s in sizes]
    c = calibrate.fit(4, sizes, times)
    assert c.latency == pytest.approx(30e-6, rel=1e-6)
    assert c.bandwidth == pytest.approx(2e9, rel=1e-6)
    assert c.floored == () and calibrate.floored_note(c.floored) is None


@pytest.mark.fast
def test_a_fit_that_measured_no_cost_is_floored_and_says_so():
    """Times that fall with the size have no per-byte cost to fit: the slope is set to its floor
    (the spec stays usable) and the result names it, as does the note the CLI prints."""
    c = calibrate.fit(2, [1 << 10, 1 << 20], [2e-3, 1e-3])
    assert c.floored == ("fit_b",) and c.fit_b == calibrate.MIN_FIT_B and c.fit_a > calibrate.MIN_FIT_A
    assert c.to_dict()["floored"] == ("fit_b",)
    note = calibrate.floored_note(c.floored)
    assert note.startswith("note: the per-byte time (slope) fitted at or below zero") and "--reps" in note
    both = calibrate.floor_fit(-1e-3, float("nan"))
    assert both == (calibrate.MIN_FIT_A, calibrate.MIN_FIT_B, ("fit_a", "fit_b"))


@pytest.mark.fast
def test_fit_needs_two_devices():
    with pytest.raises(ValueError, match="at least 2 devices, got 1"):
        calibrate.fit(1, [1, 2], [1.0, 2.0])


@pytest.mark.fast
@pytest.mark.parametrize("sizes, times, match", [
    ([1024], [1e-3], r"at least 2 distinct sizes, got sizes \(1024,\)"),
    ([1024, 1024], [1e-3, 2e-3], r"at least 2 distinct sizes, got sizes \(1024, 1024\)"),
    ([1024, 2048, 4096], [1e-3, 2e-3], r"times: expected one per size \(3\), got 2"),
    ([1024, 2048], [0.0, 1e-3], r"times: expected positive seconds, got \(0.0, 0.001\)"),
])
def test_fit_refuses_what_it_cannot_fit(sizes, times, match):
    """One size has no slope to fit: the fit was a poorly conditioned guess reported as a measurement
    (nothing floored); a zero time divided by zero in the weights; a missing time was numpy's TypeError."""
    with pytest.raises(ValueError, match=match):
        calibrate.fit(2, sizes, times)


def test_variadic_all_reduce_is_measured_next_to_its_concatenation():
    from disco.runtime.allreduce_timing import measure_variadic

    variadic_s, concat_s = measure_variadic(4, operands=4, nbytes=1 << 12, reps=3)
    assert variadic_s > 0 and concat_s > 0


@pytest.mark.fast
def test_calibration_feeds_the_operand_latency_into_the_local_preset():
    c = calibrate.fit(8, [1 << 10, 1 << 20], [2e-4, 1e-3])
    c = dataclasses.replace(c, operand_latency=2e-4)
    spec = cluster.preset("local", devices=8, calibration=c.as_preset_calibration())
    assert spec.operand_latency == 2e-4 and spec.label == "calibrated on this machine"


@pytest.mark.fast
@pytest.mark.parametrize("kw, match", [
    ({"devices": 1}, r"at least 2 devices, got 1"),
    ({"sizes": (1024,)}, r"sizes: expected at least 2 distinct byte counts to fit, got \(1024,\)"),
    ({"reps": 0}, r"reps: expected an integer >= 1, got 0"),
])
def test_calibrate_refuses_bad_arguments_before_measuring(kw, match, monkeypatch):
    """Before any all-reduce is timed (reps=0 ended in statistics' "no median for empty data"; one
    device or one size was refused by the fit, after every size was measured)."""
    def measured(*a, **k):
        raise AssertionError("measured before the arguments were checked")

    monkeypatch.setattr(calibrate.InProcessRunner, "time", measured)
    kw = {"devices": 2, "sizes": (1 << 10, 1 << 12), "reps": 1, **kw}
    with pytest.raises(ValueError, match=match):
        calibrate.calibrate(calibrate.InProcessRunner(kw.pop("devices")), **kw)


def test_the_rs_ag_pair_is_measured_next_to_its_all_reduce():
    from disco.runtime.allreduce_timing import measure_rs_ag

    all_reduce_s, rs_ag_s = measure_rs_ag(4, nbytes=1 << 12, reps=3)
    assert all_reduce_s > 0 and rs_ag_s > 0


class _Timed:
    """A calibration runner that returns fixed timings (nothing is measured)."""

    devices, sizes, reps, chain = 8, (1 << 10, 1 << 20), 1, ()

    def __init__(self, timings):
        self.timings = timings

    def check_devices(self):
        pass

    def time(self, sizes, reps, chain):
        return self.timings

    def result(self, calibration, chained, lone, timed):
        return calibration


@pytest.mark.fast
def test_the_rs_ag_scale_is_the_pair_over_its_all_reduce_and_reaches_the_spec():
    from disco.calibrate._runners import timings

    worker = {"sizes": [1 << 10, 1 << 20], "medians_s": [2e-4, 1e-3], "variadic_s": 3e-3, "concat_s": 1e-3,
              "operands": 32}
    slow = {**worker, "rs_ag_all_reduce_s": 4e-3, "rs_ag_s": 6e-3}
    # the slowest worker's per cell: 4 ms and 6 ms, not one worker's ratio
    t = timings(8, [{**worker, "rs_ag_all_reduce_s": 2e-3, "rs_ag_s": 6.5e-3}, slow])
    assert (t.rs_ag_all_reduce_s, t.rs_ag_s) == (4e-3, 6.5e-3)
    c = calibrate.calibrate(_Timed(t))
    assert c.rs_ag_scale == pytest.approx(6.5 / 4) and c.rs_ag_s == 6.5e-3
    spec = cluster.preset("local", devices=8, calibration=c.as_preset_calibration())
    assert spec.rs_ag_scale == pytest.approx(6.5 / 4)
    # workers of an older disco time no pair: rs_ag buckets are priced as the links price them
    old = calibrate.calibrate(_Timed(timings(8, [worker])))
    assert old.rs_ag_scale == 1.0 and old.rs_ag_s is None

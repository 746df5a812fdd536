"""Data parallelism across real processes joined with jax.distributed over 127.0.0.1."""

from __future__ import annotations

import pytest

from disco.runtime import multiprocess
from tests.support.mp_checks import assert_same_plans_and_xla_defaults_numbers
from tests.support.paths import REPO


def test_two_processes_apply_the_same_plan_and_match_xla_default():
    spec = multiprocess.WorkerSpec(model="mlp", preset="tiny", plans=("xla_default", "one_bucket", "ddp"),
                                   rounds=1, steps=1, optimizer="sgd", check_steps=3)
    res = multiprocess.launch(2, 2, spec, timeout_s=400)
    try:
        assert_same_plans_and_xla_defaults_numbers(res, ("one_bucket", "ddp"), devices=4, local=2)
        a, b = res.results
        # the replicated parameters are the same on both processes
        assert a["checks"]["one_bucket"]["digest"] == b["checks"]["one_bucket"]["digest"]
    finally:
        assert multiprocess.stray_processes(res.pids) == []


def test_failed_workers_are_reported_and_killed():
    spec = multiprocess.WorkerSpec(model="nosuch", preset="tiny", plans=("xla_default",), rounds=1, steps=1)
    res = multiprocess.launch(2, 1, spec, timeout_s=120)
    assert not res.ok
    assert any("unknown model 'nosuch'" in f for f in res.failures), res.failures
    assert multiprocess.stray_processes(res.pids) == []


def test_hung_workers_are_killed_after_the_timeout():
    # a worker still busy at the deadline is killed with its whole process group
    spec = multiprocess.WorkerSpec(model="mlp", preset="tiny", plans=("xla_default",), rounds=1, steps=1)
    res = multiprocess.launch(1, 1, spec, timeout_s=0.5)
    assert not res.ok and "killed" in res.failures[0]
    assert multiprocess.stray_processes(res.pids) == []


@pytest.mark.fast
def test_combine_takes_the_slowest_process_per_round_and_pairs_by_round():
    def row(plan, samples):
        return {"plan": plan, "samples_ms": samples, "all_reduces": 1, "applied": True, "plan_digest": plan}

    res = multiprocess.LaunchResult(2, 1, (
        {"results": [row("xla_default", [10.0, 20.0, 10.0]), row("one_bucket", [5.0, 10.0, 12.0])]},
        {"results": [row("xla_default", [11.0, 19.0, 10.0]), row("one_bucket", [6.0, 9.0, 20.0])]},
    ), (), (1, 2))
    rows = {r["plan"]: r for r in multiprocess.combine(res)}
    assert rows["xla_default"]["samples_ms"] == [11.0, 20.0, 10.0]
    assert rows["one_bucket"]["samples_ms"] == [6.0, 10.0, 20.0]
    assert rows["one_bucket"]["median_ms"] == 10.0
    # per round 11/6, 20/10, 10/20 -> median 1.833
    assert rows["one_bucket"]["paired_speedup"] == pytest.approx(11 / 6, rel=1e-12)
    lo, hi = rows["one_bucket"]["paired_interval"]  # resampled among the per-round ratios 0.5, 1.833, 2.0
    assert 0.5 <= lo <= 11 / 6 <= hi <= 2.0
    assert rows["xla_default"]["paired_interval"] == [1.0, 1.0]
    assert res.link_info() == {"link": "loopback"}


@pytest.mark.fast
def test_worker_spec_rejects_an_unknown_task():
    import pytest

    with pytest.raises(ValueError, match=r"WorkerSpec.task: expected one of bench, calibrate, jit, got 'train'"):
        multiprocess.WorkerSpec(task="train")


def test_calibration_across_two_processes_fits_a_cluster_spec():
    from disco import calibrate

    cal = calibrate.calibrate(calibrate.ProcessRunner(2, 1, None, timeout_s=400), sizes=(1 << 10, 1 << 16, 1 << 20),
                              reps=3)
    c = cal.calibration
    assert c.devices == 2 and len(c.medians_s) == 3 and all(t > 0 for t in c.medians_s)
    assert c.variadic_s > 0 and c.concat_s > 0
    assert (c.fit_b == calibrate.MIN_FIT_B) == ("fit_b" in c.floored)  # a floor is named as one
    spec = calibrate.cluster_spec(cal)
    assert (spec.nodes, spec.devices_per_node, spec.algorithm, spec.overlap) == (2, 1, "ring", False)
    assert spec.inter.bandwidth == c.bandwidth and spec.operand_latency == c.operand_latency
    # the reduce-scatter plus all-gather pair timed beside its all-reduce in every worker
    assert c.rs_ag_s > 0 and c.rs_ag_scale == pytest.approx(c.rs_ag_s / c.rs_ag_all_reduce_s)
    assert spec.rs_ag_scale == c.rs_ag_scale and cal.to_dict()["rs_ag_scale"] == c.rs_ag_scale
    assert "127.0.0.1" in spec.label
    assert cal.to_dict()["link"] == "loopback"


def test_an_interrupted_launch_leaves_no_worker_and_no_directory(tmp_path, monkeypatch):
    """A Ctrl-C (here: an error while the workers run) killed the workers but left the launch's
    directory of worker logs in the temp dir, one per interrupted run."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    started = []

    def interrupt(pids):
        started.extend(pids)
        raise KeyboardInterrupt

    spec = multiprocess.WorkerSpec(model="mlp", preset="tiny", plans=("xla_default",), rounds=1, steps=1)
    with pytest.raises(KeyboardInterrupt):
        multiprocess.launch(2, 1, spec, timeout_s=120, on_started=interrupt)
    assert len(started) == 2 and not multiprocess.stray_processes(started)
    assert not list(tmp_path.glob("disco-mp-*"))


def test_a_terminated_launch_leaves_no_worker_and_no_directory(tmp_path):
    """SIGTERM (or SIGHUP) to the launcher over 127.0.0.1: the workers run in sessions of their own,
    and the launcher died at once, leaving them running (and their directory of logs)."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    root = str(REPO)
    code = textwrap.dedent("""
        import os, signal
        from disco.runtime import multiprocess

        def terminate(pids):
            print(*pids, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)

        spec = multiprocess.WorkerSpec(model="mlp", preset="tiny", plans=("xla_default",), rounds=100, steps=3)
        multiprocess.launch(2, 1, spec, timeout_s=300, on_started=terminate)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120,
                       env={**os.environ, "PYTHONPATH": root, "TMPDIR": str(tmp_path)})
    pids = [int(p) for p in r.stdout.split()]
    try:
        assert len(pids) == 2, r.stderr
        assert r.returncode == 128 + signal.SIGTERM, r.stderr
        assert multiprocess.stray_processes(pids) == []
        assert not list(tmp_path.glob("disco-mp-*"))
    finally:
        for pid in multiprocess.stray_processes(pids):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.fast
def test_a_pmap_step_on_several_processes_is_refused_before_any_worker_starts():
    spec = multiprocess.WorkerSpec(style="pmap")
    with pytest.raises(ValueError, match=r"style 'pmap' runs on one process only.*--processes 1"):
        multiprocess.launch(2, 1, spec)
    with pytest.raises(ValueError, match=r"WorkerSpec.style: expected one of shard_map, pmap, gspmd, fsdp, got 'vmap'"):
        multiprocess.WorkerSpec(style="vmap")

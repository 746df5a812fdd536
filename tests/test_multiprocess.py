"""Data parallelism across real processes joined with jax.distributed over 127.0.0.1."""

from __future__ import annotations

import numpy as np

from disco import multiprocess


def test_two_processes_apply_the_same_plan_and_match_xla_default():
    spec = multiprocess.WorkerSpec(model="mlp", preset="tiny", plans=("xla_default", "one_bucket", "ddp"),
                                   rounds=1, steps=1, optimizer="sgd", check_steps=3)
    res = multiprocess.launch(2, 2, spec, timeout_s=400)
    try:
        assert res.ok, res.failures
        a, b = res.results
        assert a["global_devices"] == 4 and a["local_devices"] == 2
        # both processes saw the same program and applied the identical plans
        assert a["fingerprint"] == b["fingerprint"]
        for ra, rb in zip(a["results"], b["results"]):
            assert ra["plan"] == rb["plan"] and ra["plan_digest"] == rb["plan_digest"] and ra["applied"]
        for proc in (a, b):
            ref = proc["checks"]["xla_default"]["leaves"]
            for name in ("one_bucket", "ddp"):
                for x, y in zip(proc["checks"][name]["leaves"], ref):
                    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
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

"""Steps that shard their parameters, run across real processes: a ``("data", "fsdp")`` mesh over the
devices of all the workers, process-major (data parallel across the processes, FSDP within each)."""

from __future__ import annotations

import pytest

from disco.runtime import multiprocess
from tests.support.mp_checks import assert_same_plans_and_xla_defaults_numbers


def test_two_processes_run_an_fsdp_step_on_a_data_x_fsdp_mesh_and_match_xla_default():
    """2 processes x 2 devices on a 2 x 2 mesh: every process builds the same partitioned program,
    applies the same gather-bucket and all-reduce-bucket plans, and after 3 SGD steps holds the
    parameter shards XLA's default holds; each row reports the largest process's compiled peak."""
    plans = ("xla_default", "one_gather_bucket", "ddp")
    spec = multiprocess.WorkerSpec(model="mlp", preset="tiny", plans=plans, rounds=1, steps=1, optimizer="sgd",
                                   style="fsdp", mesh_shape=(2, 2), check_steps=3)
    res = multiprocess.launch(2, 2, spec, timeout_s=600)
    try:
        assert_same_plans_and_xla_defaults_numbers(res, plans[1:], devices=4, local=2)
        rows = {r["plan"]: r for r in multiprocess.combine(res)}
        assert set(rows) == set(plans)
        for name, row in rows.items():
            peaks = [next(x for x in p["results"] if x["plan"] == name)["peak_memory_bytes"] for p in res.results]
            assert all(isinstance(v, int) and v > 0 for v in peaks), peaks
            assert row["peak_memory_bytes"] == max(peaks)
    finally:
        assert multiprocess.stray_processes(res.pids) == []


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, message", [
    ({"style": "gspmd", "mesh_shape": (2, 2)}, "is for style 'fsdp' only"),
    ({"style": "fsdp", "mesh_shape": (2,)}, "a tuple of two ints >= 1"),
    ({"style": "fsdp", "mesh_shape": (0, 4)}, "a tuple of two ints >= 1"),
    ({"style": "fsdp", "mesh_shape": [2, 2]}, "a tuple of two ints >= 1"),
])
def test_worker_spec_refuses_a_mesh_it_cannot_build(kwargs, message):
    with pytest.raises(ValueError, match=message):
        multiprocess.WorkerSpec(**kwargs)


@pytest.mark.fast
def test_a_mesh_of_other_devices_than_the_launchs_is_refused_before_anything_starts():
    spec = multiprocess.WorkerSpec(style="fsdp", mesh_shape=(2, 4))
    with pytest.raises(ValueError, match=r"mesh 2x4 has 8 devices and 2 processes x 2 devices have 4"):
        multiprocess.launch(2, 2, spec)


@pytest.mark.fast
def test_combine_reports_the_largest_processs_peak_and_none_where_one_read_none():
    def row(plan, peak):
        return {"plan": plan, "samples_ms": [1.0], "all_reduces": 1, "applied": True, "plan_digest": plan,
                "peak_memory_bytes": peak}

    res = multiprocess.LaunchResult(2, 1, (
        {"results": [row("xla_default", 100), row("ddp", 120)]},
        {"results": [row("xla_default", 140), row("ddp", None)]},
    ), (), (1, 2))
    rows = {r["plan"]: r for r in multiprocess.combine(res)}
    assert rows["xla_default"]["peak_memory_bytes"] == 140
    assert rows["ddp"]["peak_memory_bytes"] is None

"""The measured communication-free bound: the step with its all-reduces replaced by copies."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import trax_models
from disco import bench
from disco.ir import extractor
from xla_hooks import bound

HLO = """HloModule m

region_0 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add = f32[] add(a, b)
}

ENTRY main {
  p = f32[2,3]{1,0} parameter(0)
  ar = f32[2,3]{1,0} all-reduce(f32[2,3]{1,0} p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=region_0, metadata={op_name="disco_grad[w]/psum"}
  ROOT r = f32[2,3]{1,0} multiply(ar, ar)
}
"""


@pytest.mark.fast
def test_strip_replaces_each_all_reduce_by_a_copy_and_keeps_metadata():
    out = bound.strip_all_reduces(HLO)
    assert "all-reduce(" not in out
    assert ('  ar = f32[2,3]{1,0} copy(f32[2,3]{1,0} p), metadata={op_name="disco_grad[w]/psum"}'
            in out.splitlines())
    assert out.replace("copy(", "").count("\n") == HLO.count("\n")  # nothing else changed in size


@pytest.mark.fast
def test_strip_rejects_variadic_all_reduces_and_text_without_any():
    variadic = HLO.replace("all-reduce(f32[2,3]{1,0} p)", "all-reduce(f32[2,3]{1,0} p, f32[2,3]{1,0} p)")
    with pytest.raises(ValueError, match="single-operand all-reduces"):
        bound.strip_all_reduces(variadic)
    with pytest.raises(ValueError, match="no all-reduce"):
        bound.strip_all_reduces(HLO.replace("all-reduce(", "negate("))


@pytest.mark.fast
def test_keep_scalars_keeps_only_the_scalar_all_reduces():
    scalar = ('  lr = f32[] all-reduce(f32[] q), channel_id=2, replica_groups={{0,1}}, '
              'use_global_device_ids=true, to_apply=region_0')
    text = HLO.replace("ENTRY main {\n  p = f32[2,3]{1,0} parameter(0)\n",
                       "ENTRY main {\n  p = f32[2,3]{1,0} parameter(0)\n  q = f32[] parameter(1)\n" + scalar + "\n")
    out = bound.strip_all_reduces(text, keep_scalars=True)
    assert scalar in out.splitlines() and out.count("all-reduce(") == 1
    assert bound.strip_all_reduces(text).count("all-reduce(") == 0
    with pytest.raises(ValueError, match="no all-reduce"):  # nothing left to replace
        bound.strip_all_reduces(text.replace("f32[2,3]{1,0} all-reduce(", "f32[2,3]{1,0} negate("),
                                keep_scalars=True)


def test_sync_floor_step_keeps_the_averaged_loss():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    fn = bound.compile_comm_free(step, *args, keep_scalars=True)
    assert fn.as_text().count(" all-reduce(") == 1  # the loss's
    _, loss = fn(*args)
    _, ref_loss = jax.jit(step)(*args)
    assert float(loss) == float(ref_loss)


def test_comm_free_step_compiles_without_all_reduces_and_runs():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    fn = bound.compile_comm_free(step, *args)
    assert " all-reduce" not in fn.as_text()
    state, loss = fn(*args)
    ref_state, _ = jax.jit(step)(*args)
    assert jax.tree.structure(state) == jax.tree.structure(ref_state)
    assert np.isfinite(float(loss))
    # each device kept its own gradient: the update differs from the averaged one
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)))


def test_bench_measures_the_bound_last_and_marks_it_as_no_plan():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=4)
    graph = extractor.extract(step, *args)
    from disco.plans import baselines

    results = bench.run_bench(step, args, {"xla_default": baselines.make("xla_default", graph)},
                              rounds=2, steps=1, comm_free_bound=True)
    assert [r.name for r in results] == ["xla_default", bench.COMM_FREE_BOUND]
    b = results[-1]
    assert b.is_bound and not b.applied and b.all_reduces == 0
    row = b.to_dict(results[0].measurement)
    assert row["plan_digest"] is None and row["paired_speedup"] > 0 and len(row["paired_interval"]) == 2

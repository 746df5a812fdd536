"""The per-kernel GNN: features of compiled modules, padding, the pure apply, training, checkpoints,
the cost-model registry and ``disco predict-kernels`` (on a compiled H100 module from the dataset)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnn import kernel_data as KD
from gnn import kernel_features as KF
from tests.support.paths import H100_RECORD, REPO

ROOT = REPO
RECORD = H100_RECORD

LOOP_HLO = """HloModule loop, is_scheduled=true

%body (p: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[64]{0} get-tuple-element(%p), index=1
  %e = f32[64]{0} exponential(%x)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[64]{0}) tuple(%j, %e)
}

%cond (p.1: (s32[], f32[64])) -> pred[] {
  %p.1 = (s32[], f32[64]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

%fused_add (a: f32[64], b: f32[64]) -> f32[64] {
  %a = f32[64]{0} parameter(0)
  %b = f32[64]{0} parameter(1)
  %m = f32[64]{0} multiply(%a, %b)
  ROOT %s = f32[64]{0} add(%m, %a)
}

ENTRY %main (x.2: f32[64]) -> f32[64] {
  %x.2 = f32[64]{0} parameter(0)
  %f = f32[64]{0} fusion(%x.2, %x.2), kind=kLoop, calls=%fused_add
  %zero = s32[] constant(0)
  %init = (s32[], f32[64]{0}) tuple(%zero, %f)
  %w = (s32[], f32[64]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %c = f32[64]{1,0} copy(%f)
  ROOT %out = f32[64]{0} get-tuple-element(%w), index=1
}
"""


# -- features ----------------------------------------------------------------------------------
@pytest.mark.fast
def test_module_kernels_of_a_loop_count_executions_and_skip_plumbing():
    ks = {k.name: k for k in KF.module_kernels(LOOP_HLO)}
    assert set(ks) == {"f", "c", "e", "j", "lt"}, sorted(ks)
    assert ks["f"].executions == 1 and ks["e"].executions == 5 and ks["lt"].executions == 5
    f = ks["f"]
    assert f.xla_kind == "kLoop" and f.kernel.in_bytes == 256 and f.kernel.out_bytes == 256
    assert f.kernel.flops == 128  # multiply + add over 64 elements
    g = KF.kernel_graph(f.kernel)
    assert list(g.senders) == [0] and list(g.receivers) == [1]  # multiply -> add; parameters dropped
    # every kernel, the loop body's too, carries the step's input bytes (the entry's one f32[64])
    assert {k.kernel.step_bytes for k in ks.values()} == {64 * 4}


SLICE_HLO = """HloModule sliced, is_scheduled=true

%fused_add (a: f32[512,512], b: f32[1024,2048]) -> f32[512,512] {
  %a = f32[512,512]{1,0} parameter(0)
  %b = f32[1024,2048]{1,0} parameter(1)
  %s = f32[512,512]{1,0} slice(%b), slice={[512:1024], [1536:2048]}
  ROOT %r = f32[512,512]{1,0} add(%a, %s)
}

%fused_rows (x: f32[64,256]) -> f32[64] {
  %x = f32[64,256]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r.1 = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum
}

%fused_cols (y: f32[64,256]) -> f32[256] {
  %y = f32[64,256]{1,0} parameter(0)
  %z.1 = f32[] constant(0)
  ROOT %r.2 = f32[256]{0} reduce(%y, %z.1), dimensions={0}, to_apply=%sum
}

%sum (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %add = f32[] add(%p, %q)
}

ENTRY %main (a.1: f32[512,512], b.1: f32[1024,2048], c.1: f32[64,256], d.1: f32[8,32,16], e.1: f32[8,16,64])
    -> (f32[512,512], f32[64], f32[256], f32[8,32,64], f32[16,2048]) {
  %a.1 = f32[512,512]{1,0} parameter(0)
  %b.1 = f32[1024,2048]{1,0} parameter(1)
  %c.1 = f32[64,256]{1,0} parameter(2)
  %d.1 = f32[8,32,16]{2,1,0} parameter(3)
  %e.1 = f32[8,16,64]{2,1,0} parameter(4)
  %f = f32[512,512]{1,0} fusion(%a.1, %b.1), kind=kLoop, calls=%fused_add
  %rows = f32[64]{0} fusion(%c.1), kind=kInput, calls=%fused_rows
  %cols = f32[256]{0} fusion(%c.1), kind=kInput, calls=%fused_cols
  %mm = f32[8,32,64]{2,1,0} dot(%d.1, %e.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %sl = f32[16,2048]{1,0} slice(%b.1), slice={[0:16], [0:2048]}
  ROOT %t = (f32[512,512]{1,0}, f32[64]{0}, f32[256]{0}, f32[8,32,64]{2,1,0}, f32[16,2048]{1,0}) tuple(%f, %rows, %cols, %mm, %sl)
}
"""


@pytest.mark.fast
def test_sliced_operands_count_the_slices_read():
    ks = {k.name: k.kernel for k in KF.module_kernels(SLICE_HLO)}
    # the fusion reads a (1 MiB) and a 512x512 slice of b (not all 8 MiB of b)
    assert ks["f"].in_bytes == 2 * 512 * 512 * 4 and ks["f"].out_bytes == 512 * 512 * 4
    assert ks["sl"].in_bytes == ks["sl"].out_bytes == 16 * 2048 * 4  # an unfused slice reads its slice


ASYNC_COLLECTIVES_HLO = """HloModule async_collectives, is_scheduled=true

%add.2 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_mul (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  ROOT %m = f32[1024]{0} multiply(%p0, %p0)
}

ENTRY %main (x: f32[1024]) -> (f32[128], f32[1024], f32[8192]) {
  %x = f32[1024]{0} parameter(0)
  %reduce-scatter-start = ((f32[1024]{0}), f32[128]{0}) reduce-scatter-start(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add.2
  %f = f32[1024]{0} fusion(%x), kind=kLoop, calls=%fused_mul
  %reduce-scatter-done = f32[128]{0} reduce-scatter-done(%reduce-scatter-start)
  %all-to-all-start = ((f32[1024]{0}), f32[1024]{0}) all-to-all-start(%f), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %all-to-all-update = ((f32[1024]{0}), f32[1024]{0}) all-to-all-update(%all-to-all-start)
  %all-to-all-done = f32[1024]{0} all-to-all-done(%all-to-all-update)
  %all-gather-start = (f32[1024]{0}, f32[8192]{0}) all-gather-start(%x), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %all-gather-done = f32[8192]{0} all-gather-done(%all-gather-start)
  ROOT %t = (f32[128]{0}, f32[1024]{0}, f32[8192]{0}) tuple(%reduce-scatter-done, %all-to-all-done, %all-gather-done)
}
"""


@pytest.mark.fast
def test_async_collectives_and_their_done_halves_are_no_compute_kernels():
    """XLA:GPU prints an async reduce-scatter or all-to-all as ``<op>-start``/``-update``/``-done``: a
    collective (on the network, as all-gather-start is) and waits, none of them a compute kernel."""
    assert [k.name for k in KF.module_kernels(ASYNC_COLLECTIVES_HLO)] == ["f"]


@pytest.mark.fast
def test_features_tell_row_from_column_reductions_and_read_matrix_dims():
    ks = {k.name: k.kernel for k in KF.module_kernels(SLICE_HLO)}
    tot = {n: dict(zip(KF.TOTAL_FEATURES, KF.kernel_graph(k).totals.tolist(), strict=True)) for n, k in ks.items()}
    assert tot["rows"]["reduce_minor"] == 1.0 and tot["cols"]["reduce_minor"] == 0.0
    assert tot["rows"]["log_reduce_len"] == pytest.approx(np.log(256)) and tot["cols"]["log_reduce_len"] == (
        pytest.approx(np.log(64)))
    mm = tot["mm"]
    assert [round(float(np.exp(mm[f"log_mm_{d}"]))) for d in ("batch", "m", "n", "k")] == [8, 32, 64, 16]
    assert tot["f"]["log_mm_k"] == 0.0 and tot["f"]["log_inputs"] == pytest.approx(np.log1p(2))
    step = 4 * (512 * 512 + 1024 * 2048 + 64 * 256 + 8 * 32 * 16 + 8 * 16 * 64)  # the entry's parameters
    assert [t["log_step_bytes"] for t in tot.values()] == [pytest.approx(np.log1p(step))] * len(tot)
    node = dict(zip(KF.NODE_FEATURES, KF.kernel_graph(ks["rows"]).nodes[0].tolist(), strict=True))
    assert node["log_minor_dim"] == pytest.approx(np.log(64)) and node["log_in_ratio"] == pytest.approx(np.log(256))


@pytest.mark.fast
def test_minor_dim_follows_the_layout():
    from disco.ir.graph import Node

    base = dict(name="n", opcode="copy", computation="c", shape="f32[8,16]", dtype="f32", out_bytes=512,
                out_elements=128, flops=0.0)
    assert KF.minor_dim(Node(**base)) == 16
    assert KF.minor_dim(Node(**base, layout="0,1")) == 8
    assert KF.minor_dim(Node(**{**base, "shape": "f32[]"})) == 1


@pytest.mark.fast
def test_gpu_module_kernels_cover_the_profiled_ops(record_json: dict, record: KD.Record):
    kernels = KF.module_kernels(record_json["compiled_hlo"])
    kinds = {k.xla_kind for k in kernels}
    assert "__cudnn$convForward" in kinds or "__cudnn$convBiasActivationForward" in kinds
    convs = [k for k in kernels if k.xla_kind.startswith("__cudnn")]
    assert all(k.kernel.flops > 0 for k in convs)
    profiled = {k["hlo_op"] for k in record_json["kernels_trace_a"]}
    assert profiled <= {k.name for k in kernels}
    assert len(record.labels) == len(profiled) and record.step_s > 0


@pytest.mark.fast
def test_features_are_deterministic(record_json: dict):
    a = [KF.kernel_graph(k.kernel) for k in KF.module_kernels(record_json["compiled_hlo"])]
    b = [KF.kernel_graph(k.kernel) for k in KF.module_kernels(record_json["compiled_hlo"])]
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


@pytest.mark.fast
def test_the_feature_cache_gives_back_the_same_records(tmp_path: Path, record: KD.Record):
    cold = KD.load_records(RECORD, cache_dir=tmp_path)
    warm = KD.load_records(RECORD, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 1
    for r in (cold[0], warm[0]):
        assert r.names == record.names and r.labels == record.labels and r.step_s == record.step_s
        np.testing.assert_array_equal(r.executions, record.executions)
        for g, h in zip(r.graphs, record.graphs, strict=True):
            for u, v in zip(g, h, strict=True):
                np.testing.assert_array_equal(u, v)
    # the cached graphs are views of one array per field, not a copy of the file's arrays per graph
    assert len({id(g.nodes.base) for g in warm[0].graphs}) == 1


@pytest.mark.fast
def test_features_written_by_other_feature_code_are_not_read(tmp_path: Path, monkeypatch):
    """The cache key holds a digest of the feature code: features another version of it cached (same
    FEATURE_VERSION, other code) are computed again, not read."""
    KD.load_records(RECORD, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 1
    monkeypatch.setattr(KD, "features_code_digest", lambda: "another feature code")
    KD.load_records(RECORD, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 2


@pytest.mark.fast
def test_batch_rejects_sizes_too_small(record: KD.Record):
    with pytest.raises(ValueError, match="cannot hold"):
        KF.batch(record.graphs[:4], n_node=2)
    with pytest.raises(ValueError, match="at least one"):
        KF.batch([])


# -- model -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model(record: KD.Record):
    from gnn import kernel_train as KT

    ex = KT.make_examples([record])
    cfg = KT.TrainConfig(hidden=16, layers=1, steps=1, max_graphs=16, node_budget=512)
    model, _ = KT.init(ex, cfg, (3.4e14, 3.0e12, 1.4e-6))
    return model


def test_predictions_are_padding_invariant_and_numpy_matches_jax(record: KD.Record, small_model):
    import jax.numpy as jnp

    from gnn import kernel_model as KM

    w = KM.weights(small_model)
    graphs = list(record.graphs[:10])
    small = np.asarray(KM.apply(w, KF.batch(graphs), jnp))[:10]
    big = np.asarray(KM.apply(w, KF.batch(graphs, n_node=4096, n_edge=4096, n_graph=64), jnp))[:10]
    np.testing.assert_allclose(small, big, rtol=1e-5, atol=1e-5)
    one_by_one = [KM.apply(KM.to_numpy(w), KF.batch([g]), np)[0] for g in graphs]
    np.testing.assert_allclose(small, one_by_one, rtol=1e-4, atol=1e-4)


def test_a_few_training_steps_lower_the_loss(record: KD.Record):
    import random

    from gnn import kernel_train as KT

    ex = KT.make_examples([record])
    cfg = KT.TrainConfig(hidden=16, layers=1, steps=30, max_graphs=128, node_budget=1024, lr=1e-2)
    _, state = KT.init(ex, cfg, (3.4e14, 3.0e12, 1.4e-6))
    step = KT.make_step(cfg)
    b, y, w = KT.batches(ex, cfg, random.Random(0))[0]
    first = float(KT.loss_fn(state.params, state.const, b, y, w))
    for _ in range(30):
        state, _ = step(state, b, y, w)
    assert float(KT.loss_fn(state.params, state.const, b, y, w)) < 0.7 * first


def test_the_ranking_term_adds_to_the_loss_and_training_lowers_it(record: KD.Record):
    import random

    from gnn import kernel_train as KT

    ex = KT.make_examples([record])
    cfg = KT.TrainConfig(hidden=16, layers=1, steps=30, max_graphs=128, node_budget=1024, lr=1e-2, rank_weight=0.5)
    _, state = KT.init(ex, cfg, (3.4e14, 3.0e12, 1.4e-6))
    b, y, w = KT.batches(ex, cfg, random.Random(0))[0]
    mse = float(KT.loss_fn(state.params, state.const, b, y, w))
    first = float(KT.loss_fn(state.params, state.const, b, y, w, 0.5))
    assert first > mse  # a softplus of every pair is positive
    step = KT.make_step(cfg)
    for _ in range(30):
        state, _ = step(state, b, y, w)
    assert float(KT.loss_fn(state.params, state.const, b, y, w, 0.5)) < 0.8 * first


def test_an_ensemble_averages_independently_trained_members(record: KD.Record):
    import dataclasses

    import jax.numpy as jnp

    from gnn import kernel_model as KM
    from gnn import kernel_train as KT

    ex = KT.make_examples([record])
    cfg = KT.TrainConfig(hidden=8, layers=1, steps=3, max_graphs=64, node_budget=1024, members=2, seed=5)
    ens, hist = KT.fit(ex, cfg, (3.4e14, 3.0e12, 1.4e-6))
    singles = [KT.fit(ex, dataclasses.replace(cfg, members=1, seed=5 + i), (3.4e14, 3.0e12, 1.4e-6))[0]
               for i in range(2)]
    assert ens.config.members == 2 and hist["steps"] == 3
    b = KF.batch(list(record.graphs[:12]))
    got = np.asarray(KM.apply(KM.weights(ens), b, jnp))[:12]
    want = np.mean([np.asarray(KM.apply(KM.weights(m), b, jnp))[:12] for m in singles], 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.asarray(KM.apply(KM.weights(singles[0]), b, jnp))[:12],
                           np.asarray(KM.apply(KM.weights(singles[1]), b, jnp))[:12])


# -- checkpoints -------------------------------------------------------------------------------
def test_checkpoint_round_trip_is_identical(tmp_path: Path, record: KD.Record, small_model):
    from gnn.kernel_costs import KernelCosts

    costs = KernelCosts(small_model, device="h100", meta={"note": "test"})
    p = tmp_path / "k.msgpack"
    costs.save(p)
    back = KernelCosts.load(p)
    assert back.device == "h100" and back.meta == {"note": "test"} and back.checkpoint_digest == costs.checkpoint_digest
    ks = [k.kernel for k in KF.module_kernels(LOOP_HLO)]
    assert [costs.kernel_time(k) for k in ks] == [back.kernel_time(k) for k in ks]
    p2 = tmp_path / "k2.msgpack"
    back.save(p2)
    assert p2.read_bytes() == p.read_bytes()


def test_corrupt_or_mismatched_checkpoints_say_why(tmp_path: Path, small_model):
    from flax import serialization

    from gnn.kernel_costs import KernelCosts, to_bytes

    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"\x00not msgpack at all")
    with pytest.raises(ValueError, match="bad.msgpack: (not a msgpack checkpoint|expected format)"):
        KernelCosts.load(bad)
    raw = serialization.msgpack_restore(to_bytes(small_model, device="h100"))
    raw["params"] = {k: v for k, v in raw["params"].items() if "/out2/" not in k}
    (tmp_path / "missing.msgpack").write_bytes(serialization.msgpack_serialize(raw))
    with pytest.raises(ValueError, match="parameters do not match config.*missing"):
        KernelCosts.load(tmp_path / "missing.msgpack")
    raw = serialization.msgpack_restore(to_bytes(small_model, device="h100"))
    raw["config"] = json.dumps({**json.loads(raw["config"]), "feature_version": 99})
    (tmp_path / "version.msgpack").write_bytes(serialization.msgpack_serialize(raw))
    with pytest.raises(ValueError, match="feature version 99"):
        KernelCosts.load(tmp_path / "version.msgpack")


def test_both_gnn_cost_models_rebuild_from_params_and_check_the_digest(tmp_path: Path, small_model):
    from gnn.cost_model import DEFAULT_CHECKPOINT, GnnCosts
    from gnn.kernel_costs import KernelCosts

    p = tmp_path / "k.msgpack"
    KernelCosts(small_model, device="h100").save(p)
    for cls, path, what in ((KernelCosts, p, "gnn kernel cost params"), (GnnCosts, DEFAULT_CHECKPOINT, "gnn cost params")):
        costs = cls.load(path)
        again = cls.from_params(costs.params())
        assert again.checkpoint_digest == costs.checkpoint_digest
        with pytest.raises(ValueError, match=f"{what}: checkpoint .* has digest {costs.checkpoint_digest}, "
                                             f"expected 0000"):
            cls.from_params({**costs.params(), "checkpoint_digest": "0000"})
        with pytest.raises(ValueError, match=f"{what}: expected an object with 'source'"):
            cls.from_params({"checkpoint_digest": "0000"})


# -- registry and CLI --------------------------------------------------------------------------
def test_registry_resolves_names_devices_and_files(tmp_path: Path, small_model):
    from disco.sim.costs import registry
    from gnn.kernel_costs import KernelCosts
    from gnn.registration import ENTRY

    assert registry.make("analytic", device="cpu").config.mem_bandwidth == 1e10
    assert registry.make("analytic", device="h100").name == "analytic-summed"
    with pytest.raises(ValueError, match="device 'tpu'"):
        registry.make("analytic", device="tpu")
    with pytest.raises(ValueError, match="expected analytic"):
        registry.make("nope")
    registry.register(ENTRY)
    p = tmp_path / "m.msgpack"
    KernelCosts(small_model, device="h100").save(p)
    loaded = registry.make(str(p))
    assert isinstance(loaded, KernelCosts) and loaded.device == "h100"
    assert registry.make(str(p), device="h100").device == "h100"
    with pytest.raises(ValueError, match=r"m\.msgpack' was trained for device 'h100', not 'cpu'; expected a model "
                                         r"of 'cpu' kernels"):
        registry.make(str(p), device="cpu")  # an H100 checkpoint does not price CPU kernels


def test_a_step_level_checkpoint_prices_cpu_kernels_only(tmp_path: Path, record_json: dict):
    """The step-level GNN is trained on CPU measurements: --device h100 refuses it (it priced H100 kernels)."""
    from disco.sim.costs import registry
    from gnn.cost_model import DEFAULT_CHECKPOINT
    from gnn.registration import ENTRY

    registry.register(ENTRY)
    assert registry.make(str(DEFAULT_CHECKPOINT), device="cpu").device == "cpu"
    with pytest.raises(ValueError, match=r"default_checkpoint\.msgpack' was trained for device 'cpu', not 'h100'"):
        registry.make(str(DEFAULT_CHECKPOINT), device="h100")
    hlo = tmp_path / "module.hlo.txt"
    hlo.write_text(record_json["compiled_hlo"])
    r = _cli("predict-kernels", "--hlo", str(hlo), "--device", "h100", "--cost-model", str(DEFAULT_CHECKPOINT))
    assert r.returncode == 2 and r.stdout == "" and "trained for device 'cpu', not 'h100'" in r.stderr, r.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disco", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


@pytest.mark.parametrize("cost_model", ["analytic", "gnn"])
def test_predict_kernels_json_on_a_compiled_h100_module(tmp_path: Path, record_json: dict, cost_model: str):
    from gnn.kernel_costs import CHECKPOINTS

    if cost_model == "gnn" and not CHECKPOINTS["h100"].is_file():
        pytest.skip("no shipped h100 checkpoint")
    hlo = tmp_path / "module.hlo.txt"
    hlo.write_text(record_json["compiled_hlo"])
    r = _cli("predict-kernels", "--hlo", str(hlo), "--device", "h100", "--cost-model", cost_model, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert set(out) == {"device", "cost_model", "kernels", "total_s"}
    assert out["device"] == "h100" and out["cost_model"] == cost_model
    launching = {k.name for k in KF.module_kernels(record_json["compiled_hlo"]) if not k.kernel.is_empty}
    assert set(out["kernels"]) == launching
    assert all(v > 0 for v in out["kernels"].values())
    assert out["total_s"] == pytest.approx(sum(out["kernels"].values()))
    profiled = {k["hlo_op"] for k in record_json["kernels_trace_a"]}
    assert profiled <= set(out["kernels"])
    assert "warning" not in r.stderr  # a compiled module: is_scheduled=true in its header


def test_predict_kernels_warns_on_a_module_before_optimisation(tmp_path: Path, record_json: dict):
    pre = tmp_path / "pre.hlo.txt"
    pre.write_text(record_json["compiled_hlo"].replace("is_scheduled=true, ", "", 1))
    r = _cli("predict-kernels", "--hlo", str(pre), "--device", "h100", "--cost-model", "analytic", "--top", "1")
    assert r.returncode == 0 and "this looks like HLO before optimisation" in r.stderr, r.stderr[-2000:]
    assert len(r.stdout.strip().splitlines()) == 2  # the total and --top 1 kernel
    r = _cli("predict-kernels", "--hlo", str(pre), "--device", "h100", "--top", "-1")
    assert r.returncode == 2 and "--top must be >= 0 kernels, got -1" in r.stderr


def _cpu_module() -> str:
    """A tiny function compiled by XLA:CPU in this process."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0) * 2.0).lower(jnp.ones((64, 32))).compile().as_text()


def test_predict_kernels_refuses_a_module_of_the_other_backend(tmp_path: Path, record_json: dict):
    cpu, gpu = tmp_path / "cpu.hlo.txt", tmp_path / "gpu.hlo.txt"
    cpu.write_text(_cpu_module())
    gpu.write_text(record_json["compiled_hlo"])
    r = _cli("predict-kernels", "--hlo", str(cpu), "--device", "cpu", "--json")  # the default on cpu: analytic
    assert r.returncode == 0 and json.loads(r.stdout)["kernels"], r.stderr[-2000:]
    assert json.loads(r.stdout)["cost_model"] == "analytic" and r.stderr == ""
    r = _cli("predict-kernels", "--hlo", str(cpu), "--device", "cpu", "--cost-model", "gnn", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["cost_model"] == "gnn", r.stderr[-2000:]
    assert "no per-kernel CPU checkpoint is shipped; gnn on cpu is the step-level GNN's kernel part" in r.stderr
    for path, device, other in ((cpu, "h100", "XLA:CPU"), (gpu, "cpu", "XLA:GPU")):
        r = _cli("predict-kernels", "--hlo", str(path), "--device", device, "--cost-model", "analytic")
        assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
        assert r.stderr.count("\n") == 1 and f"is a module compiled by {other}" in r.stderr, r.stderr


def test_predict_kernels_says_once_why_text_is_not_hlo(tmp_path: Path):
    """Empty or StableHLO text: one error line naming the file, no pre-optimisation warning before it."""
    import jax
    import jax.numpy as jnp

    empty, mlir = tmp_path / "empty.txt", tmp_path / "stablehlo.mlir"
    empty.write_text("")
    mlir.write_text(jax.jit(jnp.sin).lower(jnp.ones(4)).as_text())
    for path, why in ((empty, "empty HLO text"), (mlir, "must start with 'HloModule <name>'")):
        r = _cli("predict-kernels", "--hlo", str(path), "--device", "cpu", "--cost-model", "analytic")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"disco predict-kernels: error: --hlo {str(path)!r}: ") and why in r.stderr


def test_predict_kernels_reads_one_module_of_several(tmp_path: Path):
    """A file of two modules: --module picks one (the error's advice named only `disco graph --module`)."""
    two = tmp_path / "two.hlo.txt"
    text = _cpu_module()
    two.write_text(text + "\n" + text)
    r = _cli("predict-kernels", "--hlo", str(two), "--device", "cpu", "--cost-model", "analytic")
    assert r.returncode == 2 and "holds 2 HLO modules" in r.stderr and "`disco predict-kernels`" in r.stderr
    r = _cli("predict-kernels", "--hlo", str(two), "--device", "cpu", "--cost-model", "analytic", "--module", "#2",
             "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert set(json.loads(r.stdout)["kernels"]) == {k.name for k in KF.module_kernels(text) if not k.kernel.is_empty}


def test_compiled_backend_reads_the_backend_config_fields(record_json: dict):
    from disco.ir.hlo_parse import compiled_backend

    assert compiled_backend(record_json["compiled_hlo"]) == "gpu"
    assert compiled_backend(_cpu_module()) == "cpu"
    assert compiled_backend(LOOP_HLO) is None  # neither backend's fields: not told apart


def test_predict_kernels_rejects_a_missing_file():
    r = _cli("predict-kernels", "--hlo", "/nonexistent.txt", "--device", "h100", "--cost-model", "analytic")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_train_script_trains_on_several_kernel_files(tmp_path: Path):
    """scripts/tools/train_gnn.py --kernels A --kernels B: one checkpoint over both files' records."""
    from gnn.kernel_costs import KernelCosts

    out = tmp_path / "k.msgpack"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "tools" / "train_gnn.py"), "--kernels", str(RECORD),
                           "--kernels", str(RECORD), "--device", "h100", "--out", str(out), "--steps", "3",
                           "--members", "1", "--cache", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    costs = KernelCosts.load(out)
    data = costs.meta["data"]
    assert data["records"] == 2 and [f["file"] for f in data["files"]] == [RECORD.name] * 2
    assert costs.corrections and costs.meta["measured_kernels"] == len(costs.corrections)
    judged = subprocess.run([sys.executable, str(ROOT / "scripts" / "tools" / "kernel_judge.py"), "--checkpoint", str(out),
                             "--kernels", str(RECORD), "--cache", str(tmp_path / "cache")],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert judged.returncode == 0, judged.stderr[-2000:]
    assert "| vgg19/small/default |" in judged.stdout
    # every kernel of the training record has its measured correction
    n = len(KD.load_records(RECORD, cache_dir=tmp_path / "cache")[0].profiled_ops())
    assert f"kernels with a measured correction: {n}/{n} (100.0%)" in judged.stdout
    assert "gnn: pooled over" in judged.stdout and "gnn_network_alone: pooled over" in judged.stdout


def test_leave_one_model_out_reports_the_corrections(tmp_path: Path, record_json: dict):
    """scripts/tools/kernel_lomo.py over two 'models' with the same kernels: every held-out kernel has a
    measured correction; one model alone is refused with a reason."""
    twin = tmp_path / "twin.jsonl.gz"
    with gzip.open(twin, "wt") as f:
        f.write(json.dumps({**record_json, "model": "vgg19_twin"}) + "\n")
    cmd = [sys.executable, str(ROOT / "scripts" / "tools" / "kernel_lomo.py"), "--kernels", str(RECORD), "--steps", "3",
           "--members", "1", "--cache", str(tmp_path / "cache")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    alone = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert alone.returncode == 2 and "at least two models" in alone.stderr
    proc = subprocess.run([*cmd, "--kernels", str(twin), "--json", str(tmp_path / "m.json")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "m.json").read_text())
    n = out["covered"]["of"]
    assert n == 2 * len(KD.record_from_json(record_json).profiled_ops())
    assert out["covered"]["kernels"] == n
    assert {"gnn", "gnn_network_alone", "analytic"} <= set(out)
    # a held-out kernel measured in the other 'model' is predicted at that measurement
    assert out["gnn"]["median_rel_err"] < 1e-4 < out["gnn_network_alone"]["median_rel_err"]


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "tools" / name), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _one_error_line(r: subprocess.CompletedProcess, prog: str, *parts: str) -> None:
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith(f"{prog}: error: ") and r.stderr.count("\n") == 1, r.stderr[-2000:]
    for part in parts:
        assert part in r.stderr, r.stderr


def test_kernel_scripts_refuse_bad_input_in_one_line_before_training(tmp_path: Path, record_json: dict,
                                                                      small_model):
    """train_gnn.py --kernels, kernel_judge.py and kernel_lomo.py: exit status 2 and one line naming
    what was wrong (they printed tracebacks, exit status 1); nothing written."""
    from gnn.kernel_costs import KernelCosts

    out, cache = tmp_path / "k.msgpack", str(tmp_path / "cache")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record_json) + "\n" + '{"model": "vgg19", broken\n')
    train = ("train_gnn.py", "--steps", "1", "--members", "1", "--cache", cache, "--out", str(out))
    _one_error_line(_script(*train, "--kernels", str(bad), "--device", "h100"), "train_gnn", "bad.jsonl:2: not a JSON")
    _one_error_line(_script(*train, "--kernels", str(RECORD), "--device", "cpu"), "train_gnn",
                    f"{RECORD.name}:1: record vgg19/small/default was profiled on 'NVIDIA H100 80GB HBM3' (h100), "
                    "not 'cpu'")
    _one_error_line(_script(*train, "--kernels", str(RECORD), "--device", "h100", "--steps", "0"), "train_gnn",
                    "steps: expected an integer >= 1, got 0")
    _one_error_line(_script(*train[:-1], str(tmp_path / "no" / "k.msgpack"), "--kernels", str(RECORD),
                            "--device", "h100"), "train_gnn", "does not exist; create it first")
    assert not out.exists()
    cpu_ckpt, cut = tmp_path / "cpu.msgpack", tmp_path / "cut.msgpack"
    KernelCosts(small_model, device="cpu").save(cpu_ckpt)
    cut.write_bytes(cpu_ckpt.read_bytes()[:1000])
    judge = ("kernel_judge.py", "--cache", cache, "--kernels", str(RECORD), "--checkpoint")
    _one_error_line(_script(*judge, str(cpu_ckpt)), "kernel_judge", "(h100), not 'cpu'")
    _one_error_line(_script(*judge, str(cut)), "kernel_judge", "--checkpoint", "not a msgpack checkpoint")
    _one_error_line(_script(*judge, str(tmp_path / "none.msgpack")), "kernel_judge", "no such file")
    _one_error_line(_script("kernel_lomo.py", "--cache", cache, "--kernels", str(RECORD), "--device", "cpu"),
                    "kernel_lomo", "(h100), not 'cpu'")


@pytest.mark.fast
def test_load_records_names_the_line_of_a_bad_record(tmp_path: Path, record_json: dict):
    lines = tmp_path / "k.jsonl"
    lines.write_text(json.dumps(record_json) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"k\.jsonl:2: expected a JSON object, got list"):
        KD.load_records(lines)
    lines.write_text(json.dumps({k: v for k, v in record_json.items() if not k.startswith("kernels_trace")}) + "\n")
    with pytest.raises(ValueError, match=r"k\.jsonl:1: record vgg19/default: expected 'kernels_trace_a'"):
        KD.load_records(lines)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(RECORD.read_bytes()[:4000])
    with pytest.raises(ValueError, match=r"cut\.jsonl\.gz:1: not a complete gzip file"):
        KD.load_records(cut)
    assert [r.key for r in KD.load_records(RECORD, device="h100")] == ["vgg19/small/default"]
    with pytest.raises(ValueError, match=r"profiled on 'NVIDIA H100 80GB HBM3' \(h100\), not 'cpu'"):
        KD.load_records(RECORD, device="cpu")


def test_train_script_keeps_the_shipped_checkpoint_without_the_flag(tmp_path: Path):
    """train_gnn.py --kernels --out gnn/kernel_h100.msgpack is refused before training unless
    --overwrite-shipped (it wrote over what --cost-model gnn loads without a word)."""
    from gnn.kernel_costs import CHECKPOINTS

    shipped = CHECKPOINTS["h100"]
    if not shipped.is_file():
        pytest.skip("no shipped h100 checkpoint")
    before = shipped.read_bytes()
    try:
        r = _script("train_gnn.py", "--kernels", str(RECORD), "--device", "h100", "--out", str(shipped),
                    "--steps", "1", "--members", "1", "--cache", str(tmp_path / "cache"))
    finally:
        after = shipped.read_bytes()
        if after != before:
            shipped.write_bytes(before)  # a failing run must not leave the shipped file replaced
    assert after == before
    _one_error_line(r, "train_gnn", "is a file shipped in the gnn package", "--overwrite-shipped")


@pytest.mark.fast
def test_a_damaged_feature_cache_file_is_computed_again(tmp_path: Path, record: KD.Record):
    """A cache file cut short (a run killed while writing it) is a miss, computed again and replaced
    (every later run stopped with zipfile.BadZipFile); files are written whole (no half file left)."""
    KD.load_records(RECORD, cache_dir=tmp_path)
    (f,) = tmp_path.iterdir()
    f.write_bytes(f.read_bytes()[:1000])
    (again,) = KD.load_records(RECORD, cache_dir=tmp_path)
    assert again.names == record.names and again.labels == record.labels
    assert [p.name for p in tmp_path.iterdir()] == [f.name]  # replaced in place, no temporary left
    (warm,) = KD.load_records(RECORD, cache_dir=tmp_path)
    assert all(np.array_equal(a.nodes, b.nodes) for a, b in zip(warm.graphs, record.graphs))


_FAILING_SAVE = """
import resource, signal, sys
from flax import nnx
from gnn import checkpoint
from gnn import kernel_model as KM
from gnn.kernel_costs import KernelCosts
from gnn.model import CostGNN

kind, path = sys.argv[1:]
model = (KM.KernelGNN(hidden=8, layers=1, rngs=nnx.Rngs(0)) if kind == "kernel"
         else CostGNN(hidden=8, edge_hidden=4, layers=1, opcode_dim=4, rngs=nnx.Rngs(0)))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # as a full disk: a write stops after 1000 bytes
try:
    KernelCosts(model, device="h100").save(path) if kind == "kernel" else checkpoint.save(path, model)
except OSError:
    sys.exit(0)
sys.exit("the save did not fail")
"""


@pytest.mark.parametrize("kind", ["kernel", "step"])
def test_a_failed_checkpoint_write_keeps_the_file_that_was_there(tmp_path: Path, small_model, kind: str):
    """A save that fails part way (here a file-size limit, as a full disk) leaves the old checkpoint
    whole and no temporary file; it cut the old one to the bytes written."""
    from gnn.cost_model import DEFAULT_CHECKPOINT, GnnCosts
    from gnn.kernel_costs import KernelCosts

    p = tmp_path / "ck.msgpack"
    if kind == "kernel":
        KernelCosts(small_model, device="h100").save(p)
    else:
        p.write_bytes(DEFAULT_CHECKPOINT.read_bytes())
    before = p.read_bytes()
    assert len(before) > 1000
    r = subprocess.run([sys.executable, "-c", _FAILING_SAVE, kind, str(p)], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert r.returncode == 0, r.stderr
    assert p.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ck.msgpack"]
    (KernelCosts if kind == "kernel" else GnnCosts).load(p)


@pytest.mark.parametrize("kind", ["kernel", "step"])
@pytest.mark.parametrize("edit, match", [
    (lambda raw: {**raw, "config": json.dumps({**json.loads(raw["config"]), "hidden": "8"})}, r"hidden: expected an integer"),
    (lambda raw: {**raw, "config": json.dumps({**json.loads(raw["config"]), "depth": 2})}, r"unknown keys \['depth'\]"),
    (lambda raw: {**raw, "config": json.dumps({k: v for k, v in json.loads(raw["config"]).items()
                                               if k != "feature_version"})}, r"expected an object with a feature_version"),
    (lambda raw: {**raw, "meta": "[1, 2]"}, r"meta: expected an object, got list"),
])
def test_a_hand_edited_checkpoint_config_names_the_file(tmp_path: Path, small_model, kind: str, edit, match: str):
    """A config or meta field edited by hand: a ValueError naming the file (a bad config value said only
    'KernelModelConfig.hidden: ...', a config without its feature version loaded as this code's
    version, a meta list loaded and broke describe())."""
    from flax import nnx, serialization

    from gnn import checkpoint
    from gnn.cost_model import GnnCosts
    from gnn.kernel_costs import KernelCosts, to_bytes
    from gnn.model import CostGNN

    data = (to_bytes(small_model, device="h100") if kind == "kernel"
            else checkpoint.to_bytes(CostGNN(hidden=8, edge_hidden=4, layers=1, opcode_dim=4, rngs=nnx.Rngs(0))))
    p = tmp_path / "edited.msgpack"
    p.write_bytes(serialization.msgpack_serialize(edit(serialization.msgpack_restore(data))))
    with pytest.raises(ValueError, match=rf"^edited\.msgpack: damaged checkpoint fields \(.*{match}"):
        (KernelCosts if kind == "kernel" else GnnCosts).load(p)


@pytest.mark.fast
@pytest.mark.parametrize("field, value", [("ns_per_step", float("nan")), ("ns_per_step", float("inf")),
                                          ("ns_per_step", -5.0), ("launches_per_step", float("nan"))])
def test_a_kernel_time_that_is_not_a_finite_number_names_the_line(tmp_path: Path, record_json: dict, field: str,
                                                                  value: float):
    """A NaN, infinite or negative time in a trace: a ValueError naming the file, line and kernel. A NaN or
    negative time dropped the kernel silently (and made the step time NaN), an infinite one became a
    training target of infinite log seconds (a NaN model)."""
    rec = json.loads(json.dumps(record_json))
    for t in ("kernels_trace_a", "kernels_trace_b"):
        rec[t][3][field] = value
    lines = tmp_path / "k.jsonl"
    lines.write_text(json.dumps(record_json) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match=rf"k\.jsonl:2: record vgg19/default: kernel '.*' of '.*': expected "
                                         rf"ns_per_step and launches_per_step finite numbers >= 0, got .*{value}"):
        KD.load_records(lines)


@pytest.mark.parametrize("kind", ["kernel", "step"])
@pytest.mark.parametrize("value, match", [(np.nan, "non-finite values"), (np.inf, "non-finite values")])
def test_a_checkpoint_parameter_that_is_not_finite_names_the_file(tmp_path: Path, small_model, kind: str, value,
                                                                  match: str):
    """A parameter holding NaN or infinity (a diverged run, a hand edit): a ValueError naming the file and
    parameter; it loaded and priced kernels at NaN seconds."""
    from flax import nnx, serialization

    from gnn import checkpoint
    from gnn.cost_model import GnnCosts
    from gnn.kernel_costs import KernelCosts, to_bytes
    from gnn.model import CostGNN

    data = (to_bytes(small_model, device="h100") if kind == "kernel"
            else checkpoint.to_bytes(CostGNN(hidden=8, edge_hidden=4, layers=1, opcode_dim=4, rngs=nnx.Rngs(0))))
    raw = serialization.msgpack_restore(data)
    name = sorted(k for k in raw["params"] if k.endswith("kernel"))[0]
    raw["params"][name] = np.full(np.shape(raw["params"][name]), value)
    p = tmp_path / "edited.msgpack"
    p.write_bytes(serialization.msgpack_serialize(raw))
    with pytest.raises(ValueError, match=rf"^edited\.msgpack: parameter '{name}': expected finite numbers, got {match}"):
        (KernelCosts if kind == "kernel" else GnnCosts).load(p)


@pytest.mark.parametrize("kind", ["kernel", "step"])
def test_a_diverged_model_is_not_written(tmp_path: Path, small_model, kind: str):
    """Training that diverged saved a NaN checkpoint (refused only when loaded); now the save refuses it
    and the file that was there stays as it was."""
    import jax.numpy as jnp
    from flax import nnx

    from gnn import checkpoint
    from gnn.kernel_costs import KernelCosts
    from gnn.model import CostGNN

    model = small_model if kind == "kernel" else CostGNN(hidden=8, edge_hidden=4, layers=1, opcode_dim=4,
                                                          rngs=nnx.Rngs(0))
    model = nnx.clone(model)
    param = next(v for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Param))
    param[...] = jnp.full_like(param[...], jnp.nan)
    p = tmp_path / "model.msgpack"
    p.write_bytes(b"the previous checkpoint")
    with pytest.raises(ValueError, match=r"^the model to save \(a diverged training run\?\); nothing written: "
                                         r"parameter '.*': expected finite numbers, got non-finite values"):
        if kind == "kernel":
            KernelCosts(model, device="h100").save(p)
        else:
            checkpoint.save(p, model)
    assert p.read_bytes() == b"the previous checkpoint"

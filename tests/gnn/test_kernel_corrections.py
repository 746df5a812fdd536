"""Measured corrections of the per-kernel GNN: the kernel fingerprint, the table fitted on training
examples, its use in ``KernelCosts`` and its place in the checkpoint (on a compiled H100 module from
the dataset)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn import kernel_corrections as KC
from gnn import kernel_data as KD
from gnn import kernel_features as KF
from tests.support.paths import H100_RECORD

RECORD = H100_RECORD
STEP = KF.TOTAL_FEATURES.index("log_step_bytes")


@pytest.fixture(scope="module")
def trained(record: KD.Record):
    from gnn import kernel_train as KT

    ex = KT.make_examples([record])
    cfg = KT.TrainConfig(hidden=16, layers=1, steps=20, max_graphs=16, node_budget=512, members=1)
    model, _ = KT.fit(ex, cfg, (3.4e14, 3.0e12, 1.4e-6))
    return model, ex


def _with(graph: KF.KernelGraph, **fields: np.ndarray) -> KF.KernelGraph:
    return graph._replace(**fields)


@pytest.mark.fast
def test_the_fingerprint_names_the_kernel_not_its_step(record: KD.Record):
    g = record.graphs[0]
    fp = KF.fingerprint(g)
    assert re.fullmatch("[0-9a-f]{16}", fp), fp
    assert KF.fingerprint(KF.KernelGraph(*(a.copy() for a in g))) == fp
    other_step = g.totals.copy()
    other_step[STEP] += 3.0
    assert KF.fingerprint(_with(g, totals=other_step)) == fp
    bigger = g.nodes.copy()
    bigger[0, 0] += 0.5  # one node's output elements
    assert KF.fingerprint(_with(g, nodes=bigger)) != fp
    assert KF.fingerprint(_with(g, opcodes=(g.opcodes + 1) % KF.N_OPCODES)) != fp
    # graphs that share a fingerprint are equal (up to the rounding)
    graphs = [KF.kernel_graph(k.kernel) for k in KF.module_kernels(_compiled_hlo())]
    by_fp: dict[str, list[KF.KernelGraph]] = {}
    for h in graphs:
        by_fp.setdefault(KF.fingerprint(h), []).append(h)
    assert 1 < len(by_fp) <= len(graphs)
    for same in by_fp.values():
        for h in same[1:]:
            for u, v in zip(h, same[0], strict=True):
                np.testing.assert_allclose(u, v, atol=1e-4)


def _compiled_hlo() -> str:
    with gzip.open(RECORD, "rt") as f:
        return json.loads(f.readline())["compiled_hlo"]


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(col=st.integers(0, len(KF.TOTAL_FEATURES) - 1), delta=st.floats(0.01, 5.0), index=st.integers(0, 40))
def test_a_changed_kernel_total_changes_the_fingerprint_unless_it_is_context(record: KD.Record, col: int,
                                                                          delta: float, index: int):
    g = record.graphs[index % len(record.graphs)]
    t = g.totals.copy()
    t[col] += np.float32(delta)
    same = KF.fingerprint(_with(g, totals=t)) == KF.fingerprint(g)
    assert same == (KF.TOTAL_FEATURES[col] in KF.CONTEXT_TOTALS)


@pytest.mark.fast
def test_negative_zero_and_last_bit_noise_do_not_change_the_fingerprint(record: KD.Record):
    g = record.graphs[0]
    nodes = g.nodes.copy()
    zero = nodes == 0
    nodes[zero] = -0.0
    nodes[~zero] = np.nextafter(nodes[~zero], np.float32(np.inf))
    assert KF.fingerprint(_with(g, nodes=nodes)) == KF.fingerprint(g)


@pytest.mark.fast
def test_fit_corrections_takes_the_median_residual_per_fingerprint(record: KD.Record):
    a, b = record.graphs[0], record.graphs[1]
    assert KF.fingerprint(a) != KF.fingerprint(b)
    moved = a.totals.copy()
    moved[STEP] += 1.0  # a in another step: the same kernel
    graphs = [a, _with(a, totals=moved), a, b]
    table = KC.fit_corrections([1.0, 2.0, 3.0, -5.0], [0.9, 1.5, 2.4, -5.0], graphs)
    assert table == {KF.fingerprint(a): pytest.approx(0.5), KF.fingerprint(b): 0.0}
    out = KC.corrected([0.0, 0.0, 7.0], [a, b, record.graphs[2]], table)
    np.testing.assert_allclose(out, [0.5, 0.0, 7.0])
    np.testing.assert_array_equal(KC.corrected([1.0, 2.0], [a, b], {}), [1.0, 2.0])


@pytest.mark.fast
def test_fit_corrections_rejects_mismatched_or_non_finite_input(record: KD.Record):
    g = record.graphs[:2]
    with pytest.raises(ValueError, match="one measured and one predicted value per graph"):
        KC.fit_corrections([1.0], [1.0, 2.0], g)
    with pytest.raises(ValueError, match="finite"):
        KC.fit_corrections([1.0, float("nan")], [1.0, 2.0], g)


@pytest.mark.fast
@pytest.mark.parametrize("table, match", [
    ([1, 2], "expected an object, got list"),
    ({"xyz": 0.1}, "16-hex-digit fingerprints"),
    ({"0123456789abcdef": "0.1"}, "16-hex-digit fingerprints"),
    ({"0123456789abcdef": float("inf")}, "finite"),
])
def test_a_bad_table_says_what_was_expected(table: object, match: str):
    with pytest.raises(ValueError, match=f"ckpt: corrections: .*{match}"):
        KC.check_table(table, "ckpt")


def test_measured_corrections_fit_the_training_kernels(trained, record: KD.Record):
    from gnn import kernel_model as KM
    from gnn import kernel_train as KT

    model, ex = trained
    w = KM.weights(model)
    graphs = [e.graph for e in ex]
    y = np.array([e.log_s for e in ex])
    net = KT.predict_log_seconds(w, graphs)
    table = KT.measured_corrections(w, ex)
    assert len(table) == len({KF.fingerprint(g) for g in graphs})
    fixed = KC.corrected(net, graphs, table)
    assert np.median(np.abs(fixed - y)) < np.median(np.abs(net - y))
    once = [i for i, g in enumerate(graphs) if sum(KF.fingerprint(h) == KF.fingerprint(g) for h in graphs) == 1]
    assert once
    np.testing.assert_allclose(fixed[once], y[once], atol=2e-6)  # a kernel measured once: its measurement


def test_kernel_costs_apply_the_corrections_and_keep_them_in_the_checkpoint(tmp_path: Path, trained,
                                                                            record: KD.Record):
    from flax import serialization

    from gnn import kernel_model as KM
    from gnn import kernel_train as KT
    from gnn.kernel_costs import KernelCosts, to_bytes

    model, ex = trained
    table = KT.measured_corrections(KM.weights(model), ex)
    kernels = [k.kernel for k in KF.module_kernels(_compiled_hlo())][:12]
    plain, fixed = KernelCosts(model, device="h100"), KernelCosts(model, device="h100", corrections=table)
    for k in kernels:
        c = table.get(KF.fingerprint(KF.kernel_graph(k)), 0.0)
        assert fixed.kernel_time(k) == pytest.approx(plain.kernel_time(k) * np.exp(c), rel=1e-5)
    graphs = [KF.kernel_graph(k) for k in kernels]
    np.testing.assert_allclose(fixed.predict(graphs), [fixed.kernel_time(k) for k in kernels], rtol=1e-4)
    assert any(table.get(KF.fingerprint(g), 0.0) != 0.0 for g in graphs)

    p = tmp_path / "c.msgpack"
    fixed.save(p)
    back = KernelCosts.load(p)
    assert back.corrections == table and back.describe()["measured_kernels"] == len(table)
    assert [back.kernel_time(k) for k in kernels] == [fixed.kernel_time(k) for k in kernels]
    back.save(tmp_path / "again.msgpack")
    assert (tmp_path / "again.msgpack").read_bytes() == p.read_bytes()

    raw = serialization.msgpack_restore(to_bytes(model, device="h100", corrections=table))
    del raw["corrections"]  # a checkpoint written before corrections existed
    (tmp_path / "old.msgpack").write_bytes(serialization.msgpack_serialize(raw))
    old = KernelCosts.load(tmp_path / "old.msgpack")
    assert old.corrections == {} and old.kernel_time(kernels[0]) == plain.kernel_time(kernels[0])
    raw["corrections"] = json.dumps({"not-a-fingerprint": 1.0})
    (tmp_path / "bad.msgpack").write_bytes(serialization.msgpack_serialize(raw))
    with pytest.raises(ValueError, match=r"bad\.msgpack: corrections: expected 16-hex-digit"):
        KernelCosts.load(tmp_path / "bad.msgpack")


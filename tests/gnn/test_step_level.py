"""The GNN cost model: features, padding, checkpoints, training, GnnCosts."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flax")

from disco.ir.graph import HloGraph  # noqa: E402
from disco.plans.plan import FusionPlan  # noqa: E402
from disco.plans.random_plans import random_plan  # noqa: E402
from gnn import checkpoint, features as F, train  # noqa: E402
from tests.support.paths import DATA  # noqa: E402

SMALL = DATA / "profiles_small"
TINY = train.TrainConfig(hidden=8, edge_hidden=4, layers=1, opcode_dim=4, epochs=3, batch=8, node_budget=4096,
                         lr=3e-3, patience=10)


def _graph() -> HloGraph:
    paths = sorted((SMALL / "graphs").glob("*.json"))
    if not paths:
        pytest.skip("tests/data/profiles_small has no graphs")
    graphs = [HloGraph.from_json(p.read_text()) for p in paths]
    return min(graphs, key=len)


@pytest.fixture(scope="module")
def graph() -> HloGraph:
    return _graph()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> train.Dataset:
    """The committed measurements (profiles_small: 30 samples of mlp and transformer_lm on CPU),
    else, where a checkout lacks them, a simulator-priced stand-in on one graph (gnn.synthetic)."""
    g = _graph()
    if (SMALL / "samples.jsonl").is_file():
        ds = train.load_dataset(SMALL)
        if len(ds.samples) >= 24:
            return ds
    from gnn import synthetic

    out = synthetic.write_dataset(tmp_path_factory.mktemp("synth"), {"mlp": g}, plans_per_graph=28, seed=1)
    return train.load_dataset(out)


@pytest.fixture(scope="module")
def trained(dataset: train.Dataset) -> tuple[object, dict]:
    tr, va, _ = train.split(dataset, "plans", seed=0)
    return train.fit(dataset, tr, va, TINY)


def _plans(graph: HloGraph, n: int = 3) -> list[FusionPlan]:
    return [FusionPlan()] + [random_plan(graph, s, n_groups=6) for s in range(n)]


# -- features ----------------------------------------------------------------------------------
@pytest.mark.fast
def test_features_deterministic_and_canonical(graph: HloGraph) -> None:
    plan = random_plan(graph, 3, n_groups=6)
    a = F.fused_graph(F.GraphContext(graph), plan, devices=4)
    b = F.fused_graph(F.GraphContext(graph), plan.replace(groups=plan.groups[::-1]), devices=4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert a.nodes.shape[1] == len(F.NODE_FEATURES) and a.edges.shape[1] == len(F.EDGE_FEATURES)
    assert a.n_node[0] == a.nodes.shape[0] < len(graph)  # zero-cost ops folded away
    assert a.senders.max() < a.n_node[0] and a.receivers.max() < a.n_node[0]


@pytest.mark.fast
def test_groups_contract_into_one_node(graph: HloGraph) -> None:
    ctx = F.GraphContext(graph)
    plan = random_plan(graph, 5, n_groups=6)
    base = F.fused_graph(ctx, plan.replace(groups=()), devices=4)
    fused = F.fused_graph(ctx, plan, devices=4)
    idx = graph.index()
    working = sum(sum(1 for nm in g if graph.nodes[idx[nm]].opcode != "constant") - 1 for g in plan.groups)
    assert base.n_node[0] - fused.n_node[0] == working
    assert (fused.opcodes == F.FUSION_ID).sum() >= len(plan.groups)


@pytest.mark.fast
def test_kernel_features_match_graph_node(graph: HloGraph) -> None:
    from disco.sim.costs import GraphKernels

    plan = random_plan(graph, 7, n_groups=6)
    fg = F.fused_graph(F.GraphContext(graph), plan)
    gk, idx = GraphKernels(graph), graph.index()
    for grp in plan.groups:
        opc, kf = F.kernel_features(gk.kernel([idx[n] for n in grp]))
        hit = (np.abs(fg.nodes[:, :F.N_KERNEL_FEATURES] - kf).max(1) < 1e-5) & (fg.opcodes == opc)
        assert hit.any()


@pytest.mark.fast
def test_unknown_name_is_a_clear_error(graph: HloGraph) -> None:
    with pytest.raises(ValueError, match=r"group 0: instruction 'nope' is not in the graph"):
        F.fused_graph(F.GraphContext(graph), FusionPlan(groups=(("nope",),)))


@pytest.mark.fast
def test_pad_rejects_too_small_sizes(graph: HloGraph) -> None:
    g = F.fused_graph(F.GraphContext(graph), FusionPlan())
    with pytest.raises(ValueError, match=r"too small"):
        F.pad(g, n_node=g.nodes.shape[0])


def test_padding_and_batching_never_change_predictions(graph: HloGraph) -> None:
    from flax import nnx

    from gnn.model import CostGNN

    model = CostGNN(hidden=8, edge_hidden=4, layers=2, opcode_dim=4, rngs=nnx.Rngs(0))
    ctx = F.GraphContext(graph)
    gs = [F.fused_graph(ctx, p, devices=4) for p in _plans(graph)]
    alone = [np.asarray(model(F.pad(g))[1])[0] for g in gs]
    big = F.pad(F.batch(gs), n_node=8192, n_edge=16384, n_graph=8)
    k_log, rel = model(big)
    np.testing.assert_allclose(np.asarray(rel)[:len(gs)], alone, rtol=1e-5, atol=1e-5)
    assert np.isfinite(np.asarray(k_log)).all()


# -- training, checkpoints, cost model ---------------------------------------------------------
def test_training_lowers_the_loss(trained: tuple[object, dict]) -> None:
    _, hist = trained
    assert len(hist["loss"]) >= 2
    assert hist["loss"][-1] < hist["loss"][0]


def test_training_is_deterministic_for_a_seed(dataset: train.Dataset, trained: tuple[object, dict]) -> None:
    tr, va, _ = train.split(dataset, "plans", seed=0)
    _, hist = train.fit(dataset, tr, va, TINY)
    assert hist["loss"] == trained[1]["loss"]


@pytest.mark.fast
def test_split_keeps_plans_apart(dataset: train.Dataset) -> None:
    tr, va, te = train.split(dataset, "plans", seed=0)
    # plans are held out per group (model, preset, devices): a plan of one graph is not one of another
    keys = [{(dataset.samples[i].group, dataset.samples[i].plan.digest()) for i in part} for part in (tr, va, te)]
    assert not (keys[0] & keys[2]) and not (keys[1] & keys[2]) and not (keys[0] & keys[1]) and te
    assert sorted(tr + va + te) == list(range(len(dataset.samples)))
    for model in dataset.models():
        tr, va, te = train.split(dataset, f"lomo:{model}", seed=0)
        assert {dataset.samples[i].model for i in te} == {model}
        assert model not in {dataset.samples[i].model for i in tr + va}
    with pytest.raises(ValueError, match=r"model 'nope' is not in the dataset"):
        train.split(dataset, "lomo:nope")


def test_checkpoint_round_trip_gives_identical_predictions(tmp_path: Path, dataset: train.Dataset,
                                                           trained: tuple[object, dict]) -> None:
    from gnn.cost_model import GnnCosts

    model, _ = trained
    feats = [dataset.features(i) for i in range(4)]
    path = tmp_path / "m.msgpack"
    digest = checkpoint.save(path, model, {"note": "test"})
    model2, meta, digest2 = checkpoint.load(path)
    assert digest == digest2 and meta == {"note": "test"}
    for a, b in zip(train.predict(model, feats), train.predict(model2, feats)):
        np.testing.assert_array_equal(a, b)
    assert not path.read_bytes().startswith(b"\x80")  # not a pickle
    c1, c2 = GnnCosts(model), GnnCosts.load(path)
    assert c2.describe()["digest"] == digest and c2.describe()["name"] == "gnn"
    from disco.sim.costs import GraphKernels

    g = dataset.graphs[dataset.samples[0].fingerprint]
    k = GraphKernels(g).kernel([i for i, n in enumerate(g.nodes) if n.opcode == "add"][:1])
    assert c1.kernel_time(k) == c2.kernel_time(k) > 0


def test_numpy_kernel_head_matches_the_model(dataset: train.Dataset, trained: tuple[object, dict]) -> None:
    import jax.numpy as jnp

    from disco.sim.costs import GraphKernels
    from gnn.cost_model import GnnCosts

    model, _ = trained
    g = dataset.graphs[dataset.samples[0].fingerprint]
    gk = GraphKernels(g)
    costs = GnnCosts(model)
    for i in [i for i, n in enumerate(g.nodes) if n.opcode in ("dot", "add", "multiply")][:5]:
        opc, kf = F.kernel_features(gk.kernel([i]))
        want = math.exp(float(model.kernel_log_time(jnp.array([opc]), jnp.array([kf]))[0]))
        assert costs.kernel_time(gk.kernel([i])) == pytest.approx(want, rel=1e-4)
    assert costs.kernel_time(gk.kernel([i])) and costs.hits >= 1


def test_gnn_costs_in_the_simulator_and_whole_plan_predict(graph: HloGraph, trained: tuple[object, dict]) -> None:
    from disco.sim.cluster import preset
    from disco.sim.simulator import Simulator
    from gnn.cost_model import GnnCosts

    costs = GnnCosts(trained[0])
    sim = Simulator(graph, costs, preset("local", 4))
    plans = _plans(graph)
    times = [sim.step_time(p) for p in plans]
    assert all(math.isfinite(t) and t > 0 for t in times)
    pred = costs.predict(graph, plans, devices=4)
    assert pred.shape == (len(plans),) and np.isfinite(pred).all() and (pred > 0).all()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "pickle", "format"])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path, trained: tuple[object, dict], damage: str) -> None:
    from flax import serialization

    path = tmp_path / "m.msgpack"
    checkpoint.save(path, trained[0])
    data = path.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = b"not a checkpoint at all"
    elif damage == "pickle":
        import pickle

        data = pickle.dumps({"format": checkpoint.FORMAT})
    else:
        raw = serialization.msgpack_restore(data)
        raw["format"] = "something/9"
        data = serialization.msgpack_serialize(raw)
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"m\.msgpack: (not a msgpack checkpoint|expected format)"):
        checkpoint.load(path)


def test_mismatched_checkpoint_is_a_clear_error(tmp_path: Path, trained: tuple[object, dict]) -> None:
    from flax import serialization

    path = tmp_path / "m.msgpack"
    checkpoint.save(path, trained[0])
    raw = serialization.msgpack_restore(path.read_bytes())
    cfg = json.loads(raw["config"])
    raw["config"] = json.dumps({**cfg, "hidden": cfg["hidden"] * 2})
    path.write_bytes(serialization.msgpack_serialize(raw))
    with pytest.raises(ValueError, match=r"has shape .* expected|do not match config"):
        checkpoint.load(path)
    raw["config"] = json.dumps({**cfg, "feature_version": 999})
    path.write_bytes(serialization.msgpack_serialize(raw))
    with pytest.raises(ValueError, match=r"feature version 999"):
        checkpoint.load(path)


def test_default_checkpoint_loads_and_names_itself() -> None:
    from gnn import cost_model

    if not cost_model.DEFAULT_CHECKPOINT.is_file():
        pytest.skip("no default checkpoint shipped yet")
    costs = cost_model.load_default()
    info = costs.describe()
    assert info["name"] == "gnn" and len(info["digest"]) == 16
    assert cost_model.default_metrics().get("checkpoint_digest") == info["digest"]


def test_train_gnn_cli_writes_checkpoint_and_metrics(tmp_path: Path, dataset: train.Dataset) -> None:
    from disco.cli import train_gnn as cli

    src = Path(dataset.source)
    data = tmp_path / "data"
    shutil.copytree(src, data)
    out = tmp_path / "ck.msgpack"
    cli.main(["--data", str(data), "--out", str(out), "--epochs", "1", "--hidden", "8", "--edge-hidden", "4",
              "--layers", "1", "--batch", "8", "--node-budget", "4096", "--quiet", "--limit", "40"])
    metrics = json.loads((tmp_path / "ck_metrics.json").read_text())
    assert metrics["checkpoint_digest"] == checkpoint.load(out)[2]
    held = metrics["heldout_plans"]
    assert {"gnn", "analytic", "gnn_simulated"} <= set(held)
    assert 0.0 <= held["noise_ceiling_tau"] <= 1.0 and "tau_raw" in held["gnn"]


def _samples(times, spread, refs=None):
    refs = refs or [1.0] * len(times)
    out = [train.Sample(model="m", group="m/tiny/d4/x", devices=4, fingerprint="x", plan=FusionPlan(),
                        median_ms=t, ref_ms=r, line=i, min_ms=t * (1 - spread), max_ms=t * (1 + spread))
           for i, (t, r) in enumerate(zip(times, refs))]
    group_ref = float(np.median(refs))
    return [dataclasses.replace(s, group_ref_ms=group_ref) for s in out]


@pytest.mark.fast
def test_norm_ms_removes_the_drift_between_chunks():
    # the same plan measured twice, on a machine twice as slow the second time: same label
    a, b = _samples([2.0, 4.0], 0.0, refs=[1.0, 2.0])
    assert a.norm_ms == pytest.approx(b.norm_ms) == pytest.approx(2.0 / 1.0 * 1.5)


@pytest.mark.fast
def test_noise_ceiling_falls_with_measurement_spread():
    from gnn import evaluate

    times = list(np.linspace(1.0, 2.0, 30))
    exact = types.SimpleNamespace(samples=_samples(times, 0.0))
    noisy = types.SimpleNamespace(samples=_samples(times, 0.3))
    idx = list(range(30))
    assert evaluate.noise_ceiling(exact, idx)["mean"] == pytest.approx(1.0)
    ceiling = evaluate.noise_ceiling(noisy, idx)["mean"]
    assert 0.0 < ceiling < 0.9
    assert evaluate.noise_ceiling(noisy, idx) == evaluate.noise_ceiling(noisy, idx)  # seeded


def test_train_gnn_cli_logs_epochs_when_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Redirected (pytest's capture is not a TTY), train-gnn prints a line per epoch on stderr, not a bar."""
    if not (SMALL / "samples.jsonl").is_file():
        pytest.skip("tests/data/profiles_small has no samples")
    from disco.cli import main

    out = tmp_path / "ck.msgpack"
    rc = main(["train-gnn", "--data", str(SMALL), "--limit", "40", "--epochs", "2", "--hidden", "8",
               "--edge-hidden", "4", "--layers", "1", "--batch", "8", "--node-budget", "4096", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0 and out.is_file()
    lines = [ln for ln in err.splitlines() if "train-gnn: epoch" in ln]
    assert [ln.split("train-gnn: ")[1].split(":")[0] for ln in lines] == ["epoch 0", "epoch 1"], err
    assert "\r" not in err  # no bar redraws


# small enough to train in seconds on the committed samples
_FAST = ["--epochs", "1", "--hidden", "8", "--edge-hidden", "4", "--layers", "1", "--batch", "8", "--node-budget", "4096"]


def _train_gnn(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    if not (SMALL / "samples.jsonl").is_file():
        pytest.skip("tests/data/profiles_small has no samples")
    from disco.cli import main

    rc = main(["train-gnn", "--data", str(SMALL), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_train_gnn_writes_to_the_current_directory_by_default_not_the_shipped_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gnn import cost_model

    shipped = cost_model.DEFAULT_CHECKPOINT.read_bytes() if cost_model.DEFAULT_CHECKPOINT.is_file() else None
    monkeypatch.chdir(tmp_path)
    rc, out, err = _train_gnn([*_FAST, "--no-progress"], capsys)
    assert rc == 0, err
    assert (tmp_path / "gnn_checkpoint.msgpack").is_file() and (tmp_path / "gnn_checkpoint_metrics.json").is_file()
    if shipped is not None:
        assert cost_model.DEFAULT_CHECKPOINT.read_bytes() == shipped
    # a readable summary: tau as a number, MAPE and regrets in percent, no dict reprs
    assert re.search(r"gnn graph head: +tau -?\d\.\d{3} \(raw -?\d\.\d{3}\), MAPE \d+\.\d%, "
                     r"top-1 regret \d+\.\d% \(worst group \d+\.\d%\), top-5 regret \d+\.\d%; 6 samples", out), out
    assert "{" not in out and "nan" not in out, out


@pytest.mark.fast
@pytest.mark.parametrize("flag", ["--out", "--metrics"])
def test_train_gnn_refuses_to_write_over_the_shipped_files(
        flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gnn import cost_model

    shipped = (cost_model.DEFAULT_CHECKPOINT, cost_model.DEFAULT_METRICS)
    if not all(f.is_file() for f in shipped):
        pytest.skip("no checkpoint and metrics shipped")
    target = shipped[0] if flag == "--out" else shipped[1]
    before = [f.read_bytes() for f in shipped]
    try:
        rc, _, err = _train_gnn([*_FAST, "--limit", "40", "--out", str(tmp_path / "ck.msgpack"), flag, str(target)],
                                capsys)
    finally:
        changed = [f.name for f, b in zip(shipped, before) if f.read_bytes() != b]
        for f, b in zip(shipped, before):  # restore the package's files whatever the command did
            if f.name in changed:
                f.write_bytes(b)
    assert not changed
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"disco train-gnn: error: {flag} ") and "--overwrite-shipped" in err, err


@pytest.mark.fast
@pytest.mark.parametrize("flag, path", [("--out", "missing/ck.msgpack"), ("--metrics", "missing/m.json")])
def test_train_gnn_checks_output_paths_before_training(
        flag: str, path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--out", str(tmp_path / "ck.msgpack"), flag, str(tmp_path / path)]
    rc, _, err = _train_gnn([*_FAST, "--limit", "40", *args], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"disco train-gnn: error: {flag} ") and "does not exist" in err, err
    assert "train-gnn: epoch" not in err and not (tmp_path / "ck.msgpack").exists()  # failed before training


@pytest.mark.fast
@pytest.mark.parametrize("flag, value", [("--lr", "-1"), ("--lr", "0"), ("--lr", "nan"), ("--lr", "inf"),
                                         ("--epochs", "0"), ("--lomo-epochs", "0"), ("--batch", "0"),
                                         ("--node-budget", "0"), ("--hidden", "0"), ("--edge-hidden", "0"),
                                         ("--layers", "0"), ("--limit", "0")])
def test_train_gnn_rejects_bad_hyperparameters_up_front(
        flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ck.msgpack"
    rc, _, err = _train_gnn([*_FAST, "--limit", "40", "--lomo", "--out", str(out), flag, value], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert re.match(rf"disco train-gnn: error: {flag} \S+: expected (an integer >= 1|a finite number > 0)", err), err
    assert "train-gnn: epoch" not in err and not out.exists()


def _params(path: Path) -> dict[str, np.ndarray]:
    from flax import nnx

    from gnn.params import flat

    return {k: np.asarray(v) for k, v in flat(nnx.to_pure_dict(nnx.state(checkpoint.load(path)[0]))).items()}


def test_train_gnn_init_fine_tunes_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--init CK`` starts from CK's weights: at a learning rate too small to move them the result
    is CK's weights (a fresh model at that rate is not), with CK's architecture, and the metrics name CK."""
    ck1, ck2, fresh = (tmp_path / f"{n}.msgpack" for n in ("ck1", "ck2", "fresh"))
    rc, _, err = _train_gnn([*_FAST, "--limit", "40", "--out", str(ck1), "--no-progress"], capsys)
    assert rc == 0, err
    still = ["--epochs", "1", "--batch", "8", "--node-budget", "4096", "--limit", "40", "--lr", "1e-12", "--no-progress"]
    rc, out, err = _train_gnn([*still, "--init", str(ck1), "--out", str(ck2)], capsys)
    assert rc == 0, err
    digest = checkpoint.load(ck1)[2]
    assert f"init: {ck1} (digest {digest}), trained on " in out, out
    a, b = _params(ck1), _params(ck2)
    assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], atol=1e-6) for k in a)
    meta = json.loads((tmp_path / "ck2_metrics.json").read_text())
    assert meta["init"]["digest"] == digest
    assert meta["init"]["data"] == json.loads((tmp_path / "ck1_metrics.json").read_text())["data"]  # what trained ck1
    assert (meta["train_config"]["hidden"], meta["train_config"]["layers"]) == (8, 1)  # the checkpoint's, not the defaults
    rc, _, err = _train_gnn([*still, "--hidden", "8", "--edge-hidden", "4", "--layers", "1", "--out", str(fresh)], capsys)
    assert rc == 0, err
    c = _params(fresh)
    assert not all(np.allclose(a[k], c[k], atol=1e-6) for k in a)  # training from scratch does not land on ck1
    # the architecture cannot change in a fine-tune
    rc, _, err = _train_gnn([*still, "--init", str(ck1), "--hidden", "16", "--out", str(tmp_path / "x.msgpack")], capsys)
    assert rc == 2 and "--hidden 16: the --init checkpoint has 8; leave the flag out" in err, err
    assert not (tmp_path / "x.msgpack").exists()


@pytest.mark.fast
@pytest.mark.parametrize("extra, says", [
    (["--init", "nowhere.msgpack"], "--init 'nowhere.msgpack': no such file; expected a checkpoint"),
    (["--init", "shipped", "--lomo"], "--lomo with --init: every leave-one-model-out run would start from weights"),
])
def test_train_gnn_init_refuses_what_it_cannot_fine_tune(extra: list[str], says: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ck.msgpack"
    rc, _, err = _train_gnn([*_FAST, "--limit", "40", "--out", str(out), *extra], capsys)
    assert rc == 2 and err.count("\n") == 1 and says in err, err
    assert "train-gnn: epoch" not in err and not out.exists()


def test_train_gnn_says_why_tau_is_undefined_on_too_few_samples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """4 samples of one group: one held-out sample, so no tau and no noise ceiling; said in words,
    without numpy's warnings (errors here: pyproject's filterwarnings)."""
    rc, out, err = _train_gnn([*_FAST, "--limit", "4", "--out", str(tmp_path / "ck.msgpack")], capsys)
    assert rc == 0, err
    assert "1 test sample" in out and "{" not in out and "nan" not in out, out
    assert re.search(r"gnn graph head: +tau undefined \(no group has 2 or more of these samples\), MAPE \d+\.\d%", out)
    assert re.search(r"noise ceiling of tau: +undefined", out), out
    assert "val tau undefined (no validation group of 2 or more samples)" in err, err


@pytest.mark.fast
def test_a_damaged_graph_file_is_named(tmp_path: Path) -> None:
    """A graph file cut short: the error names the file and the sample's line (it said only
    'graph JSON is not valid JSON')."""
    import shutil

    data = tmp_path / "profiles"
    shutil.copytree(SMALL, data)
    damaged = sorted((data / "graphs").iterdir())[0]
    damaged.write_text(damaged.read_text()[:100])
    with pytest.raises(ValueError, match=rf"samples\.jsonl:\d+: .*{damaged.name}: graph JSON is not valid JSON"):
        train.load_dataset(data)


@pytest.mark.fast
@pytest.mark.parametrize("damage, match", [
    (lambda s: s.pop("plan"), r"KeyError: 'plan'"),
    (lambda s: s.pop("model"), r"KeyError: 'model'"),
    (lambda s: s.__setitem__("devices", "four"), r"invalid literal for int"),
    (lambda s: s.__setitem__("plan", {"groups": 5}), r"plan field"),
])
def test_a_damaged_sample_is_named_by_file_and_line(tmp_path: Path, damage, match: str) -> None:
    """A sample with a time but a missing or malformed field: a ValueError naming the file and line
    (a missing field was a KeyError traceback, a malformed one a ValueError naming neither)."""
    data = tmp_path / "profiles"
    shutil.copytree(SMALL, data)
    lines = (data / "samples.jsonl").read_text().splitlines()
    sample = json.loads(lines[3])
    damage(sample)
    lines[3] = json.dumps(sample)
    (data / "samples.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"samples\.jsonl:4: sample '.*': damaged fields \(.*{match}"):
        train.load_dataset(data)


@pytest.mark.fast
def test_an_infinite_reference_time_falls_back_to_the_group_default(tmp_path: Path) -> None:
    """A sample whose reference_xla_default_median_ms is Infinity takes its group's measured xla_default,
    as a missing one does; it was taken as is (a target of log(0), its group's norm_ms infinite)."""
    data = tmp_path / "profiles"
    shutil.copytree(SMALL, data)
    lines = (data / "samples.jsonl").read_text().splitlines()
    sample = json.loads(lines[3])
    sample["reference_xla_default_median_ms"] = float("inf")
    lines[3] = json.dumps(sample)
    (data / "samples.jsonl").write_text("\n".join(lines) + "\n")
    ds = train.load_dataset(data)
    assert len(ds.samples) == 30
    assert all(math.isfinite(s.ref_ms) and math.isfinite(s.norm_ms) for s in ds.samples)
    abs_t, rel_t = train._targets(ds, range(len(ds.samples)), len(ds.samples))
    assert np.isfinite(abs_t).all() and np.isfinite(rel_t).all()

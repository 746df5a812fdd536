"""disco collect: resumable JSONL samples of measured plans."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from disco.data import dataset
from disco.data.collect import CollectConfig, collect
from disco.ir.graph import HloGraph
from disco.plans.plan import FusionPlan
from tests.support.paths import DATA, REPO

BASELINES = ("xla_default", "one_bucket")
KEYS = {"sample_id", "model", "preset", "devices", "graph_fingerprint", "plan", "measured",
        "reference_xla_default_median_ms", "compiled", "versions", "device", "created"}


def _config(out, random=2, **kw):
    return CollectConfig(models=("mlp",), out=str(out), preset="tiny", devices=4, random=random, rounds=1,
                         steps=1, baselines=BASELINES, **kw)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("collect")
    summary = collect(_config(out), show_progress=False, log=lambda m: None)
    return out, summary


def _ids(out):
    samples, _, bad = dataset.read(dataset.samples_path(out))
    return [s["sample_id"] for s in samples], samples, bad


def test_collect_writes_valid_samples(first_run):
    out, summary = first_run
    ids, samples, bad = _ids(out)
    assert bad == 0
    assert summary.written == len(samples) == len(set(ids))
    assert summary.written + summary.duplicates + summary.invalid_plans == len(BASELINES) + 2
    assert {s["kind"] for s in samples} >= {"baseline", "random", "random_buckets"}
    for s in samples:
        assert KEYS <= set(s)
        graph = HloGraph.from_json(dataset.read_graph_json(out, s["graph_fingerprint"]))
        plan = FusionPlan.from_dict(s["plan"]).validate(graph)
        assert s["sample_id"] == dataset.sample_id("mlp", "tiny", 4, plan.digest()) and s["schema"] == dataset.SCHEMA
        m = s["measured"]
        assert 0 < m["min_ms"] <= m["median_ms"] <= m["max_ms"] and m["rounds"] == 1
        assert s["reference_xla_default_median_ms"] > 0
        assert s["device"]["count"] == 4 and s["versions"]["jax"]


def test_second_run_skips_all(first_run, tmp_path):
    out, summary = first_run
    copy = tmp_path / "again"
    shutil.copytree(out, copy)
    again = collect(_config(copy), show_progress=False, log=lambda m: None)
    assert again.written == 0 and again.skipped == summary.written


def test_truncated_last_line_is_cut_and_reported(first_run, tmp_path):
    out, summary = first_run
    copy = tmp_path / "trunc"
    shutil.copytree(out, copy)
    path = copy / "samples.jsonl"
    with open(path, "a") as f:
        f.write('{"sample_id": "mlp/tiny/d4/abc", "meas')
    msgs = []
    samples, lines, bad = dataset.read(path, repair=True, report=msgs.append)
    assert bad == 1 and len(samples) == summary.written
    assert any("truncated last line" in m for m in msgs)
    assert path.read_bytes().endswith(b"\n")
    assert dataset.read(path) == (samples, lines, 0)


def test_killed_collector_resumes_without_duplicates(tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, os.path.join(str(REPO), "scripts", "tools", "collect_profiles.py"), "--models", "mlp",
           "--preset", "tiny", "--devices", "4", "--random", "1", "--rounds", "1", "--steps", "1",
           "--baselines", ",".join(BASELINES), "--interleave", "1", "--no-progress", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = out / "samples.jsonl"
    deadline = time.monotonic() + 80
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists() and path.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert path.exists(), "the collector wrote nothing before the deadline"
    before = len(_ids(out)[0])
    summary = collect(_config(out, random=1, interleave=1), show_progress=False, log=lambda m: None)
    ids, samples, _ = _ids(out)
    assert len(ids) == len(set(ids)) == summary.written + summary.skipped
    assert summary.skipped >= before >= 1
    assert len(ids) + summary.duplicates + summary.invalid_plans == len(BASELINES) + 1
    assert all(json.loads(json.dumps(s)) == s for s in samples)


@pytest.mark.fast
def test_committed_small_dataset_is_valid():
    data = str(DATA / "profiles_small")
    samples, _, bad = dataset.read(dataset.samples_path(data))
    assert bad == 0 and 20 <= len(samples) and {s["model"] for s in samples} == {"mlp", "transformer_lm"}
    assert len({s["sample_id"] for s in samples}) == len(samples)
    graphs = {}
    for s in samples:
        fp = s["graph_fingerprint"]
        if fp not in graphs:
            graphs[fp] = HloGraph.from_json(dataset.read_graph_json(data, fp))
        FusionPlan.from_dict(s["plan"]).validate(graphs[fp])
        assert s["applied"] and s["measured"]["median_ms"] > 0


@pytest.mark.fast
def test_bad_counts_and_names_are_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "d"
    with pytest.raises(ValueError, match=r"^collect: devices 0 \(expected >= 1\), random -1 \(expected >= 0\)$"):
        collect(CollectConfig(models=("mlp",), out=str(out), devices=0, random=-1), show_progress=False)
    # --interleave 0 was measured as 1 plan per chunk, without a word
    with pytest.raises(ValueError, match=r"^collect: interleave 0 \(expected >= 1\)$"):
        collect(CollectConfig(models=("mlp",), out=str(out), interleave=0), show_progress=False)
    with pytest.raises(ValueError, match=r"^unknown baselines \['nosuch'\]; expected some of: xla_default"):
        collect(CollectConfig(models=("mlp",), out=str(out), baselines=("nosuch",)),
                show_progress=False)
    assert not out.exists()


def _foreign_sample(out, **fields):
    """A sample of mlp/tiny/d4's xla_default plan, as another run wrote it."""
    os.makedirs(out, exist_ok=True)
    rec = {"sample_id": dataset.sample_id("mlp", "tiny", 4, FusionPlan().digest()), "model": "mlp",
           "preset": "tiny", "devices": 4, "optimizer": "adamw", **fields}
    dataset.append(dataset.samples_path(out), rec)
    return dataset.samples_path(out)


@pytest.mark.fast
def test_samples_of_another_optimizer_are_refused_before_anything_is_built(tmp_path):
    """Sample ids leave the optimizer out: collecting --optimizer sgd into a directory of adamw samples
    skipped every plan as already measured (measured: 9 of 10 mlp plans) and wrote almost nothing."""
    path = _foreign_sample(tmp_path / "d", graph_fingerprint="f" * 32)
    before = Path(path).read_bytes()
    with pytest.raises(ValueError, match=r"samples\.jsonl holds samples of mlp/tiny/d4 with optimizer adamw, but "
                                         r"this run measures --optimizer sgd .*give another --out"):
        collect(_config(tmp_path / "d", random=0, optimizer="sgd"), show_progress=False, log=lambda m: None)
    assert Path(path).read_bytes() == before


def test_samples_of_another_graph_of_the_same_step_are_refused(tmp_path):
    """The same model, preset, devices and optimizer traced to another graph (another jax, changed model
    code): its plans were skipped as measured, though measured on another program."""
    path = _foreign_sample(tmp_path / "d", graph_fingerprint="f" * 32)
    before = Path(path).read_bytes()
    with pytest.raises(ValueError, match=r"holds samples of mlp/tiny/d4 measured on graph f{32}, but this step's "
                                         r"graph is [0-9a-f]{32} .*give another --out"):
        collect(_config(tmp_path / "d", random=0), show_progress=False, log=lambda m: None)
    assert Path(path).read_bytes() == before


def test_progress_counts_a_baseline_given_twice_once(tmp_path):
    """--baselines xla_default,xla_default builds one plan; the progress total counted two, so the
    last line said [1/2] with time left."""
    msgs = []
    collect(CollectConfig(models=("mlp",), out=str(tmp_path / "d"), devices=4, random=0, rounds=1, steps=1,
                          baselines=("xla_default", "xla_default")), log=msgs.append)
    lines = [m for m in msgs if m.startswith("[")]
    assert lines and lines[-1].startswith("[1/1] mlp: measuring 1 elapsed") and lines[-1].endswith("ETA 0:00:00")

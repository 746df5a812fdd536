"""disco.data.dataset: the one reader and writer of samples.jsonl (round trip, tolerance, repair)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from disco.data import dataset
from tests.support.paths import DATA, REPO

SMALL = str(DATA / "profiles_small")


def sample(i, **extra):
    return {"sample_id": dataset.sample_id("mlp", "tiny", 4, f"{i:016x}"), "model": "mlp", "preset": "tiny",
            "devices": 4, "graph_fingerprint": "401ed8c98fdc62b9", "measured": {"median_ms": 1.0 + i}, **extra}


@pytest.mark.fast
def test_ids_name_the_step_and_the_plan():
    assert dataset.sample_id("mlp", "tiny", 4, "a3dafcf73eaefc13") == "mlp/tiny/d4/a3dafcf73eaefc13"
    assert dataset.group_key(sample(0)) == "mlp/tiny/d4/401ed8c9"
    assert dataset.group_key({"model": "bert", "graph_fingerprint": "ffeeddccbb"}) == "bert//d1/ffeeddcc"


@pytest.mark.fast
def test_round_trip_keeps_every_sample_and_its_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    assert dataset.read(path) == ([], [], 0)  # a missing file reads as empty
    written = [sample(i, plan={"name": f"p{i}", "groups": [[1, 2]]}) for i in range(5)]
    for s in written:
        dataset.append(path, s)
    found = dataset.read(path)
    assert found.samples == written and found.lines == [1, 2, 3, 4, 5] and found.skipped == 0
    assert path.read_text().count("\n") == 5
    with pytest.raises(ValueError, match=r"a sample needs a 'sample_id'; got keys \['model'\]"):
        dataset.append(path, {"model": "mlp"})


@pytest.mark.fast
def test_lines_that_are_not_samples_are_skipped_and_reported(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join([json.dumps(sample(0)), "not json", "", json.dumps({"model": "no id"}),
                               "[1, 2]", json.dumps(sample(1))]) + "\n")
    msgs = []
    found = dataset.read(path, repair=True, report=msgs.append)
    assert [s["sample_id"] for s in found.samples] == [sample(0)["sample_id"], sample(1)["sample_id"]]
    assert found.lines == [1, 6] and found.skipped == 3
    assert msgs == [f"{path}:{n}: ignoring a line that is not a sample" for n in (2, 4, 5)]
    assert path.read_text().count("\n") == 6  # lines before the last are never cut


@pytest.mark.fast
def test_repair_cuts_a_truncated_last_line_and_ends_an_unterminated_one(tmp_path):
    path = tmp_path / "samples.jsonl"
    dataset.append(path, sample(0))
    good = path.read_bytes()
    with open(path, "a") as f:
        f.write('{"sample_id": "mlp/tiny/d4/abc", "meas')
    msgs = []
    assert dataset.read(path, report=msgs.append).skipped == 1 and path.read_bytes() != good  # no repair: kept
    found = dataset.read(path, repair=True, report=msgs.append)
    assert found.samples == [sample(0)] and found.skipped == 1 and path.read_bytes() == good
    assert msgs[-1] == f"{path}:2: ignoring a truncated last line (38 bytes), cut off"
    with open(path, "a") as f:
        f.write(json.dumps(sample(1)))  # valid, but no newline
    assert dataset.read(path, repair=True).samples == [sample(0), sample(1)]
    assert path.read_bytes().endswith(b"}\n")
    dataset.append(path, sample(2))
    assert dataset.read(path) == ([sample(0), sample(1), sample(2)], [1, 2, 3], 0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
records = st.dictionaries(st.text(max_size=10), json_values, max_size=5).flatmap(
    lambda d: st.text(min_size=1, max_size=30).map(lambda sid: {**d, "sample_id": sid}))


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(st.lists(records, max_size=6), records, st.data())
def test_any_records_round_trip_and_survive_a_crash_mid_write(written, torn, data):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "samples.jsonl")
        for r in written:
            dataset.append(path, r)
        assert dataset.read(path) == (written, list(range(1, len(written) + 1)), 0)
        line = dataset.encode(torn)
        cut = data.draw(st.integers(1, len(line.encode()) - 2), label="bytes of the torn line written")
        with open(path, "ab") as f:  # a crash mid-write leaves a proper prefix of the line
            f.write(line.encode()[:cut])
        found = dataset.read(path, repair=True)
        assert found.samples == written and found.skipped == 1
        dataset.append(path, torn)
        assert dataset.read(path).samples == [*written, torn]


@pytest.mark.fast
def test_graph_files_are_written_once_and_read_back(tmp_path):
    path = dataset.write_graph(tmp_path, "abc", '{"g": 1}')
    assert path == os.path.join(tmp_path, "graphs", "abc.json")
    assert dataset.write_graph(tmp_path, "abc", '{"g": 2}') == path  # a fingerprint names one graph
    assert dataset.read_graph_json(tmp_path, "abc") == '{"g": 1}'
    with pytest.raises(ValueError, match=r"graph nope is missing; expected .*graphs/nope.json"):
        dataset.read_graph_json(tmp_path, "nope")


@pytest.mark.fast
def test_the_collector_and_the_gnn_trainer_read_a_torn_file_alike(tmp_path):
    copy = tmp_path / "profiles"
    shutil.copytree(SMALL, copy)
    with open(copy / "samples.jsonl", "a") as f:
        f.write('{"sample_id": "mlp/tiny/d4/abc", "meas')
    found = dataset.read(dataset.samples_path(copy))
    assert found.skipped == 1 and len(found.samples) == 30
    from gnn import train

    ds = train.load_dataset(copy)
    usable = [ln for ln, s in zip(found.lines, found.samples) if s.get("applied") is not False]
    assert ds.skipped == 1 + len(found.samples) - len(usable)
    assert [s.line for s in ds.samples] == usable


def test_reading_a_dataset_imports_no_jax():
    code = ("import sys\nfrom disco.data import dataset\n"
            f"assert len(dataset.read(dataset.samples_path({SMALL!r})).samples) == 30\n"
            "assert 'jax' not in sys.modules and 'numpy' not in sys.modules, 'disco.data.dataset imported jax/numpy'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.fast
def test_a_built_sample_names_its_plan_and_reference_and_keeps_the_writers_fields():
    from disco.plans.plan import FusionPlan

    plan = FusionPlan(groups=(("add.1", "mul.2"),), name="two")
    line = dataset.sample(model="mlp", preset="g", devices=2, graph_fingerprint="abc", kind="optimize", plan=plan,
                          measured={"median_ms": 4.0, "min_ms": 3.0, "max_ms": 5.0, "rounds": 9, "steps": 3},
                          reference_ms=8.0, created=0.0, plan_name="disco_1", applied=True)
    assert line["sample_id"] == dataset.sample_id("mlp", "g", 2, plan.digest())
    assert line["plan"] == plan.to_dict() and line["plan_digest"] == plan.digest()
    assert line["plan_name"] == "disco_1"  # the writer's name wins over the plan's own
    assert line["ratio_to_reference"] == 0.5 and line["created"] == "1970-01-01T00:00:00Z"
    assert line["applied"] is True and dataset.is_sample(json.loads(dataset.encode(line)))
    assert dataset.sample(model="mlp", preset="g", devices=2, graph_fingerprint="abc", kind="trial", plan=plan,
                          measured={"median_ms": 4.0}, reference_ms=None)["ratio_to_reference"] is None
    for bad in (0.0, -1.0, float("nan"), None):
        with pytest.raises(ValueError, match="median_ms: expected a positive finite time"):
            dataset.sample(model="mlp", preset="g", devices=2, graph_fingerprint="abc", kind="trial", plan=plan,
                           measured={"median_ms": bad}, reference_ms=8.0)


@pytest.mark.fast
def test_an_output_directory_is_made_and_lists_what_it_holds(tmp_path):
    out, have = dataset.output_dir(tmp_path / "new")
    assert os.path.isdir(out) and have == set()
    dataset.append(dataset.samples_path(out), sample(1))
    assert dataset.output_dir(out)[1] == {sample(1)["sample_id"]}
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="expected a dataset directory, got the file"):
        dataset.output_dir(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "x"

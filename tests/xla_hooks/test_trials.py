"""Trials inside the job (issue 43): the decision every process shares, the trial steps, the service's
candidates, ``/v1/trials`` and the measured answer on both stores, the schema's version 3, and the
trials as training data for the cost model.

The protocol runs over the in-memory key-value store of tests/support/stubs.py (threads as
processes); the real multi-process jobs are in tests/xla_hooks/test_trials_job.py.
"""

from __future__ import annotations

import functools
import threading
import time

import pytest

from tests.support.stubs import MemoryKV
from xla_hooks import agreement
from xla_hooks.agreement import Outcome, Round
from xla_hooks.trials import Candidate, TrialRun, with_default


# -- the decision --------------------------------------------------------------------------------
def test_choose_counts_each_step_on_its_slowest_process():
    # candidate 0 is fastest on process 0, but process 1 makes its steps slow; ties go to the first
    samples = [[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]],
               [[5.0, 5.0, 5.0], [2.0, 2.5, 2.0]]]
    assert agreement.choose(samples) == 1
    assert agreement.choose([[[3.0], [3.0], [1.0]]]) == 2
    assert agreement.choose([[[1.0], [1.0]]]) == 0
    with pytest.raises(ValueError, match=r"candidate 0: expected the same number \(>= 1\) of steps on every "
                                         r"process, got \[2, 1\]"):
        agreement.choose([[[1.0, 1.0]], [[1.0]]])
    with pytest.raises(ValueError, match=r"expected the same candidates on every process, got \[2, 1\]"):
        agreement.choose([[[1.0], [1.0]], [[1.0]]])


def _trial_round(processes, samples, *, skip=(), timeout_s=2.0):
    kv = MemoryKV()
    out = {}

    def process(p):
        rnd = Round(kv, "disco/xla_hooks/trial/0", "prog", p, processes, timeout_s)
        out[p] = agreement.agree_winner(rnd, samples[p])

    threads = [threading.Thread(target=process, args=(p,)) for p in range(processes) if p not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("processes", [2, 4])
def test_every_process_keeps_the_winner_process_0_chose_from_all_times(processes):
    # on its own each process would keep another candidate; the slowest process decides
    # (process 0 alone would keep candidate 2, the others candidate 0: each step on its slowest process, 1)
    samples = {p: [[1.0, 1.0], [2.0, 2.0], [5.0, 5.0]] for p in range(processes)}
    samples[0] = [[5.0, 5.0], [2.0, 2.0], [1.0, 1.0]]
    out = _trial_round(processes, samples)
    assert {w for w, _, _ in out.values()} == {1}
    assert all(o.ok for _, _, o in out.values())
    every = [e for _, e, _ in out.values()]
    assert all(e == [samples[p] for p in range(processes)] for e in every)  # one table on every process


def test_a_process_without_times_is_named_and_the_rest_decide():
    samples = {0: [[3.0], [2.0]], 1: [[1.0], [0.5]], 2: [[9.0], [0.5]]}
    out = _trial_round(3, samples, skip={2}, timeout_s=0.3)
    winner, every, outcome = out[0]
    assert winner == 1 and len(every) == 2 and outcome.ok
    assert outcome.reason == ("process 2 sent no step times within 0.3 s (waited for key "
                              "'disco/xla_hooks/trial/0/timings/2')")
    assert out[1][0] == 1 and out[1][2].reason == outcome.reason  # the others are told who was left out


def test_a_process_that_gets_no_winner_keeps_the_predicted_best_and_says_why():
    rnd = Round(MemoryKV(), "disco/xla_hooks/trial/0", "prog", 1, 2, 0.1)
    winner, every, outcome = agreement.agree_winner(rnd, [[1.0], [0.5]])
    assert (winner, every, outcome.kind) == (0, None, agreement.TIMEOUT)
    assert outcome.reason == ("process 1 got no trial winner from process 0 within 0.2 s (waited for key "
                              "'disco/xla_hooks/trial/0/winner'); it keeps candidate 0")


def test_a_candidate_that_does_not_apply_on_one_process_is_dropped_on_all():
    kv = MemoryKV()
    decisions = {}
    masks = {0: (True, True, True), 1: (True, False, True), 2: (True, True, True)}

    def process(p):
        rnd = Round(kv, "disco/xla_hooks/cands/0", "prog", p, 3, 2.0)
        why = None if all(masks[p]) else f"candidate 'b' did not apply on process {p}"
        decisions[p] = agreement.decide(rnd, Outcome(None, why, masks[p]))

    threads = [threading.Thread(target=process, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {d.applied for d in decisions.values()} == {(True, False, True)}
    assert all(d.ok and d.reason == "candidate 'b' did not apply on process 1" for d in decisions.values())
    none = agreement.combine_candidates([Outcome(None, "x on 0", (False, True)), Outcome(None, "y on 1", (True, False))])
    assert none.kind == agreement.APPLY and none.reason == "no candidate plan applied on every process (x on 0; y on 1)"


def test_an_agreement_report_round_trips_its_candidates_and_refuses_garbage():
    o = Outcome(None, "r", (True, False))
    assert Outcome.from_bytes(o.to_bytes(), "k") == o
    assert Outcome.from_bytes(Outcome().to_bytes(), "k") == Outcome()
    bad = Outcome.from_bytes(b'{"kind": null, "reason": null, "applied": [1]}', "key 'x'")
    assert bad.kind == agreement.RECEIVE and "key 'x' is not an agreement report" in bad.reason


# -- the trial steps ---------------------------------------------------------------------------------
class _Step:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, x):
        self.calls.append(self.name)
        return x + 1


def test_trial_steps_go_round_the_candidates_and_finish_once():
    pytest.importorskip("jax")
    calls, finished = [], []
    cands = [Candidate("a", 1.0, None), Candidate("b", 2.0, None)]
    run = TrialRun(cands, [_Step("a", calls), _Step("b", calls)], 3, finished.append)
    x = 0
    for _ in range(6):
        x = run(x)
    assert x == 6 and calls == ["a", "b", "a", "b", "b", "a"]  # in rounds: the given order, then the design's rows
    (samples,) = finished
    assert [len(s) for s in samples] == [2, 2] and all(t > 0 for s in samples for t in s)  # first round untimed
    with pytest.raises(ValueError, match="expected one compiled step per candidate, got 2 candidates and 1"):
        TrialRun(cands, [_Step("a", calls)], 3, finished.append)


def test_xla_default_is_measured_once():
    plan = Candidate("p", 1.0, object())
    assert [c.name for c in with_default([plan], {"baselines_ms": {"xla_default": 3.0}})] == ["p", "xla_default"]
    assert with_default([plan], {"baselines_ms": {"xla_default": 3.0}})[1].predicted_ms == 3.0
    assert [c.name for c in with_default([Candidate("xla_default", 1.0, None), plan], None)] == ["xla_default", "p"]


def test_jit_refuses_trial_settings_it_cannot_run():
    import xla_hooks

    with pytest.raises(ValueError, match=r"^trials: expected an integer >= 0, got -1"):
        xla_hooks.jit(lambda x: x, trials=-1)
    with pytest.raises(ValueError, match=r"^trial_steps: expected an integer >= 1, got 0"):
        xla_hooks.jit(lambda x: x, trials=2, trial_steps=0)
    with pytest.raises(ValueError, match=r"^trials: expected at most 8 candidates"):
        xla_hooks.jit(lambda x: x, trials=9)


@pytest.mark.slow  # 17 s on 2 loaded cores; the 2-process job of tests/xla_hooks/test_trials_job.py runs the same steps
def test_a_single_process_job_measures_its_candidates_and_keeps_the_fastest():
    """The local planner's candidates (service=None) on one process: the first steps go to each in
    turn, the fastest is kept, and every step's loss is jax.jit's."""
    import jax
    import numpy as np

    import trax_models
    import xla_hooks

    step, (state0, batch) = trax_models.make_train_step("mlp", "tiny", devices=1, optimizer="sgd")
    planned = xla_hooks.jit(step, cluster="local", trials=2, trial_steps=2,
                            options={"budget_s": 0.5, "strategy": "baselines"})
    reference, state, ref_state = jax.jit(step), state0, state0
    measured_after = None
    for i in range(8):
        state, loss = planned(state, batch)
        ref_state, ref_loss = reference(ref_state, batch)
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5, atol=1e-7)
        if planned.trials and measured_after is None:
            measured_after = i + 1
    (table,) = planned.trials.values()
    # the planner's plan and the next best baseline, and XLA's default unless it is one of them
    assert len(table) in (2, 3) and "xla_default" in [t["name"] for t in table]
    assert measured_after == 2 * len(table)  # 2 rounds, then the winner is installed
    assert sum(t["winner"] for t in table) == 1
    fastest = min(table, key=lambda t: t["measured_ms"])
    assert fastest["winner"]
    (applied,) = planned.applied.values()
    (report,) = planned.reports.values()
    assert applied.plan.digest() == fastest["plan_digest"] and report["trials"] == table


# -- the service ---------------------------------------------------------------------------------------
BACKENDS = ["sqlite", "postgresql"]


def _database(request, backend, tmp_path, name):
    if backend == "sqlite":
        return str(tmp_path / f"{name}.sqlite")
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture(params=BACKENDS)
def app(request, tmp_path):
    from service import create_app
    from service.jobs import stop_runner

    app = create_app({"DATABASE": _database(request, request.param, tmp_path, "app"), "WORKERS": 1,
                      "TESTING": True})
    yield app
    stop_runner(app)


@functools.cache
def _mlp_hlo() -> str:
    import disco
    import trax_models

    step, args = trax_models.make_train_step("mlp", "tiny", devices=4, optimizer="sgd")
    return disco.hlo_text(step, *args)


def _rows(db, query):
    from service.store import Store

    with Store(str(db)) as store:
        return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in store._x(query).fetchall()]


def _plan_body(**extra):
    plan_body = {"hlo_text": _mlp_hlo(), "cluster": "local", "devices": 4,
                 "options": {"budget_s": 1.0, "strategy": "baselines", "seed": 0}}
    return {**plan_body, "environment": {"jax": "0.10.2", "jaxlib": "0.10.2", "platform": "cpu",
                                           "device_kind": "cpu", "processes": 2, "devices_per_process": 2,
                                           "xla_flags": []}, **extra}


def _answer(client, body):
    r = client.post("/v1/plans", json=body)
    deadline = time.monotonic() + 60
    while r.status_code == 202 and time.monotonic() < deadline:
        time.sleep(0.05)
        job = client.get(f"/v1/jobs/{r.json['job_id']}").json
        if job["state"] == "done":
            return client.post("/v1/plans", json=body).json
        assert job["state"] != "failed", job
    assert r.status_code == 200, r.json
    return r.json


def _trial_report(answer, winner, samples=((3.0, 2.0, 2.5), (2.0, 2.0, 2.2))):
    return {"key": answer["key"], "run_id": "run1", "winner": winner,
            "trials": [{"plan": c["plan"], "name": c["name"], "predicted_ms": c["predicted_ms"],
                        "samples_ms": [list(s) for s in samples]} for c in answer["candidates"]]}


def test_candidates_trials_and_the_measured_winner(app):
    """A request with candidates gets the plan first and the next best baselines; the times a job
    reports are stored under the key; from then on the key is answered its measured winner."""
    client = app.test_client()
    old = _answer(client, _plan_body())
    assert "candidates" not in old and "candidates" not in old["report"]  # an old client's answer
    answer = _answer(client, _plan_body(candidates=3))
    assert answer["key"] == old["key"]  # candidates are not part of the key
    names = [c["name"] for c in answer["candidates"]]
    assert len(names) == 3 and answer["candidates"][0]["plan"] == answer["plan"]
    assert len({c["plan"]["name"] for c in answer["candidates"]}) == 3
    r = client.post("/v1/trials", json=_trial_report(answer, winner=2))
    assert r.status_code == 201, r.json
    assert r.json["stored"] == 3 and r.json["winner"]["name"] == names[2]
    assert r.json["winner"]["step_time_ms"] == 2.5  # median over steps of the slowest process's time
    for body in (_plan_body(candidates=3), _plan_body()):
        measured = client.post("/v1/plans", json=body)
        assert measured.status_code == 200
        assert measured.json["plan"] == answer["candidates"][2]["plan"]
        assert measured.json["measured"]["name"] == names[2] == measured.json["report"]["measured"]["name"]
        assert measured.json["report"]["environment"] == body["environment"]
    assert [c["name"] for c in measured.json["measured"]["trials"]] == names


def test_trial_reports_are_checked(app):
    client = app.test_client()
    answer = _answer(client, _plan_body(candidates=2))
    r = client.post("/v1/trials", json={**_trial_report(answer, 0), "key": "0" * 32})
    assert r.status_code == 404 and r.json["field"] == "key"
    r = client.post("/v1/trials", json=_trial_report(answer, 5))
    assert r.status_code == 400 and r.json["message"] == "winner: expected an index into the 2 trials, got 5"
    r = client.post("/v1/trials", json=_trial_report(answer, 0, samples=((1.0, 2.0), (1.0,))))
    assert r.status_code == 400 and "expected the same number of steps on every process, got [1, 2]" in r.json["message"]
    bad = _trial_report(answer, 0)
    bad["trials"][0]["plan"] = {"groups": "nope"}
    r = client.post("/v1/trials", json=bad)
    assert r.status_code == 400 and r.json["field"] == "trials[0].plan"
    from service.store import Store

    with Store(app.config["DATABASE"]) as store:
        assert store.count("trials") == 0


# -- schema version 3 -------------------------------------------------------------------------------
def _version_2_tables(types):
    from service import schema

    out = [s for s in schema.tables(types) if " trials " not in s and not s.startswith("CREATE INDEX IF NOT EXISTS trials_")]
    assert len(out) == len(schema.tables(types)) - 2
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_version_2_database_gains_the_trials_table_and_keeps_its_plans(request, backend, tmp_path):
    import sqlite3

    from service import create_app, schema
    from service.store import Store

    db = _database(request, backend, tmp_path, "v2")
    if backend == "sqlite":
        conn = sqlite3.connect(db)
        for stmt in _version_2_tables(schema.SQLITE_TYPES):
            conn.execute(stmt)
        conn.execute("INSERT INTO plans VALUES ('k', 'f', '{}', '{}', NULL, 1.0)")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
        conn.close()
    else:
        with Store(db) as store:
            for stmt in ["CREATE TABLE disco_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)",
                         "INSERT INTO disco_schema VALUES (1, 2)", *_version_2_tables(schema.POSTGRES_TYPES),
                         "INSERT INTO plans VALUES ('k', 'f', '{}', '{}', NULL, 1.0)"]:
                store._x(stmt)
    create_app({"DATABASE": db, "WORKERS": 0})
    assert schema.SCHEMA_VERSION == 3
    if backend == "sqlite":
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        conn.close()
    else:
        assert _rows(db, "SELECT version FROM disco_schema") == [(3,)]
    assert _rows(db, "SELECT key FROM plans") == [("k",)]
    with Store(db) as store:
        store.add_trials("k", "r", "f", None, [{"plan": {}, "plan_digest": "d", "name": "n", "step_time_ms": 1.5,
                                                 "samples_ms": [[1.5]]}], 0)
        assert [(t["name"], t["winner"], t["step_time_ms"]) for t in store.trials("k")] == [("n", True, 1.5)]
    # a version-3 database is refused by the layout check of a version-2 reader only where it lacks columns
    assert "trials" not in schema.columns(2) and "trials" in schema.columns(3)


# -- training data ---------------------------------------------------------------------------------------
def test_measured_trials_are_samples_the_cost_model_trains_on(tmp_path):
    """``service.trials.export`` writes every measured run as ``disco.samples/1`` lines with their
    graph, which ``gnn.train.load_dataset`` (``disco train-gnn --data``) reads; exporting again adds nothing."""
    from gnn.train import load_dataset
    from service import create_app
    from service.jobs import stop_runner
    from service.trials import export

    db = str(tmp_path / "t.sqlite")
    app = create_app({"DATABASE": db, "WORKERS": 1, "TESTING": True})
    try:
        client = app.test_client()
        answer = _answer(client, _plan_body(candidates=3))
        assert client.post("/v1/trials", json=_trial_report(answer, 1)).status_code == 201
    finally:
        stop_runner(app)
    out = tmp_path / "data"
    assert export(db, out) == 3
    assert export(db, out) == 0
    ds = load_dataset(out)
    assert len(ds.samples) == 3 and {s.median_ms for s in ds.samples} == {2.5}
    assert {s.devices for s in ds.samples} == {4}


@pytest.mark.slow
def test_disco_train_gnn_trains_on_the_measured_trials(tmp_path):
    """``disco train-gnn --trials DB --data DIR`` appends the database's measured runs and trains on them."""
    from disco.cli import train_gnn
    from service import create_app
    from service.jobs import stop_runner

    db = str(tmp_path / "t.sqlite")
    app = create_app({"DATABASE": db, "WORKERS": 1, "TESTING": True})
    try:
        client = app.test_client()
        answer = _answer(client, _plan_body(candidates=4))
        assert client.post("/v1/trials", json=_trial_report(answer, 1)).status_code == 201
    finally:
        stop_runner(app)
    lines = []
    args = train_gnn.add_arguments  # the CLI's own parser
    import argparse

    parser = argparse.ArgumentParser()
    args(parser)
    ns = parser.parse_args(["--data", str(tmp_path / "data"), "--trials", db, "--epochs", "1",
                            "--out", str(tmp_path / "c.msgpack")])
    metrics = train_gnn.train_and_report(ns, log=lines.append)
    assert lines[0] == f"trials: 4 measured samples appended from {db}"
    assert lines[1].startswith("data: 4 samples, 1 groups")
    assert (tmp_path / "c.msgpack").is_file() and metrics

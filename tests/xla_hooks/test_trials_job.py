"""Trials inside a real multi-process job (issue 43), against real plan-service processes.

Real ``jax.distributed`` jobs (gloo, one CPU device per process) train the zoo's mlp under
``xla_hooks.jit(..., trials=2)`` with ``disco serve`` processes on SQLite: the job measures the
service's candidates, keeps the fastest on every process and reports the times; a second
``xla_hooks.jit`` of the same program gets the measured winner without trials; a service killed
after it answered (before the times are reported) or while it plans (after it accepted the
request) leaves every process running the same program. Then the same over the emulated link
(10 Gbit/s, 50 us) with a second job: the measured winner, no trials.
"""

from __future__ import annotations

import contextlib
import json
import os
import re

import numpy as np
import pytest

from service.testing import ServerProcess

MODEL = {"model": "mlp", "preset": "tiny", "optimizer": "sgd"}
OPTIONS = {"budget_s": 1.0, "strategy": "baselines"}
TRIAL = {"trials": 2, "trial_steps": 2, "steps": 8, "timeout_s": 30.0, "agree_timeout_s": 30.0,
         "options": OPTIONS}


def _same_program(rows, name):
    state = [(r["plan"], r["plan_digest"], r["all_reduces"]) for r in rows]
    assert len(set(state)) == 1, f"{name}: the processes disagree: {state}; {[r['warnings'] for r in rows]}"


def _losses_are_xla_defaults(res, i):
    for proc in res.results:
        row = proc["scenarios"][i]
        np.testing.assert_allclose(row["losses"], proc["default_losses"][:len(row["losses"])], rtol=1e-5, atol=1e-7)


def _trials_stored(db, key=None):
    from service.store import Store

    with Store(str(db)) as store:
        return store.trials(key), {k: store.get_plan(k) for k in {t["key"] for t in store.trials(key)}}


@pytest.mark.parametrize("processes", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_trials_pick_one_winner_for_every_process_and_survive_a_killed_service(processes, tmp_path):
    from disco.runtime import multiprocess
    from service.testing import free_port

    with contextlib.ExitStack() as stack:
        healthy, killed_after, killed_during = (
            stack.enter_context(ServerProcess(tmp_path / f"{n}.sqlite", log=tmp_path / f"{n}.log"))
            for n in ("healthy", "after", "during"))
        down = f"http://127.0.0.1:{free_port()}"

        def on(url, process0=None):
            return [process0 or url] + [down] * (processes - 1)  # only process 0 may ask

        scenarios = (
            {"name": "trials", "services": on(healthy.url), **TRIAL},
            {"name": "measured", "services": on(healthy.url), **TRIAL},
            {"name": "killed after it answered", "services": on(killed_after.url), **TRIAL},
            {"name": "killed while planning", "services": on(killed_during.url), **TRIAL},
        )
        kill = {killed_after.url: [killed_after.proc.pid, "answered"],
                killed_during.url: [killed_during.proc.pid, "accepted"]}
        spec = multiprocess.WorkerSpec(task="jit", **MODEL, check_steps=8, scenarios=scenarios)
        env = {**os.environ, "DISCO_TEST_KILL_SERVICE": json.dumps(kill)}
        res = multiprocess.launch(processes, 1, spec, timeout_s=400, env=env, worker="tests.support.mp_faults")
        assert res.ok, res.failures
        assert multiprocess.stray_processes(res.pids) == []
        rows = [[r["scenarios"][i] for r in res.results] for i in range(len(scenarios))]
        for i, sc in enumerate(scenarios):
            _same_program(rows[i], sc["name"])
            _losses_are_xla_defaults(res, i)

        # the trials: the same measurements decided one winner on every process, and it is in effect
        trials = [r["trials"] for r in rows[0]]
        assert trials[0] and all(t == trials[0] for t in trials), trials
        (winner,) = [t["name"] for t in trials[0] if t["winner"]]
        assert len(trials[0]) >= 2 and "xla_default" in [t["name"] for t in trials[0]]
        assert rows[0][0]["plan"] == ("xla_default" if winner == "xla_default" else winner)
        stored, plans = _trials_stored(healthy.db)
        (key,) = plans
        assert [t["name"] for t in stored] == [t["name"] for t in trials[0]]
        assert [t["winner"] for t in stored] == [t["winner"] for t in trials[0]]
        assert all(t["processes"] == processes and len(t["samples_ms"]) == processes for t in stored)
        # the full key: made for this job's environment (jax, backend, its processes), as the report says
        environment = plans[key]["report"]["environment"]
        assert (environment["processes"], environment["devices_per_process"], environment["platform"]) == \
            (processes, 1, "cpu")
        assert all(t["environment"] == environment for t in stored)

        # the next xla_hooks.jit of the program: the measured winner, no trials, no warning
        measured = rows[1][0]
        assert all(r["trials"] is None for r in rows[1])
        assert measured["measured"]["name"] == winner and measured["plan_digest"] == rows[0][0]["plan_digest"]
        assert not any(w.startswith(("Plan", "Trial")) for r in rows[1] for w in r["warnings"])

        # killed after it answered: the trials ran, one winner everywhere, the report failed and says so
        assert all(r["trials"] for r in rows[2]) and len({json.dumps(r["trials"]) for r in rows[2]}) == 1
        assert any(re.search(r"TrialReportWarning: disco: the trial measurements were not reported to "
                             + re.escape(killed_after.url), w) for w in rows[2][0]["warnings"]), rows[2][0]["warnings"]
        assert _trials_stored(killed_after.db)[0] == []

        # killed while planning: every process compiles XLA's default, each saying why
        assert {r["plan"] for r in rows[3]} == {"xla_default"}
        for p, r in enumerate(rows[3]):
            assert any(re.search(r"PlanServiceWarning: .*(GET /v1/jobs/|refused|Connection)", w)
                       for w in r["warnings"]), f"process {p}: {r['warnings']}"


def _namespaces_permitted() -> str | None:
    from disco.runtime import testbed

    try:
        testbed.check_permitted()
    except PermissionError as e:
        return str(e)
    return None


@pytest.mark.slow
@pytest.mark.skipif(_namespaces_permitted() is not None, reason="network namespaces are not permitted here")
def test_a_trial_run_over_the_emulated_link_is_stored_and_the_next_job_gets_the_winner(tmp_path):
    """Two processes over the emulated link (10 Gbit/s, 50 us): the trial job reports its step times,
    the real SQLite store holds them under the full key, and a second job of the same program
    gets the measured winner without trials."""
    from disco.runtime import multiprocess
    from disco.runtime.testbed import LinkSpec
    from service.testing import free_port
    from tests.support.relay import unix_to_tcp

    link = LinkSpec(10e9, 50e-6)
    port = free_port()
    with ServerProcess(tmp_path / "s.sqlite", log=tmp_path / "s.log") as server, \
            unix_to_tcp(str(tmp_path / "relay.sock"), server.port) as sock:
        services = [f"http://127.0.0.1:{port}", "http://127.0.0.1:9"]  # process 0's relay; process 1 never asks
        env = {**os.environ, "DISCO_TEST_RELAY": json.dumps({"port": port, "socket": sock})}
        jobs = []
        for name in ("trials", "the next job"):
            spec = multiprocess.WorkerSpec(task="jit", **MODEL, check_steps=8,
                                           scenarios=({"name": name, "services": services, **TRIAL},))
            res = multiprocess.launch(2, 1, spec, timeout_s=400, env=env, link=link, worker="tests.support.mp_faults")
            assert res.ok, res.failures
            assert res.link == link
            rows = [r["scenarios"][0] for r in res.results]
            _same_program(rows, name)
            _losses_are_xla_defaults(res, 0)
            jobs.append(rows)
            if name == "trials":
                stored, plans = _trials_stored(server.db)
    first, second = jobs
    (winner,) = [t["name"] for t in first[0]["trials"] if t["winner"]]
    (key,) = plans
    assert [t["name"] for t in stored] == [t["name"] for t in first[0]["trials"]]
    assert all(t["key"] == key and t["processes"] == 2 for t in stored)
    assert plans[key]["report"]["environment"]["processes"] == 2
    assert all(r["trials"] is None for r in second)
    assert second[0]["measured"]["name"] == winner and second[0]["plan_digest"] == first[0]["plan_digest"]

"""One plan per job (issue 43): process 0 obtains the plan, every process applies it or all fall back.

The protocol of :mod:`xla_hooks.agreement` over an in-memory key-value store (threads as processes,
fast), then real ``jax.distributed`` jobs of 2 and 4 processes (gloo, one CPU device each) over
127.0.0.1 whose step is wrapped with ``xla_hooks.jit``, each running a series of scenarios with a
fault (the service down, slow or answering garbage on process 0, a plan that does not apply or
arrives corrupt on the last process).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time

import pytest

from xla_hooks import agreement
from tests.support.stubs import MemoryKV
from xla_hooks.agreement import Outcome, Round


PLAN = {"name": "p"}


def run_job(processes, *, leader_plan=PLAN, applies=None, skip=(), timeout_s=5.0, program="prog",
            programs=None, before_publish_s=0.0):
    """Every process's decision, each process a thread: process 0 publishes ``leader_plan`` (None: it
    obtained none) after ``before_publish_s``; process p's apply succeeds unless ``applies[p]`` is
    False; the processes in ``skip`` never take part."""
    kv = MemoryKV()
    decisions: dict[int, Outcome] = {}

    def process(p):
        rnd = Round(kv, "disco/xla_hooks/test/0", (programs or {}).get(p, program), p, processes, timeout_s)
        if rnd.leader:
            time.sleep(before_publish_s)
            outcome = agreement.publish_plan(rnd, leader_plan, {"r": 1}, None if leader_plan else "service down")
            plan = leader_plan
        else:
            plan, _report, outcome = agreement.receive_plan(rnd, timeout_s)
        if plan is not None and outcome.ok and not (applies or {}).get(p, True):
            outcome = Outcome(agreement.APPLY, f"plan did not apply on process {p}")
        decisions[p] = agreement.decide(rnd, outcome)

    threads = [threading.Thread(target=process, args=(p,)) for p in range(processes) if p not in skip]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return decisions, kv


@pytest.mark.fast
@pytest.mark.parametrize("processes", [2, 4])
def test_every_process_applies_when_all_can(processes):
    decisions, kv = run_job(processes)
    assert all(d.ok for d in decisions.values()) and len(decisions) == processes
    assert json.loads(kv.values["disco/xla_hooks/test/0/plan"])["plan"] == PLAN


@pytest.mark.fast
@pytest.mark.parametrize("processes", [2, 4])
def test_a_plan_that_does_not_apply_on_one_process_makes_all_fall_back(processes):
    decisions, _ = run_job(processes, applies={processes - 1: False})
    assert len(decisions) == processes
    for d in decisions.values():
        assert d.kind == agreement.APPLY and f"did not apply on process {processes - 1}" in d.reason


@pytest.mark.fast
def test_no_plan_on_process_0_is_no_plan_anywhere():
    decisions, _ = run_job(3, leader_plan=None)
    assert {d.kind for d in decisions.values()} == {agreement.NO_PLAN}
    assert all("process 0 obtained no plan (service down)" in d.reason for d in decisions.values())


@pytest.mark.fast
def test_a_plan_published_after_the_others_stopped_waiting_is_not_used():
    """Process 0 slower than the others' wait: they fall back naming the key, and process 0, having
    their reports, falls back too."""
    decisions, _ = run_job(2, timeout_s=0.3, before_publish_s=0.6)
    assert not decisions[0].ok and not decisions[1].ok
    assert "process 1 got no plan from process 0 within 0.3 s (waited for key " \
           "'disco/xla_hooks/test/0/plan')" in decisions[0].reason


@pytest.mark.fast
def test_a_process_that_never_reports_makes_all_fall_back_and_is_named():
    decisions, _ = run_job(3, skip={2}, timeout_s=0.3)
    assert set(decisions) == {0, 1}
    for d in decisions.values():
        assert d.kind == agreement.TIMEOUT
        assert "process 2 did not report within 0.3 s (process 0 waited for key " \
               "'disco/xla_hooks/test/0/applied/2')" in d.reason


@pytest.mark.fast
def test_process_0_never_deciding_bounds_the_others_wait():
    kv = MemoryKV()
    rnd = Round(kv, "disco/xla_hooks/test/0", "prog", 1, 2, 0.1)
    d = agreement.decide(rnd, Outcome())
    assert d.kind == agreement.TIMEOUT
    assert d.reason == ("process 1 got no decision from process 0 within 0.2 s "
                        "(waited for key 'disco/xla_hooks/test/0/decision')")


@pytest.mark.fast
def test_processes_compiling_different_programs_fall_back():
    decisions, _ = run_job(2, programs={1: "other"})
    assert not decisions[0].ok and "the processes compile different steps" in decisions[1].reason


@pytest.mark.fast
@pytest.mark.parametrize("raw", [b"\x00\x01", b"[1]", b'{"program": "prog", "plan": "x"}', b'{"program": "pr'])
def test_corrupt_plan_bytes_are_a_failure_on_the_reader(raw):
    kv = MemoryKV()
    kv.set("disco/xla_hooks/test/0/plan", raw)
    plan, _, outcome = agreement.receive_plan(Round(kv, "disco/xla_hooks/test/0", "prog", 1, 2, 1.0), 1.0)
    assert plan is None and outcome.kind == agreement.RECEIVE
    assert "read key 'disco/xla_hooks/test/0/plan' that is not a published plan" in outcome.reason


@pytest.mark.fast
def test_rounds_of_one_program_get_fresh_keys():
    """Compiling the same step again (a new signature, a new xla_hooks.jit) must not read the keys
    the last compile left in the store."""
    kv = MemoryKV()
    a = agreement.new_round(kv, "digest-a-test_rounds", 0, 2, 1.0)
    b = agreement.new_round(kv, "digest-a-test_rounds", 0, 2, 1.0)
    c = agreement.new_round(kv, "digest-c-test_rounds", 0, 2, 1.0)
    assert len({a.plan_key(), b.plan_key(), c.plan_key()}) == 3
    assert a.report_key(1) != b.report_key(1) and a.decision_key() != b.decision_key()
    with pytest.raises(ValueError, match=r"process: expected an index in \[0, 2\), got 2"):
        agreement.new_round(kv, "d", 2, 2, 1.0)


# -- real processes --------------------------------------------------------------------------------
MODEL = {"model": "mlp", "preset": "tiny", "optimizer": "sgd"}


@functools.cache
def _per_tensor(hlo_text: str) -> dict:
    from disco.ir.graph import HloGraph
    from disco.plans import baselines

    return baselines.make_all(HloGraph.from_hlo_text(hlo_text), ("per_tensor",))["per_tensor"].to_dict()


def _plan_service(handler, stubs):
    """The stub plan service: one all-reduce per gradient (XLA's default combines them into one) for
    any posted step, echoing its environment; the path's first part picks a fault."""
    from tests.support.stubs import send

    fault = handler.path.split("/")[1]
    body = json.loads(handler.body or b"{}")
    stubs.setdefault(fault, []).append(body.get("environment"))
    if fault == "slow":
        time.sleep(3)
    if fault == "corrupt":
        return send(handler, 200, json.dumps({"key": "k", "plan": {"groups": "nope"}}).encode())
    plan = dict(_per_tensor(body["hlo_text"]))
    if fault == "mismatched":  # a plan for another step: all-reduces this one does not have
        plan["buckets"] = [{"members": ["all-reduce.999"], "build": "concat"}]
    elif fault in ("inject-apply-failure", "inject-corrupt-bytes"):
        plan["name"] = fault
    report = {"method": "stub", "environment": body.get("environment")}
    with contextlib.suppress(OSError):  # the slow one's client is gone
        send(handler, 200, json.dumps({"key": "k", "plan": plan, "report": report}).encode())


def _scenarios(url: str, down: str, processes: int) -> list[dict]:
    last = processes - 1

    def services(default, **per):
        return [per.get(f"p{p}", default) for p in range(processes)]

    fast = {"timeout_s": 20.0, "agree_timeout_s": 30.0}
    return [
        {"name": "healthy", "services": services(f"{url}/ok"), **fast},
        {"name": "down for process 0", "services": services(f"{url}/ok", p0=down), **fast},
        {"name": f"down for process {last}", "services": services(f"{url}/ok", **{f"p{last}": down}), **fast},
        {"name": "slow", "services": services(f"{url}/slow"), "timeout_s": 1.0, "agree_timeout_s": 30.0},
        {"name": "corrupt answer", "services": services(f"{url}/corrupt"), **fast},
        {"name": "mismatched plan", "services": services(f"{url}/mismatched"), **fast},
        {"name": f"apply fails on process {last}", "services": services(f"{url}/inject-apply-failure"), **fast},
        {"name": f"corrupt bytes on process {last}", "services": services(f"{url}/inject-corrupt-bytes"), **fast},
    ]


# what each scenario must end in on every process, and a warning every process must show
EXPECTED = {
    "healthy": (True, None),
    "down for process 0": (False, "PlanServiceWarning: .*(refused|Connection)"),
    "down for process {last}": (True, None),
    "slow": (False, "PlanServiceWarning: .*timeout_s=1"),
    "corrupt answer": (False, "PlanServiceWarning: .*is not a valid plan"),
    "mismatched plan": (False, "PlanServiceWarning: .*does not fit this step"),
    "apply fails on process {last}": (False, "PlanAgreementWarning: .*did not apply on process {last} "
                                             r"\(RuntimeError: injected compile failure on process {last}\)"),
    "corrupt bytes on process {last}": (False, "PlanAgreementWarning: .*process {last} read key "
                                               "'disco/xla_hooks/.*/plan' that is not a published plan"),
}


@pytest.mark.parametrize("processes", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_every_process_runs_the_same_program_whatever_fails(processes):
    """Each scenario compiles the step afresh under xla_hooks.jit on every process (so it also checks
    that a second compile of the same program reads fresh keys) and runs three steps. Every
    process must end in the same state (all applied the one-bucket-per-gradient plan, or all
    compiled XLA's default), with the same all-reduces in its compiled step, and the loss of XLA's
    default; the job must end within its timeout (a hang would be killed and reported)."""
    import re

    import numpy as np

    from disco.runtime import multiprocess
    from service.testing import free_port
    from tests.support import mp_faults
    from tests.support.stubs import stub

    last = processes - 1
    calls: dict[str, list] = {}
    with stub(lambda h: _plan_service(h, calls)) as url:
        spec = multiprocess.WorkerSpec(task="jit", **MODEL, check_steps=3,
                                       scenarios=tuple(_scenarios(url, f"http://127.0.0.1:{free_port()}", processes)))
        env = {**os.environ, "DISCO_TEST_FAULT_PROCESSES": str(last)}
        res = multiprocess.launch(processes, 1, spec, timeout_s=300, env=env, worker="tests.support.mp_faults")
    assert res.ok, res.failures
    assert multiprocess.stray_processes(res.pids) == []
    assert mp_faults.APPLY_FAILURE in calls and mp_faults.CORRUPT_BYTES in calls
    # only process 0 asked (once a scenario; "ok" serves two, and process 0's service was down in one),
    # and it named the job's topology
    assert {k: len(v) for k, v in calls.items()} == {"ok": 2, "slow": 1, "corrupt": 1, "mismatched": 1,
                                                     mp_faults.APPLY_FAILURE: 1, mp_faults.CORRUPT_BYTES: 1}
    env0 = calls["ok"][0]
    assert (env0["processes"], env0["devices_per_process"], env0["platform"]) == (processes, 1, "cpu")
    default_ars = None
    for i, name in enumerate(EXPECTED):
        applied, warning = EXPECTED[name]
        name = name.format(last=last)
        rows = [r["scenarios"][i] for r in res.results]
        assert all(r["name"] == name for r in rows)
        state = [(r["plan"], r["plan_digest"], r["all_reduces"]) for r in rows]
        assert len(set(state)) == 1, f"{name}: the processes disagree: {state}; {[r['warnings'] for r in rows]}"
        assert (rows[0]["plan"] != "xla_default") is applied, f"{name}: {rows[0]}"
        if not applied:
            default_ars = default_ars or rows[0]["all_reduces"]
            assert rows[0]["all_reduces"] == default_ars
            pattern = re.compile(warning.format(last=last))
            for p, r in enumerate(rows):
                assert any(pattern.search(w) for w in r["warnings"]), f"{name}, process {p}: {r['warnings']}"
        else:
            assert rows[0]["applied"] and rows[0]["report_environment"] == env0
            assert not any(w.startswith("Plan") for r in rows for w in r["warnings"]), [r["warnings"] for r in rows]
        for r, proc in zip(rows, res.results):
            np.testing.assert_allclose(r["losses"], proc["default_losses"], rtol=1e-5, atol=1e-7)
    # the plan was really in effect: one all-reduce per gradient, where XLA's default combines them
    healthy = res.results[0]["scenarios"][0]
    assert healthy["all_reduces"] > default_ars

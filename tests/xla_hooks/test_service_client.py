"""``xla_hooks.service_client``: the plan service's HTTP client against real (stub) HTTP servers.

The fallbacks a job sees are tested through ``xla_hooks.jit`` in test_hook.py; these pin what the
client itself sends and answers, without jax.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.stubs import send, stub
from xla_hooks.service_client import NoPlan, ServiceClient, TimedOut, check_service_url, checked_token

pytestmark = pytest.mark.fast


def test_a_202_job_is_polled_until_done_and_asks_for_the_candidates():
    seen: list[tuple[str, str, dict | None]] = []
    polls = iter(["queued", "running", "done"])

    def reply(h):
        seen.append((h.command, h.path, json.loads(h.body) if h.command == "POST" else None))
        if h.command == "POST":
            send(h, 202, b'{"job_id": "j1"}')
        else:
            state = next(polls)
            body = {"state": state, "result": {"plan": {"name": "p"}}} if state == "done" else {"state": state}
            send(h, 200, json.dumps(body).encode())

    with stub(reply) as url:
        answer = ServiceClient(url, "tok", 10.0).plan({"hlo_text": "HloModule m"}, candidates=3)
    assert answer == {"plan": {"name": "p"}}
    assert [(m, p) for m, p, _ in seen] == [("POST", "/v1/plans")] + [("GET", "/v1/jobs/j1?candidates=3")] * 3
    assert seen[0][2] == {"hlo_text": "HloModule m"}


def test_the_token_goes_in_the_authorization_header():
    headers = []

    def reply(h):
        headers.append(h.headers.get("Authorization"))
        send(h, 200, b"{}")

    with stub(reply) as url:
        ServiceClient(url, "tok", 5.0).plan({})
        ServiceClient(url, None, 5.0).plan({})
    assert headers == ["Bearer tok", None]


@pytest.mark.parametrize("status, body, match", [
    (500, b'{"message": "boom"}', "POST /v1/plans answered 500: boom"),
    (200, b"<html>", "not JSON"),
    (200, b"[1]", "not an object"),
    (202, b"{}", "without a job id"),
])
def test_what_is_not_an_answer_is_a_no_plan_saying_why(status, body, match):
    with stub(lambda h: send(h, status, body)) as url, pytest.raises(NoPlan, match=match):
        ServiceClient(url, None, 5.0).plan({})


def test_a_job_not_done_by_the_deadline_says_it_goes_on_in_the_service():
    def reply(h):
        send(h, 202, b'{"job_id": "j"}') if h.command == "POST" else send(h, 200, b'{"state": "running"}')

    with stub(reply) as url:
        t0 = time.monotonic()
        with pytest.raises(NoPlan, match=r"not done within timeout_s=0.5 \(state running.*goes on in the service"):
            ServiceClient(url, None, 0.5).plan({})
    assert time.monotonic() - t0 < 5


def test_a_request_past_its_deadline_times_out_before_it_is_sent():
    with pytest.raises(TimedOut, match="before GET /x"):
        ServiceClient("http://127.0.0.1:9", None, 1.0).request("GET", "/x", None, time.monotonic() - 1)


def test_trials_not_stored_are_a_no_plan():
    bodies = []

    def reply(h):
        bodies.append(json.loads(h.body))
        send(h, 400, b'{"message": "bad key"}')

    with stub(reply) as url, pytest.raises(NoPlan, match="POST /v1/trials answered 400: bad key"):
        ServiceClient(url, None, 5.0).report_trials({"key": "k"})
    assert bodies == [{"key": "k"}]


@pytest.mark.parametrize("url, match", [
    ("127.0.0.1:8000", "base URL"), ("http://h:8000/?x=1", "query or fragment"),
    ("http://u@h:8000", "user name"), ("http://h:99999", "port"), ("http://h /", "whitespace"),
])
def test_service_urls_that_cannot_work_are_refused(url, match):
    with pytest.raises(ValueError, match=match):
        check_service_url(url)


def test_tokens_are_stripped_and_must_fit_a_header():
    assert checked_token(" tok\n") == "tok"
    assert checked_token(None) is None
    with pytest.raises(TypeError, match="as a str"):
        checked_token(b"tok")
    with pytest.raises(ValueError, match="printable ASCII"):
        checked_token("t\u00e9k")

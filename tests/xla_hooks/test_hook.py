"""``xla_hooks.jit``: plans from a real service process, the local planner, and every fallback."""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import time
import warnings

import jax
import numpy as np
import pytest

import trax_models
import xla_hooks
from xla_hooks.apply_plan import PlanFallbackWarning
from xla_hooks.hook import PlanServiceWarning

pytest.importorskip("flask")

from service.testing import ServerProcess, free_port  # noqa: E402
from tests.support.equivalence import assert_allclose_leaves as assert_close  # noqa: E402
from tests.support.equivalence import three_steps  # noqa: E402
from tests.support.stubs import send as _send  # noqa: E402
from tests.support.stubs import stub  # noqa: E402

DEVICES = 4


@functools.cache
def setup():
    step, args = trax_models.make_train_step("mlp", "tiny", devices=DEVICES, optimizer="sgd")
    reference = three_steps(jax.jit(step), args)
    return step, args, reference


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("hook") / "plans.sqlite", workers=1, token="tok") as srv:
        yield srv


@pytest.mark.parametrize("strategy", ["random", "auto"])
def test_round_trip_through_a_real_service(server, strategy):
    # "auto" is disco.search's best-first search where it is installed
    step, args, reference = setup()
    fast = xla_hooks.jit(step, service=server.url, cluster="local", timeout_s=60, token="tok",
                         options={"strategy": strategy, "budget_s": 1.0, "seed": 0})
    out = three_steps(fast, args)
    assert_close(out, reference)
    (applied,) = fast.applied.values()
    (report,) = fast.reports.values()
    assert applied.applied, applied.fallback_reason
    assert report["graph"]["fingerprint"] and report["cluster"]["devices"] == DEVICES
    assert applied.plan.digest() == report["plan_summary"]["digest"]
    # the compiled step is cached per argument signature: three calls, one plan
    assert len(fast.applied) == 1


def test_a_job_past_timeout_s_falls_back_and_a_later_run_gets_its_plan(server):
    step, args, reference = setup()
    options = {"strategy": "random", "budget_s": 6.0, "seed": 17}
    slow = xla_hooks.jit(step, service=server.url, cluster="local", timeout_s=1.5, token="tok", options=options)
    with pytest.warns(PlanServiceWarning, match=r"the plan job was not done within timeout_s=1\.5 .*it goes on in "
                                                r"the service, and a later run of this step gets its plan"):
        assert_close(three_steps(slow, args), reference)
    (applied,) = slow.applied.values()
    assert applied.plan.name == "xla_default" and list(slow.reports.values()) == [None]  # XLA's default
    time.sleep(8.0)  # the job's search runs out its 6 s budget
    later = xla_hooks.jit(step, service=server.url, cluster="local", timeout_s=60, token="tok", options=options)
    assert_close(three_steps(later, args), reference)
    (applied,) = later.applied.values()
    (report,) = later.reports.values()
    assert applied.applied and report["search"]["random_plans_tried"] > 0, (applied.fallback_reason, report)
    assert applied.plan.digest() == report["plan_summary"]["digest"]


def test_a_token_read_from_a_file_keeps_its_newline_out_of_the_header(server, tmp_path):
    """A trailing newline made http.client raise 'Invalid header value' at the first step."""
    step, args, reference = setup()
    (tmp_path / "token").write_text("tok\n")
    fast = xla_hooks.jit(step, service=server.url, timeout_s=60, token=(tmp_path / "token").read_text(),
                         options={"strategy": "baselines", "seed": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanFallbackWarning)
        assert_close(three_steps(fast, args), reference)
    (report,) = fast.reports.values()
    assert report is not None and report["graph"]["fingerprint"]


def test_local_planner_without_a_service():
    step, args, reference = setup()
    fast = xla_hooks.jit(step, service=None, timeout_s=30, options={"strategy": "baselines"})
    assert_close(three_steps(fast, args), reference)
    (report,) = fast.reports.values()
    assert report["method"] in ("baselines", "search") and report["lower_bound_ms"] > 0


def test_service_down_falls_back_to_xla():
    step, args, reference = setup()
    fast = xla_hooks.jit(step, service=f"http://127.0.0.1:{free_port()}", timeout_s=5)
    with pytest.warns(PlanServiceWarning, match="ConnectionRefused|refused"):
        out = three_steps(fast, args)
    assert_close(out, reference)
    (applied,) = fast.applied.values()
    assert applied.plan.name == "xla_default"


def test_slow_service_times_out_and_falls_back():
    step, args, reference = setup()

    def slow(handler):
        time.sleep(3)
        with contextlib.suppress(OSError):
            _send(handler, 500, b"{}")

    with stub(slow) as url:
        fast = xla_hooks.jit(step, service=url, timeout_s=0.5)
        with pytest.warns(PlanServiceWarning, match="timed out|timeout"):
            out = three_steps(fast, args)
    assert_close(out, reference)


_PLAN_FOR_ANOTHER_GRAPH = {"schema_version": 1, "name": "x", "groups": [["add.1", "multiply.2"]],
                           "xla_fusion": "extend", "buckets": None, "compile_options": {}}


@pytest.mark.parametrize("status, body, match", [
    (200, b"<html>not json</html>", "not JSON"),
    (200, b"[1, 2, 3]", "not an object"),
    (200, b'{"key": "k"}', "holds no plan"),
    (200, json.dumps({"key": "k", "plan": {"groups": "nope"}}).encode(), "is not a valid plan"),
    (200, json.dumps({"key": "k", "plan": _PLAN_FOR_ANOTHER_GRAPH}).encode(), "does not fit"),
    (500, b'{"code": "internal", "message": "boom", "field": null}', "500"),
    (202, b'{"job_id": 5}', "without a job id"),
])
def test_garbage_from_the_service_falls_back(status, body, match):
    step, args, reference = setup()
    with stub(lambda h: _send(h, status, body)) as url:
        fast = xla_hooks.jit(step, service=url, timeout_s=5)
        with pytest.warns(PlanServiceWarning, match=match) as record:
            out = three_steps(fast, args)
    assert_close(out, reference)
    assert all(issubclass(w.category, PlanFallbackWarning) for w in record)


@contextlib.contextmanager
def raw_stub(answer: bytes, drip_s: float = 0.0, drip_from: int = 0):
    """A TCP server that reads one request and writes ``answer`` (from byte ``drip_from`` on, a
    byte every ``drip_s``): not necessarily HTTP."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.1)
    stop = threading.Event()

    def answer_one(conn):
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536) or b"\r\n\r\n"
            rest = answer[drip_from:]
            chunks = [answer[:drip_from]] + [rest[i:i + 1] for i in range(len(rest))] if drip_s else [answer]
            for chunk in chunks:
                if stop.is_set():
                    return
                conn.sendall(chunk)
                time.sleep(drip_s)

    def serve():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = sock.accept()
                threading.Thread(target=answer_one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        sock.close()


@pytest.mark.parametrize("answer, match", [
    (b"garbage garbage\r\n\r\n", "BadStatusLine"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n{}", "LineTooLong"),
])
def test_a_service_that_does_not_speak_http_falls_back(answer, match):
    """http.client's protocol errors are no OSError; they escaped and stopped the step."""
    step, args, reference = setup()
    with raw_stub(answer) as url:
        fast = xla_hooks.jit(step, service=url, timeout_s=5)
        with pytest.warns(PlanServiceWarning, match=rf"POST /v1/plans failed: {match}") as record:
            out = three_steps(fast, args)
    assert_close(out, reference)
    assert len(record) == 1 and "\n" not in str(record[0].message)


_SLOW_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"p" * 300 + b"\r\n"
_SLOW_BODY = b"Content-Length: 300\r\n\r\n" + b" " * 300


@pytest.mark.parametrize("drip_from", [0, len(_SLOW_HEAD)], ids=["headers", "body"])
def test_a_service_that_answers_a_byte_at_a_time_falls_back_at_timeout_s(drip_from):
    """urlopen's timeout bounds each socket read, not the request: a byte every 50 ms held the step
    for the whole answer (30 s here) whatever timeout_s said."""
    step, args, reference = setup()
    xla_hooks.apply(None, step, *args)  # compiled once already, so the time below is the planning's
    with raw_stub(_SLOW_HEAD + _SLOW_BODY, drip_s=0.05, drip_from=drip_from) as url:
        fast = xla_hooks.jit(step, service=url, timeout_s=1)
        t0 = time.monotonic()
        with pytest.warns(PlanServiceWarning, match=r"POST /v1/plans did not finish within timeout_s=1\b") as record:
            fast(*args)
        elapsed = time.monotonic() - t0
    assert elapsed < 8, f"the first step took {elapsed:.1f} s with timeout_s=1"
    assert len(record) == 1
    assert_close(three_steps(fast, args), reference)


def test_failed_job_falls_back():
    step, args, reference = setup()

    def reply(handler):
        if handler.command == "POST":
            _send(handler, 202, b'{"job_id": "abc123", "key": "k", "state": "queued"}')
        else:
            _send(handler, 200, json.dumps({"job_id": "abc123", "state": "failed", "error": {
                "code": "server_restarted", "message": "server restarted during the job", "field": None}}).encode())

    with stub(reply) as url:
        fast = xla_hooks.jit(step, service=url, timeout_s=5)
        with pytest.warns(PlanServiceWarning, match="server restarted"):
            out = three_steps(fast, args)
    assert_close(out, reference)


@pytest.mark.fast
def test_jit_rejects_a_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s"):
        xla_hooks.jit(lambda x: x, timeout_s=0)


@pytest.mark.fast
@pytest.mark.parametrize("url", ["not a url", "127.0.0.1:8000", "ftp://host", "http://", "http://h:99999", 8000,
                                 # these raised from http.client at the first step, or sent the request elsewhere
                                 "http://127.0.0.1:8000/my plans", "http://127.0.0.1:8000/plän",
                                 "http://127.0.0.1:8000/\n", "http://127.0.0.1:8000/?a=b", "http://127.0.0.1:8000/#x",
                                 "http://user:pw@127.0.0.1:8000"])
def test_jit_rejects_a_service_that_is_not_a_url(url):
    """A wrong URL is a setup error raised at once (it was urllib's 'unknown url type' at the first step)."""
    with pytest.raises(ValueError, match=r"service: (expected the plan service's base URL, e\.g\. "
                                         r"'http://127\.0\.0\.1:8000'|the port of .* is not a number in 0-65535)"):
        xla_hooks.jit(lambda x: x, service=url)
    assert xla_hooks.jit(lambda x: x, service="https://plans.example:8443/disco").service == \
        "https://plans.example:8443/disco"


@pytest.mark.fast
def test_a_gpu_keeps_a_plans_cuts_buckets_and_options_but_not_its_groups(monkeypatch):
    from disco.plans.plan import make_plan
    from xla_hooks.hook import _for_this_backend

    plan = make_plan(groups=[["a", "b"]], buckets=[["r"]], cuts=[("x", "y")], xla_fusion="off",
                     compile_options={"xla_gpu_enable_latency_hiding_scheduler": "True"})
    assert _for_this_backend(plan, {"k": 1}) == (plan, {"k": 1})  # CPU: as planned
    monkeypatch.setattr(jax, "default_backend", lambda: "cuda")
    kept, report = _for_this_backend(plan, {"k": 1})
    assert kept == plan.replace(groups=(), xla_fusion="extend")
    assert report["k"] == 1 and report["dropped_groups"].startswith("1 fusion group(s) dropped: XLA:GPU cannot")


@pytest.mark.parametrize("kw, exc, match", [
    ({"step_fn": "step"}, TypeError, r"^step_fn: expected the training step .*got str"),
    ({"timeout_s": "5"}, ValueError, r"^timeout_s: expected a positive number of seconds, got '5'"),
    ({"cluster": "nope"}, ValueError, r"^cluster: expected a ClusterSpec, 'auto' or a preset name \(local, .*\), got 'nope'"),
    ({"cluster": 3}, ValueError, r"^cluster: expected a ClusterSpec, 'auto' or a preset name .*got 3"),
    ({"options": {"foo": 1}}, ValueError, r"^options: unknown keys \['foo'\]"),
    ({"options": {"budget_s": -1}}, ValueError, r"^options\.budget_s: expected a positive number of seconds, got -1"),
    # tokens an HTTP header cannot carry raised from http.client at the first step
    ({"token": "to\nken"}, ValueError, r"^token: expected printable ASCII .*got a token holding '\\n'"),
    ({"token": "tök"}, ValueError, r"^token: expected printable ASCII .*got a token holding 'ö'"),
    ({"token": 1234}, TypeError, r"^token: expected the service's bearer token as a str, got int"),
])
def test_setup_errors_raise_at_once(kw, exc, match):
    step, args, _ = setup()
    kw = {"step_fn": step, **kw}
    with pytest.raises(exc, match=match):
        xla_hooks.jit(**kw)


def test_a_python_scalar_argument_is_traced_so_a_new_value_is_not_a_new_plan():
    """jax traces a Python float as a weak-typed scalar: a learning rate or step counter that changes every
    call must not plan and compile the step again (it did, keyed by the value)."""
    import jax.numpy as jnp

    def scaled(x, lr):
        return x * lr

    x = jnp.ones(3)
    step = xla_hooks.jit(scaled)
    for lr in (0.1, 0.2, 0.3):
        np.testing.assert_array_equal(np.asarray(step(x, lr)), np.asarray(jax.jit(scaled)(x, lr)))
    np.testing.assert_array_equal(np.asarray(step(x, 2)), np.asarray(jax.jit(scaled)(x, 2)))  # int: its own
    assert len(step.applied) == 2


def test_keyword_arguments_are_traced_like_positional_ones():
    """``step(state, batch=batch)`` works as with jax.jit; a keyword's new value is not a new plan, a
    new name or shape is."""
    import jax.numpy as jnp

    def scaled(x, *, lr, bias=0.0):
        return x * lr + bias

    x = jnp.ones(3)
    step = xla_hooks.jit(scaled)
    for lr in (0.1, 0.2):
        np.testing.assert_array_equal(np.asarray(step(x, lr=lr)), np.asarray(jax.jit(scaled)(x, lr=lr)))
    assert len(step.applied) == 1
    np.testing.assert_array_equal(np.asarray(step(x, lr=0.5, bias=jnp.ones(3))),
                                  np.asarray(jax.jit(scaled)(x, lr=0.5, bias=jnp.ones(3))))
    assert len(step.applied) == 2


def test_a_step_whose_hlo_disco_cannot_read_trains_as_xla_compiles_it(monkeypatch):
    """The graph was parsed outside the fallback: an HLO disco's parser refuses stopped training."""
    from disco.ir.graph import HloGraph

    step, args, reference = setup()

    def refuse(text, *a, **kw):
        raise ValueError("line 3: cannot parse instruction (an HLO construct disco does not know)")

    monkeypatch.setattr(HloGraph, "from_hlo_text", staticmethod(refuse))
    fast = xla_hooks.jit(step, service=None, timeout_s=30)
    with pytest.warns(PlanServiceWarning, match=r"no plan from the local planner \(disco could not read the step's "
                                                r"HLO \(ValueError: line 3: cannot parse"):
        result = three_steps(fast, args)
    assert_close(result, reference)
    (applied,) = fast.applied.values()
    assert applied.plan.name == "xla_default"


def test_each_static_value_of_a_jitted_step_is_its_own_signature():
    """As jax.jit caches them: a static argument is part of the signature by value; an unhashable
    one is refused as jax refuses it."""
    import jax.numpy as jnp

    from disco.ir.step_form import StepFormError

    def scaled(x, lr):
        return x * lr

    static = jax.jit(scaled, static_argnums=1)
    planned = xla_hooks.jit(static)
    x = jnp.ones(3)
    np.testing.assert_array_equal(planned(x, 0.5), static(x, 0.5))
    np.testing.assert_array_equal(planned(x, 0.5), static(x, 0.5))
    assert len(planned.applied) == 1
    np.testing.assert_array_equal(planned(x, 2.0), static(x, 2.0))
    assert len(planned.applied) == 2
    assert [a.compiled.as_text().count("constant(2)") for a in planned.applied.values()] == [0, 1]
    with pytest.raises(StepFormError, match=r"static argument \(argument 1: list\) is not hashable"):
        planned(x, [0.5])


def test_the_default_cluster_is_the_devices_the_step_runs_on():
    """cluster="auto": on CPU the 'local' preset over the step's devices (on GPUs, the H100 preset of that
    many: tests/disco/optimizer/test_optimize.py checks the mapping; no GPU here)."""
    step, args = trax_models.make_train_step("mlp", "tiny", devices=2)
    planned = xla_hooks.jit(step, options={"max_evals": 50})
    assert planned.cluster == "auto"
    planned(*args)
    (report,) = planned.reports.values()
    assert report["cluster"]["name"] == "local" and report["cluster"]["devices"] == 2


def test_shardings_that_place_shards_on_other_devices_get_their_own_compiled_step():
    """P("a", "b") and P("b", "a") on a 2x2 mesh cut a 4x4 array into equal 2x2 shards on the same four
    devices, but put them on different devices: the step compiled for one refused the other
    ("Computation was compiled for input shardings that disagree ..."), stopping training, because the
    cache keyed a sharding by its device set and shard shape. Equivalent shardings still share one."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    def scaled(x):
        return x * 2.0

    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(2, 2), ("a", "b"))
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    step = xla_hooks.jit(scaled)
    for spec in (P("a", "b"), P("b", "a")):
        out = step(jax.device_put(x, NamedSharding(mesh, spec)))
        np.testing.assert_array_equal(np.asarray(out), x * 2.0)
    assert len(step.applied) == 2
    for spec in (P(), P(None,)):
        step(jax.device_put(x, NamedSharding(mesh, spec)))
    assert len(step.applied) == 3


def test_a_weak_typed_argument_is_its_own_signature():
    """A weak-typed f32 scalar (what a jitted function returns for a Python number) times a bf16 array is
    bf16 under jax.jit, a strong f32 one makes it f32: the two shared one compiled step, so whichever came
    second was computed in the first one's dtype."""
    import jax.numpy as jnp

    def scaled(x, c):
        return x * c

    x = jnp.full(3, 1.1, jnp.bfloat16)
    weak, strong = jax.jit(lambda: 1.001)(), jnp.asarray(1.001, jnp.float32)
    assert weak.weak_type and not strong.weak_type
    for order in ((weak, strong), (strong, weak)):
        step = xla_hooks.jit(scaled)
        for c in order:
            out, expected = step(x, c), jax.jit(scaled)(x, c)
            assert out.dtype == expected.dtype
            np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
        assert len(step.applied) == 2


def test_a_plan_made_for_another_environment_is_refused():
    """Issue 43: the plan key holds the job's jax, backend, topology and XLA flags; an answer whose
    report names another environment (or none: a service that keyed it without) is not used."""
    step, args, reference = setup()
    for environment in ({"jax": "0.0.1"}, None):
        def answer(handler, environment=environment):
            body = json.loads(handler.body)
            from disco.ir.graph import HloGraph
            from disco.plans import baselines

            plan = baselines.make_all(HloGraph.from_hlo_text(body["hlo_text"]), ("per_tensor",))["per_tensor"]
            assert body["environment"]["processes"] == 1 and body["environment"]["platform"] == "cpu"
            _send(handler, 200, json.dumps({"key": "k", "plan": plan.to_dict(),
                                            "report": {"environment": environment}}).encode())

        with stub(answer) as url:
            fast = xla_hooks.jit(step, service=url, timeout_s=5)
            with pytest.warns(PlanServiceWarning, match="the service answered a plan made for another environment"):
                out = three_steps(fast, args)
        assert_close(out, reference)
        assert next(iter(fast.applied.values())).plan.name == "xla_default"


@pytest.mark.fast
def test_xla_flags_that_only_dump_or_log_do_not_change_the_environment():
    from xla_hooks.environment import xla_flags

    assert xla_flags("--b=1 --xla_dump_to=/tmp/x --a=2 --xla_log_x=1") == ("--a=2", "--b=1")
    assert xla_flags(None) == xla_flags("") == ()


def test_a_single_process_job_uses_no_key_value_store(monkeypatch):
    from xla_hooks import agreement

    def refuse(self):
        raise AssertionError("a single-process job opened the coordination service's key-value store")

    monkeypatch.setattr(agreement.JaxKeyValue, "__init__", refuse)
    step, args, reference = setup()
    fast = xla_hooks.jit(step, service=None, timeout_s=30, options={"strategy": "baselines"})
    assert_close(three_steps(fast, args), reference)


@pytest.mark.fast
def test_jit_rejects_a_bad_agree_timeout():
    with pytest.raises(ValueError, match=r"^agree_timeout_s: expected a positive number of seconds, got 0"):
        xla_hooks.jit(lambda x: x, agree_timeout_s=0)

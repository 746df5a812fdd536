"""The plan service: a real server process on 127.0.0.1, plus the Flask test client for the rest.

The ``server`` and ``app`` fixtures run on both store backends: SQLite, and PostgreSQL on a
throwaway server (``postgres``: initdb and pg_ctl from the machine's PostgreSQL; its tests skip,
saying why, where there is none).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import sqlite3
import socket
import subprocess
import sys
import threading
import time

import pytest

flask = pytest.importorskip("flask")
schemathesis = pytest.importorskip("schemathesis")

import hypothesis  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from service import create_app  # noqa: E402
from service.jobs import stop_runner  # noqa: E402
from service.store import Store  # noqa: E402
from service.testing import ServerProcess  # noqa: E402
from tests.support.service import mlp_hlo, plan_body  # noqa: E402

TOKEN = "s3cret-token"


BACKENDS = ["sqlite", "postgresql"]


def new_database(request, backend: str, directory, name: str) -> str:
    """A new, empty database of ``backend``: an SQLite file in ``directory``, or a database on ``postgres``."""
    if backend == "sqlite":
        return str(directory / f"{name}.sqlite")
    return request.getfixturevalue("postgres").create_database()


def rows(db, query: str, params=()) -> list[tuple]:
    """The rows of a query (``?`` placeholders) on either backend."""
    with Store(str(db)) as store:
        cur = store._x(query, params)
        found = cur.fetchall() if cur.description else []
        return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in found]


@pytest.fixture(scope="module", params=BACKENDS)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service")
    srv = ServerProcess(new_database(request, request.param, tmp, "plans"), workers=2, token=TOKEN,
                        log=tmp / "server.log")
    srv.start()
    yield srv
    srv.stop()


def assert_error(status, body, expected_status, field="unset"):
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body) == {"code", "message", "field"}, body
    assert body["message"]
    if field != "unset":
        assert body["field"] == field, body


# -- a real server ---------------------------------------------------------------------------------
def test_plan_round_trip_and_report_page(server):
    status, body, _ = server.request("POST", "/v1/plans", plan_body(seed=1))
    assert status == 202 and body["state"] in ("queued", "running"), body
    job = server.wait_job(body["job_id"])
    assert job["state"] == "done", job
    result = job["result"]
    assert result["key"] == body["key"]
    report = result["report"]
    assert report["method"] == "baselines" or report["method"].startswith("search")
    assert set(report["baselines_ms"]) >= {"xla_default", "per_tensor", "horovod", "ddp"}
    assert report["lower_bound_ms"] <= report["plan_ms"] <= min(report["baselines_ms"].values()) + 1e-9
    assert report["cost_model"]["name"] == "analytic"
    # now cached
    status, cached, _ = server.request("POST", "/v1/plans", plan_body(seed=1))
    assert status == 200 and cached == result
    status, stored, _ = server.request("GET", f"/v1/plans/{body['key']}")
    assert status == 200 and stored["plan"] == result["plan"]
    status, page, headers = server.request("GET", f"/plans/{body['key']}")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "<svg" in page and "compute" in page and "comm" in page and "lower bound" in page
    for name in report["baselines_ms"]:
        assert name in page


def test_identical_concurrent_requests_share_one_job(server):
    body = plan_body(seed=7, strategy="random", budget_s=2.0)
    results: list = [None] * 50
    barrier = threading.Barrier(50)

    def post(i):
        barrier.wait()
        results[i] = server.request("POST", "/v1/plans", body)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    statuses = [r[0] for r in results]
    assert set(statuses) <= {200, 202}, statuses
    job_ids = {r[1]["job_id"] for r in results if r[0] == 202}
    keys = {r[1]["key"] for r in results}
    assert len(job_ids) == 1 and len(keys) == 1, (job_ids, keys)
    job = server.wait_job(job_ids.pop())
    assert job["state"] == "done", job
    plans = {json.dumps(r[1]["plan"], sort_keys=True) for r in results if r[0] == 200}
    plans.add(json.dumps(job["result"]["plan"], sort_keys=True))
    assert len(plans) == 1
    assert rows(server.db, "SELECT COUNT(*) FROM jobs WHERE key = ?", (keys.pop(),)) == [(1,)]


def test_max_evals_gives_the_same_plan_on_another_server(server, tmp_path):
    """Two servers with their own stores search the same request to the same plan."""
    body = plan_body(seed=11, strategy="auto", budget_s=120.0, max_evals=60)
    plans, keys = [], []
    with ServerProcess(tmp_path / "other.sqlite", workers=1, token=TOKEN) as other:
        for srv in (server, other):
            status, posted, _ = srv.request("POST", "/v1/plans", body)
            assert status == 202, posted
            job = srv.wait_job(posted["job_id"], timeout=120)
            assert job["state"] == "done", job
            report = job["result"]["report"]
            assert report["options"]["max_evals"] == 60 and 60 <= report["search"]["evals"] < 120, report
            plans.append(job["result"]["plan"])
            keys.append(posted["key"])
    assert keys[0] == keys[1] and plans[0] == plans[1]


def _raw_post(server, path, headers, body: bytes):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            conn.send(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_malformed_inputs_get_json_4xx_and_the_server_stays_up(server):
    ok = plan_body()
    cases = [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b"NaN", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({**ok, "hlo_text": 5}).encode(), 400, "hlo_text"),
        (json.dumps({**ok, "devices": "4"}).encode(), 400, "devices"),
        (json.dumps({**ok, "options": {"budget_s": "fast"}}).encode(), 400, "options.budget_s"),
        (json.dumps({**ok, "options": {"strategy": "magic"}}).encode(), 400, "options.strategy"),
        (json.dumps({**ok, "options": {"max_evals": 0}}).encode(), 400, "options.max_evals"),
        (json.dumps({**ok, "options": {"max_evals": "100"}}).encode(), 400, "options.max_evals"),
        (json.dumps({**ok, "surprise": 1}).encode(), 400, "surprise"),
        (json.dumps({"cluster": "local"}).encode(), 400, None),
        (json.dumps({**ok, "graph": {"schema": "disco.graph/1"}}).encode(), 400, "graph.name"),
        (json.dumps({**ok, "hlo_text": None, "graph": {"schema": "disco.graph/1", "name": "g", "nodes": 3,
                                                       "edges": []}}).encode(), 400, "graph.nodes"),
        (json.dumps({**ok, "cluster": {"yaml": "nodes: [unclosed"}}).encode(), 400, "cluster.yaml"),
        (json.dumps({**ok, "cluster": {"yaml": "/etc/passwd"}}).encode(), 400, "cluster.yaml"),
        (json.dumps({**ok, "cluster": "dgx-a100-8", "devices": 3}).encode(), 400, "devices"),
        ("[" * 100000 + "]" * 100000).encode(),
    ]
    cases[-1] = (cases[-1], 400, None)
    for raw, expected, field in cases:
        status, body, _ = server.request("POST", "/v1/plans", raw=raw)
        assert_error(status, body, expected, field)
    # unparsable HLO names the line; an unknown preset lists the presets
    status, body, _ = server.request("POST", "/v1/plans", {**ok, "hlo_text": "HloModule m\nENTRY e {\n  x = f32[2] bogus(\n}"})
    assert_error(status, body, 400, "hlo_text")
    assert "line 3" in body["message"]
    status, body, _ = server.request("POST", "/v1/plans", {**ok, "cluster": "moon-base"})
    assert_error(status, body, 400, "cluster")
    assert "dgx-a100-8" in body["message"] and "16x8-ib" in body["message"]
    # cluster YAML is read as every cluster file is (disco.sim.cluster_spec.parse_yaml): a key twice is refused
    from disco.sim.cluster import preset

    twice = preset("dgx-a100-8").to_yaml() + "nodes: 2\n"
    status, body, _ = server.request("POST", "/v1/plans", {**ok, "cluster": {"yaml": twice}})
    assert_error(status, body, 400, "cluster.yaml")
    assert "found duplicate key 'nodes'" in body["message"]
    # wrong content type, missing and wrong token
    status, body, _ = server.request("POST", "/v1/plans", raw=b"x", headers={"Content-Type": "text/plain"})
    assert_error(status, body, 415)
    for auth in ("", "Bearer nope", "Basic czNjcmV0"):
        status, body, headers = server.request("POST", "/v1/plans", ok, headers={"Authorization": auth})
        assert_error(status, body, 401)
        assert headers.get("WWW-Authenticate") == "Bearer"
    # a body over MAX_CONTENT_LENGTH (64 MB) is refused from its Content-Length
    status, body = _raw_post(server, "/v1/plans", {"Content-Type": "application/json", "Content-Length": str(80 << 20),
                                                   "Authorization": f"Bearer {TOKEN}"}, b"{" * 1024)
    assert_error(status, body, 413)
    # unknown ids, routes and methods
    for path in ("/v1/jobs/0123456789abcdef", "/v1/jobs/..%2f", "/v1/plans/nothere", "/plans/nothere", "/nope"):
        status, body, _ = server.request("GET", path)
        assert_error(status, body, 404)
    status, body, _ = server.request("DELETE", "/v1/plans")
    assert_error(status, body, 405)
    # profiles
    plan = {"schema_version": 1, "name": "p", "groups": [], "xla_fusion": "extend", "buckets": None,
            "compile_options": {}}
    for bad, field in (([], None), ({"a": 1}, None), ([{"fingerprint": "f"}], "[0].plan"),
                       ([{"fingerprint": "f", "plan": {"x": 1}, "step_time_ms": 1.0}], "[0].plan"),
                       ([{"fingerprint": "f", "plan": plan, "step_time_ms": -1}], "[0].step_time_ms")):
        status, body, _ = server.request("POST", "/v1/profiles", bad)
        assert_error(status, body, 400, field)
    status, body, _ = server.request("POST", "/v1/profiles", [
        {"fingerprint": "abc", "plan": plan, "step_time_ms": 3.5, "device_kind": "cpu"},
        {"fingerprint": "abc", "plan": plan, "step_time_ms": 3.7, "extra": {"round": 2}}])
    assert status == 201 and body == {"stored": 2}
    status, body, _ = server.request("GET", "/healthz")
    assert status == 200 and body["status"] == "ok"


def test_openapi_covers_every_endpoint(server):
    status, doc, _ = server.request("GET", "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/v1/plans", "/v1/plans/{key}", "/v1/jobs/{job_id}", "/v1/profiles", "/v1/trials",
                                 "/plans/{key}", "/healthz", "/openapi.json"}
    assert "PlanRequest" in doc["components"]["schemas"]


def _fuzz(server, op, mode, failures, calls):
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=8, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def call(case):
        calls.append(op.label)
        try:
            case.call_and_validate(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"},
                                   checks=[not_a_server_error], timeout=30)
        except Exception as e:  # noqa: BLE001 - collect every failure, then report
            failures.append(f"{op.label} ({mode.value}): {str(e)[:500]}")

    try:
        call()
    except hypothesis.errors.Unsatisfiable:
        pass  # no negative data for an operation without parameters


def test_schemathesis_finds_no_server_errors(server):
    # schemathesis' pytest plugin does not load under pytest 9, so the operations are driven here.
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    failures, calls = [], []
    for result in api.get_all_operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(server, result.ok(), mode, failures, calls)
    assert not failures, "\n".join(failures[:5])
    assert {"POST /v1/plans", "POST /v1/profiles", "GET /v1/jobs/{job_id}"} <= set(calls) and len(calls) > 40, calls
    assert server.request("GET", "/healthz")[0] == 200


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_jobs_survive_a_killed_server(tmp_path):
    import socket

    db = tmp_path / "restart.sqlite"
    with ServerProcess(db, workers=1) as first:
        status, body, _ = first.request("POST", "/v1/plans", plan_body(seed=3, strategy="random", budget_s=3.0))
        assert status == 202
        job = first.wait_job(body["job_id"], timeout=30, states=("running", "done", "failed"))
        assert job["state"] == "running", job
        first.kill()  # SIGKILL while the job runs
        assert first.proc is None
    # a job row left by a dead server without its inputs (as from an older server)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO jobs (id, key, state, request, owner, heartbeat_at, created_at) "
                     "VALUES ('00000000deadbeef', 'k', 'running', NULL, ?, ?, ?)",
                     (f"{socket.gethostname()}:{_dead_pid()}:x", time.time(), time.time()))
    with ServerProcess(db, workers=1) as second:
        job = second.wait_job(body["job_id"], timeout=5, states=("queued", "running", "done", "failed"))
        assert job["attempts"] == 1 and job["state"] != "failed", job
        assert job["state"] in ("queued", "running", "done")
        job = second.wait_job(body["job_id"], timeout=30)
        assert job["state"] == "done" and job["result"]["plan"], job
        status, lost, _ = second.request("GET", "/v1/jobs/00000000deadbeef")
        assert status == 200 and lost["state"] == "failed"
        assert "server restarted during the job" in lost["error"]["message"]


class _DiskFull:
    """No file write of the server's process succeeds while inside (RLIMIT_FSIZE 0: SQLite's 'disk I/O error')."""

    def __init__(self, server):
        self.pid = server.proc.pid

    def __enter__(self):
        self.before = resource.prlimit(self.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (0, self.before[1]))

    def __exit__(self, *exc):
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, self.before)


needs_prlimit = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit")


@needs_prlimit
@pytest.mark.slow
def test_a_job_whose_end_cannot_be_written_is_run_again(tmp_path):
    """The disk is full when the job ends (its plan and its failure both unwritable): it is not left running."""
    with ServerProcess(tmp_path / "lost.sqlite", workers=1) as srv:
        status, body, _ = srv.request("POST", "/v1/plans", plan_body(seed=62, strategy="random", budget_s=2.0))
        assert status == 202, body
        job = srv.wait_job(body["job_id"], timeout=30, states=("running", "done", "failed"))
        assert job["state"] == "running", job
        with _DiskFull(srv):
            time.sleep(8.0)  # the job ends meanwhile (a 2 s search; room for a loaded machine)
        job = srv.wait_job(body["job_id"], timeout=40)
        assert job["state"] == "done" and job["attempts"] == 1 and job["result"]["plan"], job
        # the same key asked again is answered from the plan, not joined to a job nobody runs
        status, cached, _ = srv.request("POST", "/v1/plans", plan_body(seed=62, strategy="random", budget_s=2.0))
        assert status == 200 and cached["key"] == body["key"], cached


@needs_prlimit
def test_a_full_disk_is_answered_with_sqlites_reason(tmp_path):
    plan = {"schema_version": 1, "name": "p", "groups": [], "xla_fusion": "extend", "buckets": None,
            "compile_options": {}}
    samples = [{"fingerprint": "abc", "plan": plan, "step_time_ms": 3.5, "extra": {"note": "x" * 4000}}] * 1000
    with ServerProcess(tmp_path / "full.sqlite", workers=1) as srv:
        for body in (samples[:1], samples):  # a small write fails as it commits, a large one while it is written
            with _DiskFull(srv):
                status, answer, headers = srv.request("POST", "/v1/profiles", body)
            assert_error(status, answer, 503)
            assert answer["code"] == "database_unavailable" and "disk I/O error" in answer["message"], answer
            assert headers.get("Retry-After", "").isdigit()
        status, answer, _ = srv.request("POST", "/v1/profiles", samples)  # room again
        assert status == 201 and answer["stored"] == len(samples), answer


# -- the Flask test client ---------------------------------------------------------------------------
@pytest.fixture(params=BACKENDS)
def app(request, tmp_path):
    app = create_app({"DATABASE": new_database(request, request.param, tmp_path, "app"), "WORKERS": 1,
                      "QUEUE_SIZE": 1, "TESTING": True})
    assert "disco_jobs" not in app.extensions  # create_app starts nothing
    yield app
    stop_runner(app)


@pytest.fixture
def client(app):
    return app.test_client()


ENVIRONMENT = {"jax": "0.10.2", "jaxlib": "0.10.2", "platform": "cpu", "device_kind": "cpu", "processes": 2,
               "devices_per_process": 2, "xla_flags": []}


def test_a_plan_is_answered_only_for_its_environment(client):
    """Issue 43: the same program, cluster and options under two environments (jax versions here)
    are two plans, and the report says which environment each was made for; a request naming
    none keeps the key it had before environments were part of it."""
    keys = {}
    for name, body in [("none", plan_body()), ("env", {**plan_body(), "environment": ENVIRONMENT}),
                       ("other", {**plan_body(), "environment": {**ENVIRONMENT, "jax": "0.12.0.1"}})]:
        r = client.post("/v1/plans", json=body)
        assert r.status_code == 202, r.json
        keys[name] = r.json["key"]
        job, deadline = r.json, time.monotonic() + 60
        while job["state"] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = client.get(f"/v1/jobs/{r.json['job_id']}").json
        assert job["state"] == "done", job
        assert job["result"]["report"].get("environment") == body.get("environment")
    assert len(set(keys.values())) == 3
    r = client.post("/v1/plans", json={**plan_body(), "environment": {**ENVIRONMENT, "processes": 0}})
    assert_error(r.status_code, r.json, 400, "environment.processes")


def test_full_queue_answers_503_with_retry_after(client):
    def post(seed):
        return client.post("/v1/plans", json=plan_body(seed=seed, strategy="random", budget_s=2.0))

    first = post(100)
    assert first.status_code == 202
    deadline = time.monotonic() + 20
    while client.get(f"/v1/jobs/{first.json['job_id']}").json["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert post(101).status_code == 202  # waits in the queue (size 1)
    full = post(102)
    assert full.status_code == 503 and full.headers["Retry-After"].isdigit()
    assert full.json["code"] == "queue_full"
    # the refused job was committed, then failed: nobody waits on a job no worker will run
    failed = rows(client.application.config["DATABASE"], "SELECT state, error FROM jobs WHERE state = 'failed'")
    assert len(failed) == 1 and json.loads(failed[0][1])["code"] == "queue_full", failed
    assert post(102).status_code == 503  # asked again: a new job, refused again (not joined to the failed one)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("app", ["sqlite"], indirect=True)  # SQLite's database-wide write lock
def test_a_failed_progress_write_does_not_cut_the_search_short(client, monkeypatch):
    """The database is locked for a moment during the search: the job still searches its whole budget."""
    import service.store

    monkeypatch.setattr(service.store, "BUSY_TIMEOUT_S", 1.0)  # a write waits 1 s for the lock, then fails
    posted = client.post("/v1/plans", json=plan_body(seed=61, strategy="auto", budget_s=4.0))
    assert posted.status_code == 202, posted.json
    job_url = f"/v1/jobs/{posted.json['job_id']}"
    deadline = time.monotonic() + 30
    while "plans evaluated" not in client.get(job_url).json["message"]:
        assert time.monotonic() < deadline, client.get(job_url).json
        time.sleep(0.02)
    with sqlite3.connect(client.application.config["DATABASE"], isolation_level=None) as conn:
        conn.execute("BEGIN IMMEDIATE")  # another writer holds the lock: a progress report fails
        time.sleep(1.5)
        conn.execute("ROLLBACK")
    while client.get(job_url).json["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, client.get(job_url).json
        time.sleep(0.05)
    job = client.get(job_url).json
    assert job["state"] == "done", job
    report = job["result"]["report"]
    assert report["method"].startswith("search") and "error" not in report["search"], report


def test_graph_json_fingerprint_is_the_servers(client):
    from disco.ir.graph import HloGraph

    graph = HloGraph.from_hlo_text(mlp_hlo()).to_dict()
    a = client.post("/v1/plans", json={**plan_body(seed=5), "hlo_text": None, "graph": graph})
    b = client.post("/v1/plans", json={**plan_body(seed=5), "hlo_text": None,
                                       "graph": {**graph, "fingerprint": "0" * 32}})
    c = client.post("/v1/plans", json={**plan_body(seed=5), "hlo_text": None,
                                       "graph": {k: v for k, v in graph.items() if k != "fingerprint"}})
    h = client.post("/v1/plans", json=plan_body(seed=5))
    assert {r.status_code for r in (a, b, c, h)} <= {200, 202}, (a.json, b.json, c.json, h.json)
    assert a.json["key"] == b.json["key"] == c.json["key"]  # the client's fingerprint is ignored
    assert h.json["key"] != a.json["key"]  # HLO and graph JSON are identified apart


def test_report_page_speedups_are_xla_default_over_plan(client):
    """"speedup vs xla_default" is xla_default's time over the plan's everywhere: a plan slower than
    xla_default shows a value below 1, a faster one above 1."""
    report = {"graph": {"name": "g", "nodes": 3, "all_reduces": 1, "fingerprint": "f"},
              "cluster": {"name": "local", "devices": 4}, "method": "baselines", "strategy": "baselines",
              "cost_model": {"name": "analytic", "version": 1}, "plan_summary": {}, "chosen": "ddp",
              "plan_ms": 20.0, "lower_bound_ms": 4.0, "speedup_vs_xla_default": 0.5,
              "baselines_ms": {"xla_default": 10.0, "per_tensor": 5.0, "ddp": 20.0}}
    with Store(client.application.config["DATABASE"]) as store:
        job, _ = store.submit("k" * 32, {})
        store.finish_job(job["job_id"], "k" * 32, "f", {}, report, [["a", "compute", 0.0, 1.0]])
    page = client.get("/plans/" + "k" * 32).get_data(as_text=True)
    assert "speedup vs xla_default (higher is faster)" in page
    rows = re.findall(r'<td>(?:<i>)?([a-z_() ]+?)(?:</i>)?</td><td class="num">[0-9.]+</td>\n'
                      r'<td class="num">([0-9.]+)x</td>', page)
    assert rows == [("this plan (ddp)", "0.500"), ("per_tensor", "2.000"), ("xla_default", "1.000"),
                    ("ddp", "0.500"), ("lower bound", "2.500")], page


def test_healthz_does_not_import_jax(tmp_path):
    code = ("import sys; from service import create_app; "
            f"app = create_app({{'DATABASE': {str(tmp_path / 'h.sqlite')!r}, 'WORKERS': 0}}); "
            "r = app.test_client().get('/healthz'); assert r.status_code == 200, r.data; "
            "print(sorted(m for m in ('jax', 'jaxlib', 'flax') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- issue 19: identity, limits, expensive input, configuration, health, HTTP details -------------------
def tiny_graph(fingerprint: str) -> dict:
    def node(name, opcode, operands=(), flops=0.0):
        return {"name": name, "opcode": opcode, "computation": "main", "shape": "f32[4]", "dtype": "f32",
                "out_bytes": 16, "out_elements": 4, "flops": flops, "operands": list(operands)}

    return {"schema": "disco.graph/1", "name": "three", "fingerprint": fingerprint,
            "nodes": [node("p", "parameter"), node("n", "negate", ["p"], 4.0), node("r", "add", ["n", "n"], 4.0)],
            "edges": [[0, 1], [1, 2]]}


def hlo_chain(n: int, dim: str = "64,64") -> str:
    lines = ["HloModule chain", "", "ENTRY main {", f"  p0 = f32[{dim}] parameter(0)"]
    lines += [f"  a{i} = f32[{dim}] add({'p0' if i == 0 else f'a{i - 1}'}, p0)" for i in range(n)]
    lines += [f"  ROOT r = f32[{dim}] negate(a{n - 1})", "}"]
    return "\n".join(lines)


def jobs_in(db) -> int:
    return rows(db, "SELECT COUNT(*) FROM jobs")[0][0]


def test_a_client_fingerprint_cannot_poison_another_programs_plan(server):
    from disco.ir.graph import HloGraph

    victim = HloGraph.from_hlo_text(mlp_hlo())
    body = {**plan_body(seed=21), "hlo_text": None, "graph": tiny_graph(victim.fingerprint)}
    status, attack, _ = server.request("POST", "/v1/plans", body)
    assert status == 202, attack
    job = server.wait_job(attack["job_id"])
    assert job["state"] == "done", job
    assert job["result"]["report"]["graph"]["nodes"] == 3
    assert job["result"]["report"]["graph"]["fingerprint"] != victim.fingerprint  # the server's own digest
    # the victim's real HLO gets its own key, plan and report
    status, real, _ = server.request("POST", "/v1/plans", plan_body(seed=21))
    assert status == 202 and real["key"] != attack["key"], real
    job = server.wait_job(real["job_id"])
    report = job["result"]["report"]
    assert report["graph"]["nodes"] == len(victim.nodes) and report["graph"]["fingerprint"] == victim.fingerprint
    status, stored, _ = server.request("GET", f"/v1/plans/{real['key']}")
    assert stored["fingerprint"] == victim.fingerprint


def test_limits_are_checked_before_a_job_exists(server):
    before = jobs_in(server.db)
    graph = tiny_graph("f")
    node = graph["nodes"][1]
    dgx = "nodes: {n}\ndevices_per_node: {d}\nintra: {{bandwidth: 100 GB/s, latency: 1 us}}\n" \
          "inter: {{bandwidth: {bw}, latency: 5 us}}\nname: big\n"
    cases = [
        # HLO: a 400-digit dimension (was a 500 OverflowError), a dimension past 2^40
        ({"hlo_text": hlo_chain(2, "1" + "0" * 399)}, "hlo_text", "400 digits"),
        ({"hlo_text": hlo_chain(2, str(2**41))}, "hlo_text", "2^40"),
        ({"hlo_text": hlo_chain(2, f"{2**30},{2**30}")}, "hlo_text", "2^48"),
        # graph JSON: wrong types, absurd flops, operands and edges that do not make a DAG
        ({"graph": {**graph, "nodes": [graph["nodes"][0], {**node, "out_bytes": "16"}, graph["nodes"][2]]}},
         "graph.nodes[1].out_bytes", "integer"),
        ({"graph": {**graph, "nodes": [graph["nodes"][0], {**node, "flops": 1e308}, graph["nodes"][2]]}},
         "graph.nodes[1].flops", "less than or equal"),
        ({"graph": {**graph, "nodes": [graph["nodes"][0], {**node, "out_elements": True}, graph["nodes"][2]]}},
         "graph.nodes[1].out_elements", "integer"),
        ({"graph": {**graph, "nodes": [graph["nodes"][0], {**node, "operands": ["r"]}, graph["nodes"][2]]}},
         "graph", "not the name of an earlier node"),
        ({"graph": {**graph, "edges": [[1, 0]]}}, "graph", "topological"),
        ({"graph": {**graph, "nodes": []}}, "graph.nodes", "at least 1"),
        # clusters: 10^6 devices, a million local devices, a link of 10 B/s: inside what a ClusterSpec
        # may hold (disco.sim.cluster_spec.MAX_DEVICES, MIN_BANDWIDTH), outside the service's limits
        ({"cluster": {"yaml": dgx.format(n=1000, d=1000, bw="25 GB/s")}, "devices": None}, "cluster.yaml",
         "at most 65536"),
        ({"devices": 10**6}, "devices", "less than or equal to 65536"),
        ({"cluster": {"yaml": dgx.format(n=2, d=8, bw="10")}, "devices": None}, "cluster.yaml",
         "bytes/s"),
    ]
    for change, field, words in cases:
        body = {**plan_body(seed=22), **change}
        if "graph" in change:
            body["hlo_text"] = None
        status, answer, _ = server.request("POST", "/v1/plans", body)
        assert_error(status, answer, 400, field)
        assert words in answer["message"], (field, answer)
    # reject early: too many lines is refused without parsing
    status, answer, _ = server.request("POST", "/v1/plans", {**plan_body(), "hlo_text": "HloModule m\n" * 200_001})
    assert_error(status, answer, 400, "hlo_text")
    assert "at most 200000" in answer["message"], answer  # the line count, not a parse, refused it
    assert jobs_in(server.db) == before  # nothing was accepted
    assert server.request("GET", "/healthz")[0] == 200


def hlo_loops(loops: int, body: int) -> str:
    """``loops`` while loops in a row, all running one body of ``body`` adds: a text of about
    ``loops + body`` lines whose graph holds ``loops * body`` loop-body nodes."""
    lines = ["HloModule loops", "", "body {", "  prev = (s32[], f32[64,64]) parameter(0)",
             "  i = s32[] get-tuple-element(prev), index=0", "  v0 = f32[64,64] get-tuple-element(prev), index=1",
             "  one = s32[] constant(1)", "  next = s32[] add(i, one)"]
    lines += [f"  v{j + 1} = f32[64,64] add(v{j}, v{j})" for j in range(body)]
    lines += [f"  ROOT t = (s32[], f32[64,64]) tuple(next, v{body})", "}", "",
              "cond {", "  p = (s32[], f32[64,64]) parameter(0)", "  c = s32[] get-tuple-element(p), index=0",
              "  lim = s32[] constant(5)", "  ROOT lt = pred[] compare(c, lim), direction=LT", "}", "",
              "ENTRY main {", "  x = f32[64,64] parameter(0)", "  zero = s32[] constant(0)",
              "  w0 = (s32[], f32[64,64]) tuple(zero, x)"]
    lines += [f"  w{k + 1} = (s32[], f32[64,64]) while(w{k}), condition=cond, body=body" for k in range(loops)]
    lines += [f"  ROOT r = f32[64,64] get-tuple-element(w{loops}), index=1", "}"]
    return "\n".join(lines)


def test_the_node_limit_counts_the_nodes_of_loop_bodies(client):
    """60 loops over one body of 1,000 adds: 1,100 lines, 60,000 nodes to simulate; the limit is 50,000."""
    answer = client.post("/v1/plans", json={**plan_body(), "hlo_text": hlo_loops(60, 1_000)})
    assert_error(answer.status_code, answer.json, 400, "hlo_text")
    assert re.search(r"has 6\d{4} instructions \(6\d{4} of them in while loops\); the service accepts at most "
                     r"50000", answer.json["message"]), answer.json
    assert jobs_in(client.application.config["DATABASE"]) == 0
    small = client.post("/v1/plans", json={**plan_body(), "hlo_text": hlo_loops(2, 1_000)})
    assert small.status_code == 202, small.json  # loops within the limit are still planned


def test_calls_nested_too_deeply_are_refused_not_a_server_error(client):
    """1,500 computations, each calling the next: the parse is flat, building the graph recursed past
    Python's limit in the checking process, and the request was answered 500."""
    comps = [f"c{i} {{\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] call(p), to_apply=c{i + 1}\n}}\n"
             for i in range(1_499)]
    comps.append("c1499 {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}\n")
    text = "HloModule calls\n\n" + "\n".join(comps) + \
        "\nENTRY main {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] call(x), to_apply=c0\n}"
    answer = client.post("/v1/plans", json={**plan_body(), "hlo_text": text})
    assert_error(answer.status_code, answer.json, 400, "hlo_text")
    assert "nested too deeply" in answer.json["message"], answer.json
    assert jobs_in(client.application.config["DATABASE"]) == 0


def test_a_cluster_name_that_is_not_unicode_text_is_refused(client):
    """YAML's "\\ud800" escape makes a lone surrogate, which no UTF-8 text holds: such a cluster was
    planned, and its plan's report page (which shows the name) answered 500."""
    yaml = "nodes: 1\ndevices_per_node: 4\nintra: {bandwidth: 1e9, latency: 1e-6}\n"
    for key in ("name", "description", "label"):
        answer = client.post("/v1/plans", json={**plan_body(), "devices": None,
                                                "cluster": {"yaml": yaml + f'{key}: "a\\ud800b"\n'}})
        assert_error(answer.status_code, answer.json, 400, "cluster.yaml")
        assert f"cluster.yaml.{key}: " in answer.json["message"] and "surrogate" in answer.json["message"], answer.json
    assert jobs_in(client.application.config["DATABASE"]) == 0
    answer = client.post("/v1/plans", json={**plan_body(), "devices": None,
                                            "cluster": {"yaml": yaml + 'name: "caf\\u00e9 \\U0001F600"\n'}})
    assert answer.status_code == 202, answer.json  # escapes of characters are fine


def test_a_check_past_the_parse_timeout_is_killed_and_refused():
    """The timeout path on its own: 10 ms is less than starting the checking process takes."""
    from service.errors import ApiError
    from service.intake import Intake

    with pytest.raises(ApiError) as err:
        Intake(timeout_s=0.01).hlo(hlo_chain(1_000))
    assert err.value.status == 400 and err.value.code == "too_large" and err.value.field == "hlo_text"
    assert "checking it took longer than PARSE_TIMEOUT_S=0.01 s" in err.value.message


def test_expensive_hlo_is_checked_off_the_request_thread(tmp_path):
    big = hlo_chain(100_000)  # 3.7 MB: the chain, twice the graph limit
    # 3 s: the mlp's check fits even on a loaded machine. The chain's check took 6.4 s before issue
    # 18's parser and 2.6 s after it (quiet machine, 2026-11-24), so it may or may not fit: either
    # it is killed at the timeout or its graph is refused by size. Both refuse it; the timeout path
    # alone is tested above.
    with ServerProcess(tmp_path / "parse.sqlite", workers=2, extra_args=("--parse-timeout", "3")) as srv:
        warm = srv.request("POST", "/v1/plans", plan_body(seed=23))
        assert warm[0] == 202 and srv.wait_job(warm[1]["job_id"])["state"] == "done"
        done: dict = {}

        def post_big():
            done["answer"] = srv.request("POST", "/v1/plans", {**plan_body(), "hlo_text": big})

        t = threading.Thread(target=post_big)
        t.start()
        time.sleep(0.3)
        # while the big text is being checked, the server keeps answering others: several
        # answers arrive before the big POST's own (a server that parsed inline would answer
        # them only after it)
        answered_while_pending = 0
        while t.is_alive():
            status, _, _ = srv.request("POST", "/v1/plans", plan_body(seed=23))
            assert status == 200
            answered_while_pending += t.is_alive()
        t.join()
        status, answer, _ = done["answer"]
        assert_error(status, answer, 400, "hlo_text")
        timed_out = answer["code"] == "too_large" and "PARSE_TIMEOUT_S=3" in answer["message"]
        too_big = answer["code"] == "invalid_hlo" and "100002 instructions; the service accepts at most 50000" in \
            answer["message"]
        assert timed_out or too_big, answer
        assert answered_while_pending >= 2, answered_while_pending
        assert jobs_in(srv.db) == 1


def test_plan_jobs_run_in_parallel(tmp_path):
    with ServerProcess(tmp_path / "par.sqlite", workers=2) as srv:
        ids = []
        for seed in (31, 32):
            status, body, _ = srv.request("POST", "/v1/plans", plan_body(seed=seed, strategy="random", budget_s=3.0))
            assert status == 202
            ids.append(body["job_id"])
        deadline = time.monotonic() + 30
        while True:
            states = [srv.request("GET", f"/v1/jobs/{i}")[1]["state"] for i in ids]
            if states == ["running", "running"]:
                break
            assert time.monotonic() < deadline and "done" not in states, states
            time.sleep(0.05)
        assert all(srv.wait_job(i)["state"] == "done" for i in ids)


def test_unsafe_configuration_is_refused_or_warned(tmp_path):
    # an empty token is an error (it would turn authentication off without a word)
    for kind in ("gunicorn", "serve"):
        srv = (ServerProcess(tmp_path / "e.sqlite", gunicorn=True, env={"DISCO_SERVICE_TOKEN": ""})
               if kind == "gunicorn" else ServerProcess(tmp_path / "e.sqlite", extra_args=("--token", "")))
        with pytest.raises(RuntimeError, match="exited") as e:
            srv.start(timeout=30)
        assert "empty" in str(e.value), str(e.value)[-2000:]
    # no token: a warning that says who can write
    with ServerProcess(tmp_path / "w.sqlite") as srv:
        assert srv.request("POST", "/v1/profiles", [])[0] == 400  # anonymous writes reach validation
        assert "no write token" in srv.tail() and "anyone who can reach the server" in srv.tail()
    # bound beyond loopback: a warning naming the bind, even with a token
    with ServerProcess(tmp_path / "b.sqlite", host="0.0.0.0", token=TOKEN) as srv:
        log = srv.tail()
        assert "beyond loopback" in log and "writes need the token" in log, log
        assert "no write token" not in log
    with ServerProcess(tmp_path / "l.sqlite", token=TOKEN) as srv:
        assert "beyond loopback" not in srv.tail() and "no write token" not in srv.tail()


def test_a_token_with_surrounding_whitespace_authenticates_without_it(tmp_path):
    """A token read from a file ends in a newline: the server compares it stripped, as the client sends it."""
    with ServerProcess(tmp_path / "w.sqlite", env={"DISCO_SERVICE_TOKEN": f" {TOKEN}\n"}) as srv:
        for sent, status in ((TOKEN, 400), ("other", 401)):
            got = srv.request("POST", "/v1/profiles", [], headers={"Authorization": f"Bearer {sent}"})[0]
            assert got == status, (sent, got)  # 400: past authentication, refused by validation


def test_request_log_is_plain_text_in_a_file_and_coloured_on_a_terminal(tmp_path, monkeypatch):
    from service.cli import _colour

    with ServerProcess(tmp_path / "c.sqlite", token=TOKEN) as srv:
        assert srv.request("GET", "/v1/no-such-route")[0] == 404
        assert srv.request("POST", "/v1/profiles", [])[0] == 400
        log = srv.tail()
    assert '"GET /v1/no-such-route HTTP/1.1" 404' in log and '"POST /v1/profiles HTTP/1.1" 400' in log, log
    assert "\x1b[" not in log, log  # Werkzeug's colours stay out of a redirected log
    main, other = os.openpty()
    with os.fdopen(other, "w") as terminal, open(tmp_path / "f.log", "w") as file:
        monkeypatch.delenv("NO_COLOR", raising=False)
        assert _colour(terminal) and not _colour(file)
        monkeypatch.setenv("NO_COLOR", "1")
        assert not _colour(terminal)
    os.close(main)


@pytest.mark.parametrize("args, env, message", [
    (["--workers", "0"], {}, r"--workers: expected an integer >= 1 .*got 0"),
    ([], {"DISCO_SERVICE_WORKERS": "0"}, r"DISCO_SERVICE_WORKERS: expected an integer >= 1 .*got 0"),
    (["--queue-size", "0"], {}, r"--queue-size: expected an integer >= 1, got 0"),
    (["--job-timeout", "nan"], {}, r"--job-timeout: expected a positive, finite number of seconds, got nan"),
    (["--job-timeout", "inf"], {}, r"--job-timeout: expected a positive, finite number of seconds, got inf"),
    (["--parse-timeout", "0"], {}, r"--parse-timeout: expected a positive, finite number of seconds, got 0"),
    (["--port", "70000"], {}, r"--port: expected a TCP port 0-65535 .*got 70000"),
    (["--db", ""], {}, r"--db: expected a file path or a postgresql:// URL, got an empty one"),
    (["--db", "{tmp}"], {}, r"--db: expected an SQLite database file, got the directory '{tmp}'"),
    (["--db", "{tmp}/text.sqlite"], {}, r"--db: expected an SQLite database, got '{tmp}/text.sqlite' "
                                        r"\(file is not a database\)"),
    (["--db", "{tmp}/missing/p.sqlite"], {},
     r"--db: expected a database file in an existing directory, got '{tmp}/missing/p.sqlite' "
     r"\(no directory '{tmp}/missing'; create it first\)"),
    ([], {"DISCO_SERVICE_DB": "{tmp}/missing/p.sqlite"},
     r"DISCO_SERVICE_DB: expected a database file in an existing directory, got '{tmp}/missing/p.sqlite'"),
    ([], {"DISCO_SERVICE_TOKEN": ""}, r"DISCO_SERVICE_TOKEN is set but empty"),
    (["--job-lease", "0"], {}, r"--job-lease: expected a positive, finite number of seconds, got 0"),
    (["--db", "postgresql://disco:pw@127.0.0.1:1/x"], {},  # nothing listens on port 1; the password is not shown
     r"--db: (expected a PostgreSQL database that takes connections, got 'postgresql://disco:\*\*\*@127\.0\.0\.1:1/x' "
     r"\(.*|a postgresql:// database needs the driver psycopg)"),
], ids=["workers", "env-workers", "queue-size", "job-timeout-nan", "job-timeout-inf", "parse-timeout", "port",
        "db-empty", "db-directory", "db-not-a-database", "db-missing-directory", "env-db-missing-directory",
        "env-token-empty", "job-lease", "db-postgres-unreachable"])
def test_disco_serve_refuses_bad_settings_in_one_line(tmp_path, args, env, message):
    """Refused at start: one line naming the option, exit status 2, no traceback, no directory made."""
    (tmp_path / "text.sqlite").write_text("not a database\n" * 10)
    tmp = str(tmp_path)
    args = [a.format(tmp=tmp) for a in args]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), **{k: v.format(tmp=tmp) for k, v in env.items()}}
    if "--db" not in args and "DISCO_SERVICE_DB" not in env:
        args += ["--db", str(tmp_path / "ok.sqlite")]
    cmd = [sys.executable, "-m", "disco", "serve", "--port", "0", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert re.fullmatch("disco serve: error: " + message.format(tmp=re.escape(tmp)) + ".*", out.stderr.strip()), \
        out.stderr
    assert not (tmp_path / "missing").exists()


def test_disco_serve_refuses_an_address_it_cannot_listen_on(tmp_path):
    """A port another program holds, or a host that is not this machine's: one line, exit status 2."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for host, message in (("127.0.0.1", rf"cannot listen on 127\.0\.0\.1:{port}: .*in use.*; another program "
                               r"listens there: stop it, or give another --port \(0: any free port\)"),
                              ("nosuch.invalid", rf"cannot listen on nosuch\.invalid:{port}: .*; expected an address "
                               r"of this machine or a name that resolves to one \(--host\)")):
            cmd = [sys.executable, "-m", "disco", "serve", "--host", host, "--port", str(port), "--token", "t",
                   "--db", str(tmp_path / "p.sqlite")]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            assert out.returncode == 2, out.stderr
            assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert re.fullmatch("disco serve: error: " + message, out.stderr.strip()), out.stderr


@pytest.mark.fast
def test_create_app_refuses_a_database_it_cannot_use(tmp_path, monkeypatch):
    """gunicorn's path (create_app) refuses what ``disco serve --db`` refuses, naming its setting."""
    (tmp_path / "text.sqlite").write_text("not a database\n" * 10)
    with pytest.raises(ValueError, match=r"^config DATABASE: expected an SQLite database file, got the directory"):
        create_app({"DATABASE": str(tmp_path)})
    with pytest.raises(ValueError, match=r"^config DATABASE: expected an SQLite database, .*not a database"):
        create_app({"DATABASE": str(tmp_path / "text.sqlite")})
    monkeypatch.setenv("DISCO_SERVICE_DB", str(tmp_path / "missing" / "p.sqlite"))
    with pytest.raises(ValueError, match=r"^DISCO_SERVICE_DB: expected a database file in an existing directory"):
        create_app()
    assert not (tmp_path / "missing").exists()


@pytest.mark.fast
def test_a_database_of_another_layout_is_refused_and_left_as_it_was(tmp_path):
    """A newer disco's database (a higher schema version) and another program's file with a table of
    disco's name are refused at start, naming what was found and what was expected; neither is written."""
    import sqlite3

    from service import store as store_mod

    newer = tmp_path / "newer.sqlite"
    create_app({"DATABASE": str(newer)})  # this version's file
    conn = sqlite3.connect(newer)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == store_mod.SCHEMA_VERSION
    conn.execute(f"PRAGMA user_version = {store_mod.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ValueError, match=rf"^config DATABASE: the database .* has schema version "
                                         rf"{store_mod.SCHEMA_VERSION + 1}, written by a newer disco; expected version "
                                         rf"{store_mod.SCHEMA_VERSION} or a new file"):
        create_app({"DATABASE": str(newer)})

    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE plans (key TEXT PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO plans VALUES ('k', 'theirs')")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(ValueError, match=r"^config DATABASE: the database .* has a table 'plans' without the "
                                         r"column\(s\) fingerprint, plan, report, timeline, created_at; expected "
                                         r"disco's plan store"):
        create_app({"DATABASE": str(foreign)})
    assert foreign.read_bytes() == before
    conn = sqlite3.connect(foreign)
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("plans",), ("sqlite_autoindex_plans_1",)]
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    conn.close()


@pytest.mark.fast
def test_a_database_written_before_the_schema_version_is_used_and_stamped(tmp_path):
    """A file of this layout without a recorded version (written before disco recorded one) keeps its
    plans and gets the version."""
    import sqlite3

    from service import store as store_mod

    from service import schema

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    for stmt in version_1_tables(schema.SQLITE_TYPES):
        conn.execute(stmt)
    conn.execute("INSERT INTO plans VALUES ('k', 'f', '{}', '{}', NULL, 1.0)")
    conn.commit()
    conn.close()
    create_app({"DATABASE": str(path)})
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == store_mod.SCHEMA_VERSION
    assert conn.execute("SELECT key FROM plans").fetchall() == [("k",)]
    assert "lease_until" in {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}  # migrated to version 2
    conn.close()


def version_1_tables(types: dict[str, str]) -> list[str]:
    """The tables as schema version 1 made them (no ``jobs.lease_until``)."""
    from service import schema

    real = types["real"]
    out = [s.replace(f",\n    lease_until {real}", "") for s in schema.tables(types)]
    assert sum("lease_until" in s for s in out) == 0
    return out


def test_disco_serve_takes_the_token_from_the_environment(tmp_path):
    with ServerProcess(tmp_path / "t.sqlite", env={"DISCO_SERVICE_TOKEN": TOKEN}) as srv:
        status, body, _ = srv.request("POST", "/v1/profiles", [])  # no token sent
        assert_error(status, body, 401)
        status, body, _ = srv.request("POST", "/v1/profiles", [], headers={"Authorization": f"Bearer {TOKEN}"})
        assert_error(status, body, 400)  # the token from the environment lets the write through
        assert "no write token" not in srv.tail()


def _chattr(flag: str, path) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_database_failures_answer_503_with_the_reason(tmp_path):
    db = tmp_path / "health.sqlite"
    plan = {"schema_version": 1, "name": "p", "groups": [], "xla_fusion": "extend", "buckets": None,
            "compile_options": {}}
    sample = [{"fingerprint": "abc", "plan": plan, "step_time_ms": 3.5}]
    with ServerProcess(db, workers=1) as srv:
        status, body, _ = srv.request("POST", "/v1/plans", plan_body(seed=41))
        key = body["key"]
        assert srv.wait_job(body["job_id"])["state"] == "done"
    # the database is read-only when the server starts (root ignores file modes: chattr +i)
    files = [db] + [p for p in (tmp_path / "health.sqlite-wal", tmp_path / "health.sqlite-shm") if p.exists()]
    if os.geteuid() == 0:
        if not all(_chattr("+i", f) for f in files):
            pytest.skip("chattr +i is not supported here (needed to make the file read-only for root)")
    else:
        for f in files:
            os.chmod(f, 0o444)
    srv = ServerProcess(db, workers=1)
    try:
        srv.start(healthy=False)
        status, body, headers = srv.request("GET", "/healthz")
        assert_error(status, body, 503)
        assert body["code"] == "database_unavailable" and "readonly" in body["message"], body
        status, body, headers = srv.request("POST", "/v1/profiles", sample)
        assert_error(status, body, 503)
        assert body["code"] == "database_unavailable" and "readonly" in body["message"], body
        assert headers.get("Retry-After", "").isdigit()
        status, stored, _ = srv.request("GET", f"/v1/plans/{key}")  # reads still work
        assert status == 200 and stored["key"] == key
    finally:
        for f in files:
            if os.geteuid() == 0:
                _chattr("-i", f)
            else:
                os.chmod(f, 0o644)
    try:
        assert srv.request("GET", "/healthz")[0] == 200  # writable again: healthy again
        assert srv.request("POST", "/v1/profiles", sample)[0] == 201
        # a damaged file: every connection the server opens finds no database
        with open(db, "r+b") as f:
            f.write(b"this is not an SQLite file at all" * 4)
        for method, path, body in (("GET", "/healthz", None), ("POST", "/v1/profiles", sample),
                                   ("POST", "/v1/plans", plan_body(seed=42))):
            status, answer, _ = srv.request(method, path, body)
            assert_error(status, answer, 503)
            assert "not a database" in answer["message"], answer
    finally:
        srv.stop()


def test_http_details(server):
    # a chunked body over MAX_CONTENT_LENGTH (32 MiB) is 413, as one with a Content-Length is
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.putrequest("POST", "/v1/profiles")
        for k, v in {"Content-Type": "application/json", "Transfer-Encoding": "chunked",
                     "Authorization": f"Bearer {TOKEN}"}.items():
            conn.putheader(k, v)
        conn.endheaders()
        chunk = b"[" + b" " * (1 << 20)
        try:
            for _ in range(40):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = conn.getresponse()
        status, body = resp.status, json.loads(resp.read())
    finally:
        conn.close()
    assert_error(status, body, 413)
    # a request line over 64 KiB is 414, as JSON
    status, body, headers = server.request("GET", "/v1/plans/" + "a" * 70_000)
    assert_error(status, body, 414)
    assert headers["Content-Type"] == "application/json"
    # no versions in the Server header; a CSP on the HTML pages; an index page at /
    status, page, headers = server.request("GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and "/v1/plans" in page
    for path in ("/", "/healthz", "/nope"):
        server_header = server.request("GET", path)[2].get("Server", "")
        assert "Werkzeug" not in server_header and "Python" not in server_header, server_header
    status, body, _ = server.request("POST", "/v1/plans", plan_body(seed=1))
    assert status in (200, 202), body
    if status == 202:
        assert server.wait_job(body["job_id"])["state"] == "done"
    for path in ("/", f"/plans/{body['key']}"):
        status, page, headers = server.request("GET", path)
        csp = headers["Content-Security-Policy"]
        assert status == 200 and "default-src 'none'" in csp and "script-src" not in csp, csp
        assert "frame-ancestors 'none'" in csp and headers["X-Content-Type-Options"] == "nosniff"
        assert "<script" not in page


def test_gunicorn_workers_start_their_runners_lazily(tmp_path):
    with ServerProcess(tmp_path / "g.sqlite", gunicorn=True, gunicorn_workers=2, workers=2, token=TOKEN) as srv:
        status, body, _ = srv.request("POST", "/v1/plans", plan_body(seed=51))
        assert status == 202
        job = srv.wait_job(body["job_id"])
        assert job["state"] == "done", job
        status, health, _ = srv.request("GET", "/healthz")
        assert status == 200 and health["database"] == "ok"


def test_disco_serve_help_does_not_import_jax():
    code = ("import sys\nfrom disco.cli import main\ntry:\n    main(['serve', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint(sorted(m for m in ('jax', 'jaxlib', 'flax') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("[]") and "--parse-timeout" in out.stdout


# -- issue 45: PostgreSQL, plan workers of their own, replicas ------------------------------------------
def test_postgres_schema_is_versioned_migrated_and_checked_at_start(postgres):
    """A version-1 database is migrated (its plans kept); a newer one and a foreign table are refused,
    naming the database without its password and what was expected."""
    from service import schema

    url = postgres.create_database()
    with Store(url) as store:  # a database of schema version 1, as the first PostgreSQL store would have made it
        for stmt in ["CREATE TABLE disco_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)",
                     "INSERT INTO disco_schema VALUES (1, 1)", *version_1_tables(schema.POSTGRES_TYPES),
                     "INSERT INTO plans VALUES ('k', 'f', '{}', '{}', NULL, 1.0)"]:
            store._x(stmt)
    create_app({"DATABASE": url, "WORKERS": 0})
    assert rows(url, "SELECT version FROM disco_schema") == [(schema.SCHEMA_VERSION,)]
    assert rows(url, "SELECT key FROM plans") == [("k",)]
    assert rows(url, "SELECT COUNT(*) FROM information_schema.columns WHERE table_name = 'jobs' "
                     "AND column_name = 'lease_until'") == [(1,)]
    rows(url, "UPDATE disco_schema SET version = ? RETURNING version", (schema.SCHEMA_VERSION + 1,))
    with_password = url.replace("disco@", "disco:pw@")
    with pytest.raises(ValueError, match=rf"^config DATABASE: the database 'postgresql://disco:\*\*\*@.*' has schema "
                                         rf"version {schema.SCHEMA_VERSION + 1}, written by a newer disco; expected "
                                         rf"version {schema.SCHEMA_VERSION} or a new database"):
        create_app({"DATABASE": with_password})
    foreign = postgres.create_database()
    rows(foreign, "CREATE TABLE jobs (id TEXT PRIMARY KEY, body TEXT) ")
    with pytest.raises(ValueError, match=r"has a table 'jobs' without the column\(s\) key, state, .*disco's plan store"):
        create_app({"DATABASE": foreign})
    assert rows(foreign, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'") == [("jobs",)]
    with pytest.raises(ValueError, match=r"^config DATABASE: expected a PostgreSQL database that takes connections, "
                                         r"got 'postgresql://disco@127\.0\.0\.1:\d+/nosuch' \(.*does not exist"):
        create_app({"DATABASE": postgres.url("nosuch")})


def _owner_and_lease(db, job_id):
    return rows(db, "SELECT owner, lease_until FROM jobs WHERE id = ?", (job_id,))[0]


def test_a_killed_plan_worker_s_job_is_finished_by_another_after_its_lease(postgres, tmp_path):
    """A plan worker process (another host, as its owner id says) is SIGKILLed while it runs a job: nobody can
    see it die, so the job waits out its lease (3 s), then a second plan worker takes it over and finishes it."""
    url = postgres.create_database()
    lease = ("--job-lease", "3")
    # a replica that runs no plans (gunicorn, DISCO_SERVICE_WORKERS=0): the plan workers run them
    with ServerProcess(url, gunicorn=True, gunicorn_workers=1, workers=0, log=tmp_path / "replica.log") as replica:
        first = ServerProcess(url, plan_workers_only=True, workers=1, extra_args=lease, log=tmp_path / "w1.log",
                              env={"DISCO_SERVICE_HOSTNAME": "plan-host-1"}).start()
        try:
            status, body, _ = replica.request("POST", "/v1/plans", plan_body(seed=45, strategy="random", budget_s=3.0))
            assert status == 202, body
            job = replica.wait_job(body["job_id"], timeout=60, states=("running", "done", "failed"))
            assert job["state"] == "running", job
            owner, _ = _owner_and_lease(url, body["job_id"])
            assert owner.startswith("plan-host-1:"), owner
            first.kill()  # SIGKILL mid-job
            _, lease_until = _owner_and_lease(url, body["job_id"])
        finally:
            first.kill()
        with ServerProcess(url, plan_workers_only=True, workers=1, extra_args=lease, log=tmp_path / "w2.log",
                           env={"DISCO_SERVICE_HOSTNAME": "plan-host-2"}):
            job = replica.wait_job(body["job_id"], timeout=90)
            assert job["state"] == "done" and job["attempts"] == 1 and job["result"]["plan"], job
            assert job["started_at"] >= lease_until, (job, lease_until)  # taken over only once the lease ran out
            owner, _ = _owner_and_lease(url, body["job_id"])
            assert owner.startswith("plan-host-2:"), owner
        assert rows(url, "SELECT COUNT(*) FROM jobs") == [(1,)]


def test_two_replicas_answer_one_plan_for_concurrent_identical_posts(postgres, tmp_path):
    """Two ``disco serve`` replicas on one PostgreSQL database, 16 identical POSTs at once, half to each:
    one job in the database, and every answer (202 with that job, or 200 with the plan) has the same plan."""
    url = postgres.create_database()
    body = plan_body(seed=46, strategy="random", budget_s=1.0)
    with ServerProcess(url, workers=1, token=TOKEN, log=tmp_path / "a.log") as a, \
            ServerProcess(url, workers=1, token=TOKEN, log=tmp_path / "b.log") as b:
        replicas = (a, b)
        results: list = [None] * 16
        barrier = threading.Barrier(16)

        def post(i):
            barrier.wait()
            results[i] = replicas[i % 2].request("POST", "/v1/plans", body)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert {r[0] for r in results} <= {200, 202}, results
        job_ids = {r[1]["job_id"] for r in results if r[0] == 202}
        keys = {r[1]["key"] for r in results}
        assert len(job_ids) == 1 and len(keys) == 1, (job_ids, keys)
        job_id, key = job_ids.pop(), keys.pop()
        plans = {json.dumps(r[1]["plan"], sort_keys=True) for r in results if r[0] == 200}
        for srv in replicas:
            job = srv.wait_job(job_id, timeout=60)
            assert job["state"] == "done", job
            plans.add(json.dumps(job["result"]["plan"], sort_keys=True))
            status, stored, _ = srv.request("GET", f"/v1/plans/{key}")
            assert status == 200
            plans.add(json.dumps(stored["plan"], sort_keys=True))
        assert len(plans) == 1
    assert rows(url, "SELECT COUNT(*) FROM jobs WHERE key = ?", (key,)) == [(1,)]

"""The plan service's tiers (``options.tier``): a GPU cluster's plans ranked by the modules deviceless
XLA:GPU builds for them where the server has ``.venv-gpu``, the emulated tier elsewhere, and a request
for the compiled tier refused, saying why, where it cannot run.

The gpu_compile test runs a real server whose plan worker compiles for 8 H100s (``make
test-gpu-compile``); the others run everywhere, with the deviceless environment hidden."""

from __future__ import annotations

import re
import time

import pytest

pytest.importorskip("flask")

from disco import planner  # noqa: E402
from service import create_app  # noqa: E402
from service.jobs import NoCompiler, compiler, stop_runner  # noqa: E402
from service.store import Store  # noqa: E402
from service.testing import ServerProcess  # noqa: E402
from tests.support.service import mlp_hlo, plan_body  # noqa: E402
from xla_hooks import deviceless  # noqa: E402


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.GPU_PYTHON_ENV, str(tmp_path / "no-venv-gpu" / "python"))
    app = create_app({"DATABASE": str(tmp_path / "tiers.sqlite"), "WORKERS": 1, "TESTING": True})
    yield app.test_client()
    stop_runner(app)


def h100_body(**options) -> dict:
    return {**plan_body(**options), "cluster": "h100-sxm-8", "devices": None}


def wait(client, job_id: str) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end: {job}")


@pytest.mark.parametrize("body, message", [
    (h100_body(tier="compiled"), "no deviceless XLA:GPU environment here: run `make install-gpu`"),
    ({**h100_body(tier="compiled"), "hlo_text": None, "graph": {}}, None),  # graph JSON: checked below
    (plan_body(tier="compiled"), "the cluster's devices are CPUs"),
])
def test_the_compiled_tier_is_refused_where_it_cannot_run(client, body, message):
    if body.get("graph") == {}:
        from disco.ir.graph import HloGraph

        body = {**body, "graph": HloGraph.from_hlo_text(mlp_hlo()).to_dict()}
        message = "the request posts a graph JSON, not hlo_text"
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 400, r.json
    assert r.json["field"] == "options.tier" and message in r.json["message"], r.json
    assert "expected 'auto' or 'emulated'" in r.json["message"]
    with Store(client.application.config["DATABASE"]) as store:
        assert store.backlog() == 0  # refused before a job exists


def test_auto_falls_back_to_the_emulated_tier_and_keeps_the_keys_of_plans_stored_before_tiers(client):
    keys, reports = [], []
    for tier in (None, "auto", "emulated"):
        body = h100_body(seed=3) if tier is None else h100_body(seed=3, tier=tier)
        r = client.post("/v1/plans", json=body)
        assert r.status_code in (200, 202), r.json
        keys.append(r.json["key"])
        if r.status_code == 202:
            job = wait(client, r.json["job_id"])
            assert job["state"] == "done", job
            reports.append(job["result"]["report"])
    assert len(set(keys)) == 1 and len(reports) == 1  # one job: the same request three ways
    report = reports[0]
    assert report["tier"] == "emulated" and "make install-gpu" in report["tier_note"], report
    assert "compiled" not in report
    # the key a request had before options.tier existed: its options, none of them a tier
    from disco.ir.graph import HloGraph
    from disco.sim.cluster import preset
    from service.programs import program_identity

    identity = program_identity("hlo", HloGraph.from_hlo_text(mlp_hlo()))
    cluster = preset("h100-sxm-8")
    before = planner.plan_key(identity, cluster, planner.default_costs(cluster.device),
                              {"budget_s": 1.0, "strategy": "baselines", "seed": 3, "max_evals": None})
    assert keys[0] == before


def test_a_job_queued_for_the_compiled_tier_fails_where_it_cannot_compile(monkeypatch, tmp_path):
    from disco.sim.cluster import preset

    monkeypatch.setenv(deviceless.GPU_PYTHON_ENV, str(tmp_path / "missing"))
    with pytest.raises(NoCompiler, match="cannot run on this plan worker: no deviceless XLA:GPU environment"):
        compiler({"hlo_text": mlp_hlo()}, preset("h100-sxm-8"), time.monotonic() + 60)


def test_the_server_says_at_start_which_tier_ranks_gpu_plans(tmp_path):
    hidden = {deviceless.GPU_PYTHON_ENV: str(tmp_path / "missing" / "python")}
    with ServerProcess(tmp_path / "start.sqlite", env=hidden) as server:
        line = next(ln for ln in server.tail().splitlines() if "listening on" in ln)
    assert "GPU clusters' plans ranked by the emulated tier (no deviceless XLA:GPU environment here: run " \
           "`make install-gpu`" in line, line


def test_the_report_page_shows_the_compiled_prices_beside_the_emulated_ones(client):
    report = {"graph": {"name": "g", "nodes": 3, "all_reduces": 1, "fingerprint": "f"},
              "cluster": {"name": "h100-sxm-8", "devices": 8}, "method": "search", "strategy": "auto",
              "cost_model": {"name": "analytic", "version": 1}, "plan_summary": {}, "chosen": "ddp",
              "tier": "compiled", "plan_ms": 20.0, "lower_bound_ms": 4.0, "speedup_vs_xla_default": 0.5,
              "baselines_ms": {"xla_default": 10.0, "ddp": 20.0},
              "compiled": {"chosen": "ddp", "plan_ms": 4.0, "speedup_vs_xla_default": 2.0,
                           "ranked": ["ddp", "xla_default"],
                           "ms": {"xla_default": 8.0, "ddp": 4.0}, "not_compiled": {"disco_1": "DeadlinePassed: x"},
                           "modules": {}}}
    with Store(client.application.config["DATABASE"]) as store:
        job, _ = store.submit("c" * 32, {})
        store.finish_job(job["job_id"], "c" * 32, "f", {}, report, [["a", "compute", 0.0, 1.0]])
    page = client.get("/plans/" + "c" * 32).get_data(as_text=True)
    compiled = page[page.index("<h2>Compiled step time</h2>"):page.index("<h2>Emulated step time</h2>")]
    rows = re.findall(r'<td>([a-z_]+)</td>\n<td class="num">([0-9.]+)</td><td class="num">([0-9.]+)x</td>',
                      compiled)
    assert rows == [("ddp", "4.0000", "2.000"), ("xla_default", "8.0000", "1.000")], compiled
    assert "not compiled: DeadlinePassed: x" in compiled
    assert "<th>ranked by</th><td>the compiled tier</td>" in page
    assert "<th>speedup vs xla_default (compiled)</th><td>2.000x</td>" in page


@pytest.mark.gpu_compile
@pytest.mark.skipif(not deviceless.available(), reason=f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")
def test_a_real_server_ranks_a_gpu_clusters_plans_by_their_compiled_modules(tmp_path):
    """An 8-device step's HLO text posted for h100-sxm-8: the plan worker compiles the candidates
    deviceless and answers the fastest module; its candidates are in that order."""
    import trax_models
    from disco.ir import extractor

    step, args = trax_models.make_train_step("mlp", "tiny", devices=8, optimizer="sgd")
    body = {"hlo_text": extractor.hlo_text(step, *args), "cluster": "h100-sxm-8",
            "options": {"budget_s": 2.0, "max_evals": 200}, "candidates": 8}
    with ServerProcess(tmp_path / "gpu.sqlite", env={deviceless.CACHE_ENV: str(tmp_path / "cache")}) as server:
        status, accepted, _ = server.request("POST", "/v1/plans", body)
        assert status == 202, accepted
        job = server.wait_job(accepted["job_id"], timeout=600)
        assert job["state"] == "done", job
        report = job["result"]["report"]
        assert report["tier"] == "compiled", report.get("tier_note")
        priced = report["compiled"]
        ms, ranked = priced["ms"], priced["ranked"]
        assert "xla_default" in ms and not priced["not_compiled"] and sorted(ranked) == sorted(ms), priced
        assert [ms[n] for n in ranked] == sorted(ms.values()) and report["chosen"] == ranked[0]
        assert all(m["backend"] == "gpu" and m["kernels_from"] == "compiled" for m in priced["modules"].values())
        # XLA:GPU's own combiner makes xla_default's gradients one all-reduce or a few; per_tensor keeps one each
        if "per_tensor" in priced["modules"]:
            assert priced["modules"]["per_tensor"]["collectives"] > priced["modules"]["xla_default"]["collectives"]
        status, answer, _ = server.request("POST", "/v1/plans", body)
        assert status == 200 and answer["plan"]["name"] == report["chosen"], answer
        assert [c["name"] for c in answer["candidates"][:len(ms)]] == ranked
        assert [c["predicted_ms"] for c in answer["candidates"][:len(ms)]] == [ms[n] for n in ranked]
        status, page, _ = server.request("GET", f"/plans/{accepted['key']}")
        assert status == 200 and "Compiled step time" in page

"""``disco optimize --cluster h100-sxm-8`` on this CPU machine (issues 16, 41): the cluster's devices are
not here, so nothing is measured; the answer is chosen by prediction, from a search over buckets, cuts
and compile options (no fusion groups), and the output says so and names the options of the plans it
prints. Here without the deviceless environment (the emulated tier ranks, with the reason); the compiled
tier's run is in tests/xla_hooks/test_deviceless.py (``make test-gpu-compile``).

The search runs a fixed number of evaluations (``--max-evals``, the time budget far above what
they take), so the plans it finds are the same on every machine whatever its load."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cli import run_cli

ARGS = ("optimize", "--model", "mlp", "--preset", "tiny", "--devices", "8", "--cluster", "h100-sxm-8",
        "--budget", "600", "--max-evals", "1000", "--measure-top-k", "2", "--bucket-sweep", "2", "--no-progress")


@pytest.fixture
def no_deviceless(monkeypatch, tmp_path):
    monkeypatch.setenv("DISCO_GPU_PYTHON", str(tmp_path / "no-such-python"))


def test_optimize_for_a_gpu_cluster_predicts_its_answer_and_measures_nothing(tmp_path, no_deviceless):
    out = tmp_path / "plan.json"
    r = run_cli(*ARGS, "--details", "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    block = r.stdout[r.stdout.rindex("disco optimize mlp/tiny"):].splitlines()  # the answer, last
    assert block[0].endswith("(predicted, not measured)") and len(block) <= 15, block
    assert all(len(ln) <= 100 for ln in block) and "nothing was measured" in "\n".join(block)
    assert "is of h100 devices and this machine runs jax on cpu" in " ".join(r.stderr.split())
    assert "no deviceless XLA:GPU environment" in r.stderr  # the fallback's warning
    text = " ".join(r.stdout.split())  # rich wraps long lines
    assert "for cluster 'h100-sxm-8'" in text and "not measured" in text, text[:500]
    assert "measured ms" not in text and "paired" not in text
    answer = re.search(r"the answer is (\S+), predicted (\d+\.\d+)x faster than xla_default on 'h100-sxm-8' "
                       r"\(emulated tier\); nothing was measured", text)
    assert answer, text[-1500:]
    # the chosen plan's line always names its options (XLA's defaults when it has none) ...
    chosen = re.search(r"chosen (\S+): (\d+) fusion groups?, \d+ cuts?, [^;]+; compile options: (\S+)", text)
    assert chosen and chosen.group(1) == answer.group(1) and chosen.group(2) == "0", text[-1500:]
    plan = json.loads(out.read_text())
    assert plan["name"] == answer.group(1) and not plan.get("groups")
    assert (chosen.group(3) == "XLA's") == (not plan.get("compile_options"))
    # ... and the searched plan, priced on the GPU cluster, has no fusion groups and turns GPU options on
    best = re.search(r"(?:chosen|search best) \S+: 0 fusion groups, \d+ cuts?, [^;]+; compile options: "
                     r"(xla_gpu_\w+=\w+)", text)
    assert best, text[-1500:]


@pytest.mark.slow
def test_optimize_for_a_gpu_cluster_json_holds_every_candidate_predicted(tmp_path, no_deviceless):
    r = run_cli(*ARGS, "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["measured"] is False and out["tier"] == "emulated" and "make install-gpu" in out["tier_note"]
    rows = {row["name"]: row for row in out["rows"]}
    assert {"xla_default", "per_tensor", "horovod", "ddp", "even_2"} <= set(rows)
    assert "disco_1" in {row["found_as"] for row in out["rows"]}  # the search's first, named by content
    assert all(row["compiled_ms"] is None and row["emulated_ms"] > 0 for row in rows.values())
    # MaxText's recipe is a row on a GPU cluster; each row's peak is XLA:CPU's here (no compiled tier)
    assert rows["maxtext"]["kind"] == "baseline"
    assert all(row["peak_memory_bytes"] > 0 and row["peak_memory_from"] == "xla-cpu" and row["over_memory"] is None
               for row in rows.values())
    assert out["memory_limit_bytes"] == 80 << 30 and out["over_memory"] == []
    # fastest first by the emulated tier; the answer is the first row, its speedup the table's
    times = [row["emulated_ms"] for row in out["rows"]]
    assert times == sorted(times) and out["chosen"] == out["rows"][0]["name"]
    assert out["predicted_speedup_vs_xla_default"] == pytest.approx(rows["xla_default"]["emulated_ms"] / times[0])


def test_optimize_for_a_gpu_cluster_shows_predicted_peaks_and_keeps_plans_over_the_limit_out(no_deviceless):
    """--memory-limit 1 byte: every plan is over it but XLA's default (the step as written), which answers."""
    r = run_cli(*ARGS, "--details", "--memory-limit", "1", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stdout.split())
    assert "peak mem" in text and "!: above the limit of 1 bytes, never the answer" in text, text[:1500]
    assert "c: XLA:CPU's analysis of the plan compiled here" in text and "predicted (simulated, not measured)" in text
    marked = [ln for ln in r.stdout.splitlines() if re.search(r"\d+(\.\d)?[KMG]c!", ln)]
    assert len(marked) >= 4, r.stdout[:3000]  # every row but xla_default's
    block = r.stdout[r.stdout.rindex("disco optimize mlp/tiny"):].splitlines()
    assert block[0].endswith("the answer is xla_default (predicted, not measured)") and len(block) <= 15, block
    answer = " ".join(" ".join(block).split())
    assert re.search(r"peak memory per device \(predicted\): [\d.]+ KiB \(XLA:CPU's analysis of it compiled here, "
                     r"not the cluster's compiler's\), limit 1 B; over the limit, never chosen: \S+", answer), answer


@pytest.mark.slow
def test_optimize_for_a_gpu_cluster_refuses_what_needs_measurements(tmp_path, no_deviceless):
    r = run_cli(*ARGS, "--trace", str(tmp_path / "t.json"), timeout=900)
    assert r.returncode == 2 and "--trace: draws the timelines of a measured run" in r.stderr, r.stderr[-1000:]
    r = run_cli(*ARGS, "--samples", str(tmp_path / "data"), timeout=900)
    assert r.returncode == 2 and "--samples: keeps the plans a run measured" in r.stderr, r.stderr[-1000:]
    assert not (tmp_path / "data").exists()
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--cluster", "h100-sxm-8", "--processes", "2",
                "--devices-per-process", "1", timeout=300)
    assert r.returncode == 2 and "--processes measures plans in CPU worker processes" in r.stderr, r.stderr[-1000:]
    r = run_cli(*[a if a != "8" else "4" for a in ARGS], timeout=300)
    assert r.returncode == 2 and "--devices 4: cluster 'h100-sxm-8' has 8 devices" in r.stderr, r.stderr[-1000:]

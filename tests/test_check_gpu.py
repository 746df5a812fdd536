"""scripts/check_gpu.py, the manual check of plans on a GPU (CI has none): its CPU dry run applies
every plan, and without a GPU it runs only when asked to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "check_gpu.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


def test_the_dry_run_on_cpu_applies_every_plan(tmp_path):
    r = _run("--allow-cpu", "--models", "mlp", "--preset", "tiny", "--rounds", "1", "--steps", "1",
             "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "unexpected (a fallback, or groups not refused on GPU): none" in r.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["backend"] == "cpu"
    plans = report["models"][0]["plans"]
    assert {"xla_default", "per_tensor", "ddp", "ddp+lhs", "cuts", "groups", "xla_default_rt"} <= set(plans)
    assert all(row["applied"] for row in plans.values()), plans  # on CPU fusion groups apply too


def test_without_a_gpu_it_runs_only_when_asked(tmp_path):
    r = _run("--models", "mlp", "--preset", "tiny", "--rounds", "1", "--steps", "1", "--out", str(tmp_path))
    if json.loads(r.stdout.splitlines()[0])["backend"] == "gpu":  # on a GPU machine it is the real check
        assert "unexpected (a fallback, or groups not refused on GPU): none" in r.stdout, r.stdout[-2000:]
        return
    assert r.returncode == 2 and "no GPU backend: nothing to check" in r.stderr

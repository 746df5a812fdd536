"""``disco optimize --cluster h100-sxm-8`` (issue 16): a GPU cluster's search takes buckets, cuts and
compile options, no fusion groups, and the output names the options of the plans it prints.

The search runs a fixed number of evaluations (``--max-evals``, the time budget far above what
they take), so the plans it finds are the same on every machine whatever its load."""

from __future__ import annotations

import json
import re

from tests.support.cli import run_cli


def test_optimize_for_a_gpu_cluster_prints_the_compile_options_it_chose(tmp_path):
    out = tmp_path / "plan.json"
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--devices", "8", "--cluster", "h100-sxm-8",
                "--budget", "600", "--max-evals", "1000", "--measure-top-k", "1", "--rounds", "1", "--steps", "1", "--bucket-sweep", "",
                "--no-bound", "--no-confirm", "--no-progress", "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stdout.split())  # rich wraps long lines
    assert "on cluster 'h100-sxm-8'" in text, text[:500]
    # the chosen plan's line always names its options (XLA's defaults when it has none) ...
    chosen = re.search(r"chosen (\S+): (\d+) fusion groups?, \d+ cuts?, [^;]+; compile options: (\S+)", text)
    assert chosen, text[-1500:]
    plan = json.loads(out.read_text())
    opts = plan.get("compile_options") or []
    assert (chosen.group(3) == "XLA's") == (not opts), (chosen.group(0), opts)
    # ... and the searched plan, priced on the GPU cluster, has no fusion groups and turns GPU options on
    best = re.search(r"(?:chosen|search best) disco_1: 0 fusion groups, \d+ cuts?, [^;]+; compile options: "
                     r"(xla_gpu_\w+=\w+)", text)
    assert best, text[-1500:]

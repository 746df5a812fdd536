"""scripts/experiments/kernel_repeatability.py: per-launch times, streams matched by number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.paths import REPO, load_script

pytestmark = pytest.mark.fast

kr = load_script(REPO / "scripts" / "experiments" / "kernel_repeatability.py")


def _k(stream: str, op: str, ns: float, launches: float) -> dict:
    return {"stream": stream, "kernel": op.replace(".", "_"), "hlo_op": op, "ns_per_step": ns,
            "launches_per_step": launches}


def test_compares_per_launch_times_and_matches_streams_by_number(tmp_path: Path, capsys):
    rec = {"model": "gpt2", "preset": "small", "variant": "default",
           # a loop's launches split 1.6 / 2.4 in one trace and 2.4 / 1.6 in the other, same time per launch
           "kernels_trace_a": [_k("Stream #14(Memset,Compute)", "f.1", 1600.0, 1.6),
                               _k("Stream #14(Memset,Compute)", "f.2", 2400.0, 2.4),
                               _k("Stream #14(Memset,Compute)", "g", 1000.0, 1.0)],
           "kernels_trace_b": [_k("Stream #14(Compute,Memset)", "f.1", 2400.0, 2.4),
                               _k("Stream #14(Compute,Memset)", "f.2", 1600.0, 1.6),
                               _k("Stream #14(Compute,Memset)", "g", 1100.0, 1.0)]}
    d = sorted(kr.rel_diffs(rec).tolist())
    assert d == [0.0, 0.0, pytest.approx(100 / 1050)]
    path = tmp_path / "kernels.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    assert kr.main(["--kernels", str(path)]) == 0
    assert "| gpt2/small/default | 3 | 0.00% |" in capsys.readouterr().out

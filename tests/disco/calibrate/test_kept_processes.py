"""Two real processes keeping corrections in one file at once (disco.calibrate.kept's lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SAVER = """
import sys
from disco.calibrate import correction, kept
path, who = sys.argv[1], sys.argv[2]
for i in range(100):
    kept.save(path, f"{who}-{i}", (correction.Point("g", f"{who}{i}", tuple(1.0 for _ in correction.FEATURES), 1.0),))
"""


def test_two_processes_keeping_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "c.json")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, path, who], env=env) for who in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads(Path(path).read_text())
    assert set(data["machines"]) == {f"{w}-{i}" for w in "ab" for i in range(100)}

"""The guide "Steps with sharded parameters" (docs/guides/sharded-steps.md): its example runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.paths import REPO

GUIDE = os.path.join(str(REPO), "docs", "guides", "sharded-steps.md")


def test_the_guide_example_runs_as_written():
    with open(GUIDE, encoding="utf-8") as f:
        (code,) = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert "NamedSharding" in code and "shard_map" not in code and "all_gather" not in code
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("XLA_FLAGS", None)  # the example sets its own device count
    p = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300,
                       env=env, cwd=str(REPO))
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "[('grad_scatter', 2), ('other', 1), ('param_gather', 2)]"
    assert lines[1] == "1 gather bucket; applied: True; 1 all-gather compiled"
    assert re.fullmatch(r"peak memory per device: [\d,]+ bytes", lines[2])

"""``disco`` run as a command in a child process, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import REPO


def run_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "disco", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)

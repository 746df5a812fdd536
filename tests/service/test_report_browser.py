"""The plan report page, rendered by a real headless Chromium (Debian's package).

Marked ``browser``; .ci/run installs chromium so CI runs it. Without a chromium binary the
test is skipped with the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

import pytest

from tests.support.service import plan_body
from service.testing import ServerProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")]


def chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def test_report_page_renders_table_and_timeline(tmp_path):
    with ServerProcess(tmp_path / "plans.sqlite") as server:
        status, body, _ = server.request("POST", "/v1/plans", plan_body(seed=11))
        assert status == 202, body
        assert server.wait_job(body["job_id"])["state"] == "done"
        url = f"{server.url}/plans/{body['key']}"
        dom = chromium("--dump-dom", url)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        # the browser built a table with the plan and the baselines, and an SVG timeline
        assert re.search(r"<table[\s\S]*xla_default[\s\S]*</table>", html)
        assert "<svg" in html and re.search(r"<rect[^>]*>", html)
        shot = tmp_path / "page.png"
        r = chromium(f"--screenshot={shot}", "--window-size=1200,900", url)
        assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
        png = shot.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

"""Where the repository and the tests' committed data are, for test files at any depth."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
# One compiled H100 module (vgg19 small, XLA's default compile) with its per-kernel trace.
H100_RECORD = DATA / "h100_vgg19_small_default.jsonl.gz"

"""Where the repository and the tests' committed data are, for test files at any depth."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
# One compiled H100 module (vgg19 small, XLA's default compile) with its per-kernel trace.
H100_RECORD = DATA / "h100_vgg19_small_default.jsonl.gz"


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """A script of ``scripts/`` imported as a module (``name``, default the file's stem), registered in
    ``sys.modules`` (its dataclasses look their module up there)."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module

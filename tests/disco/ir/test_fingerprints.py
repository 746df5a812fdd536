"""The zoo's graph fingerprints are pinned: a refactor of the parser, the graph or the extractor
that changes what a fingerprint covers would silently orphan every stored plan and cached service
entry keyed by it.

The pinned values are what the extractor printed for each zoo model at preset ``tiny`` on 4 virtual
devices with the jax version recorded in the data file; HLO text (and so a fingerprint) changes
with jax itself, so another jax version skips with that reason. Regenerate, only when a change in
what fingerprints cover is intended, with ``PYTHONPATH=. python tests/disco/ir/test_fingerprints.py --write``.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
from tests.support.paths import DATA as TEST_DATA

DATA = TEST_DATA / "zoo_fingerprints.json"
DEVICES = 4
PRESET = "tiny"


def _fingerprint(model: str) -> str:
    import disco
    import trax_models

    step, args = trax_models.make_train_step(model, PRESET, devices=DEVICES)
    return disco.extract(step, *args).fingerprint


def _pinned() -> dict:
    return json.loads(DATA.read_text())


@pytest.mark.parametrize("model", sorted(_pinned()["fingerprints"]) if DATA.exists() else [])
def test_zoo_fingerprint_unchanged(model):
    import jax

    pinned = _pinned()
    if jax.__version__ != pinned["jax"]:
        pytest.skip(f"fingerprints pinned with jax {pinned['jax']}; this is jax {jax.__version__}")
    assert _fingerprint(model) == pinned["fingerprints"][model]


def _write() -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import trax_models

    fps = {m: _fingerprint(m) for m in trax_models.names()}
    DATA.write_text(json.dumps({"jax": jax.__version__, "preset": PRESET, "devices": DEVICES,
                                "fingerprints": fps}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DATA}")


if __name__ == "__main__" and "--write" in sys.argv:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
    _write()

"""Planned kLoop fusions of FUSIBLE_OPCODES compile, run and match the default compile.

XLA:CPU aborts the whole process on some injected fusions (a CHECK failure), so every
compile here happens in a child process run by scripts/tools/measure_fusible.py: an abort
fails the test instead of killing pytest.
"""

from __future__ import annotations


import pytest
from tests.support.paths import REPO, load_script

ROOT = REPO

# Cases of scripts/tools/measure_fusible.py (each names the opcode it puts in a planned group).
SAMPLE = ("markers", "add", "multiply", "tanh", "select", "convert", "compare", "divide",
          "rsqrt", "clamp", "slice", "pad", "reverse", "reduce", "dynamic-slice",
          "dynamic-update-slice", "iota", "copy")


@pytest.fixture(scope="module")
def measure_fusible():
    return load_script(ROOT / "scripts" / "tools" / "measure_fusible.py")


@pytest.fixture(scope="module")
def sample_results(measure_fusible):
    from disco.ir.opcodes import FUSIBLE_OPCODES

    cases = {c.name: c for c in measure_fusible.all_cases()}
    names = [n for n in SAMPLE if n == "markers" or cases[n].opcode in FUSIBLE_OPCODES]
    tasks = [f"{n}:{cfg}" for n in names for cfg in measure_fusible.CONFIGS]
    return names, measure_fusible.run_tasks(tasks, timeout=60)


def test_sample_covers_core_elementwise_opcodes(sample_results):
    names, _ = sample_results
    for op in ("add", "multiply", "tanh", "select", "convert"):
        assert op in names, f"{op} is no longer in FUSIBLE_OPCODES"


def test_planned_fusions_of_fusible_opcodes_match_reference(measure_fusible, sample_results):
    names, results = sample_results
    bad = {}
    for n in names:
        for cfg in measure_fusible.CONFIGS:
            res = results[f"{n}:{cfg}"]
            if res["result"] != "ok" or not res.get("in_fusion", True):
                bad[f"{n}:{cfg}"] = measure_fusible.cell_text(res)
    assert not bad, f"planned fusions that failed (abort = XLA CHECK failure in the child): {bad}"


@pytest.mark.fast
def test_every_fusible_opcode_has_a_measured_case(measure_fusible):
    from disco.ir.opcodes import FUSIBLE_OPCODES

    measured = {c.opcode for c in measure_fusible.all_cases()} | {
        measure_fusible.PRODUCER, measure_fusible.CONSUMER}
    assert not FUSIBLE_OPCODES - measured, (
        f"opcodes in FUSIBLE_OPCODES that scripts/tools/measure_fusible.py does not measure: "
        f"{sorted(FUSIBLE_OPCODES - measured)}")


def test_abort_in_child_is_recorded_not_fatal(measure_fusible):
    import jax

    if jax.__version__ != "0.10.2":
        pytest.skip("the transpose abort was measured with jaxlib 0.10.2")
    # An injected fusion with a transpose aborts XLA:CPU 0.10.2 ("input_shape.has_layout()").
    res = measure_fusible.run_tasks(["transpose:jit:off"], timeout=60)["transpose:jit:off"]
    assert res["result"] == "abort", res
    assert "has_layout" in res["detail"]
    from disco.ir.opcodes import FUSIBLE_OPCODES

    assert "transpose" not in FUSIBLE_OPCODES

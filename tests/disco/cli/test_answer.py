"""The answer first (issue 61): `disco optimize` ends with at most 15 lines of at most 100 columns,
and the lines of Python it prints apply the plan when pasted into a script; nothing the JSON had is
lost."""

from __future__ import annotations

import re

import pytest

from tests.support.cli import run_cli

MAX_LINES, WIDTH = 15, 100


def _block(stdout: str) -> list[str]:
    """The final block: from the line that starts ``disco optimize`` to the end."""
    lines = stdout.rstrip("\n").splitlines()
    start = max(i for i, ln in enumerate(lines) if ln.startswith("disco optimize "))
    return lines[start:]


def test_a_newcomer_reads_the_answer_in_15_lines_and_its_snippet_applies_the_plan(tmp_path):
    """`disco optimize` at preset tiny, as `make run` runs it but shorter: stdout is the answer alone
    (the progress goes to stderr), within 15 lines and 100 columns, and the printed snippet, run with
    the step and arguments a script has, applies the plan written to --out."""
    out = tmp_path / "plan.json"
    r = run_cli("optimize", "--model", "mlp", "--preset", "tiny", "--devices", "4", "--cluster", "local",
                "--budget", "1", "--max-evals", "300", "--rounds", "3", "--steps", "1", "--measure-rounds", "1",
                "--confirm-rounds", "3", "--bucket-sweep", "", "--no-bound", "--no-keep-correction", "--no-progress",
                "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    block = _block(r.stdout)
    assert block == r.stdout.rstrip("\n").splitlines(), "stdout holds more than the answer"
    assert len(block) <= MAX_LINES, block
    assert all(len(ln) <= WIDTH for ln in block), [ln for ln in block if len(ln) > WIDTH]
    text = "\n".join(block)
    assert re.search(r"the answer is \S+", block[0]), block[0]
    assert "what it does: " in text and "from: " in text and "model (simulated): " in text
    assert "measured on CPU" in text and "--details" in block[-1]
    chosen = re.search(r"the answer is (\S+)", block[0]).group(1)
    if chosen == "xla_default":  # nothing to apply: the block says so, and prints no snippet
        assert "nothing to apply" in text and "xla_hooks.apply" not in text
        pytest.skip("no plan beat xla_default in this run: no snippet to run")
    assert re.search(r"\d\.\d{3}x faster than XLA's default \(90% interval \d\.\d{3}-\d\.\d{3}: "
                     r"(beyond|within) noise\)", text), text
    start = next(i for i, ln in enumerate(block) if ln.endswith("to apply it in a training script:")) + 1
    snippet = [ln[4:] for ln in block[start:] if ln.startswith("    ")]
    assert len(snippet) == 3 and snippet[1] == f"path = {str(out)!r}", snippet

    import jax

    import trax_models

    step, args = trax_models.make_train_step("mlp", preset="tiny", devices=4)
    scope = {"step": step, "args": args}
    exec("\n".join(snippet), scope)  # what a user pastes into a script with its step and arguments
    applied = scope["step"]
    assert applied.applied, getattr(applied, "fallback_reason", None)
    from disco.plans.plan import FusionPlan

    assert applied.plan.digest() == FusionPlan.from_json(out.read_text()).digest()
    jax.block_until_ready(applied(*args))


def test_details_print_the_table_and_the_accuracy_figures_before_the_answer(capsys):
    """--details: today's table, each accuracy figure on a line with its meaning, then the answer."""
    from disco.cli import _optimize_report as report
    from tests.support.optimize_results import built_result

    info = {"model": "mlp", "preset": "tiny", "devices": 8, "device_kind": "cpu:cpu x8 on x86_64",
            "cost_model_info": {"name": "analytic"}, "cluster_spec": {}, "plan_file": "/tmp/p.json"}
    report.print_measured(built_result(), info, details=True)
    out = capsys.readouterr().out
    assert "┃ plan" in out and "Kendall tau -: predictions vs measured medians" in out
    block = _block(out)
    assert block[0] == "disco optimize mlp/tiny on 8 devices: the answer is ddp" and len(block) <= MAX_LINES
    assert block[-1] == "  --json: everything"
    report.print_measured(built_result(), info)
    short = capsys.readouterr().out
    assert "┃" not in short and _block(short) == short.rstrip("\n").splitlines()


# What `disco optimize --json` held before issue 61 (c6034ad), every key of which must stay.
OLD_KEYS = {
    "accuracy", "best_baseline", "chosen", "cluster", "comm_free_bound_ms", "comm_free_bound_speedup",
    "confirmation", "confirmation_baseline", "confirmation_ms", "confirmed_baseline_speedup", "confirmed_speedup",
    "confirmed_vs_best_baseline", "confirmed_vs_best_baseline_interval", "cost_model", "graph", "headroom_closed",
    "learning", "lower_bound_ms", "measurement", "plan", "plan_json", "relation", "rows", "runoff", "runoff_ms",
    "search", "speedup", "speedup_vs_xla_default", "verdict"}
OLD_ROW_KEYS = {
    "all_reduces", "applied", "fallback_reason", "kind", "max_ms", "measured_max_ms", "measured_median_ms",
    "measured_min_ms", "median_ms", "min_ms", "name", "origin", "paired_speedup", "plan", "plan_digest",
    "plan_summary", "predicted_by", "predicted_ms", "simulated_ms", "speedup_halves", "speedup_vs_xla_default"}
OLD_ACCURACY_KEYS = {
    "kendall_tau", "median_relative_error", "paired_kendall_tau", "paired_median_relative_error", "plans",
    "predicted_by", "repeat_kendall_tau", "repeat_median_relative_error", "resolved_kendall_tau", "resolved_pairs",
    "simulated_kendall_tau", "simulated_median_relative_error"}


@pytest.mark.fast
def test_the_json_keeps_every_field_it_had_and_adds_the_answer():
    from tests.support.optimize_results import built_result, contradicting_result

    for result in (built_result(), contradicting_result()):
        d = result.to_dict()
        assert OLD_KEYS <= set(d), OLD_KEYS - set(d)
        assert all(OLD_ROW_KEYS <= set(r) for r in d["rows"]), [OLD_ROW_KEYS - set(r) for r in d["rows"]]
        assert OLD_ACCURACY_KEYS <= set(d["accuracy"]), OLD_ACCURACY_KEYS - set(d["accuracy"])
        assert d["chosen"] == result.chosen and d["speedup"] == result.speedup and d["verdict"] == result.verdict
        a = d["answer"]
        assert a["chosen"] == result.chosen and a["vs_default"] == result.speedup
        assert a["model"] == result.accuracy.decision_line()
        assert {"measured_best", "measured_best_rank", "top_k", "model_pick", "regret"} <= set(d["accuracy"])
        assert all(r["found_as"] == r["name"] for r in d["rows"])  # rows built without a search-order name

"""scripts/tools/check_gpu.py, the manual check of plans on a GPU (CI has none): its CPU dry run applies
every plan, and without a GPU it runs only when asked to."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.paths import REPO, load_script

ROOT = REPO


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "tools" / "check_gpu.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)


def test_the_dry_run_on_cpu_applies_every_plan(tmp_path):
    r = _run("--allow-cpu", "--models", "mlp", "--preset", "tiny", "--rounds", "1", "--steps", "1",
             "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "unexpected (a fallback, groups not refused on GPU, or numbers changed): none" in r.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["backend"] == "cpu"
    plans = report["models"][0]["plans"]
    assert {"xla_default", "per_tensor", "ddp", "ddp+lhs", "cuts", "groups", "xla_default_rt", "xla_o1",
            "auto_pgle"} <= set(plans)
    # on CPU fusion groups apply too; the GPU baselines are refused, each with its reason
    assert all(row["applied"] for name, row in plans.items() if name not in ("xla_o1", "auto_pgle")), plans
    assert "optimization_level='O1' on cpu" in plans["xla_o1"]["fallback_reason"]
    assert "empty profile" in plans["auto_pgle"]["fallback_reason"]
    assert "| mlp | auto_pgle | no: auto_pgle fell back" in r.stdout  # the table


def test_without_a_gpu_it_runs_only_when_asked(tmp_path):
    r = _run("--models", "mlp", "--preset", "tiny", "--rounds", "1", "--steps", "1", "--out", str(tmp_path))
    if json.loads(r.stdout.splitlines()[0])["backend"] == "gpu":  # on a GPU machine it is the real check
        assert "unexpected (a fallback, groups not refused on GPU, or numbers changed): none" in r.stdout, r.stdout[-2000:]
        return
    assert r.returncode == 2 and "no GPU backend: nothing to check" in r.stderr


def _check_gpu():
    return load_script(ROOT / "scripts" / "tools" / "check_gpu.py")


@pytest.mark.fast
def test_numerics_measures_against_the_test_tolerance():
    check_gpu = _check_gpu()
    ref = {"w": np.array([1.0, -2.0]), "key_bias": np.array([1e-9, -1e-9])}
    same = check_gpu.numerics({"w": ref["w"].copy(), "key_bias": ref["key_bias"].copy()}, ref)
    assert same["within_test_tolerance"] and same["tolerance_ratio"] == 0.0 and same["worst_leaf"] is None
    # a zero-gradient leaf's rounding noise of the other sign: relative error 2, well inside the 1e-7 floor
    noise = check_gpu.numerics({"w": ref["w"], "key_bias": -ref["key_bias"]}, ref)
    assert noise["within_test_tolerance"] and noise["max_rel_leaf_err"] == 2.0 and noise["tolerance_ratio"] < 0.1
    changed = check_gpu.numerics({"w": np.array([1.0, -2.01]), "key_bias": ref["key_bias"]}, ref)
    assert not changed["within_test_tolerance"] and changed["leaves_outside_tolerance"] == 1
    assert changed["worst_leaf"]["leaf"] == "['w']" and changed["worst_leaf"]["scale"] == 2.0
    assert abs(changed["tolerance_ratio"] - 0.01 / (1e-5 * 2.0 + 1e-7)) < 1e-6


@pytest.mark.fast
def test_a_plan_changes_the_numbers_only_beyond_the_same_programs_spread():
    check_gpu = _check_gpu()

    def row(vs_default, vs_rt, applied=True):
        return {"applied": applied, "vs_xla_default": {"tolerance_ratio": vs_default},
                "vs_xla_default_rt": {"tolerance_ratio": vs_rt}}

    rows = {"inside": row(0.5, 0.5), "like_its_recompile": row(900.0, 0.0), "changed": row(900.0, 800.0),
            "noisy": row(60.0, 70.0), "fell_back": row(900.0, 900.0, applied=False)}
    assert check_gpu.changed_beyond_spread(rows, spread=0.0) == ["changed", "noisy"]
    assert check_gpu.changed_beyond_spread(rows, spread=10.0) == ["changed"]  # over 10 x 10


@pytest.mark.fast
def test_only_keeps_the_rows_named():
    check_gpu = _check_gpu()
    names = ["per_tensor", "ddp", "xla_tuned_16mb", "xla_tuned_32mb", "xla_o1", "auto_pgle"]
    assert check_gpu.row_names(names, None) == names
    assert check_gpu.row_names(names, {"xla_tuned", "auto_pgle"}) == ["xla_tuned_16mb", "xla_tuned_32mb", "auto_pgle"]
    assert check_gpu.row_names(names, {"xla_tuned_16mb", "ddp"}) == ["ddp", "xla_tuned_16mb"]


def _gpu_truth():
    return load_script(ROOT / "scripts" / "tools" / "gpu_truth.py")


@pytest.mark.fast
def test_gpu_truth_refuses_an_unknown_phase(capsys):
    with pytest.raises(SystemExit) as e:
        _gpu_truth().main(["--phases", "autotune,bogus"])
    assert e.value.code == 2 and "expected a comma list of autotune, baselines, numerics, autotune_small" in (
        capsys.readouterr().err)


@pytest.mark.fast
@pytest.mark.parametrize("shares, message", [("bogus=0.5", "--shares: unknown phase 'bogus'"),
                                             ("autotune=lots", "--shares 'autotune=lots': expected phase=fraction")])
def test_gpu_truth_refuses_a_bad_share(capsys, tmp_path, shares, message):
    with pytest.raises(SystemExit) as e:
        _gpu_truth().main(["--shares", shares, "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and message in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.fast
def test_gpu_truth_budget_gives_each_phase_its_share_and_the_last_the_rest():
    clock = _gpu_truth().Clock(100.0)
    assert 41 < clock.begin(0.42) <= 42
    assert clock.begin(0.0, rest=True) > 99  # nothing spent yet: the last phase gets all that is left


@pytest.mark.fast
def test_gpu_truth_reads_the_autotune_dump_it_writes(tmp_path):
    gpu_truth = _gpu_truth()
    assert gpu_truth.dump_entries(tmp_path / "none.textproto") == {"entries": 0, "error": "not written"}
    got = gpu_truth.dump_entries(ROOT / "tests" / "data" / "autotune" / "h100_pre_dot_cublas.textproto")
    assert got["entries"] == 1 and got["kinds"] == {"gemm": 1} and "DNN version: 9.8.0" in got["devices"][0]
    (tmp_path / "empty.textproto").write_text("version: 3\n")  # what a compile that autotuned nothing writes
    empty = gpu_truth.dump_entries(tmp_path / "empty.textproto")
    assert "no 'results' entries" in empty["error"] and empty["head"] == "version: 3\n"


@pytest.mark.fast
def test_kernel_match_counts_the_device_kernels_a_deviceless_one_matches():
    import gzip

    from scripts.tools import kernel_match

    with gzip.open(ROOT / "tests" / "data" / "h100_vgg19_small_default.jsonl.gz", "rt") as f:
        text = json.loads(f.readline())["compiled_hlo"]
    same = kernel_match.match(text, text)
    assert same["match"] == same["coarse_match"] == 1.0 and same["device_kernels"] == same["deviceless_kernels"] > 0
    assert same["unmatched_by_kind"] == {} and same["cublas_device"] == 0
    sigs = kernel_match.signatures(text)  # one signature per kernel-launching instruction
    assert sum(sigs.values()) == same["device_kernels"] and all(len(s) == 3 for s in sigs)

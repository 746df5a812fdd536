"""disco collect --kernels on CPU at preset tiny: real compiles, real traces, resumable file."""

from __future__ import annotations

import json
import os
import re

import pytest

from disco.data import kernel_collect
from disco.ir.hlo_parse import parse_module
from tests.support.paths import H100_RECORD, REPO


def test_collects_resumes_and_repairs(tmp_path):
    cfg = kernel_collect.KernelCollectConfig(models=("mlp",), presets=("tiny",), out=str(tmp_path),
                                             variants=("default",), steps=2, rounds=1, round_steps=2)
    lines: list[str] = []
    s = kernel_collect.collect_kernels(cfg, progress=lines.append)
    assert (s.written, s.skipped) == (1, 0)
    assert re.match(r"\[1/1\] mlp/tiny/default: \d+ kernels, [0-9.]+ ms device", lines[0])
    recs, bad = kernel_collect.read_records(os.path.join(tmp_path, kernel_collect.RECORDS))
    assert bad == 0 and len(recs) == 1
    rec = recs[0]
    assert rec["record_id"] == "mlp/tiny/default" and rec["compile_options"] == {}
    assert rec["pre_optimization_hlo"].startswith("HloModule")
    names = {i.name for c in parse_module(rec["compiled_hlo"]).computations for i in c.instructions}
    for trace in ("kernels_trace_a", "kernels_trace_b"):
        ks = rec[trace]
        assert ks and all(k["ns_per_step"] > 0 and k["launches_per_step"] > 0 for k in ks)
        assert {k["hlo_op"] for k in ks} <= names  # every kernel names a compiled instruction
    # A rerun skips what is there; a truncated last line is cut off first.
    with open(os.path.join(tmp_path, kernel_collect.RECORDS), "a") as f:
        f.write('{"model": "mlp", "var')
    s2 = kernel_collect.collect_kernels(cfg, progress=None)
    assert (s2.written, s2.skipped, s2.dropped_lines) == (0, 1, 1)
    with open(os.path.join(tmp_path, kernel_collect.RECORDS)) as f:
        assert [json.loads(x)["record_id"] for x in f] == ["mlp/tiny/default"]


@pytest.mark.fast
def test_bad_variant_and_model_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="variant 'fast' is not known on cpu; expected one of default, no_fusion"):
        kernel_collect.collect_kernels(kernel_collect.KernelCollectConfig(
            models=("mlp",), presets=("tiny",), out=str(tmp_path), variants=("fast",)), progress=None)
    with pytest.raises(ValueError, match=r"unknown models \['nope'\]"):
        kernel_collect.collect_kernels(kernel_collect.KernelCollectConfig(
            models=("nope",), presets=("tiny",), out=str(tmp_path)), progress=None)
    assert kernel_collect.variant_options("gpu", "no_priority_fusion") == {
        "xla_disable_hlo_passes": "priority-fusion", "xla_gpu_enable_command_buffer": ""}


def test_cli_flag(tmp_path, capsys):
    from disco.cli import main

    rc = main(["collect", "--kernels", "--models", "mlp", "--presets", "tiny", "--variants", "default",
               "--out", str(tmp_path), "--rounds", "1", "--no-progress"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 1


def test_cli_takes_devices_as_given(tmp_path, capsys):
    """--kernels with an explicit --devices 4 compiles for 4 devices (it was taken as 1), and a count
    above 1 gets its virtual CPU devices in a fresh process (it stopped with 'only 1 are available')."""
    import subprocess
    import sys

    from disco.cli import main

    rc = main(["collect", "--kernels", "--models", "mlp", "--presets", "tiny", "--variants", "default",
               "--devices", "4", "--steps", "1", "--out", str(tmp_path / "four"), "--rounds", "1", "--no-progress"])
    assert rc == 0
    recs, _ = kernel_collect.read_records(str(tmp_path / "four" / kernel_collect.RECORDS))
    assert [r["devices"] for r in recs] == [4]
    root = REPO
    proc = subprocess.run([sys.executable, "-m", "disco", "collect", "--kernels", "--models", "mlp", "--presets",
                           "tiny", "--variants", "default", "--devices", "2", "--steps", "1", "--rounds", "1",
                           "--out", str(tmp_path / "two"), "--no-progress"], capture_output=True, text=True,
                          cwd=root, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs, _ = kernel_collect.read_records(str(tmp_path / "two" / kernel_collect.RECORDS))
    assert [r["devices"] for r in recs] == [2]


def test_a_last_record_without_its_newline_is_kept_when_appending(tmp_path):
    """A whole last record whose newline is missing (cut off just before it, or a file another tool
    wrote) gets one before the next append (the two records were joined into one unreadable line)."""
    path = os.path.join(tmp_path, kernel_collect.RECORDS)
    first = kernel_collect.KernelCollectConfig(models=("mlp",), presets=("tiny",), out=str(tmp_path),
                                               variants=("default",), steps=1, rounds=1, round_steps=1)
    kernel_collect.collect_kernels(first, progress=None)
    with open(path, "rb+") as f:
        f.truncate(os.path.getsize(path) - 1)  # the newline
    both = kernel_collect.KernelCollectConfig(models=("mlp",), presets=("tiny",), out=str(tmp_path),
                                              variants=("default", "no_fusion"), steps=1, rounds=1, round_steps=1)
    s = kernel_collect.collect_kernels(both, progress=None)
    assert (s.written, s.skipped, s.dropped_lines) == (1, 1, 0)
    recs, bad = kernel_collect.read_records(path)
    assert bad == 0 and [r["record_id"] for r in recs] == ["mlp/tiny/default", "mlp/tiny/no_fusion"]


@pytest.mark.fast
def test_refuses_to_resume_a_file_of_another_device(tmp_path):
    """An H100 record in DIR/kernels.jsonl: collecting on CPU is refused (mlp/tiny/default there would
    have been skipped as done, and the CPU records appended beside the H100 one)."""
    import gzip
    from pathlib import Path

    record = H100_RECORD
    path = os.path.join(tmp_path, kernel_collect.RECORDS)
    with gzip.open(record, "rt") as f, open(path, "w") as out:
        out.write(f.read())
    before = Path(path).read_text()
    cfg = kernel_collect.KernelCollectConfig(models=("vgg19", "mlp"), presets=("tiny",), out=str(tmp_path),
                                             variants=("default",), steps=1, rounds=1, round_steps=1)
    with pytest.raises(ValueError, match=r"holds records profiled on NVIDIA H100 80GB HBM3, but this process runs "
                                         r"on 'cpu'; expected a directory of this device's records"):
        kernel_collect.collect_kernels(cfg, progress=None)
    assert Path(path).read_text() == before


@pytest.mark.fast
@pytest.mark.parametrize("argv, message", [
    (["--kernels", "--random", "3", "--profile"], r"--random, --profile: for the plan dataset \(disco collect without "
                                                  r"--kernels\); --kernels takes --models, --presets"),
    (["--kernels", "--interleave", "2"], r"--interleave: for the plan dataset"),
    (["--variants", "default", "--presets", "tiny"], r"--presets, --variants: for --kernels \(what it compiles\); "
                                                     r"expected --kernels with them, or --preset for the plan dataset"),
])
def test_one_mode_s_options_are_refused_in_the_other(tmp_path, capsys, argv, message):
    """They did nothing there, without a word; refused before anything is created."""
    from disco import cli

    out = tmp_path / "out"
    assert cli.main(["collect", "--models", "mlp", "--out", str(out), *argv]) == 2
    assert re.search(r"^disco collect: error: " + message, capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.fast
@pytest.mark.parametrize("field, value, message", [
    ("devices", 2, r"holds records of steps with devices 2, but this run compiles devices 1 with optimizer adamw"),
    ("optimizer", "sgd", r"holds records of steps with optimizer sgd, but this run compiles devices 1 with "
                         r"optimizer adamw"),
])
def test_refuses_to_resume_records_of_another_step(tmp_path, field, value, message):
    """Record ids leave devices and optimizer out: collecting --devices 1 into a directory of
    --devices 2 records skipped mlp/tiny/default as done and wrote nothing."""
    from pathlib import Path

    path = os.path.join(tmp_path, kernel_collect.RECORDS)
    with open(path, "w") as f:
        f.write(json.dumps({"record_id": "mlp/tiny/default", "model": "mlp", "preset": "tiny", "variant": "default",
                            "device_kind": "cpu", "devices": 1, "optimizer": "adamw", field: value}) + "\n")
    before = Path(path).read_text()
    cfg = kernel_collect.KernelCollectConfig(models=("mlp",), presets=("tiny",), out=str(tmp_path),
                                             variants=("default",), steps=1, rounds=1, round_steps=1)
    with pytest.raises(ValueError, match=message + r"; expected a directory of this step's records"):
        kernel_collect.collect_kernels(cfg, progress=None)
    assert Path(path).read_text() == before


@pytest.mark.fast
def test_a_second_collector_on_the_directory_is_refused(tmp_path):
    """Only the plan collector took DIR/.lock: two --kernels collectors on one directory each measured
    every record and appended it, so every record was there twice."""
    from disco.data.dataset import DirLock

    cfg = kernel_collect.KernelCollectConfig(models=("mlp",), presets=("tiny",), out=str(tmp_path),
                                             variants=("default",), steps=1, rounds=1, round_steps=1)
    measured = []
    with DirLock(str(tmp_path)), pytest.raises(RuntimeError, match=r"another collector is writing to .*expected "
                                                                     r"one collector per directory"):
        kernel_collect.collect_kernels(cfg, progress=None, measure=lambda *a: measured.append(a) or {})
    assert measured == [] and not os.path.exists(os.path.join(tmp_path, kernel_collect.RECORDS))


@pytest.mark.fast
def test_random_networks_are_models_and_the_budget_stops_between_records(tmp_path, monkeypatch):
    """A fake measure and a fake clock (10 s a record): with a 25 s budget three records are written
    (the third starts at 20 s), the rest are left for a rerun, which resumes."""
    clock = [0.0]
    monkeypatch.setattr(kernel_collect.time, "perf_counter", lambda: clock[0])

    def measure(model, preset, variant, config):
        clock[0] += 10.0
        return {"record_id": f"{model}/{preset}/{variant}", "model": model, "preset": preset, "variant": variant,
                "device_kind": "cpu", "kernels_trace_a": [], "wall_step_ms": 1.0, "compile_s": 0.1}

    monkeypatch.setattr("jax.devices", lambda: [type("D", (), {"device_kind": "cpu"})()])
    names = tuple(__import__("trax_models").random_names(5))
    cfg = kernel_collect.KernelCollectConfig(models=names, presets=("tiny",), out=str(tmp_path),
                                             variants=("default",), budget_s=25)
    s = kernel_collect.collect_kernels(cfg, progress=None, measure=measure)
    assert (s.written, s.left) == (3, 2)
    s = kernel_collect.collect_kernels(cfg, progress=None, measure=measure)
    assert (s.written, s.skipped, s.left) == (2, 3, 0)
    with pytest.raises(ValueError, match="budget_s: expected seconds > 0 or None, got 0"):
        kernel_collect.KernelCollectConfig(models=names, presets=("tiny",), out=str(tmp_path), budget_s=0)


@pytest.mark.fast
def test_cli_expands_random_models():
    from disco.cli.collect import expand_models
    from disco.cli.common import CliError

    assert expand_models(("mlp", "random:2")) == ("mlp", "random_mlp_0", "random_cnn_1")
    with pytest.raises(CliError, match="expected random:N with N an int >= 1"):
        expand_models(("random:0",))

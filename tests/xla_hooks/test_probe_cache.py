"""xla_hooks.probe keeps the modules that compiled: a second probe of one starts no child."""

from __future__ import annotations

import subprocess

import jax
import pytest

from xla_hooks import probe


@pytest.fixture
def children(monkeypatch, tmp_path):
    """The probe's child processes, counted; its cache in ``tmp_path``."""
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "probed"))
    started = []
    real = subprocess.run

    def counting(cmd, *a, **kw):
        started.append(cmd)
        return real(cmd, *a, **kw)

    monkeypatch.setattr(probe.subprocess, "run", counting)
    return started


def _module() -> str:
    return jax.jit(lambda x: x * 2.0 + 1.0).lower(jax.numpy.ones(4)).as_text(dialect="hlo")


def test_a_module_that_compiled_is_not_probed_again(children, tmp_path, monkeypatch):
    text = _module()
    probe.probe(text, 1, {})
    probe.probe(text, 1, {})
    assert len(children) == 1
    assert [p.name for p in (tmp_path / "probed").iterdir()] == [probe.probe_key(text, 1, {}, "cpu")]
    # other options: a probe of their own (the key's other parts: the fast test below)
    probe.probe(text, 1, {"xla_cpu_enable_fast_math": True})
    assert len(children) == 2
    monkeypatch.setenv(probe.CACHE_ENV, "off")  # nothing kept or read
    probe.probe(text, 1, {})
    assert len(children) == 3 and probe.cache_dir() is None


def test_a_module_that_failed_is_probed_again_and_says_why_each_time(children, tmp_path):
    bad = "HloModule not_hlo\n\nthis is not an instruction\n"
    for _ in range(2):
        with pytest.raises(probe.ProbeFailure, match=r"the probe compile failed: \w+: .*\S"):
            probe.probe(bad, 1, {})
    assert len(children) == 2 and not (tmp_path / "probed").exists()


@pytest.mark.fast
def test_the_key_reads_the_text_the_options_the_devices_and_the_platform():
    keys = {probe.probe_key("m", 1, {}, "cpu"), probe.probe_key("m2", 1, {}, "cpu"),
            probe.probe_key("m", 1, {"a": "1"}, "cpu"), probe.probe_key("m", 2, {}, "cpu"),
            probe.probe_key("m", 1, {}, "cuda")}
    assert len(keys) == 5
    assert probe.probe_key("m", 1, {"a": "1", "b": "2"}, "cpu") == probe.probe_key("m", 1, {"b": "2", "a": "1"}, "cpu")
    assert probe.probe_key("m", 1, {"a": True}, "cpu") != probe.probe_key("m", 1, {"a": "True"}, "cpu")

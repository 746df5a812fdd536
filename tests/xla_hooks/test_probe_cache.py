"""xla_hooks.probe keeps the modules that compiled (a second probe of one compiles nothing), and its
child serves every probe of a platform and device count until XLA aborts it."""

from __future__ import annotations

import jax
import pytest

from xla_hooks import probe


@pytest.fixture
def children(monkeypatch, tmp_path):
    """The modules the probe's child compiled, counted; its cache in ``tmp_path``."""
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "probed"))
    compiled = []
    real = probe._Child.compile

    def counting(self, text, *a, **kw):
        compiled.append(text)
        return real(self, text, *a, **kw)

    monkeypatch.setattr(probe._Child, "compile", counting)
    return compiled


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


def test_one_child_serves_the_probes_and_one_that_ended_is_replaced(monkeypatch):
    monkeypatch.setenv(probe.CACHE_ENV, "off")
    probe.probe(_module(), 1, {})
    first = probe._CHILDREN[("cpu", 1)].proc
    with pytest.raises(probe.ProbeFailure, match=r"the probe compile failed: \w+: .*\S"):
        probe.probe("HloModule not_hlo\n\nthis is not an instruction\n", 1, {})
    probe.probe(_module(), 1, {})
    assert probe._CHILDREN[("cpu", 1)].proc is first and first.poll() is None  # a rejected module: still up
    first.kill()  # a child that ended between probes is replaced (one XLA aborts in a probe: the abort
    first.wait()  # tests of test_apply_plan.py and tests/disco/plans/test_cuts.py)
    probe.probe(_module(), 1, {})
    assert probe._CHILDREN[("cpu", 1)].proc is not first

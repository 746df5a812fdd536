"""Deviceless XLA:GPU compiles (xla_hooks.deviceless) priced by the compiled tier: real compiles for an
H100 target from this CPU machine. They need .venv-gpu (`make install-gpu`); `make test-gpu-compile`
runs them there, and they skip, saying why, where it is missing."""

from __future__ import annotations

import pytest

from disco.ir import hlo_parse
from disco.sim import compiled as C
from disco.sim.cluster_presets import preset
from disco.sim.costs.device_costs import analytic
from xla_hooks import deviceless

pytestmark = [pytest.mark.gpu_compile,
              pytest.mark.skipif(not deviceless.available(),
                                 reason=f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")]

# exp(sin(x) * 2) + 1 and a matmul: one loop fusion by default, more with priority fusion off.
PRE = """HloModule jit_f, entry_computation_layout={(f32[256,512]{1,0}, f32[512,128]{1,0})->f32[256,128]{1,0}}

ENTRY main.1 {
  x = f32[256,512]{1,0} parameter(0)
  w = f32[512,128]{1,0} parameter(1)
  s = f32[256,512]{1,0} sine(x)
  two = f32[] constant(2)
  b2 = f32[256,512]{1,0} broadcast(two), dimensions={}
  m = f32[256,512]{1,0} multiply(s, b2)
  e = f32[256,512]{1,0} exponential(m)
  d = f32[256,128]{1,0} dot(e, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  one = f32[] constant(1)
  b1 = f32[256,128]{1,0} broadcast(one), dimensions={}
  ROOT r = f32[256,128]{1,0} add(d, b1)
}
"""


def test_deviceless_compile_of_hlo_text_is_xla_gpus_scheduled_module(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    text = deviceless.compile_hlo(PRE, target="h100", devices=1)
    assert hlo_parse.is_scheduled(text) and hlo_parse.compiled_backend(text) == "gpu"
    r = C.price(text, analytic("h100"), preset("h100-1"))
    assert r.backend == "gpu" and r.kernels and r.compute_s > 0 and r.collectives == ()
    assert len(list(tmp_path.glob("*.json"))) == 1  # cached: the second compile is a read
    assert deviceless.compile_hlo(PRE, target="h100", devices=1) == text


def test_fusion_variants_are_compile_options(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    default = C.read(deviceless.compile_hlo(PRE, target="h100", devices=1))[2]
    off = C.read(deviceless.compile_hlo(PRE, target="h100", devices=1,
                                        options={"xla_disable_hlo_passes": "priority-fusion"}))[2]
    assert len(off) > len(default)


def test_eight_device_step_has_xla_combined_async_all_reduces(tmp_path, monkeypatch):
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    pre, text = deviceless.compile_zoo_step("mlp", "tiny", target="h100", devices=8)
    assert "all-reduce" not in pre  # GSPMD: XLA's partitioner adds the all-reduces
    r = C.price(text, analytic("h100"), preset("h100-sxm-8"))
    ars = [c for c in r.collectives if c.kind == "all-reduce"]
    assert ars and all(c.group == 8 for c in ars) and any(c.is_async for c in ars)
    assert r.comm_s > 0 and r.step_time_s >= r.compute_s
    # XLA's combiner merged the per-gradient all-reduces: fewer than the step's parameters
    assert len(ars) < pre.count("parameter(")


def test_unknown_target_and_failed_compile_say_what_was_received():
    with pytest.raises(ValueError, match="target 'tpu'"):
        deviceless.compile_hlo(PRE, target="tpu")
    with pytest.raises(deviceless.DevicelessUnavailable, match="failed"):
        deviceless.compile_hlo("HloModule broken\n\nENTRY e { ROOT x = f32[] nonsense() }\n", use_cache=False)

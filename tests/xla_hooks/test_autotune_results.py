"""Reading XLA's autotune results files and keying them for a deviceless target (no compile here:
tests/xla_hooks/test_deviceless.py shows the loaded results changing what XLA:GPU builds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xla_hooks import autotune_results as A
from xla_hooks.deviceless import SHIPPED_AUTOTUNE, TARGETS

pytestmark = pytest.mark.fast

DATA = Path(__file__).resolve().parents[1] / "data" / "autotune"
H100_KEY = "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s, L2 cache: 50 MB, DNN version: 0.0.0"
ENTRY = '''results {{
  device: "{device}"
  hlo: "{{\\n  tmp_0 = f32[4]{{0}} parameter(0)\\n  ROOT tmp_1 = f32[4]{{0}} negate(f32[4]{{0}} tmp_{n})\\n}}"
  result {{
    run_time {{
      nanos: 100
    }}
    {kind} {{
      algorithm: 3
    }}
  }}
}}
'''


def _file(tmp_path, text, name="r.textproto"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_the_committed_files_read_with_their_kinds():
    triton = A.read(DATA / "h100_pre_dot_triton.textproto")
    cublas = A.read(DATA / "h100_pre_dot_cublas.textproto")
    assert triton.counts() == {"triton": 1} and cublas.counts() == {"gemm": 1}
    assert triton.entries[0].hlo == cublas.entries[0].hlo and triton.entries[0].hlo.startswith("{\n  tmp_0 = ")
    assert triton.devices == (H100_KEY.replace("0.0.0", "9.8.0"),)


def test_the_h100_deviceless_key_is_read_from_its_target_config():
    # what jax 0.11.2's and 0.12.0.1's deviceless compiles for targets/h100.txtpb looked results up by (cache-miss logs)
    assert A.target_device_key(TARGETS["h100"].read_text()) == H100_KEY


def test_for_target_rewrites_only_the_device_keys():
    results = A.read(DATA / "h100_pre_dot_triton.textproto")
    text = A.for_target(results, TARGETS["h100"].read_text())
    again = A.parse(text)
    assert [e.device for e in again] == [H100_KEY]
    assert [(e.hlo, e.kind) for e in again] == [(e.hlo, e.kind) for e in results.entries]
    assert text.replace(H100_KEY, "X") == results.text.replace(results.devices[0], "X")


def test_results_of_two_devices_are_refused(tmp_path):
    text = "version: 3\n" + ENTRY.format(device="dev A", n=0, kind="gemm") + ENTRY.format(device="dev B", n=0, kind="gemm")
    results = A.read(_file(tmp_path, text))
    with pytest.raises(ValueError, match=r"hold results of 2 devices \(dev A; dev B\); expected one device's"):
        A.for_target(results, TARGETS["h100"].read_text())


@pytest.mark.parametrize("text, message", [
    (ENTRY.format(device="d", n=0, kind="gemm"), r"no 'version' field; expected XLA's AutotuneResults textproto"),
    ("version: 2\n" + ENTRY.format(device="d", n=0, kind="gemm"), r"version 2; expected 3"),
    ("version: 3\n", r"no 'results' entries"),
    ("version: 3\nresults {\n  device: \"d\"\n", r"the file ends inside 'results' \(unbalanced braces\)"),
    ("version: 3\n" + ENTRY.format(device="d", n=0, kind="bogus"), r"results entry 1 \(line 2\) holds no result"),
    ("version: 3\nresults {\n  device: \"d\"\n  result {\n    gemm {\n    }\n  }\n}\n", r"results entry 1 \(line 2\) has no hlo"),
    ("version: 3\n" + ENTRY.format(device="d", n=0, kind="gemm") * 2, r"two results for one key \(device 'd'\)"),
    ("version: 3\nresult {\n}\n", r"line 2: top-level message 'result'; expected only 'version' and 'results'"),
    ("version: 3\nfoo bar\n", r"line 2: cannot read 'foo bar'"),
])
def test_a_malformed_file_is_refused_naming_what_is_wrong(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        A.read(_file(tmp_path, text))


def test_a_missing_or_binary_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no such file; expected XLA's AutotuneResults textproto"):
        A.read(tmp_path / "nothing.textproto")
    binary = tmp_path / "r.pb"
    binary.write_bytes(b"\x08\x03\x12\xff\xfe")
    with pytest.raises(ValueError, match=r"not UTF-8 text \(a binary AutotuneResults\?\)"):
        A.read(binary)


def test_comments_and_escapes_are_read():
    assert A.parse('# a comment\nversion: 3  # trailing\nresults {\n  device: "a \\"q\\" #1"\n'
                   '  hlo: "x\\303\\251"\n  version: 56\n  result {\n    triton {\n    }\n  }\n}\n') == (
        A.Entry('a "q" #1', "xé", "triton", 56),)


ANY_ENTRY = """results {
  device: "dev"
  hlo: "{\\n  ROOT tmp_0 = f32[4]{0} parameter(0)\\n}"
  result {
    other {
      name: "NATIVE_EMITTER"
      config {
        [type.googleapis.com/xla.autotuner.BackendConfig] {
          native_emitter {
          }
        }
      }
    }
  }
  version: 52
}
"""


def test_an_other_result_with_an_any_config_is_read():
    # jax 0.11.2's XLA writes the fusion-emitter choices so (an Any's expansion inside "other")
    assert A.parse("version: 3\n" + ANY_ENTRY) == (A.Entry("dev", "{\n  ROOT tmp_0 = f32[4]{0} parameter(0)\n}",
                                                          "other", 52),)


def test_merge_keeps_each_key_once_in_order(tmp_path):
    a = A.read(_file(tmp_path, "version: 3\n" + ENTRY.format(device="d", n=0, kind="gemm")
                     + ENTRY.format(device="d", n=1, kind="triton"), "a.textproto"))
    b = A.read(_file(tmp_path, "version: 3\n" + ENTRY.format(device="d", n=1, kind="triton")
                     + ENTRY.format(device="d", n=2, kind="algorithm"), "b.textproto"))
    merged = A.parse(A.merge(a, b))
    assert [(e.hlo[-20:], e.kind) for e in merged] == [(e.hlo[-20:], e.kind) for e in a.entries + b.entries[1:]]
    with pytest.raises(ValueError, match=r"merge: results of 2 devices"):
        A.merge(a, A.read(_file(tmp_path, "version: 3\n" + ENTRY.format(device="e", n=0, kind="gemm"), "c.textproto")))
    with pytest.raises(ValueError, match=r"merge: no autotune results given"):
        A.merge()


def test_a_gzipped_file_is_read_and_a_damaged_one_refused(tmp_path):
    import gzip

    text = "version: 3\n" + ENTRY.format(device="d", n=0, kind="gemm")
    good = tmp_path / "r.textproto.gz"
    good.write_bytes(gzip.compress(text.encode()))
    assert A.read(good).entries == A.parse(text) and A.read(good).text == text
    bad = tmp_path / "bad.textproto.gz"
    bad.write_bytes(gzip.compress(text.encode())[:-12])
    with pytest.raises(ValueError, match=r"bad.textproto.gz.*cannot gunzip"):
        A.read(bad)


def test_the_shipped_h100_results_are_one_h100s():
    path, jax_version = SHIPPED_AUTOTUNE["h100"]
    results = A.read(path)
    assert jax_version == "0.11.2" and results.versions() == {52: len(results.entries)}  # jax 0.11.2's key version
    assert results.devices == (H100_KEY.replace("0.0.0", "9.19.0"),)
    assert set(results.counts()) == {"gemm", "triton", "algorithm", "other"} and len(results.entries) > 1000
    assert A.parse(A.for_target(results, TARGETS["h100"].read_text()))[0].device == H100_KEY


def test_the_shipped_results_apply_only_with_the_jax_that_wrote_them(tmp_path, monkeypatch):
    from xla_hooks import deviceless

    for version, expected in (("0.11.2", SHIPPED_AUTOTUNE["h100"][0]), ("0.12.0.1", None)):
        site = tmp_path / version / "lib" / "python3.12" / "site-packages"
        (site / f"jax-{version}.dist-info").mkdir(parents=True)
        (tmp_path / version / "bin").mkdir()
        (tmp_path / version / "bin" / "python").write_text("")
        monkeypatch.setenv(deviceless.GPU_PYTHON_ENV, str(tmp_path / version / "bin" / "python"))
        assert deviceless.shipped_autotune_results("h100") == expected
        assert deviceless.shipped_autotune_results("a100") is None
    monkeypatch.setenv(deviceless.GPU_PYTHON_ENV, str(tmp_path / "nothing"))
    assert deviceless.shipped_autotune_results("h100") is None

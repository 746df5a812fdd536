"""Tests for disco.sim.cluster: our YAML format, presets, and the SuperScaler/AutoDist-style files."""

from __future__ import annotations

import os
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disco.sim.cluster import (ALGORITHMS, DEVICES, PRESETS, ClusterSpec, LinkSpec, load_cluster, parse_bandwidth,
                               parse_latency, preset, resolve)
from disco.sim.cluster_spec import MAX_DEVICES, MAX_LATENCY, MAX_RS_AG_SCALE, MIN_BANDWIDTH, MIN_COMPUTE_SPEED

SUPERSCALER = """\
Server:
  host0:
    GPU:
      0:
        links:
          - {dest: /server/host0/GPU/1/, type: NVLink, rate: 2400Gbps, propagation_latency: 5us}
      1:
        links:
          - {dest: /server/host0/GPU/0/, type: NVLink, rate: 2400Gbps, propagation_latency: 5us}
    NIC:
      0:
        links:
          - {dest: /server/host1/NIC/0/, type: RDMA, rate: 100Gbps, propagation_latency: 15us}
  host1:
    GPU:
      0:
        links:
          - {dest: /server/host1/GPU/1/, type: NVLink, rate: 2400Gbps, propagation_latency: 5us}
      1:
        links:
          - {dest: /server/host1/GPU/0/, type: NVLink, rate: 2400Gbps, propagation_latency: 5us}
"""

AUTODIST = """\
nodes:
  - address: 10.0.0.1
    gpus: [0, 1]
    chief: true
    network_bandwidth: 100
  - address: 10.0.0.2
    gpus: [0, 1]
    network_bandwidth: 100
ssh:
  conf: {username: ubuntu}
"""

NVLINK = LinkSpec(300e9, 5e-6)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.fast
def test_units():
    assert parse_bandwidth("100Gbps", "x") == 12.5e9
    assert parse_bandwidth("100 Gb/s", "x") == 12.5e9
    assert parse_bandwidth("300GB/s", "x") == 300e9
    assert parse_bandwidth("1GiB/s", "x") == 2**30
    assert parse_bandwidth(25, "x", bare_unit=1e9 / 8) == 25e9 / 8
    assert parse_latency("5us", "x") == 5e-6
    assert parse_latency("2ms", "x") == 2e-3
    assert parse_latency("15 \u00b5s", "x") == 15e-6  # MICRO SIGN
    assert parse_latency("15 \u03bcs", "x") == 15e-6  # GREEK SMALL LETTER MU, what most keyboards type
    assert parse_latency(1e-6, "x") == 1e-6
    with pytest.raises(ValueError, match=r"f: unknown unit 'furlongs' in '3 furlongs'; expected a bandwidth"):
        parse_bandwidth("3 furlongs", "f")
    with pytest.raises(ValueError, match=r"f: expected a positive bandwidth, got 0"):
        parse_bandwidth(0, "f")


@pytest.mark.fast
def test_the_case_of_b_tells_bytes_from_bits_before_ps_as_before_per_second():
    """"GBps" is gigabytes per second (as "GB/s"), not gigabits: it was read as "Gbps", 8x too slow."""
    assert parse_bandwidth("10GBps", "x") == parse_bandwidth("10 GB/s", "x") == 10e9
    assert parse_bandwidth("10 GiBps", "x") == 10 * 2**30
    assert parse_bandwidth("10 KBps", "x") == 10e3 and parse_bandwidth("10 Bps", "x") == 10
    assert parse_bandwidth("10 GB/S", "x") == 10e9  # the case of "/s" does not matter
    assert parse_bandwidth("10Gbps", "x") == parse_bandwidth("10gbps", "x") == parse_bandwidth("10 Gb/s", "x") == 1.25e9
    spec = ClusterSpec.from_yaml(_ONE + "intra: {bandwidth: 40GBps, latency: 1us}\n")
    assert spec.intra.bandwidth == 40e9


@pytest.mark.fast
@pytest.mark.parametrize("name", PRESETS)
def test_presets_round_trip_through_yaml(name, tmp_path):
    spec = preset(name)
    assert ClusterSpec.from_yaml(spec.to_yaml()) == spec
    path = tmp_path / "c.yaml"
    path.write_text(spec.to_yaml())
    again = ClusterSpec.from_yaml(path)
    assert again == spec and again.label == spec.label and again.description == spec.description
    assert load_cluster(path) == spec


_LATENCIES = st.floats(min_value=0, max_value=MAX_LATENCY)
_LINKS = st.builds(LinkSpec, st.floats(min_value=MIN_BANDWIDTH, max_value=1e300), _LATENCIES)
_SPECS = st.builds(
    ClusterSpec, name=st.text(max_size=20), nodes=st.integers(1, 2**16), devices_per_node=st.integers(1, 2**15),
    intra=_LINKS, inter=_LINKS, algorithm=st.sampled_from(ALGORITHMS),
    compute_speed=st.floats(min_value=MIN_COMPUTE_SPEED, max_value=1e300), operand_latency=_LATENCIES,
    rs_ag_scale=st.floats(min_value=1e-300, max_value=MAX_RS_AG_SCALE), overlap=st.booleans(),
    description=st.text(max_size=30), label=st.text(max_size=30),
    device=st.sampled_from(DEVICES), device_memory_bytes=st.none() | st.integers(1, 2**50))


@pytest.mark.fast
@settings(max_examples=200, deadline=None)
@given(_SPECS)
def test_every_spec_round_trips_through_yaml(spec):
    assert spec.num_devices <= MAX_DEVICES
    again = ClusterSpec.from_yaml(spec.to_yaml())
    assert again == spec
    assert (again.description, again.label) == (spec.description, spec.label)  # not compared, kept all the same


@pytest.mark.fast
def test_preset_shapes():
    assert preset("dgx-a100-8").num_devices == 8
    two = preset("2x8-100gbe")
    assert (two.nodes, two.devices_per_node, two.inter.bandwidth, two.algorithm) == (2, 8, 12.5e9, "hierarchical")
    assert "not measured" in two.label
    assert preset("16x8-ib").num_devices == 128
    local = preset("local", devices=4)
    assert (local.num_devices, local.nodes) == (4, 1) and "placeholder" in local.label
    cal = preset("local", calibration={"bandwidth": 2e9, "latency": 1e-5, "compute_speed": 0.5})
    assert (cal.intra.bandwidth, cal.intra.latency, cal.compute_speed) == (2e9, 1e-5, 0.5)
    assert local.device_memory_bytes is None  # the virtual CPU devices share the host's memory
    assert {preset(n).device_memory_bytes for n in ("h100-1", "h100-sxm-8", "h100-2x8-ib")} == {80 * 2**30}


@pytest.mark.fast
def test_device_memory_reads_with_units_and_refuses_what_is_no_size():
    base = "nodes: 1\ndevices_per_node: 8\nintra: {bandwidth: 1GB/s, latency: 1us}\n"
    assert ClusterSpec.from_yaml(base + "device_memory: 80GiB\n").device_memory_bytes == 80 * 2**30
    assert ClusterSpec.from_yaml(base + "device_memory: 2GB\n").device_memory_bytes == 2 * 10**9
    assert ClusterSpec.from_yaml(base).device_memory_bytes is None
    with pytest.raises(ValueError, match=r"cluster.device_memory: unknown unit 'GB/s'"):
        ClusterSpec.from_yaml(base + "device_memory: 2GB/s\n")
    with pytest.raises(ValueError, match=r"device_memory_bytes: expected an integer >= 1"):
        preset("local").replace(device_memory_bytes=0)


@pytest.mark.fast
def test_preset_errors():
    with pytest.raises(ValueError, match=r"unknown cluster preset 'dgx-h100'; expected one of local, dgx-a100-8, "
                                         r"2x8-100gbe, 16x8-ib"):
        preset("dgx-h100")
    with pytest.raises(ValueError, match=r"preset 'dgx-a100-8' has 8 devices, got devices=16"):
        preset("dgx-a100-8", devices=16)
    with pytest.raises(ValueError, match=r"preset 'local': calibration: unknown keys \['speed'\]"):
        preset("local", calibration={"speed": 2.0})


@pytest.mark.fast
def test_our_yaml_with_units_and_defaults():
    spec = ClusterSpec.from_yaml("""
        name: two
        nodes: 2
        devices_per_node: 2
        intra: {bandwidth: 300GB/s, latency: 5us}
        inter: {bandwidth: 100Gbps, latency: 15us}
    """)
    assert spec == ClusterSpec("two", 2, 2, LinkSpec(300e9, 5e-6), LinkSpec(12.5e9, 15e-6), "ring", 1.0)


_ONE = "nodes: 1\ndevices_per_node: 1\n"
_LINK = "intra: {bandwidth: 1, latency: 0}\n"


@pytest.mark.fast
@pytest.mark.parametrize("text, message", [
    ("nodes: 0\ndevices_per_node: 1\n" + _LINK, r"cluster.nodes: expected an integer >= 1, got 0"),
    ("nodes: 2\ndevices_per_node: 1\n" + _LINK, r"cluster: missing field 'inter'"),
    (_ONE + "intra: {bandwidth: 1}", r"cluster.intra: expected a mapping with keys bandwidth and latency"),
    (_ONE + _LINK + "algorithm: star", r"cluster.algorithm: expected one of ring, tree, hierarchical, got 'star'"),
    (_ONE + _LINK + "color: red", r"cluster: unknown fields \['color'\]"),
    ("- 1\n- 2", r"cluster: expected a mapping of cluster fields, got list"),
    ("nodes: [", r"cluster: not valid YAML"),
])
def test_our_yaml_errors(text, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec.from_yaml(text)


@pytest.mark.fast
def test_a_key_given_twice_is_refused_not_overruled_silently(tmp_path):
    text = _ONE + _LINK + "algorithm: tree\nalgorithm: ring\n"
    with pytest.raises(ValueError, match=r"^cluster: not valid YAML \(JSON is YAML too\) at line 5, column 1: "
                                         r"found duplicate key 'algorithm'$"):
        ClusterSpec.from_yaml(text)
    with pytest.raises(ValueError, match=r"^c.yaml: not valid YAML .* at line 3, column 35: found duplicate key 'latency'"):
        load_cluster(_write(tmp_path, "c.yaml", _ONE + "intra: {bandwidth: 1, latency: 0, latency: 1}\n"))
    with pytest.raises(ValueError, match=r"resource_pool.yaml: not valid YAML .* found duplicate key 'host1'"):
        load_cluster(_write(tmp_path, "resource_pool.yaml", SUPERSCALER + "  host1: {GPU: {0: {links: []}}}\n"))
    # a merge key ("<<") may be overruled: that is not a duplicate
    merged = ClusterSpec.from_yaml(_ONE + "intra: &b {bandwidth: 1GB/s, latency: 5us}\ninter: {<<: *b, latency: 9us}\n")
    assert merged.inter == LinkSpec(1e9, 9e-6)


@pytest.mark.fast
def test_yaml_nested_thousands_deep_is_refused_in_one_line(tmp_path):
    path = _write(tmp_path, "deep.yaml", "nodes: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ValueError, match=r"^deep.yaml: YAML nested too deeply to read; expected a cluster file"):
        load_cluster(path)
    with pytest.raises(ValueError, match=r"^cluster: YAML nested too deeply"):
        ClusterSpec.from_yaml("{a: " * 20000 + "}" * 20000)


# 10**7 "x" through aliases: a few hundred bytes of YAML, gigabytes if printed whole.
_LAUGHS = "[" + ", ".join(f"&{k} [{', '.join([f'*{p}' if p else 'x'] * 10)}]"
                          for p, k in zip(["", "a", "b", "c", "d", "e", "f"], "abcdefg")) + "]"


@pytest.mark.fast
@pytest.mark.parametrize("name, text, message", [
    ("c.yaml", _ONE + _LINK + "".join(f"k{i}: 1\n" for i in range(10**4)),
     r"^c.yaml: unknown fields \['k0', 'k1', 'k10', 'k100', 'k1000', 'k1001', \.\.\.\]; expected"),
    ("c.yaml", _ONE + _LINK + "name: " + _LAUGHS + "\n", r"^c.yaml.name: expected a string, got \[\['x', 'x', .*\.\.\.$"),
    ("c.yaml", _ONE + _LINK + "name: [" + "x" * 10**6 + " 1]\n", r"^c.yaml.name: expected a string, got \['x+\.\.\.x+ 1'\]"),
    ("c.yaml", _ONE.replace("1", "1" + "0" * 4000, 1) + _LINK, r"^c.yaml: expected at most 2,147,483,648 devices, got nodes x devices_per_node = 1000+\.\.\.0+ x 1$"),
    ("c.yaml", _ONE.replace("1", "1" + "0" * 5000, 1) + _LINK,
     r"^c.yaml: a value that cannot be read \(Exceeds the limit \(4300 digits\) for integer string conversion"),
    ("resource_spec.yml", "nodes: [" + _LAUGHS + "]\n", r"^resource_spec.yml: nodes\[0\]: expected a mapping with address"),
])
def test_a_huge_value_is_cut_short_in_the_message(tmp_path, name, text, message):
    """A value a few MB long, or 10^7 list items through aliases, was printed whole: a 52 MB line."""
    with pytest.raises(ValueError, match=message) as e:
        load_cluster(_write(tmp_path, name, text))
    assert len(str(e.value)) < 400, len(str(e.value))


@pytest.mark.fast
def test_numbers_with_an_exponent_and_no_dot_are_numbers_as_in_json():
    """YAML 1.1 (PyYAML) reads ``5e-1`` as a string: compute_speed refused it, JSON files too."""
    text = _ONE + "intra: {bandwidth: 1e9, latency: 5e-6}\ncompute_speed: 5e-1\noperand_latency: 2E-5\n"
    spec = ClusterSpec.from_yaml(text)
    assert (spec.compute_speed, spec.intra, spec.operand_latency) == (0.5, LinkSpec(1e9, 5e-6), 2e-5)
    as_json = ClusterSpec.from_yaml('{"nodes": 1, "devices_per_node": 1, "compute_speed": 2e0, '
                                    '"intra": {"bandwidth": 1e9, "latency": 5e-6}}')
    assert as_json.compute_speed == 2.0
    odd = spec.replace(name="1e3", description="-5E-1")  # strings that look like such numbers stay strings
    again = ClusterSpec.from_yaml(odd.to_yaml())
    assert (again, again.name, again.description) == (odd, "1e3", "-5E-1")


@pytest.mark.fast
def test_superscaler_and_autodist_files_load_into_equal_specs(tmp_path):
    ss = load_cluster(_write(tmp_path, "resource_pool.yaml", SUPERSCALER), algorithm="hierarchical")
    ad = load_cluster(_write(tmp_path, "resource_spec.yml", AUTODIST), algorithm="hierarchical",
                      intra=NVLINK, inter_latency=15e-6)
    expected = ClusterSpec("2x2", 2, 2, NVLINK, LinkSpec(12.5e9, 15e-6), "hierarchical")
    assert ss == ad == expected
    assert "SuperScaler" in ss.label and "AutoDist" in ad.label


@pytest.mark.fast
def test_superscaler_switch_links_and_one_server(tmp_path):
    one = load_cluster(_write(tmp_path, "resource_pool.yaml", """\
        Server:
          solo:
            GPU:
              0: {links: [{dest: /server/solo/GPU/1/, rate: 800, propagation_latency: 2e-6}]}
              1: {links: [{dest: /server/solo/GPU/0/, rate: 400, propagation_latency: 1e-6}]}
        """))
    assert (one.nodes, one.devices_per_node) == (1, 2)
    assert one.intra == LinkSpec(400e9 / 8, 2e-6) == one.inter  # bottleneck of the two links
    two = load_cluster(_write(tmp_path, "pool.yaml", """\
        Server:
          a: {GPU: {0: {links: []}}}
          b: {GPU: {0: {links: []}}}
        Switch:
          sw: {links: [{dest: /server/a/NIC/0/, rate: 25Gbps, propagation_latency: 10us}]}
        """))
    assert (two.nodes, two.devices_per_node, two.inter.bandwidth) == (2, 1, 25e9 / 8)


@pytest.mark.fast
@pytest.mark.parametrize("text, message", [
    ("Server:\n  a: {GPU: {0: {links: []}, 1: {links: []}}}\n  b: {GPU: {0: {links: []}}}\n",
     r"resource_pool.yaml: Server.\*.GPU: every server must have the same number of GPUs, got \{'a': 2, 'b': 1\}"),
    ("Server:\n  a: {GPU: {0: {links: [{dest: /server/a/GPU/1/, rate: fast, propagation_latency: 1us}]}}}\n",
     r"Server.a.GPU.0.links\[0\].rate: expected a bandwidth"),
    ("Server:\n  a: {GPU: {0: {links: [{dest: /server/a/GPU/1/, rate: 1Gbps}]}}}\n",
     r"Server.a.GPU.0.links\[0\]: missing field 'propagation_latency'"),
    ("Server:\n  a: {GPU: {0: {links: [{dest: /server/zz/GPU/1/, rate: 1Gbps, propagation_latency: 1us}]}}}\n",
     r"Server.a.GPU.0: link dest '/server/zz/GPU/1/' names an unknown server 'zz'"),
    ("Server:\n  a: {GPU: {0: {links: []}}}\n  b: {GPU: {0: {links: []}}}\n",
     r"resource_pool.yaml: no link between servers"),
    ("Server:\n  a: {CPU: {0: {links: []}}}\n", r"resource_pool.yaml: Server.a.GPU: expected a mapping of GPU index"),
    ("Server:\n  a: {GPU: {0: {links: []}}}\nRouter: {}\n", r"unknown top-level keys \['Router'\]"),
    ("Server:\n  a: {GPU: {0: {links: []}}}\n",
     r"resource_pool.yaml: Server: one server with one GPU and no links, so no link costs to read; expected"),
])
def test_superscaler_errors_name_the_field(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_cluster(_write(tmp_path, "resource_pool.yaml", text))


@pytest.mark.fast
@pytest.mark.parametrize("text, kwargs, message", [
    ("nodes:\n  - {address: a, gpus: [0, 1]}\n  - {address: b, gpus: abc}\n", {"intra": NVLINK},
     r"resource_spec.yml: nodes\[1\].gpus: expected a list of GPU indices, got 'abc'"),
    ("nodes:\n  - {address: a, gpus: [0, 1]}\n  - {address: b, gpus: [0]}\n", {"intra": NVLINK},
     r"nodes\[\*\].gpus: every node must have the same number of GPUs, got \[2, 1\]"),
    ("nodes:\n  - {gpus: [0]}\n", {"intra": NVLINK}, r"resource_spec.yml: nodes\[0\]: missing field 'address'"),
    ("nodes:\n  - {address: a, gpus: [0]}\n", {}, r"does not describe links inside a node; pass intra="),
    ("nodes:\n  - {address: a, gpus: [0]}\n  - {address: b, gpus: [0]}\n", {"intra": NVLINK, "inter_latency": 1e-5},
     r"nodes\[\*\].network_bandwidth: no node gives one"),
    ("nodes:\n  - {address: a, gpus: [0], network_bandwidth: 10}\n  - {address: b, gpus: [0]}\n",
     {"intra": NVLINK}, r"gives no inter-node latency; pass inter_latency="),
    ("nodes:\n  - {address: a, gpus: [0], chief: true}\n  - {address: b, gpus: [0], chief: true}\n",
     {"intra": NVLINK}, r"nodes: expected at most one node with chief: true, got 2"),
    ("nodes:\n  - {address: a, gpus: [0], network_bandwidth: fast}\n", {"intra": NVLINK},
     r"nodes\[0\].network_bandwidth: expected a bandwidth"),
])
def test_autodist_errors_name_the_field(tmp_path, text, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_cluster(_write(tmp_path, "resource_spec.yml", text), **kwargs)


def test_an_autodist_file_given_to_the_cli_says_what_to_do_there(tmp_path):
    """From --cluster no intra= can be passed: the message named only that Python argument."""
    from tests.support.cli import run_cli

    path = _write(tmp_path, "resource_spec.yml", AUTODIST)
    r = run_cli("simulate", "--model", "mlp", "--preset", "tiny", "--cluster", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "disco simulate: error: resource_spec.yml: the format does not describe links inside a node; pass "
        "intra=LinkSpec(bandwidth, latency) to load_cluster, or, where no argument can be passed (--cluster), give "
        "the cluster in disco's format: nodes, devices_per_node, intra and inter links (as `disco calibrate --out` "
        "writes)"]


@pytest.mark.fast
def test_autodist_overrides_and_one_node(tmp_path):
    one = load_cluster(_write(tmp_path, "resource_spec.yml", "nodes:\n  - {address: a, gpus: [0, 1, 2]}\n"),
                       intra=NVLINK, name="box")
    assert one == ClusterSpec("box", 1, 3, NVLINK, NVLINK)
    two = load_cluster(_write(tmp_path, "r.yml", "nodes:\n  - {address: a, gpus: [0]}\n  - {address: b, gpus: [0]}\n"),
                       intra=NVLINK, inter_latency=1e-5, inter_bandwidth=1e9)
    assert two.inter == LinkSpec(1e9, 1e-5)


@pytest.mark.fast
def test_spec_validation():
    with pytest.raises(ValueError, match=r"ClusterSpec.devices_per_node: expected an integer >= 1, got 0"):
        ClusterSpec("x", 1, 0, NVLINK, NVLINK)
    with pytest.raises(ValueError, match=r"LinkSpec.latency: expected a non-negative number of seconds, got -1"):
        LinkSpec(1.0, -1)
    with pytest.raises(ValueError, match=r"ClusterSpec.compute_speed: expected a positive number, got 0"):
        ClusterSpec("x", 1, 1, NVLINK, NVLINK, compute_speed=0)


@pytest.mark.fast
@pytest.mark.parametrize("line, message", [
    ("intra: {bandwidth: 1e-320, latency: 0}", r"c.yaml.intra.bandwidth: expected a bandwidth of at least 1 byte/s"),
    ("intra: {bandwidth: 0.5 B/s, latency: 0}", r"c.yaml.intra.bandwidth: expected a bandwidth of at least 1 byte/s"),
    ("intra: {bandwidth: 1, latency: 1e300}", r"c.yaml.intra.latency: expected a latency of at most 3600 s, got 1e\+300"),
    (_LINK + "operand_latency: 2h", r"c.yaml.operand_latency: unknown unit 'h'"),
    (_LINK + "operand_latency: 1e4", r"c.yaml.operand_latency: expected a latency of at most 3600 s"),
    (_LINK + "rs_ag_scale: 0", r"c.yaml.rs_ag_scale: expected a number > 0 and at most 1000 \(a reduce-scatter "),
    (_LINK + "rs_ag_scale: .inf", r"c.yaml.rs_ag_scale: expected a number > 0 and at most 1000 .*got inf"),
    (_LINK + "rs_ag_scale: fast", r"c.yaml.rs_ag_scale: expected a number > 0 .*got 'fast'"),
    (_LINK + "compute_speed: 1e-320", r"c.yaml.compute_speed: expected a finite number >= 1e-06, got 1e-320"),
    (_LINK + "compute_speed: 1e400", r"c.yaml.compute_speed: expected a finite number >= 1e-06, got inf"),
    (_LINK.replace("intra", "inter") + _LINK + "nodes: 65536\ndevices_per_node: 65536",
     r"c.yaml: expected at most 2,147,483,648 devices, got nodes x devices_per_node = 65536 x 65536"),
])
def test_values_that_would_make_the_simulator_fail_are_refused(tmp_path, line, message):
    """A bandwidth of 1e-320 B/s made the simulator raise "deadlocked ... a bug", 10**400 nodes an
    OverflowError: both tracebacks from `disco simulate`."""
    text = line + "\n" if "nodes:" in line else "nodes: 1\ndevices_per_node: 4\n" + line + "\n"
    with pytest.raises(ValueError, match=message):
        load_cluster(_write(tmp_path, "c.yaml", text))
    with pytest.raises(ValueError, match=r"LinkSpec.bandwidth: expected at least 1 byte/s, got 0.5"):
        LinkSpec(0.5, 0.0)
    with pytest.raises(ValueError, match=r"ClusterSpec: expected at most 2,147,483,648 devices"):
        ClusterSpec("x", 10**400, 1, NVLINK, NVLINK)
    with pytest.raises(ValueError, match=r"ClusterSpec.compute_speed: expected at least 1e-06, got 1e-07"):
        ClusterSpec("x", 1, 1, NVLINK, NVLINK, compute_speed=1e-7)


@pytest.mark.fast
def test_from_yaml_never_opens_a_path_given_as_text(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(preset("local").to_yaml())
    with pytest.raises(ValueError, match=r"cluster: expected a mapping of cluster fields, got str"):
        ClusterSpec.from_yaml(str(path))  # a str is YAML text: a bare path string is not a spec


@pytest.mark.fast
def test_operand_latency_reads_units_round_trips_and_defaults_to_zero(tmp_path):
    text = "nodes: 1\ndevices_per_node: 8\nintra: {bandwidth: 1GB/s, latency: 6us}\noperand_latency: 220us\n"
    spec = ClusterSpec.from_yaml(text)
    assert spec.operand_latency == pytest.approx(220e-6)
    assert ClusterSpec.from_yaml(spec.to_yaml()) == spec
    assert ClusterSpec.from_yaml(text.replace("operand_latency: 220us\n", "")).operand_latency == 0.0
    assert "operand_latency" not in ClusterSpec.from_yaml(text.replace("operand_latency: 220us\n", "")).to_dict()
    with pytest.raises(ValueError, match=r"cluster\.operand_latency"):
        ClusterSpec.from_yaml(text.replace("220us", "-1"))
    assert preset("local", devices=8, calibration={"operand_latency": 2e-4}).operand_latency == 2e-4
    one_stream = ClusterSpec.from_yaml(text + "overlap: false\n")
    assert not one_stream.overlap and ClusterSpec.from_yaml(one_stream.to_yaml()) == one_stream
    assert not preset("local").overlap and preset("dgx-a100-8").overlap
    with pytest.raises(ValueError, match=r"cluster\.overlap: expected true or false"):
        ClusterSpec.from_yaml(text + "overlap: sometimes\n")


@pytest.mark.fast
def test_resolve_reads_a_file_or_names_a_preset(tmp_path):
    assert resolve(None, 4) == preset("local", devices=4)
    assert resolve("local", 2).num_devices == 2
    assert resolve("dgx-a100-8", 4) == preset("dgx-a100-8")  # devices go to local only
    path = tmp_path / "c.yaml"
    path.write_text(preset("2x8-100gbe").to_yaml())
    assert resolve(str(path), 8) == preset("2x8-100gbe")
    with pytest.raises(ValueError, match=r"--cluster 'moon-base' is neither a file nor a preset; expected a path "
                                         r"or one of: local, dgx-a100-8"):
        resolve("moon-base", 8)
    binary = tmp_path / "c.bin"
    binary.write_bytes(b"nodes: 1\n\xd0\xff")
    with pytest.raises(ValueError, match=r"c\.bin: not UTF-8 text \(byte 0xd0 at offset 9\); expected cluster YAML"):
        resolve(str(binary), 8)


_HUGE = "1" + "0" * 400  # an integer past the largest float (about 1.8e308)


@pytest.mark.fast
@pytest.mark.parametrize("line, message", [
    (f"intra: {{bandwidth: {_HUGE}, latency: 0}}", r"^c.yaml.intra.bandwidth: expected a finite value, got 10+\.\.\.0+$"),
    (f"intra: {{bandwidth: 1, latency: {_HUGE}}}", r"^c.yaml.intra.latency: expected a finite value, got 10+\.\.\.0+$"),
    (_LINK + f"compute_speed: {_HUGE}", r"^c.yaml.compute_speed: expected a finite number >= 1e-06, got 10+\.\.\.0+$"),
    (_LINK + f"operand_latency: {_HUGE}", r"^c.yaml.operand_latency: expected a finite value, got 10+\.\.\.0+$"),
])
def test_an_integer_too_large_for_a_float_is_refused_with_a_message(tmp_path, line, message):
    """An integer of 400 digits (YAML reads it as an int, not as inf) raised OverflowError ("int too
    large to convert to float"): a traceback from `disco simulate --cluster`."""
    with pytest.raises(ValueError, match=message):
        load_cluster(_write(tmp_path, "c.yaml", "nodes: 1\ndevices_per_node: 4\n" + line + "\n"))
    with pytest.raises(ValueError, match=r"^LinkSpec.bandwidth: expected a positive number of bytes/s"):
        LinkSpec(10**400, 0.0)
    with pytest.raises(ValueError, match=r"^ClusterSpec.compute_speed: expected a positive number"):
        ClusterSpec("x", 1, 1, NVLINK, NVLINK, compute_speed=10**400)
    with pytest.raises(ValueError, match=r"^ClusterSpec.operand_latency: expected a non-negative number"):
        ClusterSpec("x", 1, 1, NVLINK, NVLINK, operand_latency=10**400)


@pytest.mark.fast
def test_a_directory_named_like_a_preset_does_not_hide_the_preset(tmp_path, monkeypatch):
    """`--cluster local` run where a directory ./local exists was read as a cluster file and refused
    ("cluster file 'local': Is a directory"): no preset could be named from such a directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    (tmp_path / "h100-sxm-8").mkdir()
    assert resolve("local", 4) == preset("local", devices=4)
    assert resolve("h100-sxm-8") == preset("h100-sxm-8")
    (tmp_path / "mine").mkdir()  # a directory that names no preset is still refused as a file
    with pytest.raises(ValueError, match=r"^cluster file 'mine': .*; expected a readable cluster YAML file$"):
        resolve("mine", 4)
    (tmp_path / "2x8-100gbe").write_text(preset("dgx-a100-8").to_yaml())  # a file of a preset's name is read
    assert resolve("2x8-100gbe") == preset("dgx-a100-8")


@pytest.mark.fast
def test_a_file_too_large_for_a_cluster_is_refused_without_reading_it_whole(tmp_path):
    """A cluster file was read whole: /dev/zero never ended, a multi-GB file filled the memory, and a
    large JSON file (JSON is YAML) took PyYAML minutes before 'unknown fields'."""
    from disco.sim.cluster_spec import MAX_FILE_BYTES

    big = tmp_path / "data.json"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk space taken
    with pytest.raises(ValueError, match=r"^data.json: more than 16,777,216 bytes; expected a cluster YAML file"):
        load_cluster(big)
    with pytest.raises(ValueError, match=r"^data.json: more than"):
        resolve(str(big))
    if os.path.exists("/dev/zero"):
        (tmp_path / "zero").symlink_to("/dev/zero")
        with pytest.raises(ValueError, match=r"^zero: more than"):
            load_cluster(tmp_path / "zero")
    # a file of CRLF lines reads as before (read_text's universal newlines)
    crlf = tmp_path / "c.yaml"
    crlf.write_bytes(preset("2x8-100gbe").to_yaml().replace("\n", "\r\n").encode())
    assert load_cluster(crlf) == preset("2x8-100gbe")


@pytest.mark.fast
@pytest.mark.parametrize("value", ["1" * 20_000 + "!", "." + "1" * 20_000 + "!", "1" * 10_000 + "." + "1" * 10_000 + "!"])
def test_a_long_run_of_digits_is_refused_in_linear_time(value):
    """The unit pattern let the regex try every split of a run of digits: a 60,000-digit bandwidth
    ending in "!" (a cluster YAML within the service's 64 KiB) took about two minutes to refuse."""
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"^x: expected a bandwidth such as 100Gbps"):
        parse_bandwidth(value, "x")
    with pytest.raises(ValueError, match=r"^x: expected a latency such as 5us"):
        parse_latency(value, "x")
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.fast
def test_rs_ag_scale_round_trips_defaults_to_one_and_comes_from_a_calibration():
    text = "nodes: 1\ndevices_per_node: 8\nintra: {bandwidth: 1GB/s, latency: 6us}\nrs_ag_scale: 1.3\n"
    spec = ClusterSpec.from_yaml(text)
    assert spec.rs_ag_scale == 1.3 and ClusterSpec.from_yaml(spec.to_yaml()) == spec
    assert "rs_ag_scale=1.3" in repr(spec)
    plain = ClusterSpec.from_yaml(text.replace("rs_ag_scale: 1.3\n", ""))
    assert plain.rs_ag_scale == 1.0 and "rs_ag_scale" not in plain.to_dict() and plain != spec
    assert preset("local", devices=8, calibration={"rs_ag_scale": 1.3}).rs_ag_scale == 1.3
    with pytest.raises(ValueError, match=r"ClusterSpec.rs_ag_scale: expected a number > 0"):
        plain.replace(rs_ag_scale=True)

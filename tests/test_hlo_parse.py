"""The HLO text parser: shapes, instructions, modules, and its errors."""

import pytest

from disco.ir import hlo_parse

MODULE = """HloModule jit_f, entry_computation_layout={(f32[4,8]{1,0})->f32[]}

region_0.1 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT add.1 = f32[] add(a, b)
}

ENTRY main.2 {
  p = f32[4,8]{1,0} parameter(0), sharding={replicated}
  t = f32[4,8]{1,0} tanh(p), metadata={op_name="disco_grad[[\\'w\\']]/tanh"}
  c = f32[] constant(0)
  r = f32[] reduce(t, c), dimensions={0,1}, to_apply=region_0.1
  ROOT ar = f32[] all-reduce(r), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=region_0.1
}
"""


def test_parse_shapes():
    assert hlo_parse.parse_shape("f32[8,16]{1,0}") == (hlo_parse.ArrayShape("f32", (8, 16)),)
    leaves = hlo_parse.parse_shape("(f32[2]{0}, (s32[], pred[3,3]))")
    assert [str(a) for a in leaves] == ["f32[2]", "s32[]", "pred[3,3]"]
    assert leaves[2].nbytes == 9
    assert hlo_parse.parse_shape("bf16[<=8,4]")[0].dims == (8, 4)
    assert hlo_parse.parse_shape("(f32[1], /*index=1*/s8[2])")[1].nbytes == 2


def test_parse_module_structure():
    m = hlo_parse.parse_module(MODULE)
    assert m.name == "jit_f"
    assert [c.name for c in m.computations] == ["region_0.1", "main.2"]
    assert m.entry.name == "main.2"
    ins = m.entry.by_name()
    assert ins["r"].operands == ("t", "c")
    assert ins["r"].called == ("region_0.1",)
    assert ins["ar"].is_root and ins["ar"].attrs["replica_groups"] == "{{0,1,2,3}}"
    assert ins["t"].op_name == "disco_grad[['w']]/tanh"
    assert ins["c"].operands == () and ins["c"].raw_operands == "0"


def test_operands_with_printed_shapes():
    ins = hlo_parse.parse_instruction(
        "  %add.3 = f32[2]{0} add(f32[2]{0} %x.1, f32[2]{0} %y.2), metadata={op_name=\"a\"}", "c")
    assert ins.operands == ("x.1", "y.2")
    # XLA dumps number long operand lists with comments
    ins = hlo_parse.parse_instruction("  %t = (f32[], f32[]) tuple(%a, /*index=1*/%b)", "c")
    assert ins.operands == ("a", "b")


@pytest.mark.parametrize("text, match", [
    ("", "empty HLO text"),
    ("hello world", "must start with 'HloModule"),
    ("HloModule m\n\nENTRY e {\n  x = f32[2] parameter(0)\n", "not closed"),
    ("HloModule m\nENTRY e {\n  x = what(0)\n}\n", "cannot find a shape"),
    ("HloModule m\n", "no computations"),
])
def test_parse_errors(text, match):
    with pytest.raises(hlo_parse.HloParseError, match=match):
        hlo_parse.parse_module(text)


def test_parse_error_is_value_error():
    assert issubclass(hlo_parse.HloParseError, ValueError)

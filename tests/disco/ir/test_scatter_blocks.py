"""disco.ir.scatter_blocks: an all-reduce whose dynamic-slice keeps this device's block (by its position in
the replica group, read from the offset table partition-id indexes) is a reduce-scatter; any other
offset table, slice size or user is not, and says why."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disco.ir.graph import HloGraph
from tests.support.fsdp_hlo import fsdp_text


def block(text: str):
    blocks = {b.all_reduce: b for b in HloGraph.from_hlo_text(text).scatter_blocks}
    assert set(blocks) == {"ar"}  # the loss's all-reduce feeds no dynamic-slice
    return blocks["ar"]


@pytest.mark.fast
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize(("n_groups", "interleaved"), [(1, False), (2, False), (2, True)])
def test_a_slice_by_the_devices_position_in_its_group_is_a_block_scatter(dim, n_groups, interleaved):
    b = block(fsdp_text(dim=dim, n_groups=n_groups, interleaved=interleaved))
    assert (b.dim, b.slices, b.why) == (dim, ("slice",), "")


@pytest.mark.fast
@settings(max_examples=40, deadline=None)
@given(p=st.sampled_from([2, 4]), n_groups=st.sampled_from([1, 2]), interleaved=st.booleans(), dim=st.sampled_from([0, 1]),
       data=st.data())
def test_only_the_offset_table_of_the_replica_groups_order_is_a_scatter(p, n_groups, interleaved, dim, data):
    positions = data.draw(st.permutations(range(p)))
    b = block(fsdp_text(p=p, n_groups=n_groups, interleaved=interleaved, dim=dim, positions=positions))
    if positions == list(range(p)):
        assert b.dim == dim and b.why == ""
    else:
        assert b.dim is None and "does not follow the replica groups' order" in b.why


@pytest.mark.fast
def test_a_slice_over_other_devices_or_another_user_is_no_scatter():
    b = block(fsdp_text(p=4, n_groups=2, block=1, shard=(3, 2), dim=1))  # keeps 1 of 8: 8 blocks over groups of 4
    assert b.dim is None and "keeps 1 of 8 along dimension 1, but its replica groups hold 4 devices" in b.why
    b = block(fsdp_text(extra_user=True))
    assert b.dim is None and "also feeds negate 'extra'" in b.why


@pytest.mark.fast
def test_scatter_blocks_round_trip_through_the_graphs_json():
    graph = HloGraph.from_hlo_text(fsdp_text(positions=[1, 0, 2, 3]))
    back = HloGraph.from_json(graph.to_json())
    assert back.scatter_blocks == graph.scatter_blocks and back.scatter_blocks[0].why
    assert "scatter_blocks" not in HloGraph.from_hlo_text(fsdp_text().replace("dynamic-slice(%ar", "dynamic-slice(%g")).to_dict()
    bad = graph.to_dict()
    bad["scatter_blocks"] = [{"all_reduce": "ar", "dim": -1, "slices": [], "why": ""}]
    with pytest.raises(ValueError, match=r"graph JSON field 'scatter_blocks\[0\]': expected an object"):
        HloGraph.from_dict(bad)

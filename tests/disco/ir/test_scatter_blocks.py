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


def groups_of(p: int, n_groups: int, interleaved: bool) -> list[list[int]]:
    """fsdp_text's replica groups."""
    return ([[g + k * n_groups for k in range(p)] for g in range(n_groups)] if interleaved
            else [[g * p + k for k in range(p)] for g in range(n_groups)])


@pytest.mark.fast
@settings(max_examples=40, deadline=None)
@given(p=st.sampled_from([2, 4]), n_groups=st.sampled_from([1, 2]), interleaved=st.booleans(), dim=st.sampled_from([0, 1]),
       data=st.data())
def test_any_order_of_the_blocks_is_a_scatter_over_the_group_listed_in_block_order(p, n_groups, interleaved, dim, data):
    positions = data.draw(st.permutations(range(p)))
    b = block(fsdp_text(p=p, n_groups=n_groups, interleaved=interleaved, dim=dim, positions=positions))
    assert (b.dim, b.why, b.across_groups) == (dim, "", ())
    assert b.scatter_groups == tuple(tuple(g[positions.index(i)] for i in range(p))
                                     for g in groups_of(p, n_groups, interleaved))


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(p=st.sampled_from([2, 4, 6, 8]), k=st.sampled_from([1, 2, 3, 4, 8]), n_groups=st.sampled_from([1, 2]),
       interleaved=st.booleans(), data=st.data())
def test_a_table_is_a_scatter_when_every_block_is_kept_equally_often_and_else_says_why(p, k, n_groups, interleaved,
                                                                                          data):
    """Synthetic offset tables: device ``i`` of each group keeps block ``positions[i]`` of ``k``. A scatter
    exactly when each block is kept by ``p / k`` devices: its scatter groups hold one device of each block
    in block order (the ``j``-th smallest holder of each), its across groups each block's holders."""
    import collections

    from disco.ir.scatter_blocks import decomposition_error

    even = p % k == 0 and data.draw(st.booleans())
    positions = (data.draw(st.permutations([b for b in range(k) for _ in range(p // k)])) if even
                 else data.draw(st.lists(st.integers(0, k - 1), min_size=p, max_size=p)))
    b = block(fsdp_text(p=p, n_groups=n_groups, interleaved=interleaved, dim=1, positions=positions, blocks=k))
    counts = collections.Counter(positions)
    if k == 1:  # the slice keeps the whole gradient: an all-reduce, no scatter
        assert b.dim is None and "the whole array, not one block" in b.why
    elif p % k == 0 and all(counts[i] == p // k for i in range(k)):
        assert (b.dim, b.why, b.blocks) == (1, "", k)
        assert decomposition_error(b.scatter_groups, b.across_groups) == ""
        expected_scatter, expected_across = [], []
        for g in groups_of(p, n_groups, interleaved):
            holders = [sorted(d for i, d in enumerate(g) if positions[i] == blk) for blk in range(k)]
            expected_scatter += [tuple(h[j] for h in holders) for j in range(p // k)]
            expected_across += [tuple(h) for h in holders] if p > k else []
        assert (list(b.scatter_groups), list(b.across_groups)) == (expected_scatter, expected_across)
    else:
        assert b.dim is None and b.scatter_groups == b.across_groups == ()
        if p % k:
            assert f"({k} blocks), but its replica groups hold {p} devices, which do not keep {k} blocks" in b.why
        else:
            assert f"a reduce-scatter needs each of the {k} blocks kept by {p // k}" in b.why
            assert "is kept by" in b.why and "over the replica group [" in b.why


@pytest.mark.fast
def test_a_data_x_fsdp_scatter_is_a_reduce_scatter_over_each_data_index_then_an_all_reduce_across():
    b = block(fsdp_text(p=8, blocks=4, positions=[0, 1, 2, 3] * 2))
    assert b.dim == 1 and b.scatter_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert b.across_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    b = block(fsdp_text(p=8, blocks=4, positions=[0, 0, 1, 1, 2, 2, 3, 3]))  # fsdp major: data index = id % 2
    assert b.scatter_groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and b.across_groups == ((0, 1), (2, 3), (4, 5), (6, 7))


@pytest.mark.fast
def test_a_slice_over_other_devices_or_another_user_is_no_scatter():
    b = block(fsdp_text(p=4, n_groups=2, block=1, shard=(3, 2), dim=1))  # keeps 1 of 8: 8 blocks over groups of 4
    assert b.dim is None and "keeps 1 of 8 along dimension 1 (8 blocks), but its replica groups hold 4 devices" in b.why
    b = block(fsdp_text(p=4, shard=(3, 2), dim=1, block=1, positions=[0, 1, 3, 5]))  # offsets 0, 1, 3, 5 of 8 by 2s
    assert b.dim is None and "keeps 1 of 8 along dimension 1 (8 blocks)" in b.why
    b = block(fsdp_text(p=4, shard=(2, 2), dim=0).replace(
        "s32[4] constant({0, 2, 4, 6})", "s32[4] constant({0, 3, 4, 6})"))  # device 1's offset is inside a block
    assert b.dim is None and "gives device 1 the offset [3] along dimension 0, which is no block's start" in b.why
    b = block(fsdp_text(extra_user=True))
    assert b.dim is None and "also feeds negate 'extra'" in b.why
    b = block(fsdp_text(p=4, shard=(2, 2), dim=0).replace("s32[4] constant({0, 2, 4, 6})", "s32[4] constant({...})"))
    assert b.dim is None and "a constant whose values the HLO dump leaves out ({...})" in b.why  # (a 16-entry table)


@pytest.mark.fast
def test_scatter_blocks_round_trip_through_the_graphs_json():
    for text in (fsdp_text(positions=[1, 0, 2, 3]), fsdp_text(positions=[0, 0, 2, 3]),
                 fsdp_text(p=8, blocks=4, positions=[0, 1, 2, 3] * 2)):
        graph = HloGraph.from_hlo_text(text)
        back = HloGraph.from_json(graph.to_json())
        assert back.scatter_blocks == graph.scatter_blocks
    assert back.scatter_blocks[0].across_groups and not HloGraph.from_hlo_text(fsdp_text(
        positions=[0, 0, 2, 3])).scatter_blocks[0].scatter_groups
    assert "scatter_blocks" not in HloGraph.from_hlo_text(fsdp_text().replace("dynamic-slice(%ar", "dynamic-slice(%g")).to_dict()
    bad = graph.to_dict()
    bad["scatter_blocks"] = [{"all_reduce": "ar", "dim": -1, "slices": [], "why": ""}]
    with pytest.raises(ValueError, match=r"graph JSON field 'scatter_blocks\[0\]': expected an object"):
        HloGraph.from_dict(bad)


@pytest.mark.fast
@pytest.mark.parametrize(("scatter", "across", "why"), [
    ([[0, 1], [2, 3]], [[0, 3], [1, 2]], r"across group \[0, 3\] holds devices of blocks 0 and 1"),
    ([[0, 1], [2, 3]], [[0, 2]], r"devices \[1, 3\] of the scatter groups are in no across group"),
    ([[0, 1], [0, 3]], [], "device 0 is in the scatter groups twice"),
    ([[0, 1], [2]], [], "the scatter groups differ in size"),
    ([], [], "a scatter needs at least one scatter group"),
])
def test_the_graphs_json_refuses_groups_that_are_no_reduce_scatter(scatter, across, why):
    graph = HloGraph.from_hlo_text(fsdp_text(p=8, blocks=4, positions=[0, 1, 2, 3] * 2))
    bad = graph.to_dict()
    bad["scatter_blocks"][0].update(scatter_groups=scatter, across_groups=across)
    with pytest.raises(ValueError, match=rf"graph JSON field 'scatter_blocks\[0\]': {why}"):
        HloGraph.from_dict(bad)

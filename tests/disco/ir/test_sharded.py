"""Steps with sharded parameters (FSDP): every collective of their partitioned program labelled by
dataflow (disco.ir.sharded), the counts checked against the parameters' shardings and XLA's text."""

from __future__ import annotations

import collections
import functools
import re
import warnings

import jax
import pytest
from jax.sharding import PartitionSpec as P

import trax_models
from disco.ir import extractor
from disco.ir.graph import HloGraph
from disco.ir.replica_groups import explicit_replica_groups, replica_group_lists
from disco.ir.sharded import label_collectives, mesh_axes_of, role_counts
from disco.ir.step_checks import check_data_parallel
from tests.support import maxtext_step

DEVICES = 8
# transformer_lm's 1-D mesh in the slow tier (its 2 x 4 mesh and mlp's both meshes stay in the default one)
CASES = [("mlp", None), ("mlp", (2, 4)), pytest.param("transformer_lm", None, marks=pytest.mark.slow),
         ("transformer_lm", (2, 4))]


def _count(text: str, opcode: str) -> int:
    return len(re.findall(rf"\s{opcode}(?:-start)?\(", text))


@functools.cache
def _zoo(name, mesh_shape):
    step, args = trax_models.make_train_step(name, "tiny", devices=DEVICES, style="fsdp", mesh_shape=mesh_shape)
    lowered = extractor.lower(step, *args)
    text = extractor.plan_text(lowered, strict=True)
    return args[0], text, lowered.compile().as_text(), HloGraph.from_hlo_text(text)


def _paths(state, sharded: bool) -> set[str]:
    return {f"state.params{jax.tree_util.keystr(p)}" for p, leaf in jax.tree_util.tree_leaves_with_path(state.params)
            if (leaf.sharding.spec != P() and any(leaf.sharding.spec)) == sharded}


@pytest.mark.parametrize(("name", "mesh_shape"), CASES)
def test_each_sharded_parameter_has_its_gathers_and_its_gradient_scatter(name, mesh_shape):
    state, text, compiled, graph = _zoo(name, mesh_shape)
    labelled = graph.collective_roles()
    by_role = collections.defaultdict(list)
    for c in labelled:
        by_role[c.role].append(c)
    sharded, replicated = _paths(state, True), _paths(state, False)
    assert sharded
    # every all-gather of the partitioned program gathers a parameter shard (no activation is gathered
    # here), one per sharded parameter and a second one of those the backward pass reads again
    gathers = by_role["param_gather"]
    assert len(gathers) == _count(text, "all-gather") == _count(compiled, "all-gather")
    assert {c.param for c in gathers} == sharded
    # each sharded parameter's gradient: one all-reduce and the dynamic-slice that keeps its shard
    scatters = by_role["grad_scatter"]
    assert sorted(c.param for c in scatters) == sorted(sharded)
    index = graph.index()
    for c in scatters:
        assert c.opcode == "all-reduce" and graph.nodes[index[c.slice]].opcode == "dynamic-slice"
        assert graph.nodes[index[c.name]].is_gradient  # bucketed as the gradients' all-reduces are
    # a replicated parameter's gradient is reduced whole; on a 2-D mesh a shard's gradient is then
    # reduced over the data axis too, unless XLA scattered it over both axes at once
    reduces = by_role["grad_reduce"]
    assert {c.param for c in reduces} >= replicated
    data_axis = mesh_shape is not None
    for c in reduces:
        assert c.param in replicated or (data_axis and c.axes == ("data",)), c
    # the loss's mean, the one other all-reduce
    assert [c.opcode for c in by_role["other"]] == ["all-reduce"] and by_role["other"][0].bytes == 4
    assert len(labelled) == _count(text, "all-gather") + _count(text, "all-reduce")
    assert graph.summary()["collectives"] == role_counts(labelled)


@pytest.mark.parametrize(("name", "mesh_shape"), [("resnet50", None), pytest.param("resnet50", (2, 4), marks=pytest.mark.slow)])
def test_a_conv_nets_parameters_are_gathered_again_some_reversed_for_the_backward_pass(name, mesh_shape):
    state, text, _, graph = _zoo(name, mesh_shape)
    labelled = graph.collective_roles()
    sharded = _paths(state, True)
    gathers = [c for c in labelled if c.role == "param_gather"]
    assert {c.param for c in gathers} == sharded
    assert sorted(c.param for c in labelled if c.role == "grad_scatter") == sorted(sharded)
    preds = {d: s for s, d in graph.edges}
    index = graph.index()
    regathered = [c for c in gathers if graph.nodes[preds[index[c.name]]].opcode == "reverse"]
    # gathered once for the forward pass and at most once more for the backward pass (normalisation
    # parameters, and kernels reversed for the transposed convolution)
    assert regathered and set(collections.Counter(c.param for c in gathers).values()) == {1, 2}
    # what else the partitioner adds (an activation's reshard, the loss's mean) is left alone
    others = [c for c in labelled if c.role == "other"]
    assert len(labelled) == sum(_count(text, op) for op in ("all-gather", "all-reduce", "all-to-all"))
    assert 1 <= len(others) <= 3 and all(c.param is None for c in others)


@pytest.mark.parametrize(("name", "mesh_shape"), CASES)
def test_collectives_are_told_apart_by_mesh_axis(name, mesh_shape):
    _, _, _, graph = _zoo(name, mesh_shape)
    labelled = graph.collective_roles()
    assert graph.mesh == (("data", 1 if mesh_shape is None else 2), ("fsdp", 8 if mesh_shape is None else 4))
    fsdp = 8 if mesh_shape is None else 4
    for c in labelled:
        if c.role == "param_gather":
            assert c.axes == ("fsdp",) and c.group_size == fsdp
        elif c.role == "grad_scatter":
            assert c.axes in ({("fsdp",)} if mesh_shape is None else {("fsdp",), ("data", "fsdp")})
    if mesh_shape is not None:
        assert any(c.axes == ("data",) for c in labelled if c.role == "grad_reduce")
    gather = next(c for c in labelled if c.role == "param_gather")
    node = graph.nodes[graph.index()[gather.name]]
    assert gather.bytes == node.out_bytes  # the gathered (whole) parameter


@pytest.mark.parametrize("name", ["mlp", "transformer_lm"])
def test_the_fsdp_step_passes_the_step_checks_with_its_gradients_found(name):
    _, _, _, graph = _zoo(name, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NoGradientWarning
        check_data_parallel(graph)
    assert graph.summary()["gradient_all_reduces"] == len(graph.all_reduces()) - 1  # all but the loss's


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 4, 1)])
def test_a_maxtext_style_flax_step_is_read_with_its_gathers_and_scatters(mesh_shape):
    step, (state, batch) = maxtext_step.make_step(mesh_shape)
    text = extractor.plan_text(extractor.lower(step, state, batch), strict=True)
    graph = HloGraph.from_hlo_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_data_parallel(graph)
    labelled = label_collectives(graph)
    roles = collections.Counter(c.role for c in labelled)
    sharded = {f"state.params{jax.tree_util.keystr(p)}" for p, leaf in jax.tree_util.tree_leaves_with_path(state.params)
               if any(leaf.sharding.spec)}
    assert len(sharded) == 13  # every weight but the 5 layer norms' scales
    assert {c.param for c in labelled if c.role == "param_gather"} == sharded
    assert {c.param for c in labelled if c.role == "grad_scatter"} == sharded
    assert roles["param_gather"] == 13
    assert {c.param for c in labelled if c.role == "grad_reduce"} >= _replicated(state)
    # the rest: the targets' gather for the loss, the tied embedding's reshard, the loss's mean
    assert roles["other"] <= 4
    assert sum(roles.values()) == sum(_count(text, op) for op in ("all-gather", "all-reduce", "all-to-all"))


def _replicated(state) -> set[str]:
    return {f"state.params{jax.tree_util.keystr(p)}" for p, leaf in jax.tree_util.tree_leaves_with_path(state.params)
            if not any(leaf.sharding.spec)}


# -- without a compile --------------------------------------------------------------------------
_RS_STEP = """HloModule rs_step, entry_computation_layout={(f32[2,4]{1,0}, f32[8,4]{1,0})->(f32[2,4]{1,0}, f32[])}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[2,4], x: f32[8,4]) -> (f32[2,4], f32[]) {
  %p = f32[2,4]{1,0} parameter(0)
  %x = f32[8,4]{1,0} parameter(1)
  %ag = f32[8,4]{1,0} all-gather(%p), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %g = f32[8,4]{1,0} multiply(%ag, %x)
  %rs = f32[2,4]{1,0} reduce-scatter(%g), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true, to_apply=%add
  %new = f32[2,4]{1,0} subtract(%p, %rs)
  %zero = f32[] constant(0)
  %l = f32[] reduce(%g, %zero), dimensions={0,1}, to_apply=%add
  ROOT %out = (f32[2,4]{1,0}, f32[]) tuple(%new, %l)
}
"""


@pytest.mark.fast
def test_xla_gpus_reduce_scatter_form_is_a_gradient_scatter_and_passes_the_checks():
    graph = HloGraph.from_hlo_text(_RS_STEP)
    labelled = {c.name: c for c in label_collectives(graph)}
    assert labelled["ag"].role == "param_gather" and labelled["ag"].param == "p" and labelled["ag"].bytes == 128
    assert labelled["rs"].role == "grad_scatter" and labelled["rs"].param == "p" and labelled["rs"].slice is None
    assert labelled["rs"].bytes == 128 and labelled["rs"].group_size == 4
    assert labelled["ag"].axes is None  # no mesh in the module
    check_data_parallel(graph)  # no all-reduce, but a gather and a scatter of a parameter shard


@pytest.mark.fast
def test_a_step_with_other_collectives_and_no_all_reduce_is_still_refused():
    text = _RS_STEP.replace("%ag = f32[8,4]{1,0} all-gather(%p)", "%ag = f32[8,4]{1,0} all-gather(%x.s)").replace(
        "%x = f32[8,4]{1,0} parameter(1)", "%x = f32[8,4]{1,0} parameter(1)\n  %x.s = f32[2,4]{1,0} slice(%x), "
        "slice={[0:2], [0:4]}\n  %x.e = f32[2,4]{1,0} exponential(%x.s)").replace("all-gather(%x.s)", "all-gather(%x.e)")
    text = text.replace("reduce-scatter(%g)", "reduce-scatter(%gg)").replace(
        "%rs = f32[2,4]", "%gg = f32[8,4]{1,0} exponential(%g)\n  %rs = f32[2,4]").replace(
        "%new = f32[2,4]{1,0} subtract(%p, %rs)", "%new = f32[2,4]{1,0} subtract(%x.e, %rs)")
    graph = HloGraph.from_hlo_text(text)
    assert {c.role for c in label_collectives(graph)} == {"other"}
    with pytest.raises(ValueError, match=r"no all-reduce in the program of 'rs_step', but 1 all-gather, "
                                         r"1 reduce-scatter, none of which gathers a parameter shard"):
        check_data_parallel(graph)


@pytest.mark.fast
@pytest.mark.parametrize(("groups", "lists"), [
    ("{{0,1,2,3},{4,5,6,7}}", [(0, 1, 2, 3), (4, 5, 6, 7)]),
    ("[2,4]<=[8]", [(0, 1, 2, 3), (4, 5, 6, 7)]),
    ("[4,2]<=[2,4]T(1,0)", [(0, 4), (1, 5), (2, 6), (3, 7)]),
    # XLA's partitioner over a (data=2, fsdp=4) mesh: its own axes, the devices an iota
    ("mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}", [(0, 1, 2, 3), (4, 5, 6, 7)]),
    ("mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_2'}", [(0, 4), (1, 5), (2, 6), (3, 7)]),
    ("{}", None),
])
def test_replica_group_lists_reads_every_form(groups, lists):
    assert replica_group_lists(groups) == lists


@pytest.mark.fast
def test_a_mesh_form_with_iota_device_ids_is_expanded_for_the_manual_module():
    assert explicit_replica_groups("mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}") == \
        "{{0,1,2,3},{4,5,6,7}}"


@pytest.mark.fast
@pytest.mark.parametrize(("groups", "axes"), [
    ([(0, 1, 2, 3), (4, 5, 6, 7)], ("fsdp",)),
    ([(0, 4), (1, 5), (2, 6), (3, 7)], ("data",)),
    ([tuple(range(8))], ("data", "fsdp")),
    ([(0, 1), (2, 3), (4, 5), (6, 7)], None),  # a sub-axis of fsdp: no set of the mesh's axes
])
def test_mesh_axes_of_names_the_axes_a_collective_spans(groups, axes):
    assert mesh_axes_of(groups, (("data", 2), ("fsdp", 4))) == axes


@pytest.mark.fast
def test_the_mesh_survives_the_graph_json_and_is_not_compared():
    graph = HloGraph.from_hlo_text(_RS_STEP)
    assert graph.mesh == ()
    meshed = HloGraph(graph.name, graph.nodes, graph.edges, graph.fingerprint, mesh=(("data", 2), ("fsdp", 4)))
    again = HloGraph.from_json(meshed.to_json())
    assert again.mesh == (("data", 2), ("fsdp", 4)) and again == graph
    assert "mesh" not in graph.to_dict()
    with pytest.raises(ValueError, match=r"graph JSON field 'mesh': expected a list of \[axis name, size >= 1\]"):
        HloGraph.from_dict({**meshed.to_dict(), "mesh": [["data", 0]]})


# -- written with jax.shard_map (the jax docs' FSDP) ----------------------------------------------


def test_a_shard_map_fsdp_steps_gathers_and_scatters_are_followed_through_its_boundaries():
    """all_gather and psum_scatter inside the shard_map's bodies, the step's parameters whole outside:
    each gather and scatter named for its own parameter (two biases of one shape told apart by the
    tuple element they travel in), the backward pass's re-gathers through the remat's opt-barrier, and
    the loss's pmean in the forward body no gradient (its body's scalar shard is no parameter)."""
    from tests.support import sharded_user_steps

    entry = sharded_user_steps.make_shard_map_fsdp()
    with sharded_user_steps.context(entry), warnings.catch_warnings():
        warnings.simplefilter("error")  # no NoGradientWarning: the gradients are the reduce-scatters
        text = extractor.plan_text(extractor.lower(entry.step, *entry.args), strict=True)
        graph = HloGraph.from_hlo_text(text)
        check_data_parallel(graph)
    labelled = graph.collective_roles()
    paths = [f"params{p}" for p in sharded_user_steps.sharded_paths(entry)]
    gathers = [c.param for c in labelled if c.role == "param_gather"]
    assert sorted(set(gathers)) == sorted(paths) and len(gathers) == len(paths) + 2  # W1, W2 gathered again
    assert sorted(c.param for c in labelled if c.role == "grad_scatter" and c.opcode == "reduce-scatter") == sorted(paths)
    (loss,) = [c for c in labelled if c.opcode == "all-reduce"]
    assert loss.role == "other" and loss.bytes == 4
    again = HloGraph.from_json(graph.to_json())  # a built graph keeps its labels (no tuple indices there)
    assert again.collective_roles() == labelled

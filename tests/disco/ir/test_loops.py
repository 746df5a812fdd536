"""While loops: trip counts (disco.ir.loops), flops per iteration, loop graphs, and the simulator's price.

Real jax programs (fori_loop, while_loop, the zoo's gpt2 and rnnlm at preset tiny), read both as
jax lowers them (pre-optimisation: the induction-variable pattern) and as XLA:CPU compiles them
(``known_trip_count`` in the backend config), plus hand-written HLO for the patterns jax does not
print (counting down, LE/GE bounds, steps that do not divide the range).
"""

from __future__ import annotations

import dataclasses
import functools

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from disco.ir import hlo_parse, loops
from disco.ir.flops import module_flops
from disco.ir.graph import HloGraph
from disco.ir.opcodes import COLLECTIVE_KIND, ZERO_COST_OPCODES
from disco.plans import baselines
from disco.sim import cluster as dcluster
from disco.sim.costs import AnalyticCosts, GraphKernels
from disco.sim.costs.device_costs import analytic
from disco.sim.simulator import Simulator


def _texts(fn, *args) -> tuple[str, str]:
    """(pre-optimisation, optimised) HLO text of ``jax.jit(fn)(*args)``."""
    import jax

    lowered = jax.jit(fn).lower(*args)
    return lowered.as_text(dialect="hlo"), lowered.compile().as_text()


def _counts(text: str) -> list[int | None]:
    return list(loops.trip_counts(hlo_parse.parse_module(text)).values())


def _x():
    import jax.numpy as jnp

    return jnp.ones((4,), jnp.float32)


def _fori(lower: int, upper: int):
    import jax

    return lambda x: jax.lax.fori_loop(lower, upper, lambda i, x: x * 2.0 + i, x)


# -- trip counts of real jax loops -----------------------------------------------------------------
@pytest.mark.parametrize("optimized", [False, True], ids=["pre", "opt"])
def test_fori_loop_known_count(optimized):
    pre, opt = _texts(_fori(3, 10), _x())
    assert _counts(opt if optimized else pre) == [7]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lower=st.integers(-3, 5), n=st.integers(0, 9))
def test_fori_loop_counts_property(lower, n):
    import jax

    pre, opt = _texts(lambda x: jax.lax.fori_loop(lower, lower + n, lambda i, x: x + 1.0, x), _x())
    # jax drops a loop it can see runs zero times, XLA one that runs once; otherwise one loop.
    assert _counts(pre) == ([n] if n > 0 else [])
    assert _counts(opt) == ([n] if n > 1 else [])


@pytest.mark.parametrize("optimized", [False, True], ids=["pre", "opt"])
def test_data_dependent_while_is_unknown(optimized):
    import jax

    def fn(x):
        return jax.lax.while_loop(lambda c: c[1].sum() < 100.0, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]

    pre, opt = _texts(fn, _x())
    assert _counts(opt if optimized else pre) == [None]


@pytest.mark.parametrize("optimized", [False, True], ids=["pre", "opt"])
def test_bound_from_an_argument_is_unknown(optimized):
    import jax
    import jax.numpy as jnp

    pre, opt = _texts(lambda x, n: jax.lax.fori_loop(0, n, lambda i, x: x * 2.0, x), _x(), jnp.int32(5))
    assert _counts(opt if optimized else pre) == [None]


@functools.lru_cache(maxsize=None)
def _zoo_texts(model: str) -> tuple[str, str]:
    import trax_models
    from disco.ir import extractor

    step, args = trax_models.make_train_step(model, "tiny", devices=2)
    return (extractor.hlo_text(step, *args), extractor.hlo_text(step, *args, optimized=True))


def _zoo_trips(model: str) -> int:
    import trax_models

    config = trax_models.config(model, "tiny")
    return config.n_layers if model == "gpt2" else config.seq_len


@pytest.mark.parametrize("optimized", [False, True], ids=["pre", "opt"])
@pytest.mark.parametrize("model", ["gpt2", "rnnlm"])
def test_zoo_trip_counts(model, optimized):
    """gpt2's layers run in one scan (forward and backward: n_layers each); rnnlm's LSTMs over time
    (two layers, forward and backward: seq_len each)."""
    text = _zoo_texts(model)[int(optimized)]
    counts = _counts(text)
    assert counts == [_zoo_trips(model)] * (2 if model == "gpt2" else 4)
    assert _zoo_trips(model) > 1


# -- flops and loop graphs -------------------------------------------------------------------------
def _kernel_flops(graph: HloGraph) -> float:
    return sum(n.flops for n in graph.nodes if n.opcode not in ZERO_COST_OPCODES and n.opcode not in COLLECTIVE_KIND)


@pytest.mark.parametrize("model", ["gpt2", "rnnlm"])
def test_while_flops_are_trips_times_body(model):
    """A while node's flops = trip count x (body + condition); the body graph holds one iteration."""
    module = hlo_parse.parse_module(_zoo_texts(model)[0])
    graph = HloGraph.from_hlo_text(_zoo_texts(model)[0])
    per_ins = module_flops(module)
    comp_flops = {}
    for (comp, _), f in per_ins.items():
        comp_flops[comp] = comp_flops.get(comp, 0.0) + f
    trips = _zoo_trips(model)
    assert len(graph.loops) == (2 if model == "gpt2" else 4)
    index = graph.index()
    for loop in graph.loops:
        node = graph.nodes[index[loop.node]]
        assert node.opcode == "while" and loop.trip_count == trips
        body_comp, cond_comp = loop.body.name.rsplit("/", 1)[1], loop.condition.name.rsplit("/", 1)[1]
        one = comp_flops[body_comp] + comp_flops[cond_comp]
        assert one > 0
        assert node.flops == pytest.approx(trips * one)
        # The body graph's kernels (its calls inlined) hold one iteration's flops.
        assert _kernel_flops(loop.body) + _kernel_flops(loop.condition) == pytest.approx(one)
    summary = graph.summary()
    assert summary["while_loops"] == len(graph.loops)
    assert set(summary["loop_trip_counts"].values()) == {trips} and summary["loops_unknown_trips"] == []


def test_unknown_trip_count_counts_once():
    import jax

    def fn(x):
        return jax.lax.while_loop(lambda c: c[1].sum() < 100.0, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]

    graph = HloGraph.from_hlo_text(_texts(fn, _x())[0])
    (loop,) = graph.loops
    assert loop.trip_count is None
    node = graph.nodes[graph.index()[loop.node]]
    assert node.flops == pytest.approx(_kernel_flops(loop.body) + _kernel_flops(loop.condition))
    assert graph.summary()["loops_unknown_trips"] == [loop.node]


@pytest.mark.fast
def test_fingerprint_covers_the_loop_program_not_its_trip_count(monkeypatch):
    """Two loops that differ only in their bound's constant differ (the program differs); the trip
    count disco derives is not part of the fingerprint, so stored plans keep their key when the
    loop analysis changes."""
    short, long = HloGraph.from_hlo_text(_loop_text(bound=3)), HloGraph.from_hlo_text(_loop_text(bound=10))
    assert [lp.trip_count for lp in short.loops + long.loops] == [3, 10]
    assert short.fingerprint != long.fingerprint
    monkeypatch.setattr(loops, "trip_counts", lambda module: {})  # the analysis finds nothing
    unknown = HloGraph.from_hlo_text(_loop_text(bound=10))
    assert [lp.trip_count for lp in unknown.loops] == [None] and unknown.fingerprint == long.fingerprint


def test_graph_json_round_trip_keeps_loops():
    graph = HloGraph.from_hlo_text(_zoo_texts("rnnlm")[0])
    again = HloGraph.from_json(graph.to_json())
    assert again == graph and len(again.loops) == 4
    assert again.loops[0].body.nodes == graph.loops[0].body.nodes


def test_graph_json_without_loops_has_no_loops_key():

    graph = HloGraph.from_hlo_text(_texts(lambda x: x * 2.0, _x())[0])
    assert graph.loops == () and "loops" not in graph.to_dict()


@pytest.mark.parametrize("bad,msg", [
    ({"node": "nope"}, r"loops\[0\]': expected an object"),
    ({"node": "while.5", "trip_count": -1, "body": {}, "condition": {}}, r"trip_count': expected a non-negative"),
    ({"node": "nope", "trip_count": 2, "body": None, "condition": None},
     r"loops\[0\]\.body': graph JSON must be an object, got NoneType"),
])
def test_graph_json_bad_loops(bad, msg):
    graph = HloGraph.from_hlo_text(_texts(_fori(0, 3), _x())[0])
    data = graph.to_dict()
    if isinstance(bad.get("body"), dict) and not bad["body"]:
        bad = {**bad, "body": data["loops"][0]["body"], "condition": data["loops"][0]["condition"]}
    data["loops"] = [bad]
    with pytest.raises(ValueError, match=msg):
        HloGraph.from_dict(data)


def test_graph_json_loop_node_must_exist():
    graph = HloGraph.from_hlo_text(_texts(_fori(0, 3), _x())[0])
    data = graph.to_dict()
    data["loops"][0]["node"] = "no-such-node"
    with pytest.raises(ValueError, match=r"loops\[0\]\.node': 'no-such-node' is not a node"):
        HloGraph.from_dict(data)


# -- hand-written HLO: the patterns jax does not print ------------------------------------------------
_LOOP = """HloModule m

body {{
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  k = s32[] constant({step})
  next = s32[] {update}(i, k)
  x = f32[4] get-tuple-element(p), index=1
  y = f32[4] add(x, x)
  ROOT t = (s32[], f32[4]) tuple(next, y)
}}

cond {{
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant({bound})
  ROOT c = pred[] compare({lhs}, {rhs}), direction={direction}
}}

ENTRY main {{
  zero = s32[] constant({init})
  x = f32[4] parameter(0)
  init = (s32[], f32[4]) tuple(zero, x)
  ROOT w = (s32[], f32[4]) while(init), condition=cond, body=body{config}
}}
"""


def _loop_text(init=0, bound=10, step=1, direction="LT", update="add", flip=False, config=""):
    lhs, rhs = ("n", "i") if flip else ("i", "n")
    return _LOOP.format(init=init, bound=bound, step=step, direction=direction, update=update,
                        lhs=lhs, rhs=rhs, config=config)


def _reference(init, bound, step, direction):
    """Iterations of the loop, by running it (the counter alone)."""
    ops = {"LT": int.__lt__, "LE": int.__le__, "GT": int.__gt__, "GE": int.__ge__}
    i, n = init, 0
    while ops[direction](i, bound):
        i += step
        n += 1
        assert n < 10_000
    return n


@pytest.mark.fast
@settings(max_examples=60, deadline=None)
@given(init=st.integers(-20, 20), bound=st.integers(-20, 20), step=st.integers(1, 5),
       direction=st.sampled_from(["LT", "LE", "GT", "GE"]), flip=st.booleans())
def test_counting_patterns_match_running_the_loop(init, bound, step, direction, flip):
    """i < N, i <= N counting up and i > N, i >= N counting down (as subtract, or add of -k),
    the bound on either side of the compare; a loop that would never end is None."""
    counting_down = direction in ("GT", "GE")
    mirrored = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}[direction] if flip else direction
    text = _loop_text(init=init, bound=bound, step=step, direction=mirrored,
                      update="subtract" if counting_down else "add", flip=flip)
    expected = _reference(init, bound, -step if counting_down else step, direction)
    assert _counts(text) == [expected]


@pytest.mark.fast
def test_counting_up_toward_a_lower_bound_never_ends():
    assert _counts(_loop_text(init=5, bound=0, step=1, direction="GT", update="add")) == [None]
    assert _counts(_loop_text(init=5, bound=0, step=1, direction="GT", update="subtract")) == [5]


@pytest.mark.fast
def test_known_trip_count_wins():
    config = ', backend_config={"known_trip_count":{"n":"12"}}'
    assert _counts(_loop_text(bound=3, config=config)) == [12]
    ins = hlo_parse.parse_module(_loop_text(config=config)).entry.root
    assert loops.known_trip_count(ins) == 12
    assert loops.known_trip_count(hlo_parse.parse_module(_loop_text()).entry.root) is None


@pytest.mark.fast
def test_not_a_constant_bound_or_step():
    text = _loop_text().replace("n = s32[] constant(10)", "n = s32[] get-tuple-element(p), index=0")
    assert _counts(text) == [None]
    text = _loop_text().replace("next = s32[] add(i, k)", "next = s32[] multiply(i, k)")
    assert _counts(text) == [None]
    text = _loop_text().replace("zero = s32[] constant(0)", "zero = s32[] parameter(1)")
    assert _counts(text) == [None]


@pytest.mark.fast
def test_while_trip_count_refuses_other_opcodes():
    module = hlo_parse.parse_module(_loop_text())
    tup = module.entry.by_name()["init"]
    with pytest.raises(ValueError, match=r"expected a 'while' instruction, got 'tuple' \('init'\)"):
        loops.while_trip_count(module, tup)
    assert loops.while_trip_count(module, module.entry.root) == 10


# -- traffic of slices inside a loop body ----------------------------------------------------------------
_SLICES = """HloModule s

ENTRY main {
  stack = f32[16,256] parameter(0)
  i = s32[] parameter(1)
  zero = s32[] constant(0)
  row = f32[1,256] dynamic-slice(stack, i, zero), dynamic_slice_sizes={1,256}
  twice = f32[1,256] add(row, row)
  ROOT put = f32[16,256] dynamic-update-slice(stack, twice, i, zero)
}
"""


@pytest.mark.fast
def test_dynamic_slice_reads_its_slice_and_update_writes_in_place():
    graph = HloGraph.from_hlo_text(_SLICES)
    idx = graph.index()
    gk = GraphKernels(graph)
    row = gk.kernel([idx["row"]])
    assert row.in_bytes == 256 * 4 + 4 + 4  # the slice, not the 16-row stack; two s32 indices
    put = gk.kernel([idx["put"]])
    assert put.in_bytes == 256 * 4 + 4 + 4 and put.out_bytes == 256 * 4  # the update, in place
    fused = gk.kernel([idx["row"], idx["twice"], idx["put"]])
    assert fused.in_bytes == 256 * 4 + 8 and fused.out_bytes == 256 * 4


_GATHER_SCATTER = """HloModule g

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  table = f32[1000,64] parameter(0)
  ids = s32[8,1] parameter(1)
  rows = f32[8,64] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  twice = f32[8,64] add(rows, rows)
  zeros = f32[1000,64] parameter(2)
  ROOT grad = f32[1000,64] scatter(zeros, ids, twice), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add_f32
}
"""


@pytest.mark.fast
def test_gather_reads_its_rows_and_scatter_writes_its_update_in_place():
    """An embedding lookup and its gradient: neither kernel moves the 1000-row table."""
    graph = HloGraph.from_hlo_text(_GATHER_SCATTER)
    idx = graph.index()
    gk = GraphKernels(graph)
    rows = gk.kernel([idx["rows"]])
    assert rows.in_bytes == 8 * 64 * 4 + 8 * 4 and rows.out_bytes == 8 * 64 * 4  # the rows and the ids
    grad = gk.kernel([idx["grad"]])
    assert grad.in_bytes == 8 * 4 + 8 * 64 * 4 and grad.out_bytes == 8 * 64 * 4  # ids and update; in place
    fused = gk.kernel([idx["rows"], idx["twice"], idx["grad"]])
    assert fused.in_bytes == 8 * 64 * 4 + 8 * 4 and fused.out_bytes == 8 * 64 * 4


@pytest.mark.fast
def test_compiled_gather_and_scatter_count_rows_not_the_table():
    """The per-kernel features read the same traffic from an optimised module (fused and unfused)."""
    from gnn import kernel_features as KF

    fused = _GATHER_SCATTER.replace("ENTRY main {", """fused_rows {
  t = f32[1000,64] parameter(0)
  i = s32[8,1] parameter(1)
  g = f32[8,64] gather(t, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  ROOT d = f32[8,64] add(g, g)
}

fused_grad {
  z = f32[1000,64] parameter(0)
  i = s32[8,1] parameter(1)
  u = f32[8,64] parameter(2)
  ROOT sc = f32[1000,64] scatter(z, i, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add_f32
}

ENTRY main {""").replace(
        "  rows = f32[8,64] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, "
        "index_vector_dim=1, slice_sizes={1,64}\n  twice = f32[8,64] add(rows, rows)",
        "  twice = f32[8,64] fusion(table, ids), kind=kLoop, calls=fused_rows").replace(
        "  ROOT grad = f32[1000,64] scatter(zeros, ids, twice), update_window_dims={1}, inserted_window_dims={0}, "
        "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add_f32",
        "  ROOT grad = f32[1000,64] fusion(zeros, ids, twice), kind=kInput, calls=fused_grad")
    assert "calls=fused_rows" in fused and "calls=fused_grad" in fused
    for text, names in ((_GATHER_SCATTER, ("rows", "grad")), (fused, ("twice", "grad"))):
        kernels = {k.name: k.kernel for k in KF.module_kernels(text)}
        gather, scatter = kernels[names[0]], kernels[names[1]]
        assert gather.in_bytes == 8 * 64 * 4 + 8 * 4, text
        assert scatter.out_bytes == 8 * 64 * 4 and scatter.in_bytes == 8 * 4 + 8 * 64 * 4, text


@pytest.mark.fast
def test_a_variadic_scatter_is_not_taken_as_in_place():
    from disco.ir.opcodes import in_place_update

    assert in_place_update("scatter", 3) == 2 and in_place_update("dynamic-update-slice", 4) == 1
    assert in_place_update("scatter", 5) is None and in_place_update("gather", 2) is None


_GPU_LOOP = """HloModule w, is_scheduled=true

cond {
  p = (s32[], f32[64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(6)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[64]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[64] get-tuple-element(p), index=1
  y = f32[64] exponential(x)
  ROOT t = (s32[], f32[64]) tuple(next, y)
}

ENTRY main {
  x0 = f32[64] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[64]) tuple(zero, x0)
  ROOT w = (s32[], f32[64]) while(init), condition=cond, body=body, backend_config={"known_trip_count":{"n":"6"}}
}
"""


@pytest.mark.fast
@pytest.mark.parametrize("backend", ["gpu", "cpu"])
def test_compiled_while_runs_its_condition_only_off_the_gpu(backend):
    """XLA:GPU's WhileThunk loops on known_trip_count: the condition's compare is no kernel there."""
    from gnn import kernel_features as KF

    kernels = {k.name: k.executions for k in KF.module_kernels(_GPU_LOOP, backend=backend)}
    assert kernels["y"] == 6 and kernels["next"] == 6
    assert ("lt" in kernels) == (backend == "cpu")
    unknown = _GPU_LOOP.replace(', backend_config={"known_trip_count":{"n":"6"}}', "")
    assert "lt" in {k.name for k in KF.module_kernels(unknown, backend=backend)}  # an unknown count runs it
    with pytest.raises(ValueError, match="backend 'tpu'"):
        KF.module_kernels(_GPU_LOOP, backend="tpu")


# -- the simulator prices a loop by its trip count -----------------------------------------------------
_CLUSTERS = {"cpu": (AnalyticCosts(), dcluster.preset("local", devices=2)),
             "h100": (analytic("h100"), dcluster.preset("h100-1"))}


@pytest.mark.parametrize("cluster", sorted(_CLUSTERS))
@pytest.mark.parametrize("model", ["gpt2", "rnnlm"])
def test_simulated_loop_is_trips_times_one_iteration(model, cluster):
    costs, spec = _CLUSTERS[cluster]
    graph = HloGraph.from_hlo_text(_zoo_texts(model)[0])
    sim = Simulator(graph, costs, spec)
    plan = baselines.make("xla_default", graph)
    timeline = {e.name: e.end - e.start for e in sim.run(plan).timeline}
    for loop in graph.loops:
        body = Simulator(loop.body, costs, spec).serial_time()
        condition = Simulator(loop.condition, costs, spec).serial_time()
        assert body > 0 and condition > 0 and loop.trip_count is not None
        # XLA:GPU loops on a known trip count and never runs the condition; XLA:CPU evaluates it every trip.
        one = body if cluster == "h100" else body + condition
        assert timeline[loop.node] == pytest.approx(loop.trip_count * one, rel=1e-12)
    # More work than the same graph with each loop priced as one node (the old price).
    flat = Simulator(dataclasses.replace(graph, loops=()), costs, spec)
    assert sim.result(plan).compute_time > flat.result(plan).compute_time
    assert sim.lower_bound() <= sim.step_time(plan)


def test_loop_kernels_carry_the_steps_input_bytes():
    """The per-kernel GNN's step context: a loop body's kernels get the step's parameters, not the body's."""
    text = _zoo_texts("rnnlm")[0]
    graph = HloGraph.from_hlo_text(text)
    entry = hlo_parse.parse_module(text).entry
    step = sum(i.out_bytes for i in entry.instructions if i.opcode == "parameter")
    seen: set[int] = set()

    class Spy(AnalyticCosts):
        def kernel_time(self, kernel):
            seen.add(kernel.step_bytes)
            return super().kernel_time(kernel)

    sim = Simulator(graph, Spy(), _CLUSTERS["h100"][1])
    sim.step_time(baselines.make("xla_default", graph))
    assert graph.loops and step > 0 and seen == {step}
    assert GraphKernels(graph).step_bytes == step and GraphKernels(graph.loops[0].body).step_bytes != step


def test_simulated_time_scales_with_trip_count():
    costs, spec = _CLUSTERS["cpu"]
    times = {}
    for n in (4, 8):
        graph = HloGraph.from_hlo_text(_texts(_fori(0, n), _x())[0])
        (loop,) = graph.loops
        assert loop.trip_count == n
        sim = Simulator(graph, costs, spec)
        events = {e.name: e.end - e.start for e in sim.run(baselines.make("xla_default", graph)).timeline}
        times[n] = events[loop.node]
    assert times[8] == pytest.approx(2 * times[4], rel=1e-12)


def test_loop_priced_per_fusion_mode():
    """xla_fusion="off" runs the body unfused: more kernels per iteration than "extend"."""
    costs, spec = _CLUSTERS["cpu"]
    graph = HloGraph.from_hlo_text(_zoo_texts("rnnlm")[0])
    loop = graph.loops[0]
    body = Simulator(loop.body, costs, spec)
    assert body.serial_time("off") > body.serial_time("extend")
    with pytest.raises(ValueError, match="xla_fusion: expected 'extend' or 'off', got 'sideways'"):
        body.serial_time("sideways")

"""All-reduces moved out of ``while`` loops: which ones move (text), and that a plan over the moved
ones compiles and keeps the step's numbers (real jax steps that scan over layers and accumulate
gradients over micro-batches, written as ``jax.jit`` over shardings)."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import xla_hooks
from disco.ir import extractor, loop_collectives
from disco.ir.graph import HloGraph
from disco.ir.hlo_parse import parse_module
from disco.plans import baselines
from tests.support.equivalence import assert_close, compiled_all_reduces, three_steps

DEVICES = 4

# One carry of a loop, by how its all-reduce reaches the loop's output.
MOVABLE = ("accumulate", "write", "accumulate_through_moves", "accumulate_through_a_sum", "cross_replica",
           "accumulate_a_zero_update")
KEPT = ("nonzero_init", "read_by_condition", "read_again", "max_reduction", "read_by_its_own_body",
        "through_a_sum_from_one", "the_body_reads_its_whole_state", "an_update_of_ones")
WHOLE = "the_body_reads_its_whole_state"  # every carry of that loop stays


def _carry(k: int, kind: str) -> tuple[list[str], str, str, str]:
    """(body lines, the root's element, the init's element, the condition line or "") for carry
    ``k`` (tuple index k + 1) of kind ``kind``; the carry is f32[4] except a written one, f32[3,4]."""
    idx = k + 1
    shape = "f32[3,4]" if kind == "write" else "f32[4]"
    red = "%max" if kind == "max_reduction" else "%add"
    channel = "" if kind == "cross_replica" else f"channel_id={k + 1}, "
    lines = [f"  %c{k} = {shape} get-tuple-element(%p), index={idx}",
             f"  %x{k} = f32[4] broadcast(%fi), dimensions={{}}",
             f"  %ar{k} = f32[4] all-reduce(%x{k}), {channel}replica_groups={{{{0,1}}}}, to_apply={red}"]
    init, cond = f"%z{k}", ""
    if kind == "write":
        lines += [f"  %r{k} = f32[1,4] reshape(%ar{k})",
                  f"  %n{k} = {shape} dynamic-update-slice(%c{k}, %r{k}, %i, %zero)"]
    elif kind == "accumulate_through_moves":
        lines += [f"  %r{k} = f32[2,2] reshape(%ar{k})", f"  %t{k} = f32[2,2] transpose(%r{k}), dimensions={{1,0}}",
                  f"  %b{k} = f32[4] reshape(%t{k})", f"  %n{k} = f32[4] add(%c{k}, %b{k})"]
    elif kind in ("accumulate_through_a_sum", "through_a_sum_from_one"):
        start = "%zf" if kind == "accumulate_through_a_sum" else "%of"
        lines += [f"  %r{k} = f32[2,4] broadcast(%ar{k}), dimensions={{1}}",
                  f"  %s{k} = f32[4] reduce(%r{k}, {start}), dimensions={{0}}, to_apply=%add",
                  f"  %n{k} = f32[4] add(%c{k}, %s{k})"]
    elif kind in ("accumulate_a_zero_update", "an_update_of_ones"):  # the gradient of params[i]
        base = "%zb" if kind == "accumulate_a_zero_update" else "%ob"
        lines += [f"  %r{k} = f32[1,4] reshape(%ar{k})", f"  %u{k} = f32[3,4] dynamic-update-slice({base}, %r{k}, %i, %zero)",
                  f"  %s{k} = f32[1,4] slice(%u{k}), slice={{[0:1], [0:4]}}", f"  %t{k} = f32[4] reshape(%s{k})",
                  f"  %n{k} = f32[4] add(%c{k}, %t{k})"]
    elif kind == "read_again":  # the carry is also read by something else in the body
        lines += [f"  %n{k} = f32[4] add(%c{k}, %ar{k})", f"  %again{k} = f32[4] multiply(%c{k}, %c{k})"]
    elif kind == "read_by_its_own_body":  # the reduced value feeds the body's other work too
        lines += [f"  %n{k} = f32[4] add(%c{k}, %ar{k})", f"  %again{k} = f32[4] negate(%ar{k})"]
    else:
        lines += [f"  %n{k} = f32[4] add(%c{k}, %ar{k})"]
    if kind == "nonzero_init":
        init = f"%one{k}"
    if kind == "read_by_condition":
        cond = f"  %cc{k} = f32[4] get-tuple-element(%q), index={idx}"
    return lines, f"%n{k}", init, cond


def _module(kinds: tuple[str, ...]) -> str:
    shapes = ["s32[]"] + ["f32[3,4]" if k == "write" else "f32[4]" for k in kinds]
    tup = "(" + ", ".join(shapes) + ")"
    body, roots, inits, conds = [], [], [], []
    for k, kind in enumerate(kinds):
        b, r, i, c = _carry(k, kind)
        body += b
        roots.append(r)
        inits.append(i)
        conds += [c] if c else []
    if WHOLE in kinds:  # the body reads its whole state: any carry may be read
        body.append(f"  %state = {tup} copy(%p)")
    entry = []
    for k, kind in enumerate(kinds):
        shape = shapes[k + 1]
        entry += [f"  %z{k} = {shape} broadcast(%zc), dimensions={{}}", f"  %one{k} = {shape} broadcast(%oc), dimensions={{}}"]
    gtes = [f"  %g{k} = {shapes[k + 1]} get-tuple-element(%w), index={k + 1}" for k in range(len(kinds))]
    out_shape = "(" + ", ".join(shapes[1:]) + ")"
    return "\n".join([
        "HloModule m", "",
        "%add (a: f32[], b: f32[]) -> f32[] {", "  %a = f32[] parameter(0)", "  %b = f32[] parameter(1)",
        "  ROOT %s = f32[] add(%a, %b)", "}", "",
        "%max (a.1: f32[], b.1: f32[]) -> f32[] {", "  %a.1 = f32[] parameter(0)", "  %b.1 = f32[] parameter(1)",
        "  ROOT %s.1 = f32[] maximum(%a.1, %b.1)", "}", "",
        f"%body (p: {tup}) -> {tup} {{", f"  %p = {tup} parameter(0)", "  %i = s32[] get-tuple-element(%p), index=0",
        "  %fi = f32[] convert(%i)", "  %zero = s32[] constant(0)", "  %zf = f32[] constant(0)",
        "  %of = f32[] constant(1)", "  %zb = f32[3,4] broadcast(%zf), dimensions={}",
        "  %ob = f32[3,4] broadcast(%of), dimensions={}", "  %inc = s32[] constant(1)",
        "  %next = s32[] add(%i, %inc)", *body,
        f"  ROOT %out = {tup} tuple(%next, {', '.join(roots)})", "}", "",
        f"%cond (q: {tup}) -> pred[] {{", f"  %q = {tup} parameter(0)", "  %qi = s32[] get-tuple-element(%q), index=0",
        *conds, "  %three = s32[] constant(3)", "  ROOT %lt = pred[] compare(%qi, %three), direction=LT", "}", "",
        "ENTRY %main () -> " + out_shape + " {", "  %zc = f32[] constant(0)", "  %oc = f32[] constant(1)",
        "  %start = s32[] constant(0)", *entry, f"  %init = {tup} tuple(%start, {', '.join(inits)})",
        f"  %w = {tup} while(%init), condition=%cond, body=%body", *gtes,
        f"  ROOT %res = {out_shape} tuple({', '.join(f'%g{k}' for k in range(len(kinds)))})", "}", ""])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(MOVABLE + KEPT), min_size=1, max_size=5).map(tuple))
def test_exactly_the_covered_all_reduces_move_and_the_module_stays_whole(kinds):
    text = _module(kinds)
    hoisted = loop_collectives.hoist(text)
    moved = {m.all_reduce for m in hoisted.moved}
    movable = set() if WHOLE in kinds else {k for k, kind in enumerate(kinds) if kind in MOVABLE}
    assert moved == {f"ar{k}" for k in movable}
    module = parse_module(hoisted.text)  # parses: every name it reads is defined
    body, entry = module.computation("body"), module.entry
    assert {i.name for i in body.instructions if i.opcode == "all-reduce"} == \
        {f"ar{k}" for k in range(len(kinds)) if k not in movable}
    after = {i.name: i for i in entry.instructions if i.opcode == "all-reduce"}
    assert set(after) == {f"g{k}" for k in movable}
    for k, kind in enumerate(kinds):
        if k in movable:  # the loop's output is read through the new all-reduce, its users unchanged
            assert after[f"g{k}"].operands == (f"g{k}{loop_collectives.SUFFIX}",)
            assert "replica_groups={{0,1}}" in hoisted.text.split(f"%g{k} = ")[1].split("\n")[0]
            assert ("channel_id" in after[f"g{k}"].attrs) == (kind != "cross_replica")
            assert {m.all_reduce: m for m in hoisted.moved}[f"ar{k}"].carries == ((k + 1, kind != "write"),)
    channels = [int(c) for c in re.findall(r"channel_id=(\d+)", hoisted.text)]
    assert len(channels) == len(set(channels))  # the new all-reduces take new channel ids
    assert entry.root.operands == tuple(f"g{k}" for k in range(len(kinds)))
    assert loop_collectives.hoist(hoisted.text).moved == ()  # nothing more to move
    if not moved:
        assert hoisted.text == text


def test_a_loop_whose_output_is_read_whole_is_left_alone():
    text = _module(("accumulate",))
    text = text.replace("  ROOT %res", "  %whole = (s32[], f32[4]) copy(%w)\n  ROOT %res")
    assert "%whole" in text and loop_collectives.hoist(text).moved == ()


def _mesh():
    return jax.make_mesh((DEVICES,), ("dp",), devices=jax.devices()[:DEVICES], axis_types=(jax.sharding.AxisType.Auto,))


@functools.cache
def looped_step(kind: str):
    """A GSPMD step with a loop: ``scan`` applies 3 stacked layers (their gradients written slice by
    slice), or ``accumulate`` sums the gradients of 4 micro-batches in a fori_loop."""
    mesh, tx = _mesh(), optax.sgd(0.1)
    keys = jax.random.split(jax.random.key(0), 3)
    params = {"w": jax.random.normal(keys[0], (3, 16, 16)) * 0.3, "b": jnp.zeros((3, 16)),
              "out": jax.random.normal(keys[1], (16, 4)) * 0.3}
    x = jax.random.normal(keys[2], (32, 16))
    y = jnp.tanh(x[:, :4])

    def loss(p, xb, yb):
        def layer(h, wb):
            return jnp.tanh(h @ wb[0] + wb[1]), None

        h, _ = jax.lax.scan(layer, xb, (p["w"], p["b"]))
        return jnp.mean((h @ p["out"] - yb) ** 2)

    def grads(p, xb, yb):
        if kind == "scan":
            return jax.grad(loss)(p, xb, yb)
        # micro-batch i is rows 4j + i: each micro-batch stays split over the devices as the batch is
        micro = tuple(jax.lax.with_sharding_constraint(a.reshape(-1, 4, a.shape[1]).swapaxes(0, 1),
                                                       NamedSharding(mesh, P(None, "dp"))) for a in (xb, yb))

        def body(i, acc):
            g = jax.grad(loss)(p, micro[0][i], micro[1][i])
            return jax.tree.map(jnp.add, acc, g)

        return jax.lax.fori_loop(0, 4, body, jax.tree.map(jnp.zeros_like, p))

    @jax.jit
    def step(state, batch):
        p, opt = state
        g = grads(p, *batch)
        updates, opt = tx.update(g, opt, p)
        return (optax.apply_updates(p, updates), opt), jnp.float32(0)

    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
    state = jax.device_put((params, tx.init(params)), replicated)
    batch = (jax.device_put(x, split), jax.device_put(y, split))
    return step, (state, batch)


def _in_loop_all_reduces(text: str) -> int:
    module = parse_module(text)
    bodies = {i.attrs["body"].lstrip("%") for c in module.computations for i in c.instructions if i.opcode == "while"}
    return sum(i.opcode == "all-reduce" for c in module.computations if c.name in bodies for i in c.instructions)


@pytest.mark.parametrize("kind", ["scan", "accumulate"])
def test_a_looped_steps_all_reduces_leave_the_loop_and_a_bucket_plan_keeps_the_numbers(kind):
    step, args = looped_step(kind)
    lowered = extractor.lower(step, *args)
    plain = lowered.as_text(dialect="hlo")
    text = extractor.plan_text(lowered, debug_info=False)
    assert _in_loop_all_reduces(text) == 0
    graph = HloGraph.from_hlo_text(extractor.plan_text(lowered, debug_info=True))
    # every parameter's gradient is now an all-reduce a bucket can take: the loop's and the head's
    assert len(graph.all_reduces()) >= 3 and "all-reduce" not in plain
    # the scan computes all but the head's gradient; the micro-batch loop computes all three
    assert graph.summary()["all_reduces_after_loops"] == len(graph.all_reduces()) - (kind == "scan")
    plan = baselines.make("one_bucket", graph)
    applied = xla_hooks.apply(plan, step, *args)
    assert applied.applied, applied.fallback_reason
    assert compiled_all_reduces(applied) == 1
    assert _in_loop_all_reduces(applied.compiled_text()) == 0
    reference = three_steps(step, args)
    assert_close(three_steps(applied, args), reference)
    # XLA:CPU's own compile reduces inside the loop: what the plan changed
    assert _in_loop_all_reduces(lowered.compile().as_text()) > 0


def _random_step(layers: int, micro: int, width: int, bias: bool):
    """A GSPMD step: ``layers`` stacked tanh layers in a ``scan``, gradients summed over ``micro``
    micro-batches in a fori_loop (none for 1), sgd."""
    mesh, tx = _mesh(), optax.sgd(0.05)
    keys = jax.random.split(jax.random.key(layers * 100 + micro * 10 + width), 3)
    params = {"w": jax.random.normal(keys[0], (layers, width, width)) / width ** 0.5,
              "out": jax.random.normal(keys[1], (width, 2)) / width ** 0.5}
    if bias:
        params["b"] = jnp.full((layers, width), 0.1)
    x = jax.random.normal(keys[2], (8 * micro * DEVICES // 2, width))
    y = jnp.tanh(x[:, :2])

    def loss(p, xb, yb):
        def layer(h, i):
            h = h @ p["w"][i] + (p["b"][i] if bias else 0.0)
            return jnp.tanh(h), None

        h, _ = jax.lax.scan(layer, xb, jnp.arange(layers))
        return jnp.mean((h @ p["out"] - yb) ** 2)

    def grads(p, xb, yb):
        if micro == 1:
            return jax.grad(loss)(p, xb, yb)
        parts = tuple(jax.lax.with_sharding_constraint(a.reshape(-1, micro, a.shape[1]).swapaxes(0, 1),
                                                       NamedSharding(mesh, P(None, "dp"))) for a in (xb, yb))
        return jax.lax.fori_loop(0, micro, lambda i, acc: jax.tree.map(
            jnp.add, acc, jax.grad(loss)(p, parts[0][i], parts[1][i])), jax.tree.map(jnp.zeros_like, p))

    @jax.jit
    def step(state, batch):
        p, opt = state
        updates, opt = tx.update(grads(p, *batch), opt, p)
        return (optax.apply_updates(p, updates), opt), jnp.float32(0)

    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
    return step, (jax.device_put((params, tx.init(params)), replicated),
                  (jax.device_put(x, split), jax.device_put(y, split)))


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([8, 16]), st.booleans(), st.sampled_from(["one_bucket", "per_tensor", "ddp"]))
def test_random_looped_steps_keep_their_numbers_under_a_bucket_plan(layers, micro, width, bias, baseline):
    step, args = _random_step(layers, micro, width, bias)
    lowered = extractor.lower(step, *args)
    text = extractor.plan_text(lowered, debug_info=False)
    assert _in_loop_all_reduces(text) == 0
    plan = baselines.make(baseline, HloGraph.from_hlo_text(text))
    applied = xla_hooks.apply(plan, step, *args)
    assert applied.applied, applied.fallback_reason
    assert compiled_all_reduces(applied) == len(plan.buckets)
    assert_close(three_steps(applied, args), three_steps(step, args))


@pytest.mark.gpu_compile
def test_the_moved_all_reduces_reach_xla_gpu_as_one_bucket_after_the_loop(tmp_path, monkeypatch):
    """Deviceless XLA:GPU for 4 H100s (``make test-gpu-compile``): the scanned step's plan keeps its one
    bucket after the loop, as XLA:GPU's own compile moves the all-reduces out of the loop too. The
    partitioned program holds copies, which the GPU plugin takes only written as reshapes
    (``xla_hooks.rewrite.copies_as_reshapes``; before, this compile failed on ``mhlo.copy``)."""
    from xla_hooks import deviceless
    from xla_hooks.compile_for import compile_for, plan_text_for

    if not deviceless.available():
        pytest.skip(f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")
    monkeypatch.setenv(deviceless.CACHE_ENV, str(tmp_path))
    step, args = looped_step("scan")
    lowered = extractor.lower(step, *args)
    text = extractor.plan_text(lowered, debug_info=False)
    assert " copy(" in text
    plan = baselines.make("one_bucket", HloGraph.from_hlo_text(text))
    planned = plan_text_for(text, plan, device="h100", devices=DEVICES)
    default = compile_for(lowered.as_text(dialect="hlo"), device="h100", devices=DEVICES)

    def all_reduces(module: str) -> tuple[int, int]:  # (in loop bodies, everywhere)
        starts = module.count(" all-reduce-start(") or module.count(" all-reduce(")
        return _in_loop_all_reduces(module.replace(" all-reduce-start(", " all-reduce(")), starts

    assert all_reduces(planned) == (0, 1)
    assert all_reduces(default)[0] == 0  # XLA:GPU (jax 0.11.2) moves them itself; XLA:CPU does not (above)

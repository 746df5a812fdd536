"""Gather anchors (``FusionPlan.gather_after``) applied to the real compile: a sharded (FSDP) zoo step's
parameter all-gathers held back behind their anchors by an optimization barrier, scheduled after them,
the numbers unchanged, the memory measured."""

from __future__ import annotations

import functools
import re

import jax
import pytest

from disco.ir import hlo_parse
from disco.plans import baselines
from disco.plans.plan import FusionPlan
from disco.sim import module_memory
from disco.sim.memory import peak_memory
from tests.support.equivalence import apply_strictly, assert_close, three_steps
from tests.xla_hooks.test_gather_buckets import setup

# XLA:CPU's buffer assignment gives each barrier's tuple (and the barrier's own) a table of pointers:
# measured 64 bytes more temporaries per anchor on mlp tiny (jax 0.10.2), the live buffers unchanged.
TUPLE_TABLES = 64


@functools.cache
def compiled(name, distance):
    step, args, graph, reference = setup(name, None)
    plan = baselines.make("prefetch", graph, distance=distance) if distance else FusionPlan()
    applied = apply_strictly(plan, step, args) if distance else jax.jit(step).lower(*args).compile()
    return plan, applied


def schedule(text):
    """(position of each entry instruction in the compiled schedule, the entry's instructions)."""
    entry = hlo_parse.parse_module(text).entry
    return {ins.name: i for i, ins in enumerate(entry.instructions)}, entry.instructions


def anchored(text):
    """Per barrier a plan added: (its gather's name in the plan, positions of: the anchors' producers,
    the barrier, the all-gathers that read it)."""
    pos, instructions = schedule(text)
    by_name = {ins.name: ins for ins in instructions}
    users: dict[str, list[str]] = {}
    for ins in instructions:
        for o in ins.operands:
            users.setdefault(o, []).append(ins.name)
    out = []
    for ins in instructions:
        meta = ins.attrs.get("metadata", "")
        if ins.opcode != "opt-barrier" or "disco.after." not in meta:
            continue
        gather = meta.split("disco.after.")[1].split(".barrier")[0]
        elements = by_name[ins.operands[0]].operands
        gathers = [u2 for u in users.get(ins.name, []) for u2 in users.get(u, [])
                   if by_name[u2].opcode == "all-gather"]
        out.append((gather, [pos[e] for e in elements[1:]], pos[ins.name], [pos[g] for g in gathers]))
    return out


def test_a_prefetch_plan_schedules_each_gather_after_its_anchor_and_keeps_the_numbers():
    step, args, graph, reference = setup("mlp", None)
    plan, applied = compiled("mlp", 1)
    assert len(plan.gather_after) == 15  # Dense_1 .. Dense_8: 8 kernels and 7 biases
    seen = anchored(applied.compiled_text())
    # every anchor (a dot: XLA keeps its value) survived as the barrier's second element, and the
    # all-gather comes after the anchor in the compiled schedule
    assert sorted(g for g, *_ in seen) == sorted(g for g, _ in plan.gather_after)
    for gather, anchors, barrier, gathers in seen:
        assert len(anchors) == 1 and len(gathers) == 1, gather
        assert anchors[0] < barrier < gathers[0], gather
    # XLA's default schedules every all-gather before the first kernel; the plan spreads them out
    def gathers_after_the_first_kernel(text):
        pos, instructions = schedule(text)
        first = min(pos[i.name] for i in instructions if i.opcode in ("fusion", "custom-call", "dot"))
        return sum(pos[i.name] > first for i in instructions if i.opcode == "all-gather")

    _, default = compiled("mlp", 0)
    assert gathers_after_the_first_kernel(default.as_text()) == 0
    assert gathers_after_the_first_kernel(applied.compiled_text()) >= 8  # the anchored kernels' at least
    assert_close(three_steps(applied, args), reference)


def test_a_prefetch_plans_memory_is_the_defaults_but_for_its_barriers_tuple_tables():
    """mlp keeps every gathered kernel for the backward pass, so no gathered buffer dies earlier: the live
    buffers (the module's estimate) are the default's, and XLA's temporaries grow by the barriers' tuple
    tables only (measured on CPU, jax 0.10.2; transformer_lm's re-gathers do die earlier: slow tier)."""
    _, default = compiled("mlp", 0)
    for d in baselines.PREFETCH_DISTANCES:
        plan, applied = compiled("mlp", d)
        base, mine = peak_memory(default), peak_memory(applied)
        assert module_memory.estimate(applied.compiled_text()).temporaries <= module_memory.estimate(
            default.as_text()).temporaries
        assert base.peak <= mine.peak <= base.peak + TUPLE_TABLES * len(plan.gather_after), (d, base, mine)
    # the memory limit holds a prefetch plan to its compiled peak as any plan: over it, it is not applied
    import xla_hooks

    step, args, _, _ = setup("mlp", None)
    plan, applied = compiled("mlp", 1)
    limit = peak_memory(default).peak
    with pytest.raises(ValueError, match=rf"plan 'prefetch_1': peak device memory .* over the limit of {limit:,} bytes"):
        xla_hooks.apply(plan, step, *args, strict=True, memory_limit=limit)


@pytest.mark.slow
@pytest.mark.parametrize("distance", baselines.PREFETCH_DISTANCES)
def test_on_transformer_lm_a_prefetch_plan_lowers_the_peak_and_keeps_the_numbers(distance):
    """transformer_lm gathers its layer norms' scales again for the backward pass; XLA's default issues
    those at the step's start, the plan in the backward pass: the compiled peak is lower (measured on
    CPU, jax 0.10.2, 2026-12-02: 277,796 bytes by default, 276,324 with prefetch_1, 275,556 with
    prefetch_2)."""
    step, args, graph, reference = setup("transformer_lm", None)
    _, default = compiled("transformer_lm", 0)
    plan, applied = compiled("transformer_lm", distance)
    assert peak_memory(applied).peak < peak_memory(default).peak
    seen = anchored(applied.compiled_text())
    assert all(a[0] < barrier < g[0] for _, a, barrier, g in seen if a and g)
    assert_close(three_steps(applied, args), reference)


@pytest.mark.gpu_compile
def test_a_prefetch_plan_compiles_for_an_h100_and_keeps_the_layers_gathers_apart():
    """Deviceless XLA:GPU (``.venv-gpu``, jax 0.11.2, the H100 target): the barrier passes the plugin's
    StableHLO path. XLA:GPU's all-gather combiner merges all 17 of mlp's all-gathers into one by default;
    with ``prefetch_1`` each layer's gathers wait for another anchor, so it merges only within a layer
    (measured 2026-12-02: 9 all-gathers, one per layer; the compiled module keeps no barrier)."""
    from disco.ir.extractor import plan_text
    from disco.ir.graph import HloGraph
    from xla_hooks import compile_for, deviceless

    if not deviceless.available():
        pytest.skip(f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")
    step, args, _, _ = setup("mlp", None)
    text = plan_text(jax.jit(step).lower(*args), debug_info=False)
    graph = HloGraph.from_hlo_text(text)
    plan = baselines.make("prefetch", graph, distance=1).validate(graph, "gpu")
    counts = {}
    for p in (FusionPlan(), plan):
        module = compile_for.plan_module_for(text, p, device="h100", devices=8).text
        counts[bool(p.gather_after)] = len(re.findall(r"\sall-gather(?:-start)?\(", module))
    assert counts == {False: 1, True: 9}


@pytest.mark.slow
def test_anchored_gather_buckets_apply_as_one_all_gather_per_layer_after_its_anchor():
    """FSDP2's shape (``per_layer_gathers+prefetch_1``, a search start): each layer's bucket reads its
    members' shards through their barriers, one all-gather per layer, after the anchor; the numbers kept."""
    step, args, graph, reference = setup("mlp", None)
    per_layer = baselines.make("per_layer_gathers", graph)
    plan = baselines.make("prefetch", graph, distance=1).replace(gather_buckets=per_layer.gather_buckets)
    applied = apply_strictly(plan.validate(graph), step, args)
    text = applied.compiled_text()
    assert len(re.findall(r"\sall-gather\(", text)) == len(per_layer.gather_buckets)
    pos, instructions = schedule(text)
    by_name = {i.name: i for i in instructions}
    for ins in instructions:
        if ins.opcode == "opt-barrier" and "disco.after." in ins.attrs.get("metadata", ""):
            assert len(by_name[ins.operands[0]].operands) == 2  # the shard and the anchor's value
            assert pos[by_name[ins.operands[0]].operands[1]] < pos[ins.name]
    assert_close(three_steps(applied, args), reference)

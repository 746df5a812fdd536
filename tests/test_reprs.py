"""Every public object's repr is one short line (issues 39 and 42: ``repr(PlannedStep.applied)``
printed about 100 kB, every signature's whole HLO text; an HloGraph's, every node)."""

from __future__ import annotations

import dataclasses
import types
import warnings

import pytest

import trax_models
import xla_hooks
from disco import optimizer as opt
from disco.bench import PlanResult
from disco.ir import extractor
from disco.ir.graph import HloGraph, Loop, Node
from disco.plans import baselines
from disco.plans.plan import Bucket, FusionPlan
from disco import search
from disco.search import greedy_fusion
from disco.sim.costs import device_costs
from disco.sim.cluster import preset
from disco.sim.simulator import Simulator
from tests.support.optimize_results import built_result, contradicting_result
from xla_hooks.measure import Measurement
from xla_hooks.profiling import KernelTime, OpProfile

LIMIT = 200
LONG = "x" * 300  # a name longer than any repr may be


@pytest.fixture(scope="module")
def real():
    """mlp tiny on 2 devices: its graph, a plan applied, a planned step called once, a profile."""
    step, args = trax_models.make_train_step("mlp", "tiny", devices=2)
    graph = HloGraph.from_hlo_text(extractor.hlo_text(step, *args))
    plan = baselines.make("horovod", graph).replace(graph_fingerprint=graph.fingerprint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xla_hooks.PlanFallbackWarning)
        applied = xla_hooks.apply(plan, step, *args)
        fell = xla_hooks.apply(plan.replace(graph_fingerprint="f" * 32), step, *args)
        planned = xla_hooks.jit(step, cluster="local", options={"strategy": "baselines"})
        planned(*args)
    profiled = xla_hooks.profile(applied, args, steps=1, rounds=1)
    sim = Simulator(graph, device_costs.analytic("cpu"), preset("local", devices=2))
    return types.SimpleNamespace(step=step, args=args, graph=graph, plan=plan, applied=applied, fell=fell,
                                 planned=planned, profiled=profiled, sim=sim)


def _rows():
    return built_result().rows


OBJECTS = {
    "HloGraph": lambda r: r.graph,
    "Node (longest name)": lambda r: max(r.graph.nodes, key=lambda n: len(repr(n))),
    "Node (an all-reduce)": lambda r: r.graph.all_reduces()[0],
    "Node (long fields)": lambda r: Node(LONG, "concatenate", "c", "(" + ", ".join(["f32[8]"] * 100) + ")", "f32",
                                         800, 200, 0.0, operands=(LONG,) * 100, param_path=LONG),
    "GraphArrays": lambda r: r.graph.to_arrays(),
    "Loop": lambda r: Loop(LONG, 10, r.graph, r.graph),
    "FusionPlan (a baseline)": lambda r: r.plan,
    "FusionPlan (many groups)": lambda r: greedy_fusion(r.graph).replace(
        name=LONG, compile_options=(("xla_cpu_use_thunk_runtime", "true"),), cuts=(("a", "b"),), xla_fusion="off"),
    "Bucket": lambda r: r.plan.buckets[0],
    "Bucket (long names)": lambda r: Bucket((LONG,) * 50, "tuple"),
    "SimResult": lambda r: r.sim.run(greedy_fusion(r.graph)),
    "SearchResult": lambda r: dataclasses.replace(
        search.run(search.make("best_first"), r.graph, r.sim.step_time, max_evals=30),
        best_plan=r.plan.replace(name=LONG), strategy=LONG[:40]),
    "ClusterSpec (local)": lambda r: preset("local", devices=2),
    "ClusterSpec (h100)": lambda r: dataclasses.replace(preset("h100-sxm-8"), name=LONG, label=LONG, description=LONG,
                                                        compute_speed=1.5, operand_latency=1e-6),
    "OptimizeResult": lambda r: built_result(),
    "OptimizeResult (run-off)": lambda r: contradicting_result(),
    "OptimizeConfig": lambda r: opt.OptimizeConfig(budget_s=3, measure_top_k=2, rounds=2, steps=1,
                                                   bucket_sweep=tuple(range(1, 100)), confirm=False),
    "Setting": lambda r: built_result().setting._replace(graph={"name": LONG, "nodes": 1}, cluster=LONG),
    "SearchSummary": lambda r: opt.SearchSummary("best_first", 10_000, 5000.0, 2.0,
                                                 tuple((i, i / 10, 1e-3) for i in range(1000))),
    "Candidates": lambda r: opt.Candidates(_rows(), built_result().search),
    "Measured": lambda r: opt.Measured(_rows(), "ddp", "x" * 1000, built_result().bound, {"ddp": r.step}),
    "RunOff": lambda r: contradicting_result().runoff,
    "Confirmation": lambda r: built_result().confirmation,
    "Bound": lambda r: built_result().bound,
    "Span": lambda r: opt.Span(1 / 3, 1 / 7, 1 / 9),
    "PlanRow": lambda r: _rows()[1],
    "Target": lambda r: opt.Target(r.step, r.args, r.graph, None),
    "AppliedStep": lambda r: r.applied,
    "AppliedStep (fell back)": lambda r: r.fell,
    "PlannedStep": lambda r: r.planned,
    "PlannedStep.applied": lambda r: r.planned.applied,
    "PlannedStep.reports": lambda r: r.planned.reports,
    "ProfileResult": lambda r: r.profiled,
    "OpProfile": lambda r: max(r.profiled.ops, key=lambda o: len(o.nodes)),
    "OpProfile (long fields)": lambda r: OpProfile(LONG, "fusion", 1e-3, 1.0, op_name=LONG, group=3, nodes=(LONG,) * 9),
    "KernelTime": lambda r: KernelTime(LONG, LONG, LONG, 1234.5, 2.0),
    "Measurement": lambda r: Measurement(tuple(i / 1e4 for i in range(1, 28))),
    "PlanResult": lambda r: PlanResult(LONG, r.plan, False, LONG, 1.25, 10, 1,
                                       Measurement(tuple(i / 1e4 for i in range(1, 28))), step=r.step),
    "ProcessRunner": lambda r: opt.ProcessRunner(LONG, LONG, 2, 4),
    "InProcessRunner": lambda r: opt.InProcessRunner(),
    "Trial": lambda r: opt.Trial(Measurement(tuple(i / 1e4 for i in range(1, 28))), False, LONG, record={"x": LONG}),
    "Trials": lambda r: opt.Trials({LONG: opt.Trial(Measurement((1.0,)), True)}, None, {}, {"x": LONG}),
}


@pytest.mark.parametrize("name", list(OBJECTS))
def test_the_repr_is_one_short_line(real, name):
    obj = OBJECTS[name](real)
    text = repr(obj)
    assert "\n" not in text and len(text) <= LIMIT, f"{name}: {len(text)} characters: {text[:400]}"
    assert str(obj) == text or not dataclasses.is_dataclass(obj)


def test_the_reprs_name_what_matters(real):
    g = real.graph
    assert repr(g) == (f"HloGraph({g.name!r}, {len(g.nodes)} nodes, {len(g.edges)} edges, "
                       f"{len(g.all_reduces())} all-reduces, fingerprint {g.fingerprint[:8]})")
    k = len(real.plan.buckets)
    assert repr(real.plan) == (f"FusionPlan('horovod', 0 groups, {k} bucket{'' if k == 1 else 's'}, 0 cuts, "
                               f"for graph {g.fingerprint[:8]})")
    assert repr(real.applied) == f"AppliedStep(plan 'horovod', applied, hlo {len(real.applied.hlo):,} chars)"
    assert repr(real.fell).startswith("AppliedStep(plan 'xla_default', requested 'horovod', fell back: \"ValueError: plan ")
    assert repr(real.planned.applied).startswith("{1 signature: AppliedStep(plan ")
    assert repr(preset("local", devices=2)) == "ClusterSpec('local', 1 x 2 cpu, link 5 GB/s 20 us, overlap=False)"
    assert repr(opt.OptimizeConfig(rounds=2)) == "OptimizeConfig(rounds=2)"


def test_reprs_change_no_equality_hash_or_serialisation(real):
    plan = real.plan
    assert FusionPlan.from_json(plan.to_json()) == plan and hash(FusionPlan.from_json(plan.to_json())) == hash(plan)
    assert HloGraph.from_dict(real.graph.to_dict()) == real.graph
    spec = preset("local", devices=2)
    assert dataclasses.replace(spec, label="other") == spec  # the label is still not compared
    assert real.planned.applied == dict(real.planned.applied) and isinstance(real.planned.applied, dict)


@pytest.mark.fast
def test_the_service_identity_still_hashes_every_field_of_a_node():
    """Plan keys were made of ``repr(node)``, the dataclass's generated text; the node's repr is
    short now, and the identity is made of the same text as before (stored plans keep their keys)."""
    from service.programs import node_text

    n = Node(name="add.1", opcode="add", computation="main", shape="f32[8]", dtype="f32", out_bytes=32,
             out_elements=8, flops=8.0, operands=("a", "b"), replica_groups="{{0,1}}")
    assert node_text(n) == (
        "Node(name='add.1', opcode='add', computation='main', shape='f32[8]', dtype='f32', out_bytes=32, "
        "out_elements=8, flops=8.0, operands=('a', 'b'), grad_bytes=0, param_path=None, "
        "replica_groups='{{0,1}}', reduction=None, layout='')")

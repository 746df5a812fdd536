"""The simulator prices a plan's gather anchors: an anchored all-gather starts only once its anchor's
kernel has ended."""

from __future__ import annotations

import pytest

from disco.plans import baselines
from disco.plans.plan import FusionPlan, make_plan
from disco.sim.costs import AnalyticCosts
from disco.sim.delta import DeltaSimulator
from disco.sim.simulator import Simulator
from tests.disco.sim.test_gather_buckets import CLUSTER, fsdp_mlp, graph_of


def chain():
    """Two layers: g1 gathers p1 for the dot d1 (of x), g2 gathers p2 for the dot d2 (of d1)."""
    return graph_of([("p1", "parameter", (), 64), ("p2", "parameter", (), 256), ("x", "parameter", (), 1024),
                     ("g1", "all-gather", ("p1",), 1024), ("d1", "dot", ("x", "g1"), 1024),
                     ("g2", "all-gather", ("p2",), 4096), ("d2", "dot", ("d1", "g2"), 1024),
                     ("out", "tuple", ("d2",), 0)])


@pytest.mark.fast
def test_an_anchored_gather_starts_when_its_anchor_ends():
    g = chain()
    sim = Simulator(g, AnalyticCosts(), CLUSTER)
    free, held = sim.run(FusionPlan()), sim.run(make_plan(gather_after=[["g2", "d1"]]))
    at = {e.name: e for e in free.timeline}
    assert at["g2"].start == at["g1"].end  # by default both gather at the step's start, one after the other
    at = {e.name: e for e in held.timeline}
    assert at["g2"].start == at["d1"].end and at["d2"].start == at["g2"].end
    assert held.step_time > free.step_time  # nothing hides g2 now: the dot waits for it
    assert held.comm_time == free.comm_time and held.compute_time == free.compute_time
    assert sim.lower_bound() <= held.step_time
    # the same in the topological order, and in the delta simulator from either plan
    assert sim.run(make_plan(gather_after=[["g2", "d1"]]), order="topological").step_time == held.step_time
    delta = DeltaSimulator(sim)
    assert delta.step_time(FusionPlan()) == free.step_time
    plan = make_plan(gather_after=[["g2", "d1"]])
    assert delta.step_time(plan, parent=FusionPlan()) == held.step_time
    assert delta.step_time(FusionPlan(name="again"), parent=plan) == free.step_time


@pytest.mark.fast
def test_an_anchor_that_waits_on_its_own_bucket_is_a_cycle():
    sim = Simulator(chain(), AnalyticCosts(), CLUSTER)
    with pytest.raises(ValueError, match="cycle"):
        sim.step_time(make_plan(gather_buckets=[["g1", "g2"]], gather_after=[["g2", "d1"]]))
    with pytest.raises(ValueError, match=r"gather anchor 0: instruction 'nope' is not in the graph"):
        sim.step_time(make_plan(gather_after=[["g2", "nope"]]))


def test_on_an_fsdp_step_each_anchored_gather_waits_for_its_anchor():
    g = fsdp_mlp()
    sim = Simulator(g, AnalyticCosts(), CLUSTER)
    for d in baselines.PREFETCH_DISTANCES:
        plan = baselines.make("prefetch", g, distance=d)
        at = {}
        for e in sim.run(plan).timeline:
            for m in e.members:
                at[m] = e
        for gather, anchor in plan.gather_after:
            assert at[gather].start >= at[anchor].end, (gather, anchor)
        free = {m: e for e in sim.run(FusionPlan()).timeline for m in e.members}
        late = [gather for gather, anchor in plan.gather_after if free[gather].start < at[anchor].end]
        assert late  # some gathers XLA's default starts earlier start later here

"""The first step of ``optimize``: the step's graph and the simulator that prices its plans."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from disco.ir.arguments import devices_of
from disco.ir.extractor import hlo_text
from disco.ir.graph import HloGraph
from disco.ir.replica_groups import replica_group_size
from disco.ir.step_checks import check_data_parallel
from disco.optimizer._config import Progress, no_progress
from disco.sim.cluster import ClusterSpec, preset, require_cluster
from disco.sim.costs import device_costs
from disco.sim.costs import CostModel, require_cost_model
from disco.sim.simulator import Simulator


@dataclasses.dataclass(frozen=True)
class Target:
    """What is optimised: the step, its example arguments, its graph and the simulator pricing it, and
    the pre-optimisation HLO text the graph was read from (None where a target was built from a graph
    alone): the text plans are written into for a compile (``predict``'s compiled tier)."""

    step_fn: Callable[..., Any]
    args: tuple[Any, ...] = dataclasses.field(repr=False)
    graph: HloGraph = dataclasses.field(repr=False)
    simulator: Simulator = dataclasses.field(repr=False)
    text: str | None = dataclasses.field(default=None, repr=False)
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def cluster(self) -> ClusterSpec:
        return self.simulator.cluster

    @property
    def costs(self) -> CostModel:
        return self.simulator.costs


def prepare(step_fn: Callable[..., Any], args: tuple[Any, ...], *, cluster: ClusterSpec | None = None,
            costs: CostModel | None = None, progress: Progress = no_progress,
            kwargs: Mapping[str, Any] | None = None) -> Target:
    """Extracts the step's graph and sets up its simulator.

    Args:
      step_fn: the training step (plain or jitted).
      args: its example arguments (real arrays: the plans are measured).
      kwargs: its example keyword arguments, if it is called with some.
      cluster: the cluster the simulator prices collectives with (default:
        ``preset("local", devices=<devices args are sharded over>)``, or over the devices the
        all-reduces' replica groups span when more: a pmap step's host arrays are on none).
      costs: the cost model (default: the analytic model of the cluster's device kind,
        :func:`disco.sim.costs.device_costs.analytic`).
      progress: reports phase "extract".

    Raises:
      TypeError: for a ``cluster`` or ``costs`` of the wrong type (before extracting).
      ValueError: for a step disco cannot plan (no all-reduce in its pre-optimisation HLO, or a
        gradient reduced twice; :func:`disco.ir.step_checks.check_data_parallel`), or a GSPMD step
        whose partitioned program it cannot read (:class:`~disco.ir.gspmd.GspmdError`, saying why).

    Warns:
      NoGradientWarning: when no all-reduce is in a ``disco_grad[...]`` scope.
    """
    require_cluster(cluster, or_none=True)
    require_cost_model(costs, or_none=True)
    progress("extract", 0.0, "extracting the HLO graph")
    kwargs = dict(kwargs or {})
    text = hlo_text(step_fn, *args, strict=True, kwargs=kwargs)
    graph = HloGraph.from_hlo_text(text)
    check_data_parallel(graph)
    if cluster is None:
        cluster = preset("local", devices=step_devices(graph, args))
    sim = Simulator(graph, costs or device_costs.analytic(cluster.device), cluster)
    progress("extract", 1.0, f"{len(graph.nodes)} nodes, {len(graph.all_reduces())} all-reduces")
    return Target(step_fn, tuple(args), graph, sim, text, kwargs)


def step_devices(graph: HloGraph, args: tuple[Any, ...]) -> int:
    """The devices a step runs on: those its arguments are sharded over, or its all-reduces' replica
    groups span when more (a pmap step takes host arrays, which are on none)."""
    spans = [replica_group_size(n.replica_groups) or 1 for n in graph.all_reduces()]
    return max([devices_of(args), *spans])

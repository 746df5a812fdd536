"""Cost models, one home: how long one fused kernel takes, and how long one collective takes.

- this package: the interface (:class:`CostModel`), the kernels it prices (:class:`Kernel`,
  :class:`GraphKernels`), the analytic roofline (:class:`AnalyticCosts`) and profiled tables
  (:class:`TableCosts`), and the file format (:func:`load_costs`);
- :mod:`disco.sim.costs.device_costs`: the analytic model of each device kind (the CPU roofline,
  ``SummedCosts`` on an H100; :func:`~disco.sim.costs.device_costs.analytic`);
- :mod:`disco.sim.costs.registry`: the cost models by name, for the simulator, the CLI and the
  service (the learned ones, ``gnn``, register themselves there through an entry point).

Every cost model has one interface (:class:`CostModel`): ``kernel_time``,
``collective_time``, ``name``, ``version``, ``to_dict`` / ``save`` / ``load``.

A kernel is described by a :class:`Kernel`: the graph nodes fused into it plus
the bytes it reads from outside (``in_bytes``) and writes for use outside
(``out_bytes``). Building it needs the graph's edges, so cost models never see
the graph: :class:`GraphKernels` precomputes a graph's adjacency once and turns
a set of node indices into a Kernel (``GraphKernels(graph).kernel(indices)``);
``kernel_of(graph, indices)`` is the one-off convenience. A single unfused node
is a kernel of one.

A ``dynamic-slice`` or ``gather`` reads only its slice of its first operand, and a
``dynamic-update-slice`` or ``scatter`` whose buffer comes from outside the kernel updates it in
place (reads none of it, writes only the update; ``disco.ir.opcodes.SLICE_READ_OPCODES`` and
``IN_PLACE_UPDATE_OPERAND``): how a scan's body reads the step's slice of a stacked array and
writes its slice of a stacked result, so a loop's traffic per iteration is not the whole stack,
and how an embedding lookup reads its rows of the table and its gradient adds rows into a buffer.

A ``while`` node is priced by the simulator (``disco.sim.simulator``: its trip
count times one iteration of its body's and condition's kernels, the body's alone on a
GPU cluster when the count is known, from ``HloGraph.loops``); as a kernel of one here (a graph without loop bodies, or
``node_kernel_times``) its flops are already its trip count times its body's
(``disco.ir.flops``) and its traffic is the loop state it reads and writes once.

Some opcodes never become kernels (``disco.ir.opcodes.ZERO_COST_OPCODES``: parameters, constants,
tuple plumbing, bitcasts, inlined calls) and collectives run on the network,
not as kernels (``disco.ir.opcodes.COLLECTIVE_KIND``); both cost 0.0 as kernels.

Implementations:
  :class:`AnalyticCosts`: a roofline, ``max(flops / peak_flops, bytes / mem_bandwidth)
    + launch_overhead``, so fusing saves launches and the memory traffic of the
    intermediates that stay inside the kernel.
  :class:`TableCosts`: profiled seconds looked up by ``kernel_key`` (the sorted
    opcode:shape signature of the kernel's nodes), falling back to an
    AnalyticCosts for kernels it has not seen.

Example:
  >>> from disco.sim.costs import AnalyticCosts, kernel_of
  >>> costs = AnalyticCosts()
  >>> costs.kernel_time(kernel_of(graph, [3, 4]))  # doctest: +SKIP
"""

from __future__ import annotations

from disco.sim.costs._model import (
    SCHEMA,
    AnalyticConfig,
    AnalyticCosts,
    CostModel,
    GraphKernels,
    Kernel,
    TableCosts,
    costs_from_dict,
    is_kernel_node,
    kernel_key,
    kernel_of,
    load_costs,
    node_kernel_times,
    require_cost_model,
)

__all__ = [
    "SCHEMA", "AnalyticConfig", "AnalyticCosts", "CostModel", "GraphKernels", "Kernel", "TableCosts",
    "costs_from_dict", "is_kernel_node", "kernel_key", "kernel_of", "load_costs", "node_kernel_times",
    "require_cost_model",
]

"""A two-stream list-scheduling simulator of one data-parallel training step.

``simulate(graph, plan, costs, cluster)`` predicts the step time of ``graph``
compiled with ``plan``:

1. **Kernels.** Zero-cost ops (``disco.ir.opcodes.ZERO_COST_OPCODES``: parameters,
   constants, tuple plumbing, bitcasts, inlined calls) are not kernels: they take no
   time and only pass dependencies through. The other compute ops are contracted into
   kernels according to ``plan.xla_fusion``:

   - ``"off"``: each of ``plan.groups`` is one kernel; every other compute op is a
     kernel of one (XLA's fusion pass is disabled).
   - ``"extend"`` (XLA's fusion pass runs after ours): an emulation of XLA:CPU's loop
     fusion. Producers are visited consumers-first (descending program position). A
     loop-fusible producer (``XLA_CPU_LOOP_OPCODES``: elementwise ops, broadcast, reshape,
     transpose, slice, concatenate, reduce, ...; or a planned group, which is a loop
     fusion) is fused into its users' fusion when all its users are loop-fusible and
     already in one and the same fusion, its value is not read by a zero-cost op
     (tuple, get-tuple-element, call: a step output) or a collective, and no plan cut
     separates it from a user (``plan.cuts``: the user reads it through an optimization
     barrier; both backends' emulations honour cuts); otherwise it roots a fusion of its own. A broadcast whose users are all loop-fusible is
     duplicated into each consumer (it becomes part of every consumer's kernel: its
     inputs are read there, its result is never written; ``XLA_CPU_DUPLICATED_OPCODES``).
     Dots, convolutions, custom calls, scatters and collectives are never fused (XLA:CPU
     runs dots and convolutions as library calls). Planned groups are pre-fused before
     the pass, so XLA grows them by the same rule. Every fusion has one root that all its
     members reach, so contracting it never adds a dependency between outside ops.

   A kernel's time is ``costs.kernel_time(kernel) / cluster.compute_speed``; a fused
   kernel's traffic is the bytes it reads from outside plus the bytes of its members
   read outside (``disco.sim.costs.GraphKernels.kernel``). A ``while`` node is one
   unit whose time is its trip count (1 when unknown) times one iteration: the
   kernels (and collectives, serially) of its body and condition graphs
   (``HloGraph.loops``; on a GPU cluster the body alone when the trip count is known,
   as XLA:GPU runs it), contracted by the same fusion emulation in the plan's
   ``xla_fusion`` mode and priced by the same cost model; a while without a body
   graph is a kernel of one.
2. **Collectives.** Each of ``plan.buckets`` becomes one all-reduce of the members'
   summed bytes (``costs.collective_time("all-reduce", bytes, cluster)``); all-reduces
   in no bucket are one collective each. ``buckets=None`` models XLA's combiner: all
   all-reduces in one bucket; where some all-reduces depend on others (so one bucket
   would deadlock), one bucket per *level* (the number of all-reduces on the longest
   chain of all-reduces above it). On a GPU cluster (``cluster.is_gpu``) XLA:GPU's
   combiner also closes a bucket at the plan's ``xla_gpu_all_reduce_combine_threshold_bytes``
   (XLA's default when unset: 30 MiB + 7 bytes): per level, all-reduces in program order, at
   most that many bytes (one larger all-reduce alone) and 256 operands per bucket. Each of
   ``plan.gather_buckets`` with several members becomes one all-gather of the members' summed
   gathered bytes (``costs.collective_time("all-gather", bytes, cluster)``), ready when every
   member's inputs are and releasing every member's readers when it ends, as the compiled step's
   one all-gather of the concatenated shards does; all-gathers in no bucket (every one under
   ``gather_buckets=None``: XLA:CPU has no all-gather combiner) are one collective each. Other
   collectives are one collective each. A gather bucket of a loop body's all-gathers (a scanned
   step's layer) changes the loop's unit instead: each iteration runs one all-gather of the
   members' summed bytes in place of theirs. A gather anchor (``plan.gather_after``: all-gather, anchor)
   is one more input of the all-gather's collective (its bucket's, if it has one): it is ready only
   once the kernel that computes the anchor has ended, as the compiled step's all-gather reads its
   shard through a barrier with the anchor's value.
3. **Two streams, ready-list scheduling.** A *compute stream* runs kernels one at a
   time; a *communication stream* runs collectives one at a time. A unit is *ready* at
   the time the last of its inputs (kernels and collectives) ends.

   - Whenever the compute stream is free (time ``t``), it starts the kernel that is
     ready by ``t`` with the smallest priority key; if none is ready it idles until the
     next kernel becomes ready. A kernel waiting for a collective never blocks ready
     kernels after it (XLA:CPU's thunk executor runs any ready thunk; XLA:GPU's
     latency-hiding scheduler moves the consumers of asynchronous collectives late).
   - ``order="program"`` (default): the key is the program position (the kernel's
     first member in ``graph.nodes``). ``order="topological"``: the key is the longest
     remaining path to the end of the step (its own time plus the longest chain of
     kernel and collective times after it), longest first, ties by program position.
   - On a GPU cluster collectives overlap kernels only with the plan's
     ``xla_gpu_enable_latency_hiding_scheduler`` on (XLA's default scheduler puts each
     asynchronous collective's done right after its start): without it, as with
     ``cluster.overlap=False``, a collective holds the compute stream.
   - A collective starts at ``max(ready, comm stream free)``; collectives are served
     first come, first served (by ready time, ties by program position). When the
     comm stream's next start and the compute stream's next start coincide, the
     collective is placed first.
4. **Result.** ``step_time`` is when the last kernel or collective ends;
   ``compute_time``/``comm_time`` are the summed kernel/collective durations;
   ``exposed_comm = step_time - compute_time`` is the time the compute stream sat
   idle (waiting for collectives, or for the last collectives after the last kernel).

Where each part lives: this module is the facade (:class:`Simulator`, :func:`simulate`,
:func:`lower_bound`); :mod:`disco.sim.units` (kernels and collectives, per fusion mode),
:mod:`disco.sim.cpu_fusion` (XLA:CPU's loop fusion, emulated; on a GPU cluster
:mod:`disco.sim.gpu_fusion`, XLA:GPU's), :mod:`disco.sim.patch`
(what a plan changes), :mod:`disco.sim.scheduler` (the one scheduling loop),
:mod:`disco.sim.timeline` (:class:`SimResult`, :class:`Event`, the Chrome trace) and
:mod:`disco.sim.critical_path`.

Performance: :class:`Simulator` precomputes, per fusion mode, the kernels of the plan
without groups (XLA's fusion of the whole graph for "extend", computed once in the
constructor), their successor lists and input counts in flat arrays. A plan is a patch
of that: its groups (in "extend": each set of XLA fusions its groups touch, re-fused
with the groups pre-fused; cached per set of groups) and buckets replace some units.
Kernel times are cached per member set. ``Simulator.step_time`` then costs one
O(U log U) heap sweep over the U units; ``Simulator.run`` runs the same sweep recording
each start, then builds the timeline and critical path from the record. A search prices
plans one move from plans it has priced: :mod:`disco.sim.delta` re-patches such a plan by
piece (:mod:`disco.sim.pieces`) and restarts the same sweep at the first event the move can
move, from the neighbour's recorded schedule, with the same result bit for bit.

Example:
  >>> from disco.sim.simulator import Simulator
  >>> sim = Simulator(graph, AnalyticCosts(), preset("local"))  # doctest: +SKIP
  >>> sim.step_time(plan), sim.run(plan).to_chrome_trace()        # doctest: +SKIP
"""


from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from disco.ir.graph import HloGraph, Loop, require_graph
from disco.ir.replica_groups import replica_group_size
from disco.ir.opcodes import ALL_REDUCE_OPCODES, COLLECTIVE_KIND, FUSIBLE_OPCODES, XLA_CPU_LOOP_OPCODES
from disco.plans.check import body_gathers as plan_body_gathers
from disco.plans.check import gather_class, scatterable
from disco.plans.plan import FusionPlan
from disco.sim import gpu_fusion, scheduler
from disco.sim.cluster_spec import ClusterSpec, require_cluster
from disco.sim.costs import CostModel, GraphKernels, Kernel, require_cost_model
from disco.sim.critical_path import critical_path
from disco.sim.cpu_fusion import CpuFusion
from disco.sim.patch import Patch, Patcher
from disco.sim.timeline import Event, SimResult, timeline
from disco.sim.units import (COLL, KERNEL, FusionEmulation, Mode, Unit, UnitBuilder, node_kinds, rs_ag_time,
                             scatter_time)


__all__ = ["ORDERS", "Event", "Order", "SimResult", "Simulator", "lower_bound", "simulate"]

Order = Literal["program", "topological"]
ORDERS: tuple[str, ...] = ("program", "topological")



def iteration_graphs(loop: Loop, *, gpu: bool) -> tuple[HloGraph, ...]:
    """The graphs one trip of ``loop`` (an ``HloGraph.loops`` entry) runs: its body and its condition,
    except on a GPU for a loop of known trip count, where XLA:GPU loops on the count and never runs
    the condition (no condition kernel in any H100 profile; ``gnn.kernel_features.module_kernels``)."""
    return (loop.body,) if gpu and loop.trip_count is not None else (loop.body, loop.condition)

class Simulator:
    """Plan-independent precomputation for fast repeated simulation of one graph.

    Args:
      graph: the step's HLO graph.
      costs: the cost model.
      cluster: the cluster (collective costs and ``compute_speed``).
      step_bytes: the step's input bytes every kernel carries (:attr:`disco.sim.costs.Kernel.step_bytes`);
        None: the graph's entry parameters (a while body's simulator is given its step's).

    Raises:
      TypeError: for a graph, cost model or cluster of the wrong type.
      ValueError: for a graph whose edges are not in topological order.

    Example:
      >>> sim = Simulator(graph, costs, cluster)  # doctest: +SKIP
      >>> best = min(plans, key=sim.step_time)    # doctest: +SKIP
    """

    def __init__(self, graph: HloGraph, costs: CostModel, cluster: ClusterSpec, *, step_bytes: int | None = None):
        require_graph(graph, "Simulator: graph")
        require_cluster(cluster, "Simulator: cluster")
        require_cost_model(costs, "Simulator: costs")
        self.graph = graph
        self.costs = costs
        self.cluster = cluster
        self.kernels = GraphKernels(graph, step_bytes)
        nodes = graph.nodes
        n = len(nodes)
        self._n = n
        kind = self._kind = node_kinds(nodes)
        for d, preds in enumerate(self.kernels.preds):
            for p in preds:
                if p >= d:
                    raise ValueError(f"graph {graph.name!r}: edge {nodes[p].name!r} -> {nodes[d].name!r} "
                                     "goes backwards; expected nodes in topological order")
        p = cluster.num_devices
        self._cbytes = [0] * n
        for i, node in enumerate(nodes):
            if kind[i] == COLL:
                # The full buffer: a reduce-scatter's result is one device's shard.
                scale = ((replica_group_size(node.replica_groups) or p)
                         if COLLECTIVE_KIND[node.opcode] == "reduce-scatter" else 1)
                self._cbytes[i] = node.out_bytes * scale
        self._ars = [i for i in range(n) if nodes[i].opcode in ALL_REDUCE_OPCODES]
        self._ar_set = frozenset(self._ars)
        index = graph.index()
        self._loops = {index[lp.node]: lp for lp in graph.loops if lp.node in index}
        self._loop_sims: dict[int, tuple[Simulator, ...]] = {}
        builder = UnitBuilder(graph, costs, cluster, self.kernels, self._cbytes,
                              self._loop_time if self._loops else None)
        if getattr(cluster, "is_gpu", False):  # a GPU cluster: XLA:GPU's fusion instead of XLA:CPU's
            emulation: FusionEmulation = gpu_fusion.GpuFusion(nodes, [k == KERNEL for k in kind], self.kernels.succs,
                                                              self.kernels.preds, index)
        else:
            emulation = CpuFusion(nodes, kind, self.kernels.succs)
        self._gpu = bool(getattr(cluster, "is_gpu", False))
        self._duplicated = emulation.duplicated if self._gpu else frozenset()
        # each loop body's all-gathers by name -> its while node (a gather bucket may merge them)
        body_gathers = {name: index[lp.node] for name, (_, lp) in plan_body_gathers(graph).items()
                        if lp.node in index}
        self._patcher = Patcher(builder, kind, self._ars, emulation, gpu=self._gpu, body_gathers=body_gathers,
                                loop_unit=self._loop_unit if body_gathers else None)

    @property
    def backend(self) -> str:
        """"gpu" on a GPU cluster (its plans carry no fusion groups; GPU compile options are priced)."""
        return "gpu" if self._gpu else "cpu"

    def _loop_sims_of(self, i: int) -> tuple[Simulator, ...]:
        """The simulators of while node ``i``'s :func:`iteration_graphs` (made once)."""
        sims = self._loop_sims.get(i)
        if sims is None:
            step = self.kernels.step_bytes  # a loop's kernels belong to this step
            sims = self._loop_sims[i] = tuple(Simulator(g, self.costs, self.cluster, step_bytes=step)
                                              for g in iteration_graphs(self._loops[i], gpu=self._gpu))
        return sims

    def _loop_time(self, i: int, fusion: str, gather_buckets: tuple[tuple[str, ...], ...] = ()) -> float | None:
        """Seconds of while node ``i``: trip count (1 if unknown) x one iteration in ``fusion`` mode.

        An iteration is :func:`iteration_graphs`, its collectives one after another; with
        ``gather_buckets`` (of the loop body's all-gathers) each bucket of several is one all-gather of
        their summed bytes in place of its members (priced as a gather bucket outside loops).
        """
        loop = self._loops.get(i)
        if loop is None:
            return None
        sims = self._loop_sims_of(i)
        trips = 1 if loop.trip_count is None else loop.trip_count
        one = sum(sim.serial_time(fusion) for sim in sims)
        if gather_buckets:
            body = sims[0]._patcher
            mode = body.mode(fusion)
            _, units = body.gather_units(mode, gather_buckets)
            one += sum(u.dur - sum(mode.dur[mode.unit_of[m]] for m in u.members) for _, u in units)
        return trips * one

    def _body_classes(self, i: int) -> tuple[tuple[str, ...], ...]:
        """While node ``i``'s body's all-gathers (one array each) in one bucket per class, the cheapest
        any gather buckets of them make the loop (a bucket costs less than its parts): for the lower bound."""
        classes: dict[tuple, list[str]] = {}
        for n in self._loops[i].body.nodes:
            if n.opcode == "all-gather" and not n.shape.startswith("("):
                classes.setdefault(gather_class(n), []).append(n.name)
        return tuple(tuple(c) for c in classes.values())

    def _loop_unit(self, mode: Mode, i: int, gather_buckets: tuple[tuple[str, ...], ...]) -> Unit:
        """While node ``i``'s unit in ``mode`` with its body's ``gather_buckets``: the base unit's links,
        its time :meth:`_loop_time` with them."""
        base = mode.units[mode.unit_of[i]]
        return Unit(False, base.members, self._loop_time(i, mode.fusion, gather_buckets), base.succ, base.preds,
                    base.name, base.groups)

    def serial_time(self, fusion: str = "extend") -> float:
        """The graph's kernels and collectives without a plan, one after another (a loop iteration's time).

        Raises:
          ValueError: for a fusion mode other than "extend" or "off".
        """
        mode = self._patcher.mode(fusion)
        return mode.kernel_total + mode.comm_total

    def _schedule(self, plan: FusionPlan, patch: Patch, order: str, record: bool) -> SimResult:
        """One sweep of the scheduler over ``patch``; with ``record``, the timeline and critical path too."""
        unit_of, indeg, dur, key, succ, coll, ready_k, ready_c = self._patcher.arrays(patch)
        key_unit = unit_of  # program order: a unit's key is its first member's position
        if order == "topological":
            key, key_unit = scheduler.topological_keys(self._patcher.toposort(patch), unit_of, dur, key, succ)
        placed: list[tuple[int, float]] | None = [] if record else None
        step = scheduler.schedule(unit_of, key_unit, indeg, dur, key, succ, coll, ready_k, ready_c,
                                  len(patch.dead), patch.blocking, placed)
        if placed is None:
            return SimResult(step_time=step, compute_time=patch.compute, comm_time=patch.comm,
                             exposed_comm=max(0.0, step - patch.compute))
        events = timeline(placed, patch.mode.units + patch.new, dur, self._patcher.labels(plan, patch),
                          self.graph.nodes)
        return SimResult(step_time=step, compute_time=patch.compute, comm_time=patch.comm,
                         exposed_comm=max(0.0, step - patch.compute),
                         critical_path=critical_path(events, placed, unit_of, succ, coll, patch.blocking),
                         timeline=tuple(events))

    def _simulate(self, plan: FusionPlan, order: str, record: bool) -> SimResult:
        if not isinstance(plan, FusionPlan):
            raise TypeError(f"plan: expected a disco FusionPlan, got {type(plan).__name__} {plan!r:.60}")
        if order not in ORDERS:
            raise ValueError(f"order: expected one of {', '.join(ORDERS)}, got {order!r}")
        patcher = self._patcher
        patch = patcher.patch(plan)
        for attempt in range(2):
            try:
                return self._schedule(plan, patch, order, record)
            except scheduler.Deadlock:
                if (attempt or plan.buckets is not None or not (plan.groups or plan.gather_buckets or plan.gather_after)
                        or not self._ars):
                    break
                # One combined bucket deadlocks against the groups (or a gather bucket of an
                # all-gather below an all-reduce, or a gather anchor below one): one bucket per level
                # of the graph with the plan's kernels, gather buckets and anchors contracted.
                try:
                    levels = patcher.contracted_levels(patch)
                except (IndexError, KeyError):  # pragma: no cover
                    break
                patch = patcher.patch(plan, levels)
        patcher.toposort(patch)  # raises ValueError naming the cycle
        raise RuntimeError("simulation deadlocked on an acyclic plan; this is a bug in disco.sim.simulator")


    # -- public API --------------------------------------------------------------------------------
    def run(self, plan: FusionPlan, order: Order = "program") -> SimResult:
        """Simulates ``plan`` with the timeline and critical path.

        Args:
          plan: the fusion plan (groups and buckets by instruction name).
          order: "program" or "topological" (see the module docstring).

        Returns:
          The SimResult.

        Raises:
          ValueError: for an unknown order, a name not in the graph, overlapping groups or
            buckets, or a plan whose contraction forms a cycle.
        """
        return self._simulate(plan, order, record=True)

    def step_time(self, plan: FusionPlan, order: Order = "program") -> float:
        """Only the predicted step time of ``plan`` (no timeline): the fast path for search.

        Raises:
          ValueError: as ``run``.
        """
        return self._simulate(plan, order, record=False).step_time

    def result(self, plan: FusionPlan, order: Order = "program") -> SimResult:
        """The step, compute, comm and exposed times without timeline or critical path.

        Raises:
          ValueError: as ``run``.
        """
        # A topological result has always carried its timeline and critical path.
        return self._simulate(plan, order, record=order != "program")

    def fusions(self, plan: FusionPlan) -> list[tuple[str, ...]]:
        """The compute kernels ``plan`` compiles to (instruction names per kernel), program order.

        With ``xla_fusion="extend"`` this is the emulation of XLA's loop fusion around the
        plan's groups; with ``"off"`` the planned groups and one kernel per other op.

        Raises:
          ValueError: as ``run``.
        """
        patch = self._patcher.patch(plan)
        names = self.graph.nodes
        return [tuple(names[m].name for m in u.members)
                for u in sorted(self._patcher.all_units(patch), key=lambda u: u.prio) if not u.is_coll]

    def lower_bound(self) -> float:
        """See :func:`lower_bound`."""
        nodes = self.graph.nodes
        gk = self.kernels
        speed = self.cluster.compute_speed
        loops = {i: min(self._loop_time(i, f, self._body_classes(i)) for f in ("extend", "off")) for i in self._loops}
        fixed = [i for i in range(self._n)
                 if self._kind[i] == KERNEL and nodes[i].opcode not in FUSIBLE_OPCODES
                 and nodes[i].opcode not in XLA_CPU_LOOP_OPCODES and i not in self._duplicated]
        rest = [i for i in fixed if i not in loops]
        if self._gpu and rest:
            # One kernel holding all their work that reads and writes nothing (see lower_bound).
            compute = sum(loops[i] for i in fixed if i in loops) + self.costs.kernel_time(
                Kernel(nodes=tuple(nodes[i] for i in rest), in_bytes=0, out_bytes=0, step_bytes=gk.step_bytes)) / speed
        else:
            compute = sum(loops[i] if i in loops else self.costs.kernel_time(gk.kernel((i,))) / speed for i in fixed)
        builder = self._patcher.builder
        comm = 0.0
        # per set of replica groups (only collectives over the same groups share a bucket): one all-reduce,
        # or one "rs_ag" bucket (cheaper with a tree), of all their bytes; where some of them are gradient
        # scatters a "scatter" bucket may hold, or one such bucket of all their bytes, for each way they
        # scatter (a reduce-scatter, on a data x fsdp mesh then an all-reduce of the shard, which may cost
        # less than a reduce-scatter over the whole group). Each is affine in the bytes with a non-negative
        # intercept, so their minimum is concave, hence subadditive: no split of the bytes costs less.
        scatters = _scatter_nodes(self.graph)
        ways: dict[ClusterSpec, set] = {}
        for i in self._ars:
            if i in scatters:
                ways.setdefault(builder.group_cluster(i), set()).add(builder.scatter_way(i))
        for over, ar_bytes in _bytes_by_group(self._ars, self._cbytes, builder.group_cluster):
            comm += min(self.costs.collective_time("all-reduce", ar_bytes, over),
                        rs_ag_time(self.costs, ar_bytes, over),
                        *(scatter_time(self.costs, ar_bytes, way) for way in ways.get(over, ())))
        mode = self._patcher.mode("extend")
        gathers = [i for i in range(self._n) if nodes[i].opcode == "all-gather"]
        # one all-gather of all of them per set of groups: what every set of gather buckets costs at least
        for over, ag_bytes in _bytes_by_group(gathers, self._cbytes, builder.group_cluster):
            comm += self.costs.collective_time("all-gather", ag_bytes, over)
        priced = self._ar_set.union(gathers)  # priced above
        comm += sum(mode.dur[ui] for ui, u in enumerate(mode.units)
                    if u.is_coll and u.members[0] not in priced)
        return max(compute, comm)


# ---------------------------------------------------------------------------------------------
def _scatter_nodes(graph: HloGraph) -> frozenset[int]:
    """The all-reduces a "scatter" bucket may hold (:func:`disco.plans.check.scatterable`), by node index;
    empty without a scatter block (labelling the collectives is left out then)."""
    if not any(b.dim is not None for b in graph.scatter_blocks):
        return frozenset()
    index = graph.index()
    return frozenset(index[n] for n in scatterable(graph))


def _bytes_by_group(nodes: Sequence[int], cbytes: Sequence[int],
                    group_cluster: Callable[[int], ClusterSpec]) -> list[tuple[ClusterSpec, int]]:
    """The collectives ``nodes``' bytes summed per cluster of their replica groups, in first-seen order."""
    out: dict[ClusterSpec, int] = {}
    for i in nodes:
        c = group_cluster(i)
        out[c] = out.get(c, 0) + cbytes[i]
    return list(out.items())


def simulate(graph: HloGraph, plan: FusionPlan, costs: CostModel, cluster: ClusterSpec,
             order: Order = "program") -> SimResult:
    """Simulates one step of ``graph`` compiled with ``plan``; see the module docstring.

    Builds a :class:`Simulator` each call; for many plans of one graph, build it once.

    Args:
      graph: the step's HLO graph.
      plan: the fusion plan.
      costs: the cost model.
      cluster: the cluster.
      order: "program" or "topological".

    Returns:
      The SimResult, with timeline and critical path.

    Raises:
      ValueError: for an unknown order or a plan that does not fit the graph.
    """
    return Simulator(graph, costs, cluster).run(plan, order)


def lower_bound(graph: HloGraph, costs: CostModel, cluster: ClusterSpec) -> float:
    """A step time no plan can beat under this cost model (ideal overlap of compute and comm).

    ``max(compute, comm)`` where

    - ``compute`` is the summed unfused kernel time of the compute ops that no plan can fuse
      (opcodes outside ``disco.ir.opcodes.FUSIBLE_OPCODES`` and ``XLA_CPU_LOOP_OPCODES``, always kernels
      of one in both fusion modes), divided by
      ``cluster.compute_speed``; fusible ops are counted as free, since fusion may hide them. A
      ``while`` counts its simulated time (all iterations), the smaller of its two fusion modes'.
      On a GPU cluster XLA:GPU fuses epilogues and prologues into a dot or convolution and
      duplicates cheap producers into it (``disco.sim.gpu_fusion``), so the kernel that holds such
      an op can move fewer bytes than the op alone, and a plan's group can hold several: there
      they are priced as one kernel holding all their work that reads and writes nothing, and
      the producers the emulation duplicates (never kernels of their own) are left out. This
      bounds every plan for a cost model under which a kernel costs no less when it gains nodes
      or bytes and two kernels no less than one holding both (the analytic models; a learned
      model need not be either).
    - ``comm`` is one all-reduce of all all-reduce bytes together, or one reduce-scatter plus one
      all-gather of them (an "rs_ag" bucket; cheaper than the all-reduce with the tree algorithm),
      (or, over groups where some all-reduces are gradient scatters a "scatter" bucket may hold,
      one "scatter" bucket of them all for each way they scatter: a reduce-scatter, then on a data x
      fsdp mesh an all-reduce of the shard), whichever is less (any bucketing costs at least this, as the alpha-beta cost is affine in
      bytes with a non-negative intercept), plus one all-gather of all all-gather bytes (a bound on
      every set of gather buckets, by the same argument), plus the time of every other collective.

    Both streams are serial, so a simulated step is never shorter than either term.
    """
    return Simulator(graph, costs, cluster).lower_bound()

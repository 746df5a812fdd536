"""Alpha-beta cost formulas for collectives on a :class:`~disco.sim.cluster.ClusterSpec`.

Notation: ``n`` bytes per device (the full, unsharded buffer), ``p`` devices,
``alpha`` a link's latency (s), ``beta = 1 / bandwidth`` (s/byte). With ``p == 1``
every collective is free (0.0 s).

Flat algorithms ("ring", "tree") run over all ``p`` devices. On a multi-node
cluster their messages cross both kinds of link, so they are priced with the
bottleneck link: ``alpha = max(intra.latency, inter.latency)`` and
``beta = 1 / min(intra.bandwidth, inter.bandwidth)``; on one node, the intra link.

ring:
  all-reduce      ``2 (p-1) alpha + 2 (p-1)/p n beta``
  reduce-scatter  ``(p-1) alpha + (p-1)/p n beta``
  all-gather      ``(p-1) alpha + (p-1)/p n beta``

tree (pipelined binary trees for all-reduce, recursive halving / doubling for the others;
``L = ceil(log2 p)``):
  all-reduce      ``2 L alpha + 2 n beta``
  reduce-scatter  ``L alpha + (p-1)/p n beta``
  all-gather      ``L alpha + (p-1)/p n beta``

hierarchical (``d`` devices per node, ``N`` nodes; the inter-node bandwidth ``B_e`` is
per node, shared by its ``d`` devices, each of which carries ``n/d`` bytes across):
  all-reduce      ``RS_ring(n, d, intra) + AR_inter(n) + AG_ring(n, d, intra)`` with
                  ``AR_inter(n) = 2 (N-1) alpha_e + 2 (N-1)/N n / B_e``
  reduce-scatter  ``RS_ring(n, d, intra) + (N-1) alpha_e + (N-1)/N n / B_e``
  all-gather      ``(N-1) alpha_e + (N-1)/N n / B_e + AG_ring(n, d, intra)``
  With ``N == 1`` this is the intra ring; with ``d == 1`` the inter ring.

Also priced, for graphs that contain them (any algorithm; bottleneck link):
  all-to-all          ``(p-1) alpha + (p-1)/p n beta``
  collective-permute  ``alpha + n beta``

A collective whose replica groups are a part of the devices (one axis of a 2-D mesh: a sharded
step's parameter gathers over ``"fsdp"``, its gradients' reduction over ``"data"``) runs over one
group: :func:`over_group` gives the cluster of that group's devices, read as the cluster numbers
them (device ``i`` on node ``i // devices_per_node``), to price it with. A collective of one group
(a replicated step's) runs over the whole cluster.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disco.sim.cluster import ClusterSpec

COLLECTIVE_KINDS: tuple[str, ...] = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all",
                                     "collective-permute")


def over_group(cluster: ClusterSpec, groups: Sequence[Sequence[int]] | None) -> ClusterSpec:
    """The cluster a collective over the replica groups ``groups`` (device ids per group) runs on:
    ``cluster`` itself for None or a single group (all the step's devices: as many as the cluster has,
    also when the graph was built for fewer), else the nodes of the first group's devices, with as many
    devices per node as it has on its fullest node.

    >>> from disco.sim.cluster_presets import preset
    >>> c = preset("h100-2x8-ib")
    >>> across = over_group(c, [(i, i + 8) for i in range(8)])  # "data" over the two nodes
    >>> across.nodes, across.devices_per_node
    (2, 1)
    >>> within = over_group(c, [tuple(range(8)), tuple(range(8, 16))])  # one node each
    >>> within.nodes, within.devices_per_node
    (1, 8)
    """
    if groups is None or len(groups) <= 1 or len(groups[0]) >= cluster.num_devices:
        return cluster
    per_node = collections.Counter(d // cluster.devices_per_node for d in groups[0])
    nodes, per = len(per_node), max(per_node.values(), default=1)
    if (nodes, per) == (cluster.nodes, cluster.devices_per_node):
        return cluster
    return dataclasses.replace(cluster, nodes=nodes, devices_per_node=per)


def _check_bytes(nbytes: float) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes >= 0:
        raise ValueError(f"nbytes: expected a non-negative number of bytes, got {nbytes!r}")


def _flat_link(cluster: ClusterSpec) -> tuple[float, float]:
    """(alpha, beta) of the bottleneck link a flat algorithm crosses."""
    if cluster.nodes == 1:
        return cluster.intra.latency, 1.0 / cluster.intra.bandwidth
    if cluster.devices_per_node == 1:
        return cluster.inter.latency, 1.0 / cluster.inter.bandwidth
    return (max(cluster.intra.latency, cluster.inter.latency),
            1.0 / min(cluster.intra.bandwidth, cluster.inter.bandwidth))


def _ring_half(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """One reduce-scatter (or all-gather) pass of a ring over ``p`` members."""
    if p <= 1:
        return 0.0
    return (p - 1) * alpha + (p - 1) / p * nbytes * beta


def _inter_half(nbytes: float, cluster: ClusterSpec) -> float:
    """One inter-node ring pass of the hierarchical algorithm (node bandwidth shared)."""
    n_nodes = cluster.nodes
    if n_nodes <= 1:
        return 0.0
    return (n_nodes - 1) * cluster.inter.latency + (n_nodes - 1) / n_nodes * nbytes / cluster.inter.bandwidth


def allreduce_time(nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds for one all-reduce of ``nbytes`` per device under ``cluster.algorithm``.

    Ring and hierarchical all-reduces are a reduce-scatter then an all-gather (twice
    :func:`reduce_scatter_time`); a tree reduces to the root and broadcasts back.

    Args:
      nbytes: bytes of the buffer each device contributes (and receives).
      cluster: devices, links and algorithm.

    Returns:
      The time in seconds; 0.0 for one device.

    Raises:
      ValueError: for a negative byte count.
    """
    p = cluster.num_devices
    if cluster.algorithm == "tree" and p > 1:
        _check_bytes(nbytes)
        alpha, beta = _flat_link(cluster)
        return 2 * math.ceil(math.log2(p)) * alpha + 2 * nbytes * beta
    return 2 * reduce_scatter_time(nbytes, cluster)


def reduce_scatter_time(nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds for a reduce-scatter of an ``nbytes`` buffer (each device keeps ``nbytes / p``).

    Raises:
      ValueError: for a negative byte count.
    """
    _check_bytes(nbytes)
    p = cluster.num_devices
    if p <= 1:
        return 0.0
    if cluster.algorithm == "hierarchical":
        d = cluster.devices_per_node
        return (_ring_half(nbytes, d, cluster.intra.latency, 1.0 / cluster.intra.bandwidth)
                + _inter_half(nbytes, cluster))
    alpha, beta = _flat_link(cluster)
    if cluster.algorithm == "tree":
        return math.ceil(math.log2(p)) * alpha + (p - 1) / p * nbytes * beta
    return _ring_half(nbytes, p, alpha, beta)


def all_gather_time(nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds for an all-gather whose gathered result has ``nbytes`` per device.

    Raises:
      ValueError: for a negative byte count.
    """
    # Every formula above is symmetric in reduce-scatter and all-gather.
    return reduce_scatter_time(nbytes, cluster)


def all_to_all_time(nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds for an all-to-all of ``nbytes`` per device (bottleneck link, any algorithm).

    Raises:
      ValueError: for a negative byte count.
    """
    _check_bytes(nbytes)
    return _ring_half(nbytes, cluster.num_devices, *_flat_link(cluster))  # 0.0 for one device


def permute_time(nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds for a collective-permute sending ``nbytes`` to one peer (bottleneck link).

    Raises:
      ValueError: for a negative byte count.
    """
    _check_bytes(nbytes)
    if cluster.num_devices <= 1:
        return 0.0
    alpha, beta = _flat_link(cluster)
    return alpha + nbytes * beta


_BY_KIND = {
    "all-reduce": allreduce_time,
    "reduce-scatter": reduce_scatter_time,
    "all-gather": all_gather_time,
    "all-to-all": all_to_all_time,
    "collective-permute": permute_time,
}


def collective_time(kind: str, nbytes: float, cluster: ClusterSpec) -> float:
    """Seconds for a collective of ``kind`` (one of ``COLLECTIVE_KINDS``).

    Raises:
      ValueError: for an unknown kind (listing the known ones) or a negative byte count.
    """
    fn = _BY_KIND.get(kind)
    if fn is None:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVE_KINDS)}")
    return fn(nbytes, cluster)

"""Sharded parameters for the zoo's ``style="fsdp"`` steps: the mesh and the per-leaf rule.

The step is the ``gspmd`` step (the plain global computation under ``jax.jit``) on a
``("data", "fsdp")`` mesh, written as MaxText and flax's logical axis rules write one: the batch
split over both axes, and every parameter, and every optimizer-state leaf of the same shape, split
over ``"fsdp"`` along one dimension (:func:`shard_dim`), replicated over ``"data"``. XLA's SPMD
partitioner then inserts an all-gather of each sharded parameter before its use and returns
each sharded gradient to its shard (a reduce-scatter, or an all-reduce and a slice).
A 1-D fsdp mesh is ``(1, devices)``; ``(2, 4)`` is 2-way data parallelism over 4-way FSDP.
"""

from __future__ import annotations

import numbers

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES: tuple[str, str] = ("data", "fsdp")
BATCH_SPEC = P(MESH_AXES)


def check_mesh_shape(mesh_shape: object, devices: int) -> tuple[int, int]:
    """Returns ``mesh_shape`` as ``(data, fsdp)``; ``None`` gives ``(1, devices)`` (1-D FSDP).

    Raises:
      TypeError: for anything but None or a pair of ints.
      ValueError: for a size below 1, or sizes whose product is not ``devices``.
    """
    expected = f"mesh_shape: expected None or (data, fsdp), two ints >= 1 whose product is devices ({devices})"
    if mesh_shape is None:
        return 1, devices
    if (not isinstance(mesh_shape, (tuple, list)) or len(mesh_shape) != 2
            or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in mesh_shape)):
        raise TypeError(f"{expected}, got {mesh_shape!r}")
    data, fsdp = (int(n) for n in mesh_shape)
    if data < 1 or fsdp < 1 or data * fsdp != devices:
        raise ValueError(f"{expected}, got {mesh_shape!r}")
    return data, fsdp


def shard_dim(shape: tuple[int, ...], fsdp: int) -> int | None:
    """The dimension of a leaf of ``shape`` split over an fsdp axis of size ``fsdp``: the largest
    dimension that ``fsdp`` divides (the leading one of equal sizes); None (replicated) where none
    does or ``fsdp`` is 1."""
    if fsdp <= 1:
        return None
    fits = [(n, -d) for d, n in enumerate(shape) if n >= fsdp and n % fsdp == 0]
    return -max(fits)[1] if fits else None


def leaf_spec(shape: tuple[int, ...], fsdp: int) -> P:
    """The PartitionSpec of a parameter or optimizer-state leaf of ``shape``."""
    d = shard_dim(tuple(shape), fsdp)
    if d is None:
        return P()
    return P(*([None] * d), MESH_AXES[1])


def state_shardings(state, mesh: jax.sharding.Mesh):
    """The NamedSharding of every leaf of ``state`` (arrays or ShapeDtypeStructs), by its shape."""
    fsdp = mesh.shape[MESH_AXES[1]]
    return jax.tree.map(lambda x: NamedSharding(mesh, leaf_spec(tuple(x.shape), fsdp)), state)

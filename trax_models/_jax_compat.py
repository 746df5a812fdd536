"""The jax calls whose spelling differs between the jax releases disco supports, in one place.

setup.cfg admits jax 0.8.2 to 0.12.x; ``xla_hooks._jax_private.TESTED_JAX_VERSIONS`` names the
releases the XLA hooks were tested on.
"""

from __future__ import annotations

import jax


def data_parallel_mesh(devices: int, axis: str, *, explicit: bool = True) -> jax.sharding.Mesh:
    """A 1-D mesh of the first ``devices`` devices with one axis named ``axis``.

    The axis type is given explicitly: jax 0.9 changed ``make_mesh``'s default from ``Auto`` to
    ``Explicit`` (0.8 warns about it), so asking for ``Explicit`` gives every release the
    mesh that jax >= 0.9 builds by default. ``explicit=False`` gives an ``Auto`` axis: the
    classic GSPMD mode, where XLA's partitioner propagates the inputs' shardings (a ``jax.jit``
    step written without sharding-in-types annotations needs it: with an ``Explicit`` axis jax
    0.11 refuses the scatter of a cross-entropy's gradient over the sharded batch).
    """
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.make_mesh((devices,), (axis,), devices=jax.devices()[:devices], axis_types=(kind,))


def auto_mesh(shape: tuple[int, ...], axes: tuple[str, ...]) -> jax.sharding.Mesh:
    """A mesh of the first ``prod(shape)`` devices with ``Auto`` axes named ``axes`` (the classic
    GSPMD mode of :func:`data_parallel_mesh` with ``explicit=False``, over several axes)."""
    size = 1
    for n in shape:
        size *= n
    kinds = (jax.sharding.AxisType.Auto,) * len(axes)
    return jax.make_mesh(tuple(shape), tuple(axes), devices=jax.devices()[:size], axis_types=kinds)

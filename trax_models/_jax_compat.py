"""The jax calls whose spelling differs between the jax releases disco supports, in one place.

setup.cfg admits jax 0.8.2 to 0.12.x; ``xla_hooks._jax_private.TESTED_JAX_VERSIONS`` names the
releases the XLA hooks were tested on.
"""

from __future__ import annotations

import jax


def data_parallel_mesh(devices: int, axis: str) -> jax.sharding.Mesh:
    """A 1-D mesh of the first ``devices`` devices with one axis named ``axis``.

    The axis type is given explicitly: jax 0.9 changed ``make_mesh``'s default from ``Auto`` to
    ``Explicit`` (0.8 warns about it), so asking for ``Explicit`` gives every release the
    mesh that jax >= 0.9 builds by default.
    """
    return jax.make_mesh((devices,), (axis,), devices=jax.devices()[:devices],
                         axis_types=(jax.sharding.AxisType.Explicit,))

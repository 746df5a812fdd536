"""Facts about a step's example arguments that the graph does not hold."""

from __future__ import annotations

from typing import Any


def devices_of(args: Any) -> int:
    """The number of devices the arrays in ``args`` (any pytree) are sharded over (at least 1: host
    arrays and scalars are on none)."""
    import jax

    n = 1
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            n = max(n, len(sharding.device_set))
    return n

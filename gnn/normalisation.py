"""The normalisation statistics both GNN families save with their parameters."""

from __future__ import annotations

from flax import nnx


class Stat(nnx.Variable):
    """A non-trainable constant saved with the parameters (feature means and deviations, the
    kernel family's roofline): not a ``nnx.Param``, so optimisers leave it alone."""

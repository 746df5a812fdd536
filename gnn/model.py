"""The cost GNN (Flax NNX): edge-aware message passing over a plan's fused graph.

Two heads:

* a **kernel head**: per node, the log seconds of that kernel, from the node's own
  features only (opcode embedding + the first ``features.N_KERNEL_FEATURES`` features),
  so a kernel can be priced out of context and cached (:class:`gnn.cost_model.GnnCosts`).
  Trained so that ``log(sum over a graph's nodes of exp(kernel log time))`` matches the
  measured step time (absolute, in seconds).
* a **graph head**: after ``layers`` rounds of residual message passing (messages along and
  against each edge, edges updated from both ends), mean and max pooling plus globals give
  ``log(step time / xla_default step time of the same round)``; trained with MSE and/or a
  pairwise ranking loss within one model's samples.

Example:
  >>> from flax import nnx
  >>> model = CostGNN(hidden=32, layers=2, rngs=nnx.Rngs(0))
  >>> kernel_log_s, rel = model(padded_graphs)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from gnn import features as F
from gnn.normalisation import Stat


@dataclasses.dataclass(frozen=True)
class GnnConfig:
    """The model's hyperparameters (saved in the checkpoint, checked on load).

    Attributes:
      hidden: node state width.
      edge_hidden: edge state width.
      layers: message-passing rounds.
      opcode_dim: opcode embedding width.
      feature_version: ``gnn.features.FEATURE_VERSION`` the model was built for.
    """

    hidden: int = 64
    edge_hidden: int = 8
    layers: int = 4
    opcode_dim: int = 16
    feature_version: int = F.FEATURE_VERSION

    def __post_init__(self) -> None:
        for f in ("hidden", "edge_hidden", "layers", "opcode_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GnnConfig.{f}: expected an integer >= 1, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> GnnConfig:
        """Raises ValueError for unknown or wrong fields."""
        if not isinstance(data, dict):
            raise ValueError(f"GnnConfig: expected an object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"GnnConfig: unknown keys {unknown}; expected some of {sorted(known)}")
        return cls(**data)


def _seg_mean(x: jax.Array, seg: jax.Array, n: int) -> jax.Array:
    s = jax.ops.segment_sum(x, seg, num_segments=n)
    c = jax.ops.segment_sum(jnp.ones((x.shape[0], 1), x.dtype), seg, num_segments=n)
    return s / jnp.maximum(c, 1.0)


class _Layer(nnx.Module):
    def __init__(self, *, hidden: int, edge_hidden: int, rngs: nnx.Rngs):
        self.fwd = nnx.Linear(hidden + edge_hidden, hidden, rngs=rngs)
        self.bwd = nnx.Linear(hidden + edge_hidden, hidden, rngs=rngs)
        self.edge = nnx.Linear(2 * hidden + edge_hidden, edge_hidden, rngs=rngs)
        self.node = nnx.Linear(3 * hidden, hidden, rngs=rngs)
        self.norm = nnx.LayerNorm(hidden, rngs=rngs)

    def __call__(self, h: jax.Array, e: jax.Array, s: jax.Array, r: jax.Array) -> tuple[jax.Array, jax.Array]:
        n = h.shape[0]
        hs, hr = h[s], h[r]
        m_in = _seg_mean(jax.nn.relu(self.fwd(jnp.concatenate([hs, e], -1))), r, n)
        m_out = _seg_mean(jax.nn.relu(self.bwd(jnp.concatenate([hr, e], -1))), s, n)
        e = e + jax.nn.relu(self.edge(jnp.concatenate([hs, hr, e], -1)))
        h = h + self.node(jax.nn.relu(jnp.concatenate([self.norm(h), m_in, m_out], -1)))
        return h, e


class CostGNN(nnx.Module):
    """Edge-aware residual message passing with a per-kernel head and a whole-graph head.

    Args:
      hidden: node state width.
      edge_hidden: edge state width.
      layers: message-passing rounds.
      opcode_dim: opcode embedding width.
      rngs: parameter initialisation.

    Example:
      >>> model = CostGNN(hidden=64, edge_hidden=8, layers=4, rngs=nnx.Rngs(0))  # doctest: +SKIP
      >>> kernel_log_s, rel = model(g)  # g: a padded gnn.features.GraphsTuple   # doctest: +SKIP
    """

    def __init__(self, *, hidden: int = 64, edge_hidden: int = 8, layers: int = 4, opcode_dim: int = 16,
                 rngs: nnx.Rngs):
        self.config = GnnConfig(hidden=hidden, edge_hidden=edge_hidden, layers=layers, opcode_dim=opcode_dim)
        nf, ef, gf, kf = len(F.NODE_FEATURES), len(F.EDGE_FEATURES), len(F.GLOBAL_FEATURES), F.N_KERNEL_FEATURES
        self.node_mean, self.node_std = Stat(jnp.zeros(nf)), Stat(jnp.ones(nf))
        self.edge_mean, self.edge_std = Stat(jnp.zeros(ef)), Stat(jnp.ones(ef))
        self.glob_mean, self.glob_std = Stat(jnp.zeros(gf)), Stat(jnp.ones(gf))
        self.target_mean = Stat(jnp.zeros(()))  # mean log seconds of a kernel-head target
        self.embed = nnx.Embed(F.N_OPCODES, opcode_dim, rngs=rngs)
        self.node_in = nnx.Linear(opcode_dim + nf + gf, hidden, rngs=rngs)
        self.edge_in = nnx.Linear(ef, edge_hidden, rngs=rngs)
        self.layers = nnx.List([_Layer(hidden=hidden, edge_hidden=edge_hidden, rngs=rngs) for _ in range(layers)])
        self.k1 = nnx.Linear(opcode_dim + kf, hidden, rngs=rngs)
        self.k2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.k3 = nnx.Linear(hidden, 1, rngs=rngs)
        self.g1 = nnx.Linear(2 * hidden + gf, hidden, rngs=rngs)
        self.g2 = nnx.Linear(hidden, 1, rngs=rngs)

    @classmethod
    def from_config(cls, config: GnnConfig, *, rngs: nnx.Rngs) -> CostGNN:
        return cls(hidden=config.hidden, edge_hidden=config.edge_hidden, layers=config.layers,
                   opcode_dim=config.opcode_dim, rngs=rngs)

    def kernel_log_time(self, opcodes: jax.Array, kfeats: jax.Array) -> jax.Array:
        """Log seconds per kernel from opcode ids [K] and kernel features [K, N_KERNEL_FEATURES]."""
        return kernel_head(kernel_head_weights(self), opcodes, kfeats, jnp)

    def __call__(self, g: F.GraphsTuple) -> tuple[jax.Array, jax.Array]:
        """Returns (kernel log seconds [N], predicted log(time / xla_default time) [G])."""
        n_graph = g.n_node.shape[0]
        nodes = jnp.clip((g.nodes - self.node_mean[...]) / self.node_std[...], -F.CLIP, F.CLIP)
        glob = jnp.clip((g.globals - self.glob_mean[...]) / self.glob_std[...], -F.CLIP, F.CLIP)
        k_log = self.kernel_log_time(g.opcodes, g.nodes[:, :F.N_KERNEL_FEATURES])
        h = self.node_in(jnp.concatenate([self.embed(g.opcodes), nodes, glob[g.node_graph]], -1))
        e = self.edge_in(jnp.clip((g.edges - self.edge_mean[...]) / self.edge_std[...], -F.CLIP, F.CLIP))
        for layer in self.layers:
            h, e = layer(h, e, g.senders, g.receivers)
        mask = g.node_mask[:, None]
        mean = (jax.ops.segment_sum(h * mask, g.node_graph, num_segments=n_graph)
                / jnp.maximum(jax.ops.segment_sum(mask, g.node_graph, num_segments=n_graph), 1.0))
        mx = jax.ops.segment_max(jnp.where(mask > 0, h, -1e9), g.node_graph, num_segments=n_graph)
        mx = jnp.where(mx < -1e8, 0.0, mx)
        rel = self.g2(jax.nn.relu(self.g1(jnp.concatenate([mean, mx, glob], -1))))[..., 0]
        return k_log, rel


def kernel_head_weights(model: CostGNN) -> dict[str, Any]:
    """The kernel head's parameters and normalisation as a plain dict (what :func:`kernel_head` takes)."""
    kf = F.N_KERNEL_FEATURES
    lin = lambda m: {"kernel": m.kernel[...], "bias": m.bias[...]}  # noqa: E731
    return {"mean": model.node_mean[...][:kf], "std": model.node_std[...][:kf], "embed": model.embed.embedding[...],
            "k1": lin(model.k1), "k2": lin(model.k2), "k3": lin(model.k3), "t0": model.target_mean[...]}


def kernel_head(w: dict[str, Any], opcodes: Any, kfeats: Any, xp: Any) -> Any:
    """The kernel head, one pure function for jax (``xp=jax.numpy``) and numpy (``xp=numpy``).

    Args:
      w: :func:`kernel_head_weights` output (jax or numpy arrays).
      opcodes: opcode ids [K].
      kfeats: kernel features [K, N_KERNEL_FEATURES].
      xp: the array module.

    Returns:
      log seconds per kernel [K].
    """
    x = xp.clip((kfeats - w["mean"]) / w["std"], -F.CLIP, F.CLIP)
    x = xp.concatenate([w["embed"][opcodes], x], -1)
    x = xp.maximum(x @ w["k1"]["kernel"] + w["k1"]["bias"], 0.0)
    x = xp.maximum(x @ w["k2"]["kernel"] + w["k2"]["bias"], 0.0)
    return (x @ w["k3"]["kernel"] + w["k3"]["bias"])[..., 0] + w["t0"]


def graph_log_time(k_log: jax.Array, g: F.GraphsTuple) -> jax.Array:
    """log(sum of a graph's kernel times) per graph, from kernel log times (padding masked)."""
    n_graph = g.n_node.shape[0]
    x = jnp.where(g.node_mask > 0, k_log, -jnp.inf)
    m = jax.ops.segment_max(x, g.node_graph, num_segments=n_graph)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    s = jax.ops.segment_sum(jnp.where(g.node_mask > 0, jnp.exp(k_log - m[g.node_graph]), 0.0), g.node_graph,
                            num_segments=n_graph)
    return m + jnp.log(jnp.maximum(s, 1e-30))

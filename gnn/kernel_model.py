"""The per-kernel GNN (Flax NNX): a kernel's seconds from its fused computation's graph.

The model predicts ``log(seconds per launch)`` as the device's roofline
(:data:`disco.sim.costs.device_costs.ROOFLINE`: ``max(flops / matrix rate, bytes / bandwidth) + launch``) plus a
learned correction: an opcode embedding and node features, ``layers`` rounds of message
passing along and against the kernel's edges, mean and max pooling, and the kernel totals. With
``members`` > 1 the model is an ensemble: that many networks, trained independently from different
seeds (:func:`gnn.kernel_train.fit`), whose corrections are averaged.

Everything is one pure function, :func:`apply` ``(weights, batch, xp)``: jax calls it with
``jax.numpy`` (training, batched prediction) and :class:`gnn.kernel_costs.KernelCosts` calls it
with numpy for one kernel at a time inside the simulator, so the two can never disagree.
:class:`KernelGNN` only owns the parameters; :func:`weights` reads them as a plain pytree.

Example:
  >>> from flax import nnx
  >>> model = KernelGNN(hidden=32, layers=2, rngs=nnx.Rngs(0))
  >>> b = KF.batch([KF.kernel_graph(kernel)])  # doctest: +SKIP
  >>> log_s = apply(weights(model), b, jnp)     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from flax import nnx

from gnn import graph as G, kernel_features as KF
from gnn.normalisation import Stat

CLIP = 8.0  # normalised inputs are clipped to +-CLIP (features far outside the training range)
_I_IN, _I_OUT, _I_FLOPS = (KF.TOTAL_FEATURES.index(k) for k in ("log_in_bytes", "log_out_bytes", "log_flops"))


@dataclasses.dataclass(frozen=True)
class KernelModelConfig:
    """Hyperparameters (saved in the checkpoint, checked on load).

    Attributes:
      hidden: node state width.
      layers: message-passing rounds.
      opcode_dim: opcode embedding width.
      members: independently trained networks whose log-space corrections are averaged (an ensemble).
      feature_version: ``gnn.kernel_features.FEATURE_VERSION`` the model was built for.
    """

    hidden: int = 32
    layers: int = 2
    opcode_dim: int = 8
    members: int = 1
    feature_version: int = KF.FEATURE_VERSION

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "opcode_dim", "members", "feature_version"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"KernelModelConfig.{f}: expected an integer >= 1, got {v!r}")

    @classmethod
    def from_dict(cls, data: Any) -> KernelModelConfig:
        """Raises ValueError for unknown or wrong fields."""
        if not isinstance(data, dict):
            raise ValueError(f"KernelModelConfig: expected an object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"KernelModelConfig: unknown keys {unknown}; expected some of {sorted(known)}")
        return cls(**data)


class Member(nnx.Module):
    """One network of the ensemble: opcode embedding, message passing, readout (a correction in log space)."""

    def __init__(self, *, hidden: int, layers: int, opcode_dim: int, rngs: nnx.Rngs):
        nf, tf = len(KF.NODE_FEATURES), len(KF.TOTAL_FEATURES)
        self.embed = nnx.Embed(KF.N_OPCODES, opcode_dim, rngs=rngs)
        self.node_in = nnx.Linear(opcode_dim + nf, hidden, rngs=rngs)
        self.mp = nnx.List([nnx.Linear(3 * hidden, hidden, rngs=rngs) for _ in range(layers)])
        self.out1 = nnx.Linear(2 * hidden + tf, hidden, rngs=rngs)
        self.out2 = nnx.Linear(hidden, 1, kernel_init=nnx.initializers.zeros_init(), rngs=rngs)


class KernelGNN(nnx.Module):
    """The parameters of the per-kernel GNN; :func:`apply` is its forward pass.

    Args:
      hidden: node state width.
      layers: message-passing rounds.
      opcode_dim: opcode embedding width.
      members: networks in the ensemble (their corrections are averaged; they share the normalisation).
      rngs: parameter initialisation.

    Example:
      >>> model = KernelGNN(hidden=32, layers=2, rngs=nnx.Rngs(0))
      >>> model.config.hidden
      32
    """

    def __init__(self, *, hidden: int = 32, layers: int = 2, opcode_dim: int = 8, members: int = 1,
                 rngs: nnx.Rngs):
        self.config = KernelModelConfig(hidden=hidden, layers=layers, opcode_dim=opcode_dim, members=members)
        nf, tf = len(KF.NODE_FEATURES), len(KF.TOTAL_FEATURES)
        self.node_mean, self.node_std = Stat(np.zeros(nf, np.float32)), Stat(np.ones(nf, np.float32))
        self.tot_mean, self.tot_std = Stat(np.zeros(tf, np.float32)), Stat(np.ones(tf, np.float32))
        # matrix flops/s, bytes/s, launch seconds of the device (set from disco.sim.costs.device_costs).
        self.roofline = Stat(np.array([1e12, 1e11, 1e-6], np.float32))
        self.members = nnx.List([Member(hidden=hidden, layers=layers, opcode_dim=opcode_dim, rngs=rngs)
                                 for _ in range(members)])

    @classmethod
    def from_config(cls, config: KernelModelConfig, *, rngs: nnx.Rngs) -> KernelGNN:
        if config.feature_version != KF.FEATURE_VERSION:
            raise ValueError(f"KernelModelConfig: built for feature version {config.feature_version}, this code "
                             f"computes version {KF.FEATURE_VERSION}; retrain with scripts/tools/train_gnn.py --kernels")
        return cls(hidden=config.hidden, layers=config.layers, opcode_dim=config.opcode_dim,
                   members=config.members, rngs=rngs)


def weights(model: KernelGNN) -> dict[str, Any]:
    """The model's parameters and constants as a plain nested dict of arrays (what :func:`apply` takes)."""
    return nnx.to_pure_dict(nnx.state(model))


def split_weights(w: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainable, constant) halves of :func:`weights` output (constants: normalisation, roofline)."""
    const = {"node_mean", "node_std", "tot_mean", "tot_std", "roofline"}
    return {k: v for k, v in w.items() if k not in const}, {k: v for k, v in w.items() if k in const}


# ---------------------------------------------------------------------------------------------
def _np_segment_sum(x: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((n, *x.shape[1:]), x.dtype)
    np.add.at(out, seg, x)
    return out


def _np_segment_max(x: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    out = np.full((n, *x.shape[1:]), -np.inf, x.dtype)
    np.maximum.at(out, seg, x)
    return out


def _segment_ops(xp: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    if xp is np:
        return _np_segment_sum, _np_segment_max
    import jax

    return (lambda x, s, n: jax.ops.segment_sum(x, s, num_segments=n),
            lambda x, s, n: jax.ops.segment_max(x, s, num_segments=n))


def roofline_log_seconds(totals: Any, roofline: Any, xp: Any = np) -> Any:
    """log(max(flops / matrix rate, (bytes in + out) / bandwidth) + launch) from kernel totals [G, T]."""
    flops = xp.expm1(totals[:, _I_FLOPS])
    nbytes = xp.expm1(totals[:, _I_IN]) + xp.expm1(totals[:, _I_OUT])
    return xp.log(xp.maximum(flops / roofline[0], nbytes / roofline[1]) + roofline[2])


def apply(w: dict[str, Any], b: G.GraphsTuple, xp: Any = np) -> Any:
    """log seconds per launch of every graph in the batch [G] (padding graphs give finite junk).

    Args:
      w: :func:`weights` output (numpy or jax arrays).
      b: a padded :class:`gnn.graph.GraphsTuple` (:func:`gnn.kernel_features.batch`).
      xp: ``numpy`` or ``jax.numpy``.
    """
    n_graph = b.globals.shape[0]
    x = xp.clip((b.nodes - w["node_mean"]) / w["node_std"], -CLIP, CLIP)
    t = xp.clip((b.globals - w["tot_mean"]) / w["tot_std"], -CLIP, CLIP)
    members = w["members"]
    keys = sorted(members, key=int)
    corr = sum(_member(members[k], b, x, t, xp) for k in keys) / len(keys)
    return roofline_log_seconds(b.globals, w["roofline"], xp) + corr[:n_graph]


def _member(w: dict[str, Any], b: G.GraphsTuple, x: Any, t: Any, xp: Any) -> Any:
    """One member's log-space correction [G] from normalised node features ``x`` and totals ``t``."""
    seg_sum, seg_max = _segment_ops(xp)
    relu = lambda v: xp.maximum(v, 0.0)  # noqa: E731
    lin = lambda p, v: v @ p["kernel"] + p["bias"]  # noqa: E731
    n_node, n_graph = b.nodes.shape[0], b.globals.shape[0]
    h = relu(lin(w["node_in"], xp.concatenate([w["embed"]["embedding"][b.opcodes], x], -1)))
    ones = xp.ones((b.senders.shape[0], 1), h.dtype)
    deg_in = xp.maximum(seg_sum(ones, b.receivers, n_node), 1.0)
    deg_out = xp.maximum(seg_sum(ones, b.senders, n_node), 1.0)
    for i in sorted(w["mp"], key=int):
        m_in = seg_sum(h[b.senders], b.receivers, n_node) / deg_in
        m_out = seg_sum(h[b.receivers], b.senders, n_node) / deg_out
        h = h + relu(lin(w["mp"][i], xp.concatenate([h, m_in, m_out], -1)))
    mask = b.node_mask[:, None]
    count = xp.maximum(seg_sum(mask, b.node_graph, n_graph), 1.0)
    mean = seg_sum(h * mask, b.node_graph, n_graph) / count
    mx = seg_max(xp.where(mask > 0, h, -1e9), b.node_graph, n_graph)
    mx = xp.where(mx < -1e8, 0.0, mx)
    z = relu(lin(w["out1"], xp.concatenate([mean, mx, t], -1)))
    return lin(w["out2"], z)[:, 0]


def to_numpy(w: Any) -> Any:
    """A copy of a weights pytree with numpy float32 arrays (for the numpy fast path)."""
    if isinstance(w, dict):
        return {k: to_numpy(v) for k, v in w.items()}
    a = np.asarray(w)
    return a.astype(np.float32) if a.dtype.kind == "f" else a




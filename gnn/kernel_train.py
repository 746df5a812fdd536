"""Training the per-kernel GNN: pure ``init``/``step`` over explicit state, one jitted step.

Examples are the profiled ops of :class:`gnn.kernel_data.Record` objects: a kernel graph and
its measured log seconds per launch. Batches are packed to one padded shape (``max_graphs``
graphs, ``node_budget`` nodes), so the step compiles once. The loss is the squared error of
log seconds (a relative error), averaged over a batch's real graphs.

Example:
  >>> examples = make_examples(records)                             # doctest: +SKIP
  >>> state, history = fit(examples, TrainConfig(steps=400), roofline)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from gnn import kernel_data as KD
from gnn import graph as G, kernel_features as KF
from gnn import kernel_model as KM


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Training settings.

    Attributes:
      hidden, layers, opcode_dim: the model (:class:`gnn.kernel_model.KernelModelConfig`).
      steps: optimizer steps (the bound on training time).
      lr: peak learning rate (adamw, cosine decay).
      weight_decay: adamw weight decay.
      max_graphs: graphs per batch.
      node_budget: padded nodes per batch (edges: twice as many).
      seed: parameter init and batch order.
      rank_weight: weight of the pairwise ranking term of the loss (0: squared error only).
      members: networks in the ensemble, each trained for ``steps`` steps from seed ``seed + i``.
    """

    hidden: int = 64
    layers: int = 3
    opcode_dim: int = 8
    steps: int = 2000
    lr: float = 3e-3
    weight_decay: float = 1e-4
    max_graphs: int = 64
    node_budget: int = 2048
    seed: int = 0
    rank_weight: float = 0.0
    members: int = 3

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "opcode_dim", "steps", "max_graphs", "node_budget", "members"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{field}: expected an integer >= 1, got {v!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"TrainConfig.lr: expected a finite number > 0, got {self.lr!r}")
        for field in ("weight_decay", "rank_weight"):
            v = getattr(self, field)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"TrainConfig.{field}: expected a finite number >= 0, got {v!r}")


def train_config(**overrides: Any) -> TrainConfig:
    """:class:`TrainConfig` with the ``overrides`` that are not None (a script's unset options keep
    the defaults)."""
    return TrainConfig(**{k: v for k, v in overrides.items() if v is not None})


class Example(NamedTuple):
    graph: KF.KernelGraph
    log_s: float  # measured log seconds per launch
    weight: float = 1.0  # the loss weight (see make_examples)


class TrainState(NamedTuple):
    """What a step reads and returns: trainable params, optimizer state, constants, step count."""

    params: dict[str, Any]
    opt_state: Any
    const: dict[str, Any]
    step: int


def make_examples(records: Sequence[KD.Record], time_weight: float = 0.5) -> list[Example]:
    """One example per profiled op of every record (ops with a zero time are skipped).

    An op's loss weight is ``(1 - time_weight) + time_weight * share * n``: ``share`` its part of
    the record's step time and ``n`` the record's profiled ops (so weights average 1 per record),
    which makes the kernels that dominate a step count more, capped at 20.
    """
    out = []
    for r in records:
        idx = r.index()
        ops = [(op, r.labels[op]) for op in r.profiled_ops()]
        total = sum(lab.seconds for _, lab in ops) or 1.0
        for op, lab in ops:
            w = (1 - time_weight) + time_weight * lab.seconds / total * len(ops)
            out.append(Example(r.graphs[idx[op]], math.log(lab.per_launch), min(w, 20.0)))
    return out


def pack(graphs: Sequence[KF.KernelGraph], max_graphs: int, node_budget: int) -> list[list[int]]:
    """Indices of ``graphs`` grouped into batches that fit one padded shape (input order kept).

    Raises:
      ValueError: for a graph bigger than the node or edge budget.
    """
    out: list[list[int]] = []
    cur: list[int] = []
    nodes = edges = 0
    for i, g in enumerate(graphs):
        n, e = len(g.opcodes), len(g.senders)
        if n + 1 > node_budget or e > 2 * node_budget:
            raise ValueError(f"pack: a kernel of {n} nodes and {e} edges exceeds the budget of {node_budget} nodes")
        if cur and (len(cur) == max_graphs or nodes + n + 1 > node_budget or edges + e > 2 * node_budget):
            out.append(cur)
            cur, nodes, edges = [], 0, 0
        cur.append(i)
        nodes, edges = nodes + n, edges + e
    if cur:
        out.append(cur)
    return out


def padded(graphs: Sequence[KF.KernelGraph], max_graphs: int, node_budget: int) -> G.GraphsTuple:
    return KF.batch(graphs, n_node=node_budget, n_edge=2 * node_budget, n_graph=max_graphs + 1)


def init(examples: Sequence[Example], config: TrainConfig, roofline: Sequence[float]) -> tuple[Any, TrainState]:
    """(model, state): a fresh :class:`gnn.kernel_model.KernelGNN` with normalisation from ``examples``.

    Raises:
      ValueError: for no examples.
    """
    from flax import nnx

    if not examples:
        raise ValueError("init: expected training examples, got none")
    model = KM.KernelGNN(hidden=config.hidden, layers=config.layers, opcode_dim=config.opcode_dim,
                         members=config.members, rngs=nnx.Rngs(config.seed))
    nodes = np.concatenate([e.graph.nodes for e in examples])
    totals = np.stack([e.graph.totals for e in examples])
    std = lambda a: np.where(a.std(0) < 1e-2, 1.0, a.std(0)).astype(np.float32)  # noqa: E731
    model.node_mean[...], model.node_std[...] = nodes.mean(0).astype(np.float32), std(nodes)
    model.tot_mean[...], model.tot_std[...] = totals.mean(0).astype(np.float32), std(totals)
    model.roofline[...] = np.asarray(roofline, np.float32)
    params, const = KM.split_weights(KM.weights(model))
    return model, TrainState(params, _tx(config).init(params), const, 0)


def _tx(config: TrainConfig) -> Any:
    import optax

    sched = optax.cosine_decay_schedule(config.lr, max(config.steps, 1), alpha=0.05)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=config.weight_decay))


def loss_fn(params: dict[str, Any], const: dict[str, Any], b: G.GraphsTuple, y: Any, w: Any,
            rank_weight: float = 0.0) -> Any:
    """Weighted mean squared error of log seconds over the batch's real graphs, plus ``rank_weight``
    times a pairwise logistic ranking loss: for every pair of real graphs whose measured times
    differ, ``log(1 + exp(-(p_i - p_j) * sign(y_i - y_j)))`` averaged over the pairs."""
    import jax
    import jax.numpy as jnp

    pred = KM.apply({**params, **const}, b, jnp)
    m = b.graph_mask
    loss = (m * w * (pred - y) ** 2).sum() / jnp.maximum(m.sum(), 1.0)
    if rank_weight:
        dy = y[:, None] - y[None, :]
        pair = m[:, None] * m[None, :] * (jnp.abs(dy) > 0.01)
        margin = (pred[:, None] - pred[None, :]) * jnp.sign(dy)
        loss = loss + rank_weight * (pair * jax.nn.softplus(-margin)).sum() / jnp.maximum(pair.sum(), 1.0)
    return loss


_STEP: dict[TrainConfig, Callable[..., Any]] = {}


def make_step(config: TrainConfig) -> Callable[[TrainState, G.GraphsTuple, Any, Any], tuple[TrainState, Any]]:
    """The jitted ``step(state, batch, targets, weights) -> (state, loss)`` (one compile per config)."""
    config = dataclasses.replace(config, seed=0)  # the step does not depend on the seed: one compile
    if config not in _STEP:
        import jax
        import optax

        tx = _tx(config)

        @jax.jit
        def step(state: TrainState, b: G.GraphsTuple, y: Any, w: Any) -> tuple[TrainState, Any]:
            loss, grads = jax.value_and_grad(loss_fn)(state.params, state.const, b, y, w, config.rank_weight)
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            return TrainState(optax.apply_updates(state.params, updates), opt_state, state.const,
                              state.step + 1), loss

        _STEP[config] = step
    return _STEP[config]


def batches(examples: Sequence[Example], config: TrainConfig,
            rng: random.Random) -> list[tuple[G.GraphsTuple, Any, Any]]:
    """One epoch of padded batches, their targets and loss weights, in a shuffled order."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    out = []
    for chunk in pack([examples[i].graph for i in order], config.max_graphs, config.node_budget):
        ids = [order[j] for j in chunk]
        y = np.zeros(config.max_graphs + 1, np.float32)
        y[:len(ids)] = [examples[i].log_s for i in ids]
        w = np.zeros(config.max_graphs + 1, np.float32)
        w[:len(ids)] = [examples[i].weight for i in ids]
        out.append((padded([examples[i].graph for i in ids], config.max_graphs, config.node_budget), y, w))
    return out


def fit(examples: Sequence[Example], config: TrainConfig, roofline: Sequence[float], *,
        log: Callable[[str], None] | None = None) -> tuple[Any, dict[str, Any]]:
    """Trains for ``config.steps`` steps; returns (model holding the final weights, history).

    With ``config.members`` > 1, trains that many networks independently (seeds ``seed``,
    ``seed + 1``, ...) on the same examples and returns them as one ensemble model; the history's
    loss is then the members' mean per epoch. Deterministic for a seed (batch order and init);
    history has the loss per epoch and seconds.

    Raises:
      ValueError: for no examples.
    """
    from flax import nnx

    if config.members > 1:
        t0 = time.perf_counter()
        fits = [fit(examples, dataclasses.replace(config, members=1, seed=config.seed + i), roofline,
                    log=(lambda s, i=i: log(f"member {i}: {s}")) if log else None)
                for i in range(config.members)]
        model, _ = init(examples, config, roofline)
        w = KM.weights(model)
        w["members"] = {i: KM.weights(m)["members"][0] for i, (m, _) in enumerate(fits)}
        state = nnx.state(model)
        nnx.replace_by_pure_dict(state, w)
        nnx.update(model, state)
        losses = [h["loss"] for _, h in fits]
        return model, {"loss": list(np.mean([h[:min(map(len, losses))] for h in losses], 0)),
                       "steps": fits[0][1]["steps"], "seconds": time.perf_counter() - t0}

    model, state = init(examples, config, roofline)
    step = make_step(config)
    rng = random.Random(config.seed)
    history: dict[str, Any] = {"loss": [], "steps": 0}
    t0 = time.perf_counter()
    while state.step < config.steps:
        losses = []
        for b, y, w in batches(examples, config, rng):
            if state.step >= config.steps:
                break
            state, loss = step(state, b, y, w)
            losses.append(float(loss))
        history["loss"].append(float(np.mean(losses)))
        if log:
            log(f"step {state.step}: loss {history['loss'][-1]:.4f} ({time.perf_counter() - t0:.0f} s)")
    history["steps"] = int(state.step)
    history["seconds"] = time.perf_counter() - t0
    nnx.update(model, _as_state(model, state))
    return model, history


def _as_state(model: Any, state: TrainState) -> Any:
    from flax import nnx

    st = nnx.state(model)
    nnx.replace_by_pure_dict(st, {**state.params, **state.const})
    return st


def predict_log_seconds(w: dict[str, Any], graphs: Sequence[KF.KernelGraph], *, max_graphs: int = 64,
                        node_budget: int = 2048) -> np.ndarray:
    """log seconds per launch of each graph, batched through the jitted :func:`gnn.kernel_model.apply`."""
    import jax
    import jax.numpy as jnp

    fwd = _forward()
    out = np.zeros(len(graphs), np.float64)
    big = [i for i, g in enumerate(graphs) if len(g.opcodes) + 1 > node_budget or len(g.senders) > 2 * node_budget]
    small = [i for i in range(len(graphs)) if i not in set(big)]
    for chunk in pack([graphs[i] for i in small], max_graphs, node_budget):
        ids = [small[j] for j in chunk]
        res = fwd(w, padded([graphs[i] for i in ids], max_graphs, node_budget))
        out[ids] = np.asarray(res)[:len(ids)]
    for i in big:  # rare: a kernel larger than the budget gets a shape of its own
        out[i] = float(np.asarray(KM.apply(jax.tree.map(jnp.asarray, w), KF.batch([graphs[i]]), jnp))[0])
    return out


_FWD: list[Callable[..., Any]] = []


def _forward() -> Callable[..., Any]:
    if not _FWD:
        import jax
        import jax.numpy as jnp

        _FWD.append(jax.jit(lambda w, b: KM.apply(w, b, jnp)))
    return _FWD[0]


def measured_corrections(w: dict[str, Any], examples: Sequence[Example]) -> dict[str, float]:
    """The corrections table (:func:`gnn.kernel_corrections.fit_corrections`) of a trained model's
    weights ``w`` on its training ``examples``."""
    from gnn.kernel_corrections import fit_corrections

    graphs = [e.graph for e in examples]
    return fit_corrections([e.log_s for e in examples], predict_log_seconds(w, graphs), graphs)

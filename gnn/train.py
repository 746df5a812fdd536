"""Training the cost GNN on the profile collector's samples.

Data: ``DIR/samples.jsonl`` (one measured plan per line: model, preset, devices,
graph_fingerprint, plan, measured.median_ms, reference_xla_default_median_ms) and
``DIR/graphs/<fingerprint>.json``. A *group* is one (model, preset, devices) step: the
ranking loss, Kendall's tau and regret are computed within a group.

Splits (:func:`split`): ``"plans"`` holds out plans (by plan digest) of every group;
``"lomo:<model>"`` holds out every sample of one model.

Training (:func:`fit`) is deterministic for a seed: adamw, batches of one group's samples,
early stopping on the validation ranking (mean Kendall's tau), best parameters kept.

Example:
  >>> ds = load_dataset("tests/data/profiles_small")                      # doctest: +SKIP
  >>> tr, va, te = split(ds, "plans", seed=0)                            # doctest: +SKIP
  >>> model, history = fit(ds, tr, va, TrainConfig(epochs=5))           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from disco.data import dataset
from disco.ir.graph import HloGraph
from disco.plans.plan import FusionPlan
from gnn import features as F
from gnn.inference import make_batch, predict


@dataclasses.dataclass(frozen=True)
class Sample:
    """One measured plan."""

    model: str
    group: str  # "model/preset/d<devices>/<fingerprint prefix>": plans compared only within one
    devices: int
    fingerprint: str
    plan: FusionPlan
    median_ms: float
    ref_ms: float
    line: int
    group_ref_ms: float = 0.0  # the median of ref_ms over the group (set by load_dataset)
    min_ms: float = 0.0
    max_ms: float = 0.0

    @property
    def norm_ms(self) -> float:
        """The drift-normalised time: ``median_ms / ref_ms * group_ref_ms``.

        The collector measures each plan next to xla_default (``ref_ms``, same rounds);
        between chunks the machine's speed drifts (on 2 shared cores, xla_default's
        time varies 2x between chunks), so a plan's time relative to its own reference,
        rescaled to the group's typical reference, is the comparable label.
        """
        return self.median_ms / self.ref_ms * (self.group_ref_ms or self.ref_ms)


@dataclasses.dataclass
class Dataset:
    """Samples plus their graphs (by fingerprint) and cached per-sample features."""

    samples: list[Sample]
    graphs: dict[str, HloGraph]
    source: str = ""
    skipped: int = 0
    _ctx: dict[str, F.GraphContext] = dataclasses.field(default_factory=dict, repr=False)
    _feat: dict[int, F.GraphsTuple] = dataclasses.field(default_factory=dict, repr=False)

    def features(self, i: int) -> F.GraphsTuple:
        g = self._feat.get(i)
        if g is None:
            s = self.samples[i]
            ctx = self._ctx.get(s.fingerprint)
            if ctx is None:
                ctx = self._ctx[s.fingerprint] = F.GraphContext(self.graphs[s.fingerprint])
            g = self._feat[i] = F.fused_graph(ctx, s.plan, devices=s.devices)
        return g

    def groups(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, s in enumerate(self.samples):
            out.setdefault(s.group, []).append(i)
        return out

    def models(self) -> list[str]:
        return sorted({s.model for s in self.samples})

    def digest(self) -> str:
        h = hashlib.sha256()
        for s in self.samples:
            h.update(f"{s.group}|{s.plan.digest()}|{s.median_ms:.6g}\n".encode())
        return h.hexdigest()[:16]


def load_dataset(path: str | os.PathLike[str], *, limit: int | None = None) -> Dataset:
    """Reads a collector dataset directory (the format: :mod:`disco.data.dataset`).

    Lines that are not samples (:func:`disco.data.dataset.read`'s tolerance rule: a collector may
    be writing the file) or that lack a measured median are skipped and counted in
    ``Dataset.skipped``; samples whose plan was not applied (``applied: false``) are skipped
    too, since the plan's features would not describe what ran.

    Raises:
      ValueError: if the directory has no samples.jsonl, a sample with a time has a missing or
        malformed field (naming the file and line), a sample names a graph file that is
        missing, or no usable sample is left.
    """
    root = Path(path)
    fn = Path(dataset.samples_path(root))
    if not fn.is_file():
        raise ValueError(f"{root}: expected a collector dataset with samples.jsonl, found none")
    samples: list[Sample] = []
    graphs: dict[str, HloGraph] = {}
    found = dataset.read(fn)
    skipped = found.skipped
    raw: list[tuple[int, dict[str, Any], FusionPlan, str]] = []  # line, sample, its plan and group
    for ln, d in zip(found.lines, found.samples):
        try:
            med = float(d["measured"]["median_ms"])
            if d.get("applied") is False or not (math.isfinite(med) and med > 0):
                raise ValueError("not applied or no time")
        except (ValueError, KeyError, TypeError):
            skipped += 1
            continue
        try:  # a sample with a time but a field missing or malformed is damaged: say where
            plan, g = FusionPlan.from_dict(d["plan"]), dataset.group_key(d)
            int(d.get("devices", 1))
            float(d["measured"].get("min_ms", med)), float(d["measured"].get("max_ms", med))
            if not isinstance(d["model"], str) or not isinstance(d["graph_fingerprint"], str):
                raise TypeError("expected 'model' and 'graph_fingerprint' strings, got "
                                f"{d['model']!r} and {d['graph_fingerprint']!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{fn}:{ln}: sample {d.get('sample_id')!r}: damaged fields "
                             f"({type(e).__name__}: {e})") from None
        raw.append((ln, d, plan, g))
    # References: the round's measured xla_default, else the group's median xla_default sample.
    default_ms: dict[str, list[float]] = {}
    for _, d, plan, g in raw:
        if plan.is_default:
            default_ms.setdefault(g, []).append(float(d["measured"]["median_ms"]))
    for ln, d, plan, g in raw:
        fp = d["graph_fingerprint"]
        if fp not in graphs:
            try:
                text = dataset.read_graph_json(root, fp)
            except ValueError as e:
                raise ValueError(f"{fn}:{ln}: {e}") from None
            try:
                graphs[fp] = HloGraph.from_json(text)
            except ValueError as e:  # the file is there but damaged: say which one
                raise ValueError(f"{fn}:{ln}: {dataset.graph_path(root, fp)}: {e}") from None
        ref = d.get("reference_xla_default_median_ms")
        if not isinstance(ref, (int, float)) or not (math.isfinite(ref) and ref > 0):
            ref = float(np.median(default_ms[g])) if g in default_ms else None
        if ref is None:
            skipped += 1
            continue
        m = d["measured"]
        samples.append(Sample(model=d["model"], group=g, devices=int(d.get("devices", 1)), fingerprint=fp,
                              plan=plan, median_ms=float(m["median_ms"]),
                              ref_ms=float(ref), line=ln, min_ms=float(m.get("min_ms", m["median_ms"])),
                              max_ms=float(m.get("max_ms", m["median_ms"]))))
        if limit is not None and len(samples) >= limit:
            break
    group_refs: dict[str, list[float]] = {}
    for smp in samples:
        group_refs.setdefault(smp.group, []).append(smp.ref_ms)
    samples = [dataclasses.replace(smp, group_ref_ms=float(np.median(group_refs[smp.group]))) for smp in samples]
    if not samples:
        raise ValueError(f"{fn}: no usable samples ({skipped} line{'' if skipped == 1 else 's'} skipped)")
    return Dataset(samples=samples, graphs=graphs, source=str(root), skipped=skipped)


def split(ds: Dataset, mode: str, *, seed: int = 0, val_frac: float = 0.15,
          test_frac: float = 0.2) -> tuple[list[int], list[int], list[int]]:
    """(train, val, test) sample indices.

    Args:
      ds: the dataset.
      mode: "plans" (hold out plans of every group) or "lomo:<model>" (hold out one model;
        validation is held-out plans of the other models).
      seed: the shuffle seed.
      val_frac: fraction of plans per group for validation.
      test_frac: fraction of plans per group for the test set ("plans" mode).

    Raises:
      ValueError: for an unknown mode or model.
    """
    rng = random.Random(seed)
    hold_model = None
    if mode.startswith("lomo:"):
        hold_model = mode[5:]
        if hold_model not in ds.models():
            raise ValueError(f"split: model {hold_model!r} is not in the dataset; expected one of {ds.models()}")
    elif mode != "plans":
        raise ValueError(f"split: expected mode 'plans' or 'lomo:<model>', got {mode!r}")
    tr, va, te = [], [], []
    for _, idx in sorted(ds.groups().items()):
        if hold_model is not None and ds.samples[idx[0]].model == hold_model:
            te += idx
            continue
        by_plan: dict[str, list[int]] = {}
        for i in idx:
            by_plan.setdefault(ds.samples[i].plan.digest(), []).append(i)
        keys = sorted(by_plan)
        rng.shuffle(keys)
        n_te = 0 if hold_model is not None else max(1, round(test_frac * len(keys)))
        n_va = max(1, round(val_frac * len(keys)))
        for j, k in enumerate(keys):
            (te if j < n_te else va if j < n_te + n_va else tr).extend(by_plan[k])
    return sorted(tr), sorted(va), sorted(te)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters.

    Attributes:
      hidden, edge_hidden, layers, opcode_dim: the model (:class:`gnn.model.GnnConfig`).
      epochs: maximum passes over the training samples.
      batch: most samples per step (all from one group).
      node_budget: padded nodes per step (edges: twice that); batches are cut to fit, so
        every step has one shape and jit compiles once.
      lr: adamw learning rate (constant; early stopping keeps the best epoch).
      weight_decay: adamw weight decay.
      patience: epochs without a better validation tau before stopping.
      loss: "rank", "mse" or "both" for the graph head (the kernel head always fits the
        absolute step time).
      rank_scale: logistic temperature of the pairwise loss (per unit of log time).
      seed: the seed of initialisation and shuffling.
    """

    hidden: int = 64
    edge_hidden: int = 8
    layers: int = 4
    opcode_dim: int = 16
    epochs: int = 30
    batch: int = 16
    lr: float = 2e-3
    weight_decay: float = 1e-4
    patience: int = 6
    node_budget: int = 16384
    loss: str = "both"
    rank_scale: float = 20.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss not in ("rank", "mse", "both"):
            raise ValueError(f"TrainConfig.loss: expected 'rank', 'mse' or 'both', got {self.loss!r}")


def _batches(ds: Dataset, idx: Sequence[int], config: TrainConfig,
             rng: random.Random | None) -> list[list[int]]:
    """Chunks of one group's samples that fit the padded sizes of ``config`` (one jit shape)."""
    by_group: dict[str, list[int]] = {}
    for i in idx:
        by_group.setdefault(ds.samples[i].group, []).append(i)
    out = []
    for _, members in sorted(by_group.items()):
        members = list(members)
        if rng is not None:
            rng.shuffle(members)
        cur: list[int] = []
        nodes = edges = 0
        for i in members:
            g = ds.features(i)
            n, e = g.nodes.shape[0], g.edges.shape[0]
            if cur and (nodes + n + 1 > config.node_budget or edges + e > 2 * config.node_budget
                        or len(cur) >= config.batch):
                out.append(cur)
                cur, nodes, edges = [], 0, 0
            cur.append(i)
            nodes, edges = nodes + n, edges + e
        if cur:
            out.append(cur)
    if rng is not None:
        rng.shuffle(out)
    return out


def _targets(ds: Dataset, idx: Sequence[int], n_graph: int) -> tuple[np.ndarray, np.ndarray]:
    abs_t = np.zeros(n_graph, np.float32)
    rel_t = np.zeros(n_graph, np.float32)
    for j, i in enumerate(idx):
        s = ds.samples[i]
        abs_t[j] = math.log(s.norm_ms * 1e-3)
        rel_t[j] = math.log(s.median_ms / s.ref_ms)
    return abs_t, rel_t


def _set_stats(model: Any, ds: Dataset, idx: Sequence[int]) -> None:
    import jax.numpy as jnp

    gs = [ds.features(i) for i in idx]
    nodes = np.concatenate([g.nodes for g in gs])
    edges = np.concatenate([g.edges for g in gs]) if any(g.edges.size for g in gs) else np.zeros((1, 2))
    glob = np.concatenate([g.globals for g in gs])
    def std(a: np.ndarray) -> np.ndarray:  # a feature constant in training stays unscaled
        sd = a.std(0)
        return np.where(sd < 1e-2, 1.0, sd)

    model.node_mean[...] = jnp.asarray(nodes.mean(0))
    model.node_std[...] = jnp.asarray(std(nodes))
    model.edge_mean[...] = jnp.asarray(edges.mean(0))
    model.edge_std[...] = jnp.asarray(std(edges))
    model.glob_mean[...] = jnp.asarray(glob.mean(0))
    model.glob_std[...] = jnp.asarray(std(glob))
    per_node = [math.log(ds.samples[i].norm_ms * 1e-3 / max(1, ds.features(i).nodes.shape[0])) for i in idx]
    model.target_mean[...] = jnp.asarray(float(np.mean(per_node)), dtype=jnp.float32)


def loss_fn(model: Any, g: F.GraphsTuple, abs_t: Any, rel_t: Any, config: TrainConfig) -> Any:
    """The training loss of one batch (one group's samples; padding graphs masked)."""
    import jax
    import jax.numpy as jnp

    from gnn.model import graph_log_time

    k_log, rel = model(g)
    m = g.graph_mask
    n = jnp.maximum(m.sum(), 1.0)
    abs_loss = (m * (graph_log_time(k_log, g) - abs_t) ** 2).sum() / n
    mse = (m * (rel - rel_t) ** 2).sum() / n
    pair = m[:, None] * m[None, :] * (rel_t[:, None] < rel_t[None, :])
    margin = jax.nn.softplus(-(rel[None, :] - rel[:, None]) * config.rank_scale)
    rank = (pair * margin).sum() / jnp.maximum(pair.sum(), 1.0)
    w_mse = 1.0 if config.loss in ("mse", "both") else 0.1
    w_rank = 1.0 if config.loss in ("rank", "both") else 0.0
    return 0.5 * abs_loss + w_mse * mse + w_rank * rank


_STEPS: dict[tuple[Any, ...], Callable[..., Any]] = {}


_TX: dict[tuple[float, float], Any] = {}


def _tx(lr: float, weight_decay: float) -> Any:
    """adamw with gradient clipping, one object per setting (the optimizer is static under jit,
    so sharing it lets every fit reuse the compiled step)."""
    import optax

    key = (lr, weight_decay)
    if key not in _TX:
        _TX[key] = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, weight_decay=weight_decay))
    return _TX[key]


def _train_step(config: TrainConfig) -> Callable[..., Any]:
    """The jitted train step for the loss settings of ``config`` (shared across fits, so
    leave-one-model-out runs reuse one compile per shape)."""
    key = (config.loss, config.rank_scale)
    if key not in _STEPS:
        from flax import nnx

        @nnx.jit
        def step(model: Any, opt: Any, g: F.GraphsTuple, abs_t: Any, rel_t: Any) -> Any:
            loss, grads = nnx.value_and_grad(loss_fn)(model, g, abs_t, rel_t, config)
            opt.update(model, grads)
            return loss

        _STEPS[key] = step
    return _STEPS[key]


def fit(ds: Dataset, train_idx: Sequence[int], val_idx: Sequence[int], config: TrainConfig = TrainConfig(), *,
        progress: bool = False, log: Callable[[str], None] | None = None,
        init_model: Any = None) -> tuple[Any, dict[str, Any]]:
    """Trains a model; returns (model with the best validation parameters, history).

    ``init_model`` continues training a copy of that model (its normalisation kept).

    Raises:
      ValueError: for an empty training set.
    """
    from flax import nnx

    from gnn import metrics
    from gnn.model import CostGNN

    if not train_idx:
        raise ValueError("fit: the training set is empty")
    rng = random.Random(config.seed)
    if init_model is not None:
        model = nnx.clone(init_model)
    else:
        model = CostGNN(hidden=config.hidden, edge_hidden=config.edge_hidden, layers=config.layers,
                        opcode_dim=config.opcode_dim, rngs=nnx.Rngs(config.seed))
        _set_stats(model, ds, train_idx)
    opt = nnx.Optimizer(model, _tx(config.lr, config.weight_decay), wrt=nnx.Param)

    step = _train_step(config)

    def val_score() -> float:
        if not val_idx:
            return float("nan")
        _, rel = predict(model, [ds.features(i) for i in val_idx], node_budget=config.node_budget)
        return metrics.ranking_metrics(ds, val_idx, rel)["tau"]

    val_groups = [ds.samples[i].group for i in val_idx]
    why_no_tau = ("predicted or measured times constant within every validation group"
                  if any(val_groups.count(g) >= 2 for g in set(val_groups)) else "no validation group of 2 or more samples")
    history: dict[str, Any] = {"loss": [], "val_tau": [], "best_epoch": -1}
    best, best_state, bad = -math.inf, None, 0
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("training", total=config.epochs)
    try:
        for epoch in range(config.epochs):
            losses = []
            for b in _batches(ds, train_idx, config, rng):
                g = make_batch([ds.features(i) for i in b], config.batch + 1, config.node_budget)
                abs_t, rel_t = _targets(ds, b, config.batch + 1)
                losses.append(float(step(model, opt, g, abs_t, rel_t)))
            tau = val_score()
            history["loss"].append(float(np.mean(losses)))
            history["val_tau"].append(tau)
            shown = f"{tau:.3f}" if math.isfinite(tau) else f"undefined ({why_no_tau})"
            if log:
                log(f"epoch {epoch}: loss {np.mean(losses):.4f} val tau {shown}")
            if bar is not None:
                bar.update(task, advance=1, description=f"loss {np.mean(losses):.3f} val tau {shown}")
            score = tau if math.isfinite(tau) else -float(np.mean(losses))
            if score > best:
                best, bad, history["best_epoch"] = score, 0, epoch
                best_state = nnx.clone(nnx.state(model))
            else:
                bad += 1
                if bad >= config.patience:
                    break
    finally:
        if bar is not None:
            bar.stop()
    if best_state is not None:
        nnx.update(model, best_state)
    return model, history

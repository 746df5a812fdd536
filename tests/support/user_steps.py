"""Training steps written the way public JAX training code writes them: the corpus disco reads.

Each entry follows one public file or idiom (its ``source``) and keeps that code's shape: how it
builds the state, how it jits the step (``nnx.jit``, ``jax.jit`` with static arguments, donation,
``None`` or ``PartitionSpec`` shardings, ``jax.pmap``, ``jax.shard_map``) and how it calls it. The
models are tiny (two layers, widths 16-64, batches of 16-32, sequences of 8) so that each compiles
in a second or two on 8 virtual CPU devices; parameters are replicated everywhere (pure data
parallelism, or a second mesh axis of size 1 or one the parameters ignore).

``CORPUS`` maps a name to its ``make_<name>()``, which builds fresh objects on every call from fixed
seeds. ``REFUSED`` maps a name to ``(make, regex)``: a step disco must refuse, and what the error
must name; :data:`JAX_REFUSED` names those that jax itself refuses when the step is called.

Steps whose ``jax.jit`` takes bare ``PartitionSpec``\\ s (EasyLM's, the JAX docs') need the mesh in
context when called: their ``advance`` enters ``jax.set_mesh(mesh)`` around the call, as the user's
loop does (:data:`NEEDS_MESH_CONTEXT`; the mesh is the one their arguments live on).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import jax_utils, nnx, struct
from flax.training import common_utils, train_state
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P


class UserStep(NamedTuple):
    """One training step as its user writes, jits and calls it.

    Attributes:
      name: the corpus key.
      source: the public file or idiom it follows.
      step: the step exactly as the user jits it (an ``nnx.jit``, ``jax.jit`` or ``jax.pmap`` object).
      args: the example call's positional arguments.
      kwargs: and its keyword arguments.
      advance: ``advance(fn, args, kwargs) -> (args, kwargs)``: one training step with ``fn`` called
        exactly as the user calls ``step``; the next step's arguments (for nnx the same objects,
        updated in place).
      params: ``params(args, kwargs)``: the parameters (a pytree of arrays) to compare.
      dtype: the compute dtype, ``"float32"`` or ``"bfloat16"`` (sets the comparison tolerance).
      donated: the positional indices the user's jit donates (``()`` if none).
      style: ``"nnx"``, ``"jit"``, ``"jit-static"``, ``"pmap"`` or ``"shard_map"``.
    """

    name: str
    source: str
    step: Callable
    args: tuple
    kwargs: dict
    advance: Callable
    params: Callable
    dtype: str
    donated: tuple
    style: str


# ----------------------------------------------------------------------------------------------
# Shared pieces: meshes, data, small models.
# ----------------------------------------------------------------------------------------------


def _mesh(shape: tuple[int, ...], names: tuple[str, ...], devices=None):
    """A mesh with Auto axes (GSPMD propagates shardings), as the flax and maxtext examples make."""
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=devices if devices is not None else jax.devices()[:int(np.prod(shape))])


def _classification(seed: int, n: int = 32, features: int = 16, classes: int = 10):
    """Inputs ``f32[n, features]`` and integer labels ``i32[n]``."""
    kx, ky = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (n, features)), jax.random.randint(ky, (n,), 0, classes)


def _images(seed: int, n: int = 32, size: int = 8, channels: int = 3, classes: int = 10):
    """Images ``f32[n, size, size, channels]`` and labels, as numpy (an input pipeline's output)."""
    rs = np.random.RandomState(seed)
    return (rs.normal(size=(n, size, size, channels)).astype(np.float32),
            rs.randint(0, classes, size=(n,)).astype(np.int32))


def _tokens(seed: int, n: int = 16, length: int = 8, vocab: int = 32) -> np.ndarray:
    """Token ids ``i32[n, length]`` in ``[1, vocab)`` (0 is padding), as numpy."""
    return np.random.RandomState(seed).randint(1, vocab, size=(n, length)).astype(np.int32)


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


class _MLP(nn.Module):
    """A linen MLP classifier; ``dtype`` the compute dtype (parameters stay float32)."""

    widths: tuple[int, ...] = (32, 32)
    classes: int = 10
    dtype: Any = None
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x, train: bool = True):
        for width in self.widths:
            x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
            if self.dropout_rate:
                x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return nn.Dense(self.classes, dtype=self.dtype)(x).astype(jnp.float32)


def _replicated_tree(mesh, tree):
    """A NamedSharding ``P()`` for every leaf of ``tree``: the state's shardings on a data mesh."""
    replicated = NamedSharding(mesh, P())
    return jax.tree.map(lambda _: replicated, tree)


def _numpy(tree):
    return jax.tree.map(np.asarray, tree)


def _thread_state(fn, args, kwargs):
    """The common loop ``state, metrics = step(state, *rest)``: the new state replaces ``args[0]``."""
    out = fn(*args, **kwargs)
    return (out[0], *args[1:]), kwargs


def _state_params(args, kwargs):
    return args[0].params


def _replica0_params(args, kwargs):
    return jax.tree.map(lambda x: x[0], args[0].params)


# ----------------------------------------------------------------------------------------------
# flax NNX.
# ----------------------------------------------------------------------------------------------


class _NnxMLP(nnx.Module):
    def __init__(self, din: int, dhidden: int, dout: int, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dout, rngs=rngs)

    def __call__(self, x):
        return self.linear2(nnx.relu(self.linear1(x)))


class _NnxCNN(nnx.Module):
    """The MNIST tutorial's CNN, shrunk: a conv, pooling, dropout, two linear layers."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(3, 8, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(4 * 4 * 8, 32, rngs=rngs)
        self.dropout = nnx.Dropout(rate=0.1, rngs=rngs)
        self.linear2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = x.reshape(x.shape[0], -1)
        return self.linear2(self.dropout(nnx.relu(self.linear1(x))))


def _nnx_place(mesh, *objs):
    """flax's NNX data-parallel guide: every object's state put replicated on the mesh, in place."""
    replicated = NamedSharding(mesh, P())
    for obj in objs:
        nnx.update(obj, jax.device_put(nnx.state(obj), replicated))


def _nnx_advance(fn, args, kwargs):
    fn(*args, **kwargs)
    return args, kwargs


def _nnx_params(args, kwargs):
    return nnx.to_pure_dict(nnx.state(args[0], nnx.Param))


def make_nnx_stateful() -> UserStep:
    mesh = _mesh((8,), ("data",))
    model = _NnxMLP(16, 32, 10, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    _nnx_place(mesh, model, optimizer)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return _xent(model(x), y)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    x, y = jax.device_put(_classification(1), NamedSharding(mesh, P("data")))
    return UserStep("nnx_stateful", "google/flax docs_nnx/guides/flax_gspmd.ipynb (nnx.jit, nnx.Optimizer)",
                    train_step, (model, optimizer, x, y), {}, _nnx_advance, _nnx_params, "float32", (), "nnx")


def make_nnx_mnist_metrics_dropout() -> UserStep:
    mesh = _mesh((8,), ("data",))
    model = _NnxCNN(rngs=nnx.Rngs(params=0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(5e-3, 0.9), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    _nnx_place(mesh, model, optimizer, metrics)
    model.train()

    def loss_fn(model, batch):
        logits = model(batch["image"])
        return _xent(logits, batch["label"]), logits

    @nnx.jit
    def train_step(model, optimizer, metrics, batch):
        grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
        (loss, logits), grads = grad_fn(model, batch)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])
        optimizer.update(model, grads)

    image, label = _images(2)
    batch = jax.device_put({"image": image, "label": label}, NamedSharding(mesh, P("data")))
    return UserStep("nnx_mnist_metrics_dropout",
                    "google/flax docs_nnx/mnist_tutorial.ipynb (nnx.MultiMetric, nnx.Dropout with Rngs(dropout=))",
                    train_step, (model, optimizer, metrics, batch), {}, _nnx_advance, _nnx_params, "float32",
                    (), "nnx")


def make_nnx_donate() -> UserStep:
    mesh = _mesh((8,), ("data",))
    model = _NnxMLP(16, 64, 10, rngs=nnx.Rngs(3))
    optimizer = nnx.Optimizer(model, optax.sgd(5e-2, momentum=0.9), wrt=nnx.Param)
    _nnx_place(mesh, model, optimizer)

    @functools.partial(nnx.jit, donate_argnums=(0, 1))
    def train_step(model, optimizer, batch):
        x, y = batch

        def loss_fn(model):
            return _xent(model(x), y)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    batch = jax.device_put(_classification(4), NamedSharding(mesh, P("data")))
    return UserStep("nnx_donate", "google/flax flax/nnx/transforms/compilation.py (nnx.jit donate_argnums)",
                    train_step, (model, optimizer, batch), {}, _nnx_advance, _nnx_params, "float32", (0, 1), "nnx")


# ----------------------------------------------------------------------------------------------
# flax linen + TrainState under jax.jit (GSPMD).
# ----------------------------------------------------------------------------------------------


@struct.dataclass
class TransformerConfig:
    """lm1b's TransformerConfig: a frozen (hashable) dataclass, passed to the step as a static argument."""

    vocab_size: int = 32
    emb_dim: int = 32
    num_heads: int = 2
    num_layers: int = 2
    mlp_dim: int = 64
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    dtype: Any = jnp.bfloat16
    deterministic: bool = False


class _DecoderBlock(nn.Module):
    config: TransformerConfig

    @nn.compact
    def __call__(self, x, mask):
        c = self.config
        y = nn.LayerNorm(dtype=c.dtype)(x)
        y = nn.MultiHeadDotProductAttention(
            num_heads=c.num_heads, dtype=c.dtype, qkv_features=c.emb_dim, broadcast_dropout=False,
            dropout_rate=c.attention_dropout_rate, deterministic=c.deterministic)(y, mask=mask)
        x = x + nn.Dropout(rate=c.dropout_rate)(y, deterministic=c.deterministic)
        z = nn.LayerNorm(dtype=c.dtype)(x)
        z = nn.Dense(c.emb_dim, dtype=c.dtype)(nn.relu(nn.Dense(c.mlp_dim, dtype=c.dtype)(z)))
        return x + nn.Dropout(rate=c.dropout_rate)(z, deterministic=c.deterministic)


class TransformerLM(nn.Module):
    """lm1b's decoder-only LM, shrunk: embeddings, learned positions, decoder blocks, a tied head."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs):
        c = self.config
        mask = nn.combine_masks(nn.make_attention_mask(inputs > 0, inputs > 0), nn.make_causal_mask(inputs))
        embed = nn.Embed(c.vocab_size, c.emb_dim, embedding_init=nn.initializers.normal(stddev=1.0))
        x = embed(jnp.pad(inputs, ((0, 0), (1, 0)))[:, :-1])  # shift right
        x = x + self.param("pos_embedding", nn.initializers.normal(stddev=0.02), (1, inputs.shape[1], c.emb_dim))
        x = nn.Dropout(rate=c.dropout_rate)(x.astype(c.dtype), deterministic=c.deterministic)
        for i in range(c.num_layers):
            x = _DecoderBlock(c, name=f"encoderdecoderblock_{i}")(x, mask)
        x = nn.LayerNorm(dtype=c.dtype, name="encoderdecoder_norm")(x)
        return embed.attend(x.astype(jnp.float32))


def _weighted_cross_entropy(logits, targets, weights):
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights
    return loss.sum(), weights.sum()


def _lm1b_train_step(state, batch, config, learning_rate_fn, label_smoothing=0.0, dropout_rng=None):
    """lm1b's train_step (jit version): dropout rng folded with the step, weighted cross-entropy."""
    del label_smoothing  # lm1b smooths the targets; the corpus keeps the argument, static
    inputs = batch["inputs"]
    weights = jnp.where(inputs > 0, 1, 0).astype(jnp.float32)
    dropout_rng = jax.random.fold_in(dropout_rng, state.step)

    def loss_fn(params):
        logits = TransformerLM(config).apply({"params": params}, inputs, rngs={"dropout": dropout_rng})
        loss, weight_sum = _weighted_cross_entropy(logits, inputs, weights)
        return loss / weight_sum, logits

    step = state.step
    lr = learning_rate_fn(step)
    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    new_state = state.apply_gradients(grads=grads)
    accuracy = (jnp.argmax(logits, -1) == inputs).astype(jnp.float32) * weights
    metrics = {"loss": loss, "accuracy": accuracy.sum() / weights.sum(), "learning_rate": lr}
    return new_state, metrics


def make_linen_lm1b() -> UserStep:
    mesh = _mesh((8,), ("data",))
    config = TransformerConfig()
    learning_rate_fn = optax.join_schedules(
        [optax.linear_schedule(init_value=0.0, end_value=3e-3, transition_steps=2),
         lambda count: 3e-3 * (count + 2) ** -0.5 * 2 ** 0.5], boundaries=[2])
    tokens = _tokens(5)
    m = TransformerLM(config.replace(deterministic=True))
    initial_variables = jax.jit(m.init)(jax.random.PRNGKey(0), jnp.ones(tokens.shape, jnp.int32))
    tx = optax.adamw(learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1)
    state = train_state.TrainState.create(apply_fn=m.apply, params=initial_variables["params"], tx=tx)
    state_shardings = _replicated_tree(mesh, state)
    data_sharding = NamedSharding(mesh, P("data"))
    state = jax.device_put(state, state_shardings)
    jit_train_step = jax.jit(
        _lm1b_train_step,
        in_shardings=(state_shardings, data_sharding, None),
        out_shardings=(state_shardings, None),
        static_argnums=(2, 3, 4),
        donate_argnums=0)
    batch = jax.device_put({"inputs": tokens}, data_sharding)
    dropout_rng = jax.random.PRNGKey(1)
    return UserStep("linen_lm1b", "google/flax examples/lm1b/train.py (jax.jit, static_argnums=(2, 3, 4))",
                    jit_train_step, (state, batch, config, learning_rate_fn, 0.0, dropout_rng), {},
                    _thread_state, _state_params, "bfloat16", (0,), "jit-static")


class _TrainStateBN(train_state.TrainState):
    batch_stats: Any = None


class _TinyResNet(nn.Module):
    """A conv, BatchNorm, a residual block and a head: flax's ImageNet ResNet, shrunk."""

    classes: int = 10
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = True):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                                 dtype=self.dtype)
        x = nn.relu(norm(name="bn_init")(nn.Conv(8, (3, 3), use_bias=False, dtype=self.dtype, name="conv_init")(x)))
        y = nn.Conv(8, (3, 3), use_bias=False, dtype=self.dtype)(x)
        x = nn.relu(x + norm(scale_init=nn.initializers.zeros)(y))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.classes, dtype=self.dtype)(x).astype(jnp.float32)


# ----------------------------------------------------------------------------------------------
# EasyLM: regex partition rules, TrainState, donate (0, 1), batch constrained inside.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LLaMAConfig:
    vocab_size: int = 32
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    resid_pdrop: float = 0.1
    bos_token_id: int = 1

    @staticmethod
    def get_partition_rules():
        """EasyLM's LLaMA rules: on a ("dp", "fsdp", "mp") = (8, 1, 1) mesh every spec names only axes
        of size 1, so each parameter is whole on every device."""
        return (
            ("transformer/wte/embedding", P("mp", "fsdp")),
            ("attention/(wq|wk|wv)/kernel", P("fsdp", "mp")),
            ("attention/wo/kernel", P("mp", "fsdp")),
            ("feed_forward/w1/kernel", P("fsdp", "mp")),
            ("feed_forward/w2/kernel", P("mp", "fsdp")),
            ("feed_forward/w3/kernel", P("fsdp", "mp")),
            ("attention_norm/kernel", P(None)),
            ("ffn_norm/kernel", P(None)),
            ("transformer/ln_f/kernel", P(None)),
            ("lm_head/kernel", P("fsdp", "mp")),
            (".*", P(None)),
        )

    @staticmethod
    def get_weight_decay_exclusions():
        return ("attention_norm/kernel", "ffn_norm/kernel", "transformer/ln_f/kernel")


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _named_tree_map(f, tree):
    """EasyLM's named_tree_map: ``f(name, leaf)`` with the leaf's path joined by ``/``."""
    return jax.tree_util.tree_map_with_path(lambda path, x: f("/".join(_key_name(k) for k in path), x), tree)


def _match_partition_rules(rules, tree):
    """EasyLM's match_partition_rules: the first rule whose regex finds the leaf's name; scalars P()."""

    def get_partition_spec(name, leaf):
        if len(leaf.shape) == 0 or np.prod(leaf.shape) == 1:
            return P()
        for rule, ps in rules:
            if re.search(rule, name) is not None:
                return ps
        raise ValueError(f"Partition rule not found for param: {name}")

    return _named_tree_map(get_partition_spec, tree)


def _easylm_with_sharding_constraint(x, partition_specs):
    """EasyLM's jax_utils.with_sharding_constraint: a constraint only where the mesh in context names
    every axis of the spec (none at init, outside the mesh)."""
    names = {a for part in partition_specs if part is not None for a in ((part,) if isinstance(part, str) else part)}
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not names <= set(mesh.axis_names):
        return x
    return lax.with_sharding_constraint(x, partition_specs)


class _RMSNorm(nn.Module):
    eps: float = 1e-6

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.ones, (x.shape[-1],))
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps) * kernel


class _LlamaBlock(nn.Module):
    """A LLaMA block, its parameters named as EasyLM's: ``h/<i>/attention/wq``, ``h/<i>/feed_forward/w1``."""

    config: LLaMAConfig

    @nn.compact
    def __call__(self, x, deterministic):
        c = self.config
        x = x + _LlamaAttention(c, name="attention")(_RMSNorm(name="attention_norm")(x), deterministic)
        return x + _LlamaMLP(c, name="feed_forward")(_RMSNorm(name="ffn_norm")(x), deterministic)


class _LlamaAttention(nn.Module):
    config: LLaMAConfig

    @nn.compact
    def __call__(self, h, deterministic):
        c = self.config
        heads, head_dim = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        # EasyLM's llama_model.py constrains q, k and v to the batch over ("dp", "fsdp") (on an fsdp mesh
        # the activations stay batch-sharded and the weights are gathered)
        q, k, v = (_easylm_with_sharding_constraint(nn.Dense(c.hidden_size, use_bias=False, name=f"w{n}")(h),
                                                    P(("dp", "fsdp"), None, "mp")).reshape(*h.shape[:2], heads, head_dim)
                   for n in "qkv")
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
        causal = jnp.tril(jnp.ones((h.shape[1], h.shape[1]), bool))
        attn = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(h.shape)
        return nn.Dropout(c.resid_pdrop)(nn.Dense(c.hidden_size, use_bias=False, name="wo")(out),
                                         deterministic=deterministic)


class _LlamaMLP(nn.Module):
    config: LLaMAConfig

    @nn.compact
    def __call__(self, h, deterministic):
        c = self.config
        h = nn.Dense(c.hidden_size, use_bias=False, name="w2")(
            nn.silu(nn.Dense(c.intermediate_size, use_bias=False, name="w1")(h))
            * nn.Dense(c.intermediate_size, use_bias=False, name="w3")(h))
        return nn.Dropout(c.resid_pdrop)(h, deterministic=deterministic)


class _LlamaBlocks(nn.Module):
    config: LLaMAConfig

    @nn.compact
    def __call__(self, x, deterministic):
        for i in range(self.config.num_hidden_layers):
            x = _LlamaBlock(self.config, name=str(i))(x, deterministic)
        return x


class _LlamaTransformer(nn.Module):
    config: LLaMAConfig

    @nn.compact
    def __call__(self, input_ids, deterministic):
        c = self.config
        x = nn.Embed(c.vocab_size, c.hidden_size, name="wte")(input_ids)
        x = _LlamaBlocks(c, name="h")(x, deterministic)
        return _RMSNorm(name="ln_f")(x)


class FlaxLLaMAForCausalLMModule(nn.Module):
    config: LLaMAConfig

    @nn.compact
    def __call__(self, input_ids, deterministic: bool = True):
        x = _LlamaTransformer(self.config, name="transformer")(input_ids, deterministic)
        return nn.Dense(self.config.vocab_size, use_bias=False, name="lm_head")(x)


def _cross_entropy_loss_and_accuracy(logits, tokens, valid):
    """EasyLM's cross_entropy_loss_and_accuracy: token-mean loss and accuracy over the valid tokens."""
    valid = valid.astype(jnp.float32)
    valid_length = jnp.maximum(jnp.sum(valid, axis=-1), 1e-10)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token_logp = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    token_logp = jnp.where(valid > 0.0, token_logp, 0.0)
    loss = -jnp.mean(jnp.sum(token_logp, axis=-1) / valid_length)
    correct = jnp.where(valid > 0.0, jnp.argmax(logits, axis=-1) == tokens, False)
    accuracy = jnp.mean(jnp.sum(correct, axis=-1) / valid_length)
    return loss, accuracy


def make_easylm_llama(mesh_dim: tuple[int, int, int] = (8, 1, 1), name: str = "easylm_llama",
                      source: str = "young-geng/EasyLM EasyLM/models/llama/llama_train.py (regex partition rules, "
                                    "donate (0, 1))", llama_config: LLaMAConfig | None = None) -> UserStep:
    """EasyLM's llama_train.py; ``mesh_dim`` its ``--mesh_dim`` ``(dp, fsdp, mp)`` (here ``'8,1,1'``: every
    parameter whole; tests/support/sharded_user_steps.py uses its default ``'1,-1,1'``)."""
    devices = np.array(jax.devices()[:int(np.prod(mesh_dim))]).reshape(mesh_dim)
    mesh = jax.sharding.Mesh(devices, ("dp", "fsdp", "mp"))  # EasyLM's get_jax_mesh(mesh_dim)
    llama_config = llama_config or LLaMAConfig()
    model = FlaxLLaMAForCausalLMModule(llama_config)
    seq_length = 8

    def get_weight_decay_mask(exclusions):
        def decay(name, _):
            return not any(re.search(rule, name) is not None for rule in exclusions)

        return lambda params: _named_tree_map(decay, params)

    schedule = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=3e-3, warmup_steps=1, decay_steps=10,
                                                  end_value=3e-4)
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=schedule, weight_decay=0.1, b1=0.9, b2=0.95,
                    mask=get_weight_decay_mask(LLaMAConfig.get_weight_decay_exclusions())))

    def init_fn(rng):
        params = model.init(input_ids=jnp.zeros((4, seq_length), dtype=jnp.int32), rngs={"params": rng})
        return train_state.TrainState.create(params=params, tx=optimizer, apply_fn=None)

    def train_step(train_state, rng, batch):
        rng, dropout_rng = jax.random.split(rng)
        tokens = lax.with_sharding_constraint(batch["tokens"], P(("dp", "fsdp")))
        loss_masks = lax.with_sharding_constraint(batch["loss_masks"], P(("dp", "fsdp")))

        def loss_and_accuracy(params):
            bos_tokens = jnp.full((tokens.shape[0], 1), llama_config.bos_token_id, dtype=jnp.int32)
            inputs = jnp.concatenate([bos_tokens, tokens[:, :-1]], axis=1)
            logits = model.apply(params, inputs, deterministic=False, rngs={"dropout": dropout_rng})
            return _cross_entropy_loss_and_accuracy(logits, tokens, loss_masks)

        grad_fn = jax.value_and_grad(loss_and_accuracy, has_aux=True)
        (loss, accuracy), grads = grad_fn(train_state.params)
        train_state = train_state.apply_gradients(grads=grads)
        metrics = dict(loss=loss, accuracy=accuracy, learning_rate=schedule(train_state.step),
                       gradient_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(train_state.params))
        return train_state, rng, metrics

    train_state_shapes = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
    train_state_partition = _match_partition_rules(LLaMAConfig.get_partition_rules(), train_state_shapes)
    sharded_init_fn = jax.jit(init_fn, in_shardings=P(), out_shardings=train_state_partition)
    sharded_train_step = jax.jit(
        train_step,
        in_shardings=(train_state_partition, P(), P()),
        out_shardings=(train_state_partition, P(), P()),
        donate_argnums=(0, 1))
    with jax.set_mesh(mesh):  # EasyLM: `with mesh:` (deprecated in jax 0.10)
        state = sharded_init_fn(jax.random.PRNGKey(42))
        sharded_rng = jax.device_put(jax.random.PRNGKey(7), NamedSharding(mesh, P()))
    tokens = _tokens(6, n=16, length=seq_length)
    batch = {"tokens": tokens, "loss_masks": np.ones_like(tokens, dtype=np.float32)}

    def advance(fn, args, kwargs):
        with jax.set_mesh(mesh):
            train_state, rng, _ = fn(*args, **kwargs)
        return (train_state, rng, args[2]), kwargs

    return UserStep(name, source, sharded_train_step, (state, sharded_rng, batch), {}, advance, _state_params, "float32", (0, 1),
                    "jit")


# ----------------------------------------------------------------------------------------------
# big_vision.
# ----------------------------------------------------------------------------------------------


def make_big_vision_update_fn() -> UserStep:
    mesh = _mesh((8,), ("data",))
    model = _MLP(widths=(32, 32), classes=10)
    image, label = _classification(7)
    labels = jax.nn.one_hot(label, 10)
    params = model.init(jax.random.PRNGKey(0), image)["params"]
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=1, decay_steps=10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.add_decayed_weights(1e-4),
                     optax.scale_by_learning_rate(sched))
    repl_sharding = NamedSharding(mesh, P())
    train_state = {"params": params, "opt": tx.init(params)}
    train_state_sharding = _replicated_tree(mesh, train_state)
    train_state = jax.device_put(train_state, train_state_sharding)

    def loss_fn(params, images, labels, rng):
        logits = model.apply({"params": params}, images, rngs={"dropout": rng})
        return optax.sigmoid_binary_cross_entropy(logits, labels).sum(axis=-1).mean()  # big_vision's sigmoid_xent

    @functools.partial(jax.jit, donate_argnums=(0,), out_shardings=(train_state_sharding, repl_sharding))
    def update_fn(train_state, rng, batch):
        images, labels = batch["image"], batch["labels"]
        step_count = optax.tree_utils.tree_get_all_with_path(train_state["opt"], "count")[0][1]  # bv_optax.get_count
        rng = jax.random.fold_in(rng, step_count)
        _, rng_model = jax.random.split(rng, 2)
        params, opt = train_state["params"], train_state["opt"]
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels, rng_model)
        updates, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, updates)
        measurements = {"training_loss": loss, "l2_grads": optax.tree.norm(grads)}
        return {"params": params, "opt": opt}, measurements

    batch = jax.device_put({"image": image, "labels": labels}, NamedSharding(mesh, P("data")))
    rng = jax.random.PRNGKey(3)
    return UserStep("big_vision_update_fn",
                    "google-research/big_vision big_vision/train.py (jax.jit(update_fn, donate_argnums=(0,), "
                    "out_shardings=...))",
                    update_fn, (train_state, rng, batch), {}, _thread_state, lambda a, k: a[0]["params"], "float32",
                    (0,), "jit")


def make_big_vision_pmap() -> UserStep:
    model = _MLP(widths=(32, 32), classes=10, dropout_rate=0.1)
    image, label = _classification(8)
    params = model.init(jax.random.PRNGKey(0), image, train=False)["params"]
    tx = optax.chain(optax.scale_by_adam(), optax.scale(-1e-2))
    n = jax.local_device_count()

    @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0, 1))
    def update_fn(params, opt, rng, images, labels):
        rng, new_rng = jax.random.split(rng)
        rng_model_local = jax.random.fold_in(rng, lax.axis_index("batch"))

        def loss_fn(params, images, labels):
            logits = model.apply({"params": params}, images, rngs={"dropout": rng_model_local})
            return _xent(logits, labels)

        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        loss, grads = lax.pmean((loss, grads), axis_name="batch")
        updates, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, updates)
        return params, opt, new_rng, loss

    params_repl = jax_utils.replicate(params)
    opt_repl = jax_utils.replicate(tx.init(params))
    rngs_loop = jax_utils.replicate(jax.random.PRNGKey(4))
    images, labels = common_utils.shard((np.asarray(image), np.asarray(label)))

    def advance(fn, args, kwargs):
        params, opt, rngs, _ = fn(*args, **kwargs)
        return (params, opt, rngs, *args[3:]), kwargs

    assert images.shape[0] == n
    return UserStep("big_vision_pmap",
                    "google-research/big_vision big_vision/train.py, pmap era (update_fn(params, opt, rng, images, "
                    "labels), donate_argnums=(0, 1))",
                    update_fn, (params_repl, opt_repl, rngs_loop, images, labels), {}, advance,
                    lambda a, k: jax.tree.map(lambda x: x[0], a[0]), "float32", (0, 1), "pmap")


# ----------------------------------------------------------------------------------------------
# optax idioms under jax.jit.
# ----------------------------------------------------------------------------------------------


def _linen_train_step(state, batch):
    def loss_fn(params):
        return _xent(state.apply_fn({"params": params}, batch["x"]), batch["y"])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def _linen_state(mesh, model, tx, seed: int):
    x, y = _classification(seed)
    params = model.init(jax.random.key(0), x)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    state = jax.device_put(state, NamedSharding(mesh, P()))
    batch = jax.device_put({"x": x, "y": y}, NamedSharding(mesh, P("data")))
    return state, batch


def make_optax_multisteps() -> UserStep:
    mesh = _mesh((8,), ("data",))
    tx = optax.MultiSteps(optax.adamw(1e-2), every_k_schedule=2)
    state, batch = _linen_state(mesh, _MLP(), tx, seed=9)
    return UserStep("optax_multisteps", "optax docs gradient accumulation (optax.MultiSteps) with a flax TrainState",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_optax_clip_adamw_cosine() -> UserStep:
    mesh = _mesh((8,), ("data",))
    model = _MLP(widths=(64, 32))
    x, y = _classification(10)
    params = model.init(jax.random.key(0), x)["params"]
    schedule = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=1e-2, warmup_steps=1, decay_steps=10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4))
    params, opt_state = jax.device_put((params, tx.init(params)), NamedSharding(mesh, P()))

    def train_step(params, opt_state, batch):
        inputs, labels = batch
        loss, grads = jax.value_and_grad(lambda p: _xent(model.apply({"params": p}, inputs), labels))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(train_step, donate_argnames=("params", "opt_state"))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))

    def advance(fn, args, kwargs):
        params, opt_state, _ = fn(*args, **kwargs)
        return (params, opt_state, args[2]), kwargs

    return UserStep("optax_clip_adamw_cosine",
                    "optax docs (optax.chain(clip_by_global_norm, adamw(warmup_cosine_decay_schedule))), "
                    "jax.jit(donate_argnames=...)",
                    step, (params, opt_state, batch), {}, advance, lambda a, k: a[0], "float32", (0, 1), "jit")


# ----------------------------------------------------------------------------------------------
# jax.jit with PartitionSpecs under jax.set_mesh, typed keys, 2-D meshes, keywords.
# ----------------------------------------------------------------------------------------------


def _mlp_init(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (m, n)) / np.sqrt(m), "b": jnp.zeros(n)}
            for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)]


def _mlp_apply(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def make_jit_pspec_set_mesh() -> UserStep:
    mesh = _mesh((8,), ("data",))
    x, y = _classification(11)
    params = jax.device_put(_mlp_init(jax.random.key(0), (16, 32, 10)), NamedSharding(mesh, P()))

    def train_step(params, batch, key):
        inputs, labels = batch
        key, dropout_key = jax.random.split(key)

        def loss_fn(params):
            keep = jax.random.bernoulli(dropout_key, 0.9, inputs.shape)
            return _xent(_mlp_apply(params, jnp.where(keep, inputs / 0.9, 0.0)), labels)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        return params, key, loss

    step = jax.jit(train_step, in_shardings=(P(), P("data"), P()), out_shardings=(P(), P(), P()))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    key = jax.random.key(0)

    def advance(fn, args, kwargs):
        with jax.set_mesh(mesh):
            params, key, _ = fn(*args, **kwargs)
        return (params, args[1], key), kwargs

    return UserStep("jit_pspec_set_mesh",
                    "jax docs sharded-computation / distributed arrays (jax.set_mesh, PartitionSpec in/out "
                    "shardings, jax.random.key)",
                    step, (params, batch, key), {}, advance, lambda a, k: a[0], "float32", (), "jit")


def make_jit_explicit_axes() -> UserStep:
    mesh = jax.make_mesh((8,), ("data",))  # jax 0.10's default: Explicit axes
    x, y = _classification(12)
    params = jax.device_put(_mlp_init(jax.random.key(1), (16, 32, 10)), NamedSharding(mesh, P()))
    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))

    @jax.jit
    def train_step(params, batch):
        inputs, labels = batch
        loss, grads = jax.value_and_grad(lambda p: _xent(_mlp_apply(p, inputs), labels))(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    return UserStep("jit_explicit_axes",
                    "jax docs explicit sharding (jax.make_mesh default AxisType.Explicit, arguments placed with "
                    "device_put)",
                    train_step, (params, batch), {}, _thread_state, lambda a, k: a[0], "float32", (), "jit")


def make_mesh_2d_data_model() -> UserStep:
    mesh = _mesh((4, 2), ("data", "model"))
    model = _MLP(widths=(32, 32))
    state, batch = _linen_state(mesh, model, optax.adam(1e-2), seed=13)  # params P(): "model" unused
    return UserStep("mesh_2d_data_model",
                    "google/flax docs_nnx/guides/flax_gspmd (2-D mesh ('data', 'model')), parameters replicated",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_jit_kwargs_static_argnames() -> UserStep:
    mesh = _mesh((8,), ("data",))
    model = _MLP(widths=(32, 32), dropout_rate=0.1)
    state, batch = _linen_state(mesh, model, optax.sgd(0.1, momentum=0.9), seed=14)

    @functools.partial(jax.jit, static_argnames=("train",))
    def train_step(state, batch, train):
        dropout_rng = jax.random.fold_in(jax.random.key(0), state.step)

        def loss_fn(params):
            logits = state.apply_fn({"params": params}, batch["x"], train=train, rngs={"dropout": dropout_rng})
            return _xent(logits, batch["y"])

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    return UserStep("jit_kwargs_static_argnames", "flax linen tutorials: train_step(state, batch=..., train=True) "
                    "with static_argnames=('train',)",
                    train_step, (state,), {"batch": batch, "train": True}, _thread_state, _state_params, "float32",
                    (), "jit-static")


# ----------------------------------------------------------------------------------------------
# Layers under scan and remat.
# ----------------------------------------------------------------------------------------------


class _ScanBlock(nn.Module):
    width: int = 32

    @nn.compact
    def __call__(self, x, _):
        return x + nn.Dense(self.width)(nn.relu(nn.Dense(self.width)(nn.LayerNorm()(x)))), None


class _ScannedMLP(nn.Module):
    layers: int = 2
    width: int = 32

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.width)(x)
        blocks = nn.scan(_ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers)
        x, _ = blocks(self.width, name="layers")(x, None)
        return nn.Dense(10)(x)


def make_linen_scan() -> UserStep:
    mesh = _mesh((8,), ("data",))
    state, batch = _linen_state(mesh, _ScannedMLP(), optax.adam(1e-2), seed=15)
    return UserStep("linen_scan", "flax linen nn.scan over layers (variable_axes={'params': 0}) in a jax.jit step",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_jax_checkpoint_scan() -> UserStep:
    mesh = _mesh((8,), ("data",))
    x, y = _classification(16)
    k_in, k_layers, k_out = jax.random.split(jax.random.key(2), 3)
    width, layers = 32, 2
    params = {
        "w_in": jax.random.normal(k_in, (16, width)) / 4.0,
        "layers": {"w": jax.random.normal(k_layers, (layers, width, width)) / np.sqrt(width),
                   "b": jnp.zeros((layers, width))},
        "w_out": jax.random.normal(k_out, (width, 10)) / np.sqrt(width),
    }
    tx = optax.adam(1e-2)
    state = jax.device_put((params, tx.init(params)), NamedSharding(mesh, P()))

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    def layer(h, p):
        return h + jnp.tanh(h @ p["w"] + p["b"]), None

    def forward(params, x):
        h, _ = lax.scan(layer, x @ params["w_in"], params["layers"])
        return h @ params["w_out"]

    @jax.jit
    def train_step(state, batch):
        params, opt_state = state
        inputs, labels = batch
        loss, grads = jax.value_and_grad(lambda p: _xent(forward(p, inputs), labels))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    return UserStep("jax_checkpoint_scan",
                    "jax docs gradient checkpointing (jax.checkpoint with a policy) over lax.scan of stacked layers",
                    train_step, (state, batch), {}, _thread_state, lambda a, k: a[0][0], "float32", (), "jit")


@dataclasses.dataclass(frozen=True)
class MaxTextConfig:
    """maxtext's config as the step sees it: a hashable static argument."""

    emb_dim: int = 32
    mlp_dim: int = 64
    num_layers: int = 2
    vocab_size: int = 32
    remat_policy: str = "minimal"
    dropout_rate: float = 0.1


class _MaxTextLayer(nn.Module):
    config: MaxTextConfig

    @nn.compact
    def __call__(self, x, deterministic):
        c = self.config
        h = nn.RMSNorm()(x)
        h = nn.Dense(c.emb_dim)(nn.gelu(nn.Dense(c.mlp_dim)(h)))
        return x + nn.Dropout(c.dropout_rate)(h, deterministic=deterministic)


class MaxTextDecoder(nn.Module):
    """maxtext's Decoder, shrunk: each layer under nn.remat with the config's policy."""

    config: MaxTextConfig

    @nn.compact
    def __call__(self, tokens, deterministic: bool = False):
        c = self.config
        policy = {"minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
                  "full": jax.checkpoint_policies.nothing_saveable}[c.remat_policy]
        remat_layer = nn.remat(_MaxTextLayer, policy=policy, static_argnums=(2,))
        embed = nn.Embed(c.vocab_size, c.emb_dim, name="token_embedder")
        x = embed(tokens)
        for i in range(c.num_layers):
            x = remat_layer(c, name=f"layers_{i}")(x, deterministic)
        return nn.Dense(c.vocab_size, name="logits_dense")(nn.RMSNorm(name="decoder_norm")(x))


def _maxtext_train_step(model, config, state, data, dropout_rng):
    """maxtext's train_step(model, config, state, data, dropout_rng): model and config static."""
    rng = jax.random.fold_in(dropout_rng, state.step)

    def loss_fn(params):
        logits = model.apply({"params": params}, data["inputs"], rngs={"dropout": rng})
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, data["targets"])
        return jnp.sum(xent * data["targets_segmentation"]) / jnp.sum(data["targets_segmentation"])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    new_state = state.apply_gradients(grads=grads)
    metrics = {"scalar": {"learning/loss": loss, "learning/grad_norm": optax.tree.norm(grads)}}
    return new_state, metrics


def make_maxtext_static_argnums() -> UserStep:
    mesh = _mesh((8, 1, 1), ("data", "fsdp", "tensor"))
    config = MaxTextConfig()
    model = MaxTextDecoder(config)
    tokens = _tokens(17)
    params = model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, tokens)["params"]
    tx = optax.adamw(optax.linear_schedule(1e-3, 3e-3, 4), b1=0.9, b2=0.95, weight_decay=0.1)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    state_mesh_shardings = _replicated_tree(mesh, state)
    data_sharding = NamedSharding(mesh, P(("data", "fsdp")))
    state = jax.device_put(state, state_mesh_shardings)
    p_train_step = jax.jit(
        _maxtext_train_step,
        in_shardings=(state_mesh_shardings, data_sharding, None),
        out_shardings=(state_mesh_shardings, None),
        static_argnums=(0, 1),
        donate_argnums=2)
    data = jax.device_put({"inputs": tokens, "targets": np.roll(tokens, -1, axis=1),
                           "targets_segmentation": np.ones_like(tokens)}, data_sharding)
    rng = jax.random.PRNGKey(2)

    def advance(fn, args, kwargs):
        state, _ = fn(*args, **kwargs)
        return (args[0], args[1], state, *args[3:]), kwargs

    return UserStep("maxtext_static_argnums",
                    "AI-Hypercomputer/maxtext MaxText/train.py (jax.jit(train_step, static_argnums=(0, 1), "
                    "donate_argnums=2), mesh ('data', 'fsdp', 'tensor') = (8, 1, 1), nn.remat layers)",
                    p_train_step, (model, config, state, data, rng), {}, advance, lambda a, k: a[2].params,
                    "float32", (2,), "jit-static")


# ----------------------------------------------------------------------------------------------
# pmap.
# ----------------------------------------------------------------------------------------------


def _imagenet_train_step(state, batch, learning_rate_fn):
    """flax ImageNet's train_step: grads and batch statistics pmean'd over "batch", metrics too."""

    def loss_fn(params):
        logits, new_model_state = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, batch["image"], mutable=["batch_stats"])
        loss = _xent(logits, batch["label"])
        weight_penalty_params = jax.tree.leaves(params)
        weight_l2 = sum(jnp.sum(x ** 2) for x in weight_penalty_params if x.ndim > 1)
        return loss + 1e-4 * 0.5 * weight_l2, (new_model_state, logits)

    lr = learning_rate_fn(state.step)
    aux, grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads = lax.pmean(grads, axis_name="batch")
    new_model_state, logits = aux[1]
    metrics = lax.pmean({"loss": aux[0], "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"]),
                         "learning_rate": lr}, axis_name="batch")
    new_state = state.apply_gradients(grads=grads,
                                      batch_stats=lax.pmean(new_model_state["batch_stats"], axis_name="batch"))
    return new_state, metrics


def _pmap_image_step(name, source, dtype, seed):
    model = _TinyResNet(dtype=jnp.bfloat16 if dtype == "bfloat16" else jnp.float32)
    image, label = _images(seed)
    variables = jax.jit(functools.partial(model.init, train=False))(jax.random.PRNGKey(0), image[:1])
    learning_rate_fn = optax.warmup_cosine_decay_schedule(0.0, 0.1, warmup_steps=1, decay_steps=10)
    state = _TrainStateBN.create(apply_fn=model.apply, params=variables["params"],
                                 tx=optax.sgd(learning_rate_fn, momentum=0.9, nesterov=True),
                                 batch_stats=variables["batch_stats"])
    state = jax_utils.replicate(state)
    p_train_step = jax.pmap(functools.partial(_imagenet_train_step, learning_rate_fn=learning_rate_fn),
                            axis_name="batch")
    batch = common_utils.shard({"image": image, "label": label})
    return UserStep(name, source, p_train_step, (state, batch), {}, _thread_state, _replica0_params, dtype, (), "pmap")


def make_pmap_imagenet_batchnorm() -> UserStep:
    return _pmap_image_step("pmap_imagenet_batchnorm",
                            "google/flax examples/imagenet/train.py (jax.pmap(train_step, axis_name='batch'), "
                            "BatchNorm batch_stats, jax_utils.replicate)", "float32", seed=18)


def make_pmap_half_precision() -> UserStep:
    return _pmap_image_step("pmap_half_precision",
                            "google/flax examples/imagenet/train.py with config.half_precision (model dtype "
                            "bfloat16, float32 parameters)", "bfloat16", seed=19)


# ----------------------------------------------------------------------------------------------
# shard_map.
# ----------------------------------------------------------------------------------------------


def make_shard_map_pmean() -> UserStep:
    mesh = _mesh((8,), ("data",))
    x, y = _classification(20)
    params = jax.device_put(_mlp_init(jax.random.key(3), (16, 32, 10)), NamedSharding(mesh, P()))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()), check_vma=False)
    def train_step(params, batch):
        inputs, labels = batch
        loss, grads = jax.value_and_grad(lambda p: _xent(_mlp_apply(p, inputs), labels))(params)
        loss, grads = lax.pmean((loss, grads), "data")
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    batch = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    return UserStep("shard_map_pmean",
                    "jax docs shard_map (jax.shard_map, check_vma=False, grads lax.pmean'd over 'data': the pmap "
                    "migration)",
                    train_step, (params, batch), {}, _thread_state, lambda a, k: a[0], "float32", (), "shard_map")


def make_shard_map_loss_pmean() -> UserStep:
    mesh = _mesh((8,), ("batch",))
    x, y = _classification(21)
    params = jax.device_put(_mlp_init(jax.random.key(4), (16, 32, 10)), NamedSharding(mesh, P()))

    def loss(params, batch):
        inputs, targets = batch
        return lax.pmean(_xent(_mlp_apply(params, inputs), targets), "batch")

    loss_dp = jax.shard_map(loss, mesh=mesh, in_specs=(P(), P("batch")), out_specs=P())

    @jax.jit
    def train_step(params, batch):
        value, grads = jax.value_and_grad(loss_dp)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    batch = jax.device_put((x, y), NamedSharding(mesh, P("batch")))
    return UserStep("shard_map_loss_pmean",
                    "jax docs shard_map notebook, data parallelism (loss under jax.shard_map with pmean, "
                    "jax.grad outside, check_vma on)",
                    train_step, (params, batch), {}, _thread_state, lambda a, k: a[0], "float32", (), "shard_map")


CORPUS: dict[str, Callable[[], UserStep]] = {
    "nnx_stateful": make_nnx_stateful,
    "nnx_mnist_metrics_dropout": make_nnx_mnist_metrics_dropout,
    "nnx_donate": make_nnx_donate,
    "linen_lm1b": make_linen_lm1b,
    "easylm_llama": make_easylm_llama,
    "big_vision_update_fn": make_big_vision_update_fn,
    "big_vision_pmap": make_big_vision_pmap,
    "optax_multisteps": make_optax_multisteps,
    "optax_clip_adamw_cosine": make_optax_clip_adamw_cosine,
    "jit_pspec_set_mesh": make_jit_pspec_set_mesh,
    "jit_explicit_axes": make_jit_explicit_axes,
    "mesh_2d_data_model": make_mesh_2d_data_model,
    "jit_kwargs_static_argnames": make_jit_kwargs_static_argnames,
    "linen_scan": make_linen_scan,
    "jax_checkpoint_scan": make_jax_checkpoint_scan,
    "maxtext_static_argnums": make_maxtext_static_argnums,
    "pmap_imagenet_batchnorm": make_pmap_imagenet_batchnorm,
    "pmap_half_precision": make_pmap_half_precision,
    "shard_map_pmean": make_shard_map_pmean,
    "shard_map_loss_pmean": make_shard_map_loss_pmean,
}

# Steps whose jit takes bare PartitionSpecs: called only with their mesh in context (their advance enters it).
NEEDS_MESH_CONTEXT = frozenset({"easylm_llama", "jit_pspec_set_mesh"})


# ----------------------------------------------------------------------------------------------
# Refused: steps disco must refuse, with what the error must name.
# ----------------------------------------------------------------------------------------------


def make_two_meshes() -> UserStep:
    """The state on a mesh ("dp",) and the batch on a mesh ("workers",) of the same 8 devices: jax runs it,
    but which axis is the data-parallel one has no single answer."""
    state_mesh, batch_mesh = _mesh((8,), ("dp",)), _mesh((8,), ("workers",))
    model, tx = _MLP(), optax.adam(1e-2)
    x, y = _classification(22)
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), x)["params"],
                                          tx=tx)
    state = jax.device_put(state, NamedSharding(state_mesh, P()))
    batch = jax.device_put({"x": x, "y": y}, NamedSharding(batch_mesh, P("workers")))
    return UserStep("two_meshes", "a user's mistake: state and batch placed on two meshes",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_two_meshes_disjoint_devices() -> UserStep:
    """The state on devices 0-3 and the batch on devices 4-7: jax refuses the call."""
    state_mesh = _mesh((4,), ("data",), devices=jax.devices()[:4])
    batch_mesh = _mesh((4,), ("data",), devices=jax.devices()[4:8])
    state, _ = _linen_state(state_mesh, _MLP(), optax.adam(1e-2), seed=23)
    _, batch = _linen_state(batch_mesh, _MLP(), optax.adam(1e-2), seed=23)
    return UserStep("two_meshes_disjoint_devices", "a user's mistake: arguments on disjoint device sets",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_unhashable_static_arg() -> UserStep:
    """A dict (unhashable) config passed as a static argument: jax refuses the call."""
    mesh = _mesh((8,), ("data",))
    state, batch = _linen_state(mesh, _MLP(), optax.adam(1e-2), seed=24)

    def train_step(state, batch, config):
        new_state, loss = _linen_train_step(state, batch)
        return new_state, loss * config["loss_scale"]

    step = jax.jit(train_step, static_argnums=(2,))
    return UserStep("unhashable_static_arg", "a user's mistake: static_argnums over a dict config",
                    step, (state, batch, {"loss_scale": 1.0}), {}, _thread_state, _state_params, "float32", (),
                    "jit-static")


def make_str_traced_arg() -> UserStep:
    """A str leaf in the (traced) batch: jax refuses the call, naming its path."""
    mesh = _mesh((8,), ("data",))
    state, batch = _linen_state(mesh, _MLP(), optax.adam(1e-2), seed=25)
    batch = {**batch, "split": "train"}
    return UserStep("str_traced_arg", "a user's mistake: a str in the batch dict",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_one_device_no_collective() -> UserStep:
    """The same step on a 1-device mesh: it runs, but there is no all-reduce to plan."""
    mesh = _mesh((1,), ("data",))
    state, batch = _linen_state(mesh, _MLP(), optax.adam(1e-2), seed=26)
    return UserStep("one_device_no_collective", "a data-parallel step run on one device",
                    jax.jit(_linen_train_step), (state, batch), {}, _thread_state, _state_params, "float32", (), "jit")


def make_nnx_modules_without_nnx_jit() -> UserStep:
    """nnx.jit's body passed as a plain function: jax.jit would drop what it updates in place."""
    entry = make_nnx_stateful()

    def train_step(model, optimizer, x, y):
        return entry.step.fun(model, optimizer, x, y)

    return entry._replace(name="nnx_modules_without_nnx_jit", source="a user's mistake: an NNX step without nnx.jit",
                          step=train_step)


# The state on one mesh and the batch on another of the same devices: jax lowers it over one mesh
# (the replicated state names no axis), so disco reads and plans it like any GSPMD step.
CORPUS["two_meshes"] = make_two_meshes

REFUSED: dict[str, tuple[Callable[[], UserStep], str]] = {
    # disco: the argument that is an NNX module, and the form to use
    "nnx_modules_without_nnx_jit": (make_nnx_modules_without_nnx_jit,
                                    r"argument 0 is a flax NNX _NnxMLP, but 'train_step' is a function, not an nnx.jit"),
    # jax: "Received incompatible devices for jitted computation. Got argument state... and argument batch..."
    "two_meshes_disjoint_devices": (make_two_meshes_disjoint_devices, r"(?s)incompatible devices.*\bbatch\b"),
    # disco, before jax: the argument that does not hash, and what jax.jit requires
    "unhashable_static_arg": (make_unhashable_static_arg,
                              r"static argument \(argument 2: dict\) is not hashable; jax.jit requires"),
    # jax: "... of type <class 'str'> ... at path batch['split']"
    "str_traced_arg": (make_str_traced_arg, r"(?s)\bstr\b.*batch\['split'\]"),
    # the error must say that the step has no all-reduce (collective) to plan
    "one_device_no_collective": (make_one_device_no_collective, r"(?i)\b(all-reduce|collective)"),
}

# The refused entries jax itself refuses when the step is called (the others run under plain jax).
JAX_REFUSED = frozenset({"two_meshes_disjoint_devices", "unhashable_static_arg", "str_traced_arg"})
# What jax's own error says where disco refuses such a step first, in its own words (REFUSED's pattern).
JAX_PATTERNS: dict[str, str] = {"unhashable_static_arg": r"(?i)non-hashable static argument"}

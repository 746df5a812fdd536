"""Training steps with sharded parameters (FSDP) written the way public training code writes them.

The companion of :mod:`tests.support.user_steps` (whose corpus is replicated): each entry follows one
public file and keeps that code's shape, how it builds the state, how it shards it (regex partition
rules, a sharding strategy, flax partitioning metadata, ``device_put`` with a ``PartitionSpec``), how
it jits the step and how it calls it, with its parameters really sharded over an fsdp axis of a
mesh of the 8 virtual CPU devices. Models are tiny (widths 16-64) so that each compiles in seconds.

``SHARDED`` maps a name to its ``make_<name>()`` (fresh objects from fixed seeds on every call), each a
:class:`tests.support.user_steps.UserStep`. :data:`NEEDS_MESH_CONTEXT` names those whose user calls
the step inside ``jax.set_mesh(mesh)`` (a jit with bare ``PartitionSpec``\\ s, a ``shard_map`` without
a mesh, flax's partitioning metadata): their ``advance`` enters it, and the tests enter
:func:`context` (that, and maxtext's logical axis rules) around disco's calls, as the user's loop
does. :func:`sharded_paths` names the parameters that are sharded.

The sources (their repository and path):

- ``easylm_llama_fsdp``: young-geng/EasyLM ``EasyLM/models/llama/llama_train.py`` at its default
  ``--mesh_dim='1,-1,1'`` (dp, fsdp, mp): the LLaMA regex partition rules of
  ``EasyLM/models/llama/llama_model.py`` shard every kernel over fsdp (the step itself is
  :func:`tests.support.user_steps.make_easylm_llama`'s, one block here).
- ``big_vision_fsdp``: google-research/big_vision ``big_vision/train.py`` with a config's
  ``mesh = [("data", -1)]`` and ``sharding_strategy = [(".*", "fsdp(axis='data')")]``: the ``fsdp`` rule of
  ``big_vision/sharding.py`` (each array's largest dimension divisible by the axis, parameters and
  optimizer state alike) over the very axis the batch is split over; params and optimizer state made
  by ``jax.jit(init, out_shardings=...)``, ``update_fn`` jitted with ``donate_argnums=(0,)`` and
  out shardings only.
- ``nnx_spmd_fsdp``: google/flax ``docs_nnx/guides/flax_gspmd.md`` ("Scale up on multiple devices"),
  its pre-eager-sharding form: ``nnx.with_partitioning`` on a kernel initializer and ``sharding`` metadata
  on an ``nnx.Param``, the model made sharded by an ``nnx.jit`` that reads ``nnx.get_partition_spec``
  and applies ``jax.lax.with_sharding_constraint``, an activation constraint in the model,
  ``nnx.Optimizer`` and an ``nnx.jit`` step; the guide's 2 x 4 mesh with its second axis ``fsdp``
  (the guide shards over ``model``; with the batch over both axes that is FSDP).
- ``shard_map_fsdp``: jax-ml/jax ``docs/notebooks/shard_map.md``, "FSDP": ``jax.set_mesh(mesh)``,
  parameters placed with ``jax.device_put(params, jax.P('batch'))``, ``all_gather`` of each weight
  before its use under ``jax.remat`` with a policy that gathers again on the backward pass, the
  loss under ``jax.shard_map(out_specs=jax.P())`` with ``pmean``; its gradient's transpose is a
  ``psum_scatter`` (a reduce-scatter in the program).
- ``maxtext_logical_fsdp``: AI-Hypercomputer/maxtext ``MaxText/train.py`` and
  ``MaxText/maxtext_utils.py`` (``get_abstract_state``: ``nn.get_partition_spec`` then
  ``nn.logical_to_mesh_sharding`` under the config's ``logical_axis_rules``), with the base config's
  rules (weights' ``embed`` over fsdp, the batch over data and fsdp): ``jax.jit(train_step,
  in_shardings=(state_mesh_shardings, data_sharding, None), static_argnums=(0, 1), donate_argnums=2)``
  on a ``("data", "fsdp", "tensor")`` = (2, 4, 1) mesh.
- ``maxtext_scanned_fsdp``: the same with maxtext's default ``scan_layers=True``
  (``MaxText/layers/decoders.py``, ``Decoder.scan_decoder_layers``: ``nn.scan`` over the layer with
  ``variable_axes={"params": 0}`` and ``metadata_params={nn.PARTITION_NAME: "layers"}``, the base config's
  rule ``("layers", None)``), 3 layers: each layer's all-gathers run in the forward loop's body, its
  re-gathers and gradient scatters in the backward loop's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax.training import train_state
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.support import user_steps
from tests.support.user_steps import UserStep

# ----------------------------------------------------------------------------------------------
# EasyLM: the LLaMA step at EasyLM's default mesh_dim '1,-1,1'.
# ----------------------------------------------------------------------------------------------


def make_easylm_llama_fsdp() -> UserStep:
    config = user_steps.LLaMAConfig(num_hidden_layers=1)
    return user_steps.make_easylm_llama(
        (1, 8, 1), "easylm_llama_fsdp",
        "young-geng/EasyLM EasyLM/models/llama/llama_train.py at its default --mesh_dim='1,-1,1' (dp, fsdp, mp): "
        "regex partition rules over fsdp, donate (0, 1)", config)


# ----------------------------------------------------------------------------------------------
# big_vision: sharding_strategy [(".*", "fsdp(axis='data')")] on a mesh [("data", -1)].
# ----------------------------------------------------------------------------------------------


def _bv_fsdp(axis: str, min_size_to_shard_mb: float = 4):
    """big_vision/sharding.py's ``fsdp`` rule: the largest dimension divisible by the axis, not taken."""

    def update_spec(cur_spec, mesh, name, x):
        shape, axis_size = x.shape, mesh.shape[axis]
        if np.prod(shape) * x.dtype.itemsize <= min_size_to_shard_mb * (2 ** 20):
            return cur_spec
        for i in np.argsort(shape)[::-1]:
            if shape[i] % axis_size == 0 and cur_spec[i] is None:
                return cur_spec[:i] + (axis,) + cur_spec[i + 1:]
        return cur_spec

    return update_spec


def _bv_infer_sharding(tree, strategy, mesh):
    """big_vision/sharding.py's ``infer_sharding``: each leaf's spec from the rules whose pattern its
    ``/``-joined name matches (here one pattern, ``.*``), a NamedSharding per leaf."""
    import re

    def spec(path, x):
        name = "/".join(user_steps._key_name(k) for k in path)
        cur = (None,) * x.ndim
        for pattern, op in strategy:
            if re.fullmatch(pattern, name):
                cur = op(cur, mesh, name, x)
        return NamedSharding(mesh, P(*cur))

    return jax.tree_util.tree_map_with_path(spec, tree)


def make_big_vision_fsdp() -> UserStep:
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8), ("data",))  # config.mesh = [("data", -1)]
    model = user_steps._MLP(widths=(32, 32), classes=16, dropout_rate=0.1)
    image, label = user_steps._classification(31, classes=16)
    labels = jax.nn.one_hot(label, 16)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.add_decayed_weights(1e-4),
                     optax.scale_by_learning_rate(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 1, 10)))

    def init(rng):
        return model.init(rng, jnp.zeros_like(image), train=False)["params"]

    rng = jax.random.PRNGKey(0)
    rng, rng_init = jax.random.split(rng)
    params_shape = jax.eval_shape(init, rng_init)
    opt_shape = jax.eval_shape(tx.init, params_shape)
    repl_sharding = NamedSharding(mesh, P())
    # the tiny model's arrays are all under big_vision's default 4 MiB floor: shard every one that divides
    strategy = [(".*", _bv_fsdp("data", min_size_to_shard_mb=0))]
    train_state_sharding = _bv_infer_sharding({"params": params_shape, "opt": opt_shape}, strategy, mesh)
    rng_init = jax.device_put(rng_init, repl_sharding)  # u.reshard
    params = jax.jit(init, out_shardings=train_state_sharding["params"])(rng_init)
    opt = jax.jit(tx.init, out_shardings=train_state_sharding["opt"])(params)
    rng, rng_loop = jax.random.split(rng, 2)
    rng_loop = jax.device_put(rng_loop, repl_sharding)
    train_state = {"params": params, "opt": opt}

    def loss_fn(params, images, labels, rng_model):
        logits = model.apply({"params": params}, images, train=True, rngs={"dropout": rng_model})
        return optax.sigmoid_binary_cross_entropy(logits, labels).sum(axis=-1).mean()  # big_vision's sigmoid_xent

    @functools.partial(jax.jit, donate_argnums=(0,), out_shardings=(train_state_sharding, repl_sharding))
    def update_fn(train_state, rng, batch):
        images, labels = batch["image"], batch["labels"]
        step_count = optax.tree_utils.tree_get_all_with_path(train_state["opt"], "count")[0][1]  # bv_optax.get_count
        rng = jax.random.fold_in(rng, step_count)
        rng, rng_model = jax.random.split(rng, 2)
        params, opt = train_state["params"], train_state["opt"]
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels, rng_model)
        updates, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, updates)
        measurements = {"training_loss": loss}
        measurements["l2_grads"] = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        measurements["l2_params"] = jnp.sqrt(sum(jnp.sum(p * p) for p in jax.tree.leaves(params)))
        return {"params": params, "opt": opt}, measurements

    # input_pipeline.start_global: the global batch split over the devices in the mesh's order
    batch = jax.device_put({"image": image, "labels": labels}, NamedSharding(mesh, P("data")))
    return UserStep("big_vision_fsdp",
                    "google-research/big_vision big_vision/train.py + big_vision/sharding.py (mesh [('data', -1)], "
                    "sharding_strategy [('.*', \"fsdp(axis='data')\")], update_fn donate_argnums=(0,), "
                    "out_shardings only)",
                    update_fn, (train_state, rng_loop, batch), {}, user_steps._thread_state,
                    lambda a, k: a[0]["params"], "float32", (0,), "jit")


# ----------------------------------------------------------------------------------------------
# flax NNX: partitioning metadata, a sharded model made by nnx.jit, an nnx.jit step.
# ----------------------------------------------------------------------------------------------


class _DotReluDot(nnx.Module):
    """flax_gspmd's DotReluDot: a Linear whose kernel initializer is partitioned, and a Param with
    ``sharding`` metadata; its hidden activation constrained (the batch over both axes here)."""

    def __init__(self, din: int, depth: int, dout: int, *, rngs: nnx.Rngs):
        init_fn = nnx.initializers.lecun_normal()
        self.dot1 = nnx.Linear(din, depth, kernel_init=nnx.with_partitioning(init_fn, (None, "fsdp")),
                               use_bias=False, rngs=rngs)
        self.w2 = nnx.Param(init_fn(rngs.params(), (depth, dout)), sharding=("fsdp", None))

    def __call__(self, x):
        y = jax.nn.relu(self.dot1(x))
        y = jax.lax.with_sharding_constraint(y, P(("data", "fsdp"), None))
        return jnp.dot(y, self.w2[...])


def make_nnx_spmd_fsdp() -> UserStep:
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "fsdp"))

    @nnx.jit
    def create_sharded_model():
        model = _DotReluDot(16, 64, 16, rngs=nnx.Rngs(0))
        state = nnx.state(model)
        pspecs = nnx.get_partition_spec(state)
        sharded_state = jax.lax.with_sharding_constraint(state, pspecs)
        nnx.update(model, sharded_state)
        return model

    with jax.set_mesh(mesh), nnx.use_eager_sharding(False):  # the guide's `with mesh:`
        model = create_sharded_model()
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            y_pred = model(x)
            return jnp.mean((y_pred - y) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    kx, ky = jax.random.split(jax.random.key(32))
    data = NamedSharding(mesh, P(("data", "fsdp"), None))
    x, y = jax.device_put((jax.random.normal(kx, (16, 16)), jax.random.normal(ky, (16, 16))), data)

    def advance(fn, args, kwargs):
        with jax.set_mesh(mesh):
            fn(*args, **kwargs)
        return args, kwargs

    return UserStep("nnx_spmd_fsdp",
                    "google/flax docs_nnx/guides/flax_gspmd.md (nnx.with_partitioning, Param sharding metadata, "
                    "nnx.get_partition_spec + with_sharding_constraint in an nnx.jit, nnx.Optimizer, nnx.jit step)",
                    train_step, (model, optimizer, x, y), {}, advance, user_steps._nnx_params, "float32", (), "nnx")


# ----------------------------------------------------------------------------------------------
# jax docs: shard_map FSDP (all_gather before use, re-gathered on the backward pass).
# ----------------------------------------------------------------------------------------------


def _init_layer(key, n_in, n_out):
    k1, k2 = jax.random.split(key)
    return jax.random.normal(k1, (n_in, n_out)) / jnp.sqrt(n_in), jax.random.normal(k2, (n_out,))


def _init(key, layer_sizes, batch_size):
    key, *keys = jax.random.split(key, len(layer_sizes))
    params = list(map(_init_layer, keys, layer_sizes[:-1], layer_sizes[1:]))
    key, *keys = jax.random.split(key, 3)
    inputs = jax.random.normal(keys[0], (batch_size, layer_sizes[0]))
    targets = jax.random.normal(keys[1], (batch_size, layer_sizes[-1]))
    return params, (inputs, targets)


def make_shard_map_fsdp() -> UserStep:
    mesh = jax.make_mesh((8,), ("batch",))  # jax 0.10's default: Explicit axes
    params, batch = _init(jax.random.key(0), [16, 32, 32, 8], 32)
    with jax.set_mesh(mesh):
        batch = jax.device_put(batch, jax.P("batch"))
        params = jax.device_put(params, jax.P("batch"))

    @functools.partial(jax.remat, policy=lambda op, *_, **__: str(op) != "all_gather")
    def predict_fsdp(params_frag, inputs):
        for W_frag, b_frag in params_frag:
            W = jax.lax.all_gather(W_frag, "batch", tiled=True)
            b = jax.lax.all_gather(b_frag, "batch", tiled=True)
            outputs = jnp.dot(inputs, W) + b
            inputs = jax.nn.relu(outputs)
        return outputs

    @jax.shard_map(out_specs=jax.P())
    def loss_fsdp(local_params, local_batch):
        inputs, targets = local_batch
        predictions = predict_fsdp(local_params, inputs)
        local_loss = jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))
        return jax.lax.pmean(local_loss, "batch")

    @jax.jit
    def train_step(params, batch):
        loss, grads = jax.value_and_grad(loss_fsdp)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    def advance(fn, args, kwargs):
        with jax.set_mesh(mesh):
            params, _ = fn(*args, **kwargs)
        return (params, args[1]), kwargs

    return UserStep("shard_map_fsdp",
                    "jax-ml/jax docs/notebooks/shard_map.md, FSDP (params device_put P('batch'), all_gather under "
                    "jax.remat(policy=...), jax.shard_map(out_specs=P()) with pmean, jax.set_mesh)",
                    train_step, (params, batch), {}, advance, lambda a, k: a[0], "float32", (), "shard_map")


# ----------------------------------------------------------------------------------------------
# MaxText: logical axis rules, statics, donation, a 2 x 4 ("data", "fsdp") mesh.
# ----------------------------------------------------------------------------------------------

# MaxText/configs/base.yml's logical_axis_rules, the ones this model names
_MAXTEXT_RULES = (("layers", None), ("activation_batch", ("data", "fsdp")), ("activation_embed", "tensor"), ("activation_mlp", "tensor"),
                  ("activation_length", None), ("mlp", "tensor"), ("vocab", "tensor"),
                  ("embed", "fsdp"), ("norm", None))


class _MaxTextMlpLayer(nn.Module):
    """maxtext's decoder layer, shrunk to its MLP: RMSNorm, wi, gelu, wo, with logical axis names."""

    config: user_steps.MaxTextConfig

    @nn.compact
    def __call__(self, x, deterministic):
        c = self.config
        h = nn.RMSNorm(scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)))(x)
        h = nn.Dense(c.mlp_dim, use_bias=False, name="wi", kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("embed", "mlp")))(h)
        h = nn.with_logical_constraint(nn.gelu(h), ("activation_batch", "activation_length", "activation_mlp"))
        h = nn.Dense(c.emb_dim, use_bias=False, name="wo", kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("mlp", "embed")))(h)
        return x + nn.Dropout(c.dropout_rate)(h, deterministic=deterministic)


class _MaxTextScannedLayer(_MaxTextMlpLayer):
    """The layer as ``nn.scan`` calls it (maxtext's layers return ``(output, None)`` under ``scan_layers``)."""

    def __call__(self, x, deterministic):
        return super().__call__(x, deterministic), None


class _MaxTextShardedDecoder(nn.Module):
    """maxtext's decoder; with ``scan_layers`` (maxtext's default) its ``Decoder.scan_decoder_layers``: an
    ``nn.scan`` of the layer over ``num_layers`` with the parameters stacked on a ``"layers"`` axis."""

    config: user_steps.MaxTextConfig
    scan_layers: bool = False

    @nn.compact
    def __call__(self, tokens, deterministic: bool = False):
        c = self.config
        embed = nn.Embed(c.vocab_size, c.emb_dim, name="token_embedder", embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")))
        x = nn.with_logical_constraint(embed(tokens), ("activation_batch", "activation_length", "activation_embed"))
        if self.scan_layers:
            scanned = nn.scan(_MaxTextScannedLayer, variable_axes={"params": 0},
                              split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast,),
                              length=c.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = scanned(c, name="layers")(x, deterministic)
        else:
            for i in range(c.num_layers):
                x = _MaxTextMlpLayer(c, name=f"layers_{i}")(x, deterministic)
        x = nn.RMSNorm(name="decoder_norm", scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)))(x)
        return nn.Dense(c.vocab_size, use_bias=False, name="logits_dense", kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("embed", "vocab")))(x)


def make_maxtext_logical_fsdp() -> UserStep:
    return _maxtext_fsdp("maxtext_logical_fsdp", user_steps.MaxTextConfig(), scan_layers=False)


def make_maxtext_scanned_fsdp() -> UserStep:
    return _maxtext_fsdp("maxtext_scanned_fsdp", user_steps.MaxTextConfig(num_layers=3), scan_layers=True)


def _maxtext_fsdp(name: str, config: user_steps.MaxTextConfig, *, scan_layers: bool) -> UserStep:
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4, 1), ("data", "fsdp", "tensor"))
    model = _MaxTextShardedDecoder(config, scan_layers)
    tokens = user_steps._tokens(33)
    tx = optax.adamw(optax.linear_schedule(1e-3, 3e-3, 4), b1=0.9, b2=0.95, weight_decay=0.1)

    def init_initial_state(key):
        params = model.init({"params": key, "dropout": key}, tokens)["params"]
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    # maxtext_utils.get_abstract_state: the boxed state's logical specs, mapped to the mesh by the rules
    with jax.set_mesh(mesh), nn.logical_axis_rules(_MAXTEXT_RULES):
        abstract_state = jax.eval_shape(init_initial_state, jax.random.PRNGKey(0))
        state_logical_annotations = nn.get_partition_spec(abstract_state)
        state_mesh_shardings = nn.logical_to_mesh_sharding(state_logical_annotations, mesh, _MAXTEXT_RULES)
        state = jax.jit(lambda k: nn.meta.unbox(init_initial_state(k)), out_shardings=state_mesh_shardings)(
            jax.random.PRNGKey(0))
    data_sharding = NamedSharding(mesh, nn.logical_to_mesh_axes(("activation_batch", None), _MAXTEXT_RULES))
    p_train_step = jax.jit(
        user_steps._maxtext_train_step,
        in_shardings=(state_mesh_shardings, data_sharding, None),
        out_shardings=(state_mesh_shardings, None),
        static_argnums=(0, 1),
        donate_argnums=2)
    data = jax.device_put({"inputs": tokens, "targets": np.roll(tokens, -1, axis=1),
                           "targets_segmentation": np.ones_like(tokens)}, data_sharding)
    rng = jax.random.PRNGKey(2)

    def advance(fn, args, kwargs):
        with jax.set_mesh(mesh), nn.logical_axis_rules(_MAXTEXT_RULES):  # train.py's `with mesh, nn.logical_axis_rules`
            state, _ = fn(*args, **kwargs)
        return (args[0], args[1], state, *args[3:]), kwargs

    return UserStep(name,
                    "AI-Hypercomputer/maxtext MaxText/train.py + MaxText/maxtext_utils.py (logical_axis_rules, "
                    "nn.logical_to_mesh_sharding, jax.jit(train_step, in_shardings=(state, data, None), "
                    "static_argnums=(0, 1), donate_argnums=2), mesh (2, 4, 1))"
                    + (", MaxText/layers/decoders.py's scan_decoder_layers (nn.scan)" if scan_layers else ""),
                    p_train_step, (model, config, state, data, rng), {}, advance, lambda a, k: a[2].params,
                    "float32", (2,), "jit-static")


SHARDED: dict[str, Callable[[], UserStep]] = {
    "easylm_llama_fsdp": make_easylm_llama_fsdp,
    "big_vision_fsdp": make_big_vision_fsdp,
    "nnx_spmd_fsdp": make_nnx_spmd_fsdp,
    "shard_map_fsdp": make_shard_map_fsdp,
    "maxtext_logical_fsdp": make_maxtext_logical_fsdp,
}
# Steps whose layers are a loop (their collectives in the loops' bodies): read another way, tested apart
# (tests/disco/plans/test_loop_gather_buckets.py).
SCANNED: dict[str, Callable[[], UserStep]] = {"maxtext_scanned_fsdp": make_maxtext_scanned_fsdp}

# The steps their user calls inside jax.set_mesh (their advance enters it; so do the tests around disco's calls).
NEEDS_MESH_CONTEXT = frozenset({"easylm_llama_fsdp", "nnx_spmd_fsdp", "shard_map_fsdp", "maxtext_logical_fsdp",
                                "maxtext_scanned_fsdp"})
# and inside flax's logical axis rules too (maxtext's train loop: `with mesh, nn.logical_axis_rules(rules)`)
_LOGICAL_RULES = {"maxtext_logical_fsdp": _MAXTEXT_RULES, "maxtext_scanned_fsdp": _MAXTEXT_RULES}


def three_steps(entry: UserStep, fn: Callable) -> object:
    """``entry``'s parameters (float64 numpy) after 3 steps of ``fn`` from its fresh arguments, advanced
    as its user's loop advances them."""
    args, kwargs = entry.args, entry.kwargs
    for _ in range(3):
        args, kwargs = entry.advance(fn, args, kwargs)
    return jax.tree.map(lambda x: np.asarray(x, np.float64), entry.params(args, kwargs))


def context(entry: UserStep) -> contextlib.AbstractContextManager:
    """What the user's loop holds around each call of the step: ``jax.set_mesh`` over its mesh (and
    flax's logical axis rules) for the :data:`NEEDS_MESH_CONTEXT` steps; nothing for the others."""
    stack = contextlib.ExitStack()
    if entry.name in NEEDS_MESH_CONTEXT:
        stack.enter_context(jax.set_mesh(mesh_of(entry)))
    if entry.name in _LOGICAL_RULES:
        stack.enter_context(nn.logical_axis_rules(_LOGICAL_RULES[entry.name]))
    return stack


def mesh_of(entry: UserStep) -> jax.sharding.Mesh:
    """The mesh the step's sharded arguments live on."""
    leaves = jax.tree.leaves(nnx.state(entry.args[0]) if entry.style == "nnx" else entry.args)
    return next(x.sharding.mesh for x in leaves if isinstance(getattr(x, "sharding", None), NamedSharding))


def sharded_paths(entry: UserStep) -> list[str]:
    """The paths (``jax.tree_util.keystr``) of the step's parameters that are sharded over some mesh axis."""
    params = (nnx.state(entry.args[0], nnx.Param) if entry.style == "nnx" else entry.params(entry.args, entry.kwargs))
    return [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(params)
            if any(x.sharding.spec)]

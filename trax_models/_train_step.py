"""Data-parallel training steps, in the three styles users write: ``shard_map`` with one all-reduce
per gradient (``style="shard_map"``), ``jax.pmap`` with the same ``pmean`` per gradient over
arguments that carry a leading device axis (``style="pmap"``), or ``jax.jit`` over sharded
arguments with no explicit collective, which XLA's SPMD partitioner reduces (``style="gspmd"``),
with the parameters and optimizer state sharded too (``style="fsdp"``, :mod:`trax_models._fsdp`)."""

from __future__ import annotations

import functools

import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trax_models import _fsdp, _registry
from trax_models._registry import STYLES
from trax_models._configs import check_device_count
from trax_models._jax_compat import auto_mesh, data_parallel_mesh
from trax_models._optimizers import make_optimizer
from trax_models._task import Task
from trax_models._train_state import TrainState

AXIS = "dp"
_FAST_COMPILE = {"xla_backend_optimization_level": 0}
StepFn = Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, jax.Array]]
def check_style(style: object) -> str:
    """Returns ``style`` when it is one of :data:`STYLES`.

    Raises:
      ValueError: naming the style received and those expected.
    """
    if style not in STYLES:
        raise ValueError(f"style: expected one of {', '.join(STYLES)}, got {style!r}")
    return str(style)


def grad_scope(keypath: tuple[Any, ...]) -> str:
    """The ``jax.named_scope`` of the all-reduce of the gradient at ``keypath``."""
    return f"disco_grad[{jax.tree_util.keystr(keypath)}]"


def check_devices(devices: int | None) -> int:
    """Returns the devices count to use (all available when ``None``).

    Raises:
      TypeError: when ``devices`` is neither None nor an int.
      ValueError: when ``devices`` is below 1 or above the available devices.
    """
    if devices is None:
        return len(jax.devices())
    devices = check_device_count(devices, expected="an int >= 1 (or None: all)")
    available = len(jax.devices())
    if devices > available:
        raise ValueError(
            f"requested {devices} devices but only {available} are available; "
            f"for virtual CPU devices set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={devices} before importing jax, "
            f"or call jax.config.update('jax_num_cpu_devices', {devices}) before "
            "first use of jax"
        )
    return devices


def check_seed(seed: object) -> int:
    """Returns ``seed`` when it is an int in ``[0, 2**63)`` (what ``jax.random.key`` and numpy take).

    Raises:
      TypeError: for anything but an int (a bool is not one).
      ValueError: for an int outside that range.
    """
    expected = "seed: expected an int in [0, 2**63)"
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{expected}, got {type(seed).__name__} {seed!r}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"{expected}, got {seed}")
    return int(seed)


def make_train_step(
    name: str,
    preset: str = "tiny",
    *,
    devices: int | None = None,
    optimizer: str = "adamw",
    seed: int = 0,
    learning_rate: float | optax.Schedule | None = None,
    abstract: bool = False,
    style: str = "shard_map",
    mesh_shape: tuple[int, int] | None = None,
) -> tuple[StepFn, tuple[TrainState, dict[str, jax.Array]]]:
    """Builds a data-parallel training step of a zoo model and example arguments.

    With ``style="shard_map"`` (the default) the step runs ``jax.shard_map`` over a 1-D mesh
    ``("dp",)``. Each device computes the loss and gradients of its batch shard; every gradient
    leaf is averaged by its own ``jax.lax.pmean`` inside
    ``jax.named_scope(f"disco_grad[{keystr(path)}]")`` and the loss by one more ``pmean`` in
    scope ``"disco_loss"``, so the lowered HLO has exactly ``n_leaves + 1`` all-reduces whose
    ``op_name`` names the parameter. With ``style="gspmd"`` the step is the plain global
    computation (loss and gradients of the whole batch, the optimizer update) over the same
    sharded arguments, as JAX's documentation writes one: XLA's SPMD partitioner adds the
    all-reduces when it is compiled (the same number, one per gradient and the loss's).
    With ``style="pmap"`` the step is ``jax.pmap`` (axis ``"dp"``) of the same per-device
    computation and the same named ``pmean`` of every gradient and the loss, as a pmap user
    writes it: every leaf of ``state`` carries a leading device axis (a replica per device),
    the batch is split into ``(devices, batch // devices, ...)``, and the step returns the new
    state and the loss with that leading axis (every row equal). With ``style="fsdp"`` the step
    is the gspmd step on a ``("data", "fsdp")`` mesh of shape ``mesh_shape`` (default
    ``(1, devices)``): the batch split over both axes, each parameter and optimizer-state leaf
    with a dimension that the fsdp size divides split over ``"fsdp"`` along the largest such
    dimension (others replicated), and the new state constrained to the same
    shardings, so the step keeps its state sharded under a plain ``jax.jit``; XLA's partitioner
    gathers the parameters and returns each gradient to its shard.

    Example:
      >>> step, (state, batch) = make_train_step("mlp", devices=1)
      >>> state, loss = jax.jit(step)(state, batch)

    Args:
      name: A model of ``trax_models.names()``, or a random network of the cost model's corpus
        (``random_<family>_<seed>``: ``trax_models.random_names``).
      preset: ``"tiny"`` (tests), ``"small"`` (CPU benchmarks) or ``"paper"``.
      devices: Data-parallel devices; ``None`` uses all of ``jax.devices()``.
      optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"``.
      seed: Seeds the parameters and the synthetic batch.
      learning_rate: Overrides the optimizer's default step size (a number, or an
        optax schedule).
      abstract: Return ``jax.ShapeDtypeStruct`` example arguments (with
        shardings) instead of arrays: enough to ``lower`` the paper presets
        without allocating a replica of the parameters on every device.
      style: ``"shard_map"``, ``"pmap"``, ``"gspmd"`` or ``"fsdp"`` (see above).
      mesh_shape: For ``style="fsdp"``: the mesh's ``(data, fsdp)`` sizes, whose product is
        ``devices``; None for ``(1, devices)``. Other styles take None only.

    Returns:
      ``(step_fn, (state, batch))``: ``step_fn(state, batch) -> (state, loss)``
      is a plain function for the caller to ``jax.jit`` (a pmap step may also be called
      as it is); ``state`` is a replicated ``TrainState`` (for ``"fsdp"``: sharded as above)
      and ``batch`` a dict sharded on its batch axis (for ``"pmap"``: both with a leading
      device axis, see above).

    Raises:
      TypeError: for ``devices`` or ``seed`` that is not an int, a ``mesh_shape`` that is
        not a pair of ints, or a ``learning_rate`` that is neither a number nor a schedule.
      ValueError: for an unknown model, preset, optimizer or style, style "pmap" on several
        processes, ``devices`` below 1
        or above those available, a global batch not divisible by ``devices``, a
        ``mesh_shape`` whose product is not ``devices`` or given with a style other than fsdp,
        ``seed`` outside ``[0, 2**63)``, or a negative or non-finite ``learning_rate``.
    """
    style = check_style(style)
    from trax_models import _random

    drawn = _random.is_random(name)  # a drawn network of the cost model's corpus (trax_models._random)
    config = _random.draw(name, preset) if drawn else _registry.config(name, preset)
    _registry.check_optimizer(optimizer)
    devices = check_devices(devices)
    task = _random.task(config) if drawn else _registry.model_module(name).task(config)
    return build_train_step(
        task, config.batch_for(devices), devices=devices, optimizer=optimizer,
        seed=seed, learning_rate=learning_rate, abstract=abstract,
        name=f"{name}_{preset}_train_step", style=style, mesh_shape=mesh_shape,
    )


def build_train_step(
    task: Task,
    global_batch: int,
    *,
    devices: int,
    optimizer: str = "adamw",
    seed: int = 0,
    learning_rate: float | optax.Schedule | None = None,
    abstract: bool = False,
    name: str = "train_step",
    style: str = "shard_map",
    mesh_shape: tuple[int, int] | None = None,
) -> tuple[StepFn, tuple[TrainState, dict[str, jax.Array]]]:
    """The data-parallel training step of any :class:`Task` (what ``make_train_step`` builds).

    Args:
      task: The model's init, loss and synthetic batches.
      global_batch: Examples per step over all devices (a multiple of ``devices``).
      devices: Data-parallel devices (checked by :func:`check_devices`).
      optimizer, seed, learning_rate, abstract, style, mesh_shape: As for :func:`make_train_step`.
      name: The step function's ``__name__`` (it names the HLO module).

    Raises:
      TypeError: for ``global_batch``, ``devices`` or ``seed`` that is not an int, a
        ``mesh_shape`` that is not a pair of ints, or a ``learning_rate`` that is neither a
        number nor a schedule.
      ValueError: for an unknown optimizer, ``devices`` below 1 or above those
        available, a global batch not divisible by ``devices``, a bad ``mesh_shape`` (as for
        :func:`make_train_step`), ``seed`` outside ``[0, 2**63)``, or a negative or
        non-finite ``learning_rate``.
    """
    _registry.check_optimizer(optimizer)
    style = check_style(style)
    devices = check_devices(devices)
    seed = check_seed(seed)
    if isinstance(global_batch, bool) or not isinstance(global_batch, numbers.Integral):
        raise TypeError(
            f"global_batch: expected an int that is a positive multiple of devices ({devices}), "
            f"got {type(global_batch).__name__} {global_batch!r}"
        )
    global_batch = int(global_batch)
    if global_batch < devices or global_batch % devices:
        raise ValueError(
            f"global batch {global_batch} must be a positive multiple of devices ({devices})"
        )
    if style == "pmap" and jax.process_count() > 1:
        raise ValueError(f"style 'pmap' runs on one process only, got {jax.process_count()} processes; "
                         "expected style shard_map or gspmd")
    if style != "fsdp" and mesh_shape is not None:
        raise ValueError(f"mesh_shape: only style 'fsdp' takes one, got {mesh_shape!r} with style {style!r}")
    tx = make_optimizer(optimizer, learning_rate=learning_rate)
    if style == "fsdp":
        mesh = auto_mesh(_fsdp.check_mesh_shape(mesh_shape, devices), _fsdp.MESH_AXES)
    else:
        mesh = data_parallel_mesh(devices, AXIS, explicit=style == "shard_map")

    def mean_step(state: TrainState, batch: dict[str, jax.Array], *, per_device_params: bool):
        # shard_map: the replicated parameters become per-device values (pcast); under pmap every
        # argument is already per device. Then the same named pmeans either way.
        params = state.params if per_device_params else jax.lax.pcast(state.params, AXIS, to="varying")
        loss, grads = jax.value_and_grad(task.loss)(params, batch)

        def mean_gradient(keypath, g):
            with jax.named_scope(grad_scope(keypath)):
                return jax.lax.pmean(g, AXIS)

        grads = jax.tree_util.tree_map_with_path(mean_gradient, grads)
        with jax.named_scope("disco_loss"):
            loss = jax.lax.pmean(loss, AXIS)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state), loss

    sharded_step = jax.shard_map(
        functools.partial(mean_step, per_device_params=False), mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P())
    )

    def global_step(state: TrainState, batch: dict[str, jax.Array]):
        loss, grads = jax.value_and_grad(task.loss)(state.params, batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), opt_state), loss

    def fsdp_step(state: TrainState, batch: dict[str, jax.Array]):
        state, loss = global_step(state, batch)
        return jax.lax.with_sharding_constraint(state, _fsdp.state_shardings(state, mesh)), loss

    replica_step = functools.partial(mean_step, per_device_params=True)

    steps = {"shard_map": sharded_step, "gspmd": global_step, "fsdp": fsdp_step}
    if style == "pmap":
        steps["pmap"] = jax.pmap(replica_step, axis_name=AXIS, devices=list(mesh.devices.flat))

    def step_fn(state: TrainState, batch: dict[str, jax.Array]):
        return steps[style](state, batch)

    step_fn.__name__ = name

    replicated = NamedSharding(mesh, P())
    split = NamedSharding(mesh, _fsdp.BATCH_SPEC if style == "fsdp" else P(AXIS))

    def init_state(key: jax.Array) -> TrainState:
        params = task.init(key)
        return TrainState(params, tx.init(params))

    key = jax.random.key(seed)
    host_batch = task.make_batch(np.random.default_rng(seed), global_batch)
    if style == "pmap":  # the batch split on a new leading device axis
        host_batch = {k: np.reshape(v, (devices, v.shape[0] // devices, *v.shape[1:]))
                      for k, v in host_batch.items()}
    if abstract:
        shapes = jax.eval_shape(init_state, key)
        if style == "pmap":  # a replica of every leaf per device, on a leading axis
            state = jax.tree.map(
                lambda s: jax.ShapeDtypeStruct((devices, *s.shape), s.dtype, sharding=split), shapes)
        elif style == "fsdp":
            state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                 shapes, _fsdp.state_shardings(shapes, mesh))
        else:
            state = jax.tree.map(
                lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), shapes)
        batch = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=split)
            for k, v in host_batch.items()
        }
    else:
        # Initialisation runs once: compiling it without backend optimisation
        # takes ~1 s instead of ~10 s for the convolutional models on CPU.
        init = jax.jit(init_state).lower(key).compile(_FAST_COMPILE)
        if style == "pmap":
            stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (devices, *x.shape)), init(key))
            state = jax.device_put(stacked, split)
        elif style == "fsdp":
            state = init(key)
            state = jax.device_put(state, _fsdp.state_shardings(state, mesh))
        else:
            state = jax.device_put(init(key), replicated)
        batch = jax.device_put(host_batch, split)
    return step_fn, (state, batch)

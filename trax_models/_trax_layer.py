"""Training steps of real trax layers (``pip install 'disco[trax]'``).

A trax layer is a pure function ``layer.pure_fn(x, weights, state, rng)``; this
module wraps it in a :class:`~trax_models._task.Task` (trainable ``weights`` as
the parameters, the layer's non-trainable ``state`` held constant) and hands it
to the same data-parallel step the Flax zoo uses, so everything downstream
(extract, plan, apply, optimize) treats it like a zoo model.

Two tasks:

* ``"lm"``: token sequences ``(batch, length)`` in ``[1, vocab_size)``; the loss is
  the cross entropy of the layer's output at position ``t`` against token ``t``
  (trax language models shift their input right in ``mode="train"``).
* ``"classify"``: float inputs ``(batch, *input_shape)`` with fixed random labels;
  the number of classes is the last dimension of the layer's output.

Limits: the layer's state (batch-norm statistics, ...) is not updated by the
step; dropout uses one fixed rng per step (the same on every device).
"""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from trax_models._task import Task, cross_entropy, progression_tokens
from trax_models._train_state import TrainState
from trax_models._train_step import StepFn, build_train_step, check_devices

TASKS: tuple[str, ...] = ("lm", "classify")


def import_trax() -> Any:
    """Imports trax (its import warns about gym, numpy 2 and TensorFlow: silenced).

    Raises:
      ImportError: naming the extra to install when trax is missing.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import trax
            import trax.models
    except ImportError as e:
        raise ImportError(
            f"real trax models need the trax package ({e}); install the extra: "
            "pip install -e '.[trax]' (trax==1.4.1, pulls TensorFlow)"
        ) from e
    return trax


def resolve_layer(path: str) -> Callable[..., Any]:
    """The layer constructor named by a dotted path, e.g. ``"trax.models.TransformerLM"``.

    Raises:
      ValueError: when the path does not name a callable in an importable module.
    """
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"expected a dotted path like 'trax.models.TransformerLM', got {path!r}")
    import_trax()
    module, _, attr = path.rpartition(".")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot find {path!r}: {e}; expected a trax layer constructor "
                         "such as trax.models.TransformerLM") from None
    if not callable(obj):
        raise ValueError(f"{path!r} is a {type(obj).__name__}, expected a layer constructor")
    return obj


def parse_kwargs(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The layer's keyword arguments from a JSON object (or a mapping)."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--trax-kwargs is not valid JSON ({e.msg} at char {e.pos}); "
                         'expected an object like \'{"vocab_size": 256, "d_model": 64}\'') from None
    if not isinstance(value, dict):
        raise ValueError(f"--trax-kwargs must be a JSON object, got {type(value).__name__}")
    return value


def trax_task(
    layer: Any,
    *,
    task: str = "lm",
    length: int = 16,
    vocab_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    seed: int = 0,
) -> Task:
    """A :class:`Task` training the trax ``layer`` (an instance, already constructed).

    Raises:
      ValueError: for an unknown task or missing ``vocab_size``/``input_shape``.
    """
    trax = import_trax()
    shapes = trax.shapes
    if task == "lm":
        if not vocab_size or vocab_size < 2:
            raise ValueError(f"task 'lm' needs vocab_size >= 2 (from the layer's kwargs), got {vocab_size}")
        example = np.ones((1, length), np.int32)
    elif task == "classify":
        if not input_shape:
            raise ValueError("task 'classify' needs input_shape, e.g. (32, 32, 3)")
        example = np.zeros((1, *input_shape), np.float32)
    else:
        raise ValueError(f"unknown trax task {task!r}; expected one of: {', '.join(TASKS)}")
    rng = jax.random.key_data(jax.random.key(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, state = layer.init(shapes.signature(example), rng=rng, use_cache=False)
    state = jax.tree.map(np.asarray, state)
    dropout_rng = jax.random.key_data(jax.random.key(seed + 1))

    def apply(weights: Any, x: jax.Array) -> jax.Array:
        out, _ = layer.pure_fn(x, weights, state, dropout_rng)
        return out

    def init(key: jax.Array) -> Any:
        weights, _ = layer.init(shapes.signature(example), rng=jax.random.key_data(key), use_cache=False)
        return weights

    if task == "lm":
        def loss(weights, batch):
            return cross_entropy(apply(weights, batch["inputs"]), batch["inputs"])

        def make_batch(rng: np.random.Generator, global_batch: int):
            return {"inputs": progression_tokens(rng, batch=global_batch, length=length,
                                                 vocab_size=vocab_size)}
    else:
        out = jax.eval_shape(apply, jax.eval_shape(init, jax.random.key(seed)), example)
        num_classes = int(out.shape[-1])

        def loss(weights, batch):
            return cross_entropy(apply(weights, batch["inputs"]), batch["labels"])

        def make_batch(rng: np.random.Generator, global_batch: int):
            x = rng.standard_normal((global_batch, *input_shape), dtype=np.float32)
            labels = rng.integers(0, num_classes, size=(global_batch,)).astype(np.int32)
            return {"inputs": x, "labels": labels}

    return Task(init=init, loss=loss, make_batch=make_batch)


def make_trax_train_step(
    layer: str | Callable[..., Any],
    kwargs: str | Mapping[str, Any] | None = None,
    *,
    task: str = "lm",
    batch_per_device: int = 2,
    length: int = 16,
    input_shape: tuple[int, ...] | None = None,
    devices: int | None = None,
    optimizer: str = "adamw",
    seed: int = 0,
    learning_rate: float | None = None,
) -> tuple[StepFn, tuple[TrainState, dict[str, jax.Array]]]:
    """Builds the data-parallel training step of a real trax layer.

    Example (needs the ``trax`` extra)::

      step, (state, batch) = make_trax_train_step(
          "trax.models.TransformerLM",
          {"vocab_size": 256, "d_model": 32, "d_ff": 64, "n_layers": 1, "n_heads": 2},
          devices=4)

    Args:
      layer: A dotted path to a trax layer constructor, or the constructor.
      kwargs: Its keyword arguments (a JSON object string or a mapping);
        ``mode`` defaults to ``"train"``.
      task: ``"lm"`` (needs ``vocab_size`` in ``kwargs``) or ``"classify"``
        (needs ``input_shape``).
      batch_per_device: Examples per device per step.
      length: Sequence length for ``"lm"``.
      input_shape: One example's shape for ``"classify"``.
      devices, optimizer, seed, learning_rate: As for ``make_train_step``.

    Raises:
      ImportError: when trax is not installed.
      ValueError: for a bad path, kwargs, task or sizes; or when the layer's
        constructor rejects the kwargs (the message says which layer).
    """
    constructor = resolve_layer(layer) if isinstance(layer, str) else layer
    options = {"mode": "train", **parse_kwargs(kwargs)}
    if batch_per_device < 1 or length < 1:
        raise ValueError(f"batch_per_device and length must be >= 1, got {batch_per_device} and {length}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = constructor(**options)
    except TypeError as e:
        name = getattr(constructor, "__name__", repr(constructor))
        raise ValueError(f"{name}(**{options}) failed: {e}") from None
    devices = check_devices(devices)
    name = getattr(constructor, "__name__", "trax_layer")
    the_task = trax_task(model, task=task, length=length, vocab_size=options.get("vocab_size"),
                         input_shape=input_shape, seed=seed)
    return build_train_step(the_task, batch_per_device * devices, devices=devices, optimizer=optimizer,
                            seed=seed, learning_rate=learning_rate, name=f"trax_{name}_train_step")

"""Getting the HLO graph out of a jitted training step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from disco.ir.graph import HloGraph


def check_step(step_fn: Any) -> None:
    """Raises TypeError unless ``step_fn`` is callable (a str has a ``.lower`` too)."""
    if not callable(step_fn):
        raise TypeError(f"step_fn: expected the training step (a function or a jax.jit result), "
                        f"got {type(step_fn).__name__}")


class StaticArgumentsError(TypeError):
    """The step is a ``jax.jit`` with static arguments, which disco's compiled steps cannot take."""


def lower(step_fn: Callable[..., Any], *args: Any, kwargs: Mapping[str, Any] | None = None) -> Any:
    """``jax.jit(step_fn).lower(*args, **kwargs)``; accepts an already jitted function too.

    ``kwargs`` are the step's keyword arguments (traced like the positional ones, as ``jax.jit``
    traces them), passed as a mapping so that no name of theirs can clash with this function's.

    Raises:
      TypeError: ``step_fn`` is not callable.
      StaticArgumentsError: ``step_fn`` is a ``jax.jit`` with static arguments: the compiled step
        takes the array arguments only, so it could not be called as the step is.
    """
    import jax

    check_step(step_fn)
    jitted = step_fn if hasattr(step_fn, "lower") else jax.jit(step_fn)
    kwargs = dict(kwargs or {})
    lowered = jitted.lower(*args, **kwargs)
    if lowered.in_tree != jax.tree.structure((args, kwargs)):
        raise StaticArgumentsError(
            "step_fn: a jax.jit with static arguments (static_argnums/static_argnames), which a compiled step "
            "cannot take; expected the plain step or a jax.jit without them: bind the static values with "
            "functools.partial(step, ...)")
    return lowered


def hlo_text(
    step_fn: Callable[..., Any],
    *args: Any,
    optimized: bool = False,
    compiler_options: Mapping[str, Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The step's HLO text: pre-optimisation (with metadata) or as compiled by XLA."""
    lowered = lower(step_fn, *args, kwargs=kwargs)
    if optimized:
        return lowered.compile(compiler_options=dict(compiler_options or {})).as_text()
    return lowered.as_text(dialect="hlo", debug_info=True)


def extract(
    step_fn: Callable[..., Any],
    *args: Any,
    optimized: bool = False,
    compiler_options: Mapping[str, Any] | None = None,
) -> HloGraph:
    """Extracts the HLO graph of ``step_fn`` applied to ``args``.

    Args:
      step_fn: the training step (a plain function or a ``jax.jit`` result).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).
      optimized: False for the pre-optimisation HLO that plans are written
        against; True for the module XLA compiled (with its fusions).
      compiler_options: per-compile XLA options, used when ``optimized``.

    Returns:
      The step computation as an :class:`HloGraph`.

    Example::

      step, args = trax_models.make_train_step("mlp", devices=4)
      graph = disco.extract(step, *args)
      print(graph.summary()["all_reduces"])
    """
    return HloGraph.from_hlo_text(
        hlo_text(step_fn, *args, optimized=optimized, compiler_options=compiler_options))

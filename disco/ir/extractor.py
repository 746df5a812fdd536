"""Getting the HLO graph out of a jitted training step."""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from disco.ir import gspmd, loop_collectives
from disco.ir.graph import HloGraph
from disco.ir.hlo_parse import parse_module


def check_step(step_fn: Any) -> None:
    """Raises TypeError unless ``step_fn`` is callable (a str has a ``.lower`` too) and not an
    ``nnx.jit`` object (its compiled form takes flax's split state, not the objects it is called with)."""
    if not callable(step_fn):
        raise TypeError(f"step_fn: expected the training step (a function or a jax.jit result), "
                        f"got {type(step_fn).__name__}")
    if type(step_fn).__module__.startswith("flax.nnx"):
        raise TypeError(
            f"step_fn: an nnx.jit step ({type(step_fn).__name__}), whose compiled form takes flax's split "
            "state rather than the modules it is called with; expected its functional form: "
            "graphdef, state = nnx.split((model, optimizer)); a jax.jit step(state, batch) that calls "
            "nnx.merge(graphdef, state) and returns nnx.state((model, optimizer)) (docs/guides/your-own-step.md)")


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
    """The step's HLO text: the text plans are written against (:func:`plan_text`, with metadata)
    or the module as compiled by XLA."""
    lowered = lower(step_fn, *args, kwargs=kwargs)
    if optimized:
        return lowered.compile(compiler_options=dict(compiler_options or {})).as_text()
    return plan_text(lowered, debug_info=True)


class GspmdWarning(UserWarning):
    """A ``jax.jit`` step with shardings could not be rewritten as its partitioned program."""


_PARTITIONED_CACHE: dict[tuple[str, str], str] = {}
_PARTITIONED_LOCK = threading.Lock()
_PARTITIONED_CACHE_SIZE = 16


def plan_text(lowered: Any, *, debug_info: bool = True) -> str:
    """The pre-optimisation HLO text of a lowered step that plans are written against.

    For a ``shard_map`` or ``pmap`` step, ``lowered.as_text(dialect="hlo")``: its collectives are
    in it. For a ``jax.jit`` step with shardings (GSPMD), whose all-reduces XLA's SPMD partitioner
    adds later, the partitioned program as a manual computation (:mod:`disco.ir.gspmd`): one
    compile of the step with XLA's dump of the ``spmd-partitioning`` pass, memoised per module
    and devices. Falls back to the plain text (which has no all-reduce, so the step checks then
    say why) when the step cannot be wrapped, with a :class:`GspmdWarning` naming the reason.

    In a GSPMD step's, the all-reduces a ``while`` loop only accumulates or writes slice by slice
    into its output are moved after the loop (:mod:`disco.ir.loop_collectives`), where buckets
    reach them (jax's own text of a shard_map step reaches its loop bodies through ``call``
    instructions, which the patterns do not follow: it is left as jax wrote it). XLA's default
    compile never reads this text: only a plan's does.
    """
    text = lowered.as_text(dialect="hlo", debug_info=debug_info)
    if "all-reduce" in text or "xla.sdy.meshes" not in text:
        return text  # written collectives (shard_map, pmap), or no mesh: nothing to partition
    try:
        plain = text if not debug_info else lowered.as_text(dialect="hlo")
        key = (hashlib.sha256(plain.encode()).hexdigest(), _device_key())
        with _PARTITIONED_LOCK:
            cached = _PARTITIONED_CACHE.get(key)
        if cached is None:  # parse the module only for a step not seen before
            if not gspmd.is_unpartitioned(text):
                return text
            cached = _manual_text(lowered, text)
            with _PARTITIONED_LOCK:
                if len(_PARTITIONED_CACHE) >= _PARTITIONED_CACHE_SIZE:
                    _PARTITIONED_CACHE.pop(next(iter(_PARTITIONED_CACHE)))
                _PARTITIONED_CACHE[key] = cached
        return cached
    except Exception as e:  # noqa: BLE001 - any failure leaves the step as jax lowered it, with the reason
        warnings.warn(f"disco: could not read the partitioned program of this jax.jit step with shardings "
                      f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}); "
                      "its all-reduces stay out of disco's reach", GspmdWarning, stacklevel=2)
        return text


def _device_key() -> str:
    import jax

    return f"{jax.default_backend()}:{','.join(str(d.id) for d in jax.devices())}"


def partitioned_module_text(lowered: Any) -> tuple[str, Any]:
    """XLA's module after SPMD partitioning (per-device shapes, one all-reduce per gradient), and
    the compiled step (its output shardings are what the partitioner chose).

    With jax's persistent compilation cache on, a compile it answers from the cache runs no XLA
    pass, so nothing is dumped: the module is then read from the copy kept beside that cache the
    first time (``<cache dir>/disco-partitioned/``, keyed by the module text, jax's version and the
    devices), so a second run of a job compiles nothing.

    Raises:
      RuntimeError: XLA wrote no module after ``spmd-partitioning`` and no copy was kept (a
        single-device compile, or a persistent cache filled before disco kept its copy).
    """
    import os
    import tempfile

    import jax

    keep = _kept_partitioned_path(lowered)
    with tempfile.TemporaryDirectory(prefix="disco-spmd-") as tmp:
        compiled = lowered.compile(compiler_options={
            "xla_dump_to": tmp, "xla_dump_hlo_pass_re": "spmd-partitioning", "xla_dump_hlo_as_text": True})
        names = sorted(n for n in os.listdir(tmp) if "after_spmd-partitioning" in n and n.endswith(".txt"))
        if names:
            with open(os.path.join(tmp, names[-1]), encoding="utf-8") as f:
                text = f.read()
            if keep is not None:
                _write_atomically(keep, text)
            return text, compiled
    if keep is not None and os.path.exists(keep):
        with open(keep, encoding="utf-8") as f:
            return f.read(), compiled
    cache = jax.config.jax_compilation_cache_dir
    raise RuntimeError("XLA wrote no module after its spmd-partitioning pass" + (
        f" (jax's persistent compilation cache in {cache} answered the compile, and holds no copy disco kept; "
        "clear that cache once)" if cache else ""))


def _kept_partitioned_path(lowered: Any) -> str | None:
    """Where the partitioned module of ``lowered`` is kept beside jax's persistent compilation
    cache (None when that cache is off)."""
    import os

    import jax

    cache = jax.config.jax_compilation_cache_dir
    if not cache or not jax.config.jax_enable_compilation_cache or "://" in str(cache):
        return None
    key = hashlib.sha256("\n".join((jax.__version__, _device_key(), lowered.as_text(dialect="hlo"))).encode())
    return os.path.join(cache, "disco-partitioned", key.hexdigest() + ".hlo")


def _write_atomically(path: str, text: str) -> None:
    import os
    import tempfile

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache directory: the next run dumps again if it can
        warnings.warn(f"disco: could not keep the partitioned module in {path} ({e})", GspmdWarning, stacklevel=3)


def _manual_text(lowered: Any, text: str) -> str:
    """The GSPMD step ``lowered`` (pre-partitioning ``text``) as a manual computation module."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    partitioned, compiled = partitioned_module_text(lowered)
    outs = jax.tree.leaves(compiled.output_shardings)
    if not all(isinstance(s, NamedSharding) for s in outs):
        raise gspmd.GspmdError("the step's outputs are not all NamedShardings")
    mesh = outs[0].mesh if outs else None
    params = gspmd.entry_parameters(text)
    if mesh is None or len(params) == 0:
        raise gspmd.GspmdError("the step has no outputs or no parameters to wrap")
    if dict(mesh.shape) != gspmd.mesh_axes(text):
        raise gspmd.GspmdError(f"the outputs' mesh {dict(mesh.shape)} is not the step's {gspmd.mesh_axes(text)}")
    def spec(dims: tuple[tuple[str, ...], ...]) -> PartitionSpec:
        return PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a for a in dims))

    in_specs = tuple(spec(p.spec) for p in params)
    out_specs = tuple(s.spec for s in outs)
    out_info = jax.tree.leaves(lowered.out_info)
    if any(0 in p.dims for p in params):
        raise gspmd.GspmdError("the step has an empty parameter")

    def body(*shards: Any) -> Any:  # a placeholder of the right shapes that reads every argument
        dep = sum(a.reshape(-1)[0].astype(jnp.float32) for a in shards) * 0
        return tuple(dep.astype(o.dtype) + jnp.zeros(NamedSharding(mesh, s).shard_shape(o.shape), o.dtype)
                     for o, s in zip(out_info, out_specs))

    def wrapper(*flat: Any) -> Any:
        return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*flat)

    structs = [jax.ShapeDtypeStruct(p.dims, jnp.dtype(p.dtype), sharding=NamedSharding(mesh, s))
               for p, s in zip(params, in_specs)]
    wrapper_text = jax.jit(wrapper, keep_unused=True).lower(*structs).as_text(dialect="hlo")
    return _out_of_loops(gspmd.manual_module(wrapper_text, partitioned, name=parse_module(text).name))


def _out_of_loops(text: str) -> str:
    """``text`` with the all-reduces :mod:`disco.ir.loop_collectives` covers moved out of their loops."""
    if " while(" not in text or " all-reduce(" not in text:
        return text
    return loop_collectives.hoist_all(text).text


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

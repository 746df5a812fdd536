"""Getting the HLO graph out of a jitted training step."""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from disco.ir import gspmd, loop_collectives, step_form
from disco.ir.graph import HloGraph
from disco.ir.hlo_parse import parse_module
from disco.ir.step_form import StepForm


def check_step(step_fn: Any) -> StepForm:
    """The step's :class:`~disco.ir.step_form.StepForm` (how it is called).

    Raises:
      StepFormError: (a TypeError) ``step_fn`` is not callable (a str has a ``.lower`` too) or is a
        flax NNX transform disco cannot lower on its own (:func:`disco.ir.step_form.read`).
    """
    return step_form.read(step_fn)


def lower(step_fn: Callable[..., Any], *args: Any, kwargs: Mapping[str, Any] | None = None) -> Any:
    """The step's ``jax.stages.Lowered`` for ``args`` / ``kwargs``: ``jax.jit(step_fn).lower(...)``
    for a plain function, the user's own jit's for a ``jax.jit`` (its static arguments baked in,
    its donation and shardings kept), and the inner jit's over the split state for an ``nnx.jit``.

    ``kwargs`` are the step's keyword arguments, passed as a mapping so that no name of theirs can
    clash with this function's.

    Raises:
      StepFormError: ``step_fn`` is not a step disco can call (:func:`check_step`).
      StepFormError: a static argument does not hash (jax refuses it too).
    """
    return check_step(step_fn).lower(args, kwargs)


def hlo_text(
    step_fn: Callable[..., Any],
    *args: Any,
    optimized: bool = False,
    compiler_options: Mapping[str, Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    strict: bool = False,
) -> str:
    """The step's HLO text: the text plans are written against (:func:`plan_text`, with metadata)
    or the module as compiled by XLA. ``strict``: a GSPMD step disco cannot wrap raises
    (:func:`plan_text`) instead of warning."""
    lowered = lower(step_fn, *args, kwargs=kwargs)
    if optimized:
        return lowered.compile(compiler_options=dict(compiler_options or {})).as_text()
    return plan_text(lowered, debug_info=True, strict=strict)


class GspmdWarning(UserWarning):
    """A ``jax.jit`` step with shardings could not be rewritten as its partitioned program."""


_PARTITIONED_CACHE: dict[tuple[str, str], str] = {}
_PARTITIONED_LOCK = threading.Lock()
_PARTITIONED_CACHE_SIZE = 16


def plan_text(lowered: Any, *, debug_info: bool = True, strict: bool = False) -> str:
    """The pre-optimisation HLO text of a lowered step that plans are written against.

    For a ``shard_map`` or ``pmap`` step, ``lowered.as_text(dialect="hlo")``: its collectives are
    in it. For a ``jax.jit`` step with shardings (GSPMD), whose all-reduces XLA's SPMD partitioner
    adds later, the partitioned program as a manual computation (:mod:`disco.ir.gspmd`): one
    compile of the step with XLA's dump of the ``spmd-partitioning`` pass, memoised per module
    and devices. Falls back to the plain text (which has no all-reduce, so the step checks then
    say why) when the step cannot be wrapped, with a :class:`GspmdWarning` naming the reason; with
    ``strict``, raises :class:`~disco.ir.gspmd.GspmdError` with that reason instead (``disco.optimize``:
    a step it cannot read is refused for what it could not read, not for the all-reduces it then lacks).

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
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if strict:
            raise gspmd.GspmdError(
                f"disco could not read the partitioned program of this jax.jit step with shardings ({reason}); "
                "expected a step over one mesh whose arguments are arrays with NamedShardings or None") from e
        warnings.warn(f"disco: could not read the partitioned program of this jax.jit step with shardings "
                      f"({reason}); its all-reduces stay out of disco's reach", GspmdWarning, stacklevel=2)
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
    devices), so a second run of a job compiles nothing. Where the cache holds the step and no copy
    (the program compiled it itself before disco read it), disco compiles it once more under another
    cache key (:data:`_OTHER_KEY`) to have XLA run the pass.

    Raises:
      RuntimeError: XLA wrote no module after ``spmd-partitioning`` (a single-device compile), or
        the cache answered both compiles and no copy was kept.
    """
    import os

    import jax

    keep = _kept_partitioned_path(lowered)
    # (large constants in full: a gradient scatter's offset table over more than 8 devices among them)
    dump = {"xla_dump_hlo_pass_re": "spmd-partitioning", "xla_dump_hlo_as_text": True,
            "xla_dump_large_constants": True}
    text, compiled = _dumped(lowered, dump)
    if text is None and keep is not None and os.path.exists(keep):
        with open(keep, encoding="utf-8") as f:
            return f.read(), compiled
    if text is None and keep is not None:
        # the cache answered a compile disco did not make (the step compiled by the program itself
        # first): compile once more under another cache key, an option that only embeds the module
        # in the executable, so that XLA runs its passes and dumps the module
        text, compiled = _dumped(lowered, {**dump, _OTHER_KEY: True})
    if text is not None:
        if keep is not None:
            _write_atomically(keep, text)
        return text, compiled
    cache = jax.config.jax_compilation_cache_dir
    raise RuntimeError("XLA wrote no module after its spmd-partitioning pass" + (
        f" (jax's persistent compilation cache in {cache} answered the compile, under both of disco's keys, and "
        "holds no copy disco kept; clear that cache once)" if cache else ""))


# A compile option that changes jax's persistent-cache key and not the compiled program (it embeds the
# HLO module in the executable); xla_dump_* options are left out of that key.
_OTHER_KEY = "xla_embed_ir_in_executable"


def _dumped(lowered: Any, options: dict[str, Any]) -> tuple[str | None, Any]:
    """(the module XLA dumped after its spmd-partitioning pass, or None when it ran no pass, and the
    compiled step) for one compile of ``lowered`` with ``options`` and a dump folder."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="disco-spmd-") as tmp:
        compiled = lowered.compile(compiler_options={"xla_dump_to": tmp, **options})
        names = sorted(n for n in os.listdir(tmp) if "after_spmd-partitioning" in n and n.endswith(".txt"))
        if not names:
            return None, compiled
        with open(os.path.join(tmp, names[-1]), encoding="utf-8") as f:
            return f.read(), compiled


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
    params = _with_chosen_shardings(params, compiled, mesh)

    def spec(dims: tuple[tuple[str, ...], ...]) -> PartitionSpec:
        return PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a for a in dims))

    in_specs = tuple(spec(p.spec) for p in params)
    out_specs = tuple(s.spec for s in outs)
    out_info = jax.tree.leaves(lowered.out_info)
    if any(0 in p.dims for p in params):
        raise gspmd.GspmdError("the step has an empty parameter")

    def placeholder(dep: Any, o: Any, s: PartitionSpec) -> Any:
        shape = NamedSharding(mesh, s).shard_shape(o.shape)
        if jax.dtypes.issubdtype(o.dtype, jax.dtypes.prng_key):  # a typed key: its key data in the module
            data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(o.shape, o.dtype))
            return dep.astype(data.dtype) + jnp.zeros(shape + data.shape[len(o.shape):], data.dtype)
        return dep.astype(o.dtype) + jnp.zeros(shape, o.dtype)

    def body(*shards: Any) -> Any:  # a placeholder of the right shapes that reads every argument
        dep = sum(a.reshape(-1)[0].astype(jnp.float32) for a in shards) * 0
        return tuple(placeholder(dep, o, s) for o, s in zip(out_info, out_specs))

    def wrapper(*flat: Any) -> Any:
        return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*flat)

    structs = [jax.ShapeDtypeStruct(p.dims, jnp.dtype(p.dtype), sharding=NamedSharding(mesh, s))
               for p, s in zip(params, in_specs)]
    # the step's donated parameters donated by the wrapper too, so the planned module aliases them as jax's does
    donated = tuple(i for i, p in enumerate(params) if p.number in gspmd.donated_parameters(text))
    wrapper_text = jax.jit(wrapper, keep_unused=True, donate_argnums=donated).lower(*structs).as_text(dialect="hlo")
    return _out_of_loops(gspmd.manual_module(wrapper_text, partitioned, name=parse_module(text).name))


def _with_chosen_shardings(params: list[gspmd.Parameter], compiled: Any, mesh: Any) -> list[gspmd.Parameter]:
    """``params`` with the sharding XLA's partitioner chose for each one the text leaves open (a
    ``jax.jit`` whose ``in_shardings`` hold ``None`` for it: an rng key, a scalar), read from the
    compiled step's input shardings (one per kept argument, in parameter order).

    Raises:
      GspmdError: an open parameter's chosen sharding is not a NamedSharding over the step's mesh.
    """
    from jax.sharding import NamedSharding

    if all(p.spec is not None for p in params):
        return params
    import jax

    chosen = [s for s in jax.tree.leaves(compiled.input_shardings, is_leaf=lambda x: x is None) if s is not None]
    if len(chosen) != len(params):
        raise gspmd.GspmdError(f"the compiled step has {len(chosen)} input shardings for {len(params)} entry "
                               "parameters; expected one per parameter")
    out = []
    for p, s in zip(params, chosen):
        if p.spec is None:
            if not isinstance(s, NamedSharding) or s.mesh.shape != mesh.shape:
                raise gspmd.GspmdError(f"entry parameter {p.number} (in_sharding None) was given {s!r} by XLA's "
                                       "partitioner; expected a NamedSharding over the step's mesh")
            dims = tuple(() if a is None else (a,) if isinstance(a, str) else tuple(a) for a in s.spec)
            p = p._replace(spec=dims + ((),) * (len(p.dims) - len(dims)))
        out.append(p)
    return out


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
    kwargs: Mapping[str, Any] | None = None,
) -> HloGraph:
    """Extracts the HLO graph of ``step_fn`` applied to ``args``.

    Args:
      step_fn: the training step as written: a plain function, a ``jax.jit`` (static arguments,
        donation and shardings as the jit has them) or an ``nnx.jit`` (called with the modules).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``; an ``nnx.jit`` step's modules).
      kwargs: example keyword arguments, as a mapping (so that no name of theirs clashes with these).
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
        hlo_text(step_fn, *args, optimized=optimized, compiler_options=compiler_options, kwargs=kwargs))

"""How a user's training step is called, and how a compiled executable of it is called the same way.

disco compiles a step's lowered module in jax's place, so what it compiles takes what jax's
``Lowered`` takes: the traced arguments only (the static arguments of a ``jax.jit`` are baked
into the module), and for flax NNX's ``nnx.jit`` the split state of the modules rather than the
modules. A :class:`StepForm`, read once from the step (:func:`read`), goes both ways: it lowers
the step for the user's arguments (:meth:`StepForm.lower`) and makes a compiled executable of
that lowering callable with the user's arguments (:meth:`StepForm.bind`), as the step itself is:

- a plain function or a ``jax.jit``: static arguments (``static_argnums`` / ``static_argnames``)
  are dropped before the call and must equal the ones it was compiled for (each distinct static
  value is its own compile, as ``jax.jit`` caches them); donated arguments are donated by the
  executable (its module keeps jax's aliasing), so a donated input is invalid after the call;
- an ``nnx.jit`` step: flax's own stages split the modules into state, call the executable and
  merge the new state back into the same objects, exactly as ``nnx.jit`` does (graph mode and
  tree mode alike: the compiled stage is flax's, with disco's executable inside it).

Measuring a step calls it many times on one set of example arguments; :meth:`StepForm.fresh`
gives each call arguments the step may consume or change (copies of the donated arrays, a clone
of the NNX objects) without touching the user's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

JIT, NNX, FUNCTION = "jax.jit", "nnx.jit", "function"


class StepFormError(TypeError):
    """The step is of a form disco cannot call (the message names the construct and the nearest form it takes)."""


class StaticArgumentsMismatch(ValueError):
    """A compiled step was called with other static arguments than it was compiled for."""


@dataclasses.dataclass(frozen=True)
class StepForm:
    """How a step is called (see the module doc).

    Attributes:
      step_fn: the step as the user wrote it.
      kind: ``"jax.jit"``, ``"nnx.jit"`` or ``"function"`` (plain: disco jits it).
      static_argnums: the positional arguments jax keeps static (resolved by jax from the jit's
        ``static_argnums`` and ``static_argnames``).
      static_argnames: the keyword arguments jax keeps static.
      donates: whether the jit declares donated arguments (``donate_argnums`` / ``donate_argnames``;
        a lowering's own record, :attr:`Lowering.donates`, is what calls go by).
    """

    step_fn: Callable[..., Any] = dataclasses.field(repr=False)
    kind: str
    static_argnums: tuple[int, ...] = ()
    static_argnames: tuple[str, ...] = ()
    donates: bool = False

    @property
    def jitted(self) -> Any:
        """The ``jax.jit`` object that lowers the step: the user's, nnx's inner one, or disco's own."""
        import jax

        if self.kind == NNX:
            return self.step_fn.jitted_fn
        return self.step_fn if self.kind == JIT else jax.jit(self.step_fn)

    def split(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any],
                                                                                  tuple[Any, ...]]:
        """The traced positional and keyword arguments, and the static ones as a comparable key
        (``((index, value), ...), ((name, value), ...)`` sorted). For an ``nnx.jit`` step the
        positions are those of the user's call, as nnx passes them on."""
        n = len(args)
        nums = {i % n for i in self.static_argnums if -n <= i < n}
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        statics = (tuple((i, args[i]) for i in sorted(nums)),
                   tuple(sorted(((k, v) for k, v in kwargs.items() if k in self.static_argnames), key=lambda kv: kv[0])))
        return dyn_args, dyn_kwargs, statics

    def statics(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """The static arguments of a call (a key: each distinct one is its own compile).

        Raises:
          StepFormError: a static argument does not hash (jax refuses it too).
        """
        key = self.split(args, kwargs)[2]
        bad = [(f"argument {i}", v) for i, v in key[0] if not _hashes(v)]
        bad += [(f"keyword {k!r}", v) for k, v in key[1] if not _hashes(v)]
        if bad:
            where = ", ".join(f"{w}: {type(v).__name__}" for w, v in bad)
            raise StepFormError(f"step_fn: a static argument ({where}) is not hashable; jax.jit requires static "
                                "arguments to be hashable: pass a frozen dataclass or a tuple, or make the "
                                "argument traced (drop it from static_argnums/static_argnames)")
        return key

    def lower(self, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None) -> Any:
        """``jax.stages.Lowered`` of the step for the user's arguments (for ``nnx.jit``, of its
        inner ``jax.jit`` over the split state); :meth:`lower_stage` also gives what :meth:`bind` needs."""
        return self.lower_stage(args, kwargs).lowered

    def lower_stage(self, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None) -> Lowering:
        """The step lowered for ``args`` / ``kwargs``: jax's ``Lowered``, flax's stage around it
        (``nnx.jit``; None otherwise) and the static arguments it was lowered for."""
        kwargs = dict(kwargs or {})
        statics = self.statics(args, kwargs)
        if self.kind != NNX:
            _check_no_graph_nodes(self, args, kwargs)
        if self.kind == NNX:
            stage = self.step_fn.lower(*args, **kwargs)
            return Lowering(stage.lowered, stage, statics, _donates(stage.lowered))
        lowered = self.jitted.lower(*args, **kwargs)
        return Lowering(lowered, None, statics, _donates(lowered))

    def bind(self, compiled: Any, lowering: Lowering) -> BoundStep:
        """``compiled`` (a ``jax.stages.Compiled`` of ``lowering.lowered``, or anything callable
        with its traced arguments) as a callable taking the user's arguments."""
        return BoundStep(compiled, self, lowering)

    def fresh(self, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None, *, donates: bool | None = None,
              ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments for one more call that leave the user's untouched: an ``nnx.jit`` step's
        objects cloned (the call updates them in place), and where the step donates (``donates``;
        default: what the jit declares), every array copied (a donated buffer is invalid after the
        call). Without either, the arguments themselves."""
        import jax

        kwargs = dict(kwargs or {})
        donates = self.donates if donates is None else donates
        if self.kind == NNX:
            from flax import nnx

            if not donates:
                return nnx.clone((args, kwargs))
            graphdef, state = nnx.split((args, kwargs))  # new objects holding copies of every array
            args, kwargs = nnx.merge(graphdef, jax.tree.map(_copy, state))
            return jax.tree.map(_copy, (args, kwargs), is_leaf=_is_graph_node)
        if not donates:
            return tuple(args), kwargs
        return jax.tree.map(_copy, (tuple(args), kwargs))


def _check_no_graph_nodes(form: StepForm, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Raises for flax NNX objects passed to a step that is not an ``nnx.jit``: ``jax.jit`` would take
    them as pytrees and drop the updates the step makes to them in place (an ``nnx.shard_map`` or
    ``nnx.pmap`` function on its own, or a plain function)."""
    import sys

    if "flax.nnx" not in sys.modules:  # no NNX object can be among the arguments
        return
    import jax

    from flax import nnx

    def stateful(x: Any) -> bool:  # a Module or an Optimizer; a Variable in a State pytree is NNX's functional form
        return _is_graph_node(x) and not isinstance(x, nnx.Variable)

    found = [(f"argument {i}" if isinstance(i, int) else f"keyword {i!r}", type(x).__name__)
             for i, value in [*enumerate(args), *kwargs.items()]
             for x in jax.tree.leaves(value, is_leaf=stateful) if stateful(x)]
    if found:
        where, kind = found[0]
        name = getattr(form.step_fn, "__name__", type(form.step_fn).__name__)
        raise StepFormError(
            f"step_fn: {where} is a flax NNX {kind}, but {name!r} is a {form.kind}, not an nnx.jit: "
            "jax.jit would take the module as a pytree and drop what the step updates in place; expected "
            "an nnx.jit step (nnx.jit(step), with nnx.shard_map or nnx.pmap inside it if the step uses them)")


def _donates(lowered: Any) -> bool:
    """Whether a lowering donates any argument (jax's ``args_info``: for a ``jax.pmap`` too, whose
    ``donate_argnums`` no jit record holds)."""
    import jax

    return any(getattr(a, "donated", False) for a in jax.tree.leaves(lowered.args_info))


def _hashes(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _copy(x: Any) -> Any:
    import jax

    return x.copy() if isinstance(x, jax.Array) else x


def _is_graph_node(x: Any) -> bool:
    from flax import nnx

    return nnx.graph.is_graph_node(x)


class Lowering(NamedTuple):
    """A step lowered for one call: jax's ``Lowered`` (what disco rewrites and compiles), flax's
    stage around it for an ``nnx.jit`` step (None otherwise), and the static arguments it was
    lowered for (:meth:`StepForm.statics`), and whether it donates any argument."""

    lowered: Any
    stage: Any
    statics: tuple[Any, ...]
    donates: bool = False


class _Ready:
    """Stands in for jax's ``Lowered`` inside flax's stage: its ``compile`` returns the executable
    disco compiled, so flax's own ``Lowered.compile`` wraps it in flax's ``Compiled``."""

    __slots__ = ("compiled",)

    def __init__(self, compiled: Any):
        self.compiled = compiled

    def compile(self, compiler_options: Any = None) -> Any:
        return self.compiled


class _Traced:
    """A compiled executable called with every argument of the inner jit (nnx passes the static
    ones on): drops the static ones first."""

    def __init__(self, compiled: Any, form: StepForm):
        self.compiled, self.form = compiled, form

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dyn_args, dyn_kwargs, _ = self.form.split(args, kwargs)
        return self.compiled(*dyn_args, **dyn_kwargs)


class BoundStep:
    """A compiled step called with the user's arguments (:meth:`StepForm.bind`).

    Attributes:
      compiled: the ``jax.stages.Compiled`` executable (taking the traced arguments only).
      form: the step's :class:`StepForm`.
      statics: the static arguments it was compiled for.
    """

    def __init__(self, compiled: Any, form: StepForm, lowering: Lowering):
        self.compiled = compiled
        self.form = form
        self.statics = lowering.statics
        self.donates = lowering.donates
        self._call: Callable[..., Any]
        if form.kind == NNX:
            stage = dataclasses.replace(lowering.stage, lowered=_Ready(_Traced(compiled, form)))
            self._call = stage.compile()
        else:
            self._call = _Traced(compiled, form)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.form.static_argnums or self.form.static_argnames:
            statics = self.form.statics(args, kwargs)
            if statics != self.statics:
                raise StaticArgumentsMismatch(
                    f"this step was compiled for the static arguments {_describe(self.statics)}, and was called "
                    f"with {_describe(statics)}; expected the same static values (xla_hooks.jit compiles each "
                    "static value's own step, as jax.jit does)")
        return self._call(*args, **kwargs)

    @property
    def consumes_arguments(self) -> bool:
        """Whether a call donates or updates its arguments (measure it with :meth:`fresh_arguments`)."""
        return self.donates or self.form.kind == NNX

    def fresh_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None,
                        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """:meth:`StepForm.fresh`: arguments for one more call that leave these usable."""
        return self.form.fresh(args, kwargs, donates=self.donates)

    def as_text(self) -> str:
        return self.compiled.as_text()

    def __repr__(self) -> str:
        return f"BoundStep({self.form.kind}, {len(self.statics[0]) + len(self.statics[1])} static arguments)"


def _describe(statics: tuple[Any, ...]) -> str:
    parts = [f"argument {i} = {v!r}"[:80] for i, v in statics[0]] + [f"{k}={v!r}"[:80] for k, v in statics[1]]
    return "(" + ", ".join(parts) + ")" if parts else "(none)"


def read(step_fn: Any) -> StepForm:
    """The form of ``step_fn``: a plain function, a ``jax.jit`` (its static and donated arguments
    read from jax's own record of them), or an ``nnx.jit`` step (graph or tree mode).

    Raises:
      StepFormError: ``step_fn`` is not callable, or is a flax NNX transform disco cannot lower
        (``nnx.shard_map``, ``nnx.pmap`` and the like without an ``nnx.jit`` around them), or
        jax's record of a jit's arguments has moved (a jax release disco does not know).
    """
    if not callable(step_fn):
        raise StepFormError(f"step_fn: expected the training step (a function, a jax.jit or an nnx.jit), "
                            f"got {type(step_fn).__name__}")
    module = type(step_fn).__module__ or ""
    if module.startswith("flax.nnx"):
        inner = getattr(step_fn, "jitted_fn", None)
        if inner is None or not hasattr(step_fn, "lower"):
            raise StepFormError(
                f"step_fn: a flax NNX {type(step_fn).__name__} disco cannot lower on its own; expected an nnx.jit "
                "step: wrap it as nnx.jit(step) (an nnx.shard_map or nnx.vmap inside an nnx.jit is read whole)")
        nums, names, donates = _jit_arguments(inner)
        return StepForm(step_fn, NNX, nums, names, donates)
    if hasattr(step_fn, "lower") and hasattr(step_fn, "_jit_info"):
        nums, names, donates = _jit_arguments(step_fn)
        return StepForm(step_fn, JIT, nums, names, donates)
    if hasattr(step_fn, "lower") and not isinstance(step_fn, str):  # a jit-like of another kind (jax.pmap)
        return StepForm(step_fn, JIT)
    return StepForm(step_fn, FUNCTION)


def _jit_arguments(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
    """A ``jax.jit``'s static positions and names, and whether it donates (jax's ``PjitInfo``,
    unchanged from jax 0.8.3 to 0.12)."""
    info = getattr(jitted, "_jit_info", None)
    if info is None:
        return (), (), False
    try:
        nums = tuple(int(i) for i in info.static_argnums)
        names = tuple(str(n) for n in info.static_argnames)
        donates = bool(info.donate_argnums) or bool(info.donate_argnames)
    except AttributeError as e:
        raise StepFormError(f"step_fn: this jax's record of a jit's arguments moved ({e}); expected jax's "
                            "PjitInfo with static_argnums, static_argnames, donate_argnums, donate_argnames") from None
    return nums, names, donates

"""``xla_hooks.apply``: compile a training step with a disco plan, or fall back.

The plan is applied to the step's pre-optimisation HLO (fusion groups as kLoop
fusions, cuts as optimization barriers, buckets as merged all-reduces), validated for
the backend first (XLA:GPU refuses fusion groups: the plan falls back with that reason
before anything is compiled), the rewritten module is compiled through
the released jaxlib with the passes that would undo the plan switched off, and the
result is a callable with the jitted step's signature. If anything goes wrong the
step is compiled by XLA's defaults and a :class:`PlanFallbackWarning` says why:
the user's step always runs.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from disco.plans.plan import FusionPlan

DEFAULT_PLAN = FusionPlan(name="xla_default")


class PlanFallbackWarning(UserWarning):
    """A plan could not be applied; XLA's default compile is used instead."""


@dataclasses.dataclass(frozen=True)
class AppliedStep:
    """A compiled step and what was applied to it.

    Attributes:
      compiled: the ``jax.stages.Compiled`` executable.
      plan: the plan that is in effect (``xla_default`` after a fallback).
      requested: the plan that was asked for.
      fallback_reason: why the requested plan was not applied, or None.
      hlo: the HLO text that was compiled (pre-optimisation; rewritten if a plan applied).
      call: ``compiled`` as a callable taking the step's own arguments
        (:class:`disco.ir.step_form.BoundStep`: static arguments dropped, an ``nnx.jit`` step's
        modules split and updated in place); None: ``compiled`` is called as it is.
    """

    compiled: Any
    plan: FusionPlan
    requested: FusionPlan
    fallback_reason: str | None = None
    hlo: str = ""
    call: Any = dataclasses.field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        """One line: the plan in effect and whether it applied (not the HLO text, often 100 kB)."""
        asked = "" if self.requested == self.plan else f", requested {self.requested.name[:40]!r}"
        why = "" if self.applied else f": {(self.fallback_reason or '').strip().splitlines()[0][:60]!r}"
        return (f"AppliedStep(plan {self.plan.name[:40]!r}{asked}, {'applied' if self.applied else 'fell back'}{why}, "
                f"hlo {len(self.hlo):,} chars)")

    @property
    def applied(self) -> bool:
        return self.fallback_reason is None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.call or self.compiled)(*args, **kwargs)

    def fresh_arguments(self, args: Any, kwargs: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Arguments for one more call that leave ``args`` / ``kwargs`` usable: copies of what the
        step donates, a clone of an ``nnx.jit`` step's modules (:meth:`disco.ir.step_form.StepForm.fresh`);
        the arguments themselves where a call consumes and changes nothing."""
        if self.call is None:
            return tuple(args), dict(kwargs or {})
        return self.call.fresh_arguments(tuple(args), kwargs)

    @property
    def consumes_arguments(self) -> bool:
        """Whether a call donates or updates its arguments (measure it with :meth:`fresh_arguments`)."""
        return self.call is not None and self.call.consumes_arguments

    def compiled_text(self) -> str:
        """The post-optimisation HLO XLA produced."""
        return self.compiled.as_text()


def _backend() -> str:
    import jax

    return jax.default_backend()


def compile_plan(plan: FusionPlan, step_fn: Callable[..., Any], *args: Any,
                 roundtrip: bool = False, probe: bool | None = None,
                 kwargs: Mapping[str, Any] | None = None) -> AppliedStep:
    """Compiles ``step_fn`` with ``plan``; raises on any failure (no fallback).

    Args:
      kwargs: the step's example keyword arguments, as :func:`apply` takes them.
      probe: compile the rewritten module in a child process first (see
        :mod:`xla_hooks.probe`), so that an XLA abort raises ProbeFailure here instead
        of killing this process. None (the default) probes the plans of the kinds measured
        to abort XLA: fusion groups, and on CPU cuts and gather anchors (an optimization
        barrier on a shard_map boundary aborted XLA:CPU; validation refuses that cut or
        anchor, the probe guards against the ones not yet found). Cuts on a GPU are not probed: the child would
        open a second client on the GPU, which was not measured.
      roundtrip: send even a plan without groups or buckets through disco's
        HLO-text path. XLA's fusion heuristics see a slightly different module on
        that path (measured: transformer_lm tiny gets 279 instead of 281 fusions),
        so its rounding can differ from the default compile by an ulp; comparing
        a plan with the round-tripped default isolates what the plan changes.

    Raises:
      ValueError: the plan does not fit the step's graph or the backend, or was made for another
        graph (its ``graph_fingerprint`` differs from the step's).
      PrivateApiError: a private jax API changed.
      Exception: whatever XLA raises when the rewritten module does not compile.
    """
    from disco.ir.extractor import check_step, plan_text
    from disco.ir.graph import HloGraph
    from xla_hooks import _jax_private
    from xla_hooks.rewrite import apply_plan_to_text

    from disco.plans import options as plan_options

    form = check_step(step_fn)
    lowering = form.lower_stage(args, kwargs)
    lowered = lowering.lowered
    check_not_replicated(lowered)

    def done(compiled: Any, hlo: str) -> AppliedStep:
        return AppliedStep(compiled, plan, plan, None, hlo, form.bind(compiled, lowering))

    text = plan_text(lowered, debug_info=False)  # a GSPMD step: its partitioned program
    backend = _backend()
    plan_options.check(plan.compile_options, backend)  # also for a plan of options alone (validate skipped)
    options = plan.compiler_options(backend)
    graph = None
    if plan.graph_fingerprint is not None:  # the text disco.extract reads (its fingerprint counts metadata)
        graph = HloGraph.from_hlo_text(plan_text(lowered, debug_info=True))
        check_fingerprint(plan, graph)
    if (not plan.groups and plan.buckets is None and not plan.cuts and plan.gather_buckets is None
            and not plan.gather_after and not roundtrip):
        return done(lowered.compile(compiler_options=options), text)
    plan.validate(graph or HloGraph.from_hlo_text(text), backend)
    _jax_private.check_version()
    if (not plan.groups and not plan.buckets and not plan.cuts and not plan.gather_buckets and not plan.gather_after
            and not roundtrip):
        # nothing to rewrite (buckets=() fits only a step without all-reduces): XLA's compile as is
        return done(lowered.compile(compiler_options=options), text)
    new_text = apply_plan_to_text(text, plan)
    if probe or (probe is None and (plan.groups or ((plan.cuts or plan.gather_after) and backend == "cpu"))):
        from xla_hooks import probe as _probe

        _probe.probe(new_text, _jax_private.device_count(lowered), options, platform=backend)
    return done(_jax_private.compile_rewritten(lowered, new_text, options), new_text)


def check_fingerprint(plan: FusionPlan, graph: Any) -> None:
    """Raises when ``plan`` records a graph fingerprint other than ``graph``'s (plans without
    one, written before it was recorded, pass).

    Raises:
      ValueError: naming both fingerprints.
    """
    if plan.graph_fingerprint is not None and plan.graph_fingerprint != graph.fingerprint:
        raise ValueError(f"plan {plan.name or plan.digest()!r} was made for graph {plan.graph_fingerprint}, "
                         f"but this step's graph is {graph.fingerprint} (another model, preset, batch or "
                         "device count?)")


def check_not_replicated(lowered: Any) -> None:
    """Raises ValueError for a module jax lowered as replicas (``mhlo.num_replicas`` > 1).

    jax lowers ``jax.pmap`` through shard_map (one program over partitions, which plans reach) by
    default on every release disco supports; only jax < 0.9 with ``jax_pmap_shmap_merge`` off lowers
    it (and ``jax.jit`` of it) as replicas of a per-device program, whose rewritten module compiles
    but is then fed the arguments' global shapes. Such a step falls back to XLA's default compile.
    """
    attributes = lowered.compiler_ir("stablehlo").operation.attributes
    replicas = attributes["mhlo.num_replicas"].value if "mhlo.num_replicas" in attributes else 1
    if replicas > 1:
        raise ValueError(
            f"step_fn: lowered as {replicas} replicas (a jax.pmap with jax_pmap_shmap_merge off, jax < 0.9), "
            "which a plan cannot be applied to; expected a program over partitions: leave "
            "jax_pmap_shmap_merge on (its default) or write the step with jax.shard_map")


def apply(plan: FusionPlan | None, step_fn: Callable[..., Any], *args: Any, strict: bool = False,
          kwargs: Mapping[str, Any] | None = None, memory_limit: int | str | None = None) -> AppliedStep:
    """Compiles ``step_fn`` for ``args`` with ``plan``, falling back to XLA's default.

    Args:
      plan: the plan (None means XLA's default compile).
      step_fn: the training step: a plain function, a ``jax.jit`` (static arguments, donation and
        shardings as it has them) or an ``nnx.jit`` (called with the modules, updated in place).
      *args: example arguments; the returned callable takes arguments of the
        same shapes, dtypes and shardings and returns the same pytrees.
      kwargs: example keyword arguments, if the step is called with some (a mapping, so that
        their names cannot clash with ``strict``); the returned callable takes keyword arguments
        of the same names, shapes and dtypes.
      strict: raise instead of falling back (for a plan made for another graph, one that
        does not fit, or a compile that fails).
      memory_limit: bytes per device (an integer or a string such as "2GB"): when the plan's
        compiled step needs more peak device memory than this (XLA's memory analysis,
        :func:`disco.sim.memory.peak_memory`) and XLA's default compile does not, XLA's default is
        used and a :class:`PlanFallbackWarning` names both numbers (with ``strict``: ValueError).
        When XLA's default is over it too, the plan is kept with a ``UserWarning`` saying so.
        None: no limit.

    Returns:
      An :class:`AppliedStep`; ``.applied`` says whether the plan is in effect.

    Raises:
      TypeError: ``plan`` is not a FusionPlan, ``step_fn`` is not callable or not a form disco
        can call, or a static argument does not hash (usage errors, never a fallback).
      ValueError, Exception: only with ``strict``: what :func:`compile_plan` raises, or the plan
        over ``memory_limit`` (ValueError). A ``memory_limit`` that is no size is a ValueError always.

    Example::

      step = xla_hooks.apply(plan, train_step, state, batch)
      state, loss = step(state, batch)
    """
    if plan is not None and not isinstance(plan, FusionPlan):
        hint = " (FusionPlan.from_dict or FusionPlan.from_json reads a plan's JSON)" if isinstance(plan, (dict, str)) else ""
        raise TypeError(f"plan: expected a disco FusionPlan or None, got {type(plan).__name__}{hint}")
    from disco.ir.extractor import check_step

    form = check_step(step_fn)  # a usage error too: the fallback could not compile it either
    form.statics(tuple(args), dict(kwargs or {}))  # an unhashable static argument: jax refuses it too
    plan = plan or DEFAULT_PLAN
    if memory_limit is not None:
        from disco.sim.cluster_spec import parse_bytes

        memory_limit = parse_bytes(memory_limit, "memory_limit")
    if strict:
        return _within(compile_plan(plan, step_fn, *args, kwargs=kwargs), memory_limit, step_fn, args, kwargs, True)
    try:
        step = compile_plan(plan, step_fn, *args, kwargs=kwargs)
    except Exception as e:  # noqa: BLE001 - any failure must fall back, with its reason
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        warnings.warn(
            f"disco: plan {plan.name or plan.digest()!r} could not be applied ({reason}); "
            "using XLA's default compile", PlanFallbackWarning, stacklevel=2)
        lowering = form.lower_stage(tuple(args), kwargs)
        compiled = lowering.lowered.compile()
        return AppliedStep(compiled, DEFAULT_PLAN, plan, reason, lowering.lowered.as_text(dialect="hlo"),
                           form.bind(compiled, lowering))
    return _within(step, memory_limit, step_fn, args, kwargs, False)


def _within(step: AppliedStep, limit: int | None, step_fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: Mapping[str, Any] | None, strict: bool) -> AppliedStep:
    """``step``, or XLA's default compile when ``step``'s plan needs more peak device memory than
    ``limit`` and the default does not (:func:`apply`'s ``memory_limit``)."""
    from disco.sim.memory import peak_bytes

    if limit is None or not step.applied or step.plan.is_default:
        return step
    peak = peak_bytes(step)
    if peak is None or peak <= limit:
        return step
    name = step.plan.name or step.plan.digest()
    default = compile_plan(DEFAULT_PLAN, step_fn, *args, kwargs=kwargs)
    base = peak_bytes(default)
    if base is not None and base > limit:
        warnings.warn(f"disco: plan {name!r} needs {peak:,} bytes of device memory at its peak (XLA's memory "
                      f"analysis), over the limit of {limit:,}, but XLA's default compile needs {base:,}, over it "
                      "too; keeping the plan", UserWarning, stacklevel=3)
        return step
    reason = (f"peak device memory {peak:,} bytes (XLA's memory analysis of its compiled step) over the limit of "
              f"{limit:,} bytes; XLA's default compile needs {'an unknown amount' if base is None else f'{base:,}'}")
    if strict:
        raise ValueError(f"plan {name!r}: {reason}")
    warnings.warn(f"disco: plan {name!r} not applied: {reason}; using XLA's default compile", PlanFallbackWarning,
                  stacklevel=3)
    return dataclasses.replace(default, requested=step.requested, fallback_reason=reason)

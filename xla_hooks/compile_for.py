"""One compile of a pre-optimisation module for a cluster's device: the module XLA really builds.

:func:`compile_for` returns the optimised, scheduled module's text (``Compiled.as_text()``) for
``devices`` devices of a device kind: on ``cpu`` with this process's XLA:CPU backend (the caller
starts enough virtual CPU devices first), on a GPU kind (``h100``) with deviceless XLA:GPU in the
``.venv-gpu`` child (:mod:`xla_hooks.deviceless`). The simulator's compiled tier
(:mod:`disco.sim.compiled`) prices what it returns. :func:`compiled_plan_text` is the same for a
plan applied to a jax step on this process's backend (:func:`xla_hooks.apply_plan.compile_plan`);
:func:`plan_text_for`, for a plan applied to a pre-optimisation module's text and compiled for any
device kind :func:`compile_for` targets (a GPU cluster's plans, priced from a machine without its GPUs).
:func:`compile_module` and :func:`plan_module_for` return the module with its peak device memory
(XLA's memory analysis of the executable, deviceless XLA:GPU's for a GPU kind).

Example:
  >>> text = compile_for(pre_text, device="h100", devices=8)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from xla_hooks import deviceless

if TYPE_CHECKING:
    from disco.plans.plan import FusionPlan
    from disco.sim.memory import PeakMemory


def compile_for(text: str, *, device: str, devices: int = 1, options: Mapping[str, Any] | None = None,
                autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                timeout: float = deviceless.COMPILE_TIMEOUT_S) -> str:
    """The compiled module of HLO ``text`` for ``devices`` devices of kind ``device``.

    Args:
      autotune_results: for a GPU kind, a file of XLA's autotuning results whose GEMM and convolution
        choices the deviceless compile takes (:mod:`xla_hooks.autotune_results`).
      timeout: seconds a deviceless compile may take (a compile on this process's CPU has none).

    Raises:
      ValueError: for a device kind no compiler here targets, too few local CPU devices, autotune
        results for a CPU (XLA:CPU does not autotune), or a missing or malformed results file.
      deviceless.DevicelessUnavailable: for a GPU kind without the deviceless environment (or a
        failed deviceless compile).
      xla_hooks._jax_private.PrivateApiError: when jax's private compile API moved.
      Exception: what XLA raises for a module it rejects (jax's ``JaxRuntimeError``).
    """
    if device in deviceless.TARGETS:
        return deviceless.compile_hlo(text, target=device, devices=devices, options=options,
                                      autotune_results=autotune_results, use_cache=use_cache, timeout=timeout)
    _check_cpu(device, devices, autotune_results)
    import jax

    from xla_hooks import _jax_private

    return _jax_private.compile_text_for(text, jax.devices("cpu")[:devices], dict(options or {}))


def _check_cpu(device: str, devices: int, autotune_results: Any) -> None:
    """:func:`compile_for`'s checks of a compile on this process's CPU devices."""
    if device != "cpu":
        raise ValueError(f"compile_for: device kind {device!r}; expected 'cpu' or one of "
                         f"{sorted(deviceless.TARGETS)} (deviceless)")
    if autotune_results is not None:
        raise ValueError(f"compile_for: autotune results {str(autotune_results)!r} for device 'cpu': XLA:CPU does "
                         f"not autotune; they are XLA:GPU's (expected a GPU kind: {sorted(deviceless.TARGETS)})")
    import jax

    local = jax.devices("cpu")
    if len(local) < devices:
        raise ValueError(f"compile_for: the module needs {devices} CPU devices, this process has {len(local)}")


def plan_text_for(text: str, plan: FusionPlan, *, device: str, devices: int = 1,
                  autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                  timeout: float = deviceless.COMPILE_TIMEOUT_S) -> str:
    """The compiled module of pre-optimisation ``text`` with ``plan`` applied, for ``devices`` of ``device``.

    The plan's buckets and cuts are written into the text (:func:`xla_hooks.rewrite.apply_plan_to_text`:
    concatenated or reduce-scatter + all-gather buckets, an ``opt-barrier`` per cut producer) and its
    compile options, with the passes its decisions need off for the device's backend, go to
    :func:`compile_for`. The plan must have been validated against ``text``'s graph.

    Raises:
      ValueError: for a plan with fusion groups on a GPU kind (``mhlo.fusion`` cannot reach XLA:GPU:
        ../shared/GPU_NOTES.md), and what :func:`compile_for` raises.
      deviceless.DevicelessUnavailable: as :func:`compile_for`.
    """
    text, options, _ = _plan_input(text, plan, device)
    return compile_for(text, device=device, devices=devices, options=options, autotune_results=autotune_results,
                       use_cache=use_cache, timeout=timeout)


def _plan_input(text: str, plan: FusionPlan, device: str) -> tuple[str, dict[str, Any], str]:
    """(the text with ``plan`` written in, its compile options for ``device``'s backend, the backend)."""
    from disco.sim.cluster_spec import backend_of
    from xla_hooks.rewrite import apply_plan_to_text

    backend = backend_of(device)
    if plan.groups and backend == "gpu":
        raise ValueError(f"plan {plan.name or plan.digest()!r} has {len(plan.groups)} fusion group(s), which cannot "
                         f"reach XLA:GPU (jax's PJRT plugin takes StableHLO, where mhlo.fusion has no form); "
                         f"a GPU plan holds buckets, cuts and compile options")
    return apply_plan_to_text(text, plan), dict(plan.compiler_options(backend)), backend


class CompiledModule(NamedTuple):
    """A compiled module and its peak device memory.

    Attributes:
      text: the optimised, scheduled module (what :func:`compile_for` returns).
      memory: one device's memory (:class:`disco.sim.memory.PeakMemory`), or None (``memory_note``).
      memory_from: where ``memory`` came from: ``"xla"`` (XLA's memory analysis of the executable the
        compile built: XLA:GPU's buffer assignment for a GPU kind, deviceless), or
        :data:`disco.sim.module_memory.SOURCE` (estimated from the module's buffers, where the
        compile reported no analysis); None without ``memory``.
      memory_note: why the analysis is not XLA's (None when it is).
    """

    text: str
    memory: PeakMemory | None
    memory_from: str | None
    memory_note: str | None = None


def compile_module(text: str, *, device: str, devices: int = 1, options: Mapping[str, Any] | None = None,
                   autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                   timeout: float = deviceless.COMPILE_TIMEOUT_S) -> CompiledModule:
    """:func:`compile_for` with the executable's peak memory (:class:`CompiledModule`): XLA's memory
    analysis where the compile reports it (deviceless XLA:GPU does), else estimated from the module's
    buffers (:func:`disco.sim.module_memory.estimate`).

    Raises:
      what :func:`compile_for` raises.
    """
    import types

    from disco.sim import memory, module_memory

    if device in deviceless.TARGETS:
        out = deviceless.compile_hlo_module(text, target=device, devices=devices, options=options,
                                            autotune_results=autotune_results, use_cache=use_cache,
                                            timeout=timeout)
        module_text, sizes, note = out.text, out.memory, out.memory_note
    else:
        _check_cpu(device, devices, autotune_results)
        import jax

        from xla_hooks import _jax_private

        module_text, sizes, note = _jax_private.compile_module_for(text, jax.devices("cpu")[:devices],
                                                                   dict(options or {}))
    if sizes is not None:
        return CompiledModule(module_text, memory.peak_memory(types.SimpleNamespace(**sizes)), "xla")
    why = note or "the compile reported no memory analysis"
    return CompiledModule(module_text, module_memory.estimate(module_text), module_memory.SOURCE,
                          f"{why}: estimated from the compiled module's buffers")


def plan_module_for(text: str, plan: FusionPlan, *, device: str, devices: int = 1,
                    autotune_results: str | os.PathLike[str] | None = None, use_cache: bool = True,
                    timeout: float = deviceless.COMPILE_TIMEOUT_S) -> CompiledModule:
    """:func:`plan_text_for` with the compiled step's peak memory (:func:`compile_module`).

    Raises:
      what :func:`plan_text_for` raises.
    """
    text, options, backend = _plan_input(text, plan, device)
    return compile_module(text, device=device, devices=devices, options=options,
                          autotune_results=autotune_results, use_cache=use_cache, timeout=timeout)


class DeadlinePassed(RuntimeError):
    """A :func:`plan_compiler`'s deadline passed before a compile began."""


def unavailable(device: str) -> str | None:
    """Why plans for ``device`` cannot be compiled here, or None: a GPU kind needs the deviceless
    environment (``make install-gpu``); a kind no compiler here targets is named."""
    if device == "cpu":
        return None
    if device not in deviceless.TARGETS:
        return (f"no compiler here targets device kind {device!r} (expected 'cpu' or one of "
                f"{sorted(deviceless.TARGETS)})")
    if not deviceless.available():
        return f"no deviceless XLA:GPU environment here: {deviceless.INSTALL_HINT}"
    return None


def plan_module_compiler(text: str, *, device: str, devices: int,
                         deadline: float | None = None) -> Callable[[FusionPlan], CompiledModule]:
    """:func:`plan_compiler` whose function returns the :class:`CompiledModule` (the module with its
    peak memory, :func:`plan_module_for`): ``disco.optimizer.predict``'s compile function.

    Raises:
      ValueError: as :func:`plan_compiler`.
    """
    return _plan_compiler(text, device=device, devices=devices, deadline=deadline, build=plan_module_for)


def plan_compiler(text: str, *, device: str, devices: int,
                  deadline: float | None = None) -> Callable[[FusionPlan], str]:
    """plan -> :func:`plan_text_for` of ``text`` for ``devices`` of ``device`` (with the autotuning
    results shipped for a GPU kind, where the deviceless environment's jax wrote them): the compile
    function of :func:`disco.planner.plan_for_graph`'s compiled tier and of ``disco.optimizer.predict``.

    Args:
      deadline: a ``time.monotonic()`` time: a compile gets the time left as its timeout, and none
        begins after it (:class:`DeadlinePassed`).

    Raises:
      ValueError: what :func:`unavailable` says, for a device kind that cannot be compiled here.
    """
    return _plan_compiler(text, device=device, devices=devices, deadline=deadline, build=plan_text_for)


def _plan_compiler(text: str, *, device: str, devices: int, deadline: float | None,
                   build: Callable[..., Any]) -> Callable[[FusionPlan], Any]:
    import time

    problem = unavailable(device)
    if problem is not None:
        raise ValueError(f"plan_compiler: {problem}")
    results = deviceless.shipped_autotune_results(device) if device != "cpu" else None

    def compile_plan(plan: FusionPlan) -> str:
        timeout = deviceless.COMPILE_TIMEOUT_S
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                raise DeadlinePassed(f"not compiled: the deadline passed {-timeout:.1f} s before plan "
                                     f"{plan.name or plan.digest()[:12]!r} would begin")
        return build(text, plan, device=device, devices=devices, autotune_results=results, timeout=timeout)

    return compile_plan


def compiled_plan_text(plan: FusionPlan, step_fn: Callable[..., Any], *args: Any,
                       kwargs: Mapping[str, Any] | None = None) -> str:
    """The optimised module XLA builds for ``step_fn`` with ``plan`` on this process's backend.

    Raises:
      what :func:`xla_hooks.apply_plan.compile_plan` raises (no fallback: a plan that does not apply
      is an error here, so a price never belongs to another plan).
    """
    from xla_hooks.apply_plan import compile_plan

    return compile_plan(plan, step_fn, *args, kwargs=kwargs).compiled.as_text()

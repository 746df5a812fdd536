"""jax's automatic profile-guided latency estimator (auto-PGLE) on a step, as one compile.

With ``JAX_ENABLE_PGLE=1`` (``jax_enable_pgle``), ``jax.jit`` profiles a step's first
``jax_pgle_profiling_runs`` runs (default 3) and recompiles it with the aggregated profile
(``fdo_profile``), whose measured instruction latencies XLA:GPU's latency-hiding scheduler then uses.
:func:`compile_auto_pgle` takes the same steps explicitly (compile XLA's default, run it ``runs`` times
under jax's PGLE profiler, recompile with the profile) and returns an
:class:`xla_hooks.apply_plan.AppliedStep` named ``auto_pgle``, so that it can be timed interleaved with
other plans: the executable of the config route lives in jax's jit cache under the config's key, and
is only reached with the config on.

It needs a GPU (a profile of device kernels): elsewhere it is refused with
:data:`disco.plans.baselines.AUTO_PGLE_OFF_GPU`; ``allow_cpu`` lets a dry run of a GPU script through.
``scripts/tools/check_gpu.py`` measures it next to disco's plans.

Example:
  >>> applied = compile_auto_pgle(step, *example)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disco.plans.baselines import AUTO_PGLE_OFF_GPU
from disco.plans.plan import FusionPlan
from xla_hooks.apply_plan import AppliedStep

NAME = "auto_pgle"
PROFILING_RUNS = 3  # jax's default jax_pgle_profiling_runs


def compile_auto_pgle(step_fn: Callable[..., Any], *args: Any, runs: int = PROFILING_RUNS,
                      allow_cpu: bool = False) -> AppliedStep:
    """``step_fn`` compiled as auto-PGLE compiles it: after ``runs`` profiled runs of XLA's default.
    When jax's PGLE profiler moved or profiled nothing (on CPU: no device trace), XLA's default
    compile with the reason, as :func:`xla_hooks.apply_plan.apply` falls back.

    Raises:
      ValueError: off a GPU (unless ``allow_cpu``), or ``runs`` < 1.
    """
    import jax

    from xla_hooks import _jax_private

    if jax.default_backend() != "gpu" and not allow_cpu:
        raise ValueError(f"{AUTO_PGLE_OFF_GPU} (this process runs on {jax.default_backend()})")
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"auto_pgle: runs expected an integer >= 1, got {runs!r}")
    from disco.ir.extractor import check_step

    form = check_step(step_fn)
    lowering = form.lower_stage(args, {})
    lowered = lowering.lowered
    default = form.bind(lowered.compile(), lowering)
    text = lowered.as_text(dialect="hlo")
    plan = FusionPlan(name=NAME)

    def run() -> None:  # each profiled run on fresh arguments where the step donates or updates them
        a, kw = default.fresh_arguments(tuple(args)) if default.consumes_arguments else (args, {})
        jax.block_until_ready(default(*a, **kw))

    try:
        profile = _jax_private.pgle_fdo_profile(run, runs)
    except _jax_private.PrivateApiError as e:
        return AppliedStep(default.compiled, FusionPlan(name="xla_default"), plan, f"auto_pgle fell back: {e}", text,
                           default)
    compiled = lowered.compile(compiler_options={"fdo_profile": profile})
    return AppliedStep(compiled, plan, plan, None, text, form.bind(compiled, lowering))

"""What a compiled step depends on beside its program: the part of a plan's key the job supplies.

jax's persistent compilation cache keys an executable by the module, the jax and jaxlib
versions, the XLA flags and the device topology; a plan searched (or measured) under one of
those is not evidence for another. :func:`current` reads them in the job; ``xla_hooks.jit``
sends them with a plan request, the service puts them into the plan key
(:func:`disco.planner.plan_key`) and echoes them in the plan's report, and the hook refuses an
answer made for another environment.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any

# XLA_FLAGS that change what XLA writes beside the executable, never the executable itself
_OUTPUT_ONLY_FLAGS = ("--xla_dump", "--xla_log", "--xla_cpu_dump", "--xla_gpu_dump")


@dataclasses.dataclass(frozen=True)
class CompileEnvironment:
    """The job's side of a plan key.

    Attributes:
      jax, jaxlib: the installed versions.
      platform: the backend's platform ("cpu", "gpu"/"cuda", "tpu").
      device_kind: the first device's kind ("cpu", "NVIDIA H100 80GB HBM3").
      processes: ``jax.process_count()``.
      devices_per_process: ``jax.local_device_count()``.
      xla_flags: the ``XLA_FLAGS`` the job compiles with, sorted, without the dump and log flags.
    """

    jax: str
    jaxlib: str
    platform: str
    device_kind: str
    processes: int
    devices_per_process: int
    xla_flags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the service's ``environment`` field)."""
        return {**dataclasses.asdict(self), "xla_flags": list(self.xla_flags)}


def xla_flags(value: str | None) -> tuple[str, ...]:
    """The flags of an ``XLA_FLAGS`` value that can change a compile, sorted."""
    flags = shlex.split(value or "")
    return tuple(sorted(f for f in flags if not f.startswith(_OUTPUT_ONLY_FLAGS)))


def current() -> CompileEnvironment:
    """This process's environment (imports jax)."""
    import jax
    import jaxlib

    first = jax.devices()[0]
    return CompileEnvironment(jax=jax.__version__, jaxlib=str(getattr(jaxlib, "__version__", "unknown")),
                              platform=first.platform, device_kind=first.device_kind,
                              processes=jax.process_count(), devices_per_process=jax.local_device_count(),
                              xla_flags=xla_flags(os.environ.get("XLA_FLAGS")))

"""Every private jax/jaxlib API disco touches, in one place, behind a version check.

Applying a plan means compiling HLO that jax did not produce itself. The released
jaxlib has no public entry point for that which still returns a jax ``Compiled``
(pytrees in and out), so this module swaps a rewritten module into a ``Lowered``
object. Anything here may break with a new jax release: callers catch
:class:`PrivateApiError` and fall back to XLA's default compile.
"""

from __future__ import annotations

from typing import Any

TESTED_JAX_VERSIONS = ("0.8.3", "0.9.2", "0.10.2", "0.11.2", "0.12.0.1")


class PrivateApiError(RuntimeError):
    """A private jax API disco relies on is missing or behaves differently."""


def major_minor(version: str) -> tuple[int, int]:
    """``"0.12.0.1"`` -> ``(0, 12)``: the release a jax or jaxlib version string belongs to."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def check_version() -> str:
    """jax's version, if it belongs to a release (major.minor) the hooks were tested on.

    Patch versions of a release keep these private APIs (a patch carries fixes, not refactors;
    measured 2026-11-25 on CPU: the hook tests pass on 0.11.1 and 0.12.0 as on 0.11.2 and 0.12.0.1), so a user's
    0.11.1 is not refused for lacking the last patch; whatever did change still raises
    :class:`PrivateApiError` where it is used, and the plan falls back.

    Raises:
      PrivateApiError: jax's release is none of TESTED_JAX_VERSIONS'.
    """
    import jax

    if major_minor(jax.__version__) not in {major_minor(v) for v in TESTED_JAX_VERSIONS}:
        releases = ", ".join(".".join(map(str, major_minor(v))) for v in TESTED_JAX_VERSIONS)
        raise PrivateApiError(
            f"jax {jax.__version__} is not of a release disco's XLA hooks were tested with "
            f"(releases {releases}; tested: {', '.join(TESTED_JAX_VERSIONS)})")
    return jax.__version__


def hlo_text_to_mlir_bytes(text: str, platform: str = "cpu") -> bytes:
    """HLO text -> StableHLO bytecode (via jaxlib's HLO parser and converter); for a platform other
    than the CPU, copies are written as reshapes first (:func:`xla_hooks.rewrite.copies_as_reshapes`:
    the GPU plugin takes StableHLO, which has no copy)."""
    if platform != "cpu" and " copy(" in text:
        from xla_hooks.rewrite import copies_as_reshapes

        text = copies_as_reshapes(text)
    try:
        from jaxlib import _jax
    except ImportError as e:  # pragma: no cover - depends on the installed jaxlib
        raise PrivateApiError(f"jaxlib has no _jax module: {e}") from None
    try:  # the HLO text parser: in its own _hlo module in jaxlib 0.10.2 on, in _jax in 0.8.3 and 0.9.2
        from jaxlib import _hlo
    except ImportError:
        _hlo = _jax
    try:
        module = _hlo.hlo_module_from_text(text)
        proto = module.as_serialized_hlo_module_proto()
        return _jax.mlir.hlo_to_stablehlo(proto)
    except AttributeError as e:
        raise PrivateApiError(f"jaxlib's HLO conversion API changed: {e}") from None


def with_module(lowered: Any, mlir_bytes: bytes) -> Any:
    """A copy of ``lowered`` (a ``jax.stages.Lowered``) holding another module.

    jax caches lowerings per function and arguments, so the original object is
    never modified: the copy gets its own lowering object.
    """
    import copy

    try:
        old = lowered._lowering._hlo
    except AttributeError as e:
        raise PrivateApiError(f"jax.stages.Lowered no longer holds its module at _lowering._hlo: {e}") from None
    from jax._src.lib.mlir import ir

    with old.context:
        new = ir.Module.parse(mlir_bytes)
        _keep_buffer_donors(old, new)
    lowering = copy.copy(lowered._lowering)
    lowering._hlo = new
    if hasattr(lowering, "_executable"):
        lowering._executable = None
    out = copy.copy(lowered)
    out._lowering = lowering
    return out


def _main(module: Any) -> Any:
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]).strip('"') == "main":
            return op
    raise PrivateApiError("a lowered module has no func.func @main")


def _keep_buffer_donors(old: Any, new: Any) -> None:
    """Gives ``new``'s entry arguments the donation ``old``'s have, where ``new`` lost it: jax marks a
    donated argument ``tf.aliasing_output = k`` (aliased to output ``k``) or ``jax.buffer_donor``
    (donated without an alias, a jit without out_shardings). A rewritten module keeps neither on two
    paths (measured with jax 0.10.2): jaxlib's HLO -> StableHLO conversion drops the HLO text's
    ``buffer_donor={...}``, and a GSPMD step's partitioned program gets its header from a wrapper
    jit that could not alias. Without this the rewritten step would silently stop donating. The
    outputs are the step's own, in jax's order, so an alias index means the same output in both."""
    from jax._src.lib.mlir import ir

    kinds = ("tf.aliasing_output", "jax.buffer_donor")
    try:
        old_main, new_main = _main(old), _main(new)
        if "arg_attrs" not in old_main.attributes:
            return
        old_attrs = [ir.DictAttr(a) for a in old_main.attributes["arg_attrs"]]
        new_attrs = [ir.DictAttr(a) for a in new_main.attributes["arg_attrs"]] if "arg_attrs" in new_main.attributes \
            else []
    except (KeyError, AttributeError, TypeError) as e:
        raise PrivateApiError(f"a lowered module's arguments are no longer read as before: {e}") from None
    donated = {i: {k: a[k] for k in kinds if k in a} for i, a in enumerate(old_attrs) if any(k in a for k in kinds)}
    if not donated or len(new_attrs) != len(old_attrs):
        return
    out = []
    for i, a in enumerate(new_attrs):
        entries = {named.name: named.attr for named in a}
        if i in donated and not any(k in entries for k in kinds):
            entries.update(donated[i])
        out.append(ir.DictAttr.get(entries))
    new_main.attributes["arg_attrs"] = ir.ArrayAttr.get(out)


def rewritten_module_options() -> dict[str, Any]:
    """XLA options every compile of a rewritten module needs on this jax, beside the plan's own.

    A module disco compiles in jax's place went through HLO text, where a ``shard_map``'s
    shardings are written as ``xla.sdy.*`` frontend attributes. XLA since jaxlib 0.11 partitions with
    HloShardingV3 by default and reads those attributes only after switching V3 off for the
    compile, with a warning on stderr per compile ("Module contains sdy shardings or meshes in
    frontend_attributes ..."; measured with jaxlib 0.11.2 and 0.12.0.1, the GPU image's jax and the
    newest). Asking for V3 off up front compiles the same way without the warning (the step's loss
    is identical either way, measured). jaxlib 0.9.2 and 0.10.2 accept the option and do not warn
    without it; 0.8.3 rejects it as unknown.
    """
    import jax

    return {"xla_enable_hlo_sharding_v3": False} if major_minor(jax.__version__) >= (0, 11) else {}


def compile_rewritten(lowered: Any, text: str, compiler_options: dict[str, Any] | None = None) -> Any:
    """Compiles HLO ``text`` (a rewrite of ``lowered``'s module) in its place: a jax ``Compiled``.

    ``compiler_options`` are the plan's; they win over :func:`rewritten_module_options`.
    """
    rewritten = with_module(lowered, hlo_text_to_mlir_bytes(text, _platform(lowered)))
    return rewritten.compile(compiler_options={**rewritten_module_options(), **(compiler_options or {})})


def _platform(lowered: Any) -> str:
    """The platform ``lowered`` is compiled for ("cpu", "cuda", ...); jax's default backend where
    its device list is out of reach."""
    try:
        return str(lowered._lowering._device_list[0].platform)
    except (AttributeError, TypeError, IndexError):
        import jax

        return jax.default_backend()


def device_count(lowered: Any) -> int:
    """How many devices ``lowered`` (a ``jax.stages.Lowered``) is compiled for."""
    try:
        return len(lowered._lowering._device_list)
    except (AttributeError, TypeError) as e:
        raise PrivateApiError(f"jax.stages.Lowered no longer exposes its device list: {e}") from None


def compile_text_standalone(text: str, num_devices: int, compiler_options: dict[str, str]) -> None:
    """Compiles HLO text for ``num_devices`` devices of this process's backend, SPMD with shardy.

    Used by the probe child process: it only has to find out whether XLA accepts (or aborts on)
    the module, so the executable is dropped.
    """
    import jax
    import numpy as np

    try:
        from jax._src import compiler, xla_bridge
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib import xla_client as xc
        from jax._src.lib.mlir import ir
    except ImportError as e:
        raise PrivateApiError(f"jax's compiler internals moved: {e}") from None
    mlir_bytes = hlo_text_to_mlir_bytes(text, jax.default_backend())
    devices = jax.devices()[:num_devices]
    if len(devices) < num_devices:
        raise RuntimeError(f"the probe has {len(devices)} devices, the module needs {num_devices}")
    with jmlir.make_ir_context():
        module = ir.Module.parse(mlir_bytes)
        options = compiler.get_compile_options(
            num_replicas=1, num_partitions=num_devices,
            device_assignment=np.array(devices).reshape(1, num_devices),
            env_options_overrides={**rewritten_module_options(), **compiler_options})
        options.executable_build_options.use_spmd_partitioning = True
        options.executable_build_options.use_shardy_partitioner = True
        compiler.backend_compile_and_load(xla_bridge.get_backend(), module, xc.DeviceList(tuple(devices)),
                                          options, [])


def compile_text_for(text: str, devices: Any, compiler_options: dict[str, Any]) -> str:
    """Compiles HLO ``text`` for ``devices`` (this process's devices, or a topology's compile-only
    devices: deviceless XLA:GPU) and returns the optimised, scheduled module's text.

    One partition per device (SPMD, shardy); the executable itself is dropped (a compile-only
    client has none to run).
    """
    return compile_module_for(text, devices, compiler_options)[0]


# the sizes XLA's CompiledMemoryStats reports (what disco.sim.memory.peak_memory reads)
MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes", "peak_memory_in_bytes")


def compile_module_for(text: str, devices: Any, compiler_options: dict[str, Any]
                       ) -> tuple[str, dict[str, int] | None, str | None]:
    """:func:`compile_text_for` with the executable's memory analysis: ``(module text, sizes, why)``.

    ``sizes`` are the executable's ``get_compiled_memory_stats()`` (:data:`MEMORY_FIELDS` it
    reports, bytes per device: XLA's buffer assignment, as ``jax.stages.Compiled.memory_analysis()``
    reads it), or None with ``why`` (the executable reports none).
    """
    import numpy as np

    try:
        from jax._src import compiler
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib import xla_client as xc
        from jax._src.lib.mlir import ir
    except ImportError as e:
        raise PrivateApiError(f"jax's compiler internals moved: {e}") from None
    devices = tuple(devices)
    mlir_bytes = hlo_text_to_mlir_bytes(text, str(getattr(devices[0], "platform", "cpu")) if devices else "cpu")
    n = len(devices)
    with jmlir.make_ir_context():
        module = ir.Module.parse(mlir_bytes)
        options = compiler.get_compile_options(
            num_replicas=1, num_partitions=n, device_assignment=np.array(devices).reshape(1, n),
            env_options_overrides={**rewritten_module_options(), **compiler_options})
        options.executable_build_options.use_spmd_partitioning = True
        options.executable_build_options.use_shardy_partitioner = True
        exe = compiler.backend_compile_and_load(devices[0].client, module, xc.DeviceList(devices), options, [])
    try:
        module_text = exe.hlo_modules()[0].to_string()
    except (AttributeError, IndexError) as e:
        raise PrivateApiError(f"a compiled executable no longer lists its HLO modules: {e}") from None
    try:
        stats = exe.get_compiled_memory_stats()
    except Exception as e:  # noqa: BLE001 - a backend without the analysis: the module stands without it
        return module_text, None, f"the executable reports no memory analysis ({type(e).__name__}: {e})"
    sizes = {f: int(getattr(stats, f)) for f in MEMORY_FIELDS if getattr(stats, f, None) is not None}
    if not {"argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes"} <= set(sizes):
        return module_text, None, f"the executable's memory analysis lacks sizes (it has {sorted(sizes)})"
    return module_text, sizes, None


def kv_client() -> Any:
    """The coordination service's key-value client of a ``jax.distributed`` job.

    jax shares profile-guided profiles between hosts through the same client
    (``jax/_src/compiler.py``, ``_share_fdo_profiles``): ``key_value_set_bytes(key, value)``
    and ``blocking_key_value_get_bytes(key, timeout_in_ms)``, unchanged from jax 0.8.3 to 0.12.

    Raises:
      PrivateApiError: jax's release is untested, or ``jax._src.distributed`` has no client with
        those methods (also when ``jax.distributed.initialize`` was not called).
    """
    check_version()
    try:
        from jax._src import distributed
    except ImportError as e:
        raise PrivateApiError(f"jax._src.distributed moved: {e}") from None
    client = getattr(getattr(distributed, "global_state", None), "client", None)
    if client is None:
        raise PrivateApiError("jax._src.distributed.global_state has no coordination client "
                              "(was jax.distributed.initialize called?)")
    missing = [m for m in ("key_value_set_bytes", "blocking_key_value_get_bytes") if not hasattr(client, m)]
    if missing:
        raise PrivateApiError(f"jax's coordination client has no {', '.join(missing)}")
    return client


def pgle_fdo_profile(run: Any, runs: int, percentile: int = 90) -> bytes:
    """The profile jax's automatic PGLE (``JAX_ENABLE_PGLE=1``) collects: ``run()`` (one step, waited
    for) traced ``runs`` times by ``jax._src.profiler.PGLEProfiler`` (what ``jax.jit`` does for the
    first ``jax_pgle_profiling_runs`` calls), aggregated at ``percentile`` (jax's default 90). Compile
    with ``compiler_options={"fdo_profile": profile}`` to get the step jax recompiles with.

    Unchanged from jax 0.10.2 to 0.12.0.1 (read in both).

    Raises:
      PrivateApiError: jax's release is untested, its PGLE profiler moved, or the profile is empty
        (no device trace: off a GPU, or another CUPTI subscriber).
    """
    check_version()
    try:
        from jax._src import profiler
    except ImportError as e:
        raise PrivateApiError(f"jax._src.profiler moved: {e}") from None
    pgle = getattr(profiler, "PGLEProfiler", None)
    if pgle is None or not hasattr(pgle, "trace"):
        raise PrivateApiError("jax._src.profiler has no PGLEProfiler with trace()")
    runner = pgle(runs, percentile)
    for _ in range(runs):
        with pgle.trace(runner):
            run()
    profile = runner.consume_fdo_profile()
    if not profile:
        raise PrivateApiError(f"jax's PGLE profiler collected an empty profile over {runs} runs")
    return profile

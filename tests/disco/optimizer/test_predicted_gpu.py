"""``disco.optimizer.predict`` for an H100 cluster with the compiled tier: deviceless XLA:GPU compiles of
every candidate from this CPU machine, each with XLA:GPU's memory analysis of the executable it built.
They need .venv-gpu (`make install-gpu`); `make test-gpu-compile` runs them there, and they skip,
saying why, where it is missing. The emulated tier's rows are tested in test_predicted.py."""

from __future__ import annotations

import pytest

import trax_models
from disco.ir import extractor
from disco.optimizer import predict
from disco.sim.cluster import preset
from xla_hooks import compile_for, deviceless

pytestmark = [pytest.mark.gpu_compile,
              pytest.mark.skipif(not deviceless.available(),
                                 reason=f"no deviceless XLA:GPU environment: {deviceless.INSTALL_HINT}")]

FEW = {"budget_s": 600.0, "max_evals": 200, "measure_top_k": 2, "bucket_sweep": (2,)}


@pytest.fixture(scope="module")
def fsdp8():
    return trax_models.make_train_step("mlp", preset="tiny", devices=8, style="fsdp")


@pytest.fixture(scope="module")
def predicted(fsdp8):
    step, args = fsdp8
    return predict(step, *args, cluster=preset("h100-sxm-8"), **FEW)


def test_a_deviceless_compile_reports_xla_gpus_memory_analysis(fsdp8):
    """The peak of the executable XLA:GPU built for 8 H100s: its arguments are this device's shards (as
    XLA:CPU's are for the same step), and the peak adds up as disco.sim.memory's does."""
    import jax

    step, args = fsdp8
    text = extractor.hlo_text(step, *args)
    module = compile_for.compile_module(text, device="h100", devices=8)
    m = module.memory
    assert module.memory_from == "xla" and module.memory_note is None and "is_scheduled=true" in module.text
    assert m.peak == m.arguments + m.outputs - m.aliased + m.temporaries and m.xla_peak is not None
    cpu = jax.jit(step).lower(*args).compile().memory_analysis()
    assert m.arguments == cpu.argument_size_in_bytes > 0


def test_the_compiled_tier_prices_maxtext_and_every_rows_peak_memory(predicted):
    r = predicted
    assert r.tier == "compiled"
    maxtext = r.row("maxtext")
    assert maxtext.compiled_s is not None and maxtext.compiled["backend"] == "gpu"
    priced = [row for row in r.rows if row.compiled_s is not None]
    assert len(priced) == len(r.rows)
    assert all(row.peak_memory_bytes and row.memory_from == "xla" for row in priced)
    assert r.memory_limit == preset("h100-sxm-8").device_memory_bytes and r.to_dict()["over_memory"] == []
    row = next(x for x in r.to_dict()["rows"] if x["name"] == "maxtext")
    assert (row["peak_memory_bytes"], row["peak_memory_from"]) == (maxtext.peak_memory_bytes, "xla")


def test_a_limit_between_two_compiled_peaks_keeps_the_larger_out(fsdp8, predicted):
    step, args = fsdp8
    peaks = sorted({row.peak_memory_bytes for row in predicted.rows if row.name != "xla_default"})
    assert len(peaks) >= 2, "expected plans of different compiled peaks"
    limit = (peaks[0] + peaks[-1]) // 2
    r = predict(step, *args, cluster=preset("h100-sxm-8"), memory_limit=limit, **FEW)  # compiles from the cache
    over = [row for row in r.rows if row.over_memory is not None]
    assert over and all(row.peak_memory_bytes > limit and row.name != "xla_default" for row in over)
    assert all("predicted: XLA's memory analysis of its compiled step" in row.over_memory for row in over)
    answer = r.row(r.chosen)
    assert answer.over_memory is None and answer == next(row for row in r.rows if row.over_memory is None)


def scanned_fsdp_step(layers=4, width=256, batch=64):
    """A step as MaxText writes it with ``scan_layers`` (its default): the layers' weights stacked and
    sharded over fsdp along their embed dimension, ``lax.scan`` over them, so each layer's all-gather
    runs in the forward loop's body and its gradient's reduce-scatter in the backward loop's."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    ws, bs = NamedSharding(mesh, P(None, "fsdp", None)), NamedSharding(mesh, P("fsdp", None))

    def loss(w, x, y):
        h, _ = jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)
        return jnp.mean((h - y) ** 2)

    def step(w, x, y):
        value, grads = jax.value_and_grad(loss)(w, x, y)
        return w - 0.1 * grads, value

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    w = jax.device_put(jax.random.normal(k1, (layers, width, width)) / width ** 0.5, ws)
    x, y = (jax.device_put(jax.random.normal(k, (batch, width)), bs) for k in (k2, k3))
    return jax.jit(step, in_shardings=(ws, bs, bs), out_shardings=(ws, NamedSharding(mesh, P()))), (w, x, y)


def test_a_scanned_steps_loop_passes_are_a_row_the_compiled_tier_prices():
    """The scan's gathers and scatters run in loops: the emulated tier's fastest row comes back with
    XLA:GPU's loop passes on, compiled (its module's loops run fewer trips) and priced, as is maxtext."""
    import warnings

    from disco.ir.graph import HloGraph
    from disco.optimizer._predicted import loops_hold_collectives

    step, args = scanned_fsdp_step()
    assert loops_hold_collectives(HloGraph.from_hlo_text(extractor.hlo_text(step, *args)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # disco reads no gradient in a loop yet (NoGradientWarning)
        r = predict(step, *args, cluster=preset("h100-sxm-8"), **{**FEW, "compiled_top_k": 1, "bucket_sweep": ()})
    assert r.tier == "compiled"
    variant = next(row for row in r.rows if row.name.endswith("+loop_passes"))
    source = r.row(variant.name.removesuffix("+loop_passes"))
    assert variant.plan.replace(compile_options=(), name="") == source.plan.replace(compile_options=(), name="")
    assert variant.emulated_s == source.emulated_s and variant.origin.endswith("with XLA:GPU's loop passes on")
    base = r.row("xla_default")
    for row in (variant, r.row("maxtext"), base):
        assert row.compiled_s is not None and row.memory_from == "xla"
    # the passes peel and unroll the loops: more collective instructions in the module, each run fewer times
    assert variant.compiled["collectives"] > base.compiled["collectives"]

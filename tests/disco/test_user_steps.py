"""disco on training steps written as public training code writes them (tests/support/user_steps.py:
flax NNX, linen TrainState with statics and donation, EasyLM, big_vision, optax wrappers, pmap,
shard_map, scan, remat, 2-D meshes), each through extract, apply and jit (one or two steps of each
form in the default tier, every step in the slow one), through a real plan service with trials, and
through optimize (slow); and the steps disco must refuse, each refused naming what it could not read.

8 virtual CPU devices, real compiles. Numbers are compared after 3 steps: float32 steps to 1e-5 of
each leaf's scale; bfloat16 steps within twice what XLA's default itself moves when only the grouping
of its sums changes (its all-reduce combiner off), plus that float32 bound.
"""

from __future__ import annotations

import contextlib
import warnings

import jax
import numpy as np
import pytest

import disco
import xla_hooks
from disco.ir.step_form import read
from xla_hooks import measure
from disco.plans import baselines
from tests.support import user_steps
from service.testing import ServerProcess
from tests.support.equivalence import compiled_all_reduces

COMBINER_OFF = {"xla_disable_hlo_passes": "all-reduce-combiner,cpu-all-reduce-combiner"}
NAMES = sorted(user_steps.CORPUS)
# The default tier's share of the corpus, one or two steps of each form (the rest are marked slow:
# the whole corpus is two to three compiles a step, several minutes on 2 cores).
# one or two steps of each form in the default tier; the largest (linen_lm1b, easylm_llama: 100-350 s
# each on the loaded 2-core machine) only in the slow one
APPLY_FAST = {"nnx_stateful", "nnx_donate", "maxtext_static_argnums", "jit_pspec_set_mesh",
              "jit_kwargs_static_argnames", "pmap_imagenet_batchnorm", "shard_map_pmean", "optax_multisteps"}
JIT_FAST = {"nnx_stateful", "pmap_imagenet_batchnorm"}  # maxtext_static_argnums: its apply test is fast


def _tiered(fast):
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in NAMES]


def _mesh_context(entry):
    """``jax.set_mesh`` over the mesh the step's arguments live on, for a step whose jit takes bare
    PartitionSpecs (jax refuses to lower it outside one); else nothing."""
    if entry.name not in user_steps.NEEDS_MESH_CONTEXT:
        return contextlib.nullcontext()
    mesh = next(x.sharding.mesh for x in jax.tree.leaves((entry.args, entry.kwargs))
                if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding))
    return jax.set_mesh(mesh)


def _three_steps(entry, fn):
    args, kwargs = entry.args, entry.kwargs
    for _ in range(3):
        args, kwargs = entry.advance(fn, args, kwargs)
    return jax.tree.map(lambda x: np.asarray(x, np.float64), entry.params(args, kwargs))


def _reference(name):
    """The step's parameters after 3 steps of its own jit, from a fresh copy."""
    return _reference_run(name)[0]


def _reference_run(name):
    """:func:`_reference`, and how many programs the step's own jit compiled for those 3 calls
    (jax's cache size; 1 where the jit does not report it, a pmap)."""
    ref = user_steps.CORPUS[name]()
    params = _three_steps(ref, ref.step)
    size = getattr(read(ref.step).jitted, "_cache_size", None)
    return params, size() if size is not None else 1


def _combiner_off(entry):
    """XLA's default compile of the step with its all-reduce combiner off, called as the step is."""
    form = read(entry.step)
    lowering = form.lower_stage(entry.args, entry.kwargs)
    return form.bind(lowering.lowered.compile(compiler_options=COMBINER_OFF), lowering)


def _relative_error(a, b):
    """Per leaf, max |a - b| / max |b| (0 for a leaf of zeros in both); the largest over the leaves."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        scale = float(np.max(np.abs(y), initial=0.0))
        err = float(np.max(np.abs(x - y), initial=0.0))
        worst = max(worst, err / scale if scale else err)
    return worst


def _tolerance(name):
    """1e-5 for a float32 step; for a bfloat16 one, twice how far XLA's default moves with its
    combiner off (measured on fresh copies of the step), plus 1e-5."""
    entry = user_steps.CORPUS[name]()
    if entry.dtype == "float32":
        return 1e-5
    reference = _three_steps(entry, entry.step)
    other = user_steps.CORPUS[name]()
    moved = _relative_error(_three_steps(other, _combiner_off(other)), reference)
    return 2 * moved + 1e-5


def _plan(graph):
    """A bucket plan XLA's default would not make (its combiner merges every all-reduce into one):
    one bucket per all-reduce outside loops."""
    return baselines.make("per_tensor", graph)


def _expected_all_reduces(graph, plan):
    """The compiled step's all-reduces under ``plan``: its buckets, and the ones left in loop bodies."""
    return len(plan.buckets) + sum(len(lp.body.all_reduces()) for lp in graph.loops)


def _donated_deleted(entry, fn):
    """Whether every array each donated argument held before one call of ``fn`` is invalid after it
    (read before the call: an nnx.jit step's modules hold new arrays after it)."""
    held = [x for i in entry.donated for x in jax.tree.leaves(entry.args[i]) if isinstance(x, jax.Array)]
    entry.advance(fn, entry.args, entry.kwargs)
    return bool(held) and all(x.is_deleted() for x in held)


@pytest.fixture
def entry(request):
    """A fresh corpus step, under its mesh context where its jit needs one (as the user's loop runs it)."""
    made = user_steps.CORPUS[request.param]()
    with _mesh_context(made):
        yield made


@pytest.mark.parametrize("entry", _tiered(APPLY_FAST), indirect=True)
def test_a_user_step_is_read_and_its_plan_applies_with_the_same_numbers(entry):
    name = entry.name
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GspmdWarning, no fallback, no NoGradientWarning
        graph = disco.extract(entry.step, *entry.args, kwargs=entry.kwargs)
        plan = _plan(graph)
        applied = xla_hooks.apply(plan, entry.step, *entry.args, kwargs=entry.kwargs, strict=True)
    assert applied.applied
    assert compiled_all_reduces(applied) == _expected_all_reduces(graph, plan)
    got = _three_steps(entry, applied)
    want = _reference(name)
    assert _relative_error(got, want) <= _tolerance(name)
    if entry.donated:
        fresh = user_steps.CORPUS[name]()
        assert _donated_deleted(fresh, xla_hooks.apply(plan, fresh.step, *fresh.args, kwargs=fresh.kwargs))


@pytest.mark.parametrize("entry", _tiered(JIT_FAST), indirect=True)
def test_a_user_step_trains_through_xla_hooks_jit_as_through_its_own_jit(entry):
    name = entry.name
    planned = xla_hooks.jit(entry.step, options={"max_evals": 30})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _three_steps(entry, planned)
    want, compiles = _reference_run(name)
    # one compile per signature jax's own jit compiles (a key passed uncommitted, then returned
    # committed, is two signatures to jax as to disco)
    assert len(planned.applied) == compiles
    assert all(a.applied for a in planned.applied.values()), [a.fallback_reason for a in planned.applied.values()]
    assert _relative_error(got, want) <= _tolerance(name)


@pytest.mark.slow
@pytest.mark.parametrize("entry", NAMES, indirect=True)
def test_optimize_accepts_a_user_step_and_its_answer_applies_and_is_not_slower(entry):
    name = entry.name
    before = jax.tree.map(np.array, entry.params(entry.args, entry.kwargs))
    result = disco.optimize(entry.step, *entry.args, kwargs=entry.kwargs, budget_s=5, rounds=5)
    # measuring never consumed or trained the arguments it was given
    np.testing.assert_equal(jax.tree.map(np.array, entry.params(entry.args, entry.kwargs)), before)
    chosen = result.row(result.chosen)
    assert chosen.applied, chosen.fallback_reason
    fresh = user_steps.CORPUS[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied = xla_hooks.apply(result.plan, fresh.step, *fresh.args, kwargs=fresh.kwargs, strict=True)
        default = xla_hooks.apply(None, fresh.step, *fresh.args, kwargs=fresh.kwargs)
    # measured again in fresh rounds, apart from the rounds that chose it: not slower beyond noise
    times = measure.measure_interleaved({"xla_default": default, "answer": applied}, fresh.args, rounds=8, steps=3,
                                        kwargs=fresh.kwargs)
    low, high = measure.paired_interval(times["xla_default"], times["answer"])
    assert high >= 1.0, f"{result.chosen} measured slower than xla_default beyond noise (90% interval {low:.3f}-{high:.3f})"
    want = _reference(name)
    assert _relative_error(_three_steps(fresh, applied), want) <= _tolerance(name)


@pytest.mark.parametrize("name", sorted(user_steps.REFUSED))
def test_a_step_disco_cannot_read_is_refused_naming_what_it_could_not_read(name):
    make, pattern = user_steps.REFUSED[name]
    entry = make()
    with _mesh_context(entry), pytest.raises((ValueError, TypeError), match=pattern):
        disco.optimize(entry.step, *entry.args, kwargs=entry.kwargs, budget_s=1, rounds=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("user-steps") / "plans.sqlite", workers=1, token="tok") as srv:
        yield srv


@pytest.mark.parametrize("entry", ["nnx_donate", pytest.param("maxtext_static_argnums", marks=pytest.mark.slow)],
                         indirect=True)
def test_a_user_step_gets_its_plan_from_the_service_and_its_trials_measure_the_candidates(entry, server):
    """An nnx.jit step that donates its modules and a jax.jit with statics and donation, through a
    real plan service with trials: every trial step is a real training step of the user's loop."""
    name, steps = entry.name, 8
    planned = xla_hooks.jit(entry.step, service=server.url, cluster="local", timeout_s=120, token="tok", trials=2,
                            trial_steps=2, options={"strategy": "random", "budget_s": 1.0, "seed": 0})
    args, kwargs = entry.args, entry.kwargs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(steps):
            args, kwargs = entry.advance(planned, args, kwargs)
    (table,) = planned.trials.values()  # the trials ended within the steps
    assert len(table) >= 2 and sum(row["winner"] for row in table) == 1
    (applied,) = planned.applied.values()
    assert applied.applied, applied.fallback_reason
    ref = user_steps.CORPUS[name]()
    ref_args, ref_kwargs = ref.args, ref.kwargs
    for _ in range(steps):
        ref_args, ref_kwargs = ref.advance(ref.step, ref_args, ref_kwargs)
    got = jax.tree.map(lambda x: np.asarray(x, np.float64), entry.params(args, kwargs))
    want = jax.tree.map(lambda x: np.asarray(x, np.float64), ref.params(ref_args, ref_kwargs))
    assert _relative_error(got, want) <= 1e-5

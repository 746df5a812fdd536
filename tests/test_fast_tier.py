"""The fast tier's guard (tests/conftest.py): a test marked ``fast`` that compiles an XLA program or
starts a process fails, named, even where it catches the error or a module fixture does the compile;
a test that does neither passes. Run in an inner pytest session in this process (pytester)."""

from __future__ import annotations

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.fast

INNER = '''
import multiprocessing
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def compiled():
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda x: x + 1)(jnp.ones(3))


def test_compiles():
    import jax
    import jax.numpy as jnp

    jax.jit(lambda x: x * 2)(jnp.ones(3))


def test_catches_its_compile_error():
    import jax
    import jax.numpy as jnp

    try:
        jax.jit(lambda x: x * 3)(jnp.ones(3))
    except Exception:
        pass


def test_uses_a_compiled_module_fixture(compiled):
    pass


def test_starts_a_subprocess():
    subprocess.run([sys.executable, "-c", "pass"])


def test_starts_a_multiprocessing_process():
    multiprocessing.get_context("spawn").Process(target=print).start()


def test_lowers_without_compiling():
    import jax
    import jax.numpy as jnp

    assert "stablehlo" in jax.jit(lambda x: x * 4).lower(jax.ShapeDtypeStruct((3,), jnp.float32)).as_text()


def test_pure_python():
    assert sum(range(4)) == 6
'''

pytest_plugins = ["pytester"]


def test_the_guard_fails_fast_tests_that_compile_or_start_a_process(pytester):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    fast: no XLA compile, no process\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=4, errors=1)
    out = result.stdout.str()
    for name, what in [("test_compiles", "compiled an XLA program"),
                       ("test_catches_its_compile_error", "compiled an XLA program"),
                       ("test_uses_a_compiled_module_fixture", "compiled an XLA program"),
                       ("test_starts_a_subprocess", "started a process (subprocess.Popen)"),
                       ("test_starts_a_multiprocessing_process", "started a process (multiprocessing)")]:
        assert f"test_inner.py::{name} is marked fast" in out and what in out, (name, out[-3000:])

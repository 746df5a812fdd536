"""The fast tier's guard (tests/conftest.py): a test marked ``fast`` that compiles an XLA program or
starts a process fails, named, even where it catches the error or a module fixture does the compile;
a test that does neither passes. Run in an inner pytest session in this process (pytester)."""

from __future__ import annotations

import pytest

from tests.support.paths import REPO

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


@pytest.mark.fast
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


TEARDOWN = '''
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def server():
    yield
    subprocess.run([sys.executable, "-c", "pass"])


@pytest.fixture
def stops_a_process():
    yield
    subprocess.run([sys.executable, "-c", "pass"])


def test_uses_the_session_server(server):
    pass


@pytest.mark.fast
def test_own_fixture_starts_a_process_in_teardown(stops_a_process):
    pass


@pytest.mark.fast
def test_last_and_fast():
    pass
'''


def test_a_fast_test_is_blamed_for_its_own_teardown_not_for_the_session_fixtures_after_it(pytester):
    """pytest tears the session's fixtures down in the last test's teardown (CI once failed a fast test
    there for stopping the PostgreSQL server it never used). Not fast itself: the inner session's
    fixtures start processes outside any inner test."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    fast: no XLA compile, no process\n")
    pytester.makepyfile(test_teardown=TEARDOWN)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    out = result.stdout.str()
    assert "ERROR at teardown of test_own_fixture_starts_a_process_in_teardown" in out, out[-3000:]
    assert "test_last_and_fast is marked fast" not in out, out[-3000:]

"""Shared by every test: 8 virtual CPU devices, and the guard of the fast tier.

A test marked ``fast`` (``make test-fast``: the edit loop) may neither compile an XLA program nor start
a process: while its setup, call and teardown run, jax's compile entry point, ``subprocess.Popen``'s child start and
``multiprocessing``'s ``Process.start`` raise, and the test fails with its name and what it did, even
if it caught the exception. Move such a test out of the tier (drop its ``fast`` mark).

Its teardown is guarded only where it tears down its own fixtures alone (the next test shares its
parent): after the last test of a module or of the session, pytest also tears down the module's or the
session's fixtures (the PostgreSQL server), which other tests set up, and those may stop a process."""

import multiprocessing.process
import os
import subprocess

import pytest

# Before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# `disco optimize` keeps this machine's correction in the per-user cache; the tests' runs (and the
# commands they start) keep theirs in a file of this test process, never the user's. Each pytest-xdist
# worker makes its own: a worker inherits the file its controller made (marked by
# DISCO_TESTS_CORRECTIONS), and two workers' runs sharing one would learn from each other.
# The process that makes a folder removes it when it exits.
if os.environ.get("DISCO_CORRECTIONS", "") in ("", os.environ.get("DISCO_TESTS_CORRECTIONS")):
    import atexit
    import shutil
    import tempfile

    _corrections_dir, _maker = tempfile.mkdtemp(prefix="disco-tests-"), os.getpid()
    # A forked child inherits the handler; only the maker removes the folder.
    atexit.register(lambda: os.getpid() == _maker and shutil.rmtree(_corrections_dir, ignore_errors=True))
    os.environ["DISCO_CORRECTIONS"] = os.environ["DISCO_TESTS_CORRECTIONS"] = os.path.join(
        _corrections_dir, "corrections.json")
    # and the plans `disco optimize` writes without --out, in the same folder
    os.environ["DISCO_PLANS"] = os.path.join(_corrections_dir, "plans")

# The probe's kept successes (xla_hooks.probe): one folder for the whole run, shared by its
# pytest-xdist workers and the commands the tests start (that a module compiles is a fact about the
# module, not about a test); never the user's.
def _run_folder(prefix: str) -> str:
    """A temporary folder for the whole run, removed when the process that made it (pytest's main
    process, before its workers start) exits."""
    import atexit
    import shutil
    import tempfile

    path, maker = tempfile.mkdtemp(prefix=prefix), os.getpid()
    atexit.register(lambda: os.getpid() == maker and shutil.rmtree(path, ignore_errors=True))
    return path


if not os.environ.get("DISCO_TESTS_PROBE_CACHE"):
    os.environ["DISCO_PROBE_CACHE"] = os.environ["DISCO_TESTS_PROBE_CACHE"] = _run_folder("disco-tests-probed-")

# jax's persistent compilation cache, likewise one folder for the run (never the user's): the zoo's steps
# and their plans are compiled by many tests, and a module one test compiled is read back by the next
# instead of compiled again (every compile kept: no minimum time or size). On a subset of the suite
# (plans, graph, fingerprints, apply_plan, user steps, cli: 356 tests, 2 workers, quiet machine) it took
# the wall time from 259-278 s to 220 s (measured 2026-12-02). disco reads a cached step's partitioned
# module from the copy it keeps beside the cache (disco.ir.extractor); tests of the cache itself set
# their own folder.
if not os.environ.get("DISCO_TESTS_JAX_CACHE"):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["DISCO_TESTS_JAX_CACHE"] = _run_folder(
        "disco-tests-jax-cache-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# jax's compile entry points, per version: backend_compile_and_load (jax 0.8.3 to 0.12.0.1), and
# backend_compile (0.8.3 only); compile_or_get_cached and xla_hooks call them through the module.
_COMPILE_ENTRY_POINTS = ("backend_compile_and_load", "backend_compile")
_VIOLATIONS = pytest.StashKey[list]()


class FastTierViolation(RuntimeError):
    """A test of the fast tier compiled an XLA program or started a process."""


def _guarded(item: pytest.Item, what: str, violations: list[str]):
    avoid = "compile" if "compiled" in what else "process"

    def refuse(*args, **kwargs):
        message = (f"{item.nodeid} is marked fast (make test-fast: no XLA compile, no process) but {what}; "
                   f"drop its fast mark or avoid the {avoid}")
        violations.append(message)
        raise FastTierViolation(message)

    return refuse


def _install_guard(item: pytest.Item, violations: list[str]) -> list[tuple[object, str, object]]:
    from jax._src import compiler

    saved = []

    def patch(owner, name, what):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _guarded(item, what, violations))

    for name in _COMPILE_ENTRY_POINTS:
        if hasattr(compiler, name):
            patch(compiler, name, f"compiled an XLA program (jax._src.compiler.{name})")
    patch(subprocess.Popen, "_execute_child", "started a process (subprocess.Popen)")
    patch(multiprocessing.process.BaseProcess, "start", "started a process (multiprocessing)")
    return saved


def _guard_while(item: pytest.Item):
    """Runs the hook it wraps with the guard on, for a fast test."""
    if item.get_closest_marker("fast") is None:
        return (yield)
    violations = item.stash.setdefault(_VIOLATIONS, [])
    saved = _install_guard(item, violations)
    try:
        return (yield)
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """Guards a fast test's setup: the fixtures of every scope it sets up first."""
    return (yield from _guard_while(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Guards a fast test's call, and fails it if it compiled or started a process in its setup or call,
    even where it caught the error."""
    result = yield from _guard_while(item)
    violations = item.stash.get(_VIOLATIONS, [])
    if violations:
        pytest.fail(violations[0], pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """Guards a fast test's teardown where only its own fixtures are torn down (module docstring)."""
    if nextitem is None or nextitem.parent is not item.parent:
        return (yield)
    return (yield from _guard_while(item))


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the session (each test makes its own database in it:
    ``postgres.create_database()``); the test is skipped, saying why, without PostgreSQL."""
    from service.testing import PostgresServer, postgres_missing

    why = postgres_missing()
    if why:
        pytest.skip(f"the PostgreSQL backend is not tested: {why}")
    pg = PostgresServer().start()
    yield pg
    pg.stop()


@pytest.fixture(scope="session", autouse=True)
def _eight_devices_for_the_session():
    """Starts jax's CPU backend with the 8 devices above before the first test: a test that runs a
    command in-process (``disco simulate --devices 2`` sets ``jax_num_cpu_devices``) must not leave a
    fresh pytest-xdist worker with fewer devices for the tests after it, whatever order they run in."""
    import jax

    jax.devices()

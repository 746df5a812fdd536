"""The packages' lazy exports: ``__all__`` names exactly what ``__getattr__`` resolves, and every
name resolves (to the object the TYPE_CHECKING imports name), without importing jax on import."""

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["disco", "xla_hooks"])
def test_all_matches_lazy_exports(package):
    mod = importlib.import_module(package)
    lazy = set(mod._EXPORTS) | set(getattr(mod, "_SUBMODULES", {}))
    assert sorted(mod.__all__) == sorted(lazy)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018


def test_profile_is_the_function():
    import xla_hooks
    from xla_hooks.profiling import profile

    assert xla_hooks.profile is profile


@pytest.mark.parametrize("package", ["disco", "xla_hooks", "service"])
def test_import_does_not_import_jax(package):
    code = f"import sys, {package}; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""The packages' lazy exports: ``__all__`` names exactly what ``__getattr__`` resolves, and every
name resolves (to the object the TYPE_CHECKING imports name), without importing jax on import."""

import ast
import importlib
import inspect
import subprocess
import sys

import pytest


@pytest.mark.fast
@pytest.mark.parametrize("package", ["disco", "xla_hooks"])
def test_all_matches_lazy_exports(package):
    mod = importlib.import_module(package)
    lazy = set(mod._EXPORTS) | set(getattr(mod, "_SUBMODULES", {}))
    assert sorted(mod.__all__) == sorted(lazy)
    named = _type_checking_imports(mod)
    assert sorted(named) == sorted(mod.__all__)
    for name in mod.__all__:
        assert getattr(mod, name) is named[name], name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018


def _type_checking_imports(mod) -> dict:
    """name -> the object the package's ``if TYPE_CHECKING:`` imports bind to it."""
    tree = ast.parse(inspect.getsource(mod))
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    out = {}
    for stmt in block.body:
        assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
        for alias in stmt.names:
            try:  # a submodule, imported by its own name (not through the package's __getattr__)
                obj = importlib.import_module(f"{stmt.module}.{alias.name}")
            except ModuleNotFoundError:
                obj = getattr(importlib.import_module(stmt.module), alias.name)
            out[alias.asname or alias.name] = obj
    return out


@pytest.mark.fast
def test_profile_is_the_function():
    import xla_hooks
    from xla_hooks.profiling import profile

    assert xla_hooks.profile is profile


@pytest.mark.parametrize("package", ["disco", "xla_hooks", "service"])
def test_import_does_not_import_jax(package):
    code = f"import sys, {package}; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.fast
def test_no_module_imports_through_the_disco_facade():
    """docs/architecture.md: nothing below ``disco/__init__.py`` imports through its lazy exports (a bare
    ``import disco`` used as ``disco.extract``, or ``from disco import optimize``); submodules are imported
    by their own names."""
    import pathlib

    import disco

    root = pathlib.Path(disco.__file__).parent.parent
    lazy = set(disco._EXPORTS) | {k for k, v in disco._SUBMODULES.items() if v != f"disco.{k}"}
    found = []
    for package in ("disco", "gnn", "xla_hooks", "service", "trax_models"):
        for path in sorted((root / package).rglob("*.py")):
            if path == root / "disco" / "__init__.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import) and any(a.name == "disco" for a in node.names):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: import disco")
                elif isinstance(node, ast.ImportFrom) and node.module == "disco" and node.level == 0:
                    found += [f"{path.relative_to(root)}:{node.lineno}: from disco import {a.name}"
                              for a in node.names if a.name in lazy]
    assert not found, found

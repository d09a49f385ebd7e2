"""Every module wtc imports is the standard library, wtc itself, or a declared dependency (pyproject's
[project] dependencies), so that a fresh install runs every command; the optional extras below are
imported only inside a function or a try block, never when a module is loaded (a fresh install of
two studies once died with ModuleNotFoundError: scipy)."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

import wtc

ROOT = Path(wtc.__file__).parent
PYPROJECT = ROOT.parent / "pyproject.toml"

# Optional extras: imported lazily (in the function that needs them), with an error naming the extra
# when absent. Module name -> why it is optional.
OPTIONAL = {
    "transformers": "the hf / test extra: wtc.models.hf and wtc.models.tl load Hugging Face models",
    "tokenizers": "installed with transformers (the hf extra): wtc.models.hf builds a tokenizer",
    "transformer_lens": "the tl extra: wtc.models.tl",
    "pysr": "the pysr extra: wtc.sr's backend='pysr'",
    "sklearn": "scikit-learn (the bench extra): only its protocol classes, when the user has it",
    "pandas": "the test extra: SymbolicRegressor.equations_ is a DataFrame when pandas is installed, a list otherwise",
    "pdoc": "the test extra: wtc.apidoc builds the API reference (its test runs in CI)",
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return {_normalise(re.match(r"[A-Za-z0-9_.-]+", d).group(0)) for d in deps}


def _imports() -> list[tuple[str, Path, int, bool]]:
    """(top-level module name, file, line, whether the import is inside a function or try block)
    for every absolute import in wtc, function-level ones included."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())

        def visit(node: ast.AST, lazy: bool) -> None:
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Try))
                if isinstance(child, ast.Import):
                    out.extend((a.name.split(".")[0], path, child.lineno, lazy) for a in child.names)
                elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                    out.append((child.module.split(".")[0], path, child.lineno, lazy))
                visit(child, inner)
        visit(tree, False)
    return out


def test_every_import_is_stdlib_wtc_or_a_declared_dependency():
    declared, dists = _declared(), importlib.metadata.packages_distributions()
    undeclared = set()
    for name, path, line, _ in _imports():
        if name in sys.stdlib_module_names or name == "wtc" or name in OPTIONAL:
            continue
        owners = {_normalise(d) for d in dists.get(name, [])}
        if not owners & declared:
            undeclared.add(f"{name} ({path.relative_to(ROOT.parent)}:{line}; distribution "
                           f"{'/'.join(sorted(owners)) or 'not installed'})")
    assert not undeclared, "imported but not in pyproject's dependencies: " + "; ".join(sorted(undeclared))


def test_optional_extras_are_imported_lazily_only():
    eager = [f"{name} at {path.relative_to(ROOT.parent)}:{line}" for name, path, line, lazy in _imports()
             if name in OPTIONAL and not lazy]
    assert not eager, "optional extras imported when a module loads: " + ", ".join(eager)


def test_the_allow_list_holds_no_declared_dependency():
    declared, dists = _declared(), importlib.metadata.packages_distributions()
    assert not {_normalise(d) for m in OPTIONAL for d in dists.get(m, [])} & declared

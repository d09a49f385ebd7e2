"""The house rules that a newcomer relies on: no import cycles, `import wtc` is cheap and reaches
every public subpackage, long modules say why they are long, every wtc error has one base."""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import wtc

ROOT = Path(wtc.__file__).parent
LONG = 500          # lines; a longer module says why in its docstring ("... over 500 lines because ...")


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every wtc module this file imports explicitly, at any depth of the file (function-level
    imports included: a lazy import that closes a cycle is still a cycle for the reader)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # `from pkg import submodule` names the submodule; the package's own names are an edge to it
            targets = subs + ([base] if any(t not in known for t in subs) else [])
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def test_no_import_cycles():
    mods = _modules()
    graph = {m: _imports(p, m, set(mods)) for m, p in mods.items()}
    graph = {m: {t for t in ts if t != "wtc"} for m, ts in graph.items()}   # the root only re-exports
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_import_wtc_is_light_and_reaches_every_subpackage():
    code = ("import sys, wtc; heavy = [m for m in ('torch', 'numba', 'sympy', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy; "
            "import wtc; [getattr(wtc, p) for p in wtc._PACKAGES]; "
            "assert callable(wtc.scan.scan) and callable(wtc.explain.explain) and callable(wtc.ace.extract_core); "
            "assert callable(wtc.extract) and callable(wtc.discover) and callable(wtc.train)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_package_directory_is_public_or_private_on_purpose():
    dirs = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert dirs == set(wtc._PACKAGES), dirs ^ set(wtc._PACKAGES)


def test_long_modules_say_why():
    unexplained = []
    for name, path in _modules().items():
        n = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if n > LONG and f"over {LONG} lines" not in doc.lower():
            unexplained.append(f"{name} ({n} lines)")
    assert not unexplained, unexplained


def test_every_wtc_error_derives_from_wtc_error():
    bad = []
    for info in pkgutil.walk_packages(wtc.__path__, "wtc."):
        if info.name.endswith("__main__") or ".workers" in info.name:
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:        # optional extras (e.g. transformer_lens) and unbuilt native modules
            continue
        for obj_name, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == mod.__name__
                    and not issubclass(obj, wtc.WtcError)):
                bad.append(f"{mod.__name__}.{obj_name}")
    assert not bad, bad

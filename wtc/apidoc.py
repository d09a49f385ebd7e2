"""The API reference: HTML built from the docstrings by pdoc, offline (`python -m wtc.apidoc OUT`).

Every public module of wtc is documented (every module whose dotted name has no part starting
with "_"), not only those a package's `__all__` names, so the pages the README points at
(`wtc.scan.store`, `wtc.models.io`, ...) are there too. A module that needs an optional extra which
is not installed (TransformerLens, PySR, transformers) is skipped and named, never an error.

The build is strict: it fails (`ApiDocError`) when pdoc warns (an annotation it cannot resolve,
an `__all__` entry that does not exist, a module that does not import), when a public name (an
entry of `wtc.__all__` or of a subpackage's `__all__`) has no docstring, or when a docstring names
a `wtc.<dotted.name>` in backticks that does not exist (a reference left behind by a rename).
tests/test_api_docs.py runs it, so CI fails on a broken docstring. pdoc is in the `test` extra.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import wtc
from wtc.errors import WtcError

# Top-level packages of the optional extras a module may import at import time -> the extra.
OPTIONAL = {"transformer_lens": "tl", "pysr": "pysr", "juliacall": "pysr", "transformers": "hf"}
# A backticked wtc name in a docstring: `wtc.scan.store`, `wtc.tasks.data.Records` (a call's
# parenthesis or a trailing dot ends it).
_REFERENCE = re.compile(r"`(wtc(?:\.[A-Za-z_]\w*)+)")


class ApiDocError(WtcError, RuntimeError):
    """The API reference could not be built cleanly (pdoc missing, a warning, an undocumented
    public name, a broken reference); the message lists every problem."""


@dataclass(frozen=True)
class Skipped:
    """A module left out because an optional dependency is not installed."""
    module: str
    missing: str      # the package that did not import
    extra: str        # the wtc extra that installs it: pip install -e ".[extra]"


@dataclass
class ApiDocs:
    """What a build documented and where: `modules` (dotted names), `skipped` (optional extras
    missing), `pages` (the HTML files written under `out`), `problems` (empty after a strict build)."""
    out: Path
    modules: list[str]
    skipped: list[Skipped] = field(default_factory=list)
    pages: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split(".")[1:])


def public_modules() -> tuple[list[str], list[Skipped]]:
    """Every public wtc module that imports here (sorted), and those skipped for a missing extra.
    A module failing for any other reason raises: that is a bug, not a missing extra."""
    names = ["wtc"] + sorted(m.name for m in pkgutil.walk_packages(wtc.__path__, "wtc.") if _public(m.name))
    found, skipped = [], []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            root = (exc.name or "").split(".")[0]
            if root not in OPTIONAL:
                raise
            skipped.append(Skipped(name, root, OPTIONAL[root]))
            continue
        found.append(name)
    return found, skipped


def _resolve_lazy_names() -> None:
    """`wtc`'s top-level names load on first access (`import wtc` stays light); pdoc reads a
    module's __dict__, so load them first or it reports them as missing."""
    for name in wtc.__all__:
        getattr(wtc, name)


def public_names(modules: list[str]) -> list[tuple[str, str]]:
    """(module, name) for every entry of `__all__` in the documented packages."""
    out = []
    for module in modules:
        exported = getattr(sys.modules[module], "__all__", None)
        if exported is not None and (module == "wtc" or module.count(".") == 1):
            out.extend((module, name) for name in exported)
    return out


def _exists(dotted: str) -> bool:
    """Whether a dotted name (wtc.scan.store, wtc.tasks.data.Records) names a module, or an
    attribute reached from its longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _walk(doc):
    """A pdoc object and every member defined in it (inherited and imported members belong to
    their own page)."""
    yield doc
    for member in getattr(doc, "own_members", []):
        if getattr(member, "kind", None) == "module":
            continue
        yield from _walk(member)


def _share_variable_docstrings(documented: dict) -> None:
    """A constant a package re-exports (`wtc.tasks.REAL_TOLERANCE`) has its docstring where it is
    defined (a string after the assignment); pdoc reads only the importing module's source, so
    give the re-export the docstring of the defining module's variable holding the same object."""
    defined = {}
    for module in documented.values():
        for name, member in module.members.items():
            if member.kind == "variable" and member.docstring.strip():
                defined.setdefault((name, id(member.obj)), member.docstring)
    for module in documented.values():
        for name, member in module.members.items():
            if member.kind == "variable" and not member.docstring.strip() and (name, id(member.obj)) in defined:
                member.docstring = defined[(name, id(member.obj))]   # pdoc's cached_property: set once, here


def _check(documented: dict, modules: list[str]) -> list[str]:
    problems = []
    for module, name in public_names(modules):
        member = documented.get(f"{module}.{name}") or documented[module].members.get(name)   # a subpackage, or a name
        if member is None:
            problems.append(f"{module}.__all__ names {name!r}, which pdoc did not find")
        elif not member.docstring.strip():
            problems.append(f"{module}.{name} is public (in {module}.__all__) and has no docstring")
    seen = set()
    for module in documented.values():
        for doc in _walk(module):
            for ref in _REFERENCE.findall(doc.docstring or ""):
                ref = ref.rstrip(".")
                if (doc.fullname, ref) not in seen and not _exists(ref):
                    seen.add((doc.fullname, ref))
                    problems.append(f"{doc.fullname}: its docstring names `{ref}`, which does not exist")
    return problems


def build(out, strict: bool = True) -> ApiDocs:
    """Write the HTML reference of every public wtc module into `out` (index.html, one page per
    module, search.js). strict: raise ApiDocError listing every problem (pdoc warnings, public
    names without a docstring, broken `wtc.` references) instead of returning them."""
    try:
        import pdoc
        import pdoc.doc
        import pdoc.render
    except ModuleNotFoundError:
        raise ApiDocError('pdoc is not installed: python -m pip install -c constraints.txt -e ".[test]"') from None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ApiDocError(f"{out} is a file; the API reference is a directory")
    modules, skipped = public_modules()
    _resolve_lazy_names()
    result = ApiDocs(out, modules, skipped)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.render.configure(docformat="markdown", search=True, show_source=False)
        documented = {name: pdoc.doc.Module.from_name(name) for name in modules}
        _share_variable_docstrings(documented)
        for name, module in documented.items():
            page = out / f"{name.replace('.', '/')}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(pdoc.render.html_module(module, documented), encoding="utf-8")
            result.pages.append(page)
        (out / "index.html").write_text(pdoc.render.html_index(documented), encoding="utf-8")
        (out / "search.js").write_text(pdoc.render.search_index(documented), encoding="utf-8")
        problems = _check(documented, modules)
    result.problems = [f"pdoc: {w.message}".splitlines()[0] for w in caught] + problems
    if strict and result.problems:
        raise ApiDocError(f"{len(result.problems)} problem(s) in the API reference:\n  " + "\n  ".join(result.problems))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wtc.apidoc", description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="docs/api", help="directory for the HTML (default docs/api)")
    args = parser.parse_args(argv)
    try:
        result = build(args.out)
    except ApiDocError as exc:
        print(f"wtc.apidoc: error: {exc}", file=sys.stderr)
        return 2
    for s in result.skipped:
        print(f"skipped {s.module}: needs {s.missing} (the '{s.extra}' extra)")
    print(f"documented {len(result.modules)} modules; open {result.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The API reference builds from the docstrings without a problem (CI runs this, so a broken
docstring, an undocumented public name or a dangling `wtc.` reference fails it), and the checks
that decide it do catch what they are for."""
from __future__ import annotations

import importlib
import re
import sys

import pytest

pytest.importorskip("pdoc")

import wtc  # noqa: E402
from wtc import apidoc  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return apidoc.build(tmp_path_factory.mktemp("api"))      # strict: raises ApiDocError listing problems


def _anchors(page) -> set[str]:
    return set(re.findall(r'<section id="([^"]+)"', page.read_text(encoding="utf-8")))


def test_reference_builds_without_problems(built):
    assert built.problems == []
    assert (built.out / "index.html").is_file() and (built.out / "search.js").is_file()
    assert {"wtc", "wtc.scan", "wtc.scan.store", "wtc.models.io", "wtc.tasks.data"} <= set(built.modules)
    assert all(p.is_file() and p.stat().st_size > 0 for p in built.pages)
    assert len(built.pages) == len(built.modules)


def test_every_public_name_has_a_docstring_and_a_place_on_its_page(built):
    names = apidoc.public_names(built.modules)
    assert ("wtc", "discover") in names and ("wtc.scan", "scan") in names and ("wtc.tasks", "Task") in names
    for module, name in names:
        obj = getattr(sys.modules[module], name)
        if isinstance(obj, type(sys)):                 # a subpackage: its own page, linked from the parent's
            page = built.out / f"{module.replace('.', '/')}/{name}.html"
            assert page.is_file(), page
            assert (obj.__doc__ or "").strip(), f"{module}.{name} has no module docstring"
            continue
        page = built.out / f"{module.replace('.', '/')}.html"
        assert name in _anchors(page), f"{module}.{name} is not on {page}"


def test_skipped_modules_are_only_those_of_missing_extras(built):
    for s in built.skipped:
        assert s.extra in set(apidoc.OPTIONAL.values())
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(s.missing)


def test_an_undocumented_public_function_is_a_problem(monkeypatch):
    import pdoc.doc
    import wtc.scan  # noqa: F401

    def bare(x: int) -> int:
        return x

    bare.__module__ = "wtc.scan"
    monkeypatch.setattr(sys.modules["wtc.scan"], "bare", bare, raising=False)
    monkeypatch.setattr(sys.modules["wtc.scan"], "__all__", [*sys.modules["wtc.scan"].__all__, "bare"])
    documented = {"wtc.scan": pdoc.doc.Module(sys.modules["wtc.scan"])}
    problems = apidoc._check(documented, ["wtc.scan"])
    assert problems == ["wtc.scan.bare is public (in wtc.scan.__all__) and has no docstring"]


def test_a_dangling_reference_in_a_docstring_is_a_problem(monkeypatch):
    import pdoc.doc
    import wtc.scan  # noqa: F401

    def documented_fn() -> None:
        """Reads `wtc.scan.store.ScanStore` and `wtc.scan.no_such_module`."""

    documented_fn.__module__ = "wtc.scan"
    monkeypatch.setattr(sys.modules["wtc.scan"], "documented_fn", documented_fn, raising=False)
    monkeypatch.setattr(sys.modules["wtc.scan"], "__all__", [*sys.modules["wtc.scan"].__all__, "documented_fn"])
    problems = apidoc._check({"wtc.scan": pdoc.doc.Module(sys.modules["wtc.scan"])}, ["wtc.scan"])
    assert problems == ["wtc.scan.documented_fn: its docstring names `wtc.scan.no_such_module`, which does not exist"]


def test_re_exported_constant_carries_its_definition_docstring(built):
    page = (built.out / "wtc" / "tasks.html").read_text(encoding="utf-8")
    assert "REAL_TOLERANCE" in _anchors(built.out / "wtc" / "tasks.html")
    assert "suite&#39;s tolerance" in page or "suite's tolerance" in page


def test_py_typed_marker_ships_with_the_package():
    from pathlib import Path

    assert (Path(wtc.__file__).parent / "py.typed").is_file()


def _unannotated(fn) -> list[str]:
    import inspect

    sig = inspect.signature(fn)
    missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty
               and p.name not in ("self", "cls")]
    return missing + (["return"] if sig.return_annotation is inspect.Signature.empty else [])


def test_top_level_functions_and_task_from_arrays_are_fully_annotated():
    import inspect

    functions = [getattr(wtc, n) for n in wtc.__all__ if inspect.isfunction(getattr(wtc, n))]
    assert {f.__name__ for f in functions} >= {"discover", "train", "extract", "verify", "load", "backends"}
    for fn in [*functions, wtc.Task.from_arrays, wtc.scan.scan]:
        assert _unannotated(fn) == [], fn.__qualname__


def test_from_arrays_spells_out_every_option_of_the_records_task():
    """Task.from_arrays's keywords are wtc.tasks.data.from_arrays's (the one implementation), so
    the two cannot drift apart; a misspelt keyword is still a one-line TaskError."""
    import inspect

    import numpy as np

    from wtc.tasks.data import from_arrays

    ours = {k: p.default for k, p in inspect.signature(wtc.Task.from_arrays).parameters.items() if p.kind == p.KEYWORD_ONLY}
    theirs = {k: p.default for k, p in inspect.signature(from_arrays).parameters.items()
              if p.kind == p.KEYWORD_ONLY and k != "task_type"}
    assert ours == theirs
    x = np.random.default_rng(0).integers(0, 10, (100, 5))
    with pytest.raises(wtc.tasks.TaskError, match="unknown keyword argument.*'seqlen'.*takes name, output, valid_from"):
        wtc.Task.from_arrays(x, x, seqlen=5)


def test_a_module_needing_a_missing_extra_is_skipped_by_name_and_other_failures_raise(monkeypatch):
    real = importlib.import_module

    def fake(missing):            # wtc.models.tl fails to import, needing `missing`
        def imp(n, *a):
            if n == "wtc.models.tl":
                raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
            return real(n, *a)
        return imp

    monkeypatch.setattr(apidoc.importlib, "import_module", fake("transformer_lens"))
    found, skipped = apidoc.public_modules()
    assert apidoc.Skipped("wtc.models.tl", "transformer_lens", "tl") in skipped
    assert "wtc.models.tl" not in found and "wtc.models.hf" in found
    monkeypatch.setattr(apidoc.importlib, "import_module", fake("not_an_extra_of_wtc"))
    with pytest.raises(ModuleNotFoundError, match="not_an_extra_of_wtc"):
        apidoc.public_modules()

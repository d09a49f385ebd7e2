"""Tasks named on a command line: a registered name, a task in a Python file, or one in a module.

    resolve("parity_last2")                   a built-in or registered task (wtc.tasks.get)
    resolve("path/to/tasks.py:my_sum")        the wtc.Task the file binds to my_sum
    resolve("path/to/tasks.py")               the file's only wtc.Task
    resolve("pkg.mod:my_sum", module=True)    the wtc.Task an importable module binds to my_sum

A task file is plain Python that defines `wtc.Task`s (its callables included); it is run once per
process (like a script: its directory is on sys.path while it runs, so it can import modules
beside it) and the same file is not run again. NAME is the variable the Task is bound to, or the
Task's own name. `wtc train` and `wtc discover` take every form (the CLI's one resolver), and a
callable task then trains in worker processes on a pool drawn from it (wtc.tasks.pool).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from wtc.tasks.task import Task, TaskError

_LOADED: dict[tuple[str, int], ModuleType] = {}    # (resolved path, mtime_ns) -> the module it ran as


def resolve(spec: str, *, module: bool = False) -> Task:
    """The Task `spec` names (see the module's docstring); TaskError naming what is wrong (a missing
    file or module, a missing name, a name bound to something other than a wtc.Task)."""
    from wtc import tasks as registry

    if not isinstance(spec, str) or not spec:
        raise TaskError(f"a task is given as NAME, FILE.py[:NAME] or MODULE:NAME, got {spec!r}")
    if module:
        where, colon, name = spec.rpartition(":")
        if not colon or not where or not name:
            raise TaskError(f"--module takes MODULE:NAME (a dotted module and the Task's name in it), got {spec!r}")
        return _pick(_import(where), name, f"module {where!r}")
    if spec in registry.names():
        return registry.get(spec)
    where, colon, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if where.endswith(".py"):
        return _pick(_run_file(Path(where)), name or None, f"{where}")
    if spec.endswith(".py"):
        return _pick(_run_file(Path(spec)), None, spec)
    if colon:
        if Path(where).exists():
            raise TaskError(f"{where!r} is not a .py file; a task file is Python source named FILE.py")
        raise TaskError(f"no task {spec!r}: {where!r} is not a .py file (FILE.py:NAME); for a task in an importable "
                        f"module give --module {spec}")
    return registry.get(spec)


def _run_file(path: Path) -> ModuleType:
    """The module `path` ran as (run now, or the earlier run of the same unchanged file)."""
    if not path.exists():
        raise TaskError(f"no task file {str(path)!r}")
    if not path.is_file():
        raise TaskError(f"{str(path)!r} is not a file (a task file is Python source named FILE.py)")
    path = path.resolve()
    key = (str(path), path.stat().st_mtime_ns)
    if key in _LOADED:
        return _LOADED[key]
    name = f"wtc_task_file_{len(_LOADED)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskError(f"cannot load {str(path)!r} as Python")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod                 # dataclasses and pickling-free imports look their module up here
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise TaskError(f"task file {str(path)!r} raised {type(exc).__name__}: {exc}") from exc
    finally:
        try:
            sys.path.remove(str(path.parent))
        except ValueError:                 # the file took it off itself
            pass
    _LOADED[key] = mod
    return mod


def _import(dotted: str) -> ModuleType:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and dotted.startswith(exc.name):      # the module itself (or its package) is missing
            raise TaskError(f"no module {dotted!r} to import (is it on PYTHONPATH?)") from None
        raise TaskError(f"module {dotted!r} raised ModuleNotFoundError: {exc}") from exc
    except Exception as exc:
        raise TaskError(f"module {dotted!r} raised {type(exc).__name__}: {exc}") from exc


def _pick(mod: ModuleType, name: str | None, where: str) -> Task:
    """The Task `mod` binds to `name` (or whose .name is `name`); without a name, its only Task."""
    defined = {var: value for var, value in vars(mod).items() if isinstance(value, Task) and not var.startswith("_")}
    listing = ", ".join(sorted(defined)) or "none"
    if name is None:
        if len(defined) != 1:
            raise TaskError(f"{where} defines {len(defined)} wtc.Tasks ({listing}); name one: {where}:NAME")
        return next(iter(defined.values()))
    if hasattr(mod, name):
        value = getattr(mod, name)
        if not isinstance(value, Task):
            raise TaskError(f"{name!r} in {where} is of type {type(value).__name__}, not a wtc.Task")
        return value
    by_name = [t for t in defined.values() if t.name == name]
    if by_name:
        return by_name[0]
    raise TaskError(f"{where} has no task {name!r} (its wtc.Tasks: {listing})")

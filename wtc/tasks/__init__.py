"""Tasks: the `Task` type and the registry of built-in tasks (defined in wtc.tasks.builtin).

    wtc.tasks.get("parity_last2"); wtc.tasks.names(); wtc.tasks.names(tier="must")
    wtc.tasks.files.resolve("tasks.py:my_sum")   # a task defined in a file (or MODULE:NAME, module=True)
"""
from __future__ import annotations

import difflib

from wtc.tasks import builtin
from wtc.tasks.task import REAL_TOLERANCE, Task, TaskError

__all__ = ["Task", "TaskError", "REAL_TOLERANCE", "get", "names", "tier", "register"]

_USER: dict[str, Task] = {}


def names(tier: str | None = None) -> list[str]:
    """Registered task names (built-ins in table order, then user tasks); optionally one tier
    ('must', 'stretch', 'wider' or 'user'). A user task registered over a built-in's name replaces it."""
    if tier not in (None, *builtin.TIERS, "user"):
        raise TaskError(f"tier must be None, one of {builtin.TIERS} or 'user', got {tier!r}")
    builtins = [n for n in builtin.SUITE if n not in _USER and (tier is None or builtin.tier(n) == tier)]
    return builtins + ([n for n in _USER] if tier in (None, "user") else [])


def tier(name: str) -> str:
    """'must', 'stretch' or 'wider' for built-ins, 'user' for registered user tasks."""
    get(name)
    return "user" if name in _USER else builtin.tier(name)


def get(name: str | Task) -> Task:
    """The task registered under `name` (a Task passes through)."""
    if isinstance(name, Task):
        return name
    if not isinstance(name, str):
        raise TaskError(f"a task is a name (str) or a wtc.Task, got {type(name).__name__} {name!r}")
    if name in _USER:
        return _USER[name]
    if name in builtin.SUITE:
        return builtin.make(name)
    close = difflib.get_close_matches(str(name), names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names())}"
    raise TaskError(f"unknown task {name!r}{hint}")


def register(task: Task, *, overwrite: bool = False) -> Task:
    """Make a user task available by name (e.g. to the CLI)."""
    if not isinstance(task, Task):
        raise TaskError(f"register() takes a wtc.Task, got {type(task).__name__}")
    if not overwrite and (task.name in _USER or task.name in builtin.SUITE):
        raise TaskError(f"a task named {task.name!r} is already registered (pass overwrite=True)")
    _USER[task.name] = task
    return task

"""Options `wtc train` and `wtc discover` share: which task (TASK, FILE.py:NAME or --module
MODULE:NAME, one resolver: wtc.tasks.resolve) and how much progress (--quiet / --verbose)."""
from __future__ import annotations

from wtc.tasks.task import TaskError

TASK_HELP = ("a built-in task name (`wtc tasks` lists them), or FILE.py:NAME: the wtc.Task a Python file binds to "
             "NAME (FILE.py alone: its only Task)")
MODULE_HELP = "the wtc.Task an importable module binds to NAME (instead of TASK)"


def task(args):
    """The wtc.Task of the parsed arguments (TASK, or --module MODULE:NAME); TaskError naming what is wrong."""
    from wtc.tasks.files import resolve

    if args.task and args.module:
        raise TaskError(f"give a TASK or --module, not both (got {args.task!r} and --module {args.module!r})")
    if args.module:
        return resolve(args.module, module=True)
    if not args.task:
        raise TaskError("give a TASK (a name, or FILE.py:NAME) or --module MODULE:NAME")
    return resolve(args.task)


def verbosity(parser) -> None:
    """Add --quiet / --verbose: how much of the progress (the "wtc" logger, on stderr) is shown."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", action="store_true", help="no progress on stderr (warnings and errors only)")
    group.add_argument("--verbose", action="store_true", help="progress and details on stderr")

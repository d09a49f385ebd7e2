"""Options `wtc train` and `wtc discover` share: which task (TASK, FILE.py:NAME or --module
MODULE:NAME, one resolver: wtc.tasks.files.resolve) and how much progress (--quiet / --verbose,
the "wtc" logger on stderr: wtc.progress); and `wtc --version`."""
from __future__ import annotations

from wtc import __version__
from wtc.tasks.task import TaskError

VERSION = f"wtc {__version__}"

TASK_HELP = ("a built-in task name (`wtc tasks` lists them), or FILE.py:NAME: the wtc.Task a Python file binds to "
             "NAME (FILE.py alone: its only Task)")
MODULE_HELP = "the wtc.Task an importable module binds to NAME (instead of TASK)"


def task_arguments(parser) -> None:
    """Add TASK (optional: --all or --module may stand for it) and --module."""
    parser.add_argument("task", nargs="?", help=TASK_HELP)
    parser.add_argument("--module", default=None, metavar="MODULE:NAME", help=MODULE_HELP)


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


def logging_for(args):
    """The command's progress logging (wtc.progress.command_logging) from its --quiet / --verbose
    (commands without them: progress shown)."""
    from wtc.progress import command_logging

    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    return command_logging("quiet" if quiet else "verbose" if verbose else "normal")

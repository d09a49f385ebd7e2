"""Progress of `train` and `discover`, through the `logging` module (logger "wtc"), on stderr.

What a run says while it works is progress; what it found (the program, the report) is the
caller's to print on stdout. So every progress line goes to the "wtc" logger at INFO (details at
DEBUG), and the `wtc` command writes that logger to stderr: `--quiet` keeps warnings only,
`--verbose` adds the details. In Python, `progress=True` makes the logger show INFO and, when no
logging is configured at all, gives it a handler on stderr; configured logging is respected.

Step progress of a training loop (`Steps`) is a bar on a terminal, a line every LINE_EVERY_S
elsewhere (a log file gets a few lines, not a carriage return per step), and, in a worker process,
a status record every STATUS_EVERY_S on its stdout that the parent (`Board`) shows: one status line
kept at the bottom of a terminal and refreshed every second, or a line every LINE_EVERY_S.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import contextmanager

LOGGER = "wtc"
log = logging.getLogger(LOGGER)

LINE_EVERY_S = 15.0     # not on a terminal: a progress line at most this often
STATUS_EVERY_S = 1.0    # a worker reports its step this often (to the parent, not to the user)
REFRESH_S = 1.0         # a terminal's status line is redrawn this often (its seconds tick)
MILESTONE = "[wtc] "    # a worker's line for the parent to log
STATUS = "[wtc-status] "  # a worker's step record (JSON) for the parent's status line

_open_bars = 0          # tqdm bars on the terminal now: log lines are then written through tqdm.write


class _Stderr(logging.StreamHandler):
    """Writes to the sys.stderr of the moment (pytest and callers replace it), through tqdm.write while
    a bar is showing, so the bar is redrawn below the line instead of being cut by it."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        if not _open_bars:
            super().emit(record)
            return
        try:
            from tqdm.auto import tqdm
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:       # logging's contract: a failed emit is reported, never raised
            self.handleError(record)


class _Format(logging.Formatter):
    """Progress plain; warnings and details say what they are (`wtc: warning: ...`)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno == logging.INFO:
            return text
        return f"wtc: {record.levelname.lower()}: {text}"


def _handler() -> logging.Handler:
    handler = _Stderr()
    handler.setFormatter(_Format("%(message)s"))
    return handler


def enable() -> None:
    """What `progress=True` does in Python: the "wtc" logger shows INFO unless its level was set,
    and gets a stderr handler only when no logging is configured (no handler on it or the root)."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        log.addHandler(_handler())


@contextmanager
def command_logging(verbosity: str = "normal"):
    """The `wtc` command's logging while it runs: "quiet" (warnings only), "normal" (progress) or
    "verbose" (details too), on stderr; the logger is put back as it was afterwards (main() also
    runs inside other programs and tests)."""
    levels = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG}
    if verbosity not in levels:
        raise ValueError(f"verbosity must be one of {sorted(levels)}, got {verbosity!r}")
    saved = (log.level, log.propagate)
    handler = _handler()
    log.addHandler(handler)
    log.setLevel(levels[verbosity])
    log.propagate = False          # the command's own handler only (no second copy through the root's)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def showing() -> bool:
    """Whether progress lines would be shown now."""
    return log.isEnabledFor(logging.INFO)


def on_terminal() -> bool:
    """Whether progress goes to a terminal (bars and a status line) rather than a file or pipe."""
    try:
        return showing() and sys.stderr.isatty()
    except (AttributeError, ValueError):     # a replaced or closed stderr
        return False


def mode(progress) -> str:
    """A job's progress mode from its opts dict (wtc.dt.workers) or a plain bool: "worker" (report to
    the parent process), "on" (show here) or "off"."""
    if isinstance(progress, dict):
        return "worker" if progress.get("milestones") else ("on" if progress.get("progress") else "off")
    if progress in ("worker", "on", "off"):
        return progress
    return "on" if progress else "off"


def say(progress, text: str) -> None:
    """One progress line: logged here, or (in a worker) printed for the parent to log."""
    m = mode(progress)
    if m == "worker":
        print(f"{MILESTONE}{text}", flush=True)
    elif m == "on":
        log.info(text)


class Steps:
    """A loop's step progress (see the module's docstring for where it goes). update(step) every
    step is cheap: it looks at the clock and writes only when a line or a record is due."""

    def __init__(self, total: int, initial: int, label: str, progress, key: str = ""):
        self.total, self.step, self.label, self.key = total, initial, label, key or label
        self.note = ""
        self.mode = mode(progress)
        self.bar = None
        self.last = time.monotonic()
        if self.mode == "on" and not showing():
            self.mode = "off"
        if self.mode == "on" and on_terminal():
            global _open_bars
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, initial=initial, leave=False, desc=label, file=sys.stderr)
            _open_bars += 1

    def update(self, step: int, note: str | None = None) -> None:
        if note is not None:
            self.note = note
        if self.bar is not None:
            self.bar.update(step - self.step)
            if note is not None:
                self.bar.set_postfix_str(note, refresh=False)
        self.step = step
        if self.mode == "off" or self.bar is not None:
            return
        now = time.monotonic()
        if self.mode == "worker" and now - self.last >= STATUS_EVERY_S:
            self.last = now
            self._record()
        elif self.mode == "on" and now - self.last >= LINE_EVERY_S:
            self.last = now
            log.info(f"{self.label}: {self._where()}")

    def _where(self) -> str:
        pct = 100 * self.step / self.total if self.total else 100.0
        return f"step {self.step}/{self.total} ({pct:.0f}%)" + (f", {self.note}" if self.note else "")

    def _record(self) -> None:
        print(f"{STATUS}{json.dumps({'key': self.key, 'step': self.step, 'total': self.total})}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            global _open_bars
            self.bar.close()
            self.bar = None
            _open_bars -= 1
        elif self.mode == "worker":
            self._record()


class Board:
    """What the running workers report, shown together: their milestone lines are logged as they
    come, and their step records make one status line ("attempt 0 step 400/1300 | attempt 1 step
    380/1300 | 52s"), kept at the bottom of a terminal and redrawn every REFRESH_S, or logged every
    LINE_EVERY_S elsewhere. Off when progress is not shown."""

    def __init__(self, label: str, enabled: bool):
        self.label = label
        self.enabled = enabled and showing()
        self.started = self.last = time.monotonic()
        self.status: dict[str, dict] = {}
        self.bar = None
        if self.enabled and on_terminal():
            global _open_bars
            from tqdm.auto import tqdm
            self.bar = tqdm(total=None, bar_format="{desc}", leave=False, file=sys.stderr)
            _open_bars += 1

    def line(self, text: str) -> None:
        """A worker's output line: a milestone is logged, a step record kept; other lines are not ours."""
        if not self.enabled:
            return
        if text.startswith(MILESTONE):
            log.info(text[len(MILESTONE):])
        elif text.startswith(STATUS):
            try:
                record = json.loads(text[len(STATUS):])
                self.status[str(record["key"])] = record
            except (ValueError, KeyError, TypeError):
                log.debug(f"an unreadable worker status line: {text!r}")

    def done(self, key: str) -> None:
        self.status.pop(str(key), None)

    def tick(self) -> None:
        """Called as the parent polls its workers: redraw or log the status line when it is due."""
        if not self.enabled:
            return
        now = time.monotonic()
        due = REFRESH_S if self.bar is not None else LINE_EVERY_S
        if now - self.last < due:
            return
        self.last = now
        parts = [f"{k} step {r['step']}/{r['total']}" for k, r in sorted(self.status.items())]
        text = f"{self.label}: " + " | ".join(parts + [f"{now - self.started:.0f}s"])
        if self.bar is not None:
            self.bar.set_description_str(text, refresh=True)
        else:
            log.info(text)

    def close(self) -> None:
        if self.bar is not None:
            global _open_bars
            self.bar.close()
            self.bar = None
            _open_bars -= 1

"""Study bookkeeping: the output directory, its config.json, the wall time spent on it over all
(resumed) invocations, and the units of finished work a rerun reuses (kept).

Paths in a config (a model directory, a directory of checkpoints) are recorded resolved (absolute,
symbolic links followed) and compared as the directories they name (same_path), so one model given
as `gpt2` from its parent directory and as `hf/gpt2` or /abs/hf/gpt2 from elsewhere is one config.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from wtc.errors import StudyError


class Clock:
    """Seconds kept in out/time.json at every checkpoint; time after the last checkpoint of an
    interrupted run is lost (it is recomputed, and counted, on resume)."""

    def __init__(self, out: Path):
        self.file = Path(out) / "time.json"
        try:
            self.before = float(json.loads(self.file.read_text())["seconds"]) if self.file.exists() else 0.0
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            self.before = 0.0
        self.t0 = time.perf_counter()

    def now(self) -> float:
        """Seconds of this invocation."""
        return time.perf_counter() - self.t0

    def total(self) -> float:
        return self.before + self.now()

    def save(self) -> None:
        self.file.write_text(json.dumps({"seconds": round(self.total(), 1)}))


def study_dir(out_dir, error: type[Exception]) -> Path:
    """The study's output directory as a Path; `error` (the study's own) when it is an existing file."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise error(f"--out {out} exists and is not a directory")
    return out


def resolved(path) -> str | None:
    """A path as a study records it: absolute, with symbolic links followed (None stays None)."""
    return None if path is None else str(Path(path).expanduser().resolve())


def same_path(recorded, now) -> bool:
    """Whether a recorded path names the directory `now` names, however either was spelled. A
    relative path recorded by an older wtc (its working directory unknown) matches a resolved path
    that ends with it."""
    if recorded is None or now is None:
        return recorded is None and now is None
    here = Path(resolved(now))
    there = Path(recorded).expanduser()
    if there.is_absolute():
        if resolved(there) == str(here):
            return True
        try:
            return os.path.samefile(there, here)       # another mount or hard link of the same directory
        except OSError:
            return False
    parts = Path(os.path.normpath(there)).parts
    return bool(parts) and ".." not in parts and here.parts[-len(parts):] == parts


def check_config(out: Path, config: dict, free=(), label: str = "study", error: type[Exception] = StudyError,
                 paths=()) -> None:
    """Refuse an out/config.json written by another config (the fields in `free` may differ: they
    only extend the run or change what is derived from it), then write this one. The fields in
    `paths` are paths: recorded resolved and compared with same_path."""
    f = out / "config.json"
    mine = json.loads(json.dumps({k: resolved(v) if k in paths else v for k, v in config.items()}))
    if f.exists():
        try:
            theirs = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise error(f"{f}: corrupt ({exc})") from None
        diff = sorted(k for k in set(mine) | set(theirs) if k not in free and not (
            same_path(theirs.get(k), mine.get(k)) if k in paths else mine.get(k) == theirs.get(k)))
        # a run that failed before computing anything (e.g. a --model it could not use) left only
        # its config: nothing would be lost, so another config may start there
        computed = [p for p in out.iterdir() if p.name not in ("config.json", "time.json")]
        if diff and computed:
            raise error(f"{out} holds a study ({label}) with a different config ({', '.join(diff)}: "
                        f"{[theirs.get(k) for k in diff]} there, {[mine.get(k) for k in diff]} here); "
                        "use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(mine, indent=2))


def run_dirs(out_dir, config, label: str) -> tuple[Path, Clock, Path]:
    """A study of resumable runs, one JSON file each: (out, its clock, out/runs), the config checked
    against the one already there (check_config)."""
    import dataclasses

    out = study_dir(out_dir, StudyError)
    check_config(out, dataclasses.asdict(config), label=label)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return out, Clock(out), runs


def kept(path: Path, compute, clock: Clock, key=None, log=None) -> dict:
    """A study's unit of resumable work: the JSON row kept at `path`, else compute()'s row, written
    there atomically (and the clock saved) before it is returned as a reader gets it back (so a
    first run and a rerun go on from the same numbers).

    key (JSON data): what the row is computed from, kept beside it; a row kept under another key
    (or none, or a file a kill left unreadable) is computed again: it is derived work, not a run
    to protect. log(message): told whether the row was reused or computed."""
    path = Path(path)
    key = None if key is None else json.loads(json.dumps(key))
    if path.exists():
        try:
            held = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            held = None
        if key is None and held is not None:
            _tell(log, f"reusing {path}")
            return held
        if isinstance(held, dict) and held.get("key") == key and "row" in held:
            _tell(log, f"reusing {path}")
            return held["row"]
        _tell(log, f"recomputing {path}: " + ("unreadable (a kill while it was written?)" if held is None else
                                             "it was computed from other settings"))
    row = json.loads(json.dumps(compute()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(row if key is None else {"key": key, "row": row}, indent=1))
    os.replace(tmp, path)
    clock.save()
    _tell(log, f"computed {path}")
    return row


def _tell(log, message: str) -> None:
    if log is not None:
        log(message)

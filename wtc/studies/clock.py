"""Study bookkeeping: the output directory, its config.json, and the wall time spent on it over all
(resumed) invocations."""
from __future__ import annotations

import json
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


def check_config(out: Path, config: dict, free=(), label: str = "study", error: type[Exception] = StudyError) -> None:
    """Refuse an out/config.json written by another config (the fields in `free` may differ: they
    only extend the run or change what is derived from it), then write this one."""
    f = out / "config.json"
    mine = json.loads(json.dumps(config))
    if f.exists():
        try:
            theirs = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise error(f"{f}: corrupt ({exc})") from None
        diff = sorted(k for k in set(mine) | set(theirs) if k not in free and mine.get(k) != theirs.get(k))
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


def kept(path: Path, compute, clock: Clock) -> dict:
    """A study's unit of resumable work: the JSON row kept at `path`, else compute()'s row, written
    there (and the clock saved) before it is returned."""
    if path.exists():
        return json.loads(path.read_text())
    row = compute()
    path.write_text(json.dumps(row, indent=1))
    clock.save()
    return row

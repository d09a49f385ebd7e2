"""What a run was: the wtc version, the seed, the configuration, the task (its name and
fingerprint) and the machine, written into summary.json by `wtc discover` / `Discovery.save` and
`wtc train`, so a result says how to reproduce it and where it came from."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from wtc.machine import Machine, describe


@dataclass(frozen=True)
class RunRecord:
    """wtc_version, seed, the DTConfig as a dict (discover: the first attempt's, sized by the probe;
    later attempts climb DTConfig.rung from it), the task's name and fingerprint (Task.fingerprint:
    its definition and a fixed probe batch), the machine, and when the run started (UTC, ISO 8601).
    wtc_source: the git commit of the checkout wtc ran from ("+changes" when tracked files differ
    from it), None when wtc is installed from a wheel: runs of one version from different commits
    differ."""

    wtc_version: str
    seed: int
    config: dict | None
    task: str
    task_sha256: str
    machine: Machine
    started: str
    wtc_source: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["machine"] = self.machine.to_dict()
        return d


def record(task, seed: int, config=None, started: float | None = None) -> RunRecord:
    """The record of a run of `task` (a wtc.Task) with `seed` and `config` (a DTConfig or None),
    started at `started` (time.time(); default now)."""
    import wtc

    when = datetime.datetime.fromtimestamp(started, datetime.timezone.utc) if started is not None else \
        datetime.datetime.now(datetime.timezone.utc)
    return RunRecord(wtc_version=wtc.__version__, seed=int(seed),
                     config=None if config is None else config.to_dict(), task=task.name,
                     task_sha256=task.fingerprint(), machine=describe(),
                     started=when.isoformat(timespec="seconds"), wtc_source=source_revision())


@functools.lru_cache(maxsize=1)
def source_revision() -> str | None:
    """The short commit of the git checkout the wtc package is imported from, "+changes" appended
    when tracked files differ from it; None outside a checkout or without git."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("+changes" if dirty.returncode == 0 and dirty.stdout.strip() else "")

"""Study bookkeeping: the output directory, and the wall time spent on it over all (resumed) invocations."""
from __future__ import annotations

import json
import time
from pathlib import Path


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

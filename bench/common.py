"""Shared by the bench scripts: where results go and how rows are appended."""
from __future__ import annotations

import csv
import datetime
import functools
import platform
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


@functools.cache
def neutral_cwd() -> str:
    """An empty working directory for a benchmark's interpreters: `python -c` and `python -m` put the
    working directory first on sys.path, so started beside a checkout they would import its source
    tree instead of their own installation (a non-editable one: an editable install's finder runs
    first), and an earlier engine would run this one's code."""
    return tempfile.mkdtemp(prefix="wtc-bench-cwd-")


def stamp() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def machine() -> str:
    return f"{platform.node()} {platform.processor() or platform.machine()}"


def cpu_flags() -> str:
    """The CPU model and its vector-extension flags (avx*, fma, amx*), as /proc/cpuinfo lists them:
    every timing is recorded with the instruction sets it ran on (wtc.machine, as summary.json records them)."""
    from wtc.machine import cpu_line
    return cpu_line()


def append_rows(name: str, rows: list[dict]) -> Path:
    """Append rows to bench/results/<name>.csv (header written once)."""
    path = RESULTS / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return path

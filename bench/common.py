"""Shared by the bench scripts: where results go and how rows are appended."""
from __future__ import annotations

import csv
import datetime
import platform
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def stamp() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def machine() -> str:
    return f"{platform.node()} {platform.processor() or platform.machine()}"


def cpu_flags() -> str:
    """The CPU model and its vector-extension flags (avx*, fma, amx*), as /proc/cpuinfo lists them:
    every timing is recorded with the instruction sets it ran on."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    vector = sorted(f for f in set(flags) if f.startswith(("avx", "fma", "amx")))
    return f"{model} [{' '.join(vector)}]"


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

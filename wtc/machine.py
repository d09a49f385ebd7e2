"""What a run ran on: the CPU (model and vector-extension flags), the cores, the OS and the versions
of Python and the numeric libraries. Recorded in every summary.json (wtc.provenance) and in every
benchmark row (bench/common.py), so a number can be traced to the machine and instruction sets
that produced it. Reads /proc/cpuinfo and package metadata only: nothing heavy is imported.
"""
from __future__ import annotations

import dataclasses
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

VECTOR_PREFIXES = ("avx", "fma", "amx")   # the flags that decide which native kernels can run


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:                      # not Linux: the model comes from platform, no flags
        return ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows of it."""
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "?"


def cpu_flags() -> list[str]:
    """The CPU's vector-extension flags (avx*, fma*, amx*), sorted, as /proc/cpuinfo lists them
    (empty where there is no /proc/cpuinfo)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            return sorted({f for f in line.split(":", 1)[1].split() if f.startswith(VECTOR_PREFIXES)})
    return []


def cpu_line() -> str:
    """"<model> [<flags>]": the CPU for one line of a table."""
    return f"{cpu_model()} [{' '.join(cpu_flags())}]"


def _version(package: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Machine:
    """The machine a run ran on. native_isa: the instruction set wtc's native DT kernels run
    ("avx512", "avx2", "portable"), when wtc._C was loaded by the run (None otherwise: it is not
    loaded just to say so)."""

    system: str
    arch: str
    cpu_model: str
    cpu_flags: list[str]
    logical_cores: int
    python: str
    numpy: str | None
    torch: str | None
    native_isa: str | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def describe() -> Machine:
    """This machine, now."""
    from wtc.threads import cores

    isa = None
    if "wtc._C" in sys.modules:
        from wtc.errors import BackendError
        from wtc._native import dt_isa
        try:
            isa = dt_isa()
        except BackendError:
            isa = None
    return Machine(system=f"{platform.system()} {platform.release()}", arch=platform.machine(),
                   cpu_model=cpu_model(), cpu_flags=cpu_flags(), logical_cores=cores(),
                   python=platform.python_version(), numpy=_version("numpy"), torch=_version("torch"),
                   native_isa=isa)

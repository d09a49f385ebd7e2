"""Rung workers started early: their interpreters import torch and wtc while the caller is still
starting up, instead of after it.

`wtc discover TASK` spends its first seconds importing torch and probing the task, and only then
starts a worker per rung, which imports torch again (about 3 s each on this 2-core machine, one
after the other). A Prestarted pool, opened by the CLI before its own heavy imports, starts the
workers' interpreters at once (`python -m wtc.dt.workers - MODULE...`); each imports the modules
it is given (the caller's jobs: the CLI names wtc.discovery for discover) and waits for its spec
on stdin, which wtc.dt.workers.run_ladder writes when it starts a rung. What a rung computes
does not change (the spec is the same; only when the interpreter started).

Standard library only: importing this module must not import torch.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


class Prestarted:
    """n worker interpreters waiting for a spec, each with `preload` (wtc module names) imported;
    take() hands one out, close() stops the rest."""

    def __init__(self, n: int, preload: tuple[str, ...] = ()):
        self._dir = tempfile.TemporaryDirectory(prefix="wtc-workers-")
        self._idle: list[tuple[subprocess.Popen, object]] = []
        for i in range(n):
            log = open(Path(self._dir.name) / f"worker{i}.log", "w+")
            proc = subprocess.Popen([sys.executable, "-m", "wtc.dt.workers", "-", *preload], stdin=subprocess.PIPE,
                                    stdout=log, stderr=subprocess.STDOUT, text=True)
            self._idle.append((proc, log))

    def take(self):
        """(process, log file) of a waiting worker that is still alive, or None."""
        while self._idle:
            proc, log = self._idle.pop(0)
            if proc.poll() is None:
                return proc, log
            log.close()
        return None

    def close(self) -> None:
        for proc, log in self._idle:
            proc.kill()
            proc.wait()
            log.close()
        self._idle = []
        self._dir.cleanup()

    def __enter__(self) -> "Prestarted":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

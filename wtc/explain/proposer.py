"""Running an external proposer's shell command, contained as far as an ordinary process can be.

What is contained: the command (split with shlex, run without a shell unless it names one) gets
 - an environment of PATH, LANG and HOME only (HOME is its working directory): none of the
   caller's other variables (API keys, tokens) reach it;
 - a fresh temporary working directory, removed afterwards: relative paths land there;
 - its own session and process group, killed as a whole (SIGKILL) as soon as the command returns
   or its time is up: children it left in the background do not outlive the call;
 - resource limits: CPU seconds (the timeout + 2), address space (MEMORY_BYTES), the size of any
   file it writes (FILE_BYTES; its stdout counts) and, for a non-root user, the number of processes.
What is NOT contained (it is not a jail): it runs as the calling user, so it can read every file
that user can read and write wherever that user can write by absolute path, and use the network;
a process that starts a session of its own (setsid) leaves the process group and is not killed.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import tempfile
import time

from wtc.errors import WtcError

MEMORY_BYTES = 8 << 30      # address space: room for an interpreter and an LLM client, not for a runaway
FILE_BYTES = 16 << 20       # any one file it writes, its stdout included
EXTRA_PROCESSES = 256       # processes it may add to what the user already runs (non-root only)


class ProposerError(WtcError, RuntimeError):
    """An external proposer command failed (could not start, exited non-zero, printed no JSON list)."""


class ProposerTimeout(ProposerError, TimeoutError):
    """An external proposer command did not return within its time limit."""


def _user_processes() -> int:
    uid, n = os.getuid(), 0
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                continue
    return n


def _limiter(cpu_s: int, nproc: int | None):
    """The preexec function: resource limits only (it runs between fork and exec)."""
    import resource

    limits = [(resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, MEMORY_BYTES), (resource.RLIMIT_FSIZE, FILE_BYTES)]
    if nproc is not None:
        limits.append((resource.RLIMIT_NPROC, nproc))

    def apply() -> None:
        for res, soft in limits:
            hard = resource.getrlimit(res)[1]
            value = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
            resource.setrlimit(res, (value, value))
    return apply


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait for `pid` to exit without reaping it (its zombie keeps the process group id ours, so the
    kill that follows cannot hit a reused id); False when the deadline passed first."""
    pause = 0.001
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def run_command(command: str, contexts: list[str], timeout_s: float) -> list[str]:
    """The command's JSON list of predicate sources, given the JSON list `contexts` on stdin, run
    contained as the module docstring says. Raises ProposerTimeout past `timeout_s` seconds of wall
    clock, ProposerError when it cannot start, exits non-zero or prints something else."""
    argv = shlex.split(command)
    if not argv:
        raise ProposerError(f"proposer {command!r} is an empty command")
    nproc = None if os.getuid() == 0 else _user_processes() + EXTRA_PROCESSES   # root is not held by RLIMIT_NPROC
    with tempfile.TemporaryDirectory(prefix="wtc-proposer-", ignore_cleanup_errors=True) as work, \
            tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(json.dumps(contexts).encode())   # files, not pipes: a background child holding the
        stdin.seek(0)                                # pipe open cannot keep the call waiting for EOF
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": work, "LANG": os.environ.get("LANG", "C.UTF-8")}
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=work, env=env,
                                    start_new_session=True, close_fds=True,
                                    preexec_fn=_limiter(math.ceil(timeout_s) + 2, nproc))
        except (OSError, subprocess.SubprocessError) as exc:
            raise ProposerError(f"proposer {command!r} could not start: {exc}") from None
        try:
            finished = _wait_unreaped(proc.pid, time.monotonic() + timeout_s)
        finally:
            _kill_group(proc.pid)                    # the command's whole group, whether it finished or not
            proc.wait()
        if not finished:
            raise ProposerTimeout(f"proposer {command!r} timed out after {timeout_s:g} s")
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read().decode("utf-8", "replace"), stderr.read().decode("utf-8", "replace")
    if proc.returncode != 0:
        tail = " ".join(err.split())[-300:]
        raise ProposerError(f"proposer {command!r} failed (exit status {proc.returncode})" + (f": {tail}" if tail else ""))
    try:
        sources = json.loads(out)
    except ValueError:
        raise ProposerError(f"proposer {command!r} printed no JSON (it must print a JSON list of predicate sources): "
                            f"{' '.join(out.split())[:200]!r}") from None
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ProposerError(f"proposer {command!r} must print a JSON list of predicate sources (strings), got "
                            f"{type(sources).__name__}")
    return sources

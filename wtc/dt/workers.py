"""Rungs of the ladder run side by side in worker processes, one CPU core each.

A Discrete Transformer step is overhead-bound on one thread (more intra-op threads do not make it
faster), so a second core is worth a second rung, not a faster first one: on a 2-core machine
wtc.train and wtc.discover run two rungs at once, the next starting when either finishes
(wtc.dt.ladder decides which run and picks the winner as the sequential loop would). Workers are
fresh interpreters (`python -m wtc.dt.workers SPEC`): no fork after OpenMP started, and no
re-import of the user's main script (multiprocessing's spawn would re-run a script without a
__main__ guard). A process that declared itself fresh (allow_fork: the CLI, once torch is imported)
forks them instead while it has started no thread since, and so does a library caller's process
under stricter conditions (_may_fork); a forked worker runs the same spec as an interpreter would.
They rebuild built-in tasks by name, data tasks (Task.from_arrays) from their records, and tasks
defined by the user's callables from a pool of sequences drawn here (wtc.tasks.pool: a callable
cannot be sent to a fresh interpreter without pickles, which wtc never loads), each written to the
ladder's scratch directory. A callable task's jobs run on the pooled task in this process too
(JobTask), so every number of workers trains on the same data.

What a rung does is a job, named "module:Name" by its caller (an object in an importable wtc
module, so a worker finds it by name and this module imports none of them):
    result_path(opts, attempt) -> Path | None   where the result is kept (None: nowhere)
    finished(task, rung, seed, opts, path)      a kept result to reuse (resume), else None
    run(task, rung, seed, opts, path)           do the work here; write the result to path if given
    load(path, task, rung, seed)                read a result back (refusing another run's)
opts is JSON. Jobs: wtc.dt.attempt:TrainJob (wtc.train), wtc.discover_job:DiscoverJob (wtc.discover).
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from wtc.dt.config import DTConfig
from wtc.dt.ladder import Ladder, Rung
from wtc.errors import WtcError
from wtc.progress import MILESTONE, STATUS, Board, say  # noqa: F401 (MILESTONE re-exported)
from wtc.progress import log as progress_log
from wtc.threads import cores, torch_threads


POLL_S = 0.05  # seconds between looks at the running workers

# this process's threads (ids) when allow_fork() declared it fresh (None: workers are interpreters)
_FORK_BASELINE: frozenset[str] | None = None


class WorkerError(WtcError, RuntimeError):
    """A worker process failed with something other than a wtc error (its log tail is attached)."""


RECORDS = "records:"   # a task reference to a data task's records (path follows, once written)
POOL = "pool:"         # ... to a callable task's pool of drawn sequences (wtc.tasks.pool)


@dataclass(frozen=True)
class JobTask:
    """A task as the rungs' jobs see it. task: what they run on in this process (a callable task's
    pooled stand-in); ref: what a worker rebuilds it from (a built-in task's name, RECORDS or
    POOL; the path follows once run_ladder has written the file); pool: the drawn pool (POOL only)."""

    task: object
    ref: str
    pool: object | None = None

    @property
    def pooled(self) -> bool:
        return self.pool is not None


def job_task(task, seed: int) -> JobTask:
    """How the rungs of `task` get their task: by name, from records, or from a pool of sequences
    drawn here from the user's callables (seeded by `seed`)."""
    from wtc.tasks import builtin, data, pool
    if task.name in builtin.SUITE and builtin.make(task.name) is task:
        return JobTask(task, task.name)
    if data.has_records(task):
        return JobTask(task, RECORDS)
    drawn = pool.draw(task, seed)
    return JobTask(drawn.task(origin=task), POOL, drawn)


def _worker_task(ref: str):
    from wtc import tasks as task_registry
    from wtc.tasks import data, pool
    from wtc.tasks.task import Task
    if ref.startswith(RECORDS):
        inputs, outputs, options = data.read_records(Path(ref[len(RECORDS):]))
        return Task.from_arrays(inputs, outputs, **options)
    if ref.startswith(POOL):
        return pool.Pool.read(Path(ref[len(POOL):])).task()
    return task_registry.get(ref)


def worker_count(config: DTConfig, cap: int | None = None) -> int:
    """Rungs run at once: config.workers, else one per core (at most cap)."""
    if config.workers is not None:
        return config.workers
    return max(1, min(cores(), cap if cap is not None else cores()))


def _job(name: str):
    """The job named "module:Name" (a wtc module); "module:" only imports the module."""
    module, colon, attr = name.partition(":")
    if not module.startswith("wtc.") or not colon:
        raise WorkerError(f"not a wtc job name: {name!r}")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else None


def run_ladder(job_name: str, jt: JobTask, ladder: Ladder, seed: int, opts: dict,
               receive: Callable[[Rung, object], object] | None = None, prestarted=None,
               kill_at: float | None = None) -> None:
    """Run the ladder's rungs (wtc.dt.ladder.Ladder): with one worker one after another in this
    process, else each in its own worker process, a new rung starting as soon as one finishes.
    Rungs the ladder no longer wants (an earlier one solved) are stopped. receive(rung, result):
    what the caller does with a result as it arrives (judge it, report it); it returns the
    result the ladder keeps. prestarted: a wtc.worker_pool.Prestarted whose waiting interpreters
    take rungs first. kill_at (time.time() seconds): workers still running then are killed and
    give no result (the budget's last resort: jobs stop at their own deadline first).
    """
    job = _job(job_name)
    task, task_ref = jt.task, jt.ref
    receive = receive or (lambda rung, result: result)
    if ladder.workers == 1:
        while (rung := ladder.next_rung()) is not None:
            with torch_threads(rung.config.threads):
                result = job.run(task, rung, seed, opts, job.result_path(opts, rung.attempt))
            ladder.done(rung.attempt, receive(rung, result))
        return
    pending = {}
    with tempfile.TemporaryDirectory(prefix="wtc-rungs-") as scratch:
        if task_ref == RECORDS:
            from wtc.tasks import data
            data.save_records(task, Path(scratch) / "records.npz")
            task_ref = RECORDS + str(Path(scratch) / "records.npz")
        elif task_ref == POOL:
            jt.pool.save(Path(scratch) / "pool.npz")
            task_ref = POOL + str(Path(scratch) / "pool.npz")
        board = Board(task.name, bool(opts.get("progress")))

        def start(rung: Rung) -> None:
            path = job.result_path(opts, rung.attempt) or Path(scratch) / f"attempt{rung.attempt}_result"
            done = job.finished(task, rung, seed, opts, path)
            if done is not None:               # kept from an earlier run (resume)
                ladder.done(rung.attempt, receive(rung, done))
                return
            spec = {"job": job_name, "task": task_ref, "attempt": rung.attempt, "label": rung.label,
                    "parent": os.getpid(), "config": rung.config.to_dict(), "seed": seed,
                    "opts": {**opts, "progress": False, "milestones": bool(opts.get("progress"))},
                    "path": str(path), "error": str(Path(scratch) / f"attempt{rung.attempt}_error.json")}
            ready = prestarted.take() if prestarted is not None else None
            if ready is not None:              # an interpreter that already imported torch and wtc
                proc, log = ready
                try:
                    proc.stdin.write(json.dumps(spec))
                    proc.stdin.close()
                except OSError:                # it died while waiting: start one as usual
                    proc.kill()
                    ready = None
            how = "prestarted"
            if ready is None:
                log = open(Path(scratch) / f"attempt{rung.attempt}.log", "w+")
                if _may_fork([rung]):
                    proc, how = _fork(spec, log, task), "forked"
                else:
                    proc, how = subprocess.Popen([sys.executable, "-m", "wtc.dt.workers", json.dumps(spec)],
                                                 stdout=log, stderr=subprocess.STDOUT), "interpreter"
            pending[rung.attempt] = (rung, path, log, proc, 0)
            progress_log.debug(f"{task.name}: attempt {rung.attempt} runs in a worker process ({how}, pid {proc.pid})")

        try:
            while True:
                while len(pending) < ladder.workers and (rung := ladder.next_rung()) is not None:
                    start(rung)
                if not pending or (kill_at is not None and time.time() > kill_at):
                    break                      # the finally below kills what is still running
                time.sleep(POLL_S)
                for a in sorted(pending):
                    rung, path, log, proc, relayed = pending[a]
                    if not ladder.wanted(a):   # an earlier rung solved: the sequential loop never ran this one
                        _stop(proc, log)
                        board.done(f"attempt {a}")
                        del pending[a]
                        continue
                    relayed = _relay(log, relayed, board)
                    code = proc.poll()
                    if code is None:
                        pending[a] = (rung, path, log, proc, relayed)
                        continue
                    _relay(log, relayed, board)    # what it wrote before it exited
                    board.done(f"attempt {a}")
                    del pending[a]
                    log.seek(0)
                    tail = "".join(ln for ln in log.read().splitlines(True) if not ln.startswith(STATUS))[-3000:]
                    log.close()
                    if code != 0:
                        ladder.failed(a, _worker_failure(task, a, code, tail, Path(scratch) / f"attempt{a}_error.json"))
                    else:
                        ladder.done(a, receive(rung, job.load(path, task, rung, seed)))
                board.tick()
        finally:   # stopped, or something went wrong here: no orphaned workers
            board.close()
            for rung, path, log, proc, _ in pending.values():
                _stop(proc, log)


def _stop(proc, log) -> None:
    """Kill a worker (a Popen or _Forked), reap it and close its log."""
    proc.kill()
    proc.wait()
    log.close()


def _thread_ids() -> frozenset[str] | None:
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:            # no /proc: never fork
        return None


_IMPORTED_WITH = _thread_ids()     # this process's threads when this module was imported


def allow_fork() -> None:
    """Declare this process fresh: torch and the jobs imported, nothing computed (the CLI, before
    its work). Its rung workers are then forked from it while it has started no thread since,
    instead of started as interpreters that import torch again (~2 s of CPU each, on the first
    first rungs' critical path). A thread started since (GNU OpenMP's pool after a parallel region here,
    a Python thread) would not survive a fork: from then on workers are interpreters again. Threads
    are told apart by id, not counted: numpy's OpenBLAS threads, running here at import, may stop
    while an OpenMP pool starts (and they re-initialise themselves in a forked child)."""
    global _FORK_BASELINE
    _FORK_BASELINE = _thread_ids() if hasattr(os, "fork") else None


def _may_fork(rungs: list[Rung]) -> bool:
    """Whether workers for these rungs may be forked: in a process declared fresh (allow_fork) that has
    started no thread since; or, in a library caller's process (wtc.discover from user code), one
    that has started no thread since this module was imported, runs no Python thread but its main
    one, has not initialised CUDA, and whose rungs run on one CPU thread each. An OpenMP pool the
    caller started before then is left behind by a fork: a child on one thread never enters it (a
    child on two hangs in it: measured), so those rungs are interpreters."""
    now = _thread_ids()
    if now is None or not hasattr(os, "fork"):
        return False
    if _FORK_BASELINE is not None:
        return now <= _FORK_BASELINE
    import threading
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_initialized()
    return (_IMPORTED_WITH is not None and now <= _IMPORTED_WITH and threading.active_count() == 1 and not cuda
            and all(r.config.threads == 1 and r.config.device == "cpu" for r in rungs))


class _Forked:
    """A forked worker, as run_ladder uses a subprocess.Popen: pid, poll(), kill(), wait()."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        return self._reap(0)

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fork(spec: dict, log, task) -> _Forked:
    """Run main(spec) in a forked child whose stdout and stderr are `log`, as `python -m
    wtc.dt.workers SPEC` would (the same spec: the same result). It keeps the parent's task
    object, which is what the spec's reference rebuilds, and a pooled task's origin with it (the
    user's callables: its reading is judged there, not in the parent; wtc.discover_job.judged)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:                                   # the child: never returns into the parent's code
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        main(spec, task)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def milestone(opts: dict, text: str) -> None:
    """A progress line from a job: logged at once in-process, relayed by the parent from a worker
    (wtc.progress)."""
    say(opts, text)


def _relay(log, offset: int, board: Board) -> int:
    """Hand the worker's new lines (complete lines only) to the board: milestones are logged, step
    records make the status line; returns the new offset."""
    log.flush()
    with open(log.name, errors="replace") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind("\n") + 1
    for line in chunk[:end].splitlines():
        board.line(line)
    return offset + len(chunk[:end].encode())


def _worker_failure(task, attempt: int, code: int, tail: str, err: Path) -> Exception:
    """The wtc error a worker reported in `err` (same class and message, so the CLI prints one
    line), else a WorkerError with the worker's log tail."""
    if err.exists():
        info = json.loads(err.read_text())
        cls = getattr(importlib.import_module(info["module"]), info["class"], None)
        if isinstance(cls, type) and issubclass(cls, WtcError):
            try:
                return cls(info["message"])
            except TypeError:   # a constructor with other arguments: keep the message, lose the class
                pass
        return WorkerError(f"{task.name} attempt {attempt}: {info['message']}")
    return WorkerError(f"{task.name} attempt {attempt} failed in its worker (exit {code}):\n{tail}")


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """Stop this worker when the process that started it is gone (killed by SIGTERM or -9, its
    cleanup never ran): an orphaned rung would train on, unseen, for minutes."""
    import os
    import threading

    def watch():
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                os._exit(3)
    threading.Thread(target=watch, daemon=True, name="wtc-parent-watch").start()


def main(spec: dict, task=None) -> None:
    """Run the spec's job; task: the task object itself (a forked worker), else rebuilt from the spec's reference."""
    if spec.get("parent"):
        _exit_with_parent(int(spec["parent"]))
    path = Path(spec["path"])
    try:
        job = _job(spec["job"])
        rung = Rung(spec["attempt"], spec["label"], DTConfig.from_dict(spec["config"]))
        with torch_threads(rung.config.threads):
            job.run(task if task is not None else _worker_task(spec["task"]), rung, spec["seed"], spec["opts"], path)
    except WtcError as exc:
        Path(spec["error"]).write_text(json.dumps(
            {"module": type(exc).__module__, "class": type(exc).__name__, "message": str(exc)}))
        raise


if __name__ == "__main__":
    if sys.argv[1:2] == ["-"]:   # prestarted (wtc.worker_pool): import the modules it was given, wait for the spec
        _exit_with_parent(os.getppid())
        for module in sys.argv[2:]:
            _job(module + ":")
        text = sys.stdin.read()
        if not text:             # the parent closed the pool without a rung for this one
            os._exit(0)
        main(json.loads(text))
    else:
        main(json.loads(sys.argv[1]))
    # the result is on disk and closed: skip the interpreter's teardown (torch, OpenMP; ~1.5 s measured
    # per worker, which the parent would wait for before it reads the result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

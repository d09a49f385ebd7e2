"""Attempts trained side by side in worker processes, one CPU core each.

A Discrete Transformer step is overhead-bound on one thread (more intra-op threads do not make
it faster), so a second core is worth a second attempt, not a faster first one: on a 2-core
machine wtc.train runs restarts 0 and 1 (the default and the next capacity rung) at once. Each
attempt is deterministic in (task, config, seed, attempt), and the winner is chosen exactly as the
sequential loop would (the first solved attempt in index order, else the best), so the result
does not depend on the number of workers. Workers are fresh interpreters (`python -m
wtc.dt.workers SPEC`): no fork after OpenMP started, and no re-import of the user's main script
(multiprocessing's spawn would re-run a script without a __main__ guard). They rebuild built-in
tasks by name and hand results back through the same files as checkpointed runs; other tasks
train sequentially in the calling process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def default_workers(max_attempts: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(cores, max_attempts))


def task_reference(task) -> str | None:
    """The built-in task name a worker can rebuild the task from, or None (train in-process)."""
    from wtc.tasks import builtin
    if task.name in builtin.SUITE and builtin.make(task.name) is task:
        return task.name
    return None


def _attempt_in_worker(spec: dict) -> None:
    from wtc import tasks as task_registry
    from wtc.dt.config import DTConfig
    from wtc.dt.train import Attempt, _run_attempt, _save_result
    from wtc.threads import torch_threads

    task = task_registry.get(spec["task"])
    config = DTConfig.from_dict(spec["config"])
    state_path = Path(spec["state"]) if spec["state"] else None
    with torch_threads(config.threads):
        run = Attempt(task, config, spec["seed"], spec["attempt"])
        if spec["resume"] and state_path and state_path.with_suffix(".json").exists():
            run.restore(state_path)
        key, model, history = _run_attempt(run, False, state_path)
        _save_result(Path(spec["done"]), key, model, history)


def run_wave(task, task_ref, configs: dict[int, object], seed: int, ckpt: Path | None, resume: bool,
             progress: bool) -> dict[int, tuple]:
    """Run the given attempts ({attempt: config}) at once, one process each (the caller sizes the
    wave to the cores); {attempt: (key, model, history)}."""
    from wtc.dt.train import _load_result

    with tempfile.TemporaryDirectory(prefix="wtc-attempts-") as scratch:
        base = ckpt if ckpt is not None else Path(scratch)
        procs = {}
        for a, cfg in configs.items():
            if resume and (base / f"attempt{a}_result.json").exists():
                continue
            spec = {"task": task_ref, "config": cfg.to_dict(), "seed": seed, "attempt": a,
                    "state": str(base / f"attempt{a}") if ckpt is not None else None,
                    "done": str(base / f"attempt{a}_result"), "resume": resume}
            log = open(Path(scratch) / f"attempt{a}.log", "w+")
            procs[a] = (subprocess.Popen([sys.executable, "-m", "wtc.dt.workers", json.dumps(spec)],
                                         stdout=log, stderr=subprocess.STDOUT), log)
        for a, (proc, log) in procs.items():
            code = proc.wait()
            log.seek(0)
            tail = log.read()[-3000:]
            log.close()
            if code != 0:
                raise RuntimeError(f"{task.name} attempt {a} failed in its worker (exit {code}):\n{tail}")
        results = {a: _load_result(base / f"attempt{a}_result", task) for a in configs}
    if progress:
        for a, (key, model, history) in sorted(results.items()):
            print(f"{task.name} attempt {a}: {'solved' if key[0] else 'not solved'} "
                  f"({history.seconds:.0f}s in a worker)", flush=True)
    return results


if __name__ == "__main__":
    _attempt_in_worker(json.loads(sys.argv[1]))

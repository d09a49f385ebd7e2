"""wtc.train: anneal -> hard phase -> freeze -> head refit -> L-BFGS polish -> judge on fresh data.

One attempt (wtc.dt.attempt) trains a population of R replicas side by side (independent
parameters, one batched forward; AdamW is per-element, so replicas never interact). The hard
model of every replica is scored on fresh data with the task's own metric; attempts climb the
restart ladder (wtc.dt.ladder), in worker processes when there are cores for them
(wtc.dt.workers), until a replica solves the task, the attempts run out, or the time budget would
be exceeded.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING


from wtc import arguments
from wtc import tasks as task_registry
from wtc.dt.config import ConfigError, ConfigTypeError, DTConfig
from wtc.dt.ladder import FINISH_SHARE, Deadline, check_budget, climb, margin_s
from wtc.dt.workers import job_task, run_ladder, worker_count
from wtc.errors import TrainingError
from wtc.progress import enable, log

if TYPE_CHECKING:                      # annotations only
    from wtc.dt.history import History
    from wtc.dt.model import DiscreteTransformer
    from wtc.tasks.task import Task

__all__ = ["train"]

JOB = "wtc.dt.attempt:TrainJob"


def train(task: Task | str, config: DTConfig | None = None, seed: int = 0, budget_s: float | None = None,
          progress: bool = True, checkpoint_dir: str | os.PathLike | None = None,
          resume: bool = False) -> tuple[DiscreteTransformer, History]:
    """Train a Discrete Transformer on a task; returns (model, history).

    The model is the best replica of the best attempt (a single-replica, frozen model): the first
    attempt in index order that solves the task, else the best one, the same for any
    config.workers. history holds that attempt's per-step curves of every replica (history.replica
    is the one returned) and history.final the fresh-data scores.

    budget_s (None, or a finite positive number of seconds) bounds the wall time: the call returns
    within it plus a margin (5% or 10 s, whichever is larger). A new attempt starts only if the
    time left covers half the longest attempt so far; training stops when 90% of the budget is
    spent, and the attempt is then frozen, refit (its polish cut at the budget) and scored as it
    stands (model.train_info["stopped_at_step"] says where, and a resume continues its training).
    progress: lines through the "wtc" logger (wtc.progress: on stderr unless logging is configured).
    A task defined by callables trains on a pool of sequences drawn from them (wtc.tasks.pool),
    in worker processes too; its model is then scored here on fresh draws (history.final["fresh"]).
    checkpoint_dir keeps each attempt's training state and result there;
    resume=True continues a killed run from them, refusing files of another task, seed, attempt
    or DTConfig (CheckpointError naming the field).
    """
    task = task_registry.get(task)
    if config is None:
        config = DTConfig()
    if not isinstance(config, DTConfig):
        raise ConfigTypeError(f"config must be a wtc.DTConfig, got {type(config).__name__}")
    budget_s = check_budget(budget_s)
    for name, flag in (("progress", progress), ("resume", resume)):
        if not isinstance(flag, bool):          # resume="no" read as True
            raise ConfigError(f"{name} must be True or False, got {flag!r}")
    if checkpoint_dir is not None:
        if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
            raise ConfigError(f"checkpoint_dir must be None or a directory path, got {checkpoint_dir!r}")
        if Path(checkpoint_dir).exists() and not Path(checkpoint_dir).is_dir():
            raise ConfigError(f"checkpoint_dir {str(checkpoint_dir)!r} is a file, not a directory")
    elif resume:
        raise ConfigError("resume=True continues the checkpoints in checkpoint_dir: give checkpoint_dir")
    seed = arguments.seed(seed, error=ConfigError)
    config.check_size(task.seq_len, task.n_inputs)
    if progress:
        enable()
    started, t0 = time.time(), time.perf_counter()
    jt = job_task(task, seed)
    workers = worker_count(config, cap=config.max_attempts)
    deadline = None if budget_s is None else Deadline.of(budget_s, started, FINISH_SHARE)
    opts = {"checkpoint_dir": str(checkpoint_dir) if checkpoint_dir is not None else None,
            "resume": bool(resume), "progress": bool(progress),
            "deadline": None if deadline is None else deadline.to_json()}
    kill_at = None if budget_s is None else started + budget_s + margin_s(budget_s) / 2

    def solved(result) -> bool:
        return bool(result[0][0])

    def receive(rung, result):
        if progress and workers > 1:   # in-process attempts report themselves
            key, _, history = result
            log.info(f"{task.name} attempt {rung.attempt}: {'solved' if key[0] else 'not solved'} "
                     f"({history.seconds:.0f}s in a worker)")
        return result

    def run_rungs(ladder):
        run_ladder(JOB, jt, ladder, seed, opts, receive, kill_at=kill_at)

    best, _, ladder = climb(config, run_rungs, workers=workers, solved=solved, key=lambda r: r[0],
                            budget_s=budget_s, max_attempts=config.max_attempts, name=task.name, progress=progress)
    if progress:
        for rung, wanted in ladder.unfinished():
            log.info(f"{task.name} attempt {rung.attempt}: stopped ("
                     + ("the budget ran out)" if wanted else "an earlier attempt solved it)"))
    if best is None:
        raise TrainingError(f"{task.name}: the {budget_s:g}s budget ran out before any attempt finished (it was "
                            f"stopped at the budget); give a larger budget_s")
    _, model, history = best
    history.seconds = time.perf_counter() - t0
    stopped = (history.final or {}).get("stopped_at_step")
    if stopped is not None:
        model.train_info = {**model.train_info, "stopped_at_step": stopped}
        if progress:
            log.info(f"{task.name}: the {budget_s:g}s budget ran out at step {stopped} of "
                     f"{history.final['planned_steps']}: the model is partly trained"
                     + (" (resume=True continues it)" if checkpoint_dir is not None else ""))
    if task.heldout is not None or jt.pooled:   # the score reported: held-out records, or fresh draws
        fresh = task.score_fresh(model.predict, 10000, [seed, 999])
        history.final = {**(history.final or {}), "heldout" if task.heldout is not None else "fresh": fresh.score}
        model.train_info = {**model.train_info, "score": fresh.score, "score_on": fresh.describe(),
                            "train_score": model.train_info.get("score")}
    score = (history.final or {}).get("scores", [{}])[history.replica] if history.final else {}
    if score and not math.isfinite(score.get("max_abs_err", 0.0)):
        raise TrainingError(f"{task.name}: every attempt diverged (the best model predicts NaN/inf on fresh data); "
                            f"lower DTConfig.lr (now {config.lr:g}) or check the task's scale")
    return model, history

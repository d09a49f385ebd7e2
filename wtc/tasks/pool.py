"""A task defined by callables, drawn once into a pool of sequences that worker processes train on.

A user's `sample` and `target` are Python callables: they cannot be sent to a fresh interpreter
without pickles (which wtc never uses), so a worker process cannot call them. Instead the parent
draws a pool from them, seeded: sequences to train on, a separate part to check readings on (what
`verification` gives inside the worker), and for an any_length task a part at twice the length.
The pool crosses to a worker as an .npz of numbers (save / read), and `PoolTask` there samples
from it. The pooled task keeps the name and fingerprint of the task it stands for, so models
trained on it extract against the user's task. The final verdict is never the pool's: discover
verifies the chosen program with the user's callables on fresh draws, in the parent or in a worker
forked from it (PoolTask.origin: the user's task, kept in memory only).

Callable tasks use the pool whether they run in a worker or in this process, so the program found
is the same for any number of workers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable   # PoolTask's generated __init__ carries Task's string annotations, which name it

import numpy as np

from wtc.errors import TaskError
from wtc.tasks.data import Records
from wtc.tasks.task import Task

TRAIN_SEQUENCES = 65536      # a default attempt draws 1300 x 128 = 166k: each pooled sequence ~2.5 times
CHECK_SEQUENCES = 10000      # what a reading is checked on in the worker (verify's default n)
LONGER_SEQUENCES = 2000      # at twice the length (any_length tasks; verify's LONGER_SEQUENCES)
SHAPE = ("seq_len", "n_inputs", "n_outputs", "output", "valid_from", "description", "any_length")


@dataclass(frozen=True, eq=False, repr=False)
class PoolTask(Task):
    """A task over drawn sequences (wtc.tasks.data.Records, as a data task's): `sample` draws
    them, `target` looks their recorded targets up (the inputs it is given must be drawn from here).
    `check`: the part that verification gives (what readings are checked on in a worker);
    `longer`: the same pool at twice the length (what at_length(2 * seq_len) returns). any_length
    is the user's task's: the program read from a pooled task is a loop over T all the same."""

    check: "PoolTask | None" = field(default=None, kw_only=True)
    longer: "PoolTask | None" = field(default=None, kw_only=True)
    origin: "Task | None" = field(default=None, kw_only=True)   # the user's task, where this process holds it

    def verification(self, n: int) -> tuple[Task, int]:
        task, n = super().verification(n)
        return (self.check, n) if self.check is not None else (task, n)

    def at_length(self, seq_len: int) -> Task:
        if self.longer is not None and seq_len == self.longer.seq_len:
            return self.longer
        raise TaskError(f"task {self.name!r}: a pooled task has lengths {self.seq_len}"
                        + (f" and {self.longer.seq_len}" if self.longer is not None else "") + f" only, not {seq_len}")


def _part(x: np.ndarray, y: np.ndarray, name: str, shape: dict, squeeze: bool, fingerprint: str,
          longer: PoolTask | None = None, check: PoolTask | None = None, origin: Task | None = None) -> PoolTask:
    rows = Records(x, y, squeeze, False, None, name)
    task = PoolTask(name, rows.sample, rows.target, longer=longer, check=check, origin=origin, **shape)
    object.__setattr__(task, "_fingerprint", fingerprint)   # it stands for the user's task (frozen: private cache)
    object.__setattr__(task, "_ndim", 2 if squeeze else 3)
    object.__setattr__(task, "_dtype", None)
    return task


@dataclass
class Pool:
    """What the parent drew from a callable task (float64, invalid target positions NaN)."""

    name: str
    shape: dict
    fingerprint: str
    squeeze: bool                     # the user's sample returns (n, T): targets get that form
    train: tuple[np.ndarray, np.ndarray]
    check: tuple[np.ndarray, np.ndarray]
    longer: tuple[np.ndarray, np.ndarray] | None

    def task(self, origin: Task | None = None) -> PoolTask:
        """The pooled task: trains on `train`; verification (worker side) on `check` (and `longer`).
        origin: the user's task it was drawn from, kept in memory only (a worker forked from the
        parent holds it too, and judges its reading there; wtc.discover_job.judged)."""
        longer = None
        if self.longer is not None:
            shape = {**self.shape, "seq_len": self.longer[0].shape[1]}
            longer = _part(*self.longer, f"{self.name} (T={shape['seq_len']})", shape, self.squeeze, self.fingerprint)
        check = _part(*self.check, self.name, self.shape, self.squeeze, self.fingerprint, longer=longer)
        return _part(*self.train, self.name, self.shape, self.squeeze, self.fingerprint, longer=longer, check=check,
                     origin=origin)

    def save(self, path: Path) -> None:
        """An .npz of numbers and a JSON header (no pickles)."""
        arrays = {"train_x": self.train[0], "train_y": self.train[1], "check_x": self.check[0],
                  "check_y": self.check[1]}
        if self.longer is not None:
            arrays.update(longer_x=self.longer[0], longer_y=self.longer[1])
        meta = {"name": self.name, "shape": self.shape, "fingerprint": self.fingerprint, "squeeze": self.squeeze}
        np.savez(path, meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def read(cls, path: Path) -> "Pool":
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            longer = (z["longer_x"], z["longer_y"]) if "longer_x" in z else None
            return cls(meta["name"], meta["shape"], meta["fingerprint"], meta["squeeze"],
                       (z["train_x"], z["train_y"]), (z["check_x"], z["check_y"]), longer)


def draw(task: Task, seed: int, train: int = TRAIN_SEQUENCES) -> Pool:
    """Draw the pool of `task` from its own callables (validated as every draw is), seeded by seed."""
    def part(t: Task, k: int, n: int):
        x, y = t.batch(np.random.default_rng([seed, 31337, k]), n)
        return x, y

    shape = {a: getattr(task, a) for a in SHAPE}
    longer = None
    if task.any_length:
        try:
            longer = part(task.at_length(2 * task.seq_len), 2, LONGER_SEQUENCES)
        except TaskError:     # a target written for seq_len only: the parent's verify reports it
            longer = None
    return Pool(task.name, shape, task.fingerprint(), task._sample_ndim() == 2, part(task, 0, train),
                part(task, 1, CHECK_SEQUENCES), longer)

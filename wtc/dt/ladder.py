"""The restart ladder and the time budget: one policy for wtc.train and wtc.discover.

Rungs 0, 1, 2, ... (DTConfig.rung: the capacity ladder, or the same config with new seeds) run in
waves of `workers` at a time. Before every wave but the first, the budget is checked: a wave
starts only if the time left covers half the longest wave so far (its attempts are cut at the
deadline, so a wave that would run long costs its tail, not the promise). The first wave always
runs (there is no result before it). Inside a wave every attempt keeps the Deadline: training
stops at train_until, finishing and reading out stop at end, and a worker still running past
end + half the margin is killed (wtc.dt.workers), so the call returns within its budget plus
margin_s. The winner is the first solved rung in index order, else the one with the best key
(the first of equals); rungs after the first solved one are dropped even when they ran in the
same wave. So the winner and the list of rungs kept are those of the sequential loop for any
number of workers, whenever the budget does not cut the ladder short (with a binding budget,
more workers reach more rungs in the same time).
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable

from wtc.dt.config import ConfigError, DTConfig

# Share of a budget kept for what follows training: finishing the population (head refit, snap,
# L-BFGS polish), reading replicas out and verifying (discover), or finishing and scoring (train).
# Measured on a double prefix sum (2 aggregate heads, one loaded core): 23 s of training, 9 s of
# finishing, 12-17 s per replica read.
READ_SHARE = 0.25
FINISH_SHARE = 0.1
NEW_WAVE_SHARE = 0.5   # another wave starts while the time left covers this share of the longest wave


def margin_s(budget_s: float) -> float:
    """How far past its budget a call may return: 5% of it or 10 s, whichever is larger."""
    return max(0.05 * budget_s, 10.0)


@dataclass(frozen=True)
class Deadline:
    """Wall-clock limits (time.time() seconds) of a budgeted call: training stops at train_until,
    finishing at finish_by, reading out and verifying at end. Crosses to a
    worker process as two numbers (to_json / from_json)."""

    train_until: float
    end: float

    @classmethod
    def of(cls, budget_s: float, started: float, reserve_share: float) -> "Deadline":
        return cls(started + budget_s * (1.0 - reserve_share), started + budget_s)

    @property
    def finish_by(self) -> float:
        """When finishing a trained population stops (half the time after training): the rest is
        for reading replicas out and verifying them."""
        return self.train_until + 0.5 * (self.end - self.train_until)

    def left(self, now: float | None = None) -> float:
        return self.end - (time.time() if now is None else now)

    def training_over(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.train_until

    def to_json(self) -> list[float]:
        return [self.train_until, self.end]

    @classmethod
    def from_json(cls, value) -> "Deadline | None":
        return None if value is None else cls(float(value[0]), float(value[1]))


@dataclass(frozen=True)
class Rung:
    """Restart `attempt` of the ladder: its label and DTConfig (the seed offset is the index)."""

    attempt: int
    label: str
    config: DTConfig


def check_budget(budget_s) -> float | None:
    """budget_s as a float: None (no budget) or a finite positive number of seconds."""
    if budget_s is None:
        return None
    if (not isinstance(budget_s, numbers.Real) or isinstance(budget_s, bool) or not math.isfinite(budget_s)
            or budget_s <= 0):
        raise ConfigError(f"budget_s must be a finite positive number of seconds, got {budget_s!r}")
    return float(budget_s)


def climb(config: DTConfig, run_wave: Callable[[list[Rung]], dict], *, workers: int,
          solved: Callable[[object], bool], key: Callable[[object], object], budget_s: float | None = None,
          max_attempts: int | None = None, name: str = "", progress: bool = False,
          clock: Callable[[], float] = time.perf_counter,
          t0: float | None = None) -> tuple[object | None, list[tuple[Rung, object]]]:
    """Climb config's ladder; returns (winner, [(rung, result), ...] in index order).

    run_wave(rungs) runs a wave and returns {attempt: result}. solved(result) says whether a rung
    succeeded; key(result) ranks the others (None: nothing to rank). max_attempts None: until
    solved or out of budget. winner is None only when no result had a key. t0: when the budget
    started, on `clock` (default: now; the caller's own work before the ladder counts too).
    """
    budget_s = check_budget(budget_s)
    if budget_s is None and max_attempts is None:
        raise ConfigError("the ladder needs a budget_s or a max_attempts, or it never ends")
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be a positive integer, got {workers!r}")
    t0 = clock() if t0 is None else t0
    longest = 0.0
    best, best_key, ran = None, None, []
    first = 0
    while max_attempts is None or first < max_attempts:
        if first > 0 and budget_s is not None and clock() - t0 + NEW_WAVE_SHARE * longest > budget_s:
            break
        n = workers if max_attempts is None else min(workers, max_attempts - first)
        wave = [Rung(a, *config.rung(a)) for a in range(first, first + n)]
        started = clock()
        results = run_wave(wave)
        longest = max(longest, clock() - started)
        for rung in wave:
            if rung.attempt not in results:      # cut at the budget (or stopped: an earlier rung decided)
                continue
            result = results[rung.attempt]
            ran.append((rung, result))
            if solved(result):
                return result, ran
            k = key(result)
            if k is not None and (best_key is None or k > best_key):
                best, best_key = result, k
        if first == 0 and progress and budget_s is not None and clock() - t0 > budget_s:
            from wtc.progress import log
            log.info(f"{name}: the first wave ({n} attempt{'s' * (n > 1)}, {clock() - t0:.1f}s) used the "
                     f"{budget_s:g}s budget: no more attempts")
        first += n
    return best, ran

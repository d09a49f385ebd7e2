"""The restart ladder and the time budget: one policy for wtc.train and wtc.discover.

Rungs 0, 1, 2, ... (DTConfig.rung: the capacity ladder, or the same config with new seeds) run
`workers` at a time, a new rung starting as soon as one finishes (wtc.dt.workers.run_ladder; no
core waits for the slowest rung of a wave). Before every rung but the first `workers`, the budget
is checked: a rung starts only if the time left covers half the longest rung so far (its attempt
is cut at the deadline, so a rung that would run long costs its tail, not the promise). The
first rungs always run (there is no result before them). Every attempt keeps the Deadline:
training stops at train_until, finishing and reading out stop at end, and a worker still running
past end + half the margin is killed (wtc.dt.workers), so the call returns within its budget plus
margin_s. The winner is the first solved rung in index order, else the one with the best key
(the first of equals): once a rung solved, no later rung starts, the later ones running are
stopped, and the earlier ones run to their end. So the winner and the list of rungs kept are
those of the sequential loop for any number of workers, whenever the budget does not cut the
ladder short (with a binding budget, more workers reach more rungs in the same time).
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
NEW_RUNG_SHARE = 0.5   # another rung starts while the time left covers this share of the longest rung


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


class Ladder:
    """The ladder as it is climbed: which rung starts next, which running rungs still matter, and
    the verdict (the sequential loop's). A runner (wtc.dt.workers.run_ladder, or a test's fake)
    starts rungs while it has a free slot and next_rung() gives one, hands each result back
    (done; failed for a rung that raised), stops running rungs that are no longer wanted, and
    ends when nothing runs and next_rung() is None; outcome() is then the answer.

    solved(result) says whether a rung succeeded; key(result) ranks the others (None: nothing to
    rank). max_attempts None: until solved or out of budget. t0: when the budget started, on
    `clock` (default: now; the caller's own work before the ladder counts too)."""

    def __init__(self, config: DTConfig, *, workers: int, solved: Callable[[object], bool],
                 key: Callable[[object], object], budget_s: float | None = None, max_attempts: int | None = None,
                 name: str = "", progress: bool = False, clock: Callable[[], float] = time.perf_counter,
                 t0: float | None = None):
        self.budget_s = check_budget(budget_s)
        if self.budget_s is None and max_attempts is None:
            raise ConfigError("the ladder needs a budget_s or a max_attempts, or it never ends")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"workers must be a positive integer, got {workers!r}")
        self.config, self.workers, self.solved, self.key = config, workers, solved, key
        self.max_attempts, self.name, self.progress, self.clock = max_attempts, name, progress, clock
        self.t0 = clock() if t0 is None else t0
        self.begun: dict[int, Rung] = {}        # every rung started, by attempt
        self.started_at: dict[int, float] = {}
        self.results: dict[int, object] = {}    # rungs that finished with a result
        self.failures: dict[int, BaseException] = {}
        self.longest = 0.0
        self.closed = False                     # the budget said no: no rung starts any more

    @property
    def end(self) -> int | None:
        """The first rung that solved or failed: the sequential loop stops there."""
        ends = list(self.failures) + [a for a, r in self.results.items() if self.solved(r)]
        return min(ends) if ends else None

    def wanted(self, attempt: int) -> bool:
        """Whether a rung still matters: no earlier rung solved or failed."""
        end = self.end
        return end is None or attempt < end

    def next_rung(self) -> Rung | None:
        """The rung to start now, or None: a rung before it solved or failed, max_attempts are
        begun, or the time left does not cover half the longest rung, finished or still running
        (the first `workers` rungs always start)."""
        a = len(self.begun)
        if self.closed or not self.wanted(a) or (self.max_attempts is not None and a >= self.max_attempts):
            return None
        now = self.clock()
        running = [now - t for r, t in self.started_at.items() if r not in self.results and r not in self.failures]
        longest = max([self.longest] + running)       # a rung still running has taken at least this long
        if a >= self.workers and self.budget_s is not None and now - self.t0 + NEW_RUNG_SHARE * longest > self.budget_s:
            self.closed = True
            if self.progress and now - self.t0 > self.budget_s:
                from wtc.progress import log
                log.info(f"{self.name}: {a} attempt{'s' * (a > 1)} used the {self.budget_s:g}s budget "
                         f"({now - self.t0:.1f}s): no more attempts")
            return None
        rung = Rung(a, *self.config.rung(a))
        self.begun[a], self.started_at[a] = rung, now
        return rung

    def done(self, attempt: int, result) -> None:
        """A rung's result, as it finished."""
        self.results[attempt] = result
        self.longest = max(self.longest, self.clock() - self.started_at[attempt])

    def failed(self, attempt: int, error: BaseException) -> None:
        """A rung that raised: an end of the ladder like a solved one (outcome raises it if no
        earlier rung solved)."""
        self.failures[attempt] = error
        self.longest = max(self.longest, self.clock() - self.started_at[attempt])

    def unfinished(self) -> list[tuple[Rung, bool]]:
        """Rungs begun that gave no result, each with whether it was wanted (then the budget cut
        it; else it was stopped because an earlier rung solved)."""
        return [(r, self.wanted(a)) for a, r in sorted(self.begun.items())
                if a not in self.results and a not in self.failures]

    def outcome(self) -> tuple[object | None, list[tuple[Rung, object]]]:
        """(winner, [(rung, result), ...] in index order, up to the first solved); winner is None
        only when no result had a key. The first failure before any solved rung is raised."""
        end = self.end
        if end is not None and end in self.failures:
            raise self.failures[end]
        ran = [(self.begun[a], r) for a, r in sorted(self.results.items()) if end is None or a <= end]
        if end is not None:
            return self.results[end], ran
        best, best_key = None, None
        for _, result in ran:
            k = self.key(result)
            if k is not None and (best_key is None or k > best_key):
                best, best_key = result, k
        return best, ran


def climb(config: DTConfig, run: Callable[[Ladder], None], **kw) -> tuple[object | None, list[tuple[Rung, object]],
                                                                         Ladder]:
    """Climb config's ladder: run(ladder) runs its rungs (Ladder's protocol); returns
    (winner, [(rung, result), ...], the ladder). kw: Ladder's arguments."""
    ladder = Ladder(config, **kw)
    run(ladder)
    winner, ran = ladder.outcome()
    return winner, ran, ladder

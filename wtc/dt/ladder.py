"""The restart ladder and the time budget: one policy for wtc.train and wtc.discover.

Rungs 0, 1, 2, ... (DTConfig.rung: the capacity ladder, or the same config with new seeds) run in
waves of `workers` at a time. Before every wave but the first, the budget is checked: a wave
starts only if the time left covers the longest wave so far. The first wave always runs (there
is no result before it); its attempts stop training at the budget's deadline (wtc.dt.attempt.
run_attempt) and are finished as they stand, so only finishing runs past it; a progress line says
when the wave overran. The winner is the first solved rung in index
order, else the one with the best key (the first of equals); rungs after the first solved one
are dropped even when they ran in the same wave. So the winner and the list of rungs kept are
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
          clock: Callable[[], float] = time.perf_counter) -> tuple[object | None, list[tuple[Rung, object]]]:
    """Climb config's ladder; returns (winner, [(rung, result), ...] in index order).

    run_wave(rungs) runs a wave and returns {attempt: result}. solved(result) says whether a rung
    succeeded; key(result) ranks the others (None: nothing to rank). max_attempts None: until
    solved or out of budget. winner is None only when no result had a key.
    """
    budget_s = check_budget(budget_s)
    if budget_s is None and max_attempts is None:
        raise ConfigError("the ladder needs a budget_s or a max_attempts, or it never ends")
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be a positive integer, got {workers!r}")
    t0 = clock()
    longest = 0.0
    best, best_key, ran = None, None, []
    first = 0
    while max_attempts is None or first < max_attempts:
        if ran and budget_s is not None and clock() - t0 + longest > budget_s:
            break
        n = workers if max_attempts is None else min(workers, max_attempts - first)
        wave = [Rung(a, *config.rung(a)) for a in range(first, first + n)]
        started = clock()
        results = run_wave(wave)
        longest = max(longest, clock() - started)
        for rung in wave:
            result = results[rung.attempt]
            ran.append((rung, result))
            if solved(result):
                return result, ran
            k = key(result)
            if k is not None and (best_key is None or k > best_key):
                best, best_key = result, k
        if first == 0 and progress and budget_s is not None and clock() - t0 > budget_s:
            print(f"{name}: the first wave ({n} attempt{'s' * (n > 1)}, {clock() - t0:.1f}s) ran over the "
                  f"{budget_s:g}s budget (training stops at the budget; finishing and reading the program do not): "
                  f"no more attempts", flush=True)
        first += n
    return best, ran

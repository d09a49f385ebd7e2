"""The built-in task suite. Each task's docstring restates its definition.

Conventions: sequences have length T = 10; values "before the start" are 0; integer tasks are
scored by rounded accuracy, real tasks by max relative error <= 1e-3.
"""
from __future__ import annotations

import functools

import numpy as np

from wtc.tasks.task import Task, shift

T = 10
G = 9.81


def ints(lo: int, hi: int, channels: int = 1):
    """Sampler of integers uniform in [lo, hi)."""
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        shape = (n, T) if channels == 1 else (n, T, channels)
        return rng.integers(lo, hi, size=shape).astype(np.float64)
    return sample


def uniform(lo: float, hi: float):
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(lo, hi, size=(n, T))
    return sample


def _flag_and_value(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.stack([rng.integers(0, 2, size=(n, T)), rng.integers(0, 100, size=(n, T))], axis=-1).astype(np.float64)


def _fall_heights(rng: np.random.Generator, n: int) -> np.ndarray:
    h0 = rng.uniform(50, 100, size=(n, 1))
    v0 = rng.uniform(-5, 5, size=(n, 1))
    t = 0.1 * np.arange(T)[None, :]
    return h0 + v0 * t - 0.5 * G * t**2


# ---------------------------------------------------------------- targets, one per task
def parity_last2(x):
    """x_t XOR x_{t-1} on bits (the paper's example: x_t + x_{t-1} - 2 x_t x_{t-1})."""
    return x + shift(x, 1) - 2 * x * shift(x, 1)


def sum_last2(x):
    """x_t + x_{t-1}, ints in [0, 100)."""
    return x + shift(x, 1)


def prev2(x):
    """x_{t-2}, ints in [0, 100)."""
    return shift(x, 2)


def max_last3(x):
    """max of x_{t-2}, x_{t-1}, x_t (only those that exist), ints in [0, 100)."""
    out = x.copy()
    out[:, 1:] = np.maximum(out[:, 1:], x[:, :-1])
    out[:, 2:] = np.maximum(out[:, 2:], x[:, :-2])
    return out


def min_last2(x):
    """min(x_t, x_{t-1}) with x_{-1} = 0, ints in [0, 100)."""
    return np.minimum(x, shift(x, 1))


def diff_prev(x):
    """x_t - x_{t-1}, ints in [-50, 50)."""
    return x - shift(x, 1)


def product_last2(x):
    """x_t * x_{t-1}, ints in [0, 10)."""
    return x * shift(x, 1)


def first_value(x):
    """x_0 at every position, ints in [0, 100)."""
    return np.repeat(x[:, :1], x.shape[1], axis=1)


def xor_pair(x):
    """a_t XOR b_t on two bit channels (a, b)."""
    return np.logical_xor(x[..., 0], x[..., 1]).astype(np.float64)


def and_prev(x):
    """a_t AND b_{t-1} on two bit channels (a, b)."""
    return x[..., 0] * shift(x[..., 1], 1)


def select_by_flag(x):
    """v_t if f_t == 1 else v_{t-1}; channels (f bit, v int in [0, 100))."""
    f, v = x[..., 0], x[..., 1]
    return np.where(f == 1, v, shift(v, 1))


def running_max(x):
    """max(x_0 .. x_t), ints in [0, 100)."""
    return np.maximum.accumulate(x, axis=1)


def running_sum(x):
    """x_0 + ... + x_t, ints in [0, 10)."""
    return np.cumsum(x, axis=1)


def count_ones(x):
    """Number of ones in x_0 .. x_t, bits."""
    return np.cumsum(x, axis=1)


def ema3(x):
    """EMA with alpha = 0.5 seeded at x_{t-2}: 0.5 x_t + 0.25 x_{t-1} + 0.25 x_{t-2}; U[0,1]; valid from t = 2."""
    return 0.5 * x + 0.25 * shift(x, 1) + 0.25 * shift(x, 2)


def linear_combo(x):
    """2 x_t - 3 x_{t-1} + 1, U[-1, 1]."""
    return 2 * x - 3 * shift(x, 1) + 1


def nonlinear_combo(x):
    """x_t * x_{t-1} + x_{t-2}, U[-1, 1]."""
    return x * shift(x, 1) + shift(x, 2)


def relu_diff(x):
    """max(0, x_t - x_{t-1}), U[-1, 1]."""
    return np.maximum(0.0, x - shift(x, 1))


def free_fall_height(x):
    """100 - 0.5 * 9.81 * x_t^2 for elapsed time x_t ~ U[0, 4] s."""
    return 100 - 0.5 * G * x**2


def free_fall_next(x):
    """Next height of a falling body sampled every 0.1 s: 2 x_t - x_{t-1} - 9.81 * 0.01; valid from t = 1.
    Inputs: h_t = h0 + v0 (0.1 t) - g (0.1 t)^2 / 2 with h0 ~ U[50, 100], v0 ~ U[-5, 5], g = 9.81."""
    return 2 * x - shift(x, 1) - G * 0.01


def running_mean(x):
    """mean of x_0 .. x_t, U[0, 1]."""
    return np.cumsum(x, axis=1) / np.arange(1, x.shape[1] + 1)[None, :]


# ---------------------------------------------------------------- the registry table
# name -> (sampler, target, n_inputs, output, valid_from, tier)
SUITE = {
    "parity_last2": (ints(0, 2), parity_last2, 1, "integer", 0, "must"),
    "sum_last2": (ints(0, 100), sum_last2, 1, "integer", 0, "must"),
    "prev2": (ints(0, 100), prev2, 1, "integer", 0, "must"),
    "max_last3": (ints(0, 100), max_last3, 1, "integer", 0, "must"),
    "min_last2": (ints(0, 100), min_last2, 1, "integer", 0, "must"),
    "diff_prev": (ints(-50, 50), diff_prev, 1, "integer", 0, "must"),
    "product_last2": (ints(0, 10), product_last2, 1, "integer", 0, "must"),
    "first_value": (ints(0, 100), first_value, 1, "integer", 0, "must"),
    "xor_pair": (ints(0, 2, channels=2), xor_pair, 2, "integer", 0, "must"),
    "and_prev": (ints(0, 2, channels=2), and_prev, 2, "integer", 0, "must"),
    "select_by_flag": (_flag_and_value, select_by_flag, 2, "integer", 0, "must"),
    "running_max": (ints(0, 100), running_max, 1, "integer", 0, "stretch"),
    "running_sum": (ints(0, 10), running_sum, 1, "integer", 0, "stretch"),
    "count_ones": (ints(0, 2), count_ones, 1, "integer", 0, "stretch"),
    "ema3": (uniform(0, 1), ema3, 1, "real", 2, "must"),
    "linear_combo": (uniform(-1, 1), linear_combo, 1, "real", 0, "must"),
    "nonlinear_combo": (uniform(-1, 1), nonlinear_combo, 1, "real", 0, "must"),
    "relu_diff": (uniform(-1, 1), relu_diff, 1, "real", 0, "must"),
    "free_fall_height": (uniform(0, 4), free_fall_height, 1, "real", 0, "must"),
    "free_fall_next": (_fall_heights, free_fall_next, 1, "real", 1, "must"),
    "running_mean": (uniform(0, 1), running_mean, 1, "real", 0, "stretch"),
}


# the wider suite (wtc.tasks.wider): tier "wider", each with its own sequence length
from wtc.tasks import wider  # noqa: E402

SUITE.update({name: (s, t, k, out, v, "wider", T_) for name, (s, t, k, out, v, T_) in wider.TABLE.items()})
TIERS = ("must", "stretch", "wider")


# samplers whose positions are not independent draws: their tasks are defined at their own length only
FIXED_LENGTH = {_fall_heights, *wider.FIXED_LENGTH_SAMPLERS}


@functools.lru_cache(maxsize=None)
def make(name: str) -> Task:
    """The built-in task (one object per name, so workers can be sent the name instead)."""
    sample, target, n_inputs, output, valid_from, _, *seq_len = SUITE[name]
    return Task(name, sample, target, seq_len=seq_len[0] if seq_len else T, n_inputs=n_inputs, output=output,
                valid_from=valid_from, description=" ".join(target.__doc__.split()),
                any_length=sample not in FIXED_LENGTH)


def tier(name: str) -> str:
    return SUITE[name][5]

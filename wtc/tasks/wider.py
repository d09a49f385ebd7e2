"""The wider suite (tier "wider"): task classes beyond the paper's list — windows up to 7, counters
and modular counters, detectors, comparisons, prefix extrema, majority votes, double prefix sums
and real-valued physics. Each target's docstring is its definition; values before the start are 0.
Like the built-ins these are examples for measuring the engine, never special-cased by it.
"""
from __future__ import annotations

import numpy as np

from wtc.tasks.task import shift

G = 9.81
DT = 0.1


def _ints(lo: int, hi: int, T: int, channels: int = 1):
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        shape = (n, T) if channels == 1 else (n, T, channels)
        return rng.integers(lo, hi, size=shape).astype(np.float64)
    return sample


def _uniform(lo: float, hi: float, T: int, channels: int = 1):
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(lo, hi, size=(n, T) if channels == 1 else (n, T, channels))
    return sample


def _window(x, w, reduce):
    return reduce(np.stack([shift(x, d) for d in range(w)]), axis=0)


def _window_exists(x, w, reduce):
    """reduce over the last w values that exist (no zeros from before the start)."""
    out = x.copy()
    for d in range(1, w):
        out[:, d:] = reduce(out[:, d:], x[:, :-d])
    return out


# ---------------------------------------------------------------- windows
def sum_last3(x):
    """x_t + x_{t-1} + x_{t-2}, ints in [0, 10)."""
    return _window(x, 3, np.sum)


def sum_last5(x):
    """Sum of the last five values x_{t-4} .. x_t, ints in [0, 10)."""
    return _window(x, 5, np.sum)


def sum_last7(x):
    """Sum of the last seven values x_{t-6} .. x_t, ints in [0, 10), T = 12."""
    return _window(x, 7, np.sum)


def max_last5(x):
    """Maximum of the last five values that exist, ints in [0, 100)."""
    return _window_exists(x, 5, np.maximum)


def max_last7(x):
    """Maximum of the last seven values that exist, ints in [0, 100), T = 12."""
    return _window_exists(x, 7, np.maximum)


def min_last3(x):
    """Minimum of the last three values that exist, ints in [0, 100)."""
    return _window_exists(x, 3, np.minimum)


def mean_last4(x):
    """(x_{t-3} + x_{t-2} + x_{t-1} + x_t) / 4 on U[0, 1]; valid_from 3."""
    return _window(x, 4, np.sum) / 4


def prev4(x):
    """x_{t-4}, ints in [0, 100)."""
    return shift(x, 4)


def prev6(x):
    """x_{t-6}, ints in [0, 100), T = 12."""
    return shift(x, 6)


def ones_last4(x):
    """Number of ones among the last four bits."""
    return _window(x, 4, np.sum)


# ---------------------------------------------------------------- counters
def count_parity(x):
    """Parity of the number of ones in x_0 .. x_t (bits): (x_0 + ... + x_t) % 2."""
    return np.cumsum(x, axis=1) % 2


def count_mod3(x):
    """Number of ones in x_0 .. x_t modulo 3 (bits)."""
    return np.cumsum(x, axis=1) % 3


def cumsum_mod5(x):
    """(x_0 + ... + x_t) % 5, ints in [0, 5)."""
    return np.cumsum(x, axis=1) % 5


def double_prefix_sum(x):
    """Position from acceleration: the prefix sum of the prefix sum of x, ints in [0, 3)."""
    return np.cumsum(np.cumsum(x, axis=1), axis=1)


# ---------------------------------------------------------------- detectors and integer operators
def is_even(x):
    """1 if x_t is even else 0, ints in [0, 100)."""
    return 1 - x % 2


def multiple_of3(x):
    """1 if x_t is a multiple of 3 else 0, ints in [0, 100)."""
    return (x % 3 == 0).astype(np.float64)


def is_prime_digit(x):
    """1 if x_t is in {2, 3, 5, 7} else 0, ints in [0, 10)."""
    return np.isin(x, (2, 3, 5, 7)).astype(np.float64)


def is_square(x):
    """1 if x_t is a perfect square (0, 1, 4, ..., 49) else 0, ints in [0, 50)."""
    return (np.round(np.sqrt(x)) ** 2 == x).astype(np.float64)


def mod3(x):
    """x_t % 3, ints in [0, 30)."""
    return x % 3


def div3(x):
    """x_t // 3 (floor division), ints in [0, 30)."""
    return x // 3


def abs_diff(x):
    """|x_t - x_{t-1}|, ints in [0, 100)."""
    return np.abs(x - shift(x, 1))


# ---------------------------------------------------------------- comparisons and votes
def rose(x):
    """1 if x_t > x_{t-1} else 0, ints in [0, 100) (x_{-1} = 0)."""
    return (x > shift(x, 1)).astype(np.float64)


def same_as_prev(x):
    """1 if x_t == x_{t-1} else 0, ints in [0, 5) (x_{-1} = 0)."""
    return (x == shift(x, 1)).astype(np.float64)


def at_least_50(x):
    """1 if x_t >= 50 else 0, ints in [0, 100)."""
    return (x >= 50).astype(np.float64)


def a_at_least_b(x):
    """1 if a_t >= b_t else 0, two channels of ints in [0, 10)."""
    return (x[..., 0] >= x[..., 1]).astype(np.float64)


def majority3(x):
    """1 if at least two of x_{t-2}, x_{t-1}, x_t are ones (bits; zeros before the start)."""
    return (_window(x, 3, np.sum) >= 2).astype(np.float64)


def majority5(x):
    """1 if at least three of the last five bits are ones (zeros before the start)."""
    return (_window(x, 5, np.sum) >= 3).astype(np.float64)


# ---------------------------------------------------------------- prefix extrema
def running_min(x):
    """min(x_0 .. x_t), ints in [0, 100)."""
    return np.minimum.accumulate(x, axis=1)


def any_one(x):
    """1 once any of x_0 .. x_t is one, else 0 (bits)."""
    return np.maximum.accumulate(x, axis=1)


# ---------------------------------------------------------------- real-valued physics
def _spring_positions(rng: np.random.Generator, n: int) -> np.ndarray:
    amp, phase = rng.uniform(0.5, 2.0, (n, 1)), rng.uniform(0, 2 * np.pi, (n, 1))
    return amp * np.cos(2.0 * DT * np.arange(10)[None, :] + phase)


def spring_next(x):
    """Next position of a harmonic oscillator (omega = 2 rad/s) sampled every 0.1 s:
    (2 - omega^2 dt^2) x_t - x_{t-1} = 1.96 x_t - x_{t-1}; valid_from 1."""
    return (2 - 4.0 * DT**2) * x - shift(x, 1)


def velocity(x):
    """Velocity from positions sampled every 0.1 s: (x_t - x_{t-1}) / 0.1 on U[0, 1]; valid_from 1."""
    return (x - shift(x, 1)) / DT


def kinetic_energy(x):
    """0.5 m v^2 from channels (m U[0.5, 2], v U[-2, 2])."""
    return 0.5 * x[..., 0] * x[..., 1] ** 2


def power(x):
    """Electrical power V^2 / R from channels (V U[0, 5], R U[1, 5])."""
    return x[..., 0] ** 2 / x[..., 1]


def pendulum_period(x):
    """Period of a pendulum 2 pi sqrt(L / g) from its length L on U[0.1, 2] m."""
    return 2 * np.pi * np.sqrt(x / G)


def _mass_velocity(rng, n):
    return np.stack([rng.uniform(0.5, 2, (n, 10)), rng.uniform(-2, 2, (n, 10))], -1)


def _volts_ohms(rng, n):
    return np.stack([rng.uniform(0, 5, (n, 10)), rng.uniform(1, 5, (n, 10))], -1)


# samplers whose positions are not independent draws (a trajectory): tasks at their own length only
FIXED_LENGTH_SAMPLERS = (_spring_positions,)

# name -> (sampler, target, n_inputs, output, valid_from, seq_len)
TABLE = {
    "sum_last3": (_ints(0, 10, 10), sum_last3, 1, "integer", 0, 10),
    "sum_last5": (_ints(0, 10, 10), sum_last5, 1, "integer", 0, 10),
    "sum_last7": (_ints(0, 10, 12), sum_last7, 1, "integer", 0, 12),
    "max_last5": (_ints(0, 100, 10), max_last5, 1, "integer", 0, 10),
    "max_last7": (_ints(0, 100, 12), max_last7, 1, "integer", 0, 12),
    "min_last3": (_ints(0, 100, 10), min_last3, 1, "integer", 0, 10),
    "mean_last4": (_uniform(0, 1, 10), mean_last4, 1, "real", 3, 10),
    "prev4": (_ints(0, 100, 10), prev4, 1, "integer", 0, 10),
    "prev6": (_ints(0, 100, 12), prev6, 1, "integer", 0, 12),
    "ones_last4": (_ints(0, 2, 10), ones_last4, 1, "integer", 0, 10),
    "count_parity": (_ints(0, 2, 10), count_parity, 1, "integer", 0, 10),
    "count_mod3": (_ints(0, 2, 10), count_mod3, 1, "integer", 0, 10),
    "cumsum_mod5": (_ints(0, 5, 10), cumsum_mod5, 1, "integer", 0, 10),
    "double_prefix_sum": (_ints(0, 3, 10), double_prefix_sum, 1, "integer", 0, 10),
    "is_even": (_ints(0, 100, 10), is_even, 1, "integer", 0, 10),
    "multiple_of3": (_ints(0, 100, 10), multiple_of3, 1, "integer", 0, 10),
    "is_prime_digit": (_ints(0, 10, 10), is_prime_digit, 1, "integer", 0, 10),
    "is_square": (_ints(0, 50, 10), is_square, 1, "integer", 0, 10),
    "mod3": (_ints(0, 30, 10), mod3, 1, "integer", 0, 10),
    "div3": (_ints(0, 30, 10), div3, 1, "integer", 0, 10),
    "abs_diff": (_ints(0, 100, 10), abs_diff, 1, "integer", 0, 10),
    "rose": (_ints(0, 100, 10), rose, 1, "integer", 0, 10),
    "same_as_prev": (_ints(0, 5, 10), same_as_prev, 1, "integer", 0, 10),
    "at_least_50": (_ints(0, 100, 10), at_least_50, 1, "integer", 0, 10),
    "a_at_least_b": (_ints(0, 10, 10, channels=2), a_at_least_b, 2, "integer", 0, 10),
    "majority3": (_ints(0, 2, 10), majority3, 1, "integer", 0, 10),
    "majority5": (_ints(0, 2, 10), majority5, 1, "integer", 0, 10),
    "running_min": (_ints(0, 100, 10), running_min, 1, "integer", 0, 10),
    "any_one": (_ints(0, 2, 10), any_one, 1, "integer", 0, 10),
    "spring_next": (_spring_positions, spring_next, 1, "real", 1, 10),
    "velocity": (_uniform(0, 1, 10), velocity, 1, "real", 1, 10),
    "kinetic_energy": (_mass_velocity, kinetic_energy, 2, "real", 0, 10),
    "power": (_volts_ohms, power, 2, "real", 0, 10),
    "pendulum_period": (_uniform(0.1, 2, 10), pendulum_period, 1, "real", 0, 10),
}

"""The MIPS benchmark: the 62 RNN tasks of Michaud et al. 2024 ("Opening the AI black box: program
synthesis via mechanistic interpretability", arXiv 2402.05110), restated as wtc tasks.

Each entry of `SUITE` (a `MipsTask`) records the task under the paper's name, the directory of its
generator in the public repository ejmichaud/neural-verification (tasks/<source>/create_dataset.py,
where the definitions were read), the definition in words, the input ranges and channel count, the
sequence length, and the published outcomes beside it. `entry.task()` builds the `wtc.Task`.

The definitions are facts restated in wtc's own code: inputs are drawn uniformly from the ranges
the generators draw from, at their lengths, with "before the start" meaning 0 as they do. Targets
are numpy functions of whole batches, one per task class (windows, prefix scans, carries, ...),
parameterised; nothing in wtc's engine looks at which task it is given.

Published outcomes: the paper reports the totals (MIPS solves 32 of the 62, GPT-4 30, 13 of
MIPS's not solved by GPT-4: `PUBLISHED`). Per task (`OUTCOMES`): the authors' repository records
GPT-4's outcome of every task in gpt4/task_results.csv ("Task Name, Result", 30 ones). At commit
3ddc2d9 (2024-02-02, "adding gpt4") that file has a second, unlabelled column of 32 ones, which is
MIPS's outcome by every count the paper and the authors' announcement give: 32 in all, 13 solved
by MIPS and not GPT-4, 11 by GPT-4 and not MIPS. The MIPS column is therefore recorded as inferred
(`OUTCOMES_SOURCE` says so, and the suite's table repeats it); a test holds both columns to the
published counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from wtc.errors import TaskError
from wtc.tasks.task import Task, shift

PAPER = "Michaud et al. 2024, arXiv 2402.05110"
REPOSITORY = "github.com/ejmichaud/neural-verification"
PUBLISHED = {"tasks": 62, "mips_solved": 32, "gpt4_solved": 30, "mips_not_gpt4": 13}
OUTCOMES_SOURCE = ("GPT-4: gpt4/task_results.csv of ejmichaud/neural-verification; MIPS: its unlabelled second "
                   "column at commit 3ddc2d9 (2024-02-02), inferred from the published counts it matches "
                   "(32 solved, 13 not solved by GPT-4, 11 solved only by GPT-4)")
# paper name -> (GPT-4 solved, MIPS solved), 1 / 0, as OUTCOMES_SOURCE records them
OUTCOMES = {name: (int(g), int(m)) for name, g, m in (row.split(",") for row in """
Binary_Addition,0,1 Base_3_Addition,0,0 Base_4_Addition,0,0 Base_5_Addition,0,0 Base_6_Addition,1,0
Base_7_Addition,0,0 Bitwise_Xor,1,1 Bitwise_Or,1,1 Bitwise_And,1,1 Bitwise_Not,1,1 Parity_Last2,1,1
Parity_Last3,0,1 Parity_Last4,0,0 Parity_All,0,1 Parity_Zeros,0,1 Evens_Counter,0,0 Sum_All,1,1
Sum_Last2,0,1 Sum_Last3,0,1 Sum_Last4,1,1 Sum_Last5,1,1 Sum_Last6,1,1 Sum_Last7,1,1 Current_Number,1,1
Prev1,1,1 Prev2,1,1 Prev3,1,1 Prev4,1,1 Prev5,1,1 Previous_Equals_Current,0,1 Diff_Last2,0,1 Abs_Diff,0,1
Abs_Current,1,1 Diff_Abs_Values,1,0 Min_Seen,1,0 Max_Seen,1,0 Majority_0_1,1,0 Majority_0_2,0,0
Majority_0_3,0,0 Evens_Detector,1,0 Perfect_Square_Detector,0,0 Bit_Palindrome,1,0 Balanced_Parenthesis,0,0
Parity_Bits_Mod2,1,0 Alternating_Last3,0,0 Alternating_Last4,1,0 Bit_Shift_Right,1,1 Bit_Dot_Prod_Mod2,0,1
Div_3,1,0 Div_5,0,0 Div_7,0,0 Add_Mod_3,1,1 Add_Mod_4,0,0 Add_Mod_5,0,0 Add_Mod_6,0,0 Add_Mod_7,0,0
Add_Mod_8,0,0 Dithering,1,0 Newton_Freebody,0,1 Newton_Gravity,0,1 Newton_Spring,0,1 Newton_Magnetic,0,0
""".split())}


# ---------------------------------------------------------------- samplers
def uniform_ints(lo: int, hi: int, seq_len: int, channels: int = 1) -> Callable:
    """Integers uniform in [lo, hi), independently per position and channel."""
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        shape = (n, seq_len) if channels == 1 else (n, seq_len, channels)
        return rng.integers(lo, hi, size=shape, dtype=np.int64)
    return sample


def palindrome_prefix_bits(seq_len: int) -> Callable:
    """Bits whose first L positions (L uniform in 2..seq_len) are a random palindrome, the rest
    uniform: so that palindromic prefixes are common enough to learn (the generator's scheme)."""
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.integers(0, 2, size=(n, seq_len), dtype=np.int64)
        lengths = rng.integers(2, seq_len + 1, size=n)
        for length in np.unique(lengths):
            rows = lengths == length
            head = x[rows, :length]
            head[:, length - length // 2:] = head[:, : length // 2][:, ::-1]   # mirror the first half
            x[rows, :length] = head
        return x
    return sample


# ---------------------------------------------------------------- targets, one per class
def window_sum(x, w: int):
    """x_{t-w+1} + ... + x_t, zeros before the start."""
    return sum(shift(x, d) for d in range(w))


def window_parity(x, w: int):
    """Parity of the last w values (zeros before the start)."""
    return window_sum(x, w) % 2


def prefix_sum(x):
    """x_0 + ... + x_t."""
    return np.cumsum(x, axis=1)


def prefix_mod(x, k: int):
    """(x_0 + ... + x_t) mod k."""
    return np.cumsum(x, axis=1) % k


def lagged(x, k: int):
    """x_{t-k}, 0 for t < k."""
    return shift(x, k)


def digit_addition(x, base: int):
    """Two numbers written digit by digit, least significant first (channels a, b): the digits of
    their sum, carry starting at 0; digits beyond the length are dropped."""
    a, b = x[..., 0], x[..., 1]
    out = np.zeros_like(a)
    carry = np.zeros(len(a), dtype=a.dtype)
    for t in range(a.shape[1]):
        s = a[:, t] + b[:, t] + carry
        out[:, t], carry = s % base, s // base
    return out


def long_division(x, d: int):
    """Bits read first to last as a binary number (most significant first), divided by d: the
    quotient bit at each position (remainder r: v = 2 r + x_t, quotient bit v // d, r = v mod d)."""
    out = np.zeros_like(x)
    r = np.zeros(len(x), dtype=x.dtype)
    for t in range(x.shape[1]):
        v = 2 * r + x[:, t]
        out[:, t], r = v // d, v % d
    return out


def majority(x, k: int):
    """The value in 0..k seen most often so far, ties to the smaller value."""
    counts = np.stack([np.cumsum(x == v, axis=1) for v in range(k + 1)], axis=-1)
    return np.argmax(counts, axis=-1)          # argmax takes the first (smallest) of tied values


def is_palindrome_prefix(x):
    """1 where x_0 .. x_t reads the same backwards."""
    out = np.zeros_like(x)
    for t in range(x.shape[1]):
        out[:, t] = np.all(x[:, : t + 1] == x[:, t::-1], axis=1)
    return out


def balanced_prefix(x):
    """0 opens, 1 closes: 1 where the prefix is balanced (depth back at 0, never below 0 before)."""
    depth = np.cumsum(1 - 2 * x, axis=1)
    never_negative = np.minimum.accumulate(depth, axis=1) >= 0
    return ((depth == 0) & never_negative).astype(x.dtype)


def position_parity(x):
    """t mod 2, whatever the input."""
    return np.broadcast_to(np.arange(x.shape[1]) % 2, x.shape).copy()


def alternating(x, w: int):
    """1 where the last w values (zeros before the start) alternate: 0101.. or 1010.."""
    diffs = [shift(x, d) != shift(x, d + 1) for d in range(w - 1)]
    return np.logical_and.reduce(diffs).astype(x.dtype)


def dot_product_parity(x):
    """Parity of a_0 b_0 + ... + a_t b_t on two bit channels (a, b)."""
    return np.cumsum(x[..., 0] * x[..., 1], axis=1) % 2


def dithering(x, q: int):
    """Error-diffusion quantisation: floor(S_t / q) - floor(S_{t-1} / q) for the prefix sum S."""
    levels = np.cumsum(x, axis=1) // q
    return levels - shift(levels, 1)


def free_body(x, pull: int = 0):
    """Positions of a unit mass from rest under forces x_t + pull: a double prefix sum."""
    return np.cumsum(np.cumsum(x + pull, axis=1), axis=1)


def spring(x):
    """Unit mass on a unit spring, from rest: v_t = v_{t-1} + x_t - p_{t-1}, p_t = p_{t-1} + v_t."""
    out = np.zeros_like(x)
    p = np.zeros(len(x), dtype=x.dtype)
    v = np.zeros(len(x), dtype=x.dtype)
    for t in range(x.shape[1]):
        v = v + x[:, t] - p
        p = p + v
        out[:, t] = p
    return out


def magnetic(x):
    """Unit mass in the plane under forces (x_t, y_t) and a unit field across it: acceleration
    F + (-v_y, v_x), v += a, p += v, from rest; outputs (p_x, p_y)."""
    out = np.zeros_like(x)
    p = np.zeros((len(x), 2), dtype=x.dtype)
    v = np.zeros((len(x), 2), dtype=x.dtype)
    for t in range(x.shape[1]):
        v = v + x[:, t] + np.stack([-v[:, 1], v[:, 0]], axis=1)
        p = p + v
        out[:, t] = p
    return out


# ---------------------------------------------------------------- the suite
@dataclass(frozen=True)
class MipsTask:
    """One benchmark task: `name` (the paper's), `source` (its generator's directory in the MIPS
    repository), `definition` (in words), `inputs` (per channel the half-open range [lo, hi) drawn
    from), `seq_len`, `n_outputs`, the published outcomes (`mips_solved`, `gpt4_solved`: True /
    False, None where unknown), whether the definition holds for every length (`any_length`:
    positions drawn independently, the target a loop over T) and the callables."""

    name: str
    source: str
    definition: str
    inputs: tuple[tuple[int, int], ...]
    seq_len: int
    sample: Callable
    target: Callable
    n_outputs: int = 1
    any_length: bool = True
    mips_solved: bool | None = None
    gpt4_solved: bool | None = None

    @property
    def n_inputs(self) -> int:
        """Input channels."""
        return len(self.inputs)

    @property
    def symbols(self) -> int:
        """Distinct input values per position (the product over channels)."""
        return int(np.prod([hi - lo for lo, hi in self.inputs]))

    def task(self) -> Task:
        """The wtc.Task (integer outputs; the definition as its description)."""
        return Task(self.name, self.sample, self.target, seq_len=self.seq_len, n_inputs=self.n_inputs,
                    n_outputs=self.n_outputs, output="integer", description=self.definition,
                    any_length=self.any_length)

    def row(self) -> dict:
        """The entry as plain data (for tables and result files)."""
        return {"task": self.name, "source": self.source, "definition": self.definition,
                "inputs": [list(r) for r in self.inputs], "seq_len": self.seq_len, "n_outputs": self.n_outputs,
                "mips_solved": self.mips_solved, "gpt4_solved": self.gpt4_solved}


def _entry(name, source, definition, inputs, target, seq_len=10, *, sample=None, **kw) -> MipsTask:
    inputs = tuple(inputs)
    lo, hi = inputs[0]
    if sample is None:
        if any(r != inputs[0] for r in inputs):
            raise TaskError(f"{name}: channels with different ranges need their own sampler")
        sample = uniform_ints(lo, hi, seq_len, len(inputs))
    gpt4, mips = OUTCOMES[name]
    return MipsTask(name, source, definition, inputs, seq_len, sample, target, mips_solved=bool(mips),
                    gpt4_solved=bool(gpt4), **kw)


def _bind(f, **params):
    """f with its parameters fixed, keeping its docstring (the Task's description is the entry's)."""
    def target(x):
        return f(x, **params)
    target.__doc__ = f.__doc__
    return target


BIT, DIGIT, CENT, SIGNED, FORCE = (0, 2), (0, 10), (0, 100), (-100, 100), (-10, 11)


def _build() -> list[MipsTask]:
    s: list[MipsTask] = []
    add = s.append
    add(_entry("Binary_Addition", "bit_addition", "two bit strings, least significant bit first: the bits of "
               "their sum (carry from 0, the last carry dropped)", [BIT, BIT], _bind(digit_addition, base=2)))
    for b in range(3, 8):
        add(_entry(f"Base_{b}_Addition", f"rnn_base_{b}_addition", f"two base-{b} digit strings, least significant "
                   f"first: the digits of their sum", [(0, b), (0, b)], _bind(digit_addition, base=b)))
    add(_entry("Bitwise_Xor", "rnn_bitwise_xor", "a_t XOR b_t on two bit channels", [BIT, BIT],
               lambda x: x[..., 0] ^ x[..., 1]))
    add(_entry("Bitwise_Or", "rnn_bitwise_or", "a_t OR b_t on two bit channels", [BIT, BIT],
               lambda x: x[..., 0] | x[..., 1]))
    add(_entry("Bitwise_And", "rnn_bitwise_and", "a_t AND b_t on two bit channels", [BIT, BIT],
               lambda x: x[..., 0] & x[..., 1]))
    add(_entry("Bitwise_Not", "rnn_bitwise_not", "1 - x_t on bits", [BIT], lambda x: 1 - x))
    for w in (2, 3, 4):
        add(_entry(f"Parity_Last{w}", f"rnn_parity_last{w}_numerical", f"parity of the last {w} bits (zeros "
                   "before the start)", [BIT], _bind(window_parity, w=w)))
    add(_entry("Parity_All", "rnn_parity_numerical", "parity of all bits so far", [BIT], _bind(prefix_mod, k=2)))
    add(_entry("Parity_Zeros", "rnn_parity_of_zeros_numerical", "parity of the number of zeros so far", [BIT],
               lambda x: np.cumsum(1 - x, axis=1) % 2))
    add(_entry("Evens_Counter", "rnn_evens_counter_numerical", "number of even values so far; digits 0..9",
               [DIGIT], lambda x: np.cumsum(x % 2 == 0, axis=1)))
    add(_entry("Sum_All", "rnn_sum_numerical", "sum of all values so far; ints in [0, 100)", [CENT], prefix_sum))
    for w in range(2, 8):
        add(_entry(f"Sum_Last{w}", f"rnn_sum_last{w}_numerical", f"sum of the last {w} values (zeros before the "
                   f"start); ints in [0, 100)", [CENT], _bind(window_sum, w=w), seq_len=10 if w <= 4 else 20))
    add(_entry("Current_Number", "rnn_identity_numerical", "x_t; ints in [0, 100)", [CENT], lambda x: x.copy()))
    for k in range(1, 6):
        add(_entry(f"Prev{k}", f"rnn_prev{k}_numerical", f"x_(t-{k}), 0 for the first {k}; ints in [0, 100)",
                   [CENT], _bind(lagged, k=k), seq_len=10 if k <= 4 else 20))
    add(_entry("Previous_Equals_Current", "rnn_unique2_numerical", "1 where x_t == x_(t-1) (x_(-1) = 0); "
               "ints in [0, 8)", [(0, 8)], lambda x: (x == shift(x, 1)).astype(x.dtype)))
    add(_entry("Diff_Last2", "rnn_diff_last2_numerical", "x_t - x_(t-1) (x_(-1) = 0); ints in [-100, 100)",
               [SIGNED], lambda x: x - shift(x, 1)))
    add(_entry("Abs_Diff", "rnn_abs_value_of_diff_numerical", "|x_t - x_(t-1)| (x_(-1) = 0); ints in [-100, 100)",
               [SIGNED], lambda x: np.abs(x - shift(x, 1))))
    add(_entry("Abs_Current", "rnn_abs_value_numerical", "|x_t|; ints in [-100, 100)", [SIGNED], np.abs))
    add(_entry("Diff_Abs_Values", "rnn_diff_of_abs_value_numerical", "|x_t| - |x_(t-1)| (x_(-1) = 0); ints in "
               "[-100, 100)", [SIGNED], lambda x: np.abs(x) - np.abs(shift(x, 1))))
    add(_entry("Min_Seen", "rnn_min_numerical", "minimum so far; digits 0..9", [DIGIT],
               lambda x: np.minimum.accumulate(x, axis=1)))
    add(_entry("Max_Seen", "rnn_max_numerical", "maximum so far; ints in [0, 100)", [CENT],
               lambda x: np.maximum.accumulate(x, axis=1)))
    for k in (1, 2, 3):
        add(_entry(f"Majority_0_{k}", f"rnn_majority0_{k}_numerical", f"the most frequent value so far, ties to the "
                   f"smaller; values 0..{k}", [(0, k + 1)], _bind(majority, k=k)))
    add(_entry("Evens_Detector", "rnn_evens_detector_numerical", "1 where x_t is even; digits 0..9", [DIGIT],
               lambda x: (x % 2 == 0).astype(x.dtype)))
    add(_entry("Perfect_Square_Detector", "rnn_perfect_square_detector_numerical", "1 where x_t is a perfect "
               "square; ints in [0, 20)", [(0, 20)], lambda x: np.isin(x, (0, 1, 4, 9, 16)).astype(x.dtype)))
    add(_entry("Bit_Palindrome", "rnn_bit_palindromes_numerical", "1 where the bits so far read the same "
               "backwards; sequences start with a palindrome of random length 2..10", [BIT], is_palindrome_prefix,
               sample=palindrome_prefix_bits(10), any_length=False))
    add(_entry("Balanced_Parenthesis", "rnn_balanced_parenthesis_numerical", "0 opens, 1 closes: 1 where the "
               "prefix is balanced (never closed below depth 0)", [BIT], balanced_prefix))
    add(_entry("Parity_Bits_Mod2", "rnn_parity_of_index_numerical", "t mod 2 (the bits are ignored)", [BIT],
               position_parity))
    for w in (3, 4):
        add(_entry(f"Alternating_Last{w}", f"rnn_alternating_last{w}_numerical", f"1 where the last {w} bits "
                   "(zeros before the start) alternate", [BIT], _bind(alternating, w=w)))
    add(_entry("Bit_Shift_Right", "rnn_bit_shift_right_numerical", "x_(t-1), 0 at t = 0; bits", [BIT],
               _bind(lagged, k=1)))
    add(_entry("Bit_Dot_Prod_Mod2", "rnn_bit_dot_prod_mod2_numerical", "parity of the dot product of two bit "
               "strings so far", [BIT, BIT], dot_product_parity))
    for d in (3, 5, 7):
        add(_entry(f"Div_{d}", f"rnn_div_{d}_numerical", f"long division by {d} of the bits so far (most significant "
                   "first): the quotient bit", [BIT], _bind(long_division, d=d)))
    for k in range(3, 9):
        add(_entry(f"Add_Mod_{k}", f"rnn_add_mod_{k}_numerical", f"sum so far mod {k}; ints in [0, {k})", [(0, k)],
                   _bind(prefix_mod, k=k)))
    add(_entry("Dithering", "rnn_dithering_numerical", "floor(S_t / 15) - floor(S_(t-1) / 15) for the prefix "
               "sum S; ints in [0, 16)", [(0, 16)], _bind(dithering, q=15)))
    add(_entry("Newton_Freebody", "rnn_newton_freebody_numerical", "position of a unit mass from rest under "
               "forces x_t (a double prefix sum); ints in [-10, 10]", [FORCE], free_body))
    add(_entry("Newton_Gravity", "rnn_newton_gravity_numerical", "position under forces x_t and gravity -1 "
               "(double prefix sum of x_t - 1); ints in [-10, 10]", [FORCE], _bind(free_body, pull=-1)))
    add(_entry("Newton_Spring", "rnn_newton_spring_numerical", "position of a unit mass on a unit spring under "
               "forces x_t, from rest; ints in [-10, 10]", [FORCE], spring))
    add(_entry("Newton_Magnetic", "rnn_newton_magnetic_numerical", "planar position under forces (x_t, y_t) and a "
               "unit magnetic field, from rest; ints in [-10, 10]", [FORCE, FORCE], magnetic, n_outputs=2))
    return s


SUITE: list[MipsTask] = _build()
_BY_NAME = {e.name: e for e in SUITE}


def names() -> list[str]:
    """The 62 task names, in the paper's grouping (additions, bitwise, parities, sums, ...)."""
    return [e.name for e in SUITE]


def entry(name: str) -> MipsTask:
    """The suite entry called `name` (the paper's task name)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        import difflib
        close = difflib.get_close_matches(str(name), _BY_NAME, n=3)
        raise TaskError(f"no MIPS task {name!r}" + (f"; did you mean {', '.join(close)}?" if close else "")) from None


def get(name: str) -> Task:
    """The wtc.Task of the MIPS task `name`."""
    return entry(name).task()

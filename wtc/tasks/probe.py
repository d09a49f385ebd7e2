"""What a task's output depends on, measured from its target function as a black box: replace the
input at one position by the value another sampled sequence has there and see which outputs
change. From the (source position, output position) dependence table come the fixed offsets a
pointer head must route (y_t reads x_{t-d} at every t), the absolute positions read at every t
(e.g. x_0), and whether y_t reads the whole prefix (a running sum, a counter, a maximum). A second
probe sweeps each input it reads through its values and counts how often the output's curvature
changes sign: a sum, a maximum, a square or a threshold change it at most twice, a parity, a
residue, a floor division or a table over digits again and again (the evidence for periodic units).
A prefix read whole may be read through sums weighted by a periodic function of the distance (a
number read digit by digit, modulo d: long division): the smallest p with y_t a function of x_t and
the p sums of the inputs at distances = s mod p, when the plain sum (p = 1) is not enough, is the
period of such weights (wtc.dt.periodic). A third measures how many of the routed inputs interact: a function that is a sum of parts of at
most k inputs each has every (k+1)-th order mixed difference zero, so the largest order with a
nonzero one says how many inputs one computation must see together (a sum: 1; a product of two:
2; the maximum of five: 5): discover gives its sub-MLPs that many inputs.

discover sizes its first architecture from this (wtc.discovery), and a failure report quotes it.
Data tasks (Task.from_arrays) answer only for recorded inputs, so they cannot be probed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wtc import lapack
from wtc.errors import TaskError
from wtc.tasks.task import Task

PROBE_SEQUENCES = 512
SHARE = 0.9              # an offset counts when it matters at this share of the output positions
SWEEP_SEQUENCES = 32     # base sequences of the oscillation sweep
SWEEP_VALUES = 128       # at most this many values per sweep (of the sampled ones)
OSCILLATING = 4          # curvature sign changes (median over base sequences) that count as oscillating
ORDER_MAX = 8            # interaction orders measured up to this (2**k target calls per mixed difference)
ORDER_SEQUENCES = 64     # base sequences (and donors) per subset of inputs
ORDER_SUBSETS = 16       # at most this many input subsets tried per order
PERIOD_SEQUENCES = 4096  # sequences of the periodic-weights test
PERIOD_SHARED = 0.5      # the test counts only where this share of sequences share their sums with another
MAX_PERIOD = 8           # periods tried: 2 .. this (DTConfig.agg_ops "per2" .. "per8")
SUM_PERIOD_MAX = 32      # periods of y in the prefix sum tried: 2 .. this
SUM_PERIOD_PAIRS = 12    # ... each on at least this many (x_(T-1), S), (x_(T-1), S + P) pairs
SUM_PERIOD_SPANS = 2     # ... the sums seen spanning at least this many periods: a count mod 12 of digits
#                           0..3 at length 10 spans 30 (three found no period; two changes none of MIPS's 62)


@dataclass
class Dependence:
    """Per input channel: offsets d with y_t <- x_{t-d} (d >= 0), absolute positions read at
    every later t, and whether y_t reads (nearly) every earlier position (a prefix)."""
    offsets: list[list[int]]
    absolute: list[list[int]]
    prefix: list[bool]
    table: np.ndarray = field(repr=False)          # (n_inputs, T source, T output) bool
    turns: list[dict[int, int]] = field(default_factory=list)   # per channel: offset -> curvature sign changes
    sum_turns: list[int] = field(default_factory=list)          # per channel: the same in the prefix sum (prefix reads)
    order: int = 0           # most routed inputs (offsets, absolute positions) that interact in y_t
    periods: list[int] = field(default_factory=list)            # per channel: period of its prefix weights (0: none)
    # (n_inputs, T source, T output): the share of swaps of the source that moved the output (NaN
    # where no swap changed the input); a carry shows as a share that halves (base 2) with each step
    # back, the same at every output position
    rates: np.ndarray | None = field(default=None, repr=False)
    affine: list[bool] = field(default_factory=list)           # per channel: its period found as an exact affine response
    sum_periods: list[int] = field(default_factory=list)       # per channel: y's period in the prefix sum (0: none)
    # y_t - y_(t-1) (mod step_modulus; 0: plain) is a function g of the inputs at t alone: y is a
    # running sum of g (None: it is not); step_affine: g is affine in the inputs (a sum head reads it);
    # step_order 2: the difference of the difference is g (y is a running sum of a running sum of g)
    step_modulus: int | None = None
    step_affine: bool = False
    step_order: int = 1

    @property
    def oscillating(self) -> list[tuple[int, int | str, int]]:
        """(channel, offset or "sum", sign changes) where the output oscillates in that input (or in
        the prefix sum of a channel it reads whole: a counter mod k)."""
        waves = [(c, d, n) for c, per in enumerate(self.turns) for d, n in per.items() if n >= OSCILLATING]
        return waves + [(c, "sum", n) for c, n in enumerate(self.sum_turns) if n >= OSCILLATING]

    @property
    def pointer_routes(self) -> int:
        """Offsets a pointer head must route (offset 0 is the stream's own value), over channels."""
        return sum(len([d for d in offs if d > 0]) for offs in self.offsets) + sum(len(a) for a in self.absolute)

    def describe(self) -> str:
        parts = []
        for c, (offs, ab, pre) in enumerate(zip(self.offsets, self.absolute, self.prefix)):
            name = "x" if len(self.offsets) == 1 else f"x{c}"
            what = [f"{name}_(t-{d})" if d else f"{name}_t" for d in offs] + [f"{name}_{p}" for p in ab]
            if pre:
                what.append(f"the whole prefix of {name}")
            parts.append(", ".join(what) if what else f"no position of {name}")
        def where(c, d):
            name = "x" if len(self.offsets) == 1 else f"x{c}"
            return f"the prefix sum of {name}" if d == "sum" else f"{name}_{f'(t-{d})' if d else 't'}"
        waves = [f"{where(c, d)} ({n} turns)" for c, d, n in self.oscillating]
        periodic = [f"{'x' if len(self.offsets) == 1 else f'x{c}'} through sums weighted with period {p}"
                    for c, p in enumerate(self.periods) if p]
        waves += [f"the prefix of {w}" for w in periodic]
        return ("; ".join(parts) + (f"; oscillating in {', '.join(waves)}" if waves else "")
                + (f"; {self.order} of them interact" if self.order > 2 else ""))


def _changed(y0: np.ndarray, y1: np.ndarray, output: str) -> np.ndarray:
    """(n, T) whether any output channel moved (beyond rounding for real outputs)."""
    both = np.isfinite(y0) & np.isfinite(y1)
    if output == "integer":
        moved = np.round(y0) != np.round(y1)
    else:
        moved = np.abs(y0 - y1) > 1e-9 * (1 + np.abs(y0))
    return (moved & both).any(axis=2)


def dependence(task: Task, seed: int = 0) -> Dependence | None:
    """The dependence of task's outputs on its inputs, or None for a task that cannot be probed.
    Two independent probes must agree: an offset, position or prefix counts only when both find
    it (a dependence that rarely shows, like "any one so far", otherwise changed with the seed)."""
    from wtc import arguments, tasks

    task = tasks.get(task)
    seed = arguments.seed(seed, error=TaskError)
    if task.size is not None:                     # recorded data: target answers only for the records
        return None
    rates = [_rates(task, np.random.default_rng([seed, 8123, k])) for k in (0, 1)]
    a, b = (_read(task, r > 0) for r in rates)
    both = [[v for v in u if v in w] for u, w in zip(a[0], b[0])]
    absolute = [[v for v in u if v in w] for u, w in zip(a[1], b[1])]
    prefix = [p and q for p, q in zip(a[2], b[2])]
    offsets = [[d for d in offs if not pre or d == 0] for offs, pre in zip(both, prefix)]
    # offsets read far back with gaps (a spring's response is zero at every third step): a prefix
    # read through a periodic weighting is tested as one, and read as one when it is
    spread = [not pre and len(offs) >= 3 and max(offs) >= task.seq_len // 2 for offs, pre in zip(offsets, prefix)]
    found = [_period(task, c, np.random.default_rng([seed, 8123, 5])) if pre or wide else (0, False)
             for c, (pre, wide) in enumerate(zip(prefix, spread))]
    periods, affine = [p for p, _ in found], [a for _, a in found]
    for c, wide in enumerate(spread):
        if wide and periods[c]:
            prefix[c], offsets[c], absolute[c] = True, [d for d in offsets[c] if d == 0], []
    turns = _turns(task, offsets, np.random.default_rng([seed, 8123, 2]))
    sums = [_sum_turns(task, c, np.random.default_rng([seed, 8123, 3])) if pre else 0 for c, pre in enumerate(prefix)]
    sum_periods = [_sum_period(task, c, np.random.default_rng([seed, 8123, 6])) if pre else 0
                   for c, pre in enumerate(prefix)]
    order = _order(task, offsets, absolute, np.random.default_rng([seed, 8123, 4]))
    return Dependence(offsets, absolute, prefix, a[3] & b[3], turns, sums, order, periods,
                      rates=(rates[0] + rates[1]) / 2, affine=affine, sum_periods=sum_periods,
                      **_steps(task, np.random.default_rng([seed, 8123, 7])) if any(prefix) else {})


def _period(task: Task, c: int, rng: np.random.Generator) -> tuple[int, bool]:
    """The smallest p in 2..MAX_PERIOD such that y_(T-1) is a function of the inputs at T-1 and the
    p sums of channel c over the positions at distance = s mod p (s = 0 .. p-1), when the plain sum
    (p = 1) is not; 0 when no p is. Where the samples share too few keys to tell (PERIOD_SHARED:
    many values per position), "a function of" is tested as "an exact affine function of" (a
    linear response such as a spring's): wider than the key test cannot be, so it only adds finds.
    Periods above T - 2 are not tried: with fewer than two positions sharing a phase any weighting
    fits. Returns (p or 0, whether it was found by the affine test)."""
    x, y = task.batch(rng, PERIOD_SEQUENCES)
    out, T = y[:, -1, :], task.seq_len
    if not np.all(np.isfinite(out)):
        return 0, False
    distance = T - 1 - np.arange(T)
    for p in range(1, min(MAX_PERIOD, T - 2) + 1):
        sums = np.stack([x[:, distance % p == s, c].sum(axis=1) for s in range(p)], axis=1)
        keys, inverse, counts = np.unique(np.concatenate([x[:, -1, :], sums], axis=1), axis=0,
                                          return_inverse=True, return_counts=True)
        inverse = inverse.ravel()
        shared = np.mean(counts[inverse] > 1) >= PERIOD_SHARED
        if shared:
            table = np.zeros((len(keys), out.shape[1]))
            np.add.at(table, inverse, out)
            table /= counts[:, None]
            found = np.allclose(table[inverse], out, rtol=1e-9, atol=1e-9)
        else:
            found = _affine(np.concatenate([x[:, -1, :], sums], axis=1).astype(float), out.astype(float))
        if found:
            return (0, False) if p == 1 else (p, not shared)
    return 0, False


def _affine(features: np.ndarray, out: np.ndarray) -> bool:
    """Whether out (n, k) is an affine function of features (n, f), to float64 rounding."""
    design = np.concatenate([features, np.ones((len(features), 1))], axis=1)
    try:
        coef = lapack.lstsq(design, out)
    except np.linalg.LinAlgError:   # inf or NaN among the features or outputs: no affine map
        return False
    scale = 1.0 + np.abs(out).max()
    return bool(np.abs(design @ coef - out).max() <= 1e-7 * scale)


def _order(task: Task, offsets: list[list[int]], absolute: list[list[int]], rng: np.random.Generator) -> int:
    """The largest k (up to ORDER_MAX) such that some k-th order mixed difference of y_(T-1) in the
    routed inputs is nonzero: sum over subsets A of S of (-1)^(|S|-|A|) y(x with A's inputs taken
    from a donor). Zero for every S of size k+1 exactly when y is a sum of parts of <= k inputs."""
    T = task.seq_len
    inputs = [(c, T - 1 - d) for c, offs in enumerate(offsets) for d in offs if T - 1 - d >= 0]
    inputs += [(c, j) for c, ab in enumerate(absolute) for j in ab if j not in [p for q, p in inputs if q == c]]
    if len(inputs) < 2:
        return len(inputs)
    x, donor = task.draw(rng, ORDER_SEQUENCES), task.draw(rng, ORDER_SEQUENCES)
    found = 1
    for k in range(2, min(len(inputs), ORDER_MAX) + 1):
        subsets = {tuple(sorted(rng.choice(len(inputs), k, replace=False))) for _ in range(4 * ORDER_SUBSETS)}
        if not any(_mixed_nonzero(task, x, donor, [inputs[i] for i in S]) for S in sorted(subsets)[:ORDER_SUBSETS]):
            break
        found = k
    return found


def _mixed_nonzero(task: Task, x: np.ndarray, donor: np.ndarray, inputs: list[tuple[int, int]]) -> bool:
    """Whether the mixed difference of y_(T-1) over these (channel, position) inputs is nonzero
    (beyond rounding) on any base sequence."""
    k, n = len(inputs), len(x)
    masks = np.array([[(a >> i) & 1 for i in range(k)] for a in range(2 ** k)], dtype=bool)   # (2^k, k)
    xs = np.repeat(x[None], 2 ** k, axis=0)                                                  # (2^k, n, T, C)
    for i, (c, j) in enumerate(inputs):
        xs[masks[:, i], :, j, c] = donor[:, j, c]
    y = task.targets(xs.reshape(-1, *x.shape[1:]))[:, -1, :].reshape(2 ** k, n, -1)         # (2^k, n, O)
    sign = np.where((k - masks.sum(axis=1)) % 2 == 0, 1.0, -1.0)[:, None, None]
    diff = (sign * y).sum(axis=0)                                                            # (n, O)
    scale = np.abs(y).max(axis=0)
    return bool(np.any(np.isfinite(diff) & (np.abs(diff) > 1e-9 * (1 + scale))))


def _sign_changes(values: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y (..., V, O) over sorted values (V,) -> (..., O) sign changes of the slope's change."""
    slope = np.diff(y, axis=-2) / np.diff(values)[:, None]
    bend = np.diff(slope, axis=-2)
    tol = 1e-6 * (np.nanmax(np.abs(slope), axis=-2, keepdims=True) + 1e-12)
    sign = np.where(np.abs(bend) > tol, np.sign(bend), 0)
    flat = np.moveaxis(sign, -2, -1).reshape(-1, sign.shape[-2])
    changes = [int((row[row != 0][1:] != row[row != 0][:-1]).sum()) for row in flat]
    return np.reshape(changes, sign.shape[:-2] + sign.shape[-1:])


def _sum_turns(task: Task, c: int, rng: np.random.Generator) -> int:
    """Sign changes of y_(T-1) as a function of S = the sum of channel c over the sequence, when y
    is one (equal S, equal y on every sampled pair); 0 otherwise (a running maximum is no function
    of the sum)."""
    x, y = task.batch(rng, PROBE_SEQUENCES)
    S, out = x[:, :, c].sum(axis=1), y[:, -1, :]                                  # (n,), (n, O)
    values, inverse = np.unique(S, return_inverse=True)
    if len(values) < 5 or not np.all(np.isfinite(out)):
        return 0
    table = np.zeros((len(values), out.shape[1]))
    np.add.at(table, inverse.ravel(), out)
    table /= np.bincount(inverse.ravel())[:, None]
    if not np.allclose(table[inverse.ravel()], out, rtol=1e-9, atol=1e-9):
        return 0
    return int(_sign_changes(values, table).max())


def _sum_period(task: Task, c: int, rng: np.random.Generator) -> int:
    """The smallest P in 2..SUM_PERIOD_MAX with y_(T-1)(x_(T-1), S) = y_(T-1)(x_(T-1), S + P) on
    every sampled pair (at least SUM_PERIOD_PAIRS of them, over at least SUM_PERIOD_SPANS periods of S), for S =
    the sum of channel c, when y_(T-1) is a function of (x_(T-1), S); 0 otherwise. A counter mod 7
    has P = 7, error diffusion by 15 (floor(S / 15) - floor((S - x) / 15)) P = 15: the periods
    a sub-MLP's periodic units need beyond discover's 2..6."""
    x, y = task.batch(rng, PERIOD_SEQUENCES)
    S, out = x[:, :, c].sum(axis=1), y[:, -1, :]
    if not np.all(np.isfinite(out)) or not np.all(S == np.round(S)):
        return 0
    keys = np.concatenate([x[:, -1, :], S[:, None]], axis=1)
    uniq, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    table = np.zeros((len(uniq), out.shape[1]))
    np.add.at(table, inverse, out)
    table /= counts[:, None]
    if not np.allclose(table[inverse], out, rtol=1e-9, atol=1e-9):
        return 0
    value = {tuple(k): v for k, v in zip(uniq.tolist(), table)}
    span = float(S.max() - S.min())
    for P in range(2, SUM_PERIOD_MAX + 1):
        if SUM_PERIOD_SPANS * P > span:
            break
        pairs = [(v, value[k[:-1] + (k[-1] + P,)]) for k, v in value.items() if k[:-1] + (k[-1] + P,) in value]
        if len(pairs) >= SUM_PERIOD_PAIRS and all(np.allclose(a, b, rtol=1e-9, atol=1e-9) for a, b in pairs):
            return P
    return 0


def _steps(task: Task, rng: np.random.Generator) -> dict:
    """{step_modulus, step_affine, step_order} where y_t - y_(t-1) (y_(-1) = 0), plain or modulo P in
    2..MAX_PERIOD (the largest that works: mod 4 also works mod 2), is the same function of the inputs at t at every t
    and in every sampled sequence (and not constant); {} when none is. A count of the even values
    so far has steps [x_t even] (not affine: a sub-MLP must compute them before a sum head adds
    them), a parity of a dot product steps a_t b_t mod 2, a plain sum steps x_t (affine). Where no
    such step exists the difference of the difference is tried, plain only (step_order 2): a
    position under forces x_t (the prefix sum of the prefix sum) steps x_t there."""
    if task.output != "integer":
        return {}
    x, y = task.batch(rng, PROBE_SEQUENCES)
    if not np.all(np.isfinite(y)):
        return {}
    keys = x.reshape(-1, x.shape[2])
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    step = np.diff(y, axis=1, prepend=0)                                   # (n, T, O)
    for order, moduli in ((1, (0,) + tuple(range(MAX_PERIOD, 1, -1))), (2, (0,))):
        for P in moduli:
            d = (step % P if P else step).reshape(len(keys), -1)
            first = np.zeros((len(uniq), d.shape[1]))
            first[inverse] = d                                             # any one value per key
            if not np.array_equal(first[inverse], d) or len(np.unique(d, axis=0)) < 2:
                continue
            return {"step_modulus": P, "step_affine": _steps_affine(uniq, first, P), "step_order": order}
        step = np.diff(step, axis=1, prepend=0)
    return {}


def _steps_affine(keys: np.ndarray, g: np.ndarray, P: int) -> bool:
    """Whether g (per key) is affine in the keys: exactly (P = 0) or modulo P with integer
    coefficients in 0..P-1."""
    if P == 0:
        return _affine(keys.astype(float), g.astype(float))
    import itertools
    for coef in itertools.product(range(P), repeat=keys.shape[1] + 1):
        pred = (keys @ np.asarray(coef[:-1]) + coef[-1]) % P
        if np.all(pred[:, None] == g):
            return True
    return False


def _turns(task: Task, offsets: list[list[int]], rng: np.random.Generator) -> list[dict[int, int]]:
    """Per channel and offset d it reads: the median over base sequences of the number of sign
    changes of the slope's change (divided differences, so unequal spacing is no curvature) of
    y_(T-1) as x_(T-1-d) sweeps sampled values in order (every one, or SWEEP_VALUES spread evenly)."""
    x = task.draw(rng, max(SWEEP_SEQUENCES, 256))
    T, n = task.seq_len, SWEEP_SEQUENCES
    out = []
    for c, offs in enumerate(offsets):
        values = np.unique(x[:, :, c])
        if len(values) > SWEEP_VALUES:            # values the sampler gave, never in-between ones
            values = values[np.unique(np.linspace(0, len(values) - 1, SWEEP_VALUES).round().astype(int))]
        per = {}
        for d in offs:
            if len(values) < 5 or T - 1 - d < 0:
                per[d] = 0
                continue
            sweep = np.repeat(x[:n], len(values), axis=0)                       # (n * V, T, k)
            sweep[:, T - 1 - d, c] = np.tile(values, n)
            y = task.targets(sweep)[:, T - 1, :].reshape(n, len(values), -1)     # (n, V, O)
            changes = _sign_changes(values, y)                                  # (n, O)
            per[d] = int(np.median(changes.max(axis=1)))
        out.append(per)
    return out


def _rates(task: Task, rng: np.random.Generator) -> np.ndarray:
    """(n_inputs, T source, T output) the share of the sequences whose source value a swap changed
    in which the output moved (0 where nothing moved, NaN where no swap changed the input)."""
    x, y = task.batch(rng, PROBE_SEQUENCES)
    donor = task.draw(rng, PROBE_SEQUENCES)
    T, k = task.seq_len, task.n_inputs
    rates = np.full((k, T, T), np.nan)
    for c in range(k):
        for j in range(T):
            x1 = x.copy()
            x1[:, j, c] = donor[:, j, c]
            swapped = x1[:, j, c] != x[:, j, c]
            if not swapped.any():
                continue
            rates[c, j] = _changed(y[swapped], task.targets(x1[swapped]), task.output).mean(axis=0)
    return rates


def _read(task: Task, table: np.ndarray):
    """(offsets, absolute positions, prefix flags, table) per input channel from one table."""
    T, k = task.seq_len, task.n_inputs
    # output positions that depend on anything: where the output is constant (a vote that
    # cannot be won yet at t = 0, 1) there is nothing to learn about offsets
    live = table.any(axis=(0, 1))
    valid = [t for t in range(task.valid_from, T) if live[t]]
    offsets, absolute, prefix = [], [], []
    for c in range(k):
        dep = table[c]
        offs, testable = [], []
        for d in range(T):
            ts = [t for t in valid if t - d >= 0]
            if len(ts) >= 2:
                testable.append(d)
                if np.mean([dep[t - d, t] for t in ts]) >= SHARE:
                    offs.append(d)
        # every offset the sequence length can show matters: the whole prefix (a window as long as
        # the sequence is the same thing within it)
        pre = len(testable) >= 3 and set(testable) <= set(offs)
        if pre:
            offs = [d for d in offs if d == 0]
        ab = [] if pre else [j for j in range(T) if all(dep[j, t] for t in valid if t >= j) and
                             sum(t >= j for t in valid) >= 2 and not any(d == t - j for d in offs for t in valid)]
        offsets.append(offs)
        absolute.append(ab)
        prefix.append(bool(pre))
    return offsets, absolute, prefix, table

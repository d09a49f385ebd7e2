"""Tasks from recorded data: `Task.from_arrays(inputs, outputs)` for sequences with no callables
(a scientist's measurements, a log of a system).

The recorded sequences are split, seeded, into a training part (what `sample` draws from) and a
held-out part (`task.heldout`, what verification scores on). `target(x)` looks each sequence up in
the records, so it answers only for recorded inputs; the same input recorded with two different
outputs is refused (the outputs are then not a function of the inputs). Too few sequences to hold
some out is refused rather than verified on the training data.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wtc.errors import TaskError
from wtc.tasks.limits import MAX_MAGNITUDE, plain_numbers

MIN_HELDOUT = 16           # held-out sequences a verification needs to mean anything
MIN_TRAIN = 32             # training sequences below which a fit is a lookup of a handful of rows


def _as_array(a, what: str, name: str) -> np.ndarray:
    a = plain_numbers(a, f"task {name!r}: {what}", TaskError)
    try:
        complex_ = np.iscomplexobj(a)
    except (TypeError, ValueError) as exc:        # ragged lists
        raise TaskError(f"task {name!r}: {what} are not a numeric array: {exc}") from None
    if complex_:
        raise TaskError(f"task {name!r}: {what} are complex; recorded values must be real numbers")
    try:
        raw = np.asarray(a)
        a = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TaskError(f"task {name!r}: {what} are not a numeric array: {exc}") from None
    if raw.dtype.kind in "iuO" and raw.size:      # integers past 2**53 round in float64: distinct records would merge
        try:
            with np.errstate(invalid="ignore"):
                exact = np.asarray(raw == a.astype(raw.dtype) if raw.dtype.kind != "O" else
                                   [int(v) == int(f) for v, f in zip(raw.reshape(-1), a.reshape(-1))]).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            exact = np.ones(raw.size, bool)
        if raw.dtype.kind in "iu":
            exact &= np.abs(a.reshape(-1)) < 2.0**63        # float64 -> int64 wraps at 2**63
        if not exact.all():
            at = tuple(map(int, np.unravel_index(int(np.argmin(exact)), raw.shape)))
            raise TaskError(f"task {name!r}: {what} hold the integer {int(raw[at])} at {at}, which float64 (what "
                            f"records are kept in) cannot represent exactly (integers are exact up to 2**53); "
                            "subtract an offset or rescale them")
    if a.ndim not in (2, 3):
        raise TaskError(f"task {name!r}: {what} must be (n, T) or (n, T, k), got shape {a.shape}")
    if a.size == 0:
        raise TaskError(f"task {name!r}: {what} are empty (shape {a.shape}); record at least one value")
    return a


def _check_float32_resolution(x: np.ndarray, valid: np.ndarray, output: str, name: str) -> None:
    """Refuse records the Discrete Transformer, which trains in float32 (24-bit significand), cannot
    tell apart: integer outputs past 2**24 (unit steps vanish: x + 10**9 came back as
    `out = 1000000000`, NOT verified) and distinct whole-number inputs that float32 merges (integers
    past 2**24)."""
    top = float(np.abs(valid).max(initial=0))
    if output == "integer" and top >= 2**24:
        raise TaskError(f"task {name!r}: integer outputs reach {top:.10g}, but float32 (what the Discrete Transformer "
                        f"trains in) resolves unit steps only below 2**24 = {2**24}; subtract an offset (e.g. the "
                        "outputs' minimum), or pass output='real' if a relative error of 1e-3 will do")
    values = np.unique(x)
    if not np.all(values == np.round(values)):
        return        # real-valued measurements: float32 rounding is within their precision, not a lost step
    merged = np.flatnonzero(np.diff(values.astype(np.float32)) == 0)
    if merged.size:
        a, b = float(values[merged[0]]), float(values[merged[0] + 1])
        raise TaskError(f"task {name!r}: the distinct inputs {a!r} and {b!r} are the same number in float32 (what the "
                        "Discrete Transformer trains in: 24-bit significand); subtract an offset or rescale the inputs")


def sequence_keys(x: np.ndarray) -> list[bytes]:
    """One hashable key per sequence (its float64 bytes; -0.0 folded onto 0.0)."""
    x = np.ascontiguousarray(x + 0.0, dtype=np.float64)
    return [row.tobytes() for row in x.reshape(len(x), -1)]


class Records:
    """Recorded sequences (a data task's split, a callable task's drawn pool: wtc.tasks.pool):
    `sample` draws them (without replacement while they last), `target` looks each sequence up in
    `table` (sequence_keys -> its outputs; default: these sequences' own)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, squeeze_in: bool, squeeze_out: bool,
                 table: dict[bytes, np.ndarray] | None, name: str):
        if table is None:
            table = dict(zip(sequence_keys(x), y))
        self.x, self.y, self.table, self.name = x, y, table, name
        self.squeeze_in, self.squeeze_out = squeeze_in, squeeze_out

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        pick = rng.permutation(len(self.x))[:n] if n <= len(self.x) else rng.integers(0, len(self.x), n)
        x = self.x[pick]
        return x[..., 0] if self.squeeze_in else x

    def target(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        x3 = x[..., None] if self.squeeze_in else x
        try:
            y = np.stack([self.table[k] for k in sequence_keys(x3)])
        except KeyError:
            raise TaskError(f"task {self.name!r}: target(x) is known only for recorded sequences, and this "
                            "batch holds one that was not recorded") from None
        return y[..., 0] if self.squeeze_out else y


def from_arrays(inputs, outputs, *, name: str = "data", output: str | None = None, valid_from: int = 0,
                heldout: float = 0.2, seed: int = 0, description: str = "", task_type=None):
    """A Task over recorded sequences: inputs (n, T) or (n, T, k), outputs (n, T) or (n, T, m).

    output: 'integer' or 'real' (default: 'integer' when every valid output is a whole number);
    heldout: the share of sequences kept for verification (split seeded by `seed`); positions
    before valid_from need no output (NaN allowed there). task_type: the Task class (Task.from_arrays
    passes itself; this module does not import it, so the two do not import each other)."""
    from wtc import arguments

    if task_type is None:
        raise TaskError("call Task.from_arrays(inputs, outputs, ...) (this function needs the Task class)")

    x, y = _as_array(inputs, "inputs", name), _as_array(outputs, "outputs", name)
    seed = arguments.seed(seed, error=TaskError)
    if isinstance(heldout, (bool, np.bool_)) or not isinstance(heldout, (int, float, np.floating)) or not 0 < heldout < 1:
        raise TaskError(f"task {name!r}: heldout must be a share in (0, 1), got {heldout!r}")
    heldout = float(heldout)          # a numpy float as a float (the options are written as JSON)
    squeeze_in, squeeze_out = x.ndim == 2, y.ndim == 2
    x3, y3 = (x[..., None] if squeeze_in else x), (y[..., None] if squeeze_out else y)
    if x3.shape[:2] != y3.shape[:2]:
        raise TaskError(f"task {name!r}: inputs {x.shape} and outputs {y.shape} must agree in (n, T)")
    n, T = x3.shape[:2]
    if not isinstance(valid_from, (int, np.integer)) or isinstance(valid_from, bool) or not 0 <= valid_from < T:
        raise TaskError(f"task {name!r}: valid_from must be an integer in [0, {T}), got {valid_from!r}")
    if not np.all(np.isfinite(x3)):
        raise TaskError(f"task {name!r}: inputs hold NaN or inf (first at {tuple(map(int, np.argwhere(~np.isfinite(x3))[0]))})")
    valid = y3[:, valid_from:]
    if not np.all(np.isfinite(valid)):
        at = np.argwhere(~np.isfinite(valid))[0]
        at[1] += valid_from
        raise TaskError(f"task {name!r}: outputs hold NaN or inf at a valid position {tuple(map(int, at))}")
    if np.abs(x3).max() > MAX_MAGNITUDE or np.abs(valid).max() > MAX_MAGNITUDE:
        raise TaskError(f"task {name!r}: recorded values beyond |{MAX_MAGNITUDE:g}| (the DT trains in float32); rescale them")
    whole = bool(np.all(valid == np.round(valid)))
    if output is None:     # past 2**53 every float64 is whole: such data are real numbers, not integers
        output = "integer" if whole and np.abs(valid).max() < 2**53 else "real"
    if output not in ("integer", "real"):
        raise TaskError(f"task {name!r}: output must be 'integer', 'real' or None, got {output!r}")
    if output == "integer" and not whole:
        raise TaskError(f"task {name!r}: output='integer' but the recorded outputs are not whole numbers")
    _check_float32_resolution(x3, valid, output, name)
    table: dict[bytes, np.ndarray] = {}
    first: dict[bytes, int] = {}                  # each distinct input sequence once (duplicates are one)
    for k, key in enumerate(sequence_keys(x3)):
        seen = table.get(key)
        if seen is not None and not np.array_equal(seen[valid_from:], y3[k, valid_from:], equal_nan=True):
            raise TaskError(f"task {name!r}: sequence {k} repeats an earlier input (sequence {first[key]}) with "
                            "other outputs; the outputs are not a function of the inputs")
        table[key] = y3[k]
        first.setdefault(key, k)
    distinct = np.array(sorted(first.values()))
    n = len(distinct)
    n_held = int(round(n * heldout))
    if n_held < MIN_HELDOUT or n - n_held < MIN_TRAIN:
        raise TaskError(f"task {name!r}: {n} distinct recorded sequences are too few to train on and verify: "
                        f"with heldout={heldout}, {n - n_held} train and {n_held} are held out; a data task needs "
                        f">= {MIN_TRAIN} to train on and >= {MIN_HELDOUT} held out")
    x3, y3 = x3[distinct], y3[distinct]
    order = np.random.default_rng([seed, 1729]).permutation(n)
    held, train = order[:n_held], order[n_held:]
    shape = {"seq_len": T, "n_inputs": x3.shape[2], "n_outputs": y3.shape[2], "output": output,
             "valid_from": int(valid_from)}
    kept = Records(x3[held], y3[held], squeeze_in, squeeze_out, table, name)
    rec = Records(x3[train], y3[train], squeeze_in, squeeze_out, table, name)
    verify_on = task_type(f"{name} (held out)", kept.sample, kept.target, size=len(held), description=description, **shape)
    task = task_type(name, rec.sample, rec.target, size=len(train), heldout=verify_on, description=description, **shape)
    # what rebuilds this task elsewhere (a worker process): the distinct records in their given rank
    # (so the rebuilt split is this one) and the arguments; see save_records / read_records
    records = {"inputs": x3[..., 0] if squeeze_in else x3, "outputs": y3[..., 0] if squeeze_out else y3,
               "options": {"name": name, "output": output, "valid_from": int(valid_from), "heldout": heldout,
                           "seed": seed, "description": description}}
    object.__setattr__(task, "_records", records)     # frozen dataclass: a private attribute only
    return task


def has_records(task) -> bool:
    """Whether `task` came from Task.from_arrays (and can be rebuilt from its records)."""
    return "_records" in getattr(task, "__dict__", {})


def save_records(task, path: Path) -> None:
    """Write a from_arrays task's records and options to `path` (.npz, no pickles)."""
    rec = task.__dict__["_records"]
    np.savez(path, inputs=rec["inputs"], outputs=rec["outputs"], options=np.array(json.dumps(rec["options"])))


def read_records(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """(inputs, outputs, options) that save_records wrote; Task.from_arrays(inputs, outputs,
    **options) rebuilds the task (the same split and fingerprint)."""
    with np.load(path, allow_pickle=False) as z:
        return z["inputs"], z["outputs"], json.loads(str(z["options"]))

"""The Task type: a sampler of input sequences and a target function, validated on every call."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, NoReturn

import numpy as np
from numpy.typing import ArrayLike

from wtc.errors import TaskError
from wtc.tasks.limits import MAX_MAGNITUDE, REAL_TOLERANCE, plain_numbers  # noqa: F401  (REAL_TOLERANCE: re-exported)

OUTPUT_KINDS = ("integer", "real")


def shift(x: np.ndarray, k: int) -> np.ndarray:
    """x_{t-k} along axis 1, with 0 before the start (for writing targets)."""
    out = np.zeros_like(x)
    if k < x.shape[1]:
        out[:, k:] = x[:, : x.shape[1] - k]
    return out




@dataclass(frozen=True, eq=False)
class Task:
    """A sequence-to-sequence task.

    sample(rng, n) -> (n, seq_len, n_inputs)   [(n, seq_len) allowed when n_inputs == 1]
    target(x)      -> (n, seq_len)             [(n, seq_len, n_outputs) when n_outputs > 1]

    Positions before ``valid_from`` have no defined target: they are neither trained on nor scored.
    Integer tasks are scored by rounded accuracy, real tasks by max relative error
    |pred - y| / (1 + |y|) <= 1e-3.

    any_length=True says the task is defined for every length: sample draws each position
    independently (so longer sequences are draws laid end to end) and target works on any T.
    Programs are then also verified at twice seq_len (`at_length`), where a reading that only
    fits the training length fails.
    """

    name: str
    sample: Callable[[np.random.Generator, int], np.ndarray]
    target: Callable[[np.ndarray], np.ndarray]
    seq_len: int = field(kw_only=True)
    n_inputs: int = field(default=1, kw_only=True)
    n_outputs: int = field(default=1, kw_only=True)
    output: str = field(default="integer", kw_only=True)
    valid_from: int = field(default=0, kw_only=True)
    description: str = field(default="", kw_only=True)
    size: int | None = field(default=None, kw_only=True)        # recorded sequences (data tasks), else None
    heldout: "Task | None" = field(default=None, kw_only=True)  # what verification scores on (data tasks)
    any_length: bool = field(default=False, kw_only=True)       # positions i.i.d., target for any T

    def __post_init__(self) -> None:
        label = f"task {self.name!r}"
        if not isinstance(self.name, str) or not self.name.strip():
            raise TaskError(f"task name must be a non-empty string, got {self.name!r}")
        if any(not c.isprintable() for c in self.name):
            raise TaskError(f"task name must be printable (no newlines, tabs or control characters: it heads "
                            f"reports and one-line errors), got {self.name!r}")
        for attr in ("seq_len", "n_inputs", "n_outputs"):
            value = getattr(self, attr)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise TaskError(f"{label}: {attr} must be a positive integer, got {value!r}")
        if self.output not in OUTPUT_KINDS:
            raise TaskError(f"{label}: output must be one of {OUTPUT_KINDS}, got {self.output!r}")
        if (not isinstance(self.valid_from, (int, np.integer)) or isinstance(self.valid_from, bool)
                or not 0 <= self.valid_from < self.seq_len):
            raise TaskError(f"{label}: valid_from must be an integer in [0, seq_len={self.seq_len}), "
                            f"got {self.valid_from!r}")
        if self.size is not None and (not isinstance(self.size, (int, np.integer)) or isinstance(self.size, bool)
                                      or self.size < 1):
            raise TaskError(f"{label}: size must be None or a positive integer, got {self.size!r}")
        if self.heldout is not None and not isinstance(self.heldout, Task):
            raise TaskError(f"{label}: heldout must be None or a Task, got {type(self.heldout).__name__}")
        if self.heldout is not None:
            shape = ("seq_len", "n_inputs", "n_outputs", "output", "valid_from")
            differ = [a for a in shape if getattr(self.heldout, a) != getattr(self, a)]
            if differ:
                raise TaskError(f"{label}: heldout must be a task of the same shape, but its "
                                + ", ".join(f"{a} is {getattr(self.heldout, a)!r}, not {getattr(self, a)!r}" for a in differ))
        if not isinstance(self.description, str):
            raise TaskError(f"{label}: description must be a str, got {type(self.description).__name__}")
        if not isinstance(self.any_length, (bool, np.bool_)):
            raise TaskError(f"{label}: any_length must be True or False, got {self.any_length!r}")
        if self.any_length and self.heldout is not None:
            raise TaskError(f"{label}: a data task (heldout) has the recorded lengths only; any_length must be False")
        for attr in ("sample", "target"):
            if not callable(getattr(self, attr)):
                raise TaskError(f"{label}: {attr} must be callable, got {type(getattr(self, attr)).__name__}")

    # ------------------------------------------------------------------ validated calls
    def draw(self, rng: np.random.Generator | int, n: int) -> np.ndarray:
        """Sample n input sequences, validated and returned as float64 (n, seq_len, n_inputs)."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise TaskError(f"task {self.name!r}: n must be a positive integer, got {n!r}")
        if not isinstance(rng, np.random.Generator):
            from wtc import arguments
            rng = np.random.default_rng(arguments.seed(rng, "rng (a numpy Generator or a seed)", TaskError))
        try:
            x = self.sample(rng, int(n))
        except (Exception, SystemExit) as exc:  # a user callable that throws (or calls sys.exit)
            raise TaskError(f"task {self.name!r}: sample(rng, {n}) raised {type(exc).__name__}: {exc}") from exc
        try:
            ndim = np.ndim(x)
        except (TypeError, ValueError) as exc:           # ragged lists and the like
            raise TaskError(f"task {self.name!r}: sample is not a numeric array: {exc}") from None
        if self.n_inputs == 1 and ndim in (2, 3) and ndim != self._sample_ndim():
            # target(x) gets batches in the form sample gave first; a sampler that switches would
            # hand it the other form without a word
            raise TaskError(f"task {self.name!r}: sample returned a {ndim}-d array now but a "
                            f"{self._sample_ndim()}-d one before; it must return one form, (n, T) or (n, T, 1)")
        return self.check_inputs(x, n=int(n), source="sample")

    def check_inputs(self, x, n: int | None = None, source: str = "inputs") -> np.ndarray:
        """Validate an input batch and return it as float64 (n, seq_len, n_inputs)."""
        label = f"task {self.name!r}: {source}"
        x = plain_numbers(x, label, TaskError)
        try:
            complex_ = np.iscomplexobj(x)
            if not complex_:
                x = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as exc:        # ragged lists, text
            raise TaskError(f"{label} is not a numeric array: {exc}") from None
        if complex_:
            raise TaskError(f"{label} is complex; inputs must be real numbers")
        expected = f"(n, {self.seq_len}, {self.n_inputs})" + (f" or (n, {self.seq_len})" if self.n_inputs == 1 else "")
        if x.ndim == 2 and self.n_inputs == 1:
            x = x[:, :, None]
        if x.ndim != 3 or x.shape[1:] != (self.seq_len, self.n_inputs):
            raise TaskError(f"{label} has shape {x.shape}, expected {expected}")
        if n is not None and x.shape[0] != n:
            raise TaskError(f"{label} returned {x.shape[0]} sequences, {n} were requested")
        if not np.all(np.isfinite(x)):
            bad = np.argwhere(~np.isfinite(x))[0]
            raise TaskError(f"{label} contains NaN or inf (first at index {tuple(int(i) for i in bad)})")
        _check_magnitude(x, label)
        return x

    def targets(self, x: np.ndarray) -> np.ndarray:
        """Targets for validated inputs as float64 (n, seq_len, n_outputs); invalid positions are NaN."""
        x = self.check_inputs(x)
        arg = x[:, :, 0] if self.n_inputs == 1 and self._sample_ndim() == 2 else x   # as sample gives it
        kind = self._sample_dtype()
        if kind is not None and kind.kind in "biu":
            # integer / bool samples reach target as integers / bools (x & 1, table[x] work), in int64 so
            # that arithmetic on a uint8 or int8 sample does not wrap where float64 did not
            want = np.bool_ if kind.kind == "b" else np.int64
            with np.errstate(invalid="ignore"):
                back = arg.astype(want)
            if np.array_equal(arg, back) and (kind.kind == "b" or np.abs(arg).max(initial=0) < 2**63):
                arg = back
        try:
            y = self.target(arg.copy())
        except (Exception, SystemExit) as exc:
            raise TaskError(f"task {self.name!r}: target(x) raised {type(exc).__name__}: {exc}") from exc
        label = f"task {self.name!r}: target"
        y = plain_numbers(y, label, TaskError)
        if np.iscomplexobj(y):
            raise TaskError(f"{label} is complex; targets must be real numbers")
        try:
            y = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TaskError(f"{label} is not a numeric array: {exc}") from exc
        n = x.shape[0]
        if y.ndim == 2 and self.n_outputs == 1:
            y = y[:, :, None]
        want = (n, self.seq_len, self.n_outputs)
        if y.shape != want:
            shown = want[:2] if self.n_outputs == 1 else want
            raise TaskError(f"{label} has shape {y.shape}, expected {shown}")
        valid = y[:, self.valid_from:]
        if not np.all(np.isfinite(valid)):
            bad = np.argwhere(~np.isfinite(valid))[0]
            bad[1] += self.valid_from
            raise TaskError(f"{label} is NaN or inf at a valid position (index {tuple(int(i) for i in bad)})")
        if self.output == "integer" and valid.size and np.abs(valid).max() >= 2**53:
            raise TaskError(f"{label}: output='integer' but the target reaches {np.abs(valid).max():.3g}; past 2**53 "
                            "float64 holds no fractions, so whole-number checks and accuracy mean nothing there "
                            "(use output='real' or smaller targets)")
        if self.output == "integer" and not np.all(valid == np.round(valid)):
            raise TaskError(f"{label}: output='integer' but the target has non-integer values "
                            f"(e.g. {valid[valid != np.round(valid)][0]!r}); use output='real'")
        _check_magnitude(valid, label)
        y = y.copy()
        y[:, : self.valid_from] = np.nan
        return y

    def fingerprint(self) -> str:
        """sha256 of the definition (shape fields, output kind, valid_from) and of a fixed probe
        batch and its targets: two tasks that share a name but sample or compute differently
        differ here, so a resume can refuse the other one's checkpoints."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            import hashlib
            x, y = self.batch(np.random.default_rng(20261201), 8)
            if not np.array_equal(y, self.targets(x), equal_nan=True):
                raise TaskError(f"task {self.name!r}: target(x) gave other values for the same inputs on a second "
                                "call; a target must be a function of x (no randomness or state)")
            if not np.array_equal(y[-3:], self.targets(x[-3:]), equal_nan=True):
                # e.g. x.cumsum(0) or x - x.mean(0): axis 0 is the batch, so each sequence's target would
                # change with the batch it is drawn in (and a transposed (T, n) target when n == T)
                raise TaskError(f"task {self.name!r}: target(x) of a sequence depends on the other sequences in the "
                                "batch (the last 3 of 8 got other targets alone); a target works along each "
                                "sequence (axis 1), never across the batch (axis 0)")
            if not np.array_equal(x, self.draw(np.random.default_rng(20261201), 8)):
                raise TaskError(f"task {self.name!r}: sample(rng, n) gave other sequences for the same seed; it must "
                                "draw from the rng it is given (not np.random or random), or runs do not reproduce")
            h = hashlib.sha256(repr((self.seq_len, self.n_inputs, self.n_outputs, self.output,
                                     self.valid_from)).encode())
            h.update(np.ascontiguousarray(x).tobytes())
            h.update(np.ascontiguousarray(np.nan_to_num(y, nan=-7.0)).tobytes())
            cached = h.hexdigest()
            object.__setattr__(self, "_fingerprint", cached)   # frozen dataclass: a private cache only
        return cached

    def _sample_ndim(self) -> int:
        """2 or 3: the rank of what `sample` returns, so `target` receives batches in that form
        (a single-input sampler may return (n, T) or (n, T, 1)); probed once with one sequence."""
        cached = self.__dict__.get("_ndim")
        if cached is None:
            if self.n_inputs > 1:
                cached = 3
            else:
                try:
                    first = self.sample(np.random.default_rng(0), 1)
                except (Exception, SystemExit) as exc:
                    raise TaskError(f"task {self.name!r}: sample(rng, 1) raised {type(exc).__name__}: {exc}") from exc
                cached = 3 if np.ndim(first) == 3 else 2
                self._note_dtype(first)
            object.__setattr__(self, "_ndim", cached)   # frozen dataclass: a private cache only
        return cached

    def _note_dtype(self, first) -> None:
        if "_dtype" not in self.__dict__:
            dt = getattr(first, "dtype", None)
            object.__setattr__(self, "_dtype", dt if isinstance(dt, np.dtype) else None)

    def _sample_dtype(self) -> np.dtype | None:
        """The dtype of what sample returns, probed once with one sequence: integer and bool
        samples reach target as int64 / bool again after validation (as float64), so x & 1 or
        table[x] work as on sample's own output."""
        if "_dtype" not in self.__dict__:
            try:
                first = self.sample(np.random.default_rng(0), 1)
            except (Exception, SystemExit) as exc:
                raise TaskError(f"task {self.name!r}: sample(rng, 1) raised {type(exc).__name__}: {exc}") from exc
            self._note_dtype(first)
        return self.__dict__["_dtype"]

    def batch(self, rng: np.random.Generator | int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(x, y): n validated input sequences and their targets."""
        x = self.draw(rng, n)
        return x, self.targets(x)

    # ------------------------------------------------------------------ scoring
    def score(self, pred: np.ndarray, y: np.ndarray) -> dict:
        """Task metric on valid positions: accuracy (integer) or max relative error (real).

        pred and y may have the public shape ((n, T) or (n, T, n_outputs)) or (n, T, n_outputs).
        """
        pred, y = self._as_3d(pred, "prediction"), self._as_3d(y, "target")
        if pred.shape != y.shape:
            raise TaskError(f"task {self.name!r}: prediction shape {pred.shape} != target shape {y.shape}")
        p, t = pred[:, self.valid_from:], y[:, self.valid_from:]
        rel = np.abs(p - t) / (1.0 + np.abs(t))
        rel = np.where(np.isfinite(rel), rel, np.inf)
        err = np.abs(p - t)
        out = {"max_rel_err": float(rel.max()), "mean_rel_err": float(rel.mean()),
               "max_abs_err": float(np.where(np.isfinite(err), err, np.inf).max())}
        if self.output == "integer":
            hit = np.round(p) == t
            out["accuracy"] = float(hit.mean())
            out["sequence_accuracy"] = float(hit.reshape(len(hit), -1).all(axis=1).mean())
            out["solved"] = out["accuracy"] == 1.0
        else:
            out["solved"] = out["max_rel_err"] <= REAL_TOLERANCE
        return out

    def fresh_batch(self, n: int, seed) -> "FreshBatch":
        """n sequences to judge a model or program on: fresh draws (rng seeded by `seed`), or for a
        data task its held-out records (all of them when n exceeds them). The one place that
        decides what "fresh data" is: verify, train, the CLI and discover's diagnosis use it."""
        task, n = self.verification(n)
        x, y = task.batch(np.random.default_rng(seed), n)
        return FreshBatch(task, x, y, heldout=task is not self)

    def score_fresh(self, predict: Callable[[np.ndarray], np.ndarray], n: int, seed) -> "FreshScore":
        """The task metric of predict(x) on fresh_batch(n, seed)."""
        batch = self.fresh_batch(n, seed)
        return FreshScore(batch.task.score(predict(batch.x), batch.y), len(batch.x), batch.heldout)

    def _as_3d(self, a, what: str) -> np.ndarray:
        try:
            complex_ = np.iscomplexobj(a)
            if not complex_:
                a = np.asarray(a, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TaskError(f"task {self.name!r}: {what} is not a numeric array: {exc}") from None
        if complex_:
            raise TaskError(f"task {self.name!r}: {what} is complex; scores compare real numbers")
        if a.ndim == 2:
            a = a[:, :, None]
        if a.ndim != 3 or a.shape[1:] != (self.seq_len, self.n_outputs):
            raise TaskError(f"task {self.name!r}: {what} has shape {a.shape}, expected "
                            f"(n, {self.seq_len}, {self.n_outputs})")
        if len(a) == 0:
            raise TaskError(f"task {self.name!r}: {what} holds no sequences; a score needs at least one")
        if what == "target" and not np.all(np.isfinite(a[:, self.valid_from:])):
            raise TaskError(f"task {self.name!r}: the target holds NaN or inf at a valid position (from "
                            f"valid_from={self.valid_from}); pass targets from task.batch / task.targets")
        return a

    @classmethod
    def from_arrays(cls, inputs: ArrayLike, outputs: ArrayLike, *, name: str = "data",
                    output: Literal["integer", "real"] | None = None, valid_from: int = 0, heldout: float = 0.2,
                    seed: int = 0, description: str = "", **unknown: NoReturn) -> "Task":
        """A task over recorded sequences: inputs (n, T) or (n, T, k), outputs (n, T) or (n, T, m).

        output: 'integer' or 'real' (default: 'integer' when every valid output is a whole number);
        heldout: the share of sequences kept for verification, split seeded by `seed` (discover
        trains on the rest and verifies on these only); positions before valid_from need no output
        (NaN allowed there); seq_len and the input / output counts come from the arrays. Implemented
        by wtc.tasks.data.from_arrays. `unknown` is never valid (its type says so to a type checker):
        it turns a misspelt keyword into a TaskError naming the ones there are."""
        import inspect

        from wtc.tasks.data import from_arrays
        if unknown:
            known = [k for k, p in inspect.signature(cls.from_arrays).parameters.items() if p.kind == p.KEYWORD_ONLY]
            raise TaskError(f"Task.from_arrays: unknown keyword argument(s) {', '.join(map(repr, sorted(unknown)))} "
                            f"(it takes {', '.join(known)}; seq_len and the input/output counts come from the arrays)")
        return from_arrays(inputs, outputs, name=name, output=output, valid_from=valid_from, heldout=heldout,
                           seed=seed, description=description, task_type=cls)

    def at_length(self, seq_len: int) -> "Task":
        """The same task at another sequence length (any_length tasks only): each sequence is
        ceil(seq_len / self.seq_len) draws of sample laid end to end, cut to seq_len; the same target."""
        if not self.any_length:
            raise TaskError(f"task {self.name!r} is defined at seq_len={self.seq_len} only (any_length=False)")
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len <= self.valid_from:
            raise TaskError(f"task {self.name!r}: at_length needs an integer length > valid_from={self.valid_from}, "
                            f"got {seq_len!r}")
        base, length = self, int(seq_len)

        def sample(rng, n):      # in the form (and dtype) base.sample gives; the new task validates it
            parts = [np.asarray(base.sample(rng, n)) for _ in range(-(-length // base.seq_len))]
            return np.concatenate(parts, axis=1)[:, :length]

        return Task(f"{self.name} (T={length})", sample, self.target, seq_len=length, n_inputs=self.n_inputs,
                    n_outputs=self.n_outputs, output=self.output, valid_from=self.valid_from,
                    description=self.description, any_length=True)

    def verification(self, n: int) -> tuple["Task", int]:
        """(the task to verify on, how many sequences): the held-out part of a data task, all of
        it when n exceeds it; the task itself otherwise."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise TaskError(f"task {self.name!r}: verification needs a positive number of sequences, got {n!r}")
        task = self.heldout if self.heldout is not None else self
        n = int(n)
        return task, (n if task.size is None else min(n, task.size))

    def public_shape(self, y: np.ndarray) -> np.ndarray:
        """(n, T, n_outputs) -> the shape target(x) returns."""
        return y[:, :, 0] if self.n_outputs == 1 else y

    def __repr__(self) -> str:
        return (f"Task({self.name!r}, seq_len={self.seq_len}, n_inputs={self.n_inputs}, "
                f"n_outputs={self.n_outputs}, output={self.output!r}, valid_from={self.valid_from})")


@dataclass(frozen=True)
class FreshBatch:
    """Sequences a model or program is judged on (Task.fresh_batch): task is the task they were
    drawn from (a data task's held-out part, or the task itself), y its targets (n, T, n_outputs)."""

    task: Task
    x: np.ndarray
    y: np.ndarray
    heldout: bool


@dataclass(frozen=True)
class FreshScore:
    """Task.score's figures on n fresh (or held-out) sequences."""

    score: dict
    n: int
    heldout: bool

    def describe(self) -> str:
        return f"{self.n} {'held-out' if self.heldout else 'fresh'} sequences"


def _check_magnitude(a: np.ndarray, label: str) -> None:
    big = np.abs(a) > MAX_MAGNITUDE
    if big.any():
        i = tuple(int(v) for v in np.argwhere(big)[0])
        raise TaskError(f"{label} has |value| {abs(float(a[i])):.3g} > {MAX_MAGNITUDE:g} at index {i}: "
                        f"the Discrete Transformer trains in float32; rescale the task")

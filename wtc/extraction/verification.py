"""verify: run a program on freshly sampled data and score it with the task's own metric."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from wtc import arguments
from wtc import tasks as task_registry
from wtc.errors import WtcError
from wtc.tasks.task import REAL_TOLERANCE, Task, TaskError


class Predictor(Protocol):
    """What verify compares a program with: anything with predict(x) -> outputs (a DiscreteTransformer)."""

    def predict(self, x: np.ndarray) -> np.ndarray: ...


class VerificationError(WtcError, ValueError):
    """The program cannot be verified here: it raised, or returned something that is not numbers
    (ProgramFailedError), it was read for another task, or the task's target is not a function of
    its inputs."""


class ProgramFailedError(VerificationError):
    """The program under verification raised on the fresh sequences, or returned something that is
    not numbers: the program is at fault, not the task (discover counts such a reading as failed)."""


@dataclass
class Verification:
    """A program scored on `n` fresh sequences: `accuracy` (integer tasks) or `max_rel_err` (real
    tasks), how often it agrees with the model it was read from, whether that `solved` the task,
    and for an any_length task the same check at twice the length (`longer`, `holds_longer`) and,
    where that holds, at four times (`longest`, `holds_longest`). Where each position takes one of
    a few symbols, `exhaustive` records the program against the target on every sequence up to a
    length (wtc.extraction.exhaustive); a program that fails there is not `solved`."""
    accuracy: float | None          # rounded accuracy on valid positions (integer tasks)
    max_rel_err: float              # max |pred - y| / (1 + |y|) on valid positions
    n: int                          # sequences
    agrees_with_model: float | None  # share of valid positions where program and model agree
    solved: bool
    seed: int | None = None
    longer: dict | None = None      # any_length tasks: the same check at twice the length (seq_len, accuracy,
                                    # max_rel_err, solved); None when the task has one length only
    longest: dict | None = None     # the same at four times the length (checked when `longer` holds)
    exhaustive: dict | None = None  # every sequence up to a length (wtc.extraction.exhaustive.check); None: not
                                    # checked (not a small finite domain, or the sampled check already failed)

    @property
    def holds_longest(self) -> bool | None:
        """Whether the program also solves the task at four times the training length (None: not checked)."""
        return None if self.longest is None else bool(self.longest["solved"])

    @property
    def exhaustive_ok(self) -> bool | None:
        """Whether the program matched the target on every enumerated sequence (None: not checked)."""
        return None if self.exhaustive is None else bool(self.exhaustive["solved"])

    @property
    def holds_longer(self) -> bool | None:
        """Whether the program also solves the task at twice the training length (None: not checked)."""
        return None if self.longer is None else bool(self.longer["solved"])

    def __str__(self) -> str:
        metric = (f"accuracy {self.accuracy:.4f}" if self.accuracy is not None
                  else f"max rel err {self.max_rel_err:.3g}")
        agree = "" if self.agrees_with_model is None else f", agrees with model on {self.agrees_with_model:.4f}"
        longer = ""
        for m in (self.longer, self.longest):
            if m is not None:
                got = f"accuracy {m['accuracy']:.4f}" if m["accuracy"] is not None else f"max rel err {m['max_rel_err']:.3g}"
                longer += f"; at T = {m['seq_len']}: {'holds' if m['solved'] else 'does NOT hold'} ({got})"
        if self.exhaustive is not None:
            from wtc.extraction.exhaustive import describe
            longer += f"; {describe(self.exhaustive)}"
        return f"{'verified' if self.solved else 'NOT verified'}: {metric} on {self.n} fresh sequences{agree}{longer}"


def agreement(task, a: np.ndarray, b: np.ndarray) -> float:
    """Share of valid positions where two predictions agree by the task's criterion."""
    a, b = task._as_3d(a, "a")[:, task.valid_from:], task._as_3d(b, "b")[:, task.valid_from:]
    if task.output == "integer":
        return float((np.round(a) == np.round(b)).mean())
    return float((np.abs(a - b) / (1 + np.abs(b)) <= REAL_TOLERANCE).mean())


def verify(program: Callable[[np.ndarray], np.ndarray], task: Task | str, n: int = 10000, seed: int | None = None,
           model: Predictor | None = None) -> Verification:
    """Score `program` (anything callable on (n, T[, k]) arrays) on n fresh sequences of `task`;
    a wtc Program must be the one read for this task. `model` (default: the program's own): a
    model with predict(), compared position by position. For an any_length task the program is
    also scored at twice seq_len (Verification.longer; `solved` is the training-length verdict)."""
    task = task_registry.get(task)
    if not callable(program):
        raise VerificationError(f"verify() takes a program (a callable on (n, T[, k]) arrays), got "
                                f"{type(program).__name__}")
    from wtc.extraction.program import Program
    if isinstance(program, Program) and program.task != task.name:
        raise VerificationError(f"this program was read for task {program.task!r}, not {task.name!r}: verify it on "
                                "its own task")
    n = arguments.positive_int(n, "n")
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**32))
    seed = arguments.seed(seed)
    fresh = task.fresh_batch(n, seed)     # a data task verifies on its held-out sequences
    task, x, y, n = fresh.task, fresh.x, fresh.y, len(fresh.x)
    _check_deterministic(task, x, y)
    pred = _run(program, x, task, n)
    score = task.score(pred, y)
    model = model if model is not None else getattr(program, "model", None)
    if model is not None and not callable(getattr(model, "predict", None)):
        raise VerificationError(f"model= must have a predict(x) method (a wtc DiscreteTransformer), got "
                                f"{type(model).__name__}")
    agree = agreement(task, pred, model.predict(x)) if model is not None else None
    longer = longest = None
    if task.any_length:                   # the program is a loop over T: it must hold beyond the training length
        longer = _at_length(program, task, 2, min(n, LONGER_SEQUENCES), seed)
        if longer is not None and longer["solved"]:
            longest = _at_length(program, task, 4, min(n, LONGEST_SEQUENCES), seed)
    exhaustive = None
    if score["solved"]:                   # a finite small domain: every sequence up to a length, not a sample
        from wtc.extraction.exhaustive import check
        exhaustive = check(program, task, x, _run, model)
    solved = bool(score["solved"]) and (exhaustive is None or exhaustive["solved"])
    return Verification(score.get("accuracy"), score["max_rel_err"], n, agree, solved, seed, longer, longest,
                        exhaustive)


def _at_length(program, task, factor: int, m: int, seed: int) -> dict | None:
    """The program scored on m fresh sequences at factor times the task's length (None: the task
    has no such length, as a pooled task holds twice its length only)."""
    try:
        long_task = task.at_length(factor * task.seq_len)
    except TaskError:
        if factor == 2:
            raise
        return None
    xl, yl = long_task.batch(np.random.default_rng([seed, factor]), m)
    out = {"seq_len": long_task.seq_len, "n": m, "accuracy": None, "max_rel_err": float("inf"), "solved": False}
    try:                              # a callable written for seq_len only is reported, not an error
        s = long_task.score(_run(program, xl, long_task, m), yl)
        out.update(accuracy=s.get("accuracy"), max_rel_err=s["max_rel_err"], solved=bool(s["solved"]))
    except (VerificationError, WtcError) as exc:
        out["error"] = str(exc)
    return out


LONGER_SEQUENCES = 2000   # sequences of the twice-as-long check
LONGEST_SEQUENCES = 1000  # sequences of the four-times-as-long check
RECHECKED_SEQUENCES = 256  # sequences of the draw whose targets are computed a second time


def _check_deterministic(task, x: np.ndarray, y: np.ndarray) -> None:
    """A target that keeps state or draws randomness scores every program as wrong; say so rather
    than report 'NOT verified' (Task.fingerprint checks this once, at the task's first use only)."""
    k = min(len(x), RECHECKED_SEQUENCES)
    again = task.targets(x[:k])
    same = (again == y[:k]) | (np.isnan(again) & np.isnan(y[:k]))
    if not same.all():
        i, t, o = (int(j) for j in np.argwhere(~same)[0])
        raise VerificationError(f"task {task.name!r}: the target is not a function of its inputs: it changed between "
                                f"two calls on the same {k} sequences (first at sequence {i}, position {t}: "
                                f"{y[i, t, o]:g}, then {again[i, t, o]:g}); a target must not keep state or draw "
                                "randomness, so no program can be verified against it")


def _run(program, x: np.ndarray, task, n: int) -> np.ndarray:
    from wtc.extraction.program import Program
    # a wtc Program is scored on what it computes on the task's fresh draws, which may reach values
    # its extraction sample did not (a held-out split, the edge of a range): scored, not refused
    options = {"domain": "ignore"} if isinstance(program, Program) else {}
    try:
        pred = program(x, **options)
    except Exception as exc:              # the program under test is the user's (or emitted) code
        raise ProgramFailedError(f"the program raised {type(exc).__name__} on {n} fresh sequences of "
                                 f"{task.name!r}: {exc}") from exc
    try:
        return np.asarray(pred, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProgramFailedError(f"the program returned {type(pred).__name__}, not numbers: {exc}") from None

"""Exhaustive verification where the input domain is finite and small.

A sample of 10000 sequences says little about a sequence that comes once in a million draws (a
carry chain through every position, a rare run of one symbol). Where each position takes one of a
few symbols, every sequence up to some length can be checked instead: all 2^13 bit sequences, all
10^4 digit sequences of length 4. `check` enumerates every sequence of each length from the first
scored position up to the longest length whose running count stays within MAX_SEQUENCES, runs the
program on them and compares it with the task's target (the ground truth), and with the model it
was read from where that is cheap (at the model's own length, if that length was enumerated).

Which tasks: those defined at every length with positions drawn independently (Task.any_length),
so that every sequence over the symbols is one the task can draw. The symbols are the distinct
per-position input tuples of the fresh draw verify makes (at most MAX_SYMBOLS of them). Tasks over
recorded or pooled sequences, fixed-length tasks (whose draws may cover only part of the product)
and tasks over many values are not checked (None): their verdict is the sampled one.
"""
from __future__ import annotations

import numpy as np

from wtc.errors import TaskError, WtcError
from wtc.tasks.limits import REAL_TOLERANCE

MAX_SYMBOLS = 64          # distinct per-position input tuples, at most
MAX_SEQUENCES = 2 ** 14   # sequences enumerated over all lengths together


def symbols(task, x: np.ndarray) -> np.ndarray | None:
    """The distinct per-position inputs of a draw x (n, T, k) as (S, k), or None when the task is
    not one exhaustive checking applies to (see the module docstring) or there are too many."""
    from wtc.tasks.pool import PoolTask
    if not task.any_length or task.size is not None or task.heldout is not None or isinstance(task, PoolTask):
        return None
    found = np.unique(x.reshape(-1, x.shape[-1]), axis=0)
    return found if len(found) <= MAX_SYMBOLS else None


def lengths(n_symbols: int, start: int, cap: int = MAX_SEQUENCES) -> list[int]:
    """The lengths start, start+1, ... whose sequence counts n_symbols^L sum to at most cap."""
    out, total, length = [], 0, start
    while n_symbols ** length + total <= cap:
        total += n_symbols ** length
        out.append(length)
        if n_symbols == 1:           # one sequence per length: stop at the cap's worth of lengths
            if len(out) >= 64:
                break
        length += 1
    return out


def every_sequence(alphabet: np.ndarray, length: int) -> np.ndarray:
    """All len(alphabet)^length sequences over the rows of alphabet (S, k), as (S^length, length, k)."""
    idx = np.indices((len(alphabet),) * length).reshape(length, -1).T
    return alphabet[idx]


def per_position_agreement(task, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, T): whether a and b (n, T, n_outputs) agree at each position by the task's criterion
    (every output; positions before valid_from count as agreeing)."""
    if task.output == "integer":
        same = np.round(a) == np.round(b)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            same = np.abs(a - b) / (1 + np.abs(b)) <= REAL_TOLERANCE
    same = same.all(axis=2)
    same[:, : task.valid_from] = True
    return same


def check(program, task, x: np.ndarray, run, model=None, cap: int = MAX_SEQUENCES) -> dict | None:
    """Program against target on every sequence over the symbols of the draw x, up to the longest
    length within `cap` sequences. `run(program, x, task, n)`: how verify runs a program (its
    errors are verify's). Returns None when the task is not checked, else a dict: max_length,
    lengths, symbols, sequences, agree, solved, first_wrong (length, inputs, position) or None,
    and model_sequences / model_agree (sequences at the model's length, and the share of them on
    which program and model agree; None when not compared), not_run_at (lengths other than the
    task's own where the program raised, as a callable written for one length does: skipped, not
    failed; at its own length that is a failure)."""
    alphabet = symbols(task, x)
    if alphabet is None:
        return None
    todo = lengths(len(alphabet), task.valid_from + 1, cap)
    if not todo:
        return None
    record = {"max_length": todo[-1], "lengths": todo, "symbols": len(alphabet), "sequences": 0, "agree": 0,
              "solved": True, "first_wrong": None, "model_sequences": 0, "model_agree": None, "not_run_at": []}
    for length in todo:
        xs = every_sequence(alphabet, length)
        try:
            at = task if length == task.seq_len else task.at_length(length)
            y = at.targets(xs)
        except TaskError:                  # the target refuses some sequence (a magnitude limit): no check there
            record["lengths"] = [L for L in record["lengths"] if L < length]
            break
        try:
            pred = at._as_3d(run(program, xs, at, len(xs)), "prediction")
        except WtcError as exc:
            if length != task.seq_len:     # a callable written for one length (as at 2T): reported, skipped
                record["not_run_at"].append(length)
                continue
            record["sequences"] += len(xs)  # at its own length the program raised on some sequence: a failure
            record["solved"] = False
            record["first_wrong"] = record["first_wrong"] or {"length": length, "error": str(exc)}
            break
        same = per_position_agreement(at, pred, y)
        ok = same.all(axis=1)
        record["sequences"] += len(xs)
        record["agree"] += int(ok.sum())
        if not ok.all() and record["first_wrong"] is None:
            i = int(np.argmin(ok))
            t = int(np.argmin(same[i]))
            record["first_wrong"] = {"length": length, "inputs": xs[i].tolist(), "position": t,
                                     "program": pred[i, t].tolist(), "target": y[i, t].tolist()}
        if model is not None and length == task.seq_len:
            try:
                theirs = at._as_3d(model.predict(xs), "model prediction")
            except (WtcError, RuntimeError, ValueError):   # a model that cannot take these: not compared
                continue
            record["model_sequences"] = len(xs)
            record["model_agree"] = float(per_position_agreement(at, pred, theirs).all(axis=1).mean())
    record["lengths"] = [L for L in record["lengths"] if L not in record["not_run_at"]]
    if not record["lengths"]:
        return None
    record["max_length"] = record["lengths"][-1]
    record["solved"] = record["solved"] and record["agree"] == record["sequences"]
    return record


def describe(record: dict | None) -> str:
    """'exhaustive up to length n: k/N agree' (and the model's share), or '' when not checked."""
    if record is None:
        return ""
    text = (f"exhaustive up to length {record['max_length']} ({record['symbols']} symbols): "
            f"{record['agree']}/{record['sequences']} sequences agree with the target")
    if record.get("model_agree") is not None:
        text += f", {record['model_agree']:.4f} of {record['model_sequences']} with the model"
    return text

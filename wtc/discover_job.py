"""discover's work on one rung of the ladder: train the population, read its best replicas out as
programs and verify them, within the call's deadline (the job protocol of wtc.dt.workers; it runs
in a worker process or in the caller's). Its result is typed (RungResult, Candidate) and crosses
between processes as JSON and a checkpoint (save_rung / load_rung), never as a pickle.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sympy as sp

from wtc.dt.attempt import Attempt, load_result, run_attempt, save_result, take_replica
from wtc.dt.scores import rank_key
from wtc.dt.config import DTConfig
from wtc.dt.ladder import Deadline
from wtc.dt.workers import milestone
from wtc.errors import CheckpointError
from wtc.progress import mode
from wtc.extraction import Line, Program, Reading, Verification, extract, verify
from wtc.extraction.formulas import ExtractionError, ExtractionTimeout
from wtc.extraction.verification import ProgramFailedError
from wtc.extraction.routing_rules import Rule

REPLICAS_TO_READ = 3
# A rung with no replica solved on fresh data reads its top replica only: in the benchmarks' records
# (bench/RESULTS.md, session 32: 175 such rungs of 26 tasks, integer and real, that read replicas)
# 12 verified, each at its first reading, and no second or third reading of the other 161 did,
# while each cost seconds (~11-14 s on a double prefix sum).
UNSOLVED_REPLICAS_TO_READ = 1
VERIFY_SEQUENCES = 10000
VERIFY_RESERVE_S = 2.0      # a reading must leave this much of the deadline for its verification
JUDGED_ON = "fresh draws from the task's callables"    # record["verified_on"] of a judged reading (judged)


@dataclass
class Candidate:
    """A replica and its reading: the program read out and its verification, or both None when the
    budget ran out before any replica of the rung was read (then the rung's top replica, kept so
    that a cut run still returns its model). replica_rank: its fresh-data rank key
    (wtc.dt.scores.rank_key)."""

    program: Program | None
    model: object
    history: object
    verification: Verification | None
    replica_rank: tuple

    @property
    def verified(self) -> bool:
        return bool(self.program is not None and self.verification.solved and self.program.ok)

    @property
    def key(self) -> tuple:
        """Readings compare by: verified, holds at twice the length (unknown counts as holding: a
        reading that holds there beats one that fits the training length only), every module read,
        the replica's own score, then the shorter program; an unread replica after every reading."""
        if self.program is None:
            return (False, False, False, tuple(self.replica_rank), -float("inf"))
        return (self.verified, self.verification.holds_longer is not False, self.program.ok,
                tuple(self.replica_rank), -self.program.n_lines)


@dataclass
class RungResult:
    """What a rung produced: its record (a row of the report's attempts table) and its best reading."""

    record: dict
    best: Candidate | None

    @property
    def verified(self) -> bool:
        return bool(self.record["verified"])

    @property
    def key(self) -> tuple | None:
        return None if self.best is None else self.best.key


def read_replicas(run: Attempt, scores: list[dict], record: dict, seed: int, opts: dict,
                  started: float, deadline: Deadline | None, count: int = REPLICAS_TO_READ) -> Candidate | None:
    """Read the best `count` replicas (UNSOLVED_REPLICAS_TO_READ when none is solved) in rank
    order, verify each, stop at the first that verifies and holds at twice the length; each
    reading gets the time left before the deadline (less VERIFY_RESERVE_S), and none starts after
    it. A pooled task whose user's task this process holds (PoolTask.origin) is verified with the
    user's callables as the judge would (judged), not on the pool first and then again. Returns
    the best reading, or None."""
    task, attempt = run.task, run.attempt
    judge = getattr(task, "origin", None)
    order = sorted(range(len(scores)), key=lambda i: rank_key(task, scores[i]), reverse=True)
    if not any(s["solved"] for s in scores):
        count = min(count, UNSOLVED_REPLICAS_TO_READ)
    best = None
    for r in order[:count]:
        if deadline is not None and deadline.left() <= VERIFY_RESERVE_S:
            record["cut"] = f"the budget ran out before replica {r} was read"
            break
        model, history = take_replica(run, r)
        try:
            program = extract(model, task, seed=seed + attempt,
                              deadline=None if deadline is None else deadline.end - VERIFY_RESERVE_S)
        except ExtractionTimeout:
            record["cut"] = f"the budget ran out while replica {r} was read"
            break
        except ExtractionError as exc:       # reported, and the search goes on
            record.setdefault("errors", []).append(f"replica {r}: {exc}")
            continue
        on, at = ((judge, _judge_seed(seed, attempt)) if judge is not None
                  else (task, int(np.random.default_rng([seed, attempt, r]).integers(2**31))))
        try:
            ver = verify(program, on, n=VERIFY_SEQUENCES, seed=at)
        except ProgramFailedError as exc:    # a reading that fails on fresh data: reported, the search goes on
            record.setdefault("errors", []).append(f"replica {r}: {exc}")
            milestone(opts, f"{task.name} attempt {attempt}: replica {r} read ({program.n_lines} lines), "
                            f"not verified: {exc}")
            continue
        found = Candidate(program, model, history, ver, rank_key(task, scores[r]))
        milestone(opts, f"{task.name} attempt {attempt}: replica {r} read ({program.n_lines} lines), "
                        f"{'verified' if found.verified else 'not verified'}"
                        f"{'' if ver.holds_longer is not False else ' (does not hold at twice the length)'} "
                        f"({time.perf_counter() - started:.0f}s)")
        record["replicas_read"] += 1
        record.setdefault("holds_longer", []).append(ver.holds_longer)
        if best is None or found.key > best.key:
            best = found
        if found.verified:
            record["verified"] = True
            if ver.holds_longer is not False:    # else the rung's next replicas may read as one that holds
                break
    return best


def _judge_seed(seed: int, attempt: int) -> int:
    return int(np.random.default_rng([seed, attempt, 7]).integers(2**31))


def judged(result: RungResult, task, seed: int, read_so: bool = False) -> RungResult:
    """A pooled rung's best reading verified again with the task's own callables on fresh draws
    (and at twice the length): the pool only chose which replica to read. Done where the user's
    task is at hand: in the worker forked from the caller (PoolTask.origin), else in the caller.
    read_so: the reading was verified so already (read_replicas, in a job holding the task): its
    verification is the verdict, not repeated."""
    best = result.best
    if best is None or best.program is None:
        return result
    try:
        ver = best.verification if read_so else verify(best.program, task, n=VERIFY_SEQUENCES,
                                                       seed=_judge_seed(seed, result.record["attempt"]))
    except ProgramFailedError as exc:      # no verdict but "not verified"; the model is kept, as unread
        record = {**result.record, "verified": False, "verified_on": JUDGED_ON,
                  "errors": [*result.record.get("errors", []), f"the reading judged: {exc}"]}
        return RungResult(record, Candidate(None, best.model, best.history, None, best.replica_rank))
    record = {**result.record, "verified": bool(ver.solved and best.program.ok), "verified_on": JUDGED_ON,
              "holds_longer": [ver.holds_longer]}
    return RungResult(record, dataclasses.replace(best, verification=ver))


def _better(a: Candidate | None, b: Candidate | None) -> Candidate | None:
    """The better of two readings (Candidate.key), either may be None."""
    return a if b is None or (a is not None and a.key >= b.key) else b


class DiscoverJob:
    """discover's work on one rung (the job protocol of wtc.dt.workers). opts: progress,
    milestones, deadline (Deadline.to_json)."""

    @staticmethod
    def result_path(opts: dict, attempt: int) -> None:
        return None             # nothing is kept: discover does not resume

    @staticmethod
    def finished(task, rung, seed: int, opts: dict, path) -> None:
        return None

    @staticmethod
    def run(task, rung, seed: int, opts: dict, path: Path | None) -> RungResult:
        started = time.perf_counter()
        attempt = rung.attempt
        deadline = Deadline.from_json(opts.get("deadline"))
        run = Attempt(task, rung.config, seed, attempt, settle=True, read_close=True)
        milestone(opts, f"{task.name} attempt {attempt} ({rung.label}): training")
        record = {"attempt": attempt, "label": rung.label, "replicas": rung.config.replicas, "replicas_read": 0,
                  "verified": False}
        best = None
        while True:
            scores = run_attempt(run, mode(opts), deadline=deadline)
            solved = sum(bool(s["solved"]) for s in scores)
            record["replicas_solved"] = solved
            if run.resume_from is None:
                milestone(opts, f"{task.name} attempt {attempt}: {solved}/{len(scores)} replicas solved "
                                f"({time.perf_counter() - started:.0f}s); reading the best ones out")
                best = _better(best, read_replicas(run, scores, record, seed, opts, started, deadline))
                break
            # ended at a close check (wtc.dt.settle.Check.worth_reading): a reading of its best replica decides
            step = run.hard_from
            milestone(opts, f"{task.name} attempt {attempt}: close at step {step}, {solved}/{len(scores)} replicas "
                            f"solved ({time.perf_counter() - started:.0f}s); reading the best one out")
            best = _better(best, read_replicas(run, scores, record, seed, opts, started, deadline, count=1))
            record["read_at_step"] = step
            if record["verified"] or "cut" in record:
                break
            milestone(opts, f"{task.name} attempt {attempt}: not verified at step {step}; training on")
            run = run.resume_from
        for key in ("stopped_at_step", "settled_at_step", "settled_by"):
            if key in run.history.final:
                record[key] = run.history.final[key]
        if best is None:             # nothing read (cut, or every reading failed): keep the top replica
            top = max(range(len(scores)), key=lambda i: rank_key(task, scores[i]))
            model, history = take_replica(run, top)
            best = Candidate(None, model, history, None, rank_key(task, scores[top]))
        result = RungResult(record, best)
        if getattr(task, "origin", None) is not None:
            result = judged(result, task.origin, seed, read_so=True)
        result.record["seconds"] = time.perf_counter() - started
        if path is not None:
            save_rung(path, result, task, seed, attempt, rung.config)
        return result

    @staticmethod
    def load(path: Path, task, rung, seed: int) -> RungResult:
        return load_rung(path, task, seed, rung.attempt, rung.config)


# ---------------------------------------------------------------------- a rung's result on disk
def plain_json(value):
    """numpy scalars (in rule parameters and scores) as the Python numbers JSON knows."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def program_to_dict(program: Program) -> dict:
    """Everything of a Program but its model; sympy expressions exactly (srepr)."""
    lines = [{"name": ln.name, "kind": ln.kind, "source": ln.source, "comment": ln.comment,
              "rule": dataclasses.asdict(ln.rule) if ln.rule is not None else None,
              "expr": sp.srepr(ln.expr) if ln.expr is not None else None} for ln in program.lines]
    out = {"task": program.task, "source": program.source, "seq_len": program.seq_len,
           "n_inputs": program.n_inputs, "n_outputs": program.n_outputs, "ok": program.ok,
           "failures": list(program.failures), "outputs": [sp.srepr(e) for e in program.outputs],
           "lines": lines, "readings": [dataclasses.asdict(r) for r in program.readings]}
    domain = getattr(program, "domain", None)
    if domain is not None:
        out["domain"] = domain.to_dict()
    return out


def _expression(text: str) -> sp.Expr:
    """An srepr back to the expression, wtc.sr's own functions included: sympy's sympify reads
    "Ge" as its relational GreaterThan (refused inside a Mul: `2*(x >= 5)` failed to load) and
    "FloorDiv" and "In" as undefined functions."""
    from wtc.sr.expr import Eq, FloorDiv, Ge, In
    return sp.sympify(text, locals={"Ge": Ge, "Eq": Eq, "FloorDiv": FloorDiv, "In": In})


def program_from_dict(d: dict, model=None) -> Program:
    lines = [Line(ln["name"], ln["kind"], ln["source"], Rule(**ln["rule"]) if ln["rule"] else None,
                  _expression(ln["expr"]) if ln["expr"] is not None else None, ln["comment"]) for ln in d["lines"]]
    extra = {}
    if d.get("domain") is not None:       # programs saved before domains were recorded have none
        from wtc.extraction.domain import Domain
        extra["domain"] = Domain.from_dict(d["domain"])
    return Program(d["task"], d["source"], d["seq_len"], d["n_inputs"], d["n_outputs"], lines,
                   [_expression(e) for e in d["outputs"]], ok=d["ok"], failures=list(d["failures"]),
                   readings=[Reading(**r) for r in d["readings"]], model=model, **extra)


def save_rung(path: Path, result: RungResult, task, seed: int, attempt: int, config: DTConfig) -> None:
    """A DiscoverJob result: <path>.json (record, program, verification) and the model and
    history beside it (<path>_model, wtc.dt.attempt.save_result); the JSON is written last."""
    meta = {"task": task.name, "task_sha256": task.fingerprint(), "seed": seed, "attempt": attempt,
            "config": config.to_dict(), "record": result.record, "best": None}
    best = result.best
    if best is not None:
        save_result(Path(f"{path}_model"), best.replica_rank, best.model, best.history)
        meta["best"] = {"replica_rank": list(best.replica_rank),
                        "program": None if best.program is None else program_to_dict(best.program),
                        "verification": None if best.verification is None else dataclasses.asdict(best.verification)}
    tmp = Path(f"{path}.json.tmp")
    tmp.write_text(json.dumps(meta, default=plain_json))
    os.replace(tmp, Path(f"{path}.json"))


def load_rung(path: Path, task, seed: int, attempt: int, config: DTConfig) -> RungResult:
    """The RungResult written by save_rung for this task, seed, attempt and rung config."""
    try:
        meta = json.loads(Path(f"{path}.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read the result of {task.name} attempt {attempt}: {exc}") from exc
    if (meta["task"], meta["seed"], meta["attempt"], meta["config"]) != (task.name, seed, attempt, config.to_dict()):
        raise CheckpointError(f"{path}.json: result of another run ({meta['task']!r}, seed {meta['seed']}, "
                              f"attempt {meta['attempt']})")
    b = meta["best"]
    if b is None:
        return RungResult(meta["record"], None)
    _, model, history = load_result(Path(f"{path}_model"), task, seed, attempt, config)
    program = None if b["program"] is None else program_from_dict(b["program"], model)
    ver = None if b["verification"] is None else Verification(**b["verification"])
    return RungResult(meta["record"], Candidate(program, model, history, ver, tuple(b["replica_rank"])))

"""discover: train -> extract -> verify, retried within a time budget.

Each attempt trains a population of Discrete Transformers (wtc.dt), reads the best replicas out as
programs (wtc.extraction) and verifies them on fresh data. Attempts climb a ladder of configurations (DTConfig.rung)
(3-input sub-MLPs for three-way operators such as a windowed maximum; aggregate heads for prefix
sums, counts and means; a second layer of sub-MLPs for chained operators; pointer heads in both
layers; then the same again with new seeds) until a program verifies or the budget is spent. The result
is the verified program, or an honest failure with the best attempt's evidence.

Rungs run in waves of DTConfig.workers (one per core by default) in worker processes
(wtc.dt.workers; built-in tasks only, user tasks run here one rung after another); a worker
trains, reads and verifies its rung (DiscoverJob) and hands back the attempt record and its best
reading, the program serialised (save_rung / load_rung). The winner is the sequential loop's:
the first attempt in index order whose program verifies, else the best reading (wtc.dt.ladder).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sympy as sp

from wtc import arguments
from wtc import tasks as task_registry
from wtc.tasks import TaskError, probe
from wtc.dt.attempt import Attempt, load_result, rank_key, run_attempt, save_result, take_replica
from wtc.dt.config import ConfigError, ConfigTypeError, DTConfig
from wtc.dt.ladder import check_budget, climb
from wtc.dt.workers import milestone, run_wave, task_reference, worker_count
from wtc.errors import CheckpointError, WtcError
from wtc.extraction import Line, Program, Reading, Verification, extract, verify
from wtc.extraction.reader import ExtractionError
from wtc.extraction.routing_rules import Rule

DEFAULT_BUDGET_S = 600.0
REPLICAS_TO_READ = 3
PERIODS = (2, 3, 4, 5, 6)   # periodic units when the probe sees oscillation: every residue mod 2..6
JOB = "wtc.discovery:DiscoverJob"


class DiscoveryError(WtcError, ValueError):
    """A Discovery was asked for something it cannot do (e.g. saved to a file, not a directory)."""


@dataclass
class Discovery:
    task: object
    program: object | None
    model: object | None
    history: object | None
    verification: object | None
    seconds: float
    attempts: list[dict] = field(default_factory=list)
    dependence: object | None = None        # what the target was found to read (wtc.tasks.probe), if probed

    @property
    def solved(self) -> bool:
        return bool(self.verification is not None and self.verification.solved and self.program is not None
                    and self.program.ok)

    def summary(self) -> dict:
        v = self.verification
        return {"task": self.task.name, "solved": self.solved, "seconds": round(self.seconds, 1),
                "program_lines": self.program.n_lines if self.program else None,
                "accuracy": v.accuracy if v else None, "max_rel_err": v.max_rel_err if v else None,
                "agrees_with_model": v.agrees_with_model if v else None,
                "holds_at_twice_the_length": v.holds_longer if v else None,
                "failures": self.program.failures if self.program else ["no model was trained"],
                "depends_on": self.dependence.describe() if self.dependence is not None else None,
                "diagnosis": None if self.solved else self.diagnosis(),
                "attempts": self.attempts}

    def report(self, plot: str | None = None) -> str:
        """Markdown: verdict, program, per-module evidence, training dynamics."""
        t = self.task
        out = [f"# {t.name}", "", f"*{t.description}*", ""]
        out.append(f"**{'Solved' if self.solved else 'Not solved'}** in {self.seconds:.0f} s "
                   f"({len(self.attempts)} attempt(s)). Best program: {self.verification or 'none'}")
        if self.dependence is not None:
            out += ["", f"Probed as a black box, the target reads {self.dependence.describe()}."]
        if self.program is not None:
            if self.program.failures:
                if self.verification is not None and self.verification.solved:
                    out += ["", "The program scores on fresh data, but it is not accepted: parts of it are not "
                            "what the model does (below), so it would be a guess, not a reading."]
                out += ["", "Modules that could not be read:", ""] + [f"- {f}" for f in self.program.failures]
            out += ["", "## Program", "", "```python", self.program.source.rstrip(), "```", "",
                    "## Modules", "", "| module | kind | program name | reads | reading | evidence |",
                    "|---|---|---|---|---|---|"]
            for r in self.program.readings:
                cells = [r.module, r.kind, r.name or "-", r.reads, r.finding.replace("|", "\\|"), r.evidence]
                out.append("| " + " | ".join(str(c) for c in cells) + " |")
        out += ["", "## Attempts", "", "| # | configuration | replicas solved | read | verified | seconds |",
                "|---|---|---|---|---|---|"]
        for a in self.attempts:
            out.append(f"| {a['attempt']} | {a['label']} | {a['replicas_solved']}/{a['replicas']} | "
                       f"{a['replicas_read']} | {a['verified']} | {a['seconds']:.0f} |")
        if not self.solved:
            out += ["", "## Why it is not solved", ""] + [f"- {line}" for line in self.diagnosis()]
        if plot:
            out += ["", "## Training dynamics", "", f"![training]({plot})", "",
                    "Loss falls (functional convergence) before the selection and attention entropies "
                    "collapse (structural discretization)."]
        return "\n".join(out) + "\n"

    def position_scores(self, n: int = 2000) -> list[float] | None:
        """Per output position, the best model's accuracy (integer tasks) or share within the
        tolerance (real tasks) on fresh sequences; None without a model."""
        if self.model is None:
            return None
        task, n = self.task.verification(n)
        x, y = task.batch(np.random.default_rng(4242), n)
        pred = task._as_3d(self.model.predict(x), "prediction")
        hit = (np.round(pred) == y) if task.output == "integer" else (np.abs(pred - y) / (1 + np.abs(y)) <= 1e-3)
        return [float(v) for v in hit.all(axis=2).mean(axis=0)]

    def diagnosis(self) -> list[str]:
        """Plain lines for a failure: what was tried, what the best model gets right per position,
        and which kind of algorithm seems to be missing (from what the target reads)."""
        lines = []
        tried = sorted({a["label"] for a in self.attempts})
        lines.append(f"Tried {len(self.attempts)} attempt(s): {', '.join(tried) or 'none'}.")
        scores = self.position_scores()
        if scores is not None:
            t0 = self.task.valid_from
            shown = ", ".join(f"t={t}: {v:.2f}" for t, v in enumerate(scores) if t >= t0)
            lines.append(f"The best model, per output position on fresh data: {shown}.")
            if min(scores[t0:]) == 1.0 and self.program is not None and self.program.failures:
                lines.append("The model computes the task; parts of it could not be read as a program (Modules above).")
        dep = self.dependence
        if dep is not None:
            if any(dep.prefix):
                lines.append("The target reads the whole prefix. Aggregate heads read prefix means and sums "
                             "(so counts, and sums of sums in two layers); a prefix maximum or minimum, a count modulo k or a recurrence on the outputs "
                             "needs an operator on the running value that no fixed-depth reading found here.")
            if dep.pointer_routes > 3 and not any(dep.prefix):
                lines.append(f"The target reads {dep.pointer_routes} offsets besides the current value; discover "
                             f"started with that many pointer heads.")
        elif self.task.size is not None:
            lines.append("A data task is not probed (its target answers only for recorded sequences).")
        if scores is not None and max(scores[self.task.valid_from:]) < 0.5:
            lines.append("No attempt learned the function; a larger budget (more attempts up the ladder) may help.")
        return lines

    def save(self, directory) -> Path:
        """program.py, report.md, training.png, model/ (checkpoint), summary.json."""
        from wtc.dt import checkpoint

        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise DiscoveryError(f"save() takes a directory path, got {type(directory).__name__} {directory!r}")
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise DiscoveryError(f"save(): {str(d)!r} exists and is not a directory")
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DiscoveryError(f"save(): cannot create {str(d)!r}: {exc.strerror or exc}") from None
        plot = None
        if self.history is not None and len(self.history):
            plot = self.history.plot(d / "training.png") and "training.png"
        if self.program is not None:
            (d / "program.py").write_text(self.program.source)
        if self.model is not None:
            checkpoint.save(self.model, d / "model", extra=getattr(self.model, "train_info", {}))
        (d / "report.md").write_text(self.report(plot))
        (d / "summary.json").write_text(json.dumps(self.summary(), indent=2, default=str))
        return d


def discover(task, seed: int = 0, budget_s: float | None = None, progress: bool = True,
             config: DTConfig | None = None, *, prestarted=None) -> Discovery:
    """Train, extract and verify until a program verifies or the budget (default 600 s) is spent.

    budget_s must be a finite positive number of seconds. A new wave of attempts starts only if
    the time left covers the longest wave so far, and training stops when the budget is spent
    (that attempt is finished and read as it stands; its record says stopped_at_step). A
    given `config` also caps the attempts at its max_attempts; without one, attempts go on until
    the budget is spent. prestarted: worker interpreters already started (wtc.worker_pool; the
    CLI opens them before its own imports), used by the first wave.
    """
    task = task_registry.get(task)
    budget = DEFAULT_BUDGET_S if budget_s is None else check_budget(budget_s)
    seed = arguments.seed(seed, error=ConfigError)
    if config is not None and not isinstance(config, DTConfig):
        raise ConfigTypeError(f"config must be a wtc.DTConfig or None, got {type(config).__name__} {config!r}")
    try:
        dep = probe.dependence(task, seed) if config is None else None
    except TaskError:                       # a target that refuses mixed inputs: no probe, default size
        dep = None
    base = DTConfig() if config is None else config
    if dep is not None:
        base, why = sized_for(base, dep)
        if progress and why:
            print(f"{task.name}: the target reads {dep.describe()}: {why}", flush=True)
    base.check_size(task.seq_len, task.n_inputs)
    task_ref = task_reference(task)
    t0 = time.perf_counter()
    deadline = time.time() + budget

    def solved(result) -> bool:
        return result[0]["verified"]

    def wave(rungs):
        first = rungs[0].attempt == 0
        results = run_wave(JOB, task, task_ref, rungs, seed, {"progress": progress, "deadline": deadline},
                           solved=solved, prestarted=prestarted if first else None)
        if progress:
            used = True   # False after a verified attempt: later ones that ran alongside are dropped
            for rung in rungs:
                if rung.attempt not in results:
                    print(f"{task.name} attempt {rung.attempt} ({rung.label}): stopped, an earlier attempt "
                          f"verified", flush=True)
                    continue
                record = results[rung.attempt][0]
                print(f"{task.name} attempt {rung.attempt} ({rung.label}): {record['replicas_solved']}/"
                      f"{record['replicas']} replicas solved, program "
                      f"{'verified' if record['verified'] else 'not verified'} ({record['seconds']:.0f}s)"
                      + ("" if used else "; not used: an earlier attempt verified"), flush=True)
                used = used and not record["verified"]
        return results

    cap = None if config is None else config.max_attempts
    best, ran = climb(base, wave, workers=worker_count(base, task_ref, cap=cap), solved=solved,
                      key=lambda r: r[1][0] if r[1] is not None else None, budget_s=budget, max_attempts=cap,
                      name=task.name, progress=progress)
    attempts = [record for _, (record, _) in ran]
    if best is None:
        return Discovery(task, None, None, None, None, time.perf_counter() - t0, attempts, dep)
    _, program, model, history, ver = best[1]
    return Discovery(task, program, model, history, ver, time.perf_counter() - t0, attempts, dep)


def sized_for(config: DTConfig, dep) -> tuple[DTConfig, str]:
    """The default architecture grown to what the probe found: a pointer head per offset to route
    (when there are more than it has), aggregate heads from the start when outputs read the whole
    prefix (instead of two rungs later), periodic sub-MLP units when the output oscillates in an
    input it reads (parity, residues, digit tables: no bounded stack of ReLUs has the kinks), and
    sub-MLPs that read as many inputs as interact (a one-layer model sums parts of at most
    mlp_inputs inputs: a majority of five is no such sum). Returns (config, what changed and why,
    or "")."""
    changes, why = {}, []
    routes = dep.pointer_routes
    if routes > max(config.n_heads):
        changes["n_heads"] = routes
        why.append(f"{routes} pointer heads, one per offset")
    if any(dep.prefix) and max(config.n_agg_heads) == 0:
        changes["n_agg_heads"] = 2
        why.append("aggregate heads from the first attempt")
    if dep.oscillating and not config.mlp_periods:
        changes["mlp_periods"] = PERIODS
        why.append(f"periodic sub-MLP units (periods {', '.join(map(str, PERIODS))})")
    if dep.order > max(config.mlp_inputs, 3):      # three: the ladder's second rung has them anyway
        changes["mlp_inputs"] = dep.order
        why.append(f"{dep.order}-input sub-MLPs ({dep.order} inputs interact)")
    if not changes:
        return config, ""
    return config.replace(**changes), "starting with " + " and ".join(why)


class DiscoverJob:
    """discover's work on one rung (the job protocol of wtc.dt.workers): train the population, read
    its best REPLICAS_TO_READ replicas as programs and verify each, stopping at the first that
    verifies. Result: (record, best), best = (key, program, model, history, verification) of the
    rung's best reading, or None when no replica could be read. opts: progress."""

    @staticmethod
    def result_path(opts: dict, attempt: int) -> None:
        return None             # nothing is kept: discover does not resume

    @staticmethod
    def finished(task, rung, seed: int, opts: dict, path) -> None:
        return None

    @staticmethod
    def run(task, rung, seed: int, opts: dict, path: Path | None):
        started = time.perf_counter()
        attempt = rung.attempt
        run = Attempt(task, rung.config, seed, attempt)
        milestone(opts, f"{task.name} attempt {attempt} ({rung.label}): training")
        scores = run_attempt(run, opts.get("progress", False), deadline=opts.get("deadline"))
        milestone(opts, f"{task.name} attempt {attempt}: {sum(bool(s['solved']) for s in scores)}/{len(scores)} "
                        f"replicas solved ({time.perf_counter() - started:.0f}s); reading the best ones out")
        order = sorted(range(len(scores)), key=lambda i: rank_key(task, scores[i]), reverse=True)
        record = {"attempt": attempt, "label": rung.label, "replicas": len(scores),
                  "replicas_solved": sum(bool(s["solved"]) for s in scores), "replicas_read": 0,
                  "verified": False}
        if "stopped_at_step" in run.history.final:
            record["stopped_at_step"] = run.history.final["stopped_at_step"]
        best = None
        for r in order[:REPLICAS_TO_READ]:
            model, history = take_replica(run, r)
            try:
                program = extract(model, task, seed=seed + attempt)
            except ExtractionError as exc:       # reported, and the search goes on
                record.setdefault("errors", []).append(f"replica {r}: {exc}")
                continue
            ver = verify(program, task, n=10000, seed=int(np.random.default_rng([seed, attempt, r]).integers(2**31)))
            milestone(opts, f"{task.name} attempt {attempt}: replica {r} read ({program.n_lines} lines), "
                            f"{'verified' if ver.solved and program.ok else 'not verified'}"
                            f"{'' if ver.holds_longer is not False else ' (does not hold at twice the length)'} "
                            f"({time.perf_counter() - started:.0f}s)")
            record["replicas_read"] += 1
            # a reading that also holds at twice the length beats one that fits the training length only
            holds = ver.holds_longer is not False
            record.setdefault("holds_longer", []).append(ver.holds_longer)
            key = (ver.solved and program.ok, holds, program.ok, rank_key(task, scores[r]), -program.n_lines)
            if best is None or key > best[0]:
                best = (key, program, model, history, ver)
            if ver.solved and program.ok:
                record["verified"] = True
                if holds:          # else the rung's next replicas may read as one that holds
                    break
        record["seconds"] = time.perf_counter() - started
        if path is not None:
            save_rung(path, (record, best), task, seed, attempt, rung.config)
        return record, best

    @staticmethod
    def load(path: Path, task, rung, seed: int):
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
    return {"task": program.task, "source": program.source, "seq_len": program.seq_len,
            "n_inputs": program.n_inputs, "n_outputs": program.n_outputs, "ok": program.ok,
            "failures": list(program.failures), "outputs": [sp.srepr(e) for e in program.outputs],
            "lines": lines, "readings": [dataclasses.asdict(r) for r in program.readings]}


def _expression(text: str) -> sp.Expr:
    """An srepr back to the expression, wtc.sr's own functions included: sympy's sympify reads
    "Ge" as its relational GreaterThan (refused inside a Mul: `2*(x >= 5)` failed to load) and
    "FloorDiv" and "In" as undefined functions."""
    from wtc.sr.expr import Eq, FloorDiv, Ge, In
    return sp.sympify(text, locals={"Ge": Ge, "Eq": Eq, "FloorDiv": FloorDiv, "In": In})


def program_from_dict(d: dict, model=None) -> Program:
    lines = [Line(ln["name"], ln["kind"], ln["source"], Rule(**ln["rule"]) if ln["rule"] else None,
                  _expression(ln["expr"]) if ln["expr"] is not None else None, ln["comment"]) for ln in d["lines"]]
    return Program(d["task"], d["source"], d["seq_len"], d["n_inputs"], d["n_outputs"], lines,
                   [_expression(e) for e in d["outputs"]], ok=d["ok"], failures=list(d["failures"]),
                   readings=[Reading(**r) for r in d["readings"]], model=model)


def save_rung(path: Path, result, task, seed: int, attempt: int, config: DTConfig) -> None:
    """A DiscoverJob result: <path>.json (record, key, program, verification) and the model and
    history beside it (<path>_model, wtc.dt.attempt.save_result); the JSON is written last."""
    record, best = result
    meta = {"task": task.name, "task_sha256": task.fingerprint(), "seed": seed, "attempt": attempt,
            "config": config.to_dict(), "record": record,
            "best": None}
    if best is not None:
        key, program, model, history, ver = best
        save_result(Path(f"{path}_model"), key[3], model, history)
        meta["best"] = {"key": [key[0], key[1], key[2], list(key[3]), key[4]], "program": program_to_dict(program),
                        "verification": dataclasses.asdict(ver)}
    tmp = Path(f"{path}.json.tmp")
    tmp.write_text(json.dumps(meta, default=plain_json))
    os.replace(tmp, Path(f"{path}.json"))


def load_rung(path: Path, task, seed: int, attempt: int, config: DTConfig):
    """(record, best) written by save_rung for this task, seed, attempt and rung config."""
    try:
        meta = json.loads(Path(f"{path}.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read the result of {task.name} attempt {attempt}: {exc}") from exc
    if (meta["task"], meta["seed"], meta["attempt"], meta["config"]) != (task.name, seed, attempt, config.to_dict()):
        raise CheckpointError(f"{path}.json: result of another run ({meta['task']!r}, seed {meta['seed']}, "
                              f"attempt {meta['attempt']})")
    b = meta["best"]
    if b is None:
        return meta["record"], None
    _, model, history = load_result(Path(f"{path}_model"), task, seed, attempt, config)
    k = b["key"]
    key = (k[0], k[1], k[2], tuple(k[3]), k[4])
    program = program_from_dict(b["program"], model)
    return meta["record"], (key, program, model, history, Verification(**b["verification"]))

"""discover: train -> extract -> verify, retried within a time budget.

Each attempt trains a population of Discrete Transformers (wtc.dt), reads the best replicas out as
programs (wtc.extraction) and verifies them on fresh data. Attempts climb a ladder of configurations (DTConfig.rung)
(3-input sub-MLPs for three-way operators such as a windowed maximum; aggregate heads for prefix
sums, counts and means; a second layer of sub-MLPs for chained operators; pointer heads in both
layers; then the same again with new seeds) until a program verifies or the budget is spent. The result
is the verified program, or an honest failure with the best attempt's evidence.

The configuration is resolved once (plan: the probe of what the target reads sizes the first rung).
Rungs run DTConfig.workers at a time (one per core by default; the next starts when one finishes)
in worker processes (wtc.dt.workers), every kind of task: built-in tasks by name, data tasks from
their records, callable tasks from a pool drawn here (wtc.tasks.pool). A rung's work is
wtc.discover_job (DiscoverJob: train, read, verify, within the deadline). The winner is the
sequential loop's: the first attempt in index order whose program verifies, else the best reading
(wtc.dt.ladder).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wtc import arguments, provenance
from wtc import tasks as task_registry
from wtc.discover_job import (JUDGED_ON, REPLICAS_TO_READ, RungResult, judged, plain_json,  # noqa: F401
                              program_from_dict, program_to_dict)    # REPLICAS_TO_READ and the last three re-exported
from wtc.dt.config import ConfigError, ConfigTypeError, DTConfig
from wtc.dt.periodic import periodic_sizing
from wtc.dt.ladder import READ_SHARE, Deadline, check_budget, climb, margin_s
from wtc.dt.recency import recent_layout
from wtc.dt.running import step_layout
from wtc.dt.workers import JobTask, job_task, run_ladder, worker_count
from wtc.errors import WtcError
from wtc.progress import enable, log
from wtc.tasks import TaskError, probe
from wtc.tasks.task import REAL_TOLERANCE

if TYPE_CHECKING:                      # annotations only (the model classes import torch)
    from wtc.dt.history import History
    from wtc.dt.model import DiscreteTransformer
    from wtc.extraction import Program, Verification
    from wtc.provenance import RunRecord
    from wtc.tasks.probe import Dependence
    from wtc.tasks.task import Task
    from wtc.worker_pool import Prestarted

DEFAULT_BUDGET_S = 600.0
PERIODS = (2, 3, 4, 5, 6)   # periodic units when the probe sees oscillation: every residue mod 2..6
JOB = "wtc.discover_job:DiscoverJob"
SIZED_FIELDS = ("n_heads", "n_agg_heads", "agg_ops", "mlp_periods", "mlp_inputs")   # what sized_for may grow


class DiscoveryError(WtcError, ValueError):
    """A Discovery was asked for something it cannot do (e.g. saved to a file, not a directory)."""


@dataclass
class Discovery:
    """What `discover` found: the task, the best `program` (a `Program`, or None), the `model` it was
    read from and its training `history`, the program's `verification` on fresh data, the
    `seconds` taken, every attempt tried (`attempts`, and in `cut` those the budget stopped), what
    the probe found the target reads (`dependence`), the `budget_s` it ran under and what the run
    was (`run`: wtc version, seed, configuration, task fingerprint, machine). `solved`,
    `summary()`, `report()`, `diagnosis()`, `budget_notes()` and `save(directory)` read it."""
    task: Task
    program: Program | None
    model: DiscreteTransformer | None
    history: History | None
    verification: Verification | None
    seconds: float
    attempts: list[dict] = field(default_factory=list)
    dependence: Dependence | None = None       # what the target was found to read (wtc.tasks.probe), if probed
    cut: list[dict] = field(default_factory=list)   # attempts stopped at the budget before they finished
    budget_s: float | None = None
    run: RunRecord | None = None               # what the run was: version, seed, config, task fingerprint, machine
    sizing: str = ""                           # what the probe's evidence changed in the first architecture, and why

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
                "holds_at_four_times_the_length": v.holds_longest if v else None,
                "exhaustive": v.exhaustive if v else None,
                "failures": self.program.failures if self.program else ["no model was trained"],
                "depends_on": self.dependence.describe() if self.dependence is not None else None,
                "sizing": self.sizing or None,
                "diagnosis": None if self.solved else self.diagnosis(),
                "budget_s": self.budget_s, "budget_cut": self.budget_notes(),
                "domain": self.program.domain.to_dict() if getattr(self.program, "domain", None) else None,
                "attempts": self.attempts,
                **({k: v for k, v in self.run.to_dict().items() if k != "task"} if self.run is not None else {})}

    def budget_notes(self) -> list[str]:
        """What the budget cut short, in plain lines (empty when nothing was)."""
        notes = [f"attempt {a['attempt']} ({a['label']}): training stopped at the budget at step {a['stopped_at_step']}"
                 for a in self.attempts if a.get("stopped_at_step") is not None]
        notes += [f"attempt {a['attempt']} ({a['label']}): {a['cut']}" for a in self.attempts if a.get("cut")]
        notes += [f"attempt {a['attempt']} ({a['label']}): stopped at the budget before it finished (no result)"
                  for a in self.cut]
        return notes

    def report(self, plot: str | None = None) -> str:
        """Markdown: verdict, program, per-module evidence, training dynamics."""
        t = self.task
        out = [f"# {t.name}", "", f"*{t.description}*", ""]
        out.append(f"**{'Solved' if self.solved else 'Not solved'}** in {self.seconds:.0f} s "
                   f"({len(self.attempts)} attempt(s)). Best program: {self.verification or 'none'}")
        if self.dependence is not None:
            out += ["", f"Probed as a black box, the target reads {self.dependence.describe()}."
                    + (f" Discover began {self.sizing}." if self.sizing else "")]
        if self.budget_notes():
            out += ["", f"The {self.budget_s:g} s budget cut:", ""] + [f"- {n}" for n in self.budget_notes()]
        domain = getattr(self.program, "domain", None)
        if domain is not None:
            out += ["", f"Read and verified on: {domain.describe()}. The program refuses other inputs by default "
                    "(`program(x, domain='warn' | 'ignore')`; standalone: `program(xs, check_domain=False)`)."]
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
        fresh = self.task.fresh_batch(n, 4242)
        task, y = fresh.task, fresh.y
        pred = task._as_3d(self.model.predict(fresh.x), "prediction")
        hit = (np.round(pred) == y) if task.output == "integer" else (np.abs(pred - y) / (1 + np.abs(y)) <= REAL_TOLERANCE)
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
            if self.sizing:
                lines.append(f"From that evidence discover began {self.sizing}.")
        elif self.task.size is not None:
            lines.append("A data task is not probed (its target answers only for recorded sequences).")
        if scores is not None and max(scores[self.task.valid_from:]) < 0.5:
            lines.append("No attempt learned the function; a larger budget (more attempts up the ladder) may help.")
        return lines

    OUTPUTS = {"program.py": "file", "report.md": "file", "training.svg": "file", "summary.json": "file",
               "model": "directory"}
    REPLACED = ("training.png",)     # an output of earlier versions (the chart is SVG now): removed on save

    @classmethod
    def check_directory(cls, directory) -> Path:
        """The directory save() would write, checked before any work: DiscoveryError when it is not
        a directory path, cannot be created, or holds one of the outputs as the wrong kind of entry."""
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise DiscoveryError(f"save() takes a directory path, got {type(directory).__name__} {directory!r}")
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise DiscoveryError(f"save(): {str(d)!r} exists and is not a directory")
        for name, kind in cls.OUTPUTS.items():
            entry = d / name
            if entry.is_symlink() or (entry.exists() and entry.is_dir() != (kind == "directory")):
                raise DiscoveryError(f"save(): {str(entry)!r} is in the way: the output there is a {kind}; "
                                     "move it or choose another directory")
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DiscoveryError(f"save(): cannot create {str(d)!r}: {exc.strerror or exc}") from None
        return d

    def save(self, directory) -> Path:
        """program.py, report.md, training.svg, model/ (checkpoint), summary.json: written to a
        scratch directory beside them first, then moved into place, so a failure leaves the old
        outputs whole; outputs this result does not have (no program) are removed, not left stale."""
        import shutil
        import tempfile

        from wtc.dt import checkpoint

        d = self.check_directory(directory)
        with tempfile.TemporaryDirectory(dir=d, prefix=".wtc-save-") as scratch:
            new = Path(scratch)
            plot = None
            if self.history is not None and len(self.history):
                plot = self.history.plot(new / "training.svg") and "training.svg"
            if self.program is not None:
                (new / "program.py").write_text(self.program.source)
            if self.model is not None:
                checkpoint.save(self.model, new / "model", extra=getattr(self.model, "train_info", {}))
            (new / "report.md").write_text(self.report(plot))
            (new / "summary.json").write_text(json.dumps(self.summary(), indent=2, default=str))
            for name in self.OUTPUTS:
                target = d / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
                if (new / name).exists():
                    os.replace(new / name, target)
            remove_replaced(d)
        return d


def remove_replaced(directory: Path) -> None:
    """Remove what earlier versions wrote to an output directory and this one no longer does
    (Discovery.REPLACED: a training.png beside the training.svg); a link or a folder of that
    name is not ours and stays."""
    for name in Discovery.REPLACED:
        if (directory / name).is_file() and not (directory / name).is_symlink():
            (directory / name).unlink()


@dataclass(frozen=True)
class Plan:
    """discover's configuration, resolved once: the first rung's DTConfig (sized to what the probe
    found where the given config left a field at its default), why it was sized so, the probe's
    finding, rungs run at once, the attempt cap, and the task as the rungs' jobs get it."""

    config: DTConfig
    sizing: str
    dependence: object | None
    workers: int
    max_attempts: int | None
    job: JobTask


def plan(task, seed: int, config: DTConfig | None) -> Plan:
    """Probe the task (always: a given config keeps every field it sets, and the probe grows only
    those it leaves at DTConfig's defaults), check the first rung's size, and settle how the jobs
    get the task (a callable task's pool is drawn here)."""
    if config is not None and not isinstance(config, DTConfig):
        raise ConfigTypeError(f"config must be a wtc.DTConfig or None, got {type(config).__name__} {config!r}")
    base = DTConfig() if config is None else config
    try:
        dep = probe.dependence(task, seed)
    except TaskError:                       # a target that refuses mixed inputs: no probe, the given size
        dep = None
    sizing = ""
    if dep is not None:
        base, sizing = sized_for(base, dep)
    base.check_size(task.seq_len, task.n_inputs)
    cap = None if config is None else config.max_attempts
    return Plan(base, sizing, dep, worker_count(base, cap=cap), cap, job_task(task, seed))


def discover(task: Task | str, seed: int = 0, budget_s: float | None = None, progress: bool = True,
             config: DTConfig | None = None, *, prestarted: Prestarted | None = None) -> Discovery:
    """Train, extract and verify until a program verifies or the budget (default 600 s) is spent.

    budget_s must be a finite positive number of seconds; the call returns within it plus a margin
    (5% or 10 s, whichever is larger) with the best program found so far. Training stops at 75%
    of the budget (wtc.dt.ladder.READ_SHARE), finishing at 87.5%, reading replicas out at the budget,
    and a new attempt starts only while the time left covers half the longest attempt;
    whatever the budget cut is said in the attempts' records (stopped_at_step, cut) and the
    report. A given `config` keeps the fields it sets and caps the attempts at its max_attempts;
    without one, attempts go on until the budget is spent. A task defined by callables trains on a
    pool drawn from them (wtc.tasks.pool: in worker processes too) and its programs are verified
    with its own callables (in a worker forked from here, or here). prestarted: worker
    interpreters already started (wtc.worker_pool; the CLI opens them before its own imports),
    used by the first rungs.
    progress: lines through the "wtc" logger (wtc.progress: on stderr unless logging is configured);
    the result's `run` records the version, seed, configuration, task fingerprint and machine.
    """
    started, t0 = time.time(), time.perf_counter()
    task = task_registry.get(task)
    budget = DEFAULT_BUDGET_S if budget_s is None else check_budget(budget_s)
    seed = arguments.seed(seed, error=ConfigError)
    p = plan(task, seed, config)
    run = provenance.record(task, seed, p.config, started)
    if progress:
        enable()
        log.debug(f"{task.name}: {p.workers} attempt(s) at once; first configuration {p.config.to_dict()}")
    if progress and p.sizing:
        log.info(f"{task.name}: the target reads {p.dependence.describe()}: {p.sizing}")
    deadline = Deadline.of(budget, started, READ_SHARE)
    opts = {"progress": progress, "deadline": deadline.to_json()}
    kill_at = started + budget + margin_s(budget) / 2

    def receive(rung, result: RungResult) -> RungResult:
        if p.job.pooled and result.record.get("verified_on") != JUDGED_ON:   # else a forked worker judged it
            result = judged(result, task, seed)
        record = result.record
        if progress:
            log.info(f"{task.name} attempt {rung.attempt} ({rung.label}): {record['replicas_solved']}/"
                     f"{record['replicas']} replicas solved, program "
                     f"{'verified' if record['verified'] else 'not verified'} ({record['seconds']:.0f}s)"
                     + (f"; {record['cut']}" if record.get("cut") else ""))
        return result

    def run_rungs(ladder):
        run_ladder(JOB, p.job, ladder, seed, opts, receive, prestarted=prestarted, kill_at=kill_at)

    best, ran, ladder = climb(p.config, run_rungs, workers=p.workers, solved=lambda r: r.verified,
                              key=lambda r: r.key, budget_s=budget, max_attempts=p.max_attempts, name=task.name,
                              progress=progress, clock=time.time, t0=started)
    cut = [{"attempt": rung.attempt, "label": rung.label} for rung, wanted in ladder.unfinished() if wanted]
    if progress:
        for rung, wanted in ladder.unfinished():
            log.info(f"{task.name} attempt {rung.attempt} ({rung.label}): "
                     + (f"stopped at the {budget:g}s budget" if wanted else "stopped, an earlier attempt verified"))
        end = ladder.end
        for a in sorted(a for a in ladder.results if end is not None and a > end):
            log.info(f"{task.name} attempt {a}: not used, attempt {end} verified first in the ladder")
    attempts = [result.record for _, result in ran]
    found = None if best is None else best.best
    if found is None:
        return Discovery(task, None, None, None, None, time.perf_counter() - t0, attempts, p.dependence, cut, budget,
                         run, p.sizing)
    return Discovery(task, found.program, found.model, found.history, found.verification,
                     time.perf_counter() - t0, attempts, p.dependence, cut, budget, run, p.sizing)


def sized_for(config: DTConfig, dep) -> tuple[DTConfig, str]:
    """The default architecture grown to what the probe found: a pointer head per offset to route
    (when there are more than it has), aggregate heads from the start when outputs read the whole
    prefix (instead of two rungs later), periodic sub-MLP units when the output oscillates in an
    input it reads (parity, residues, digit tables: no bounded stack of ReLUs has the kinks), and
    sub-MLPs that read as many inputs as interact (a one-layer model sums parts of at most
    mlp_inputs inputs: a majority of five is no such sum); with a tail of rarely read offsets (a
    carry, the last non-zero: wtc.dt.recency) two layers with recency heads instead of a head per
    offset, aggregate heads and wide sub-MLPs. Only fields the given config leaves at
    DTConfig's defaults grow (SIZED_FIELDS): what a user set is kept. Returns (config, what changed
    and why, or "")."""
    default = DTConfig(n_layers=config.n_layers)
    left = {f for f in SIZED_FIELDS if getattr(config, f) == getattr(default, f)}   # fields set by hand stay
    changes, why = recent_layout(config, dep)      # a tail of rare reads: "latest j where" heads (wtc.dt.recency)
    if not changes:                                # a running sum of a learned step (wtc.dt.running)
        changes, why = step_layout(config, dep, PERIODS)
    why = [why] if why else []
    routes = 0 if changes else dep.pointer_routes  # the offsets read are the recency heads' to route
    if "n_heads" in left and routes > max(config.n_heads):
        changes["n_heads"] = routes
        why.append(f"{routes} pointer heads, one per offset")
    if ("n_agg_heads" in left and any(dep.prefix) and max(config.n_agg_heads) == 0
            and "n_recent_heads" not in changes and "n_agg_heads" not in changes):
        changes["n_agg_heads"] = 2
        why.append("aggregate heads from the first attempt")
    # a residue of the prefix sum past 6 (mod 7, error diffusion by 15) needs its own period
    extra = tuple(sorted({p for p in getattr(dep, "sum_periods", []) if p and p not in PERIODS}))
    if "mlp_periods" in left and (dep.oscillating or extra) and not config.mlp_periods and "mlp_periods" not in changes:
        changes["mlp_periods"] = PERIODS + extra
        why.append(f"periodic sub-MLP units (periods {', '.join(map(str, PERIODS + extra))})")
    periodic = periodic_sizing(config, dep, left, changes, PERIODS)
    if periodic:
        why.append(periodic)
    # three: the ladder's second rung has them anyway; a tail's interacting offsets are the recency heads'
    if "mlp_inputs" in left and dep.order > max(config.mlp_inputs, 3) and "n_recent_heads" not in changes:
        changes["mlp_inputs"] = dep.order
        why.append(f"{dep.order}-input sub-MLPs ({dep.order} inputs interact)")
    if not changes:
        return config, ""
    return config.replace(**changes), "starting with " + " and ".join(why)

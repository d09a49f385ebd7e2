"""discover: train -> extract -> verify, retried within a time budget.

Each attempt trains a population of Discrete Transformers (wtc.dt), reads the best replicas out as
programs (wtc.extraction) and verifies them on fresh data. Attempts climb a ladder of configurations (DTConfig.rung)
(3-input sub-MLPs for three-way operators such as a windowed maximum; aggregate heads for prefix
sums, counts and means; a second layer of sub-MLPs for chained operators; pointer heads in both
layers; then the same again with new seeds) until a program verifies or the budget is spent. The result
is the verified program, or an honest failure with the best attempt's evidence.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wtc import tasks as task_registry
from wtc.dt.config import DTConfig
from wtc.dt.train import Attempt, rank_key, run_attempt, take_replica
from wtc.threads import torch_threads
from wtc.extraction import extract, verify
from wtc.extraction.reader import ExtractionError

DEFAULT_BUDGET_S = 600.0
REPLICAS_TO_READ = 3

@dataclass
class Discovery:
    task: object
    program: object | None
    model: object | None
    history: object | None
    verification: object | None
    seconds: float
    attempts: list[dict] = field(default_factory=list)

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
                "failures": self.program.failures if self.program else ["no model was trained"],
                "attempts": self.attempts}

    def report(self, plot: str | None = None) -> str:
        """Markdown: verdict, program, per-module evidence, training dynamics."""
        t = self.task
        out = [f"# {t.name}", "", f"*{t.description}*", ""]
        out.append(f"**{'Solved' if self.solved else 'Not solved'}** in {self.seconds:.0f} s "
                   f"({len(self.attempts)} attempt(s)). Best program: {self.verification or 'none'}")
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
        if plot:
            out += ["", "## Training dynamics", "", f"![training]({plot})", "",
                    "Loss falls (functional convergence) before the selection and attention entropies "
                    "collapse (structural discretization)."]
        return "\n".join(out) + "\n"

    def save(self, directory) -> Path:
        """program.py, report.md, training.png, model/ (checkpoint), summary.json."""
        from wtc.dt import checkpoint

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
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
             config: DTConfig | None = None) -> Discovery:
    """Train, extract and verify until a program verifies or the budget (default 600 s) is spent."""
    task = task_registry.get(task)
    budget = DEFAULT_BUDGET_S if budget_s is None else float(budget_s)
    if budget <= 0:
        raise ValueError(f"budget_s must be positive, got {budget_s}")
    base = config or DTConfig()
    t0 = time.perf_counter()
    attempts: list[dict] = []
    best = None             # (key, Discovery fields)
    longest = 0.0
    attempt = 0
    while True:
        elapsed = time.perf_counter() - t0
        if attempt and elapsed + longest > budget:
            break
        label, cfg = base.rung(attempt)
        started = time.perf_counter()
        with torch_threads(cfg.threads):
            run = Attempt(task, cfg, seed, attempt)
            scores = run_attempt(run, progress)
            order = sorted(range(len(scores)), key=lambda i: rank_key(task, scores[i]), reverse=True)
            record = {"attempt": attempt, "label": label, "replicas": len(scores),
                      "replicas_solved": sum(bool(s["solved"]) for s in scores), "replicas_read": 0,
                      "verified": False}
            for r in order[:REPLICAS_TO_READ]:
                model, history = take_replica(run, r)
                try:
                    program = extract(model, task, seed=seed + attempt)
                except ExtractionError as exc:       # reported, and the search goes on
                    record.setdefault("errors", []).append(f"replica {r}: {exc}")
                    continue
                ver = verify(program, task, n=10000, seed=int(np.random.default_rng([seed, attempt, r]).integers(2**31)))
                record["replicas_read"] += 1
                key = (ver.solved and program.ok, program.ok, rank_key(task, scores[r]), -program.n_lines)
                if best is None or key > best[0]:
                    best = (key, program, model, history, ver)
                if ver.solved and program.ok:
                    record["verified"] = True
                    break
        record["seconds"] = time.perf_counter() - started
        longest = max(longest, record["seconds"])
        attempts.append(record)
        if progress:
            print(f"{task.name} attempt {attempt} ({label}): {record['replicas_solved']}/{record['replicas']} "
                  f"replicas solved, program {'verified' if record['verified'] else 'not verified'} "
                  f"({record['seconds']:.0f}s)", flush=True)
        attempt += 1
        if record["verified"]:
            break
    if best is None:
        return Discovery(task, None, None, None, None, time.perf_counter() - t0, attempts)
    _, program, model, history, ver = best
    return Discovery(task, program, model, history, ver, time.perf_counter() - t0, attempts)

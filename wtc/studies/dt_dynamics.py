"""Study: does functional convergence precede structural discretization in the Discrete
Transformer? (`wtc study dt-dynamics`)

For each task x seed one attempt is trained (wtc.train, the default DTConfig, one attempt), and for
every replica of the population the two moments are read off its training curves:
- functional step: the first step whose training loss is at most FUNCTIONAL x the first recorded
  loss (the function is learned, whatever the structure);
- structural step: the first step where the mean selection entropy and the mean attention entropy
  (over slots / pointer heads) are both at most STRUCTURAL x their first recorded values (the
  soft choices have become nearly hard).
A run is "function first" when its functional step comes strictly before its structural step, or
when the function is reached and the structure never is. The headline is the share of runs (the
replica wtc.train returns) that are function first; the same share over every replica that reached
either moment is reported beside it. Each run is kept in out/runs/ and skipped on rerun.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wtc.errors import StudyError
from wtc.studies.clock import kept, run_dirs

FUNCTIONAL = 0.01
STRUCTURAL = 0.1
TASKS = ("parity_last2", "sum_last2", "prev2", "max_last3", "min_last2", "diff_prev", "product_last2",
         "xor_pair", "and_prev", "select_by_flag", "ema3", "linear_combo")


@dataclass
class DTDynamics:
    tasks: tuple[str, ...] = TASKS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int | None = None            # None: DTConfig's default
    replicas: int | None = None

    @classmethod
    def quick(cls) -> "DTDynamics":
        return cls(tasks=("sum_last2", "prev2"), seeds=(0,), replicas=4)   # full schedule: tau anneals over the steps

    def __post_init__(self) -> None:
        import wtc.tasks

        self.tasks, self.seeds = tuple(self.tasks), tuple(self.seeds)
        if not self.tasks:
            raise StudyError("DTDynamics.tasks must name at least one task")
        for t in self.tasks:
            wtc.tasks.get(t)                              # unknown names fail here, with a suggestion
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise StudyError(f"DTDynamics.seeds must be one or more ints >= 0, got {self.seeds!r}")
        for name in ("steps", "replicas"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise StudyError(f"DTDynamics.{name} must be None or a positive int, got {v!r}")


CONFIG = DTDynamics
HEADLINE = ("function_first_fraction", "function_first_fraction_all_replicas", "runs_counted")
OUTPUTS = ("summary.json", "report.md", "dt_dynamics.png")


def first_at_most(values: np.ndarray, threshold: float) -> int | None:
    """Index of the first value <= threshold, or None."""
    hit = np.nonzero(values <= threshold)[0]
    return int(hit[0]) if len(hit) else None


def moments(curves: dict) -> dict:
    """Functional and structural steps of one replica's curves (History.curves)."""
    step, loss = curves["step"], curves["loss"]
    out = {"functional_step": None, "structural_step": None}
    if len(step) == 0:
        return out
    f = first_at_most(loss, FUNCTIONAL * float(loss[0]))
    entropies = [curves[k].mean(-1) for k in ("sel_entropy", "attn_entropy") if curves[k].size]
    hard = np.ones(len(step), bool)
    for e in entropies:
        hard &= e <= STRUCTURAL * float(e[0])
    s = first_at_most(np.where(hard, 0.0, 1.0), 0.0) if entropies else None
    out["functional_step"] = None if f is None else int(step[f])
    out["structural_step"] = None if s is None else int(step[s])
    return out


def function_first(m: dict) -> bool | None:
    """True / False, or None when neither moment was reached (the run says nothing)."""
    f, s = m["functional_step"], m["structural_step"]
    if f is None and s is None:
        return None
    if f is None:
        return False
    return s is None or f < s


def _one_run(task: str, seed: int, cfg: DTDynamics, progress: bool) -> dict:
    import wtc
    from wtc.dt import DTConfig

    overrides = {k: v for k, v in (("steps", cfg.steps), ("replicas", cfg.replicas)) if v is not None}
    config = DTConfig(max_attempts=1, grow=False, **overrides)
    model, history = wtc.train(task, config, seed=seed, progress=progress)
    R = history.arrays()["loss"].shape[1]
    per_replica = []
    for r in range(R):
        m = moments(history.curves(r))
        per_replica.append({**m, "function_first": function_first(m)})
    chosen = per_replica[history.replica]
    solved = bool(model.train_info["score"]["solved"])
    return {"task": task, "seed": seed, "replica": history.replica, **chosen, "solved": solved,
            "steps": int(history.step[-1]) if history.step else 0, "replicas": per_replica}


def run(cfg: DTDynamics | None, out_dir, progress: bool = True) -> dict:
    """Train every task x seed (resumably, one file per run), read the two moments, summarise."""
    cfg = cfg or DTDynamics()
    out, clock, runs_dir = run_dirs(out_dir, cfg, "dt-dynamics")
    def one(task, seed):
        if progress:
            print(f"dt-dynamics: {task} seed {seed}", flush=True)
        return _one_run(task, seed, cfg, progress)

    runs = [kept(runs_dir / f"{task}_seed{seed}.json", lambda: one(task, seed), clock)
            for task in cfg.tasks for seed in cfg.seeds]
    counted = [r for r in runs if r["function_first"] is not None]
    reps = [p for r in runs for p in r["replicas"] if p["function_first"] is not None]
    summary = {
        "function_first_fraction": (sum(r["function_first"] for r in counted) / len(counted)) if counted else None,
        "function_first_fraction_all_replicas": (sum(p["function_first"] for p in reps) / len(reps)) if reps else None,
        "runs_counted": len(counted), "replicas_counted": len(reps),
        "thresholds": {"functional_loss_fraction": FUNCTIONAL, "structural_entropy_fraction": STRUCTURAL},
        "runs": [{k: v for k, v in r.items() if k != "replicas"} for r in runs],
        "seconds": round(clock.total(), 1),
    }
    clock.save()
    _plot(runs, out / "dt_dynamics.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(_report(summary))
    return summary


def _plot(runs: list[dict], path: Path) -> None:
    """Functional vs structural step: one colour per task (the returned replica; every replica in
    grey), a moment never reached drawn at the last step, the diagonal splitting the two orders."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    last = max([r["steps"] for r in runs] or [1])
    at = lambda v: v if v is not None else last          # noqa: E731
    for r in runs:
        for p in r["replicas"]:
            ax.scatter(at(p["functional_step"]), at(p["structural_step"]), s=8, color="lightgray", zorder=1)
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    colours = plt.get_cmap("tab20")
    for i, task in enumerate(tasks):
        mine = [r for r in runs if r["task"] == task]
        ax.scatter([at(r["functional_step"]) for r in mine], [at(r["structural_step"]) for r in mine], s=30,
                   color=colours(i % 20), marker="os^D"[i // 20 % 4], label=task, zorder=2)
    ax.plot([0, last], [0, last], color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel(f"functional step (loss <= {FUNCTIONAL:g} x initial; never: {last})")
    ax.set_ylabel(f"structural step (entropies <= {STRUCTURAL:g} x initial; never: {last})")
    ax.set_title("above the diagonal: function first\n(colour: the returned replica per task and seed; grey: every replica)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _report(s: dict) -> str:
    def fmt(v):
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    lines = ["# Discrete Transformer: functional convergence vs structural discretization", "",
             f"Function first in **{fmt(s['function_first_fraction'])}** of {s['runs_counted']} runs (the replica "
             f"wtc.train returns), {fmt(s['function_first_fraction_all_replicas'])} of {s['replicas_counted']} "
             "replicas.", "",
             f"Functional step: training loss <= {FUNCTIONAL:g} x its first value. Structural step: mean selection "
             f"and attention entropies <= {STRUCTURAL:g} x their first values. Not reached: '-'.", "",
             "| task | seed | functional step | structural step | function first | solved | steps |",
             "|---|---|---|---|---|---|---|"]
    for r in s["runs"]:
        lines.append(f"| {r['task']} | {r['seed']} | {fmt(r['functional_step'])} | {fmt(r['structural_step'])} | "
                     f"{fmt(r['function_first'])} | {fmt(r['solved'])} | {r['steps']} |")
    lines += ["", "![dynamics](dt_dynamics.png)"]
    return "\n".join(lines) + "\n"

"""Study: architectural constraints change the algorithm a Discrete Transformer finds
(`wtc study dt-control`).

The DT paper's controllability claim: with fewer MLPs, or with the information flow masked, the
model copies through attention and combines in the linear head instead of computing in an MLP.
Here each task is discovered (wtc.discover, one seed) under each constraint, as named DTConfigs:
- default      the default architecture;
- no-mlp       n_mlps = 0: attention routes, the linear head combines (products and extrema
               cannot be formed: those runs should fail, not find something else);
- mlp-current  every sub-MLP slot may read only the raw inputs at the current position
               (DTConfig.read), so nothing routed can be combined inside an MLP;
- one-head     one pointer head per layer and two layers: a value two steps back must be fetched
               by a chain of heads (prev1 of prev1) instead of one head at offset 2.
For every run the program and the extraction's per-module readings are kept, and the run is
labelled by where the arithmetic happens: "mlp" when a live sub-MLP combines two or more
variables or an output is nonlinear (the head is linear), "head" when the output layer combines
variables linearly, "routing" when each output is one routed variable; and by its routes (the live heads' rules). Each run is kept in out/runs/ and skipped on
rerun.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from wtc.errors import StudyError
from wtc.studies.clock import kept, run_dirs

TASKS = ("sum_last2", "product_last2", "max_last3", "min_last2", "prev2")   # a sum, a product, a windowed max
CONSTRAINTS = ("default", "no-mlp", "mlp-current", "one-head")


def constraint_config(name: str, steps: int | None = None, replicas: int | None = None, max_attempts: int = 2):
    """The DTConfig a constraint names (grow=False: the ladder would add the capacity taken away)."""
    from wtc.dt import DTConfig

    extra = {k: v for k, v in (("steps", steps), ("replicas", replicas)) if v is not None}
    base = dict(grow=False, max_attempts=max_attempts, **extra)
    if name == "default":
        return DTConfig(**base)
    if name == "no-mlp":
        return DTConfig(n_mlps=0, **base)
    if name == "mlp-current":
        return DTConfig(read={"L*.m*": ["x*"]}, **base)
    if name == "one-head":
        return DTConfig(n_layers=2, n_heads=1, **base)
    raise StudyError(f"unknown constraint {name!r} (constraints: {', '.join(CONSTRAINTS)})")


@dataclass
class DTControl:
    tasks: tuple[str, ...] = TASKS
    constraints: tuple[str, ...] = CONSTRAINTS
    seed: int = 0
    budget_s: float = 300.0             # per discover run
    steps: int | None = None            # None: DTConfig's default
    replicas: int | None = None
    max_attempts: int = 2

    @classmethod
    def quick(cls) -> "DTControl":
        return cls(tasks=("sum_last2",), constraints=("default", "no-mlp"), steps=400, replicas=4, max_attempts=1,
                   budget_s=120.0)

    def __post_init__(self) -> None:
        import wtc.tasks

        self.tasks, self.constraints = tuple(self.tasks), tuple(self.constraints)
        if not self.tasks or not self.constraints:
            raise StudyError("DTControl needs at least one task and one constraint")
        for t in self.tasks:
            wtc.tasks.get(t)                              # unknown names fail here, with a suggestion
        for c in self.constraints:
            constraint_config(c)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise StudyError(f"DTControl.seed must be an int >= 0, got {self.seed!r}")
        for name in ("steps", "replicas"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise StudyError(f"DTControl.{name} must be None or a positive int, got {v!r}")
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise StudyError(f"DTControl.max_attempts must be a positive int, got {self.max_attempts!r}")
        if not isinstance(self.budget_s, (int, float)) or isinstance(self.budget_s, bool) or not self.budget_s > 0 \
                or self.budget_s == float("inf"):
            raise StudyError(f"DTControl.budget_s must be a finite number of seconds > 0, got {self.budget_s!r}")


CONFIG = DTControl
HEADLINE = ("runs", "algorithm_changed_tasks", "solved_runs")
OUTPUTS = ("summary.json", "report.md", "dt_control.png")


def computes_in(readings: list[dict], outputs: list[str]) -> str:
    """Where a program's arithmetic happens: 'mlp' (a live sub-MLP reads >= 2 distinct variables,
    or an output formula is nonlinear, which the linear head cannot make), 'head' (an output is a
    linear combination of >= 2 variables), 'routing' (each output is one variable, scaled and
    shifted), or 'none' (no output was read)."""
    import sympy as sp

    def inputs(r):                                    # "in0=L0.h0, in1=x" -> {"L0.h0", "x"}
        return {v.split("=", 1)[-1].strip() for v in r["reads"].split(",") if v.strip()}

    def linear(e):
        syms = sorted(e.free_symbols, key=str)
        return not syms or (e.is_polynomial(*syms) and sp.Poly(e, *syms).total_degree() <= 1)

    exprs = [sp.sympify(o) for o in outputs]
    if any(r["live"] and r["kind"] == "mlp" and len(inputs(r)) >= 2 for r in readings) or \
            not all(linear(e) for e in exprs):
        return "mlp"
    if not exprs:
        return "none"
    return "head" if any(len(e.free_symbols) >= 2 for e in exprs) else "routing"


def routes(readings: list[dict]) -> list[str]:
    """The live attention heads' rules ('L0.h0: offset 1 (...)'): how values reach the position."""
    return [f"{r['module']}: {r['finding']}" for r in readings
            if r["live"] and r["kind"] == "head" and not r["module"].startswith("output")]


def _one_run(task: str, constraint: str, cfg: DTControl, progress: bool) -> dict:
    import wtc

    config = constraint_config(constraint, cfg.steps, cfg.replicas, cfg.max_attempts)
    found = wtc.discover(task, seed=cfg.seed, budget_s=cfg.budget_s, progress=progress, config=config)
    program = found.program
    readings = [] if program is None else [
        {"module": r.module, "kind": r.kind, "name": r.name, "reads": r.reads, "finding": r.finding, "live": r.live,
         "ok": r.ok} for r in program.readings]
    ver = found.verification
    return {"task": task, "constraint": constraint, "config": config.to_dict(), "solved": bool(found.solved),
            "accuracy": None if ver is None else ver.accuracy, "seconds": round(found.seconds, 1),
            "attempts": len(found.attempts), "outputs": [] if program is None else [str(e) for e in program.outputs],
            "readings": readings,
            "routes": routes(readings),
            "source": "" if program is None else program.source}


def run(cfg: DTControl | None, out_dir, progress: bool = True) -> dict:
    """Discover every task under every constraint (resumably, one file per run), summarise."""
    cfg = cfg or DTControl()
    out, clock, runs_dir = run_dirs(out_dir, cfg, "dt-control")
    def one(task, constraint):
        if progress:
            print(f"dt-control: {task} under {constraint}", flush=True)
        return _one_run(task, constraint, cfg, progress)

    runs = [kept(runs_dir / f"{task}_{constraint}.json", lambda: one(task, constraint), clock)
            for task in cfg.tasks for constraint in cfg.constraints]
    for r in runs:      # labelled here, so kept runs follow the current definition
        r["computes_in"] = computes_in(r["readings"], r["outputs"])
    by_task: dict[str, dict] = {}
    for r in runs:
        by_task.setdefault(r["task"], {})[r["constraint"]] = {k: r[k] for k in ("solved", "computes_in", "routes",
                                                                                 "outputs")}
    # a changed algorithm: two verified programs that compute in different places or route differently
    changed = sorted(t for t, per in by_task.items()   # rules compared without the heads' names (L0.h2 = L0.h0)
                     if len({(p["computes_in"], tuple(sorted(r.split(": ", 1)[-1] for r in p["routes"])))
                             for p in per.values() if p["solved"]}) > 1)
    summary = {"runs": len(runs), "solved_runs": sum(r["solved"] for r in runs), "algorithm_changed_tasks": changed,
               "by_task": by_task, "constraints": {c: constraint_config(c).to_dict() for c in cfg.constraints},
               "seconds": round(clock.total(), 1),
               "runs_detail": [{k: v for k, v in r.items() if k not in ("config", "source")} for r in runs]}
    clock.save()
    _plot(cfg, by_task, out / "dt_control.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (out / "report.md").write_text(_report(summary, runs))
    return summary


COLOURS = {"mlp": "tab:orange", "head": "tab:blue", "routing": "tab:green", "none": "lightgray"}


def _plot(cfg: DTControl, by_task: dict, path) -> None:
    """Tasks x constraints: colour = where the program computes, hatched = not verified."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(cfg.constraints), 1.2 + 0.6 * len(cfg.tasks)))
    for i, task in enumerate(cfg.tasks):
        for j, c in enumerate(cfg.constraints):
            run = by_task.get(task, {}).get(c)
            where = run["computes_in"] if run else "none"
            ax.add_patch(Rectangle((j, i), 0.95, 0.9, color=COLOURS[where], hatch=None if run and run["solved"] else "//",
                                   alpha=1.0 if run and run["solved"] else 0.45))
            ax.text(j + 0.47, i + 0.45, where if run else "not run", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(cfg.constraints))
    ax.set_ylim(len(cfg.tasks), 0)
    ax.set_xticks([j + 0.47 for j in range(len(cfg.constraints))], cfg.constraints)
    ax.set_yticks([i + 0.45 for i in range(len(cfg.tasks))], cfg.tasks)
    ax.legend(handles=[Patch(color=v, label=k) for k, v in COLOURS.items()], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set_title("where the program computes (hatched: not verified)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _report(s: dict, runs: list[dict]) -> str:
    lines = ["# Discrete Transformer: constraints change the algorithm", "",
             f"{s['solved_runs']} of {s['runs']} runs verified. Tasks whose verified programs compute in different "
             f"places under different constraints: {', '.join(s['algorithm_changed_tasks']) or 'none'}.", "",
             "Where the arithmetic happens: mlp (a live sub-MLP combines >= 2 variables, or an output is "
             "nonlinear: the head is linear), head (an output is a linear combination of >= 2 variables), routing "
             "(each output is one routed variable).", "",
             "| task | constraint | verified | accuracy | computes in | routes | output | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
        out = "; ".join(f"`{o}`" for o in r["outputs"]) or "-"
        via = "; ".join(r.get("routes", [])) or "-"
        lines.append(f"| {r['task']} | {r['constraint']} | {r['solved']} | {acc} | {r['computes_in']} | {via} | {out} | "
                     f"{r['seconds']} |")
    lines += ["", "![where](dt_control.png)", "", "## Module readings", ""]
    for r in runs:
        lines.append(f"**{r['task']} / {r['constraint']}**")
        lines.append("")
        for m in r["readings"]:
            if m["live"]:
                lines.append(f"- {m['module']} ({m['kind']}) reads {m['reads']}: {m['finding']}")
        lines.append("")
    return "\n".join(lines) + "\n"

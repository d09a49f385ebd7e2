"""Reporting for the modular-addition study (wtc.studies.modadd): report.md and the plots."""
from __future__ import annotations

from pathlib import Path

import numpy as np

def markdown(out: Path, s: dict) -> None:
    """report.md: one row per checkpoint of both branches."""
    lines = [f"# modadd study (p = {s['config']['p']})", "",
             (f"grok step: {s['grok_step']} (epoch {s['grok_epoch']}); wd0 branch forked at step "
              f"{s['wd0_branch']['fork_step']}, grok step {s['wd0_branch']['grok_step']}; {s['seconds']} s"), "",
             "| branch | step | train | test | rank | necessary | unit circle | modes | frequencies |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, cks in (("main", s["checkpoints"]), ("wd0", s["wd0_branch"]["checkpoints"])):
        for c in cks:
            lines.append(f"| {name} | {c['step']} | {c['train_acc']:.3f} | {c['test_acc']:.3f} | {c['rank']} | "
                         f"{c['necessary_rank']} | {fmt(c['unit_circle_fraction'])} | {c['n_modes']} | "
                         f"{c['frequencies']} |")
    lines += ["", "![accuracy, core rank, modes](modadd.png)", "", "![shift-operator eigenvalues](modadd_eigenvalues.png)"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def plot(out: Path, s: dict, curves: dict) -> None:
    """modadd.png (accuracies, ranks, modes, unit-circle fraction vs step) and the eigenvalue plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main, wd0 = s["checkpoints"], s["wd0_branch"]["checkpoints"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    a = axes[0, 0]
    for name, ls in (("main", "-"), ("wd0", "--")):
        c = [r for r in curves.get(name, []) if r["step"] > 0]
        if c:
            tag = "wd 1.0" if name == "main" else "wd 0 branch"
            a.plot([r["step"] for r in c], [r["train_acc"] for r in c], ls, color="C0", label=f"train ({tag})")
            a.plot([r["step"] for r in c], [r["test_acc"] for r in c], ls, color="C1", label=f"test ({tag})")
    if s["grok_step"]:
        a.axvline(s["grok_step"], color="k", lw=0.8, ls=":", label="grok (test >= 0.99)")
    if s["wd0_branch"]["fork_step"]:
        a.axvline(s["wd0_branch"]["fork_step"], color="C3", lw=0.8, ls=":", label="wd0 fork")
    a.set(xscale="log", xlabel="step", ylabel="accuracy", title="accuracy")
    a.legend(fontsize=7)

    def series(ax, key, title, ylabel):
        for name, cks, ls in (("wd 1.0", main, "-o"), ("wd 0 branch", wd0, "--s")):
            pts = [(c["step"], c[key]) for c in cks if c["step"] > 0 and c[key] is not None]
            if pts:
                ax.plot(*zip(*pts), ls, ms=3, label=name)
        if s["grok_step"]:
            ax.axvline(s["grok_step"], color="k", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel="step", ylabel=ylabel, title=title)
        ax.legend(fontsize=7)

    b = axes[0, 1]
    series(b, "rank", f"core rank (energy {s['config']['energy']}; dotted: necessary)", "rank")
    for name, cks, color in (("wd 1.0", main, "C0"), ("wd 0 branch", wd0, "C1")):
        pts = [(c["step"], c["necessary_rank"]) for c in cks if c["step"] > 0 and c["necessary_rank"] is not None]
        if pts:
            b.plot(*zip(*pts), ":", color=color, lw=1)
    series(axes[1, 0], "n_modes", "occupied frequency modes (unit-circle eigenvalues)", "n_modes")
    series(axes[1, 1], "unit_circle_fraction",
           "shift-operator eigenvalues within sin(pi/p) of |z| = 1", "fraction")
    fig.tight_layout()
    fig.savefig(out / "modadd.png", dpi=110)
    plt.close(fig)

    # eigenvalues of the class-mean shift operator: a pre-grokking checkpoint and the last one
    fig, ax = plt.subplots(figsize=(5, 5))
    t = np.linspace(0, 2 * np.pi, 400)
    ax.plot(np.cos(t), np.sin(t), color="0.8", lw=0.8)
    pick = []
    fork = next((c for c in main if c["step"] == s["wd0_branch"]["fork_step"]), None)
    if fork:
        pick.append((f"fork (before grokking) step {fork['step']}", fork, "C7"))
    if main:
        pick.append((f"wd 1.0 step {main[-1]['step']}", main[-1], "C0"))
    if wd0:
        pick.append((f"wd 0 step {wd0[-1]['step']}", wd0[-1], "C1"))
    for label, c, color in pick:
        ev = np.asarray(c["eigenvalues"] or np.zeros((0, 2)))
        if len(ev):
            ax.scatter(ev[:, 0], ev[:, 1], s=18, color=color, label=label, alpha=0.8)
    ax.set(aspect="equal", xlabel="Re", ylabel="Im", title="class-mean shift operator eigenvalues")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "modadd_eigenvalues.png", dpi=110)
    plt.close(fig)


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"

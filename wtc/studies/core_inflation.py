"""Core inflation under continued weight decay (`wtc study core-inflation [--quick]`).

The ACE paper reports that after grokking the modular-addition core inflates (~15 -> ~60
dimensions) while the computation stays the same: the sufficient rank (the smallest core that keeps
accuracy) stays put and the necessary rank (the smallest core whose removal destroys it) grows, the
same computation spread redundantly over more functionally equivalent Fourier modes.

This study trains the modadd setting (wtc.studies.modadd: inputs [a, b], a seeded split, AdamW with
weight decay, minibatches from a seeded per-epoch permutation) for a long time and analyses it at
log-spaced updates (`per_decade` points per factor of 10, from `first`, and the last update) with
modadd.analyse: the core of the final residual stream at the last position (readout: centred
logits), its rank at `energy`, the minimal sufficient rank (keep within `tolerance` of the
unpatched accuracy), the minimal necessary rank (remove leaves <= 2 / p), the occupied frequency
modes of the class-mean shift operator, the weight norm.

Resumable in pieces: the training state (out/train_state) is written at every analysed update and
every `save_every` updates; a rerun with the same config continues, and `steps` may grow (the
schedule does not depend on it, only its last point does). `run_until(cfg, out, N)` returns after
N updates in all, as a kill would. Writes summary.json, report.md and inflation.png.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wtc.errors import StudyError
from wtc.models.training import Eval, TrainConfig, Trainer
from wtc.studies import modadd
from wtc.studies.clock import Clock, check_config, study_dir
from wtc.threads import torch_threads


@dataclass
class CoreInflationStudy:
    p: int = 53
    train_frac: float = 0.5
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int = 512
    lr: float = 1e-3
    weight_decay: float = 1.0
    batch: int = 512
    steps: int = 30000
    first: int = 300                # first analysed update (and update 0)
    per_decade: int = 8             # analysed updates per factor of 10
    save_every: int = 500           # training-state saves between analysed updates
    energy: float = 0.99
    tolerance: float = 0.005
    analysis_samples: int | None = None
    seed: int = 0
    threads: int = 1

    @classmethod
    def quick(cls) -> CoreInflationStudy:
        return cls(steps=6000, per_decade=6)

    def __post_init__(self) -> None:
        for name in ("first", "per_decade", "save_every", "steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StudyError(f"CoreInflationStudy.{name} must be an int >= 1, got {v!r}")
        self.modadd_config()                                  # the modadd settings' own checks

    def modadd_config(self) -> modadd.ModAddStudy:
        """The same settings as a ModAddStudy (what modadd.analyse and its batches read)."""
        fields = ("p", "train_frac", "n_layers", "d_model", "n_heads", "d_mlp", "lr", "weight_decay", "batch",
                  "energy", "tolerance", "analysis_samples", "seed", "threads")
        try:
            return modadd.ModAddStudy(**{k: getattr(self, k) for k in fields})
        except StudyError as exc:
            raise StudyError(str(exc).replace("ModAddStudy", "CoreInflationStudy")) from None


CONFIG = CoreInflationStudy
HEADLINE = ("grok_step", "at_grok.rank", "at_grok.sufficient_rank", "at_grok.necessary_rank", "final.step",
            "final.test_acc", "final.rank", "final.sufficient_rank", "final.necessary_rank", "final.n_modes")
OUTPUTS = ("summary.json", "report.md", "inflation.png")
PUBLIC = ("step", "epoch", "train_acc", "test_acc", "rank", "sufficient_rank", "necessary_rank", "max_rank",
          "keep_acc", "remove_acc", "n_modes", "frequencies", "unit_circle_fraction", "shift_residual", "weight_norm")


def schedule(first: int, per_decade: int, steps: int) -> list[int]:
    """0, then round(first * 10^(k / per_decade)) for k = 0, 1, ... while <= steps, and steps."""
    out, k = {0, steps}, 0
    while (s := int(round(first * 10 ** (k / per_decade)))) <= steps:
        out.add(s)
        k += 1
    return sorted(out)


def _data(mcfg: modadd.ModAddStudy) -> modadd._Data:
    x, y = modadd.all_pairs(mcfg.p)
    train_idx, test_idx = modadd.split(mcfg.p, mcfg.train_frac, mcfg.seed)
    n = mcfg.p ** 2
    sample_idx = (torch.arange(n) if mcfg.analysis_samples is None else
                  torch.from_numpy(np.sort(np.random.default_rng(mcfg.seed + 1).choice(n, mcfg.analysis_samples,
                                                                                       replace=False))))
    return modadd._Data(x, y, train_idx, test_idx, sample_idx, math.ceil(len(train_idx) / mcfg.batch))


def train(cfg: CoreInflationStudy, out: Path, progress: bool = True, stop_after: int | None = None) -> Trainer:
    """Train (resuming) to cfg.steps, or to stop_after updates; analysed records in metrics['records']."""
    mcfg = cfg.modadd_config()
    data = _data(mcfg)
    model = modadd.make_model(mcfg)
    at = set(schedule(cfg.first, cfg.per_decade, cfg.steps))

    def record(t: Trainer) -> dict:
        rec = {"step": t.step, "epoch": t.step / data.steps_per_epoch,
               **modadd.analyse(model, mcfg, data.x, data.y, data.train_idx, data.test_idx, data.sample_idx)}
        if progress:
            tqdm.write(f"core-inflation step {t.step}: test {rec['test_acc']:.3f} rank {rec['rank']} sufficient "
                       f"{rec['sufficient_rank']} necessary {rec['necessary_rank']} modes {rec['n_modes']}")
        return rec

    trainer = Trainer(model, TrainConfig(steps=cfg.steps, lr=cfg.lr, weight_decay=cfg.weight_decay),
                      modadd._batches(mcfg, data), lambda b: F.cross_entropy(model(b[0])[:, -1], b[1]),
                      path=out / "train_state", identity={k: v for k, v in asdict(cfg).items()
                                                          if k not in ("steps", "threads", "save_every")},
                      evals=(Eval("records", record, at=at),), checkpoint_at=at, checkpoint_every=cfg.save_every,
                      progress=progress, desc="core-inflation", leave=False)
    trainer.run(stop_after=stop_after)
    return trainer


def summarise(cfg: CoreInflationStudy, records: list[dict]) -> dict:
    recs = [{k: r.get(k) for k in PUBLIC} for r in records if r["step"] <= cfg.steps]
    grok = next((r for r in recs if r["test_acc"] >= 0.99), None)
    final = recs[-1] if recs else None
    after = [r for r in recs if grok is not None and r["step"] >= grok["step"]]

    def span(key):
        vals = [r[key] for r in after if r[key] is not None]
        return {"min": min(vals), "max": max(vals)} if vals else None

    return {"grok_step": grok["step"] if grok else None, "at_grok": grok, "final": final, "records": recs,
            "after_grok": {k: span(k) for k in ("rank", "sufficient_rank", "necessary_rank", "n_modes")},
            "necessary_growth": (final["necessary_rank"] / grok["necessary_rank"]
                                 if grok and final and grok["necessary_rank"] and final["necessary_rank"] else None)}


def run(cfg: CoreInflationStudy | None, out_dir, progress: bool = True) -> dict:
    """Train and analyse (resumably); writes summary.json, report.md, inflation.png; returns the summary."""
    return run_until(cfg, out_dir, None, progress)


def run_until(cfg: CoreInflationStudy | None, out_dir, stop_after: int | None, progress: bool = True) -> dict:
    """run, returning (checkpointed, summarised so far) once stop_after updates are done in all."""
    cfg = cfg or CoreInflationStudy()
    if not isinstance(cfg, CoreInflationStudy):
        raise StudyError(f"cfg must be a CoreInflationStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    check_config(out, asdict(cfg), ("steps", "threads", "save_every"), "core-inflation")
    clock = Clock(out)
    with torch_threads(cfg.threads):
        trainer = train(cfg, out, progress, stop_after)
    clock.save()
    summary = {"config": asdict(cfg), "layer": modadd.layer_name(cfg.modadd_config()),
               "steps_trained": trainer.step, "finished": trainer.step >= cfg.steps,
               "steps_per_epoch": _data(cfg.modadd_config()).steps_per_epoch,
               **summarise(cfg, trainer.metrics["records"]),
               "seconds": round(clock.total(), 1), "seconds_this_run": round(clock.now(), 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(out / "inflation.png", summary)
    (out / "report.md").write_text(markdown(summary))
    return summary


def _v(x) -> str:
    return "n/a" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def markdown(s: dict) -> str:
    c = s["config"]
    lines = [f"# core-inflation study (p = {c['p']}, weight decay {c['weight_decay']}, lr {c['lr']})", "",
             f"{s['steps_trained']} of {c['steps']} updates ({'finished' if s['finished'] else 'in progress'}); "
             f"grok step (test >= 0.99) {s['grok_step']}; necessary rank final / at grok "
             f"{_v(s['necessary_growth'])}; {s['seconds']} s.", "",
             "| step | epoch | train | test | energy rank | sufficient | necessary | modes | frequencies | weight norm |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in s["records"]:
        lines.append(f"| {r['step']} | {r['epoch']:.0f} | {r['train_acc']:.3f} | {r['test_acc']:.3f} | {r['rank']} | "
                     f"{_v(r['sufficient_rank'])} | {_v(r['necessary_rank'])} | {r['n_modes']} | {r['frequencies']} | "
                     f"{r['weight_norm']:.1f} |")
    lines += ["", "![ranks over training](inflation.png)"]
    return "\n".join(lines) + "\n"


def plot(path: Path, s: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in s["records"] if r["step"] > 0]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    if recs:
        st = [r["step"] for r in recs]
        a = axes[0]
        a.plot(st, [r["train_acc"] for r in recs], "-o", ms=3, label="train")
        a.plot(st, [r["test_acc"] for r in recs], "-o", ms=3, label="test")
        a.set(xscale="log", xlabel="update", ylabel="accuracy", title="accuracy")
        a.legend(fontsize=8)
        b = axes[1]
        for key, label in (("rank", "energy rank"), ("sufficient_rank", "sufficient"), ("necessary_rank", "necessary")):
            pts = [(r["step"], r[key]) for r in recs if r[key] is not None]
            if pts:
                b.plot(*zip(*pts), "-o", ms=3, label=label)
        b.set(xscale="log", xlabel="update", ylabel="dimensions", title=f"core ranks (energy {s['config']['energy']})")
        b.legend(fontsize=8)
        c = axes[2]
        c.plot(st, [r["n_modes"] for r in recs], "-o", ms=3, color="C3", label="occupied modes")
        c.set(xscale="log", xlabel="update", ylabel="modes", title="frequency modes; weight norm (right)")
        c2 = c.twinx()
        c2.plot(st, [r["weight_norm"] for r in recs], ":", color="0.4")
        c2.set_ylabel("weight norm")
        if s["grok_step"]:
            for ax in axes:
                ax.axvline(s["grok_step"], color="k", lw=0.8, ls=":")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

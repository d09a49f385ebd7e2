"""The grokking scaling law (`wtc study grok-law [--quick]`): how the grokking time of modular
addition depends on the weight decay omega and the modulus p.

The ACE paper's law is tau_grok ~ 1 / (omega * p), with p the redundancy: a modulus-p network has
(p - 1) / 2 = floor(p / 2) non-constant Fourier frequencies, functionally equivalent ways to
compute (a + b) mod p, so the number of available modes grows linearly with p. What this study
varies is the modulus p (each value a separate task, inputs [a, b], answer read at b's position as
in wtc.studies.modadd) and the AdamW weight decay omega (decoupled: every update multiplies the
weights by 1 - lr * omega). Everything else is fixed: the seeded train fraction of the p^2 pairs
(so the number of training pairs, train_frac * p^2, grows with p too, which is part of what
"varying p" means here), the architecture, lr, and full-batch training (one update = one epoch,
whatever p is, so tau is counted in updates and weight-decay contractions alike). The defaults
(train_frac 0.7, 2 layers d_model 64, lr 3e-3) are chosen so a sweep fits a 2-core machine: at
train_frac 0.5 and lr 1e-3 a p = 31 run had test accuracy 0.27 after 3000 updates here; at 0.7 and
3e-3, p = 23 and p = 31 grokked at update 725 (weight decay 1).

Per run (p, omega, seed), train and test accuracy every `eval_every` updates:
- memorisation step tau_mem: the first evaluated update with train accuracy >= train_threshold;
- grokking step tau_grok: the first evaluated update, at or after tau_mem, with test accuracy
  >= test_threshold (a run that reaches it before memorising groks at tau_mem's step);
- delay = tau_grok - tau_mem.
A run stops at its grokking step (checked every `chunk` updates) or at max_steps (censored: left out
of the fits, listed as such). Raising max_steps in a rerun continues the censored runs.

Fits (wtc.studies.grok_law_fit): ordinary least squares of log tau on log omega and log p
(exponents with 95% t-intervals), of log tau on log(omega * p) (one exponent), the same with the
redundancy R = (p - 1) / 2 in place of p, per-p omega slopes, for tau_grok and for the delay.
The law predicts exponents -1.

Resumable: each run's training state (wtc.models.training.Trainer) lives in
out/runs/p<p>_wd<omega>_s<seed>/train_state; a rerun with the same config continues every run
(max_steps and the lists of moduli / weight decays / seeds may change: runs are keyed by their own
settings). Writes summary.json, report.md and grok_law.png.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wtc.errors import StudyError
from wtc.models import Transformer, TransformerConfig
from wtc.models.training import Eval, TrainConfig, Trainer
from wtc.studies import grok_law_fit
from wtc.studies.clock import Clock, check_config, study_dir
from wtc.studies.modadd import all_pairs, split
from wtc.threads import torch_threads


@dataclass
class GrokLawStudy:
    moduli: tuple = (23, 31, 41, 53)
    weight_decays: tuple = (0.5, 1.0, 2.0, 4.0)
    seeds: tuple = (0,)
    train_frac: float = 0.7
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 256
    lr: float = 3e-3
    max_steps: int = 8000
    eval_every: int = 10
    chunk: int = 200                 # updates between checks for grokking (and training-state saves)
    train_threshold: float = 0.99
    test_threshold: float = 0.95
    threads: int = 1

    @classmethod
    def quick(cls) -> GrokLawStudy:
        return cls(moduli=(23, 31, 41), weight_decays=(1.0, 2.0, 3.0, 4.0), max_steps=4000)

    def __post_init__(self) -> None:
        def ints(name, lo):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise StudyError(f"GrokLawStudy.{name} must be an int >= {lo}, got {v!r}")

        for name in ("n_layers", "d_model", "n_heads", "d_mlp", "max_steps", "eval_every", "chunk", "threads"):
            ints(name, 1)
        if self.d_model % self.n_heads:
            raise StudyError(f"GrokLawStudy.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        self.moduli, self.weight_decays, self.seeds = tuple(self.moduli), tuple(self.weight_decays), tuple(self.seeds)
        for name, vals, ok, what in (
                ("moduli", self.moduli, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 5, "ints >= 5"),
                ("weight_decays", self.weight_decays,
                 lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
                 "finite numbers > 0"),
                ("seeds", self.seeds, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "ints >= 0")):
            if not vals or not all(ok(v) for v in vals) or len(set(vals)) != len(vals):
                raise StudyError(f"GrokLawStudy.{name} must be a non-empty list of distinct {what}, got {list(vals)!r}")
        self.weight_decays = tuple(float(w) for w in self.weight_decays)
        for name, lo, hi in (("train_frac", 0.0, 1.0), ("train_threshold", 0.0, 1.0), ("test_threshold", 0.0, 1.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo < v <= hi:
                raise StudyError(f"GrokLawStudy.{name} must be in ({lo}, {hi}], got {v!r}")
        for p in self.moduli:
            if not 1 <= int(self.train_frac * p * p) < p * p:
                raise StudyError(f"GrokLawStudy.train_frac={self.train_frac} leaves no train or no test pairs at p={p}")
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or not math.isfinite(self.lr) or self.lr <= 0:
            raise StudyError(f"GrokLawStudy.lr must be a finite number > 0, got {self.lr!r}")


CONFIG = GrokLawStudy
HEADLINE = ("fit.grok.exponent_omega", "fit.grok.ci_omega", "fit.grok.exponent_p", "fit.grok.ci_p",
            "fit.grok.exponent_product", "fit.grok.ci_product", "n_grokked", "n_censored")
OUTPUTS = ("summary.json", "report.md", "grok_law.png")
# settings that change a run's numbers (its training state must agree on them)
_RUN_FIELDS = ("train_frac", "n_layers", "d_model", "n_heads", "d_mlp", "lr", "eval_every")


def run_name(p: int, wd: float, seed: int) -> str:
    return f"p{p}_wd{wd:g}_s{seed}"


def make_model(cfg: GrokLawStudy, p: int, seed: int) -> Transformer:
    return Transformer(TransformerConfig(n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
                                         d_head=cfg.d_model // cfg.n_heads, d_mlp=cfg.d_mlp, d_vocab=p, n_ctx=2),
                       seed=seed)


def grok_steps(points: list[dict], train_threshold: float, test_threshold: float) -> tuple[int | None, int | None]:
    """(tau_mem, tau_grok) from accuracy records {"step", "train_acc", "test_acc"} (see the module doc)."""
    mem = next((r["step"] for r in points if r["train_acc"] >= train_threshold), None)
    if mem is None:
        return None, None
    grok = next((r["step"] for r in points if r["step"] >= mem and r["test_acc"] >= test_threshold), None)
    return mem, grok


def train_run(cfg: GrokLawStudy, p: int, wd: float, seed: int, out: Path, progress: bool = False) -> dict:
    """One run, resumed from its training state, trained in chunks until it groks or reaches max_steps."""
    x, y = all_pairs(p)
    train_idx, test_idx = split(p, cfg.train_frac, seed)
    xt, yt, xe, ye = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    model = make_model(cfg, p, seed)

    @torch.no_grad()
    def acc(t: Trainer) -> dict:
        return {"train_acc": float((model(xt)[:, -1].argmax(-1) == yt).float().mean()),
                "test_acc": float((model(xe)[:, -1].argmax(-1) == ye).float().mean())}

    trainer = Trainer(model, TrainConfig(steps=cfg.max_steps, lr=cfg.lr, weight_decay=wd), lambda step: None,
                      lambda _: F.cross_entropy(model(xt)[:, -1], yt),
                      path=out / "runs" / run_name(p, wd, seed) / "train_state",
                      identity={**{k: getattr(cfg, k) for k in _RUN_FIELDS}, "p": p, "seed": seed},
                      evals=(Eval("acc", acc, every=cfg.eval_every, at={0}),), progress=False)
    trainer.resume()

    def state():
        return grok_steps(trainer.metrics["acc"], cfg.train_threshold, cfg.test_threshold)

    while state()[1] is None and trainer.step < cfg.max_steps:
        trainer.run(stop_after=min(cfg.max_steps, (trainer.step // cfg.chunk + 1) * cfg.chunk))
        if progress:
            last = trainer.metrics["acc"][-1]
            tqdm.write(f"grok-law {run_name(p, wd, seed)} step {trainer.step}: train {last['train_acc']:.3f} "
                       f"test {last['test_acc']:.3f}")
    mem, grok = state()
    return {"p": p, "redundancy": (p - 1) // 2, "weight_decay": wd, "seed": seed, "n_train": len(train_idx),
            "mem_step": mem, "grok_step": grok, "delay": None if grok is None else grok - mem,
            "grokked": grok is not None, "steps_trained": trainer.step, "seconds": round(trainer.seconds, 1),
            "curve": trainer.metrics["acc"]}


def run(cfg: GrokLawStudy | None, out_dir, progress: bool = True) -> dict:
    """Every (p, omega, seed) run (resumably), the fits; writes summary.json, report.md, grok_law.png."""
    cfg = cfg or GrokLawStudy()
    if not isinstance(cfg, GrokLawStudy):
        raise StudyError(f"cfg must be a GrokLawStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    check_config(out, asdict(cfg), ("moduli", "weight_decays", "seeds", "max_steps", "chunk", "threads",
                                    "train_threshold", "test_threshold"), "grok-law")
    clock = Clock(out)
    grid = [(p, wd, s) for p in cfg.moduli for wd in cfg.weight_decays for s in cfg.seeds]
    runs = []
    with torch_threads(cfg.threads):
        for p, wd, s in tqdm(grid, desc="grok-law runs", disable=not progress, leave=False):
            runs.append(train_run(cfg, p, wd, s, out, progress))
            clock.save()
    (out / "curves.json").write_text(json.dumps({run_name(r["p"], r["weight_decay"], r["seed"]): r.pop("curve")
                                                 for r in runs}))
    done = [r for r in runs if r["grokked"]]
    fit = {}
    for key, field in (("grok", "grok_step"), ("delay", "delay")):
        pts = [r for r in done if r[field] > 0]           # a log needs tau > 0 (a delay can be 0)
        fit[key] = grok_law_fit.fit_all([r["weight_decay"] for r in pts], [r["p"] for r in pts],
                                        [r[field] for r in pts])
    summary = {"config": asdict(cfg), "quantity_p": "the modulus p (redundancy R = (p - 1) / 2 Fourier modes)",
               "grok_definition": (f"first evaluated update (every {cfg.eval_every}) with test accuracy >= "
                                   f"{cfg.test_threshold}, at or after the first with train accuracy >= "
                                   f"{cfg.train_threshold}; full-batch updates"),
               "runs": runs, "n_runs": len(runs), "n_grokked": len(done), "n_censored": len(runs) - len(done),
               "censored": [run_name(r["p"], r["weight_decay"], r["seed"]) for r in runs if not r["grokked"]],
               "fit": fit, "seconds": round(clock.total(), 1), "seconds_this_run": round(clock.now(), 1)}
    clock.save()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    grok_law_fit.plot(out / "grok_law.png", summary)
    (out / "report.md").write_text(grok_law_fit.markdown(summary))
    return summary

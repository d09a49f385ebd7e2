"""Assign-and-Add study: how a transformer composes variable binding with addition mod 59.

Task (wtc.tasks.assign_add): the authors' definitions by default (variant "authors": their seed-42
split of the pairs, a, b never on the right and k, l never on the left, r the keep-probability of a
2-var row, r = 1 as their train.py), this project's first definitions as variant "wtc-v1". The full
configuration is the authors' run: 40k steps, an evaluation and a checkpoint every 100 steps.

Setting (issue 8): 2 layers, 1 head, d_model = d_head = 128,
d_mlp = 512, ReLU, no biases, no LayerNorm, no layer-1 MLP, learned absolute positions, causal;
model_init "authors" (default) as their TransformerLens HookedTransformer: every weight matrix drawn
from N(0, 0.64 / d_model) (TransformerLens's "gpt2" init) and 59 outputs, the numbers (the 15 other
logits held at a fixed bias of -1e4 with zero weights, as load_checkpoint reads their models), so
the loss and the argmax range over the numbers alone; "wtc-v1" (the runs before session 20): wtc's
fan-in init, N(0, 1 / fan_in), and all 74 outputs. AdamW lr 1e-3, weight decay 0.02, batches of 512 fresh sequences, cross-entropy at "=" only (the
last block runs for that query alone: the same loss, about twice as fast on a CPU).

Every `eval_every` steps: the accuracy of every evaluation pool, the routing rates, the virtual
addition accuracy and the loss (curve.json). Every `checkpoint_every` steps: weights, the Fourier
analysis and the twin cosine (checkpoints/step_*/record.json, written last). At the end: the ACE
core at "=", the exhaustive 2-var union (the authors' final evaluation set, 193,580 sequences for
their task: acc_2var_union_exhaustive beside acc_0var_heldout, which is exhaustive already: each
held-out pair once), the f / r sweeps (the authors' two panels: f at the main r scored on the 0-var held-out
pairs, r at the main f scored on the 2-var union; each point stops at the first evaluation where its
panel's accuracy reaches sweep_level, so a threshold is bracketed without training the points that
generalise to the end; `thresholds`), the linear probes (wtc.studies.assign_add_probes), and, with
authors_dir, the authors' released checkpoints measured by the same code (summary "authors").

Resumable: batches are a function of (seed, step) and training runs in wtc.models.training.Trainer,
whose training state (out/train_state: weights, AdamW state, step, curve and records) is written at
every checkpoint, so a rerun continues from there and reproduces what an uninterrupted run
computes; each checkpoint also leaves a snapshot of the model for later analysis
(checkpoints/step_*/: weights and record.json). Sweep points resume the same way under sweeps/. A
different config in the same directory is refused (`steps` may grow).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wtc.arguments import seed as seed_arg
from wtc.errors import StudyError
from wtc.models import Transformer, TransformerConfig
from wtc.models import io as model_io
from wtc.models.training import Eval, TrainConfig, Trainer
from wtc.studies import assign_add_analysis as an
from wtc.studies import assign_add_probes as probes
from wtc.studies import assign_add_report as report
from wtc.studies.assign_add_sweeps import PANELS, main_points, panel_stop, thresholds
from wtc.studies.clock import Clock, check_config, resolved, same_path, study_dir
from wtc.threads import torch_threads
from wtc.tasks.assign_add import _DEFAULTS, ANSWER_POS, P, SEQ_LEN, TWO_VAR_POOLS, VARIANTS, VOCAB, AssignAdd

ANSWER = slice(ANSWER_POS, ANSWER_POS + 1)
MODEL_INITS = ("authors", "wtc-v1")
TARGETS = {"0var_heldout": 0.99, "2var_union": 0.98}     # the bar for the main run's end (union: exhaustive)
PHASE_METRICS = ("0var_heldout", "1var_heldout", "2var_valid", "2var_union", "1var_restricted",
                 "l2_value_routing_rate", "l1_prev_token_rate", "virtual_addition")


@dataclass
class AssignAddStudy:
    steps: int = 40000
    variant: str = "authors"         # task definitions: "authors" | "wtc-v1" (wtc.tasks.assign_add)
    model_init: str = "authors"      # init and outputs: "authors" | "wtc-v1" (module doc; MODEL_INITS)
    f: float = 0.7                   # share of the 59^2 pairs in training
    r: float | None = None           # authors: keep-probability of a 2-var row (1.0); wtc-v1: 2-var share (0.25)
    no_right: tuple[str, ...] | None = None   # None: the variant's (authors a, b; wtc-v1 a, b, c)
    no_left: tuple[str, ...] | None = None    # None: the variant's (authors k, l; wtc-v1 d, e, f)
    split_seed: int | None = None    # seed of the pair split (None: authors 42, theirs; wtc-v1 the study seed)
    d_model: int = 128
    d_mlp: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.02
    batch: int = 512
    eval_every: int = 100
    checkpoint_every: int = 100      # the authors' checkpoint interval
    pool_size: int = 1024
    phase_window: int = 1000         # a phase: a metric rising by >= phase_jump within this many steps
    phase_jump: float = 0.15
    sweep_f: tuple[float, ...] = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5)     # around the paper's f ~ 0.25
    sweep_r: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)     # around the paper's r ~ 0.2
    sweep_steps: int = 30000         # the most a point trains: the authors' sweep runs train.py's default, 30k steps
    sweep_stop: bool = True          # a point stops at the first evaluation where its panel reaches sweep_level
    sweep_level: float = 0.9         # a point "generalised": its panel's accuracy >= this (chance: 1/59)
    scan_sequences: int = 64         # per-weight scan of the final model at "=" (0: none)
    scan_attention_sample: int = 512 # attention weights drawn per matrix for the scan
    seed: int = 0
    threads: int = 2                 # measured: 53 ms a step with 2 threads, 105 ms with 1 (2 cores)
    authors_dir: str | None = None   # the authors' checkpoints to measure beside ours (None: not measured)
    union_seed: int = 201            # surface forms of the exhaustive 2-var union

    @classmethod
    def quick(cls) -> AssignAddStudy:
        # wtc-v1, seed 0: 0-var held-out >= 0.99 by step 2000, the restricted pools jump at ~9.3k
        # steps; the authors' own run (their checkpoints) makes its restricted jump at 14.5-16k, so
        # 14k steps may stop short of it on their task (not run here yet)
        return cls(steps=14000, eval_every=250, checkpoint_every=2000, sweep_f=(0.4,), sweep_r=(0.0,),
                   sweep_steps=3000)

    def __post_init__(self) -> None:
        for name in ("steps", "d_model", "d_mlp", "batch", "eval_every", "checkpoint_every", "pool_size",
                     "phase_window", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StudyError(f"AssignAddStudy.{name} must be a positive int, got {v!r}")
        for name in ("sweep_steps", "scan_sequences", "scan_attention_sample"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise StudyError(f"AssignAddStudy.{name} must be an int >= 0, got {v!r}")
            setattr(self, name, int(v))          # a numpy integer as an int (config.json)
        for name in ("seed", "union_seed") + (("split_seed",) if self.split_seed is not None else ()):
            setattr(self, name, seed_arg(getattr(self, name), f"AssignAddStudy.{name}", StudyError))
        for name in ("lr", "weight_decay", "phase_jump"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise StudyError(f"AssignAddStudy.{name} must be a finite number, got {v!r}")
            setattr(self, name, v.item() if isinstance(v, (np.integer, np.floating)) else v)
        if self.checkpoint_every % self.eval_every:
            raise StudyError(f"checkpoint_every ({self.checkpoint_every}) must be a multiple of eval_every "
                             f"({self.eval_every})")
        if not (self.lr > 0 and self.weight_decay >= 0 and 0 < self.phase_jump <= 1):
            raise StudyError(f"need lr > 0, weight_decay >= 0, 0 < phase_jump <= 1; got {self.lr}, "
                             f"{self.weight_decay}, {self.phase_jump}")
        if self.model_init not in MODEL_INITS:
            raise StudyError(f"AssignAddStudy.model_init must be one of {', '.join(MODEL_INITS)}, got {self.model_init!r}")
        if self.variant not in VARIANTS:
            raise StudyError(f"AssignAddStudy.variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        d_right, d_left, d_r, _ = _DEFAULTS[self.variant]
        self.no_right = tuple(d_right if self.no_right is None else self.no_right)
        self.no_left = tuple(d_left if self.no_left is None else self.no_left)
        self.r = d_r if self.r is None else self.r
        self.sweep_f, self.sweep_r = tuple(self.sweep_f), tuple(self.sweep_r)
        for name in ("f", "r"):
            for v in (getattr(self, name),) + getattr(self, f"sweep_{name}"):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise StudyError(f"AssignAddStudy.{name} values must be numbers, got {v!r}")
        bad_f = [f for f in (self.f,) + self.sweep_f if not 0 < f <= 1]
        bad_r = [r for r in (self.r,) + self.sweep_r if not 0 <= r <= 1]
        if bad_f or bad_r:
            raise StudyError(f"f values must lie in (0, 1] and r values in [0, 1]; got f {bad_f}, r {bad_r}")
        if self.f in self.sweep_f or self.r in self.sweep_r:      # one directory, two stop rules
            raise StudyError(f"sweep_f must not hold f ({self.f:g}) nor sweep_r r ({self.r:g}): the main run is "
                             "that point of each panel already")
        if isinstance(self.sweep_level, bool) or not isinstance(self.sweep_level, (int, float)) or \
                not 0 < self.sweep_level <= 1:
            raise StudyError(f"sweep_level must be an accuracy in (0, 1], got {self.sweep_level!r}")
        try:
            self.task()
        except ValueError as exc:
            raise StudyError(str(exc)) from None

    def task(self, **change) -> AssignAdd:
        seed = self.split_seed if self.split_seed is not None else (None if self.variant == "authors" else self.seed)
        kw = {"f": self.f, "r": self.r, "no_right": self.no_right, "no_left": self.no_left, "seed": seed,
              "variant": self.variant}
        return AssignAdd(**{**kw, **change})

    def to_dict(self) -> dict:
        return asdict(self)


CONFIG = AssignAddStudy
# summary keys `wtc study assign-add` prints (dotted: into nested objects)
HEADLINE = ("steps", "acc_0var_heldout", "acc_2var_union_exhaustive", "acc_2var_union", "l1_prev_token_rate", "l2_value_routing_rate",
            "routing_jump.t50", "virtual_addition_ready_step", "key_frequencies")
OUTPUTS = ("summary.json", "report.md", "assign_add.png")


def make_model(cfg: AssignAddStudy) -> Transformer:
    model = Transformer(TransformerConfig(n_layers=2, d_model=cfg.d_model, n_heads=1, d_head=cfg.d_model,
                                          d_mlp=cfg.d_mlp, d_vocab=VOCAB, n_ctx=SEQ_LEN, act_fn="relu",
                                          normalization=None, mlp_layers=(1,), bias=False), seed=cfg.seed)
    if cfg.model_init == "authors":
        from wtc.studies.assign_add_authors import authors_init

        authors_init(model, cfg.seed)
    return model


def batch_at(task: AssignAdd, seed: int, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of a step: a function of (seed, step) alone, so resumes are exact."""
    x, y = task.sample_train(np.random.default_rng([seed, 17, step]), n)
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def evaluate(model, pools: dict, grid_tokens) -> dict:
    """Pool accuracies, routing rates (2-var union) and virtual addition accuracy."""
    out = {}
    for name, (x, y) in pools.items():
        out[name] = float((model.logits_at(x, ANSWER)[:, 0].argmax(-1) == y).float().mean())
    union = pools["2var_union"][0].numpy()
    out.update(an.routing(model, union))
    out["virtual_addition"] = an.virtual_addition(model, pools["2var_valid"][0].numpy())
    return out


# settings a training state must agree on besides its TrainConfig (lr, weight decay)
_TRAIN_FIELDS = ("f", "r", "no_right", "no_left", "d_model", "d_mlp", "batch", "seed", "variant", "split_seed", "model_init")


def met_targets(acc_0var_heldout: float, acc_2var_union_exhaustive: float) -> dict:
    """The main run's final accuracies against TARGETS (the union: exhaustive, the authors' mix)."""
    return {"0var_heldout": acc_0var_heldout >= TARGETS["0var_heldout"],
            "2var_union": acc_2var_union_exhaustive >= TARGETS["2var_union"]}


def _trainer(model, cfg: AssignAddStudy, task: AssignAdd, steps: int, pools, grid, path: Path, desc: str,
             progress: bool, eval_every: int | None, curve_at=(), evals: tuple = (), stop=None) -> Trainer:
    """AdamW on cross-entropy at "="; the batch of update `step` is batch_at(step + 1); a "curve"
    Eval every eval_every steps (and at curve_at and `steps`) records the mean loss since the
    previous point and evaluate() (training stops at a point where `stop` holds); `evals` come after it."""
    def curve_point(t: Trainer) -> dict:
        curve = t.metrics["curve"]
        window = t.step - curve[-1]["step"] if curve else len(t.history["loss"])
        losses = t.history["loss"][len(t.history["loss"]) - window:]
        return {"loss": sum(losses) / len(losses) if losses else None, **evaluate(model, pools, grid)}

    return Trainer(model, TrainConfig(steps=steps, lr=cfg.lr, weight_decay=cfg.weight_decay),
                   lambda step: batch_at(task, cfg.seed, step + 1, cfg.batch),
                   lambda b: F.cross_entropy(model.logits_at(b[0], ANSWER)[:, 0], b[1]), path=path,
                   identity={k: getattr(cfg, k) for k in _TRAIN_FIELDS},
                   evals=(Eval("curve", curve_point, every=eval_every, at=set(curve_at) | {steps},
                               show=("0var_heldout", "2var_union"), stop=stop),) + tuple(evals),
                   checkpoint_every=cfg.checkpoint_every, progress=progress, desc=desc, leave=False)


# ---------------------------------------------------------------- checkpoints


def _ckpt(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


# config fields a rerun may change: sweeps are kept per point, phases are read off the curve, the
# scan off the final model, and steps extend the run
_FREE = {"steps", "threads", "sweep_f", "sweep_r", "sweep_steps", "sweep_stop", "sweep_level", "phase_window", "phase_jump", "scan_sequences",
         "scan_attention_sample", "authors_dir", "union_seed"}


def _pools(task: AssignAdd, cfg: AssignAddStudy) -> dict:
    return {k: (torch.from_numpy(x), torch.from_numpy(y)) for k, (x, y) in task.pools(cfg.pool_size).items()}


@torch.no_grad()
def checkpoint_analysis(model, pools: dict, grid) -> dict:
    qk = an.qk_identity(model)
    return {"fourier": an.fourier(model, grid), "fourier_additive": an.fourier_additive(model),
            "qk_identity": {k: v for k, v in qk.items() if k != "scores"}, "prev_token_qk": an.prev_token_qk(model),
            "twin_cosine": {k: an.twin_cosine(model, pools[k][0].numpy()) for k in ("1var_heldout", "2var_valid")}}


def ace_core(model, pools: dict, energy: float = 0.99) -> dict:
    """The core of the residual stream before the layer-2 MLP at "=" (readout: centred logits) on
    the 2-var union, validated by keeping / removing it on every pool."""
    from wtc.ace import extract_core, patched_accuracy
    from wtc.studies.modadd import _bisect, centred_logits

    x, y = pools["2var_union"]
    core = extract_core(model, x, an.L2_RESID_MID, readout=centred_logits, energy=energy, position=-1)
    base = patched_accuracy(model, x, y, core, "clean")
    m = core.basis.shape[1]
    sufficient = _bisect(lambda r: patched_accuracy(model, x, y, core, "keep", r) >= base - 0.005, 0, m)
    per_pool = {k: {"clean": patched_accuracy(model, px, py, core, "clean"),
                    "keep": patched_accuracy(model, px, py, core, "keep"),
                    "remove": patched_accuracy(model, px, py, core, "remove")} for k, (px, py) in pools.items()}
    return {"layer": an.L2_RESID_MID, "position": "=", "energy": energy, "rank": core.rank,
            "sufficient_rank": sufficient, "max_rank": m, "singular_values": core.s[:64].tolist(),
            "pools": per_pool}


# ---------------------------------------------------------------- the study


def _main_run(out: Path, cfg: AssignAddStudy, progress: bool, clock: Clock) -> tuple[Transformer, list, list]:
    task = cfg.task()
    pools = _pools(task, cfg)
    grid = an.zero_var_grid(task)
    model = make_model(cfg)                      # its weights come from the training state when resuming

    def checkpoint(t: Trainer) -> dict:
        rec = {**t.metrics["curve"][-1], **checkpoint_analysis(model, pools, grid)}    # the curve point of this step
        d = _ckpt(out, t.step)
        model_io.save(model, d, extra={"source": "assign_add", "step": t.step})
        (d / "record.json").write_text(json.dumps(rec))
        clock.save()
        if progress:
            tqdm.write(f"assign-add step {t.step}: 0var held-out {rec['0var_heldout']:.3f}, 2var union "
                       f"{rec['2var_union']:.3f}, L1 prev-token {rec['l1_prev_token_rate']:.2f}, L2 value "
                       f"routing {rec['l2_value_routing_rate']:.2f}, virtual addition "
                       f"{rec['virtual_addition']:.3f}, key frequencies {rec['fourier']['key_frequencies']}")
        return rec

    trainer = _trainer(model, cfg, task, cfg.steps, pools, grid, out / "train_state", "assign-add", progress,
                       cfg.eval_every, curve_at={0},
                       evals=(Eval("records", checkpoint, every=cfg.checkpoint_every, at={0, cfg.steps}),))
    trainer.resume()
    records = [r for r in trainer.metrics["records"] if r["step"] <= cfg.steps]
    if trainer.step > cfg.steps and records[-1]["step"] != cfg.steps:
        raise StudyError(f"{out} has trained past step {cfg.steps} (to {trainer.step}) without a checkpoint at "
                         f"{cfg.steps}; ask for at least {trainer.step} steps or use another --out")
    trainer.run()
    records = [r for r in trainer.metrics["records"] if r["step"] <= cfg.steps]
    curve = [c for c in trainer.metrics["curve"] if c["step"] <= cfg.steps]
    (out / "curve.json").write_text(json.dumps(curve))
    final = model_io.load(_ckpt(out, cfg.steps)).float()
    return final, curve, records


def union_exhaustive(out: Path, model, task: AssignAdd, cfg: AssignAddStudy) -> dict:
    """The final model on the exhaustive 2-var union (and the exhaustive 0-var held-out set), kept in
    union_exhaustive.json for this step count and union seed."""
    from wtc.studies import assign_add_authors as authors

    f = out / "union_exhaustive.json"
    if f.exists():
        rec = json.loads(f.read_text())
        if rec.get("steps") == cfg.steps and rec.get("union_seed") == cfg.union_seed:
            return rec
    rec = {"steps": cfg.steps, "union_seed": cfg.union_seed,
           **authors.exhaustive_accuracy(model, task, task.exhaustive_2var_union(cfg.union_seed))}
    f.write_text(json.dumps(rec))
    return rec


def _authors(out: Path, cfg: AssignAddStudy, progress: bool) -> dict:
    """The authors' checkpoints in cfg.authors_dir measured with this study's code on their own task
    (their split), kept in authors.json: the final model on the exhaustive sets and every pool, and
    per checkpoint the pools, routing rates and virtual addition."""
    from wtc.studies import assign_add_authors as authors

    f = out / "authors.json"
    if f.exists():
        rec = json.loads(f.read_text())
        if same_path(rec.get("dir"), cfg.authors_dir) and rec.get("union_seed") == cfg.union_seed:
            return rec
    ck = authors.checkpoints(cfg.authors_dir)
    task = authors.authors_task()
    pools = _pools(task, cfg)
    grid = an.zero_var_grid(task)
    timeline = []
    for step, path in tqdm([(s, p) for s, p in ck.items() if s != "final"], desc="authors' checkpoints",
                           disable=not progress, leave=False):
        m = authors.load_checkpoint(path)
        timeline.append({"step": step, **evaluate(m, pools, grid), **checkpoint_analysis(m, pools, grid)})
    rec = {"dir": resolved(cfg.authors_dir), "union_seed": cfg.union_seed, "timeline": timeline, "final": None}
    if "final" in ck:
        m = authors.load_checkpoint(ck["final"])
        rec["final"] = {**authors.exhaustive_accuracy(m, task, task.exhaustive_2var_union(cfg.union_seed)),
                        "pools": evaluate(m, pools, grid), "fourier": an.fourier(m, grid)}
    f.write_text(json.dumps(rec))
    return rec


def _authors_probes(out: Path, cfg: AssignAddStudy) -> dict:
    """The linear probes on the authors' final model and along their checkpoints (authors_probes.json)."""
    from wtc.studies import assign_add_authors as authors

    ck = authors.checkpoints(cfg.authors_dir)
    if "final" not in ck:
        raise StudyError(f"{cfg.authors_dir} has no final model (model_state_dict.pth) to probe")
    return probes.probe_record(out / "authors_probes.json", authors.authors_task(), authors.load_checkpoint(ck["final"]),
                               {s: (lambda p=p: authors.load_checkpoint(p)) for s, p in ck.items() if s != "final"},
                               str(cfg.authors_dir))


def _sweep_point(out: Path, cfg: AssignAddStudy, panel: str, value: float, progress: bool) -> dict:
    """One point of a panel (PANELS): a run with f (or r) = value and the other at the main run's,
    evaluated every eval_every steps, for at most sweep_steps (with sweep_stop, until the panel's
    accuracy reaches sweep_level): its last curve point, the step it first reached the level
    (reached_at, None if never), the steps it ran and, for the r panel, the exhaustive 2-var union of
    the model it ends with (the authors' figure). Cached in result.json; resumable."""
    f, r = (value, cfg.r) if panel == "f" else (cfg.f, value)
    metric = PANELS[panel]
    d = out / "sweeps" / f"f{f:g}_r{r:g}"
    res = d / "result.json"
    key = {"panel": panel, "metric": metric, "steps": cfg.sweep_steps, "stop": cfg.sweep_stop,
           "level": cfg.sweep_level, **({"union_seed": cfg.union_seed} if panel == "r" else {})}
    if res.exists():
        rec = json.loads(res.read_text())
        if all(rec.get(k) == v for k, v in key.items()):
            return rec
    task = cfg.task(f=f, r=r)
    pools = _pools(task, cfg)
    grid = an.zero_var_grid(task)
    model = make_model(cfg)
    trainer = _trainer(model, replace(cfg, f=f, r=r, sweep_f=(), sweep_r=()), task, cfg.sweep_steps, pools, grid, d / "train_state",
                       f"sweep {panel}={value:g}", progress, eval_every=cfg.eval_every,
                       stop=panel_stop(metric, cfg.sweep_level) if cfg.sweep_stop else None)
    result = trainer.run()
    curve = result.metrics["curve"]
    hit = next((i for i, c in enumerate(curve) if c[metric] >= cfg.sweep_level), None)
    # a point trained before sweeps were evaluated along the way has no curve before its end: its
    # reached_at is then only an upper bound
    exact = hit is not None and curve[hit]["step"] - (curve[hit - 1]["step"] if hit else 0) <= cfg.eval_every
    # with the stop on, the point is read where it reached the level, even when a run under another
    # rule (a higher level, no stop) trained past it
    at = curve[hit] if cfg.sweep_stop and hit is not None else curve[-1]
    rec = {"f": f, "r": r, **key, "steps_run": result.step,
           "reached_at": None if hit is None else curve[hit]["step"], "reached_at_exact": exact,
           "seconds": round(result.seconds, 1), **at}
    if panel == "r":
        from wtc.studies import assign_add_authors as authors

        ex = authors.exhaustive_accuracy(model, task, task.exhaustive_2var_union(cfg.union_seed))
        rec["acc_2var_union_exhaustive"] = ex["acc_2var_union_exhaustive"]
        rec["exhaustive_at"] = result.step              # the model the run ends with
    res.write_text(json.dumps(rec))
    return rec


def run(cfg: AssignAddStudy | None, out_dir, progress: bool = True) -> dict:
    """Train (resumably) and analyse; writes summary.json, report.md and the plots; returns the summary."""
    cfg = cfg or AssignAddStudy()
    if not isinstance(cfg, AssignAddStudy):
        raise StudyError(f"cfg must be an AssignAddStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    with torch_threads(cfg.threads):
        check_config(out, cfg.to_dict(), _FREE, "assign-add")
        clock = Clock(out)
        model, curve, records = _main_run(out, cfg, progress, clock)
        train_seconds = clock.total()
        task = cfg.task()
        pools = _pools(task, cfg)
        core = ace_core(model, pools)
        union = union_exhaustive(out, model, task, cfg)
        saved = {int(d.name.split("_")[1]): d for d in sorted((out / "checkpoints").glob("step_*"))
                 if int(d.name.split("_")[1]) <= cfg.steps}
        probed = probes.probe_record(out / "probes.json", task, model,
                                     {s: (lambda d=d: model_io.load(d).float()) for s, d in saved.items()}, str(out))
        authors = _authors(out, cfg, progress) if cfg.authors_dir else None
        if authors is not None and authors.get("final"):
            authors = {**authors, "probes": _authors_probes(out, cfg)}
        scanned = None
        if cfg.scan_sequences:
            x = pools["2var_union"][0].numpy()
            pick = np.random.default_rng([cfg.seed, 9]).choice(len(x), min(cfg.scan_sequences, len(x)), replace=False)
            scanned = an.weight_scan(model, x[np.sort(pick)], cfg.scan_attention_sample, cfg.seed)
        sweeps = [_sweep_point(out, cfg, "f", f, progress) for f in cfg.sweep_f] + \
                 [_sweep_point(out, cfg, "r", r, progress) for r in cfg.sweep_r] if cfg.sweep_steps else []
        if sweeps:
            sweeps += main_points(curve, cfg, union)
        final, last = curve[-1], records[-1]
        found = an.phases(curve, PHASE_METRICS, cfg.phase_window, cfg.phase_jump)
        transitions = {k: an.transition(curve, k) for k in PHASE_METRICS}
        routing_jump = transitions["l2_value_routing_rate"]
        addition_ready = next((c["step"] for c in curve if c["virtual_addition"] >= 0.99), None)
        summary = {
            "config": cfg.to_dict(), "steps": final["step"],
            "acc_0var_heldout": final["0var_heldout"], "acc_2var_union": final["2var_union"],
            "acc_2var_union_exhaustive": union["acc_2var_union_exhaustive"], "union_exhaustive": union,
            "targets": TARGETS, "targets_met": met_targets(final["0var_heldout"], union["acc_2var_union_exhaustive"]),
            "variant": cfg.variant, "model_init": cfg.model_init, "authors": authors,
            "pools": {k: final[k] for k in pools},
            "l1_prev_token_rate": final["l1_prev_token_rate"],
            "l2_value_routing_rate": final["l2_value_routing_rate"],
            "l2_value_attention_mass": final["l2_value_attention_mass"],
            "virtual_addition": final["virtual_addition"],
            "virtual_addition_ready_step": addition_ready,
            "routing_jump": routing_jump,
            "addition_before_routing_jump": (None if routing_jump is None or addition_ready is None
                                             else addition_ready < routing_jump["t50"]),
            "transitions": transitions,
            "first_step_0var_heldout_99": next((c["step"] for c in curve if c["0var_heldout"] >= 0.99), None),
            "first_step_2var_union_97": next((c["step"] for c in curve if c["2var_union"] >= 0.97), None),
            "key_frequencies": last["fourier"]["key_frequencies"],
            "fourier": last["fourier"], "twin_cosine": last["twin_cosine"],
            "fourier_additive": last["fourier_additive"], "qk_identity": last["qk_identity"],
            "prev_token_qk": last["prev_token_qk"],
            "probes": probed, "phases": found, "ace_core": core, "sweeps": sweeps,
            "sweep_thresholds": thresholds(sweeps, cfg) if sweeps else None, "weight_scan": scanned,
            "two_var_pools": list(TWO_VAR_POOLS),
            "seconds": round(clock.total(), 1), "train_seconds": round(train_seconds, 1),
        }
        clock.save()
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        report.plot(out, summary, curve)
        report.markdown(out, summary)
        return summary


__all__ = ["AssignAddStudy", "CONFIG", "HEADLINE", "OUTPUTS", "StudyError", "run", "make_model", "evaluate", "ace_core",
           "batch_at"]

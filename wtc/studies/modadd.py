"""ACE on modular addition and grokking: (a + b) mod p with a 2-layer transformer trained under
strong weight decay, its algorithmic core followed through training.

Setting (issue 6): p = 53, inputs [a, b] (no '=' token: the answer is read at b's position, which
attends to both), cross-entropy on the last position only, a seeded 50% split of the p^2 pairs,
2 layers (d_model 128, 4 heads, d_mlp 512, no LayerNorm), AdamW lr 1e-3 (torch's default betas),
weight decay 1.0, minibatches of 512 from a seeded per-epoch permutation (3 steps an epoch at p = 53).

At every checkpoint: train / test accuracy; the core of the final residual stream at the last
position (readout: the centred logits, softmax-invariant, so at most p - 1 directions), its rank at
`energy` and its minimal necessary / sufficient ranks (bisection on remove / keep accuracy over
all pairs); the class-mean shift operator on core coordinates, reps[c] A ~ reps[c + 1 mod p] with
reps[c] the mean over pairs with a + b = c, and the fraction of its eigenvalues within sin(pi/p) of
the unit circle (an eigenvalue of a rotation by 2 pi k / p is exactly on it; sin(pi/p) is half the
chord between neighbouring p-th roots of unity) and n_modes, the number of distinct frequencies
k = |angle| p / (2 pi) among those unit-circle eigenvalues.

The shift operator is a least-squares fit of p equations per coordinate. When the rank nears
p - 1 it fits any class means exactly, so it is a rotation whatever the network does: the
fraction is computed on at most `max_shift_rank` (default (p - 1) // 2) leading core coordinates
and the fit's relative residual is recorded, so a memorising network is not scored as a clock.

A weight-decay-0 branch forks from the last checkpoint before test accuracy first exceeds
`fork_below` (same weights and AdamW moments, weight decay set to 0) and trains on.

Everything is resumable. Each branch trains with wtc.models.training.Trainer; its training state
(checkpoints/<branch>/train_state: weights, AdamW state, step, curve and analysis records) is
written at every analysed checkpoint, and the fork point's state is kept beside its snapshot.
Each analysed checkpoint also leaves a snapshot for later analysis: checkpoints/<branch>/epoch_*/
(the weights, wtc.models.io, and record.json). A rerun with the same config continues from the
training state (epochs may grow); a different config in the same directory is refused.
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

from wtc import checkpoint_io
from wtc.errors import StudyError
from wtc.ace import extract_core, patched_accuracy, shift_operator
from wtc.models import Transformer, TransformerConfig
from wtc.models import io as model_io
from wtc.models.training import Eval, TrainConfig, Trainer, read_state
from wtc.studies import modadd_report
from wtc.studies.clock import Clock, check_config, study_dir
from wtc.threads import torch_threads


@dataclass
class ModAddStudy:
    p: int = 53
    train_frac: float = 0.5
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int = 512
    lr: float = 1e-3
    weight_decay: float = 1.0
    batch: int = 512
    epochs: int = 4000              # main branch (weight decay on)
    wd0_epochs: int = 2000          # weight-decay-0 branch, counted from its fork
    checkpoint_every: int = 100     # epochs between analysed checkpoints (plus early ones)
    curve_every: int = 10           # epochs between points of the accuracy curve
    fork_below: float = 0.1         # fork from the last checkpoint before test_acc first exceeds this
    energy: float = 0.99
    max_shift_rank: int | None = None   # None: (p - 1) // 2
    tolerance: float = 0.005        # minimal sufficient rank: keep accuracy within this of baseline
    analysis_samples: int | None = None   # None: all p^2 pairs
    seed: int = 0
    threads: int = 1

    @classmethod
    def quick(cls) -> ModAddStudy:
        return cls(epochs=1500, wd0_epochs=600, checkpoint_every=100)

    def __post_init__(self) -> None:
        def pos_int(name, lo=1):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise StudyError(f"ModAddStudy.{name} must be an int >= {lo}, got {v!r}")

        for name in ("n_layers", "d_model", "n_heads", "d_mlp", "batch", "epochs", "checkpoint_every",
                     "curve_every", "threads"):
            pos_int(name)
        pos_int("p", 3)
        pos_int("wd0_epochs", 0)
        pos_int("seed", 0)
        if self.d_model % self.n_heads:
            raise StudyError(f"ModAddStudy.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for name, lo, hi in (("train_frac", 0.0, 1.0), ("energy", 0.0, 1.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo < v <= hi or not math.isfinite(v):
                raise StudyError(f"ModAddStudy.{name} must be in ({lo}, {hi}], got {v!r}")
        n_train = int(self.train_frac * self.p ** 2)
        if not 1 <= n_train < self.p ** 2:
            raise StudyError(f"ModAddStudy.train_frac={self.train_frac} leaves {n_train} of {self.p ** 2} pairs "
                             "for training; both train and test sets must be non-empty")
        for name in ("lr", "weight_decay", "fork_below", "tolerance"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise StudyError(f"ModAddStudy.{name} must be a finite number >= 0, got {v!r}")
        if self.lr <= 0:
            raise StudyError(f"ModAddStudy.lr must be > 0, got {self.lr!r}")
        if self.max_shift_rank is not None:
            pos_int("max_shift_rank")
        if self.analysis_samples is not None:
            pos_int("analysis_samples", 2)
            if self.analysis_samples > self.p ** 2:
                raise StudyError(f"ModAddStudy.analysis_samples={self.analysis_samples} exceeds the {self.p ** 2} pairs")

    @property
    def shift_rank_cap(self) -> int:
        return self.max_shift_rank if self.max_shift_rank is not None else max((self.p - 1) // 2, 1)


CONFIG = ModAddStudy
# summary keys `wtc study modadd` prints (dotted: into nested objects and lists)
HEADLINE = ("grok_step", "final.step", "final.test_acc", "final.rank", "final.necessary_rank",
            "final.unit_circle_fraction", "final.n_modes", "final.frequencies", "wd0_branch.fork_step",
            "wd0_branch.grok_step", "wd0_branch.checkpoints.-1.test_acc", "wd0_branch.checkpoints.-1.rank")
OUTPUTS = ("summary.json", "report.md", "modadd.png", "modadd_eigenvalues.png")


# ---------------------------------------------------------------- data


def all_pairs(p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every input [a, b] (p^2, 2), row a * p + b, and its answer (a + b) mod p."""
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    x = torch.stack([a.reshape(-1), b.reshape(-1)], 1)
    return x, (x[:, 0] + x[:, 1]) % p


def split(p: int, train_frac: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) row indices into all_pairs(p): a seeded permutation cut at train_frac."""
    n = p * p
    n_train = int(train_frac * n)
    if not 1 <= n_train < n:
        raise StudyError(f"train_frac={train_frac} leaves {n_train} of {n} pairs for training")
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    return perm[:n_train].sort().values, perm[n_train:].sort().values


# ---------------------------------------------------------------- spectra


def unit_circle_stats(eigenvalues, p: int) -> tuple[float | None, int]:
    """(fraction of eigenvalues with ||lambda| - 1| <= sin(pi/p), number of distinct frequencies
    k = round(|angle| p / 2 pi) >= 1 among them). eigenvalues: complex array or [re, im] pairs."""
    ev = np.asarray(eigenvalues)
    if ev.size == 0:
        return None, 0
    if not np.iscomplexobj(ev):
        ev = ev.reshape(-1, 2)
        ev = ev[:, 0] + 1j * ev[:, 1]
    on = np.abs(np.abs(ev) - 1.0) <= math.sin(math.pi / p)
    k = np.rint(np.abs(np.angle(ev[on])) * p / (2 * math.pi)).astype(int)
    return float(on.mean()), len(set(k[k >= 1].tolist()))


def class_means(Z: torch.Tensor, labels: torch.Tensor, p: int) -> torch.Tensor:
    """(p, r) mean of the rows of Z (n, r) per answer class."""
    counts = torch.bincount(labels, minlength=p)
    if (counts == 0).any():
        raise StudyError(f"classes {torch.nonzero(counts == 0).flatten().tolist()[:10]} have no analysis samples")
    sums = torch.zeros(p, Z.shape[1], dtype=Z.dtype).index_add_(0, labels, Z)
    return sums / counts[:, None].to(Z.dtype)


# ---------------------------------------------------------------- model and training


def make_model(cfg: ModAddStudy) -> Transformer:
    return Transformer(TransformerConfig(n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
                                         d_head=cfg.d_model // cfg.n_heads, d_mlp=cfg.d_mlp, d_vocab=cfg.p,
                                         n_ctx=2), seed=cfg.seed)


def layer_name(cfg: ModAddStudy) -> str:
    return f"blocks.{cfg.n_layers - 1}.hook_resid_post"


def centred_logits(out: torch.Tensor) -> torch.Tensor:
    last = out[:, -1]
    return last - last.mean(-1, keepdim=True)


def _batches(cfg: ModAddStudy, data: "_Data"):
    """Update `step`'s batch: epoch e = step // steps_per_epoch + 1 walks a permutation of the
    training pairs seeded by (seed, e) in slices of `batch`, so a resumed run draws the same batches."""
    spe, cache = data.steps_per_epoch, {}

    def batch(step: int):
        e, i = divmod(step, spe)
        if cache.get("epoch") != e + 1:
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + e + 1)
            cache.update(epoch=e + 1, order=data.train_idx[torch.randperm(len(data.train_idx), generator=gen)])
        idx = cache["order"][i * cfg.batch:(i + 1) * cfg.batch]
        return data.x[idx], data.y[idx]

    return batch


@torch.no_grad()
def accuracy(model, x, y, idx) -> tuple[float, float]:
    logits = model(x[idx])[:, -1]
    return float((logits.argmax(-1) == y[idx]).float().mean()), float(F.cross_entropy(logits, y[idx]))


def _bisect(pred, lo: int, hi: int) -> int | None:
    """Smallest r in [lo, hi] with pred(r), assuming pred is monotone; None when pred(hi) fails."""
    if not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def analyse(model, cfg: ModAddStudy, x, y, train_idx, test_idx, sample_idx) -> dict:
    """The per-checkpoint figures (see the module docstring)."""
    train_acc, train_loss = accuracy(model, x, y, train_idx)
    test_acc, test_loss = accuracy(model, x, y, test_idx)
    xs, ys = x[sample_idx], y[sample_idx]
    layer = layer_name(cfg)
    core = extract_core(model, xs, layer, readout=centred_logits, energy=cfg.energy, position=-1)
    m = core.basis.shape[1]
    chance = 1.0 / cfg.p
    base = patched_accuracy(model, xs, ys, core, "clean")
    necessary = _bisect(lambda r: patched_accuracy(model, xs, ys, core, "remove", r) <= 2 * chance, 0, m)
    sufficient = _bisect(lambda r: patched_accuracy(model, xs, ys, core, "keep", r) >= base - cfg.tolerance, 0, m)
    remove_acc = patched_accuracy(model, xs, ys, core, "remove")
    keep_acc = patched_accuracy(model, xs, ys, core, "keep")
    with torch.no_grad():
        _, cache = model.run_with_cache(xs, names_filter=layer)
    r_shift = min(core.rank, cfg.shift_rank_cap)
    rec = {"train_acc": train_acc, "test_acc": test_acc, "train_loss": train_loss, "test_loss": test_loss,
           "rank": core.rank, "necessary_rank": necessary, "sufficient_rank": sufficient, "max_rank": m,
           "sample_acc": base, "keep_acc": keep_acc, "remove_acc": remove_acc,
           "singular_values": core.s.tolist(), "shift_rank": r_shift,
           "weight_norm": float(sum(p.detach().double().pow(2).sum() for p in model.parameters()).sqrt())}
    if r_shift >= 1:
        reps = class_means(core.project(cache[layer][:, -1], r_shift), ys, cfg.p)
        op = shift_operator(reps)
        frac, n_modes = unit_circle_stats(op["eigenvalues"], cfg.p)
        on = [abs(math.hypot(*e) - 1) <= math.sin(math.pi / cfg.p) for e in op["eigenvalues"]]
        rec.update(unit_circle_fraction=frac, n_modes=n_modes, shift_residual=op["residual"],
                   eigenvalues=op["eigenvalues"],
                   frequencies=sorted({k for k, o in zip(op["frequency_bins"], on) if o and k >= 1}))
    else:
        rec.update(unit_circle_fraction=None, n_modes=0, shift_residual=None, eigenvalues=[], frequencies=[])
    return rec


# ---------------------------------------------------------------- checkpoints


def _ckpt_dir(out: Path, branch: str, epoch: int) -> Path:
    return out / "checkpoints" / branch / f"epoch_{epoch:06d}"


def _state_path(out: Path, branch: str) -> Path:
    return out / "checkpoints" / branch / "train_state"


def _fork_epoch(records: list[dict], fork_below: float) -> int | None:
    """Epoch of the last checkpoint before test accuracy first exceeds fork_below."""
    fork = None
    for r in records:
        if r["test_acc"] > fork_below:
            break
        fork = r["epoch"]
    return fork


def _snapshot(out: Path, branch: str, epoch: int, model, record: dict) -> None:
    """The model at an analysed epoch, for later analysis, with its record (a copy of the one in
    the branch's training state)."""
    d = _ckpt_dir(out, branch, epoch)
    model_io.save(model, d, extra={"source": "modadd", "branch": branch, "epoch": epoch, "step": record["step"]})
    (d / "record.json").write_text(json.dumps(record))


def _schedule(cfg: ModAddStudy, total: int, start: int = 0) -> list[int]:
    """Checkpoint epochs in (start, start + total]: a few early ones (log-spaced) then every
    checkpoint_every, and the last epoch."""
    early = [e for e in (10, 30) if e < cfg.checkpoint_every]
    eps = set(early) | set(range(cfg.checkpoint_every, total + 1, cfg.checkpoint_every)) | {total}
    return [start + e for e in sorted(eps) if 0 < e <= total]


# ---------------------------------------------------------------- the study

# settings a branch's training state must agree on (lr and weight decay are in its TrainConfig)
_TRAIN_FIELDS = ("p", "train_frac", "n_layers", "d_model", "n_heads", "d_mlp", "batch", "seed")


@dataclass
class _Data:
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    test_idx: torch.Tensor
    sample_idx: torch.Tensor
    steps_per_epoch: int


def _branch(out: Path, cfg: ModAddStudy, branch: str, start_epoch: int, end_epoch: int, data: _Data,
            progress: bool, clock: Clock, fork_record: dict | None = None) -> Trainer:
    """Train a branch (main: from scratch, analysed at epoch 0; wd0: forked from main's state at
    start_epoch, weight decay 0) to end_epoch, resuming from its training state; curve points and
    analysed checkpoints (snapshots) on the schedule. Returns the trainer (metrics: curve, records)."""
    spe = data.steps_per_epoch
    sched = _schedule(cfg, end_epoch - start_epoch, start_epoch)
    curve_epochs = [e for e in range(start_epoch + 1, end_epoch + 1)
                    if e % cfg.curve_every == 0 or e in sched or e - start_epoch in (1, 2, 5)]
    model = make_model(cfg)                              # its weights come from the state when resuming / forking

    def curve_point(t: Trainer) -> dict:
        tr, _ = accuracy(model, data.x, data.y, data.train_idx)
        te, _ = accuracy(model, data.x, data.y, data.test_idx)
        return {"epoch": t.step // spe, "train_acc": tr, "test_acc": te}

    def checkpoint(t: Trainer) -> dict:
        e = t.step // spe
        rec = {"branch": branch, "epoch": e, "step": t.step,
               **analyse(model, cfg, data.x, data.y, data.train_idx, data.test_idx, data.sample_idx)}
        _snapshot(out, branch, e, model, rec)
        if branch == "main" and _fork_epoch(t.metrics["records"] + [rec], cfg.fork_below) == e:
            t.save(_ckpt_dir(out, branch, e) / "train_state")         # the fork point so far: keep its state
            for old in (out / "checkpoints" / branch).glob("epoch_*/train_state.*"):
                if old.parent.name != f"epoch_{e:06d}":
                    old.unlink()
        clock.save()
        if progress:
            tqdm.write(f"modadd {branch} epoch {e} (step {t.step}): train {rec['train_acc']:.3f} "
                       f"test {rec['test_acc']:.3f} rank {rec['rank']} (necessary {rec['necessary_rank']}) "
                       f"unit circle {modadd_report.fmt(rec['unit_circle_fraction'])} modes {rec['n_modes']}")
        return rec

    at = {e * spe for e in sched}
    trainer = Trainer(
        model, TrainConfig(steps=end_epoch * spe, lr=cfg.lr, weight_decay=cfg.weight_decay if branch == "main" else 0.0),
        _batches(cfg, data), lambda b: F.cross_entropy(model(b[0])[:, -1], b[1]), path=_state_path(out, branch),
        identity={**{k: getattr(cfg, k) for k in _TRAIN_FIELDS}, "fork_epoch": None if branch == "main" else start_epoch},
        evals=(Eval("curve", curve_point, at={e * spe for e in curve_epochs}, show=("train_acc", "test_acc")),
               Eval("records", checkpoint, at=at | ({0} if branch == "main" else set()))),
        checkpoint_at=at, progress=progress, desc=f"modadd {branch}", leave=False)
    if not trainer.resume() and branch == "wd0":
        src = _ckpt_dir(out, "main", start_epoch) / "train_state"
        if not checkpoint_io.exists(src):
            raise StudyError(f"{src}: the fork checkpoint lost its training state; delete {out} to rerun")
        trainer.fork_from(src)
        trainer.metrics["records"] = [{**fork_record, "branch": "wd0"}]
        _snapshot(out, "wd0", start_epoch, trainer.model, trainer.metrics["records"][0])
    if trainer.step > end_epoch * spe and not any(r["epoch"] == end_epoch for r in trainer.metrics["records"]):
        raise StudyError(f"{out}/checkpoints/{branch} has trained past epoch {end_epoch} (to "
                         f"{trainer.step // spe}) without a checkpoint there; ask for more epochs or use another --out")
    trainer.run()
    return trainer


def run(cfg: ModAddStudy | None, out_dir, progress: bool = True) -> dict:
    """Train (resumably), analyse every checkpoint, fork the weight-decay-0 branch, write
    summary.json, report.md, modadd.png and modadd_eigenvalues.png; returns the summary."""
    cfg = cfg or ModAddStudy()
    if not isinstance(cfg, ModAddStudy):
        raise StudyError(f"cfg must be a ModAddStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    with torch_threads(cfg.threads):
        return _study(cfg, out, progress)


def _study(cfg: ModAddStudy, out: Path, progress: bool) -> dict:
    check_config(out, asdict(cfg), ("epochs", "wd0_epochs", "threads"), "modadd")   # epochs may grow
    clock = Clock(out)
    x, y = all_pairs(cfg.p)
    train_idx, test_idx = split(cfg.p, cfg.train_frac, cfg.seed)
    n = cfg.p ** 2
    sample_idx = (torch.arange(n) if cfg.analysis_samples is None else
                  torch.from_numpy(np.sort(np.random.default_rng(cfg.seed + 1).choice(n, cfg.analysis_samples,
                                                                                      replace=False))))
    steps_per_epoch = math.ceil(len(train_idx) / cfg.batch)
    data = _Data(x, y, train_idx, test_idx, sample_idx, steps_per_epoch)

    main = _branch(out, cfg, "main", 0, cfg.epochs, data, progress, clock)
    main_recs = [r for r in main.metrics["records"] if r["epoch"] <= cfg.epochs]
    curves = {"main": [c for c in main.metrics["curve"] if c["epoch"] <= cfg.epochs], "wd0": []}

    fork = _fork_epoch(main_recs, cfg.fork_below)
    wd0 = {"fork_epoch": fork, "fork_step": None if fork is None else fork * steps_per_epoch,
           "weight_decay": 0.0, "checkpoints": []}
    if fork is not None and cfg.wd0_epochs > 0:
        state = _state_path(out, "wd0")
        if checkpoint_io.exists(state) and (was := read_state(state).identity.get("fork_epoch")) != fork:
            raise StudyError(f"{out}/checkpoints/wd0 was forked at epoch {was}, the main branch now forks at "
                             f"{fork}; delete that directory to rerun the branch")
        end = fork + cfg.wd0_epochs
        branch = _branch(out, cfg, "wd0", fork, end, data, progress, clock,
                         fork_record=next(r for r in main_recs if r["epoch"] == fork))
        wd0["checkpoints"] = [_public(r) for r in branch.metrics["records"] if fork <= r["epoch"] <= end]
        curves["wd0"] = [c for c in branch.metrics["curve"] if c["epoch"] <= end]
    elif fork is None:
        wd0["note"] = f"no checkpoint before test accuracy exceeded {cfg.fork_below}: no fork point"
    (out / "curve.json").write_text(json.dumps(curves))

    checkpoints = [_public(r) for r in main_recs]
    grok = next((c for c in checkpoints if c["test_acc"] >= 0.99), None)
    wd0_grok = next((c for c in wd0["checkpoints"] if c["test_acc"] >= 0.99), None)
    wd0["grok_step"] = wd0_grok["step"] if wd0_grok else None
    summary = {"config": asdict(cfg), "layer": layer_name(cfg), "readout": "centred logits, last position",
               "equals_token": False, "n_train": len(train_idx), "n_test": len(test_idx),
               "steps_per_epoch": steps_per_epoch, "unit_circle_tolerance": math.sin(math.pi / cfg.p),
               "grok_step": grok["step"] if grok else None, "grok_epoch": grok["epoch"] if grok else None,
               "checkpoints": checkpoints, "wd0_branch": wd0,
               "final": checkpoints[-1] if checkpoints else None,
               "seconds": round(clock.total(), 1), "seconds_this_run": round(clock.now(), 1)}
    clock.save()
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    modadd_report.plot(out, summary, curves)
    modadd_report.markdown(out, summary)
    return summary


PUBLIC = ("epoch", "step", "train_acc", "test_acc", "train_loss", "test_loss", "rank", "necessary_rank",
          "sufficient_rank", "keep_acc", "remove_acc", "unit_circle_fraction", "n_modes", "frequencies",
          "shift_rank", "shift_residual", "weight_norm", "eigenvalues")


def _public(rec: dict) -> dict:
    return {k: rec.get(k) for k in PUBLIC}

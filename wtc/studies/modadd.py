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

Everything is resumable: each checkpoint directory holds the weights (safetensors + JSON config),
its analysis (record.json, written last) and, for the latest and the fork checkpoint, the optimiser
state (a torch.save state dict, loaded with weights_only=True). A rerun with the same config
continues from the latest complete checkpoint; a different config in the same directory is refused.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wtc.errors import StudyError
from wtc.ace import extract_core, patched_accuracy, shift_operator
from wtc.models import Transformer, TransformerConfig
from wtc.models import io as model_io
from wtc.studies import modadd_report
from wtc.studies.clock import Clock, study_dir


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


def train_epochs(model, opt, x, y, train_idx, cfg: ModAddStudy, start_epoch: int, end_epoch: int, branch: str):
    """Epochs start_epoch+1 .. end_epoch; epoch e's batches come from a permutation seeded by
    (seed, e), so a resumed run draws the same batches."""
    model.train()
    for e in range(start_epoch + 1, end_epoch + 1):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + e)
        order = train_idx[torch.randperm(len(train_idx), generator=gen)]
        for i in range(0, len(order), cfg.batch):
            idx = order[i:i + cfg.batch]
            loss = F.cross_entropy(model(x[idx])[:, -1], y[idx])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{branch}: loss became {loss.item()} at epoch {e}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        yield e
    model.eval()


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
        _, cache = model.run_with_cache(xs)
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


def _records(out: Path, branch: str) -> list[dict]:
    """Complete checkpoints of a branch (record.json written), by epoch."""
    root = out / "checkpoints" / branch
    recs = []
    for d in sorted(root.glob("epoch_*")) if root.exists() else []:
        f = d / "record.json"
        if f.exists():
            try:
                recs.append(json.loads(f.read_text()))
            except json.JSONDecodeError as exc:
                raise StudyError(f"{f}: corrupt checkpoint record ({exc}); delete {d} to recompute it") from None
    return recs


def _fork_epoch(records: list[dict], fork_below: float) -> int | None:
    """Epoch of the last checkpoint before test accuracy first exceeds fork_below."""
    fork = None
    for r in records:
        if r["test_acc"] > fork_below:
            break
        fork = r["epoch"]
    return fork


def _save(out: Path, branch: str, epoch: int, step: int, model, opt, record: dict) -> None:
    d = _ckpt_dir(out, branch, epoch)
    if d.exists():
        shutil.rmtree(d)
    model_io.save(model, d, extra={"source": "modadd", "branch": branch, "epoch": epoch, "step": step})
    torch.save(opt.state_dict(), d / "optim.pt")
    (d / "record.json").write_text(json.dumps(record))     # last: marks the checkpoint complete


def _prune_optimiser_states(out: Path, branch: str, keep: set[int]) -> None:
    for f in (out / "checkpoints" / branch).glob("epoch_*/optim.pt"):
        if int(f.parent.name.split("_")[1]) not in keep:
            f.unlink()


def _load(out: Path, branch: str, epoch: int, cfg: ModAddStudy, weight_decay: float):
    d = _ckpt_dir(out, branch, epoch)
    try:
        model = model_io.load(d).float()
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=weight_decay)
        state = torch.load(d / "optim.pt", weights_only=True)
        opt.load_state_dict(state)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise StudyError(f"{d}: cannot resume from this checkpoint ({exc}); delete it to recompute") from None
    for g in opt.param_groups:
        g["weight_decay"] = weight_decay
    return model, opt


def _check_config(out: Path, cfg: ModAddStudy) -> None:
    f = out / "config.json"
    mine = asdict(cfg)
    mine.pop("threads")
    if f.exists():
        try:
            theirs = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise StudyError(f"{f}: corrupt ({exc})") from None
        theirs.pop("threads", None)
        # epochs / wd0_epochs may grow (continue training); everything else must match
        diff = sorted(k for k in set(mine) | set(theirs)
                      if k not in ("epochs", "wd0_epochs") and mine.get(k) != theirs.get(k))
        if diff:
            raise StudyError(f"{out} holds a modadd study with a different config ({', '.join(diff)}: "
                             f"{[theirs.get(k) for k in diff]} there, {[mine.get(k) for k in diff]} here); "
                             "use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(asdict(cfg), indent=2))


def _schedule(cfg: ModAddStudy, total: int, start: int = 0) -> list[int]:
    """Checkpoint epochs in (start, start + total]: a few early ones (log-spaced) then every
    checkpoint_every, and the last epoch."""
    early = [e for e in (10, 30) if e < cfg.checkpoint_every]
    eps = set(early) | set(range(cfg.checkpoint_every, total + 1, cfg.checkpoint_every)) | {total}
    return [start + e for e in sorted(eps) if 0 < e <= total]


# ---------------------------------------------------------------- the study


def _run_branch(out, cfg, branch, start_epoch, end_epoch, x, y, train_idx, test_idx, sample_idx,
                steps_per_epoch, curves, progress, clock, keep_optim=frozenset()):
    """Train a branch from its latest complete checkpoint in [start_epoch, end_epoch] (the branch
    starts with one at start_epoch) to end_epoch, analysing and saving on the schedule."""
    sched = _schedule(cfg, end_epoch - start_epoch, start_epoch)
    done = {r["epoch"] for r in _records(out, branch)}
    resume_from = max((e for e in done if start_epoch <= e <= end_epoch), default=None)
    if resume_from is None:
        raise StudyError(f"{out}/checkpoints/{branch}: no checkpoint at epoch {start_epoch} to start from")
    if resume_from == end_epoch:                      # done already (or a longer run's prefix)
        return
    curve = curves[branch]
    curve[:] = [c for c in curve if c["epoch"] <= resume_from]   # points past the last checkpoint are redone
    model, opt = _load(out, branch, resume_from, cfg, cfg.weight_decay if branch == "main" else 0.0)
    todo = [e for e in sched if e > resume_from]
    bar = tqdm(total=end_epoch - resume_from, disable=not progress, desc=f"modadd {branch}", leave=False)
    for e in train_epochs(model, opt, x, y, train_idx, cfg, resume_from, end_epoch, branch):
        bar.update(1)
        if e % cfg.curve_every == 0 or e in todo or e - start_epoch in (1, 2, 5):
            tr, _ = accuracy(model, x, y, train_idx)
            te, _ = accuracy(model, x, y, test_idx)
            curve.append({"epoch": e, "step": e * steps_per_epoch, "train_acc": tr, "test_acc": te})
            bar.set_postfix(train=f"{tr:.3f}", test=f"{te:.3f}")
            model.train()
        if e in todo:
            rec = {"branch": branch, "epoch": e, "step": e * steps_per_epoch,
                   **analyse(model, cfg, x, y, train_idx, test_idx, sample_idx)}
            model.train()
            _save(out, branch, e, e * steps_per_epoch, model, opt, rec)
            keep = {e} | set(keep_optim)
            if branch == "main":
                f = _fork_epoch(_records(out, "main"), cfg.fork_below)
                if f is not None:
                    keep.add(f)
            _prune_optimiser_states(out, branch, keep)
            (out / "curve.json").write_text(json.dumps(curves))
            clock.save()
            if progress:
                tqdm.write(f"modadd {branch} epoch {e} (step {rec['step']}): train {rec['train_acc']:.3f} "
                           f"test {rec['test_acc']:.3f} rank {rec['rank']} (necessary {rec['necessary_rank']}) "
                           f"unit circle {modadd_report.fmt(rec['unit_circle_fraction'])} modes {rec['n_modes']}")
    bar.close()


def run(out_dir, cfg: ModAddStudy | None = None, progress: bool = True) -> dict:
    """Train (resumably), analyse every checkpoint, fork the weight-decay-0 branch, write
    summary.json and modadd.png; returns the summary."""
    cfg = cfg or ModAddStudy()
    if not isinstance(cfg, ModAddStudy):
        raise StudyError(f"cfg must be a ModAddStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        _check_config(out, cfg)
        clock = Clock(out)
        x, y = all_pairs(cfg.p)
        train_idx, test_idx = split(cfg.p, cfg.train_frac, cfg.seed)
        n = cfg.p ** 2
        sample_idx = (torch.arange(n) if cfg.analysis_samples is None else
                      torch.from_numpy(np.sort(np.random.default_rng(cfg.seed + 1).choice(n, cfg.analysis_samples,
                                                                                          replace=False))))
        steps_per_epoch = math.ceil(len(train_idx) / cfg.batch)
        curve_file = out / "curve.json"
        curves = json.loads(curve_file.read_text()) if curve_file.exists() else {"main": [], "wd0": []}

        if not any(r["epoch"] == 0 for r in _records(out, "main")):
            model = make_model(cfg).eval()
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            _save(out, "main", 0, 0, model, opt, {"branch": "main", "epoch": 0, "step": 0,
                                                  **analyse(model, cfg, x, y, train_idx, test_idx, sample_idx)})
        _run_branch(out, cfg, "main", 0, cfg.epochs, x, y, train_idx, test_idx, sample_idx,
                    steps_per_epoch, curves, progress, clock)
        curve_file.write_text(json.dumps(curves))
        main_recs = [r for r in _records(out, "main") if r["epoch"] <= cfg.epochs]

        fork = _fork_epoch(main_recs, cfg.fork_below)
        wd0 = {"fork_epoch": fork, "fork_step": None if fork is None else fork * steps_per_epoch,
               "weight_decay": 0.0, "checkpoints": []}
        if fork is not None and cfg.wd0_epochs > 0:
            branch_recs = _records(out, "wd0")
            if branch_recs and branch_recs[0]["epoch"] != fork:
                raise StudyError(f"{out}/checkpoints/wd0 was forked at epoch {branch_recs[0]['epoch']}, the main "
                                 f"branch now forks at {fork}; delete that directory to rerun the branch")
            if not branch_recs:
                src = _ckpt_dir(out, "main", fork)
                dst = _ckpt_dir(out, "wd0", fork)
                if not (src / "optim.pt").exists():
                    raise StudyError(f"{src}: the fork checkpoint lost its optimiser state; delete {out} to rerun")
                shutil.copytree(src, dst)
                rec = json.loads((dst / "record.json").read_text())
                (dst / "record.json").write_text(json.dumps({**rec, "branch": "wd0"}))
            _run_branch(out, cfg, "wd0", fork, fork + cfg.wd0_epochs, x, y, train_idx, test_idx,
                        sample_idx, steps_per_epoch, curves, progress, clock, keep_optim={fork})
            curve_file.write_text(json.dumps(curves))
            wd0["checkpoints"] = [_public(r) for r in _records(out, "wd0") if fork <= r["epoch"] <= fork + cfg.wd0_epochs]
        elif fork is None:
            wd0["note"] = f"no checkpoint before test accuracy exceeded {cfg.fork_below}: no fork point"

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
        ends = {"main": cfg.epochs, "wd0": (fork or 0) + cfg.wd0_epochs}
        modadd_report.plot(out, summary, {b: [c for c in curves.get(b, []) if c["epoch"] <= ends[b]] for b in ends})
        modadd_report.markdown(out, summary)
        return summary
    finally:
        torch.set_num_threads(old_threads)


PUBLIC = ("epoch", "step", "train_acc", "test_acc", "train_loss", "test_loss", "rank", "necessary_rank",
          "sufficient_rank", "keep_acc", "remove_acc", "unit_circle_fraction", "n_modes", "frequencies",
          "shift_rank", "shift_residual", "weight_norm", "eigenvalues")


def _public(rec: dict) -> dict:
    return {k: rec.get(k) for k in PUBLIC}

"""Assign-and-Add study: how a transformer composes variable binding with addition mod 59.

Setting (issue 8; task in wtc.tasks.assign_add): 2 layers, 1 head, d_model = d_head = 128,
d_mlp = 512, ReLU, no biases, no LayerNorm, no layer-1 MLP, learned absolute positions, causal;
AdamW lr 1e-3, weight decay 0.02, batches of 512 fresh sequences, cross-entropy at "=" only (the
last block runs for that query alone: the same loss, about twice as fast on a CPU).

Every `eval_every` steps: the accuracy of every evaluation pool, the routing rates, the virtual
addition accuracy and the loss (curve.json). Every `checkpoint_every` steps: weights, the Fourier
analysis and the twin cosine (checkpoints/step_*/record.json, written last). At the end: the ACE
core at "=" and the f / r sweeps (short runs with another training fraction or 2-var share).

Resumable: batches are a function of (seed, step), so a rerun continues from the latest complete
checkpoint (its optimiser state is kept) and reproduces what an uninterrupted run computes; a
different config in the same directory is refused (`steps` may grow).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from wtc.errors import StudyError
from wtc.models import Transformer, TransformerConfig
from wtc.models import io as model_io
from wtc.studies import assign_add_analysis as an
from wtc.studies import assign_add_report as report
from wtc.studies.clock import Clock, study_dir
from wtc.tasks.assign_add import ANSWER_POS, SEQ_LEN, TWO_VAR_POOLS, VOCAB, AssignAdd

ANSWER = slice(ANSWER_POS, ANSWER_POS + 1)
PHASE_METRICS = ("0var_heldout", "1var_heldout", "2var_valid", "2var_union", "1var_restricted",
                 "l2_value_routing_rate", "l1_prev_token_rate", "virtual_addition")


@dataclass
class AssignAddStudy:
    steps: int = 40000
    f: float = 0.7                   # share of the 59^2 pairs in training
    r: float = 0.25                  # 2-var share of training sequences
    no_right: tuple[str, ...] = ("a", "b", "c")
    no_left: tuple[str, ...] = ("d", "e", "f")
    d_model: int = 128
    d_mlp: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.02
    batch: int = 512
    eval_every: int = 250
    checkpoint_every: int = 2000
    pool_size: int = 1024
    phase_window: int = 1000         # a phase: a metric rising by >= phase_jump within this many steps
    phase_jump: float = 0.15
    sweep_f: tuple[float, ...] = (0.3, 0.5)
    sweep_r: tuple[float, ...] = (0.0, 0.1, 0.5)
    sweep_steps: int = 12000
    scan_sequences: int = 64         # per-weight scan of the final model at "=" (0: none)
    scan_attention_sample: int = 512 # attention weights drawn per matrix for the scan
    seed: int = 0
    threads: int = 2                 # measured: 53 ms a step with 2 threads, 105 ms with 1 (2 cores)

    @classmethod
    def quick(cls) -> AssignAddStudy:
        # seed 0 (exploratory run): 0-var held-out >= 0.99 by step 2000, the restricted pools jump
        # at ~9.3k steps (2-var union 0.86 -> 0.985 by 10k); 14k steps leave margin for other seeds
        return cls(steps=14000, sweep_f=(0.4,), sweep_r=(0.0,), sweep_steps=3000)

    def __post_init__(self) -> None:
        for name in ("steps", "d_model", "d_mlp", "batch", "eval_every", "checkpoint_every", "pool_size",
                     "phase_window", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise StudyError(f"AssignAddStudy.{name} must be a positive int, got {v!r}")
        if not isinstance(self.sweep_steps, int) or self.sweep_steps < 0:
            raise StudyError(f"AssignAddStudy.sweep_steps must be an int >= 0, got {self.sweep_steps!r}")
        if self.checkpoint_every % self.eval_every:
            raise StudyError(f"checkpoint_every ({self.checkpoint_every}) must be a multiple of eval_every "
                             f"({self.eval_every})")
        if not (self.lr > 0 and self.weight_decay >= 0 and 0 < self.phase_jump <= 1):
            raise StudyError(f"need lr > 0, weight_decay >= 0, 0 < phase_jump <= 1; got {self.lr}, "
                             f"{self.weight_decay}, {self.phase_jump}")
        self.no_right, self.no_left = tuple(self.no_right), tuple(self.no_left)
        self.sweep_f, self.sweep_r = tuple(self.sweep_f), tuple(self.sweep_r)
        try:
            for f in (self.f,) + self.sweep_f:
                self.task(f=f)
            for r in self.sweep_r:
                self.task(r=r)
        except ValueError as exc:
            raise StudyError(str(exc)) from None

    def task(self, **change) -> AssignAdd:
        kw = {"f": self.f, "r": self.r, "no_right": self.no_right, "no_left": self.no_left, "seed": self.seed}
        return AssignAdd(**{**kw, **change})

    def to_dict(self) -> dict:
        return asdict(self)


def make_model(cfg: AssignAddStudy) -> Transformer:
    return Transformer(TransformerConfig(n_layers=2, d_model=cfg.d_model, n_heads=1, d_head=cfg.d_model,
                                         d_mlp=cfg.d_mlp, d_vocab=VOCAB, n_ctx=SEQ_LEN, act_fn="relu",
                                         normalization=None, mlp_layers=(1,), bias=False), seed=cfg.seed)


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


def train(model, cfg: AssignAddStudy, task: AssignAdd, start: int, end: int, opt, pools, grid, on_eval,
          desc: str, progress: bool) -> None:
    """Steps start+1..end; on_eval(step, record) at every eval_every (and at `end`)."""
    loss_sum, n_loss = 0.0, 0
    model.train()
    bar = tqdm(range(start + 1, end + 1), disable=not progress, desc=desc, leave=False, mininterval=2)
    for step in bar:
        x, y = batch_at(task, cfg.seed, step, cfg.batch)
        loss = F.cross_entropy(model.logits_at(x, ANSWER)[:, 0], y)
        if not torch.isfinite(loss):
            raise StudyError(f"training loss became {loss.item()} at step {step}; lower lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum, n_loss = loss_sum + loss.item(), n_loss + 1
        if step % cfg.eval_every == 0 or step == end:
            model.eval()
            rec = {"step": step, "loss": loss_sum / n_loss, **evaluate(model, pools, grid)}
            model.train()
            loss_sum, n_loss = 0.0, 0
            bar.set_postfix({"0var_ho": f"{rec['0var_heldout']:.3f}", "2var_u": f"{rec['2var_union']:.3f}"})
            on_eval(step, rec)
    bar.close()
    model.eval()


# ---------------------------------------------------------------- checkpoints


def _ckpt(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}"


def _records(out: Path) -> list[dict]:
    recs = []
    for d in sorted((out / "checkpoints").glob("step_*")):
        f = d / "record.json"
        if f.exists():
            try:
                recs.append(json.loads(f.read_text()))
            except json.JSONDecodeError as exc:
                raise StudyError(f"{f}: corrupt checkpoint record ({exc}); delete {d} to recompute it") from None
    return recs


def _save(out: Path, step: int, model, opt, record: dict) -> None:
    d = _ckpt(out, step)
    if d.exists():
        shutil.rmtree(d)
    model_io.save(model, d, extra={"source": "assign_add", "step": step})
    torch.save(opt.state_dict(), d / "optim.pt")
    (d / "record.json").write_text(json.dumps(record))          # last: marks the checkpoint complete
    for old in (out / "checkpoints").glob("step_*/optim.pt"):    # only the latest resumes
        if old.parent != d:
            old.unlink()


def _new_optimizer(model, cfg: AssignAddStudy):
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def _load(out: Path, step: int, cfg: AssignAddStudy):
    d = _ckpt(out, step)
    try:
        model = model_io.load(d).float()
        opt = _new_optimizer(model, cfg)
        opt.load_state_dict(torch.load(d / "optim.pt", weights_only=True))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise StudyError(f"{d}: cannot resume from this checkpoint ({exc}); delete it to recompute") from None
    return model, opt


def _check_config(out: Path, cfg: AssignAddStudy) -> None:
    f = out / "config.json"
    mine = cfg.to_dict()
    if f.exists():
        try:
            theirs = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise StudyError(f"{f}: corrupt ({exc})") from None
        free = {"steps", "threads", "sweep_f", "sweep_r", "sweep_steps",   # sweeps are kept per point,
                "phase_window", "phase_jump",                               # phases are read off the curve,
                "scan_sequences", "scan_attention_sample"}                  # the scan off the final model
        diff = sorted(k for k in set(mine) | set(theirs)
                      if k not in free and json.loads(json.dumps(mine.get(k))) != theirs.get(k))
        if diff:
            raise StudyError(f"{out} holds an assign-add study with a different config ({', '.join(diff)}: "
                             f"{[theirs.get(k) for k in diff]} there, {[mine.get(k) for k in diff]} here); "
                             "use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(mine, indent=2))


def _pools(task: AssignAdd, cfg: AssignAddStudy) -> dict:
    return {k: (torch.from_numpy(x), torch.from_numpy(y)) for k, (x, y) in task.pools(cfg.pool_size).items()}


@torch.no_grad()
def checkpoint_analysis(model, pools: dict, grid) -> dict:
    return {"fourier": an.fourier(model, grid),
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
    curve_file = out / "curve.json"
    curve = json.loads(curve_file.read_text()) if curve_file.exists() else []
    steps_done = [r["step"] for r in _records(out)]
    resumable = [s for s in steps_done if (_ckpt(out, s) / "optim.pt").exists()]
    if cfg.steps in steps_done:                                   # finished (or a longer run passed here)
        start = cfg.steps
    elif resumable and max(resumable) > cfg.steps:
        raise StudyError(f"{out} has trained past step {cfg.steps} (to {max(resumable)}) without a checkpoint at "
                         f"{cfg.steps}; ask for at least {max(resumable)} steps or use another --out")
    else:
        start = max(resumable, default=None)
    if start is None:
        model = make_model(cfg).eval()
        opt = _new_optimizer(model, cfg)
        rec = {"step": 0, "loss": None, **evaluate(model, pools, grid), **checkpoint_analysis(model, pools, grid)}
        curve = [{k: v for k, v in rec.items() if k not in ("fourier", "twin_cosine")}]
        _save(out, 0, model, opt, rec)
        curve_file.write_text(json.dumps(curve))
        start = 0
    elif start < cfg.steps:
        model, opt = _load(out, start, cfg)
    curve = [c for c in curve if c["step"] <= start]             # points after the checkpoint are redone

    def on_eval(step, rec):
        curve.append(rec)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            full = {**rec, **checkpoint_analysis(model, pools, grid)}
            _save(out, step, model, opt, full)
            curve_file.write_text(json.dumps(curve))
            clock.save()
            model.train()
            if progress:
                tqdm.write(f"assign-add step {step}: 0var held-out {rec['0var_heldout']:.3f}, 2var union "
                           f"{rec['2var_union']:.3f}, L1 prev-token {rec['l1_prev_token_rate']:.2f}, L2 value "
                           f"routing {rec['l2_value_routing_rate']:.2f}, virtual addition "
                           f"{rec['virtual_addition']:.3f}, key frequencies {full['fourier']['key_frequencies']}")

    if start < cfg.steps:
        train(model, cfg, task, start, cfg.steps, opt, pools, grid, on_eval, "assign-add", progress)
    records = [r for r in _records(out) if r["step"] <= cfg.steps]
    final = model_io.load(_ckpt(out, cfg.steps)).float()
    return final, [c for c in curve if c["step"] <= cfg.steps], records


def _sweep_point(out: Path, cfg: AssignAddStudy, f: float, r: float, progress: bool) -> dict:
    """A short run with another f or r: final pool accuracies (cached in result.json)."""
    d = out / "sweeps" / f"f{f:g}_r{r:g}"
    res = d / "result.json"
    if res.exists():
        rec = json.loads(res.read_text())
        if rec.get("steps") == cfg.sweep_steps:
            return rec
    task = cfg.task(f=f, r=r)
    pools = _pools(task, cfg)
    grid = an.zero_var_grid(task)
    model = make_model(cfg)
    opt = _new_optimizer(model, cfg)
    curve = []
    t0 = time.perf_counter()
    point = replace(cfg, eval_every=cfg.sweep_steps, checkpoint_every=cfg.sweep_steps, steps=cfg.sweep_steps, f=f, r=r)
    train(model, point, task, 0, cfg.sweep_steps, opt, pools, grid, lambda s, rec: curve.append(rec),
          f"sweep f={f:g} r={r:g}", progress)
    d.mkdir(parents=True, exist_ok=True)
    rec = {"f": f, "r": r, "steps": cfg.sweep_steps, "seconds": round(time.perf_counter() - t0, 1), **curve[-1]}
    res.write_text(json.dumps(rec))
    return rec


def run(out_dir, cfg: AssignAddStudy | None = None, progress: bool = True) -> dict:
    """Train (resumably) and analyse; writes summary.json, report.md and the plots; returns the summary."""
    cfg = cfg or AssignAddStudy()
    if not isinstance(cfg, AssignAddStudy):
        raise StudyError(f"cfg must be an AssignAddStudy, got {type(cfg).__name__}")
    out = study_dir(out_dir, StudyError)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        _check_config(out, cfg)
        clock = Clock(out)
        model, curve, records = _main_run(out, cfg, progress, clock)
        train_seconds = clock.total()
        task = cfg.task()
        pools = _pools(task, cfg)
        core = ace_core(model, pools)
        scanned = None
        if cfg.scan_sequences:
            x = pools["2var_union"][0].numpy()
            pick = np.random.default_rng([cfg.seed, 9]).choice(len(x), min(cfg.scan_sequences, len(x)), replace=False)
            scanned = an.weight_scan(model, x[np.sort(pick)], cfg.scan_attention_sample, cfg.seed)
        sweeps = [_sweep_point(out, cfg, f, cfg.r, progress) for f in cfg.sweep_f] + \
                 [_sweep_point(out, cfg, cfg.f, r, progress) for r in cfg.sweep_r] if cfg.sweep_steps else []
        at_sweep = next((c for c in curve if c["step"] == cfg.sweep_steps), None)
        if at_sweep is not None:                                  # the main run is the (f, r) point itself
            sweeps.append({"f": cfg.f, "r": cfg.r, "steps": cfg.sweep_steps, "main_run": True, **at_sweep})
        final, last = curve[-1], records[-1]
        found = an.phases(curve, PHASE_METRICS, cfg.phase_window, cfg.phase_jump)
        transitions = {k: an.transition(curve, k) for k in PHASE_METRICS}
        routing_jump = transitions["l2_value_routing_rate"]
        addition_ready = next((c["step"] for c in curve if c["virtual_addition"] >= 0.99), None)
        summary = {
            "config": cfg.to_dict(), "steps": final["step"],
            "acc_0var_heldout": final["0var_heldout"], "acc_2var_union": final["2var_union"],
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
            "phases": found, "ace_core": core, "sweeps": sweeps, "weight_scan": scanned,
            "two_var_pools": list(TWO_VAR_POOLS),
            "seconds": round(clock.total(), 1), "train_seconds": round(train_seconds, 1),
        }
        clock.save()
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        report.plot(out, summary, curve)
        report.markdown(out, summary)
        return summary
    finally:
        torch.set_num_threads(old_threads)


__all__ = ["AssignAddStudy", "StudyError", "run", "make_model", "evaluate", "ace_core", "batch_at"]

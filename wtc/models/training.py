"""The one training loop for token transformers (lm-train, weight-sparse training, the studies).

Update `step` (0-based; `Trainer.step` counts the updates done):

    lr = lr_at(step, cfg) in every param group (warmup, then constant or cosine)
    loss = loss_fn(batch_fn(step)); a non-finite loss raises TrainingError
    zero_grad, backward, clip the global L2 norm of the gradient (cfg.grad_clip), AdamW step
    step += 1; post_step(trainer) may change the weights (top-k projection) and return per-step values
    every Eval due at `step`: metrics[name] gets {"step": step, **fn(trainer)}
    a training-state checkpoint when due (checkpoint_every / checkpoint_at / checkpoint_seconds), at the
    last step, on stop, on Ctrl-C / SIGTERM

Checkpoints by default: a trainer with a path writes its state when a fresh run starts (the run and
its config exist from the first moment, so a rerun of another config is refused even then), at
least every `checkpoint_seconds` of wall time (default 60: a kill -9 loses at most a minute of
training, and a checkpoint a minute costs little next to the updates), at the last step, and when
SIGINT or SIGTERM comes: the signal is held until the update in flight is whole, the state is
written at that step, and the signal is then delivered as if nothing had held it
(wtc.models.interrupts). Rerun with the same config, the trainer resumes from the last checkpoint.

Resume is exact: batches are a function of the step, or drawn from generators registered in
`rngs` (numpy or torch Generators), whose states travel in the checkpoint with torch's global RNG
state, the model, the AdamW state, the per-step history (loss, lr, post_step's values) and the
recorded metrics. A fresh run (nothing loaded, nothing trained) first runs the Evals whose `at` holds 0.

Training state: <path>.safetensors (model.*, opt.<i>.<key>, rng.*, history.*) and <path>.json
(step, seconds, config, identity, model config, param groups, numpy RNG states, metrics), written
as an atomic pair (wtc.checkpoint_io). A resume is refused (CheckpointError naming the fields) when
the recorded config differs from the given one: the TrainConfig fields that change the numbers (all
but `steps` under a constant schedule, so a run can be extended), the caller's `identity` (data
fingerprints, study settings) and the model's config.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection

import numpy as np
import torch
from tqdm.auto import tqdm

from wtc import checkpoint_io
import wtc.models.trainer_checks as checks
from wtc.arguments import KnownFields
from wtc.models.interrupts import Deferred
from wtc.errors import CheckpointError, TrainConfigError, TrainConfigTypeError, TrainingError, WtcError
from wtc.threads import torch_threads

FORMAT = "wtc.training/1"
SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig(KnownFields):
    _field_error = TrainConfigError          # an unknown keyword (wtc.arguments.KnownFields)

    steps: int
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)      # torch's AdamW defaults
    eps: float = 1e-8
    weight_decay: float = 0.01                      # decoupled; only where `decay` says so (Trainer)
    grad_clip: float | None = None                  # global L2 norm; None: no clipping
    warmup: int = 0                                 # linear warmup updates
    schedule: str = "constant"                      # constant | cosine (to min_lr_frac * lr at the last update)
    min_lr_frac: float = 0.0

    def __post_init__(self) -> None:
        checks.check_train_config(self, SCHEDULES)

    def result_fields(self) -> dict:
        """The fields a checkpoint must agree on: all of them, but `steps` only where the schedule
        depends on it (a constant schedule's first n updates do not depend on the total)."""
        d = _jsonable(dataclasses.asdict(self))
        if self.schedule == "constant":
            d.pop("steps")
        return d


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of update `step` (0-based): linear warmup to lr over cfg.warmup updates, then
    constant, or cosine down to min_lr_frac * lr at the last update (cfg.steps - 1)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - 1 - cfg.warmup)
    t = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


@dataclass
class Eval:
    """fn(trainer) -> dict | None, called after update `step` when step % every == 0 or step in
    `at` (with the model in eval mode); a dict is recorded under metrics[name] with its step.
    `show`: keys of the record put on the progress bar. `stop`: a predicate on the record; once a
    record satisfies it, training ends there (checkpointed), and a resume past it trains no more."""
    name: str
    fn: Callable[["Trainer"], dict | None]
    every: int | None = None
    at: Collection[int] = ()
    show: tuple[str, ...] = ()
    stop: Callable[[dict], bool] | None = None

    def __post_init__(self) -> None:
        checks.check_eval(self)
        self.every = None if self.every is None else int(self.every)
        self.at = frozenset(int(s) for s in self.at)

    def due(self, step: int) -> bool:
        return bool(self.every and step % self.every == 0) or step in self.at


@dataclass
class TrainState:
    """A training-state checkpoint as read back (read_state)."""
    step: int
    seconds: float
    config: dict
    identity: dict
    model_config: dict | None
    model_state: dict[str, torch.Tensor]
    optimizer: dict                      # a torch optimizer state dict: {"state": {i: {...}}, "param_groups": [...]}
    history: dict[str, list]
    metrics: dict[str, list]
    rng_torch: dict[str, torch.Tensor]   # "torch" (the global RNG) and each registered torch Generator
    rng_numpy: dict[str, dict]
    no_decay: list[str] | None = None    # parameters weight decay skipped (None: not recorded)


@dataclass
class TrainResult:
    step: int                            # updates done (over all calls)
    finished: bool                       # step >= cfg.steps
    seconds: float                       # training seconds over all calls
    seconds_per_step: float | None       # in this call; None when no update ran
    history: dict[str, list]             # per update: step, loss, lr and post_step's values
    metrics: dict[str, list]
    path: Path | None
    stopped_by: str | None = None        # the Eval whose stop predicate ended training early

    @property
    def losses(self) -> list[float]:
        return self.history["loss"]

    def history_records(self) -> list[dict]:
        cols = list(self.history)
        return [dict(zip(cols, row)) for row in zip(*(self.history[c] for c in cols))]


def _jsonable(obj):
    return json.loads(json.dumps(obj))


def model_config(model) -> dict | None:
    """{"kind", "config"} of a model with a dataclass `cfg` (wtc Transformers), else None."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not dataclasses.is_dataclass(cfg):
        return None
    return {"kind": f"{type(model).__module__}.{type(model).__qualname__}", "config": _jsonable(dataclasses.asdict(cfg))}


def read_state(path) -> TrainState:
    """Read a training-state checkpoint (<path>.safetensors + <path>.json)."""
    path = Path(path)
    tensors, meta = checkpoint_io.read(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a training state (format {meta.get('format')!r}, expected {FORMAT!r})")
    try:
        opt_state: dict[int, dict] = {}
        model_state, history, rng = {}, {}, {}
        for k, v in tensors.items():
            kind, _, rest = k.partition(".")
            if kind == "model":
                model_state[rest] = v
            elif kind == "opt":
                i, _, key = rest.partition(".")
                opt_state.setdefault(int(i), {})[key] = v
            elif kind == "rng":
                rng[rest] = v
            elif kind == "history":
                history[rest] = v.tolist()
        history = {c: history[c] for c in meta["history_columns"]}
        return TrainState(step=int(meta["step"]), seconds=float(meta["seconds"]), config=meta["config"],
                          identity=meta["identity"], model_config=meta["model"], model_state=model_state,
                          optimizer={"state": opt_state, "param_groups": meta["param_groups"]}, history=history,
                          metrics=meta["metrics"], rng_torch=rng, rng_numpy=meta["rng_numpy"],
                          no_decay=meta.get("no_decay"))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: corrupt training state ({type(exc).__name__}: {exc}); delete it to "
                              "start afresh") from exc


def load_model(path):
    """The model of a training state of a wtc Transformer, in eval mode."""
    from wtc.models.transformer import Transformer, TransformerConfig

    st = read_state(path)
    kind = f"{Transformer.__module__}.{Transformer.__qualname__}"
    if not st.model_config or st.model_config.get("kind") != kind:
        raise CheckpointError(f"{path}: the training state is not of a {kind}")
    dtype = next(v.dtype for v in st.model_state.values() if v.is_floating_point())
    model = Transformer(TransformerConfig(**st.model_config["config"])).to(dtype)
    model.load_state_dict(st.model_state)
    return model.eval()


def _diff(saved: dict, now: dict, prefix: str = "") -> list[str]:
    return [f"{prefix}{k}" for k in sorted(set(saved) | set(now), key=str) if saved.get(k) != now.get(k)]


class Trainer:
    """The loop (module doc). `batch_fn(step)` gives update step's batch, `loss_fn(batch)` its loss
    (a scalar tensor). decay(name, param): whether weight decay applies (None: everywhere; the
    AdamW param groups are then [decayed, not decayed]). post_step(trainer) -> dict | None runs
    after every optimiser step. rngs: generators batch_fn draws from, checkpointed. path: the
    training-state checkpoint (None: none). identity: what else a resume must agree on.
    checkpoint_seconds: with a path, a checkpoint at least this often (wall time; None: none by
    time); checkpoint_every / checkpoint_at add checkpoints at fixed steps (module doc)."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, batch_fn: Callable[[int], Any],
                 loss_fn: Callable[[Any], torch.Tensor], *, path=None, identity: dict | None = None,
                 decay: Callable[[str, torch.nn.Parameter], bool] | None = None,
                 post_step: Callable[["Trainer"], dict | None] | None = None, evals: tuple[Eval, ...] = (),
                 rngs: dict | None = None, checkpoint_every: int | None = None, checkpoint_at: Collection[int] = (),
                 checkpoint_seconds: float | None = 60.0, threads: int | None = None, progress: bool = True, desc: str = "train", leave: bool = True):
        if not isinstance(cfg, TrainConfig):
            hint = " (TrainConfig(**d) for a dict)" if isinstance(cfg, dict) else ""
            raise TrainConfigTypeError(f"cfg must be a TrainConfig{hint}, got {type(cfg).__name__}")
        if isinstance(evals, Eval) or not isinstance(evals, (tuple, list)) or \
                not all(isinstance(e, Eval) for e in evals):
            raise TrainConfigTypeError(f"evals must be a tuple of Eval, got {evals!r:.80}")
        threads = checks.check_trainer(model, batch_fn, loss_fn, path=path, evals=evals, rngs=rngs, threads=threads,
                                       decay=decay, post_step=post_step, checkpoint_every=checkpoint_every,
                                       checkpoint_at=checkpoint_at, checkpoint_seconds=checkpoint_seconds)
        self.model, self.cfg, self.batch_fn, self.loss_fn = model, cfg, batch_fn, loss_fn
        self.path = None if path is None else Path(path)
        self.identity = checks.identity(identity)
        self.post_step, self.evals, self.rngs = post_step, tuple(evals), dict(rngs or {})
        self.checkpoint_every, self.checkpoint_at = checkpoint_every, frozenset(checkpoint_at)
        self.checkpoint_seconds = None if checkpoint_seconds is None else float(checkpoint_seconds)
        self.threads, self.progress, self.desc, self.leave = threads, progress, desc, leave
        named = list(model.named_parameters())
        decayed = {n: True if decay is None else bool(decay(n, p)) for n, p in named}
        self.no_decay = sorted(n for n, d in decayed.items() if not d)   # recorded: a resume must agree
        if decay is None:
            groups = [{"params": list(model.parameters())}]
        else:
            groups = [{"params": [p for n, p in named if decayed[n]], "weight_decay": cfg.weight_decay},
                      {"params": [p for n, p in named if not decayed[n]], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                           weight_decay=cfg.weight_decay)
        self.step = 0
        self.metrics: dict[str, list] = {e.name: [] for e in self.evals}
        self.history: dict[str, list] = {"step": [], "loss": [], "lr": []}
        self.loaded: str | None = None        # "resumed" / "forked" once a checkpoint was loaded
        self._decided = False
        self._seconds_before, self._t0 = 0.0, None

    # ------------------------------------------------------------------ checkpoints

    @property
    def seconds(self) -> float:
        return self._seconds_before + (0.0 if self._t0 is None else time.perf_counter() - self._t0)

    def save(self, path=None) -> Path:
        """Write the training state to `path` (default: the trainer's own)."""
        if path is None and self.path is None:
            raise TrainConfigError("Trainer.save needs a path: this trainer has none")
        path = Path(path if path is not None else self.path)
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        opt = self.optimizer.state_dict()
        for i, st in opt["state"].items():
            for k, v in st.items():
                tensors[f"opt.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
        tensors["rng.torch"] = torch.get_rng_state()
        for name, g in self.rngs.items():
            if isinstance(g, torch.Generator):
                tensors[f"rng.{name}"] = g.get_state()
        for col, vals in self.history.items():
            tensors[f"history.{col}"] = torch.tensor(vals, dtype=torch.int64 if col == "step" else torch.float64)
        meta = {"format": FORMAT, "step": self.step, "seconds": self.seconds,
                "config": _jsonable(dataclasses.asdict(self.cfg)), "identity": self.identity,
                "model": model_config(self.model), "param_groups": _jsonable(opt["param_groups"]),
                "history_columns": list(self.history), "metrics": self.metrics, "no_decay": self.no_decay,
                "rng_numpy": {n: g.bit_generator.state for n, g in self.rngs.items()
                              if isinstance(g, np.random.Generator)}}
        checkpoint_io.write_atomic(path, tensors, meta)
        return path

    def _restore(self, st: TrainState, where: Path, everything: bool) -> None:
        mine = model_config(self.model)
        if st.model_config != mine:
            fields = _diff((st.model_config or {}).get("config", {}), (mine or {}).get("config", {}), "model.")
            raise CheckpointError(f"{where}: the checkpoint's model differs from this one in {fields or ['kind']}")
        try:
            self.model.load_state_dict(st.model_state, strict=True)
            # our param groups (hyper-parameters) with the checkpoint's per-parameter state
            self.optimizer.load_state_dict({"state": st.optimizer["state"],
                                            "param_groups": self.optimizer.state_dict()["param_groups"]})
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{where}: the checkpoint does not fit this model or optimiser ({exc})") from exc
        self.step = st.step
        if "torch" in st.rng_torch:
            torch.set_rng_state(st.rng_torch["torch"])
        for name, g in self.rngs.items():
            saved = st.rng_torch.get(name) if isinstance(g, torch.Generator) else st.rng_numpy.get(name)
            if saved is None:
                raise CheckpointError(f"{where}: the checkpoint has no state for the generator {name!r}")
            if isinstance(g, torch.Generator):
                g.set_state(saved)
            else:
                g.bit_generator.state = saved
        if everything:
            self.history = {c: list(v) for c, v in st.history.items()}
            self.metrics = {**{e.name: [] for e in self.evals}, **st.metrics}
            self._seconds_before = st.seconds

    def resume(self) -> bool:
        """Load the trainer's checkpoint when there is one (refusing one of another config);
        returns whether it did. run() calls it first."""
        if self._decided:
            return self.loaded == "resumed"
        self._decided = True
        if self.path is None or not checkpoint_io.exists(self.path):
            return False
        st = read_state(self.path)
        saved = dict(st.config)
        if self.cfg.schedule == "constant":
            saved.pop("steps", None)
        diff = _diff(saved, self.cfg.result_fields()) + _diff(st.identity, self.identity)
        if diff:
            now = {**self.cfg.result_fields(), **self.identity}
            was = {**st.config, **st.identity}
            raise CheckpointError(f"{self.path}: cannot resume, the recorded config differs in {diff} (saved "
                                  f"{[was.get(k) for k in diff]}, now {[now.get(k) for k in diff]}); use another "
                                  "directory or delete the checkpoint")
        if st.step > self.cfg.steps:
            raise CheckpointError(f"{self.path}: cannot resume, the checkpoint has {st.step} steps done, more than "
                                  f"steps={self.cfg.steps}; use another directory or delete the checkpoint")
        if st.no_decay is not None and st.no_decay != self.no_decay:
            moved = sorted(set(st.no_decay) ^ set(self.no_decay))
            raise CheckpointError(f"{self.path}: cannot resume, weight decay applies to other parameters than "
                                  f"in the checkpoint (decay= differs for {moved[:5]}); use another directory "
                                  "or delete the checkpoint")
        self._restore(st, self.path, everything=True)
        self.loaded = "resumed"
        return True

    def fork_from(self, path) -> None:
        """Start from another run's training state (weights, AdamW state, step, RNG states) under
        this trainer's config (e.g. weight decay 0), with empty history and metrics."""
        if self.loaded is not None or self.history["step"]:
            raise TrainConfigError("fork_from needs a trainer that has neither loaded a checkpoint nor trained")
        self._restore(read_state(path), Path(path), everything=False)
        self._decided, self.loaded = True, "forked"

    # ------------------------------------------------------------------ the loop

    def _record(self, ev: Eval) -> dict | None:
        self.model.eval()
        try:
            rec = self._call(f"Eval {ev.name!r}", ev.fn, self)
        finally:
            self.model.train()
        if rec is not None and not isinstance(rec, dict):
            raise TrainingError(f"{self.desc}: Eval {ev.name!r} must return a dict or None, got {type(rec).__name__}")
        if rec is not None:
            if self.path is not None:                # recorded in the checkpoint's JSON
                checks.check_record(rec, ev.name, self.desc)
            rec = {"step": self.step, **rec}
            self.metrics[ev.name].append(rec)
        return rec

    def _push(self, values: dict) -> None:
        n = len(self.history["step"])
        for k, v in values.items():
            self.history.setdefault(k, [math.nan] * n).append(v)
        for col in self.history.values():           # a value post_step left out this time
            if len(col) == n:
                col.append(math.nan)

    def _call(self, what: str, fn, *args):
        """A user callback; what it raises becomes a TrainingError naming it and the step (chained,
        so the traceback is still there), with the checkpoints already written left intact."""
        try:
            return fn(*args)
        except (WtcError, KeyboardInterrupt):
            raise
        except Exception as exc:
            where = "" if self.path is None else f"; the last checkpoint in {self.path} is intact"
            raise TrainingError(f"{self.desc}: {what} raised {type(exc).__name__} at step {self.step}: {exc}{where}") from exc

    def _update(self) -> tuple[float, dict]:
        """One optimiser step (module doc); returns the loss and post_step's values."""
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = self._call("loss_fn", self.loss_fn, self._call("batch_fn", self.batch_fn, self.step))
        if not torch.is_tensor(loss) or loss.numel() != 1 or not loss.requires_grad or not loss.is_floating_point():
            raise TrainingError(f"{self.desc}: loss_fn must return a scalar tensor with a gradient, got "
                                f"{type(loss).__name__}{tuple(loss.shape) if torch.is_tensor(loss) else ''}")
        if not torch.isfinite(loss):
            where = "" if self.path is None else f"; the last checkpoint in {self.path} is intact"
            raise TrainingError(f"{self.desc}: loss is {loss.item()} at step {self.step} (lr {lr:.3g}){where}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        value = loss.item()
        self.step += 1
        extra = (self._call("post_step", self.post_step, self) if self.post_step else None) or {}
        if not isinstance(extra, dict):
            raise TrainingError(f"{self.desc}: post_step must return a dict or None, got {type(extra).__name__}")
        checks.check_post_step(extra, self.desc)
        self._push({"step": self.step, "loss": value, "lr": lr, **extra})
        return value, extra

    def run(self, stop_after: int | None = None, budget_s: float | None = None) -> TrainResult:
        """Train to cfg.steps (resuming first); stop_after: return, checkpointed, once this many
        updates are done, as a kill would; budget_s: likewise after this many seconds. With a path,
        SIGINT / SIGTERM end the run checkpointed at a whole step and are then delivered (module doc)."""
        checks.check_run(stop_after, budget_s)
        self.resume()
        target, start = self.cfg.steps, self.step
        stopped_by = self._stopped()                   # a resume of a run that already stopped early
        self._t0 = time.perf_counter()
        bar = tqdm(total=target, initial=min(start, target), disable=not self.progress, desc=self.desc,
                   leave=self.leave, dynamic_ncols=True, mininterval=1)
        postfix: dict[str, str] = {}
        held = Deferred(self.path is not None)
        try:
            with torch_threads(self.threads):
                self.model.train()
                if self.loaded is None and start == 0 and not any(self.metrics.values()):
                    for ev in self.evals:
                        if 0 in ev.at:
                            self._record(ev)
                    stopped_by = self._stopped()
                if self.path is not None and not checkpoint_io.exists(self.path):
                    self.save()                        # the run exists from its start (module doc)
                last_save = time.monotonic()
                while self.step < target and stopped_by is None:
                    value, extra = self._update()
                    for ev in self.evals:
                        if ev.due(self.step) and (rec := self._record(ev)) is not None:
                            postfix.update({k: f"{rec[k]:.3g}" for k in ev.show
                                            if isinstance(rec.get(k), (int, float))})
                    stopped_by = self._stopped()
                    bar.update(1)
                    if self.step % 10 == 0 or self.step == target:
                        bar.set_postfix({"loss": f"{value:.3f}", **{k: f"{v:.3g}" for k, v in extra.items()}, **postfix})
                    stop = (stop_after is not None and self.step >= stop_after) or stopped_by is not None or \
                           (budget_s is not None and time.perf_counter() - self._t0 >= budget_s) or \
                           held.pending is not None
                    timely = self.checkpoint_seconds is not None and \
                        time.monotonic() - last_save >= self.checkpoint_seconds
                    if self.path is not None and (self.step == target or stop or timely or self.step in self.checkpoint_at
                                                  or (self.checkpoint_every and self.step % self.checkpoint_every == 0)):
                        self.save()
                        last_save = time.monotonic()
                    if stop:
                        break
        finally:
            held.restore()                             # the handlers of before, whatever happened here
            ran, loop_s = self.step - start, time.perf_counter() - self._t0
            self._seconds_before, self._t0 = self._seconds_before + loop_s, None
            bar.close()
            self.model.eval()
        held.deliver()                                 # a held signal, now that its checkpoint is written
        return TrainResult(step=self.step, finished=self.step >= target, seconds=self.seconds,
                           seconds_per_step=loop_s / ran if ran > 0 else None,
                           history={k: list(v) for k, v in self.history.items()},
                           metrics=self.metrics, path=self.path, stopped_by=stopped_by)

    def _stopped(self) -> str | None:
        """The name of the first Eval whose stop predicate holds on its latest record (None: none)."""
        for ev in self.evals:
            recs = self.metrics.get(ev.name)
            if ev.stop is not None and recs and self._call(f"Eval {ev.name!r} stop", ev.stop, recs[-1]):
                return ev.name
        return None


def train(model, cfg: TrainConfig, batch_fn, loss_fn, stop_after: int | None = None, budget_s: float | None = None,
          **kw) -> TrainResult:
    """Trainer(model, cfg, batch_fn, loss_fn, **kw).run(stop_after, budget_s)."""
    return Trainer(model, cfg, batch_fn, loss_fn, **kw).run(stop_after=stop_after, budget_s=budget_s)


__all__ = ["Eval", "TrainConfig", "TrainResult", "TrainState", "Trainer", "load_model", "lr_at", "model_config",
           "read_state", "train"]

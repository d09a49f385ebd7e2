"""Argument and value checks of the training loop (wtc.models.training): what a TrainConfig,
run()'s arguments, a Trainer, an Eval, post_step and an Eval's record must be, each refused with a
TrainConfigError / TrainingError that names the argument, the value and what was expected."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Collection

import numpy as np
import torch

from wtc import arguments, checkpoint_io
from wtc.errors import CheckpointError, TrainConfigError, TrainConfigTypeError, TrainingError


def step_number(v, lo: int) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= lo


def identity(value) -> dict:
    """The caller's identity as JSON (a dict of str keys; finite numbers: NaN never equals itself, so
    a resume would always be refused)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TrainConfigError(f"identity must be a dict (what a resume must agree on), got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TrainConfigError(f"identity must be JSON data (dicts with str keys, lists, str, finite numbers, bool, "
                               f"None): {exc}") from None


def check_train_config(cfg, schedules) -> None:
    """TrainConfig's fields (its __post_init__; numpy floats become floats, for JSON)."""
    def bad(name, what):
        raise TrainConfigError(f"TrainConfig.{name} must be {what}, got {getattr(cfg, name)!r}")

    def number(v):
        return isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and math.isfinite(v)

    for name in ("lr", "eps", "weight_decay", "grad_clip", "min_lr_frac"):   # numpy floats as floats (JSON)
        if isinstance(getattr(cfg, name), np.floating):
            setattr(cfg, name, float(getattr(cfg, name)))

    for name, lo in (("steps", 0), ("warmup", 0)):
        v = getattr(cfg, name)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            bad(name, f"an int >= {lo}")
    if cfg.warmup > cfg.steps:
        bad("warmup", f"at most steps ({cfg.steps}); the learning rate would never reach lr")
    if not number(cfg.lr) or cfg.lr <= 0:
        bad("lr", "a number > 0")
    if not number(cfg.eps) or cfg.eps <= 0:
        bad("eps", "a number > 0")
    if not number(cfg.weight_decay) or cfg.weight_decay < 0:
        bad("weight_decay", "a number >= 0")
    if cfg.grad_clip is not None and (not number(cfg.grad_clip) or cfg.grad_clip <= 0):
        bad("grad_clip", "a number > 0 or None")
    b = cfg.betas
    if not isinstance(b, (tuple, list)) or len(b) != 2 or not all(number(x) and 0 <= x < 1 for x in b):
        bad("betas", "two numbers in [0, 1)")
    cfg.betas = tuple(float(x) for x in b)
    if cfg.schedule not in schedules:
        bad("schedule", f"one of {schedules}")
    if not number(cfg.min_lr_frac) or not 0 <= cfg.min_lr_frac <= 1:
        bad("min_lr_frac", "a number in [0, 1]")


def check_run(stop_after, budget_s) -> None:
    """Trainer.run's arguments."""
    if stop_after is not None and (not isinstance(stop_after, int) or isinstance(stop_after, bool) or stop_after < 1):
        raise TrainConfigError(f"stop_after must be None or a positive integer, got {stop_after!r}")
    if budget_s is not None and (not isinstance(budget_s, (int, float)) or isinstance(budget_s, bool)
                                 or not math.isfinite(budget_s) or budget_s <= 0):
        raise TrainConfigError(f"budget_s must be None or a finite positive number of seconds, got {budget_s!r}")


def check_eval(ev) -> None:
    """An Eval's fields (its __post_init__): every=-1 would run at every step, every=0 never."""
    if not isinstance(ev.name, str) or not ev.name:
        raise TrainConfigError(f"Eval.name must be a non-empty str, got {ev.name!r}")
    if not callable(ev.fn):
        raise TrainConfigError(f"Eval {ev.name!r}: fn must be callable, got {type(ev.fn).__name__}")
    if ev.every is not None and not step_number(ev.every, 1):
        raise TrainConfigError(f"Eval {ev.name!r}: every must be None or a positive integer, got {ev.every!r}")
    if isinstance(ev.at, (str, bytes)) or not isinstance(ev.at, Collection) or \
            not all(step_number(s, 0) for s in ev.at):
        raise TrainConfigError(f"Eval {ev.name!r}: at must be a collection of step numbers (ints >= 0), got {ev.at!r}")
    if isinstance(ev.show, str) or not all(isinstance(k, str) for k in ev.show):
        raise TrainConfigError(f"Eval {ev.name!r}: show must be a tuple of record keys (str), got {ev.show!r}")
    if ev.stop is not None and not callable(ev.stop):
        raise TrainConfigError(f"Eval {ev.name!r}: stop must be None or a callable on its record, got "
                               f"{type(ev.stop).__name__}")


MAX_THREADS = 4096                  # more intra-op threads than any machine has cores: a typo


def check_trainer(model, batch_fn, loss_fn, *, path, evals, rngs, threads, decay, post_step, checkpoint_every,
                  checkpoint_at, checkpoint_seconds=None) -> int | None:
    """Trainer's arguments, before anything is built; returns threads as an int (or None)."""
    if not isinstance(model, torch.nn.Module):
        raise TrainConfigTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names = [e.name for e in evals]
    if len(set(names)) != len(names):
        raise TrainConfigError(f"Eval names must be unique, got {names}")
    if rngs is not None and not isinstance(rngs, dict):
        raise TrainConfigTypeError(f"rngs must be a dict of name -> numpy or torch Generator, got {type(rngs).__name__}")
    for name, g in (rngs or {}).items():
        if not isinstance(g, (np.random.Generator, torch.Generator)):
            raise TrainConfigTypeError(f"rngs[{name!r}] must be a numpy or torch Generator, got {type(g).__name__}")
    if threads is not None:
        threads = arguments.positive_int(threads, "threads", TrainConfigError)
        if threads > MAX_THREADS:
            raise TrainConfigError(f"threads must be a positive integer <= {MAX_THREADS} (intra-op torch threads), "
                                   f"got {threads}")
    for name, fn in (("decay", decay), ("post_step", post_step)):
        if fn is not None and not callable(fn):
            raise TrainConfigTypeError(f"{name} must be None or callable, got {type(fn).__name__}")
    if path is not None:
        if not isinstance(path, (str, Path)):
            raise TrainConfigTypeError(f"path must be None or a path (str or Path), got {type(path).__name__}")
        try:
            checkpoint_io.stem(path)            # refused now, not at the first save
        except CheckpointError as exc:
            raise TrainConfigError(f"path: {exc}") from None
        for above in Path(path).absolute().parents:     # the nearest existing ancestor must be a directory
            if above.is_dir():
                break
            if above.exists() or above.is_symlink():
                what = "a broken symbolic link" if not above.exists() else "not a directory"
                raise TrainConfigError(f"path {str(path)!r}: {above} is {what}, so the checkpoint cannot be "
                                       "written there")
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 1):
        raise TrainConfigError(f"checkpoint_every must be None or a positive int, got {checkpoint_every!r}")
    if checkpoint_seconds is not None and (isinstance(checkpoint_seconds, bool) or
                                           not isinstance(checkpoint_seconds, (int, float)) or
                                           not math.isfinite(checkpoint_seconds) or checkpoint_seconds < 0):
        raise TrainConfigError(f"checkpoint_seconds must be None or a finite number of seconds >= 0, got "
                               f"{checkpoint_seconds!r}")
    if isinstance(checkpoint_at, (str, bytes)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in checkpoint_at):
        raise TrainConfigError(f"checkpoint_at must be a collection of step numbers (ints >= 0), got {checkpoint_at!r}")
    if path is not None and (Path(path).is_dir() or (Path(path).exists() and Path(path).suffix not in
                                                      (".safetensors", ".json"))):
        raise TrainConfigError(f"path {str(path)!r} is the stem of a checkpoint pair ({path}.safetensors + "
                               f"{path}.json), but {path} itself exists; name a new stem, e.g. {path}/state")
    for name, fn in (("batch_fn", batch_fn), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise TrainConfigError(f"{name} must be callable")
    return threads


def check_record(rec: dict, name: str, desc: str) -> None:
    """An Eval's record that goes into the checkpoint's JSON."""
    try:
        json.dumps(rec)
    except (TypeError, ValueError) as exc:
        raise TrainingError(f"{desc}: Eval {name!r} must return JSON data (it is saved in the checkpoint), got "
                            f"{rec!r:.120}: {exc}") from None


def check_post_step(extra: dict, desc: str) -> None:
    """post_step's values: numbers under names of their own (a 'loss' would overwrite the recorded loss)."""
    clash = sorted(set(extra) & {"step", "loss", "lr"}, key=str)
    if clash:
        raise TrainingError(f"{desc}: post_step returned {clash}, which the trainer records itself; name its "
                            "values otherwise")
    for k, v in extra.items():
        if not isinstance(k, str) or isinstance(v, bool) or not (isinstance(v, (int, float, np.number)) or
                                                                 (torch.is_tensor(v) and v.numel() == 1)):
            raise TrainingError(f"{desc}: post_step must return str keys with numbers, got {k!r}: {v!r:.60}")

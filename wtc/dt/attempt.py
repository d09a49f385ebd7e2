"""One attempt: a population of R replicas trained side by side, finished and judged on fresh data.

An attempt is deterministic in (task, rung config, seed, attempt index). Everything needed to
checkpoint and resume it lives in `Attempt`; a finished attempt's result (key, model, history)
is written and read back by save_result / load_result, which refuse a file of another run.
`TrainJob` is the attempt as a unit of work for wtc.dt.workers (in this process or a worker).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from wtc import checkpoint_io
from wtc.dt import checkpoint, graph_step
from wtc.dt.adamw import adamw
from wtc.dt.config import DTConfig
from wtc.dt.finish import masked_mse, polish, refit_head
from wtc.dt.history import History
from wtc.dt.ladder import Deadline
from wtc.dt.model import DiscreteTransformer
from wtc.dt.periodic_snap import snap_coefficients
from wtc.dt.step_snap import snap_steps
from wtc.dt.refine import refine_pointers
from wtc.dt.schedule import Anneal
from wtc.dt.scores import metric_value, nearly, rank_key, solid
from wtc.dt.selection import EVAL, Sampling, entropy
from wtc.dt.settle import (POLISH_CHECK_ITERS, POLISH_CHECK_STEPS, SETTLE_EVERY, SETTLE_FROM, SNAP_CHECK_STEPS,
                            check, quality)
from wtc.dt.snap import SNAP_SEQUENCES, snap_heads
from wtc.errors import CheckpointError
from wtc.progress import Steps, mode, say

CHECKPOINT_EVERY = 250   # steps between training-state checkpoints (when a directory is given)
LOG_EVERY = 10           # steps between history records (entropies cost a softmax over every head)
FIT_SEQUENCES = 2048     # sequences for normalisation and the head refit
POLISH_SEQUENCES = 1024  # full batch of the L-BFGS polish (10k positions)
REFINE_SEQUENCES = 512   # batch of the pointer refinement (counterfactual forwards per key)
PRECISION_REPLICAS = 2   # nearly-solved replicas that get the float64 polish
PRECISION_CHUNK = 250    # L-BFGS iterations between checks whether they are solved
PRECISION_GAIN = 0.01    # a chunk lowering no replica's loss by 1% ends the pass
# DTConfig fields that steer the ladder, not what one attempt computes: a resume may change them
LADDER_FIELDS = ("max_attempts", "workers")
READ_CHECKS = 1          # close checks an attempt ends at for a reading (read_close); a failed one costs a finish and a reading
CLOSE_READ = "close: read"   # settled_by of an attempt that ended at a close check


def tau_at(config: DTConfig, step: int) -> float:
    """Geometric annealing tau_start -> tau_end over config.steps, updated every step (the public
    schedule object, wtc.dt.schedule.Anneal, which a user's own loop steps)."""
    return Anneal.from_config(config).tau_at(step)


def check_run(path, recorded: dict, task, seed: int, attempt: int, config: DTConfig) -> None:
    """Refuse a checkpoint or result written by another run; the message names the field."""
    for name, want in (("task", task.name), ("seed", seed), ("attempt", attempt)):
        if recorded.get(name) != want:
            raise CheckpointError(f"{path}: checkpoint is for {name} {recorded.get(name)!r}, not {want!r} "
                                  f"(another run's files: use another directory, or do not resume)")
    if "task_sha256" in recorded and recorded["task_sha256"] != task.fingerprint():
        raise CheckpointError(f"{path}: checkpoint is for another task named {task.name!r} (its samples or "
                              f"targets differ: task fingerprint mismatch); use another directory")
    have, want = recorded.get("config") or {}, config.to_dict()
    diff = sorted(k for k in set(have) | set(want) if k not in LADDER_FIELDS and have.get(k) != want.get(k))
    if diff:
        shown = "; ".join(f"{k}={have.get(k)!r}, now {want.get(k)!r}" for k in diff[:3])
        raise CheckpointError(f"{path}: checkpoint was written with a different DTConfig ({shown})")


class Attempt:
    """One population run: all state needed to checkpoint and resume it lives here."""

    def __init__(self, task, config: DTConfig, seed: int, attempt: int, device: str | torch.device | None = None,
                 settle: bool = False, read_close: bool = False):
        """device (default config.device): where the steps run (a CUDA device takes the Triton
        kernels); the model is built and normalised on the CPU first, so a seed gives the same
        initial model anywhere. settle: end the annealing once a replica is exact (wtc.dt.settle;
        discover's attempts: wtc.train keeps the whole schedule it was given). read_close (with
        settle): also end it, up to READ_CHECKS times, at a polished check that finds a replica
        close (wtc.dt.settle.Check.worth_reading), keeping in `resume_from` this attempt as it
        stood at the check: the caller reads the finished population and, when no reading
        verifies, trains on from there (step for step the attempt that never stopped)."""
        self.task, self.config, self.seed, self.attempt = task, config, seed, attempt
        self.settle = settle
        self.read_checks_left = READ_CHECKS if settle and read_close else 0
        self.resume_from: Attempt | None = None   # set when the annealing ended at a close check
        config.check_size(task.seq_len, task.n_inputs)
        self.device = torch.device(device or config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"DTConfig.device={str(self.device)!r} but torch sees no CUDA device "
                               f"(torch {torch.__version__}, cuda available: False)")
        self.rng = np.random.default_rng([seed, attempt, 0])                 # training data
        self.generator = torch.Generator(device=self.device).manual_seed(
            int(np.random.default_rng([seed, attempt, 1]).integers(2**62)))
        with torch.random.fork_rng():
            torch.manual_seed(int(np.random.default_rng([seed, attempt, 2]).integers(2**62)))
            self.model = DiscreteTransformer(config, seq_len=task.seq_len, n_inputs=task.n_inputs,
                                             n_outputs=task.n_outputs)
        x, y = task.batch(np.random.default_rng([seed, attempt, 3]), FIT_SEQUENCES)
        self.model.fit_normalization(x, y)
        self.fit_data = self._tensors(x, y)
        with torch.no_grad():   # module-output ranges for the PLE bins, from the untrained model
            self.model(self.fit_data[0][:512], Sampling.anneal(config.tau_start, gumbel=False, straight_through=False),
                       track_ranges="set")
        self.model.to(self.device)
        self.fit_data = tuple(t.to(self.device) for t in self.fit_data)
        self.optimizer = adamw(self.model.parameters(), config.lr, config.weight_decay, self.device)
        self.step, self.phase = 0, "anneal"
        self.hard_from = config.steps          # the step the hard phase starts at (earlier once settled)
        self.settled_by: str | None = None     # how the settle check found a replica exact (wtc.dt.settle)
        self.graphed: graph_step.GraphedStep | None = None   # hard-phase steps from a CUDA graph (GPU only)
        self.snaps, self.snap_seconds = [], 0.0   # heads set to routing rules at the finish (wtc.dt.snap), CPU s
        self.coefficient_snaps, self.step_snaps = [], []   # wtc.dt.periodic_snap, wtc.dt.step_snap
        heads = [n for b in self.model.blocks if b.attn is not None for n in b.attn.head_names]
        slots = [s for sel in self.model.selectors() for s in sel.slot_names]
        self.history = History(task.name, "accuracy" if task.output == "integer" else "max_rel_err",
                               slots, heads, attempt=attempt)

    # ------------------------------------------------------------------ data
    def _tensors(self, x: np.ndarray, y: np.ndarray):
        m = self.model
        dev = m.x_scale.device
        xt = m.normalize_inputs(torch.as_tensor(x, dtype=torch.float32, device=dev))
        y_raw = torch.as_tensor(y, dtype=torch.float32, device=dev)
        yt = m.normalize_targets(y_raw)
        valid = torch.isfinite(yt)
        return xt, torch.nan_to_num(yt), valid.float(), y_raw

    def _batch_metric(self, pred: torch.Tensor, y_raw: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
        """Per replica: accuracy (integer outputs) or the largest relative error (real)."""
        with torch.no_grad():
            real = self.task.output != "integer"
            q = quality(self.model, pred, y_raw, valid, real)
            return -q if real else q

    # ------------------------------------------------------------------ phases
    def train_step(self) -> None:
        cfg = self.config
        if self.phase == "anneal":
            tau = tau_at(cfg, self.step)
            sampling = Sampling.anneal(tau, gumbel=cfg.gumbel, straight_through=cfg.straight_through,
                                       generator=self.generator)
        else:
            tau = cfg.tau_end
            sampling = Sampling.hard_phase(tau)
        x, y = self.task.batch(self.rng, cfg.batch_size)
        xt, yt, valid, y_raw = self._tensors(x, y)
        at_check = self.settle and self.phase == "anneal" and (self.step + 1) % SETTLE_EVERY == 0   # may be the last
        log_entropy = self.step % LOG_EVERY == 0 or self.step + 1 == self.planned_steps or at_check
        if self.phase == "hard" and not log_entropy and graph_step.enabled(self.device):
            if self.graphed is None:
                self.graphed = graph_step.GraphedStep(self._hard_update, self.optimizer,
                                                      settled=self.model.structure_known)
            self.graphed.step(xt, yt, valid)
        else:
            sampling = dataclasses.replace(sampling, stats=log_entropy)
            pred, stats, loss_r = self._update(xt, yt, valid, sampling)
            if log_entropy:
                with torch.no_grad():
                    sel_h = torch.cat([entropy(s.probabilities(tau)) for s in self.model.selectors()], dim=1)
                    attn_h = torch.cat(stats["attn_entropy"], dim=1) if stats["attn_entropy"] else torch.zeros(self.model.R, 0)
                self.history.record(self.step, self.phase, tau, loss_r.detach().cpu().numpy(),
                                    self._batch_metric(pred.detach(), y_raw, valid), sel_h.cpu().numpy(), attn_h.cpu().numpy())
        self.step += 1
        if self.phase == "anneal" and self.step < cfg.steps and self._settled():
            self.phase, self.hard_from = "finish", self.step     # exact now: the finish starts from here
        elif self.phase == "anneal" and self.step >= cfg.steps:
            self.phase, self.hard_from = "hard", self.step
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.lr * cfg.hard_lr_scale
        elif self.phase == "hard" and self.step >= self.hard_from + cfg.hard_steps:
            self.phase = "finish"
            self.graphed = None      # its buffers and memory pool are of no further use

    @property
    def planned_steps(self) -> int:   # the annealing (cut short once settled) and the hard phase (none once settled)
        return self.hard_from + (0 if self.hard_from < self.config.steps else self.config.hard_steps)

    def _settled(self) -> bool:
        """Whether the annealing may end here: some replica is exact at a settle check (wtc.dt.settle)."""
        if not self.settle or self.step < SETTLE_FROM or self.step % SETTLE_EVERY:
            return False
        return self._exact(snap=self.step in SNAP_CHECK_STEPS, polish=self.step in POLISH_CHECK_STEPS)

    def _exact(self, snap: bool = True, polish: bool = False) -> bool:
        """Some replica is exact on the settle check (wtc.dt.settle.exact_by), or close enough to
        read (read_close); snap, polish: the snapped and polished checks may run. The first way it
        settled is kept (settled_by)."""
        real = self.task.output != "integer"
        found = check(self.model, self.fit_data, snap=snap and self.config.snap, real=real,
                      polish_iters=POLISH_CHECK_ITERS if polish and self.config.polish_iters else 0)
        how = found.how
        if how is None and self.read_checks_left and self.phase == "anneal" and found.worth_reading(real):
            self.read_checks_left -= 1
            # the attempt as it stands (steps on as if unchecked); the task and the fit data are never changed
            self.resume_from = copy.deepcopy(self, {id(self.task): self.task, id(self.fit_data): self.fit_data})
            how = CLOSE_READ
        if how is not None and self.phase == "anneal":
            self.settled_by = how
        return how is not None

    def _update(self, xt: torch.Tensor, yt: torch.Tensor, valid: torch.Tensor, sampling: Sampling):
        """One optimizer step on a batch: forward (module ranges tracked), loss, backward, AdamW.
        -> (predictions, stats, per-replica loss)."""
        cfg = self.config
        pred, stats = self.model(xt, sampling, track_ranges="ema")
        loss_r = masked_mse(pred, yt, valid)
        objective = loss_r.sum()
        if cfg.redundancy_penalty and stats["redundancy"]:
            objective = objective + cfg.redundancy_penalty * torch.stack(stats["redundancy"]).sum()
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        self.optimizer.step()
        return pred, stats, loss_r

    def _hard_update(self, xt: torch.Tensor, yt: torch.Tensor, valid: torch.Tensor) -> None:
        """A hard-phase step; within model.structure_known it never reads the device (what
        wtc.dt.graph_step captures)."""
        self._update(xt, yt, valid, Sampling.hard_phase(self.config.tau_end))

    def finish(self, deadline: Deadline | None = None) -> None:
        """Freeze the discrete structure, refit the head exactly, polish the continuous parts (summed
        steps snap after it: it brings them closest to whole). A deadline's finish_by stops snaps and polishes."""
        end = None if deadline is None else deadline.finish_by
        self.model.freeze()
        self.model.eval()
        x, y, valid = self.fit_data[:3]
        n, k = POLISH_SEQUENCES, SNAP_SEQUENCES
        refit_head(self.model, x, y, valid)
        if self.config.snap:
            started = time.process_time()
            self.snaps = snap_heads(self.model, x[:k], y[:k], valid[:k], until=end)
            self.snap_seconds = time.process_time() - started
            refit_head(self.model, x, y, valid)      # candidates were scored on a subset
            self.coefficient_snaps = snap_coefficients(self.model, x[:k], y[:k], valid[:k], until=end)
        if self.config.polish_iters:
            polish(self.model, x[:n], y[:n], valid[:n], iters=self.config.polish_iters, until=end)
        if self.config.refine_steps and refine_pointers(self.model, x[:REFINE_SEQUENCES], y[:REFINE_SEQUENCES],
                                                        valid[:REFINE_SEQUENCES], steps=self.config.refine_steps,
                                                        until=end):
            refit_head(self.model, x, y, valid)
            if self.config.polish_iters:
                polish(self.model, x[:n], y[:n], valid[:n], iters=self.config.polish_iters, until=end)
        self.step_snaps = snap_steps(self.model, x[:k], y[:k], valid[:k], until=end) if self.config.snap else []
        self.phase = "done"

    def precision_pass(self, scores: list[dict], deadline: Deadline | None = None) -> list[dict]:
        """Float64 L-BFGS for the best nearly-solved replicas: float32 polish stalls around 3e-3
        relative error (measured on free_fall_height), float64 reaches below 1e-3.

        Skipped when a replica is already solved with margin (a population needs one: on
        parity_last2 the pass spent 59 s CPU, 60% of the attempt, on two replicas it never solved
        while six others were solid); stopped after a chunk that lowers no loss by PRECISION_GAIN.
        A replica solved without the margin is polished first (rose_c: solid after two chunks, 11 s,
        where four chunks on the two closest unsolved ones solved neither, 22 s). An attempt ended at
        a close check gets the whole pass too: after one chunk free_fall_height at step 200 read as
        100.003 - 4.907 t^2 + 0.007 t (verified, within the tolerance), after the pass as 100 - 4.905 t^2."""
        if any(solid(self.task, s) for s in scores):
            return scores
        close = [r for r, s in enumerate(scores) if nearly(self.task, s)]
        close = sorted(close, key=lambda r: rank_key(self.task, scores[r]), reverse=True)[:PRECISION_REPLICAS]
        if not close:
            return scores
        x, y, valid = (t[:POLISH_SEQUENCES].double() for t in self.fit_data[:3])
        sub = self.model.select_replicas(close).double()
        done = 0
        while done < self.config.precision_iters:   # in chunks: stop once one of them is solved
            if deadline is not None and time.time() >= deadline.finish_by:
                break
            step = min(PRECISION_CHUNK, self.config.precision_iters - done)
            ratio = polish(sub, x, y, valid, iters=step, until=None if deadline is None else deadline.finish_by)
            done += step
            self.model.assign_replicas(close, copy.deepcopy(sub).float())   # .float() is in place
            scores = self.evaluate(self.config.eval_sequences)
            if any(solid(self.task, scores[r]) for r in close):   # a population needs one solved replica
                break
            if bool((ratio > 1 - PRECISION_GAIN).all()):           # stalled: more chunks will not solve it
                break
        return scores

    def evaluate(self, n: int) -> list[dict]:
        x, y = self.task.batch(np.random.default_rng([self.seed, self.attempt, 4]), n)
        preds = self.model.predict(x, replica=-1)
        return [self.task.score(p, y) for p in preds]

    # ------------------------------------------------------------------ checkpointing
    def save(self, path: Path) -> None:
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        opt = self.optimizer.state_dict()
        for i, st in opt["state"].items():
            for k, v in st.items():
                tensors[f"opt.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
        tensors["rng.torch"] = self.generator.get_state()
        arrays = self.history.arrays()
        for k in ("loss", "metric", "sel_entropy", "attn_entropy"):
            tensors[f"hist.{k}"] = torch.from_numpy(np.ascontiguousarray(arrays[k]))
        meta = {"model": checkpoint.model_meta(self.model), "task": self.task.name,
                "task_sha256": self.task.fingerprint(), "seed": self.seed,
                "attempt": self.attempt, "step": self.step, "phase": self.phase, "hard_from": self.hard_from,
                "settled_by": self.settled_by,
                "rng_numpy": self.rng.bit_generator.state, "opt_groups": opt["param_groups"],
                "hist_step": self.history.step, "hist_phase": self.history.phase, "hist_tau": self.history.tau}
        checkpoint_io.write_atomic(path, tensors, meta)

    def restore(self, path: Path) -> None:
        tensors, meta = checkpoint_io.read(path)
        check_run(path, {**meta, "config": meta.get("model", {}).get("config")}, self.task, self.seed,
                  self.attempt, self.config)
        self.model = checkpoint.build_model(meta["model"], tensors, prefix="model.").to(self.device)
        state = {}
        for key, value in tensors.items():
            if key.startswith("opt."):
                _, i, name = key.split(".", 2)
                state.setdefault(int(i), {})[name] = value
        self.optimizer = adamw(self.model.parameters(), self.config.lr, self.config.weight_decay, self.device)
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["opt_groups"]})
        self.generator.set_state(tensors["rng.torch"])
        self.rng.bit_generator.state = meta["rng_numpy"]
        self.step, self.phase = meta["step"], meta["phase"]
        self.hard_from = meta.get("hard_from", self.config.steps)   # states written before settling existed
        self.settled_by = meta.get("settled_by")
        self.graphed = None          # a graph captured the model and optimizer replaced above
        h = self.history
        h.step, h.phase, h.tau = list(meta["hist_step"]), list(meta["hist_phase"]), list(meta["hist_tau"])
        for k in ("loss", "metric", "sel_entropy", "attn_entropy"):
            setattr(h, k, list(tensors[f"hist.{k}"].numpy()))


# ---------------------------------------------------------------------- a whole attempt
def run_attempt(run: Attempt, progress: bool | str = False, state_path: Path | None = None,
                deadline: Deadline | None = None) -> list[dict]:
    """Train one population to the end (resuming where `run` stands); fresh-data scores per replica.

    progress: True / "on" (shown here, wtc.progress), "worker" (reported to the parent process) or
    False / "off".

    deadline: training stops at deadline.train_until, the state is saved to state_path (a resume
    continues from it), and the population is finished and scored as it stands (the snap, the
    polish and the precision pass stop at deadline.finish_by); history.final["stopped_at_step"]
    says so."""
    cfg = run.config
    t_start = time.perf_counter()
    total = cfg.steps + cfg.hard_steps
    bar = Steps(total, run.step, f"{run.task.name} attempt {run.attempt}", progress, key=f"attempt {run.attempt}")
    stopped = None
    while run.phase in ("anneal", "hard"):
        run.train_step()
        note = None
        if run.step % 50 == 0:
            loss = run.history.loss[-1]
            note = f"tau={run.history.tau[-1]:.3g}, best_loss={loss.min():.2e}, phase={run.phase}"
        bar.update(run.step, note)
        if state_path is not None and run.step % CHECKPOINT_EVERY == 0:
            run.save(state_path)
        if deadline is not None and run.phase != "finish" and deadline.training_over():
            stopped = run.step
            if state_path is not None:
                run.save(state_path)
            break
    bar.close()
    run.finish(deadline)
    scores = run.evaluate(cfg.eval_sequences)
    if cfg.precision_iters and stopped is None:
        scores = run.precision_pass(scores, deadline)
    run.history.final = {"scores": scores}
    settled = run.hard_from < cfg.steps
    extras = {"settled_at_step": run.hard_from if settled else None, "settled_by": run.settled_by if settled else None,
              "snaps": [dataclasses.asdict(s) for s in run.snaps], "coefficient_snaps": run.coefficient_snaps,
              "step_snaps": run.step_snaps}
    run.history.final.update({k: v for k, v in extras.items() if v})
    if stopped is not None:
        run.history.final.update(stopped_at_step=stopped, planned_steps=run.planned_steps)
        if mode(progress) == "on":      # in a worker the parent reports the attempt's end itself
            say(progress, f"{run.task.name} attempt {run.attempt}: the budget ran out at step {stopped} of {run.planned_steps}; "
                          "finished and scored as it stands")
    run.history.seconds = time.perf_counter() - t_start
    if mode(progress) == "on":
        keys = [rank_key(run.task, s) for s in scores]
        best = max(range(len(scores)), key=lambda i: keys[i])
        say(progress, f"{run.task.name} attempt {run.attempt}: {sum(k[0] for k in keys)}/{len(keys)} replicas "
                      f"solved; best {run.history.metric_name}={metric_value(run.task, scores[best]):.4g} "
                      f"({run.history.seconds:.1f}s)")
    return scores


def take_replica(run: Attempt, r: int):
    """(model, history) for replica r of a finished attempt."""
    scores = run.history.final["scores"]
    history = copy.copy(run.history)
    history.replica = r
    model = run.model.replica(r).cpu()
    model.train_info = {"task": run.task.name, "task_sha256": run.task.fingerprint(), "seed": run.seed,
                        "attempt": run.attempt, "replica": r,
                        "score": scores[r]}
    snapped = [s for s in run.history.final.get("snaps", []) if s["replica"] == r]
    if snapped:
        model.train_info["snaps"] = [{k: v for k, v in s.items() if k != "replica"} for s in snapped]
    return model, history


def best_replica(run: Attempt, scores: list[dict]):
    """(key, model, history) of the best replica of a finished attempt (the first of equals)."""
    keys = [rank_key(run.task, s) for s in scores]
    r = max(range(len(scores)), key=lambda i: keys[i])
    model, history = take_replica(run, r)
    return keys[r], model, history


# ---------------------------------------------------------------------- finished results
def save_result(path: Path, key, model, history) -> None:
    """Write a finished attempt's (key, model, history); model.train_info says whose it is."""
    arrays = history.arrays()
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for k in ("loss", "metric", "sel_entropy", "attn_entropy"):
        tensors[f"hist.{k}"] = torch.from_numpy(np.ascontiguousarray(arrays[k]))
    meta = {"model": checkpoint.model_meta(model), "key": list(key), "history": history.to_dict(),
            "hist_step": history.step, "hist_tau": history.tau, "train_info": model.train_info}
    checkpoint_io.write_atomic(path, tensors, meta)


def load_result(path: Path, task, seed: int, attempt: int, config: DTConfig):
    """(key, model, history) written by save_result for this task, seed, attempt and rung config;
    CheckpointError naming the field when the file is another run's."""
    tensors, meta = checkpoint_io.read(path)
    info = meta.get("train_info") or {}
    check_run(path, {**info, "config": meta.get("model", {}).get("config")}, task, seed, attempt, config)
    model = checkpoint.build_model(meta["model"], tensors, prefix="model.").eval()
    model.train_info = info
    h = meta["history"]
    history = History(h["task"], h["metric_name"], h["slot_names"], h["head_names"], attempt=h["attempt"],
                      replica=h["replica"], final=h["final"], seconds=h["seconds"])
    history.step, history.phase, history.tau = meta["hist_step"], h["phase"], meta["hist_tau"]
    for k in ("loss", "metric", "sel_entropy", "attn_entropy"):
        setattr(history, k, list(tensors[f"hist.{k}"].numpy()))
    return tuple(meta["key"]), model, history


def refuse_foreign(state: Path, result: Path | None, task, seed: int, rung) -> None:
    """A fresh run (no resume) into a directory holding another run's files for this attempt would
    overwrite them: CheckpointError naming whose they are. This run's own files are overwritten."""
    for path in (state, result):
        if path is None or not path.with_suffix(".json").exists():
            continue
        try:
            tensors, meta = checkpoint_io.read(path)
            info = meta.get("train_info") or meta
            check_run(path, {**info, "config": meta.get("model", {}).get("config")}, task, seed, rung.attempt,
                      rung.config)
        except CheckpointError as exc:
            raise CheckpointError(f"{path.parent} holds another run's checkpoint ({str(exc).split(': ', 1)[-1]}); "
                                  "a fresh run would overwrite it: use another checkpoint_dir or delete it") from None


class TrainJob:
    """wtc.train's work on one rung (the job protocol of wtc.dt.workers): train the population and
    keep its best replica. opts: checkpoint_dir (state every CHECKPOINT_EVERY steps and the result
    there), resume (continue from them), progress."""

    @staticmethod
    def result_path(opts: dict, attempt: int) -> Path | None:
        d = opts.get("checkpoint_dir")
        return Path(d) / f"attempt{attempt}_result" if d else None

    @staticmethod
    def finished(task, rung, seed: int, opts: dict, path: Path | None):
        """The result kept from an earlier run when resuming (checked to be this rung's), else None;
        None also for a result the budget stopped early (the resume trains on from its state)."""
        if opts.get("resume") and path is not None and path.with_suffix(".json").exists():
            result = load_result(path, task, seed, rung.attempt, rung.config)
            if "stopped_at_step" not in (result[2].final or {}):
                return result
        return None

    @staticmethod
    def run(task, rung, seed: int, opts: dict, path: Path | None):
        done = TrainJob.finished(task, rung, seed, opts, path)
        if done is not None:
            return done
        d = opts.get("checkpoint_dir")
        state = Path(d) / f"attempt{rung.attempt}" if d else None
        if state is not None and not opts.get("resume"):
            refuse_foreign(state, path, task, seed, rung)
        run = Attempt(task, rung.config, seed, rung.attempt)
        if opts.get("resume") and state is not None and state.with_suffix(".json").exists():
            run.restore(state)
        if opts.get("milestones"):        # in a worker: the parent shows what runs
            say(opts, f"{task.name} attempt {rung.attempt} ({rung.label}): training from step {run.step}")
        result = best_replica(run, run_attempt(run, mode(opts), state,
                                               Deadline.from_json(opts.get("deadline"))))
        if path is not None:
            save_result(path, *result)
        return result

    @staticmethod
    def load(path: Path, task, rung, seed: int):
        return load_result(path, task, seed, rung.attempt, rung.config)

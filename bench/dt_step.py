"""Where one Discrete Transformer training step spends its time, and whether torch.compile pays.

What it measures, per case (task x ladder rung: DTConfig().rung(i), i = 0..3, rung 0 being the
default DTConfig(); tasks parity_last2, T = 10, and running_sum_t20, a T = 20 running sum defined
here because every built-in task has T = 10):

1. Eager step time of the real `Attempt.train_step()` (data, forward, loss, backward, AdamW, the
   1-in-10 logging steps included) in the anneal phase (Gumbel noise, soft selections, tau changing
   every step) and the hard phase (argmax forward, straight-through gradients), at 1 torch thread
   (DTConfig.threads = 1, what training uses) and 2. Variants are interleaved round by round (each
   round: `--steps` steps of each variant after one warm-up step), and the median over `--rounds`
   of the per-round mean step time is reported, with ratios taken within the same run: the
   machine is shared, so absolute times drift, ratios much less.
2. A torch.profiler breakdown (anneal, 1 thread, 10 steps, so one logging step): the top 15 ops by
   self CPU time and their share of the step, top-level aten calls per step (what Python and the
   autograd engine dispatch) and leaf ops per step (calls that call no other aten op), the share of
   forward (and within it attention / sub-MLPs) / backward / optimizer / data, and the bytes
   allocated per step (profile_memory: the sum of the leaf ops' allocations).
3. FLOPs: an analytic count from the shapes (`analytic_flops`, formula in its docstring) next to
   torch.utils.flop_counter's count of the matmul-type ops (forward and backward) of one step, and
   the bytes a fused step must touch (parameters, their gradients, AdamW state, one batch) against
   the bytes eager materialises.
4. torch.compile (inductor, C++ backend built with the system gcc, dynamic=False, 1 thread):
   - "as is": `model.forward = torch.compile(model.forward)`, as bench/train_step.py does: the graph
     breaks (logged by dynamo, with their source lines) and the recompiles across the anneal
     schedule (tau and the noise seed are Python numbers baked into the graph as constants).
   - "traceable": the same model forward compiled with fullgraph=True after removing the breaks
     from the outside, without editing wtc/ (`traceable_forward`): the pass's randomness (selection
     uniforms, the attention noise seed and its counter-based Gumbel noise) is drawn eagerly from
     the attempt's generator in eager's order and fed in as tensors, tau is passed as a 0-d tensor,
     the backend choice and the `frozen` flags (False while training) are Python constants. The
     patched forward run eagerly gives bit-identical gradients (checked: `patched_eager_grad_diff`).
   For it: cold compile time (a new process on an empty inductor cache directory) and warm compile
   time (another new process on that cache: what a later attempt's worker pays), each the first
   two steps of a phase (the logging step's graph and the other one) less two steady steps, summed
   over both phases; then in this process the step time interleaved with eager, the graphs and
   recompiles, and the max abs difference of every parameter gradient after one step from the
   same state against eager (float32); and the net seconds saved over one attempt (DTConfig.steps
   anneal + hard_steps hard steps) after paying the compile.
   `--modes` adds inductor modes (reduce-overhead, max-autotune-no-cudagraphs) for the first case.

    python bench/dt_step.py [--quick] [--rounds 5] [--steps 10] [--compile-cases first|default|all|none]
                            [--modes default,max-autotune-no-cudagraphs]
    python bench/dt_step.py --versus REV [--quick] [--rounds 5] [--steps 10]

--versus REV: only the eager step time, side by side in three worker processes interleaved round by
round (1 thread each): the package at git revision REV (a temporary copy, this checkout's wtc._C
copied in), this checkout with WTC_KERNELS=reference, and this checkout as wtc.backend chooses; every
task x rung case (--quick: parity_last2 rung 0); writes bench/results/dt_step_versus.json.

Prints markdown tables and writes bench/results/dt_step.json. --quick: parity_last2 only, rungs 0
and 1, 3 rounds of 5 steps, torch.compile for rung 0 only.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import torch

import wtc
import wtc.dt.attention as attention_mod
import wtc.dt.selection as selection_mod
import wtc.dt.submlp as submlp_mod
from wtc.backend import choose
from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt
from wtc.dt.gumbel import draw_seed, gumbel_hash
from wtc.threads import torch_threads

from common import RESULTS, machine, stamp  # bench/common.py (run as a script)

OUT = RESULTS / "dt_step.json"


# ---------------------------------------------------------------------- workloads
def running_sum_t20() -> wtc.Task:
    """x_0 + ... + x_t over T = 20 positions, ints in [0, 10) (running_sum at twice the length)."""
    return wtc.Task("running_sum_t20", lambda rng, n: rng.integers(0, 10, size=(n, 20)).astype(np.float64),
                    lambda x: np.cumsum(x, axis=1), seq_len=20, output="integer")


def make_attempt(task, config: DTConfig, phase: str, attempt: int = 0) -> Attempt:
    """A fresh attempt about to run its first step of `phase` (hard: as if annealing were done)."""
    run = Attempt(task, config, seed=0, attempt=attempt)
    if phase == "hard":
        run.phase, run.step = "hard", config.steps
        for group in run.optimizer.param_groups:
            group["lr"] = config.lr * config.hard_lr_scale
    return run


# ---------------------------------------------------------------------- a traceable forward
class _Feed:
    """The randomness of one forward pass, drawn eagerly, consumed in order inside the graph."""
    uniforms: list = []
    noise: list = []


def _pre_draw(model, sampling, batch: int) -> None:
    """Draw what eager's forward draws from sampling.generator, in the same order: per block, the
    attention selector's uniforms, the attention noise seed (-> its Gumbel noise), the sub-MLP
    selector's uniforms."""
    _Feed.uniforms, _Feed.noise = [], []
    if not sampling.noise:
        return
    g = sampling.generator
    for block in model.blocks:
        for module in (block.attn, block.mlp):
            if module is None:
                continue
            logits = module.select.logits
            _Feed.uniforms.append(torch.rand(logits.shape, generator=g, dtype=logits.dtype, device=logits.device))
            if module is block.attn and module.H:
                seed = draw_seed(g)
                shape = (model.R, batch, module.H, module.T, module.P + module.T)
                _Feed.noise.append(gumbel_hash(seed, shape, logits.device, logits.dtype))


def _fed_gumbel_like(x, generator):
    u = _Feed.uniforms.pop(0)
    return -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))   # as wtc.dt.selection.gumbel_like


def _fed_gumbel_hash(seed, shape, device=None, dtype=torch.float32, native=None):
    return _Feed.noise.pop(0).to(dtype)


@contextlib.contextmanager
def _traceable(model):
    """Within the block, the forward's graph breaks are gone (see the module docstring)."""
    fixed = {op: choose(op, model.W_out) for op in ("dt.route", "dt.mlp_bank", "dt.route_hard")}
    fixed_choose = lambda op, where, **kw: fixed[op]  # noqa: E731
    patches = [(selection_mod, "gumbel_like", _fed_gumbel_like), (attention_mod, "draw_seed", lambda g: 0),
               (attention_mod, "gumbel_hash", _fed_gumbel_hash), (attention_mod, "choose", fixed_choose),
               (submlp_mod, "choose", fixed_choose)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    selector_frozen = selection_mod.Selector.frozen
    frozen = model._buffers.pop("frozen")
    try:
        for mod, name, fn in patches:
            setattr(mod, name, fn)
        selection_mod.Selector.frozen = property(lambda self: False)
        object.__setattr__(model, "frozen", False)
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
        selection_mod.Selector.frozen = selector_frozen
        model.__dict__.pop("frozen", None)
        model._buffers["frozen"] = frozen


def traceable_forward(run: Attempt, *, compile_mode: str | None = "default") -> None:
    """Replace run.model.forward by the traceable forward, compiled (fullgraph, dynamic=False) unless
    compile_mode is None (then it runs eagerly: the check that the patches change nothing)."""
    model = run.model
    if bool(model.frozen):
        raise ValueError("traceable_forward is for training steps (the model is frozen)")
    inner = model.forward
    fn = inner if compile_mode is None else torch.compile(inner, mode=compile_mode, dynamic=False, fullgraph=True)

    def forward(x, sampling=selection_mod.EVAL, *, track_ranges=False):
        _pre_draw(model, sampling, x.shape[0])
        sampling = dataclasses.replace(sampling, tau=torch.tensor(float(sampling.tau)))
        with _traceable(model):
            return fn(x, sampling, track_ranges=track_ranges)

    model.forward = forward


# ---------------------------------------------------------------------- timing
def time_rounds(variants: dict, rounds: int, steps: int) -> dict:
    """variants {name: (attempt, threads)} -> {name: [per-round mean step seconds]}, interleaved."""
    out = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (run, threads) in variants.items():
            with torch_threads(threads):
                run.train_step()                          # warm-up after the other variants ran
                t0 = time.perf_counter()
                for _ in range(steps):
                    run.train_step()
                out[name].append((time.perf_counter() - t0) / steps)
    return out


def first_steps(run: Attempt, n: int) -> list[float]:
    """Seconds of each of the next n steps (the first ones of a compiled run include compiling)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run.train_step()
        times.append(time.perf_counter() - t0)
    return times


def med(xs) -> float:
    return float(statistics.median(xs))


# ---------------------------------------------------------------------- profile
def profile_steps(run: Attempt, n: int = 10) -> dict:
    """Per-op breakdown of n steps (1 thread): top ops, ops per step, phase shares, bytes allocated."""
    from torch.profiler import ProfilerActivity, profile, record_function

    forward, tensors, optimizer_step = run.model.forward, run._tensors, run.optimizer.step
    task = run.task

    class TimedTask:   # run.task with a named range around batch(); everything else passes through
        def __getattr__(self, name):
            return getattr(task, name)

        def batch(self, *a, **k):
            with record_function("bench::data"):
                return task.batch(*a, **k)

    def timed(fn, label):
        def wrapper(*a, **k):
            with record_function(label):
                return fn(*a, **k)
        return wrapper

    run.model.forward, run._tensors, run.task = timed(forward, "bench::forward"), timed(tensors, "bench::data"), TimedTask()
    run.optimizer.step = timed(optimizer_step, "bench::optimizer")
    modules = [(m, kind) for b in run.model.blocks for m, kind in ((b.attn, "attention"), (b.mlp, "sub-MLPs")) if m is not None]
    for m, kind in modules:
        m.forward = timed(m.forward, f"bench::forward.{kind}")
    try:
        with torch_threads(1):
            run.train_step()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                t0 = time.perf_counter()
                for _ in range(n):
                    run.train_step()
                wall = (time.perf_counter() - t0) / n
    finally:
        run.model.forward, run._tensors, run.task = forward, tensors, task
        del run.optimizer.step   # the class's step again
        for m, _ in modules:
            del m.forward
    events = prof.events()
    total = wall * n * 1e6                                     # us of the profiled steps
    top = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)
    top = [a for a in top if not a.key.startswith("bench::")][:15]

    def is_aten(e):
        return e.name.startswith("aten::")

    def aten_parent(e):
        p = e.cpu_parent
        while p is not None:
            if is_aten(p):
                return True
            p = p.cpu_parent
        return False

    aten = [e for e in events if is_aten(e)]
    top_level = sum(1 for e in aten if not aten_parent(e))
    leaves = sum(1 for e in aten if not any(is_aten(c) for c in e.cpu_children))
    spans, within_forward = Counter(), Counter()
    for e in events:
        if e.name.startswith("bench::forward."):
            within_forward[e.name[len("bench::forward."):]] += e.cpu_time_total
        elif e.name.startswith("bench::") and not any(p.name.startswith("bench::") for p in _ancestors(e)):
            spans[e.name[len("bench::"):]] += e.cpu_time_total
        elif e.name.startswith("autograd::engine::evaluate_function") and e.cpu_parent is None:
            spans["backward"] += e.cpu_time_total
    shares = {k: round(v / total, 3) for k, v in spans.items()}
    shares["other"] = round(1 - sum(shares.values()), 3)
    allocated = sum(e.cpu_memory_usage for e in events if e.cpu_memory_usage > 0 and is_aten(e)
                    and not any(is_aten(c) for c in e.cpu_children))
    return {
        "steps": n, "profiled_step_ms": round(wall * 1e3, 2),
        "top_ops": [{"op": a.key, "self_ms_per_step": round(a.self_cpu_time_total / 1e3 / n, 3),
                     "share": round(a.self_cpu_time_total / total, 3), "calls_per_step": round(a.count / n, 1)}
                    for a in top],
        "aten_calls_per_step": round(top_level / n, 1), "leaf_ops_per_step": round(leaves / n, 1),
        "shares": shares, "forward_shares": {k: round(v / total, 3) for k, v in within_forward.items()},
        "allocated_MB_per_step": round(allocated / n / 2**20, 1),
    }


def _ancestors(e):
    p = e.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent


# ---------------------------------------------------------------------- FLOPs and bytes
def analytic_flops(model, B: int, phase: str) -> dict:
    """Forward FLOPs of one step from the shapes (a multiply-add = 2), and fwd + bwd ~ 3x forward.

    Per layer with V stream variables when the module runs (R replicas, B batch, T positions,
    P pads, L = P + T keys, H pointer heads, A aggregate heads, N PLE bins, M sub-MLPs, k inputs,
    h hidden units, O outputs):
      selection reads   2 R B V (H T + 2 H L + A T)         (soft one-hot mixtures: einsum over V)
      unit scaling      2 R B L V
      PLE               3 R B H (T + L) N
      query projection  2 R B H T N^2
      content scores    2 R B H T L N
      score elementwise 12 R B H T L (positional terms, scale, mask, noise, softmax)
      routing           2 R B H T L          redundancy (anneal, H > 1)  2 R B H^2 T L
      sub-MLPs          2 R B T M (V k + h k + h + k) [+ 2 R B T M h^2 at depth 2] + 5 R B T M h
      head              2 R B T V_final O
    """
    R, T, P = model.R, model.seq_len, model.P
    L = P + T
    terms = Counter()
    V = model.n_fixed
    for block in model.blocks:
        a = block.attn
        if a is not None:
            H, A, N = a.H, a.A, a.W.shape[-1]
            terms["selection reads"] += 2 * R * B * V * (H * T + 2 * H * L + A * T)
            terms["unit scaling"] += 2 * R * B * L * V
            terms["PLE"] += 3 * R * B * H * (T + L) * N
            terms["query projection"] += 2 * R * B * H * T * N * N
            terms["content scores"] += 2 * R * B * H * T * L * N
            terms["score elementwise + softmax"] += 12 * R * B * H * T * L
            terms["routing"] += 2 * R * B * H * T * L
            if phase == "anneal" and H > 1:
                terms["redundancy"] += 2 * R * B * H * H * T * L
            V += H + A
        m = block.mlp
        if m is not None:
            M, k, h = m.M, m.k, m.W1.shape[2]
            terms["sub-MLPs"] += 2 * R * B * T * M * (V * k + h * k + h + k) + 5 * R * B * T * M * h
            if m.depth == 2:
                terms["sub-MLPs"] += 2 * R * B * T * M * h * h + 5 * R * B * T * M * h
            V += M
    terms["head"] += 2 * R * B * T * V * model.n_outputs
    forward = sum(terms.values())
    return {"forward_MFLOP": round(forward / 1e6, 2), "step_MFLOP_3x": round(3 * forward / 1e6, 2),
            "terms_MFLOP": {k: round(v / 1e6, 2) for k, v in terms.most_common()}}


def counted_matmul_flops(run: Attempt) -> float:
    """MFLOP of the matmul-type ops (mm, bmm, einsum's contractions) of one step, forward and
    backward, as torch.utils.flop_counter counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch_threads(1), FlopCounterMode(display=False) as counter:
        run.train_step()
    return round(counter.get_total_flops() / 1e6, 2)


def fused_bytes(run: Attempt, B: int) -> dict:
    """Bytes a fused step must touch at least: parameters read, gradients and AdamW's two moments
    read and written, parameters written (7 passes over the parameters), one batch of inputs,
    targets and masks; against the size of one (R, B, H, T, L) score tensor of layer 0."""
    n_params = sum(p.numel() for p in run.model.parameters())
    task, m = run.task, run.model
    batch = B * task.seq_len * (task.n_inputs + 2 * task.n_outputs)
    a = next((b.attn for b in m.blocks if b.attn is not None and b.attn.H), None)
    score = m.R * B * a.H * m.seq_len * (m.P + m.seq_len) if a is not None else 0
    return {"parameters": n_params, "fused_min_MB": round((7 * n_params + batch) * 4 / 2**20, 3),
            "score_tensor_MB": round(score * 4 / 2**20, 2)}


# ---------------------------------------------------------------------- torch.compile
class _BreakLog(logging.Handler):
    """Collects dynamo's graph-break log records as (source line, reason)."""

    def __init__(self):
        super().__init__()
        self.breaks = Counter()

    def emit(self, record):
        msg = record.getMessage()
        where = re.search(r"Graph break in user code at (\S+)", msg)
        if not where:
            return
        lines = [s.strip() for s in msg.splitlines()[2:] if s.strip()]
        reason = next((s for s in lines if not s.startswith(("Graph Break Reason", "Encountered", "Failed to handle"))), "?")
        self.breaks[(where.group(1).replace(os.getcwd() + "/", ""), reason[:100])] += 1


@contextlib.contextmanager
def _captured(handler, logger_name: str):
    """Send what a torch logger emits to `handler` only (not to the console)."""
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


@contextlib.contextmanager
def _artifacts(**artifacts):
    """torch._logging artifacts on (set_logs replaces the whole setting: call it once)."""
    torch._logging.set_logs(**artifacts)
    try:
        yield
    finally:
        torch._logging.set_logs()


def graph_break_log():
    return _captured(_BreakLog(), "torch._dynamo.symbolic_convert.__graph_breaks")


class _LimitLog(logging.Handler):
    """Counts dynamo's 'hit config.recompile_limit' warnings (that frame runs eagerly from then on)."""

    def __init__(self):
        super().__init__()
        self.hits = 0

    def emit(self, record):
        self.hits += "recompile_limit" in record.getMessage()


def dynamo_stats() -> dict:
    """Graphs compiled since the last _fresh_dynamo()."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": counters["stats"].get("unique_graphs", 0)}


def _fresh_dynamo() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


@contextlib.contextmanager
def _quiet():
    """Dynamo's console warnings about the breaks (collected by graph_break_log instead)."""
    import warnings

    logger = logging.getLogger("torch._dynamo.variables.tensor")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def compile_as_is(task, config: DTConfig, rounds: int, steps: int) -> dict:
    """torch.compile(model.forward, dynamic=False) without help, per phase: the graph breaks with
    their source lines, the recompiles and their guards, the first steps and the steady state."""
    res = {}
    for phase in ("anneal", "hard"):
        _fresh_dynamo()
        eager, run = make_attempt(task, config, phase), make_attempt(task, config, phase)
        run.model.forward = torch.compile(run.model.forward, dynamic=False)
        with tempfile.TemporaryDirectory(prefix="dt_step_inductor_") as cache, _env("TORCHINDUCTOR_CACHE_DIR", cache), \
                torch_threads(1), _artifacts(graph_breaks=True, recompiles=True), graph_break_log() as log, \
                _recompile_log() as recompiles, _captured(_LimitLog(), "torch._dynamo.convert_frame") as limit, _quiet():
            firsts = first_steps(run, 12)
            times = time_rounds({"eager": (eager, 1), "compiled": (run, 1)}, rounds, steps)
        e, c = med(times["eager"]), med(times["compiled"])
        res[phase] = {"first_12_steps_s": [round(t, 2) for t in firsts], "eager_ms": round(e * 1e3, 2),
                      "compiled_ms": round(c * 1e3, 2), "speedup": round(e / c, 3),
                      "graph_breaks": [{"where": w, "reason": r, "count": n} for (w, r), n in log.breaks.most_common()],
                      "recompiles": sum(recompiles.reasons.values()),
                      "recompile_guards": recompiles.reasons.most_common(6),
                      "recompile_limit_hits": limit.hits, **dynamo_stats()}
    return res


class _RecompileLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.reasons = Counter()

    def emit(self, record):
        for m in re.finditer(r"- \d+/\d+: (.+?)\s{2,}#", record.getMessage()):
            guard = re.sub(r"== \S+$", "== <value>", m.group(1).strip())
            self.reasons[guard] += 1


def _recompile_log():
    return _captured(_RecompileLog(), "torch._dynamo.guards.__recompiles")


def grad_diff(a: Attempt, b: Attempt) -> dict:
    """Max abs (and max relative-to-largest) difference of every parameter gradient."""
    worst, scale = 0.0, 0.0
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        if pa.grad is None and pb.grad is None:
            continue
        worst = max(worst, (pa.grad - pb.grad).abs().max().item())
        scale = max(scale, pa.grad.abs().max().item())
    return {"max_abs": worst, "max_rel": worst / scale if scale else 0.0}


def compile_traceable(task, config: DTConfig, mode: str, rounds: int, steps: int) -> dict:
    """The traceable forward compiled in `mode`, per phase: cold compile (a new process, empty
    inductor cache), warm compile (another new process on that cache: what a later attempt's
    worker pays), then in this process (cache hit) the step time interleaved with eager, the
    graphs, recompiles and the gradients against eager from the same state."""
    res = {"mode": mode}
    attempt_steps = {"anneal": config.steps, "hard": config.hard_steps}
    with tempfile.TemporaryDirectory(prefix="dt_step_inductor_") as cache, _env("TORCHINDUCTOR_CACHE_DIR", cache), \
            torch_threads(1), _artifacts(recompiles=True):
        for phase in ("anneal", "hard"):
            cold, cold_counts = _probe(task, config, phase, mode, cache)
            warm, warm_counts = _probe(task, config, phase, mode, cache)
            _fresh_dynamo()
            with _recompile_log() as recompiles:
                run = make_attempt(task, config, phase)
                traceable_forward(run, compile_mode=mode)
                first_steps(run, 2)                        # the logging step's graph, then the other one
                eager = make_attempt(task, config, phase)
                times = time_rounds({"eager": (eager, 1), "compiled": (run, 1)}, rounds, steps)
                graphs = dynamo_stats()
                # gradients of one step from the same state: compiled, eager, patched but eager
                ref, again, patched = (make_attempt(task, config, phase) for _ in range(3))
                traceable_forward(again, compile_mode=mode)
                traceable_forward(patched, compile_mode=None)
                for r in (again, ref, patched):
                    r.train_step()
                grads, patched_grads = grad_diff(again, ref), grad_diff(patched, ref)["max_abs"]
            e, c = med(times["eager"]), med(times["compiled"])
            res[phase] = {"eager_ms": round(e * 1e3, 2), "compiled_ms": round(c * 1e3, 2), "speedup": round(e / c, 3),
                          "compile_cold_s": round(cold - 2 * c, 1), "compile_warm_s": round(warm - 2 * c, 1),
                          "cache_cold": cold_counts, "cache_warm": warm_counts,
                          "grad_diff": grads, "patched_eager_grad_diff": patched_grads,
                          "recompiles": sum(recompiles.reasons.values()),
                          "recompile_guards": recompiles.reasons.most_common(4),
                          "saved_per_attempt_s": round(attempt_steps[phase] * (e - c), 1), **graphs}
    saved = sum(res[p]["saved_per_attempt_s"] for p in ("anneal", "hard"))
    for kind in ("cold", "warm"):
        paid = sum(res[p][f"compile_{kind}_s"] for p in ("anneal", "hard"))
        res[f"compile_{kind}_s"] = round(paid, 1)
        res[f"net_saved_per_attempt_{kind}_s"] = round(saved - paid, 1)
    return res


def _probe(task, config: DTConfig, phase: str, mode: str, cache: str) -> tuple[float, dict]:
    """(seconds of the first two compiled steps, inductor / AOT cache counters) in a new process
    on the inductor cache directory `cache` (1 thread)."""
    import subprocess

    spec = json.dumps({"task": task.name, "rung_config": config.to_dict(), "phase": phase, "mode": mode})
    out = subprocess.run([sys.executable, __file__, "--probe", spec], capture_output=True, text=True,
                         env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["seconds"], result["cache"]


def probe_main(spec: str) -> None:
    from torch._dynamo.utils import counters

    spec = json.loads(spec)
    task = running_sum_t20() if spec["task"] == "running_sum_t20" else wtc.tasks.get(spec["task"])
    with torch_threads(1):
        run = make_attempt(task, DTConfig.from_dict(spec["rung_config"]), spec["phase"])
        traceable_forward(run, compile_mode=spec["mode"])
        seconds = sum(first_steps(run, 2))
    keys = ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit", "autograd_cache_miss")
    found = {k: n for group in ("inductor", "aot_autograd") for k, n in counters[group].items() if k in keys}
    print(json.dumps({"seconds": seconds, "cache": found}))


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# ---------------------------------------------------------------------- before vs now, side by side
VERSUS_OUT = RESULTS / "dt_step_versus.json"


def versus_worker() -> None:
    """Internal (--versus-worker): hold one attempt per (task, rung, phase) and answer stdin lines
    'task rung phase steps' with the mean seconds of that many steps (after one warm-up step)."""
    torch.set_num_threads(1)
    runs = {}
    from wtc import _native
    print("ready", os.path.dirname(os.path.abspath(wtc.__file__)), _native.cpu_module() is not None, flush=True)
    for line in sys.stdin:
        task_name, rung, phase, steps = line.split()
        if phase == "whole":   # a fresh attempt trained through all its steps: the mean step, late anneal included
            task = running_sum_t20() if task_name == "running_sum_t20" else wtc.tasks.get(task_name)
            run = Attempt(task, DTConfig().rung(int(rung))[1], seed=0, attempt=0)
            n, t0 = 0, time.perf_counter()
            while run.phase in ("anneal", "hard"):
                run.train_step()
                n += 1
            print((time.perf_counter() - t0) / n, flush=True)
            continue
        key = (task_name, int(rung), phase)
        if key not in runs:
            task = running_sum_t20() if task_name == "running_sum_t20" else wtc.tasks.get(task_name)
            runs[key] = make_attempt(task, DTConfig().rung(int(rung))[1], phase)
        run = runs[key]
        run.train_step()
        t0 = time.perf_counter()
        for _ in range(int(steps)):
            run.train_step()
        print((time.perf_counter() - t0) / int(steps), flush=True)


def _baseline_tree(rev: str, where: str) -> str:
    """The package as it was at git revision `rev` in a temporary directory (the worker runs this
    file with that copy first on sys.path), with this checkout's
    built wtc._C copied in (native code only gains functions, so the old Python finds what it calls)."""
    import shutil
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", root, "archive", rev, "wtc", "bench"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
    from wtc import _native
    mod = _native.cpu_module()
    if mod is not None:
        shutil.copy(mod.__file__, os.path.join(where, "wtc"))
    return where


def versus(rev: str, cases: list[tuple[str, int]], rounds: int, steps: int, out: str,
           phases: tuple[str, ...] = ("anneal", "hard")) -> dict:
    """Step time of `rev` (a git revision, run from a temporary copy), this checkout with
    WTC_KERNELS=reference (the torch path) and this checkout as it chooses, one worker process
    each (1 thread), interleaved round by round; medians of the per-round means. Phase "whole":
    the mean step of a fresh attempt trained through all its steps (one attempt per round)."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        old = _baseline_tree(rev, tmp)
        import wtc as this
        now = os.path.dirname(os.path.dirname(os.path.abspath(this.__file__)))
        variants = {f"before ({rev})": (old, {}), "now, reference": (now, {"WTC_KERNELS": "reference"}),
                    "now": (now, {})}
        procs = {}
        for name, (tree, extra) in variants.items():
            env = {k: v for k, v in os.environ.items() if k != "WTC_KERNELS"}
            env.update(OMP_NUM_THREADS="1", **extra)
            script = [os.path.abspath(__file__), "--versus-worker"]
            if tree == old:   # an editable install's import redirect would win over PYTHONPATH: drop it
                env["PYTHONPATH"] = old
                script = ["-c", "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' "
                          "not in type(f).__module__]; sys.argv = [sys.argv[1], '--versus-worker']; "
                          "runpy.run_path(sys.argv[0], run_name='__main__')", os.path.abspath(__file__)]
            procs[name] = subprocess.Popen([sys.executable, *script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True, env=env, cwd=here)
            ready = procs[name].stdout.readline().split()
            if ready[:1] != ["ready"] or ready[1] != os.path.join(tree, "wtc") or ready[2] != "True":
                raise RuntimeError(f"{name}: the worker imported wtc from {ready[1:2]} (native: {ready[2:]}), "
                                   f"expected {tree} with wtc._C")
        report = {"date": stamp(), "machine": machine(), "torch": torch.__version__, "baseline": rev,
                  "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "rounds": rounds,
                  "steps_per_round": steps, "threads": 1, "cases": []}
        try:
            for task_name, rung in cases:
                for phase in phases:
                    times = {name: [] for name in procs}
                    for _ in range(rounds):
                        for name, proc in procs.items():
                            proc.stdin.write(f"{task_name} {rung} {phase} {steps}\n")
                            proc.stdin.flush()
                            times[name].append(float(proc.stdout.readline()))
                    ms = {name: round(med(t) * 1e3, 2) for name, t in times.items()}
                    base = ms[f"before ({rev})"]
                    row = {"task": task_name, "rung": rung, "phase": phase, "ms": ms,
                           "speedup_vs_before": {name: round(base / v, 2) for name, v in ms.items()},
                           "rounds_ms": {name: [round(x * 1e3, 2) for x in t] for name, t in times.items()},
                           "load_avg": [round(x, 2) for x in os.getloadavg()]}
                    report["cases"].append(row)
                    print(f"| {task_name} | {rung} | {phase} | " + " | ".join(f"{v:.1f}" for v in ms.values())
                          + f" | {base / ms['now']:.2f} |", flush=True)
        finally:
            for proc in procs.values():
                proc.stdin.close()
                proc.wait()
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    return report


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps per variant per round")
    ap.add_argument("--compile-cases", choices=["first", "default", "all", "none"], default=None,
                    help="first: the first case; default: rung 0 of each task; all; none")
    ap.add_argument("--modes", default="default", help="inductor modes, comma-separated (extra ones: first case)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--probe", help=argparse.SUPPRESS)   # internal: one compile in a new process (_probe)
    ap.add_argument("--versus", metavar="REV", help="only: step time of git revision REV vs now, side by side")
    ap.add_argument("--versus-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--whole", action="store_true", help="with --versus: whole attempts (every step, late anneal included)")
    args = ap.parse_args()
    if args.probe:
        return probe_main(args.probe)
    if args.versus_worker:
        return versus_worker()
    if args.versus:
        cases = [("parity_last2", 0)] if args.quick else [("parity_last2", r) for r in (0, 1, 2, 3)] + [("running_sum_t20", 0)]
        print(f"| task | rung | phase | before ({args.versus}) ms | now, reference ms | now ms | speedup |")
        print("|---|---|---|---|---|---|---|")
        versus(args.versus, cases, args.rounds or (1 if args.whole else 5), args.steps or 10,
               args.out if args.out != str(OUT) else str(VERSUS_OUT),
               phases=("whole",) if args.whole else ("anneal", "hard"))
        return print(f"wrote {args.out if args.out != str(OUT) else VERSUS_OUT}")
    rounds = args.rounds or (3 if args.quick else 5)
    steps = args.steps or (5 if args.quick else 10)
    compile_cases = args.compile_cases or ("first" if args.quick else "default")
    tasks = [wtc.tasks.get("parity_last2")] + ([] if args.quick else [running_sum_t20()])
    rungs = (0, 1) if args.quick else (0, 1, 2, 3)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    load = os.getloadavg()
    report = {"date": stamp(), "machine": machine(), "torch": torch.__version__, "cores": os.cpu_count(),
              "load_avg_at_start": [round(x, 2) for x in load], "rounds": rounds, "steps_per_round": steps,
              "note": "shared machine: compare ratios within a run, not absolute times across runs",
              "cases": []}
    first = True
    for task in tasks:
        for i in rungs:
            label, config = DTConfig().rung(i)
            case = {"task": task.name, "seq_len": task.seq_len, "rung": i, "rung_label": label,
                    "load_avg": [round(x, 2) for x in os.getloadavg()]}
            print(f"## {task.name} (T={task.seq_len}), rung {i}: {label}", flush=True)
            for phase in ("anneal", "hard"):
                run = make_attempt(task, config, phase)
                t = time_rounds({"1 thread": (run, 1), "2 threads": (run, 2)}, rounds, steps)
                one, two = med(t["1 thread"]), med(t["2 threads"])
                case[phase] = {"eager_1t_ms": round(one * 1e3, 2), "eager_2t_ms": round(two * 1e3, 2),
                               "2t_speedup": round(one / two, 3),
                               "rounds_1t_ms": [round(x * 1e3, 2) for x in t["1 thread"]],
                               "rounds_2t_ms": [round(x * 1e3, 2) for x in t["2 threads"]]}
                print(f"  eager {phase}: 1 thread {one * 1e3:.1f} ms, 2 threads {two * 1e3:.1f} ms", flush=True)
            run = make_attempt(task, config, "anneal")
            case["profile"] = profile_steps(run)
            B = config.batch_size
            case["flops"] = {"anneal": analytic_flops(run.model, B, "anneal"),
                             "hard": analytic_flops(run.model, B, "hard"),
                             "counted_matmul_MFLOP_anneal": counted_matmul_flops(make_attempt(task, config, "anneal")),
                             "counted_matmul_MFLOP_hard": counted_matmul_flops(make_attempt(task, config, "hard"))}
            case["bytes"] = fused_bytes(run, B)
            do_compile = (compile_cases == "all" or (compile_cases == "default" and i == 0)
                          or (compile_cases == "first" and first))
            if do_compile:
                if first:
                    print("  torch.compile as is ...", flush=True)
                    case["compile_as_is"] = compile_as_is(task, config, rounds, steps)
                case["compile"] = []
                for mode in (modes if first else modes[:1]):
                    print(f"  torch.compile traceable, mode={mode} ...", flush=True)
                    try:
                        case["compile"].append(compile_traceable(task, config, mode, rounds, steps))
                    except Exception as exc:   # report a mode that does not work here, keep going
                        case["compile"].append({"mode": mode, "error": f"{type(exc).__name__}: {exc}"[:300]})
            report["cases"].append(case)
            first = False
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:   # after every case: a partial run still leaves its numbers
                json.dump(report, f, indent=1)
    print_tables(report)
    print(f"wrote {args.out}")


def print_tables(report: dict) -> None:
    print(f"\nDT training step, {report['machine']}, torch {report['torch']}, load average at start "
          f"{report['load_avg_at_start']} (shared machine; median of {report['rounds']} interleaved rounds)\n")
    print("| task | rung | phase | eager 1t ms | eager 2t ms | 2t speedup | compiled 1t ms | compile speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for c in report["cases"]:
        comp = next((x for x in c.get("compile", []) if "error" not in x), None)
        for phase in ("anneal", "hard"):
            p = c[phase]
            cm = f"{comp[phase]['compiled_ms']:.1f}" if comp else "-"
            cs = f"{comp[phase]['speedup']:.2f} (vs {comp[phase]['eager_ms']:.1f})" if comp else "-"
            print(f"| {c['task']} | {c['rung']} | {phase} | {p['eager_1t_ms']:.1f} | {p['eager_2t_ms']:.1f} | "
                  f"{p['2t_speedup']:.2f} | {cm} | {cs} |")
    print("\n| task | rung | aten calls/step | leaf ops/step | alloc MB/step | fwd MFLOP (analytic) | "
          "counted matmul MFLOP fwd+bwd | fused min MB | shares |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in report["cases"]:
        p, f = c["profile"], c["flops"]
        shares = ", ".join(f"{k} {v:.0%}" for k, v in p["shares"].items())
        shares += " (forward: " + ", ".join(f"{k} {v:.0%}" for k, v in p["forward_shares"].items()) + ")"
        print(f"| {c['task']} | {c['rung']} | {p['aten_calls_per_step']:.0f} | {p['leaf_ops_per_step']:.0f} | "
              f"{p['allocated_MB_per_step']} | {f['anneal']['forward_MFLOP']} | {f['counted_matmul_MFLOP_anneal']} | "
              f"{c['bytes']['fused_min_MB']} | {shares} |")
    c = report["cases"][0]
    print(f"\nTop ops, {c['task']} rung {c['rung']}, anneal, 1 thread:\n")
    print("| op | self ms/step | share | calls/step |")
    print("|---|---|---|---|")
    for op in c["profile"]["top_ops"]:
        print(f"| {op['op']} | {op['self_ms_per_step']} | {op['share']:.1%} | {op['calls_per_step']} |")
    for c in report["cases"]:
        a = c.get("compile_as_is")
        if a:
            print(f"\ntorch.compile as is, {c['task']} rung {c['rung']} (model.forward, dynamic=False):\n")
            print("| phase | first 12 steps s | compiled ms | eager ms | speedup | graphs | recompiles | "
                  "recompile-limit hits |")
            print("|---|---|---|---|---|---|---|---|")
            for phase in ("anneal", "hard"):
                x = a[phase]
                print(f"| {phase} | {', '.join(f'{t:.1f}' for t in x['first_12_steps_s'])} | {x['compiled_ms']:.1f} | "
                      f"{x['eager_ms']:.1f} | {x['speedup']:.2f} | {x['unique_graphs']} | {x['recompiles']} | "
                      f"{x['recompile_limit_hits']} |")
            for phase in ("anneal", "hard"):
                for b in a[phase]["graph_breaks"]:
                    print(f"- {phase}: break x{b['count']} at {b['where']}: {b['reason']}")
                for guard, n in a[phase]["recompile_guards"]:
                    print(f"- {phase}: recompile x{n} on guard `{guard}`")
        comps = c.get("compile", [])
        if comps:
            print(f"\ntorch.compile traceable, {c['task']} rung {c['rung']} (fullgraph, dynamic=False, 1 thread):\n")
            print("| mode | phase | compiled ms | eager ms | speedup | compile cold s | compile warm s | "
                  "graphs | recompiles | grad max abs diff | saved s / attempt |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
        for comp in comps:
            if "error" in comp:
                print(f"| {comp['mode']} | - | {comp['error']} |")
                continue
            for phase in ("anneal", "hard"):
                x = comp[phase]
                print(f"| {comp['mode']} | {phase} | {x['compiled_ms']:.1f} | {x['eager_ms']:.1f} | {x['speedup']:.2f} | "
                      f"{x['compile_cold_s']} | {x['compile_warm_s']} | {x['unique_graphs']} | "
                      f"{x['recompiles']} | {x['grad_diff']['max_abs']:.1e} | {x['saved_per_attempt_s']} |")
            print(f"| {comp['mode']} | net per attempt | | | | {comp['net_saved_per_attempt_cold_s']} (cold) | "
                  f"{comp['net_saved_per_attempt_warm_s']} (warm) | | | | |")

if __name__ == "__main__":
    main()

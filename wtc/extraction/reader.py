"""extract: read a frozen Discrete Transformer out as a Program.

1. Record every variable and pointer on fresh data (readout.read).
2. Live variables: walk back from the output head (contributions above noise), through what each
   live module reads.
3. In stream order: each live pointer head gets a routing rule (routing.fit_head) or is reported
   uninterpretable; aggregate heads are prefix means or sums; each live sub-MLP gets a formula from the
   symbolic regression engine (wtc.sr), with a tolerance derived from how much of its error the
   output can absorb. Downstream modules see the rule's / formula's values, not the network's.
4. The head becomes formulas (compose.snap_output); the program is assembled and returned. A
   module that could not be read is named in program.failures (program.ok is False).

Over 500 lines because the reading of every module kind and of the outputs shares one state (the
program values and names read so far); split, each part would take all of it as arguments.
"""
from __future__ import annotations

from wtc.errors import WtcError

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import sympy as sp

from wtc import arguments
from wtc import tasks as task_registry
from wtc.dt.config import EXTREME_OPS
from wtc.extraction.argmax import read_argmax
from wtc.extraction.compose import snap_output
from wtc.extraction.constants import number
from wtc.extraction.domain import Domain
from wtc.extraction.equivalence import immaterial_heads
from wtc.extraction.grid import grid_polynomial
from wtc.extraction.indicators import indicators_under_extremes
from wtc.extraction.formulas import (DECISION_SLACK, FEWER_TIME_LIMIT, MAX_SR_POINTS, MIN_DECISION_AGREEMENT,  # noqa: F401
                                      ExtractionError, ExtractionTimeout, formula as _formula, integral_formula,
                                      reading_deadline, sr_fit as _sr_fit, values_of)
from wtc.extraction.residues import residue_formula
from wtc.extraction.program import POSITION, Line, Program, build_source
from wtc.extraction.logic import shortest_rule
from wtc.extraction.position import position_table
from wtc.extraction.readout import head_weights, pad, read
from wtc.extraction.routing_rules import Rule, fit_head, routed, rule_keys
from wtc.extraction.steps import one_step
from wtc.extraction.weighted import describe as describe_weights, simple_number, weighted_prefix
from wtc.extraction.verification import agreement

if TYPE_CHECKING:                    # annotations only: the model class imports torch
    from wtc.dt.model import DiscreteTransformer
    from wtc.tasks.task import Task

LIVE_SHARE = 0.1            # live: moves an output by more than this share of the output tolerance
MAX_DEVIATION = 0.05        # program vs model output on the extraction data, relative rms
PROGRAM_IMMATERIAL_RATE = 0.5   # an unread head's best rule routes its value this often, at least, to be
                                # read as that rule by the whole program's decisions (_misses_the_program_absorbs)
RAW_READ_DEVIATION = 0.03     # ... or, failing that, read the raw output within this relative rms
MAX_VIA = 8                 # variables the sub-MLPs feeding an output may read together
MAX_FEWER = 4               # an integer output read over fewer of its variables: from at most this many
#                             (one or two of them; six cost ~18 s a reading and found nothing more; four:
#                             the parity of a dot product reads x0, x1, their product and its sum, and is
#                             whole only as the sum mod 2)
MAX_FEWER_THROUGH = 6       # ... or of at most this many where an unread sub-MLP stands between (Div_3: the
#                             output's weak linear terms on two means made the four no formula reads whole)
MAX_COUNTED_VALUES = 8      # an input counted value by value (wtc.extraction.argmax) takes at most this many
COUNTED_AGREEMENT = 0.99    # ... and the argmax of its counts keeps this share of the model's decisions
ALONE_TIME_LIMIT = 1.0      # seconds per sub-MLP read alone for the report (its formula is in the output: the program does not use it)


class ExtractionInputError(WtcError, ValueError):
    """extract() was given a model it cannot read for this task."""


@dataclass
class Reading:
    """What extraction concluded about one module (a row of the report)."""

    module: str
    kind: str
    name: str                 # program variable ('' when dead)
    reads: str
    finding: str              # rule or formula
    evidence: str             # agreement and its confidence bound, or SR error and R^2
    ok: bool
    live: bool = True


def _output_tolerance(task, y: np.ndarray) -> float:
    """Absolute error the program's output may carry and still score perfectly (with margin)."""
    if task.output == "integer":
        return 0.05
    return 1e-4 * float(np.sqrt(np.nanmean((1 + np.abs(y)) ** 2)))


REAL_WIDENING = (1.0, 3.0, 10.0, 30.0, 100.0)   # multiples of a real output's tolerance, tried in turn


def _real_widening(tol: float, model_out: np.ndarray, target: np.ndarray) -> tuple[float, ...]:
    """The multiples of tol to read a real output at: from the first that covers the network's own
    rms error against the task's target (a tighter tolerance passes only formulas that copy that
    error, and each failing regression runs the whole search: 4-5 s of free_fall_height's and
    nonlinear_combo's readings went to two of them); all of them when even the widest does not
    (the network computes something else, which the tighter ones may read)."""
    err = float(np.sqrt(np.mean((model_out - target) ** 2)))
    covering = tuple(w for w in REAL_WIDENING if w * tol >= err)
    return covering or REAL_WIDENING


def _unique_name(base: str, taken: set[str]) -> str:
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _route_name(rule, source: str, var: str) -> str:
    p = rule.params
    if rule.kind == "offset":
        return f"prev{p['d']}_{source}"
    if rule.kind == "absolute":
        return f"first_{source}" if p["p"] == 0 else f"at{p['p']}_{source}"
    if rule.kind == "switch":
        return f"{source}_by_{p['var']}"
    if rule.kind == "recent":
        return f"latest_{source}" if var == source else f"{source}_at_latest_{var}"
    if rule.kind == "compare":
        word = {">": "above", ">=": "atleast", "<": "below", "<=": "atmost"}[p["op"]]
        return f"{source}_at_latest_{var}_{word}_{p['query']}"
    span = "run" if p["w"] is None else str(p["w"])
    if p.get("end", 0):
        span = f"_before{span}"
    return f"{p['op']}{span}_{source}" if var == source else f"{source}_at_{p['op']}{span}_{var}"


def extract(model: DiscreteTransformer, task: Task | str, *, n: int = 2048, seed: int = 0,
            deadline: float | None = None, task_check: str = "error") -> Program:
    """Read `model` (a frozen single-replica DiscreteTransformer trained on `task`) as a Program.

    A model knows the task it was trained on (train_info: name and Task.fingerprint, kept by
    wtc.load too); `task` must be that one: another task (or one whose definition changed since)
    is an ExtractionInputError naming both, or with task_check="warn" a warning (the reading is
    then of a model of another function).

    `model` may also be your own torch module computing wtc.dt.layers.LinearReadout(DTLayers(x))
    (wtc.extraction.embedded: checked on the task's inputs; anything else it computes, such as
    your own head, is refused by name, since the program would ignore it).

    deadline (time.time() seconds, None: none): every symbolic regression gets at most the time
    left, and ExtractionTimeout (an ExtractionError) is raised once it has passed."""
    from wtc.dt.model import DiscreteTransformer

    task = task_registry.get(task)
    n, seed = arguments.positive_int(n, "n"), arguments.seed(seed)
    if not isinstance(model, DiscreteTransformer):
        from wtc.extraction.embedded import readable_model
        model = readable_model(model, task, ExtractionInputError)
    if task_check not in ("error", "warn"):
        raise ExtractionInputError(f"task_check must be 'error' or 'warn', got {task_check!r}")
    trained_on = (getattr(model, "train_info", None) or {}).get("task_sha256")
    if trained_on is not None and trained_on != task.fingerprint():
        message = (f"this model was trained on task {model.train_info.get('task')!r}, not on {task.name!r} "
                   f"(task fingerprints {trained_on[:12]} and {task.fingerprint()[:12]} differ): extract it with "
                   "the task it learned")
        if task_check == "error":
            raise ExtractionInputError(message)
        import warnings
        warnings.warn(message, stacklevel=2)
    if getattr(model, "R", 1) != 1:
        raise ExtractionInputError(f"extract() reads one model; this one holds {model.R} replicas (use model.replica(i))")
    if not bool(model.frozen):
        raise ExtractionInputError("extract() needs a frozen model (wtc.train returns one; or call model.freeze())")
    if (model.seq_len, model.n_inputs, model.n_outputs) != (task.seq_len, task.n_inputs, task.n_outputs):
        raise ExtractionInputError(f"model shape (seq_len, n_inputs, n_outputs) = {(model.seq_len, model.n_inputs, model.n_outputs)}"
                         f" does not match task {task.name!r}: {(task.seq_len, task.n_inputs, task.n_outputs)}")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float, np.number))
                                 or not np.isfinite(deadline)):
        raise ExtractionInputError(f"deadline must be None or a time.time() in seconds, got {deadline!r}")
    with reading_deadline(deadline):
        return _Extraction(model, task, n, seed).run()


class _Extraction:
    """State of one extraction: program values and names of every variable read so far."""

    def __init__(self, model, task, n: int, seed: int):
        self.model, self.task, self.n = model, task, n
        self.x, self.y_task = task.batch(np.random.default_rng([seed, 77]), n)
        self.ro = ro = read(model, self.x)
        self.P, self.T, self.names = ro.P, ro.T, ro.names
        self.W = head_weights(model)                                              # (V, O)
        self.tol_out = _output_tolerance(task, self.y_task)
        self.periods = tuple(getattr(getattr(model, "config", None), "mlp_periods", ()) or ())   # its residues
        # program values (n, P + T); model value = factor * program value where that is linear
        self.prog: dict[str, np.ndarray] = {}
        self.factor: dict[str, float | None] = {}
        self.pname: dict[str, str] = {}                                            # stream -> program name
        scale = model.x_scale.double().numpy()
        for i, nm in enumerate(model.input_names):
            self._set(nm, nm, pad(self.x[:, :, i], self.P), 1.0 / scale[i])
        positions = pad(np.tile(np.arange(self.T, dtype=float), (n, 1)), self.P)
        self._set("pos", POSITION, positions, 1.0 / max(self.T - 1, 1))
        self.taken = set(self.pname.values())
        self.lines: list[Line] = []
        self.readings: list[Reading] = []
        self.failures: list[tuple[str | None, str]] = []   # (program variable or None, why)
        self.unread: dict = {}     # program variable of a head that fits no rule -> (head, best rule, its values)
        self.unread_mlps: dict = {}                                                 # sub-MLP with no formula -> module
        self.exprs: dict[str, sp.Expr] = {}                                        # sub-MLP -> formula
        self.routes: dict[tuple, str] = {}                                         # (rule, source) -> name
        self.head_only = []                                                        # sub-MLPs read via outputs
        self.sums: dict[str, tuple[str, np.ndarray]] = {}                          # aggregate -> (source, sums)
        self.live = self._live()

    def _set(self, name: str, program_name: str, values: np.ndarray, factor: float | None) -> None:
        self.prog[name], self.pname[name], self.factor[name] = values, program_name, factor

    def _strength(self, name: str, o: int | None = None) -> float:
        """How much a variable moves an output (raw units, rms); the largest output when o is None."""
        w = np.abs(self.W[self.names.index(name)])
        w = w.max() if o is None else w[o]
        return float(w * np.sqrt(np.mean(self.ro.model_values(name)[:, self.P:] ** 2)))

    def _live(self) -> set[str]:
        """Variables that move an output by more than LIVE_SHARE of what the task notices, and what
        live modules read (q and k of content heads included)."""
        live = {nm for nm in self.names if self._strength(nm) > LIVE_SHARE * self.tol_out}
        for mod in reversed(self.ro.modules):
            if mod.name in live:
                slots = ["v"] if mod.kind != "mlp" else list(mod.reads)
                if mod.kind == "head" and mod.content:
                    slots += ["q", "k"]
                elif mod.kind == "head" and self._recent(mod):
                    slots += ["k"]
                live |= {mod.reads[s] for s in slots}
        return live

    # ------------------------------------------------------------------ modules
    def run(self) -> Program:
        for mod in self.ro.modules:
            if mod.name not in self.live:
                self.readings.append(Reading(mod.name, mod.kind, "", _reads(mod), "dead (no effect on the output)",
                                             "", True, live=False))
            elif mod.kind == "head":
                self._head(mod)
            elif mod.kind == "aggregate":
                self._aggregate(mod)
            elif any(mod.name in m.reads.values() for m in self.ro.modules if m.name in self.live):
                reading, expr = _read_mlp(mod, self.ro, self.prog, self.pname, rel_tol=1e-3, periods=self.periods)
                alt = None if reading.ok else self._as_sums(list(mod.reads.values()))
                if alt is not None:                     # read through the prefix sum instead
                    reading2, expr2 = _read_mlp(mod, self.ro, *alt, rel_tol=1e-3, periods=self.periods)
                    if reading2.ok:
                        self._keep_sums(list(mod.reads.values()), alt[1])
                        self._add_mlp(mod, expr2, reading2, *alt)
                        continue
                self._add_mlp(mod, expr, reading)        # an intermediate variable: its own line
            else:
                self.head_only.append(mod)               # read through the output formula
        outputs = [self._output(o) for o in range(self.task.n_outputs)]
        for mod in self.head_only:   # report each head-only sub-MLP alone too (its formula is in the output)
            if mod.name not in self.exprs:
                reading, _ = _read_mlp(mod, self.ro, self.prog, self.pname, rel_tol=1e-2,
                                       time_limit=ALONE_TIME_LIMIT, widen=(1.0,), periods=self.periods)
                reading.name, reading.finding = "(in output)", f"alone: {reading.finding}"
                self.readings.append(reading)
        return self._assemble(outputs)

    def _recent(self, mod) -> bool:
        """A recency head (wtc.dt.attention): it scores its key, never its query."""
        return bool(self.model.blocks[mod.layer].attn.recent[mod.index])

    def _head(self, mod) -> None:
        P, T = self.P, self.T
        src = mod.reads["v"]
        view = {self.pname[k]: v for k, v in self.prog.items()}
        fit = fit_head(mod.name, self.ro.pointers[mod.name], self.pname[src], view, P, T,
                       window_vars=[self.pname[mod.reads["k"]]] if mod.content or self._recent(mod) else [],
                       query_vars=[self.pname[mod.reads["q"]]] if mod.content else [])
        best = fit.rule or fit.candidates[0]
        if fit.rule is None:
            unread = (mod.name, f"{mod.name}: pointer fits no routing rule (best: {best.describe()}, "
                                f"agreement {best.rate:.4f})")
            keys = self.ro.pointers[mod.name]       # keep going with what the head really does
        elif fit.rule.near_ties is not None:
            keys = self.ro.pointers[mod.name]       # what reads this head fits what the model computes
        else:
            keys = rule_keys(fit.rule, view, P, T)
        key = (best.kind, repr(best.params), src)
        if fit.rule is not None and fit.rule.kind == "offset" and fit.rule.params["d"] == 0:
            name = self.pname[src]                  # reads the current position: no line
        elif fit.rule is not None and key in self.routes:
            name = self.routes[key]                 # another head routes the same
        else:
            var = best.params.get("var", self.pname[src])
            name = _unique_name(_route_name(best, self.pname[src], var), self.taken)
            self.lines.append(Line(name, "route", self.pname[src], best, comment=best.describe()))
            if fit.rule is not None:
                self.routes[key] = name
        self._set(mod.name, name, pad(routed(self.prog[src], keys, P), P), self.factor.get(src))
        if fit.rule is None:
            self.failures.append((name, unread[1]))
            self.unread[name] = (mod.name, best, pad(routed(self.prog[src], rule_keys(best, view, P, T), P), P))
        evidence = f"agreement {best.rate:.5f} (99% lower bound {best.lower_bound:.5f}, n={best.n})"
        snapped = [s for s in (getattr(self.model, "train_info", None) or {}).get("snaps", []) if s["head"] == mod.name]
        if snapped:   # set to its rule at the end of training (wtc.dt.snap), not learned to it
            evidence += f"; set after training to {snapped[0]['rule']} (it followed that on {snapped[0]['rate']:.3f})"
        reads = f"v={src}" + (f", q={mod.reads['q']}, k={mod.reads['k']}" if mod.content else
                              f", k={mod.reads['k']} (recency head)" if self._recent(mod) else "")
        self.readings.append(Reading(mod.name, "head", name, reads, best.describe(), evidence, fit.rule is not None))

    def _aggregate(self, mod) -> None:
        if mod.coefficients:
            return self._periodic(mod)
        if mod.op in EXTREME_OPS:
            return self._extreme(mod)
        src = mod.reads["v"]
        sums = np.cumsum(self.prog[src][:, self.P:], axis=1)
        op = mod.op                                          # "mean" | "sum" (DTConfig.agg_ops)
        key = (op, "", src)
        name = self.routes.get(key)
        if name is None:                          # another aggregate head may already read it
            name = self.routes[key] = _unique_name(f"{op}_{self.pname[src]}", self.taken)
            self.lines.append(Line(name, op, self.pname[src], comment=f"{op} over the prefix"))
        factor = self.factor.get(src)             # a sum head writes sum / T in model units
        if op == "sum" and factor is not None:
            factor /= self.T
        self._set(mod.name, name, pad(sums if op == "sum" else sums / np.arange(1, self.T + 1), self.P), factor)
        if op == "mean":
            self.sums[mod.name] = (src, pad(sums, self.P))   # its other reading
        self.readings.append(Reading(mod.name, "aggregate", name, f"v={src}", f"{op} over the prefix",
                                     "by construction", True))

    def _extreme(self, mod) -> None:
        """A prefix max / min head: the extreme of its value over positions 0..t (a head on an
        indicator: whether it held at some / every position so far)."""
        src, op = mod.reads["v"], mod.op
        key = (op, "", src)
        name = self.routes.get(key)
        if name is None:
            name = self.routes[key] = _unique_name(f"{op}run_{self.pname[src]}", self.taken)
            self.lines.append(Line(name, op, self.pname[src], comment=f"{op} over the prefix"))
        extreme = (np.maximum if op == "max" else np.minimum).accumulate(self.prog[src][:, self.P:], axis=1)
        factor = self.factor.get(src)             # max(c v) = c max(v) only for c > 0
        self._set(mod.name, name, pad(extreme, self.P), factor if factor is not None and factor > 0 else None)
        self.readings.append(Reading(mod.name, "aggregate", name, f"v={src}", f"{op} over the prefix",
                                     "by construction", True))

    def _periodic(self, mod) -> None:
        """A periodic aggregate (wtc.dt.periodic): its weighted prefix sum, coefficients written as
        integers or simple fractions where they are (wtc.extraction.weighted)."""
        src, coefficients = mod.reads["v"], [simple_number(c) for c in mod.coefficients]
        key = ("periodic", repr(coefficients), src)
        name = self.routes.get(key)
        if name is None:
            name = self.routes[key] = _unique_name(f"{mod.op}_{self.pname[src]}", self.taken)
            self.lines.append(Line(name, "periodic", self.pname[src], Rule("periodic", {"coefficients": coefficients}),
                                   comment=describe_weights(coefficients)))
        factor = self.factor.get(src)             # written as the sum / T in model units
        self._set(mod.name, name, pad(weighted_prefix(self.prog[src][:, self.P:], coefficients), self.P),
                  None if factor is None else factor / self.T)
        self.readings.append(Reading(mod.name, "aggregate", name, f"v={src}", describe_weights(coefficients),
                                     f"learned {[round(c, 4) for c in mod.coefficients]}", True))

    def _as_sums(self, leaves) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
        """prog and pname with every aggregate among leaves read as the sum over the prefix instead
        of the mean (a counter mod k is a function of the sum, not of the mean); None if none is."""
        aggregates = [v for v in leaves if v in self.sums]
        if not aggregates:
            return None
        prog, pname = dict(self.prog), dict(self.pname)
        for v in aggregates:
            src, sums = self.sums[v]
            prog[v] = sums
            pname[v] = self.routes.get(("sum", "", src)) or _unique_name(f"sum_{self.pname[src]}",
                                                                         self.taken | set(pname.values()))
        return prog, pname

    def _keep_sums(self, leaves, pname) -> None:
        """Adopt the sum reading of the aggregates among leaves: their program lines."""
        for v in leaves:
            if v in self.sums:
                src = self.sums[v][0]
                if ("sum", "", src) not in self.routes:
                    self.routes[("sum", "", src)] = pname[v]
                    self.taken.add(pname[v])
                    self.lines.append(Line(pname[v], "sum", self.pname[src], comment="sum over the prefix"))

    def _add_mlp(self, mod, expr: sp.Expr, reading: Reading, prog=None, pname=None) -> None:
        """A sub-MLP becomes a program line; downstream modules see its formula's values."""
        prog, pname = prog or self.prog, pname or self.pname
        self.exprs[mod.name] = expr
        name = _unique_name(f"m{len(self.exprs) - 1}", self.taken)
        inputs = _distinct_inputs(mod, pname)
        f = sp.lambdify([sp.Symbol(pname[v]) for v in inputs], expr, modules=["numpy"])
        with np.errstate(all="ignore"):
            out = f(*[prog[v][:, self.P:] for v in inputs])
        self._set(mod.name, name, pad(np.broadcast_to(np.asarray(out, dtype=float), (self.n, self.T)), self.P), 1.0)
        reading.name = name
        self.readings.append(reading)
        if not reading.ok:
            self.unread_mlps[mod.name] = mod
            self.failures.append((name, f"{mod.name}: no formula within tolerance ({reading.evidence})"))
        self.lines.append(Line(name, "expr", expr=expr, comment=reading.finding))

    # ------------------------------------------------------------------ outputs
    def _output(self, o: int) -> sp.Expr:
        """Output o as a formula: one regression over the variables it depends on when they are at
        most 3 (sub-MLPs and head read together); otherwise linear terms plus one regression over
        the sub-MLPs' inputs."""
        P, task = self.P, self.task
        keep = np.isfinite(self.y_task[:, :, o])
        # integer tasks: the model's decisions (rounded outputs) are what it computes; a network that
        # wobbles around x*y by 0.3 must not teach the regression the wobble
        target = (self.ro.y_model if task.output == "real" else np.round(self.ro.y_model))[:, :, o][keep]
        floor = 0.1 * self.tol_out
        direct = {}
        for nm in self.names:
            if nm in self.prog and nm in self.live and self._strength(nm, o) > floor:
                direct.setdefault(self.pname[nm], nm)
        via = {}
        for mod in self.head_only:
            if self._strength(mod.name, o) > floor:
                for v in mod.reads.values():
                    via.setdefault(self.pname[v], v)
        leaves = everything = sorted({**direct, **via}.values(), key=self.names.index)
        through = self._through_unread(leaves)
        absorbed = through != leaves          # some leaf is a sub-MLP with no formula: a reading through it fails
        if len(through) <= 3:
            leaves = through
        # a network is often less precise than the formula it approximates: widen the tolerance
        # (integer outputs: never past what rounding forgives); verification has the last word
        widen = (1.0, 3.0, 6.0) if task.output == "integer" else \
            _real_widening(self.tol_out, target, self.y_task[:, :, o][keep])
        table = position_table(np.broadcast_to(np.arange(self.T), keep.shape)[keep], target) \
            if task.output == "integer" else None
        if table is not None:
            expr = table.expr(sp.Symbol(POSITION))
            self.readings.append(Reading(f"output {o}", "head", "out", POSITION, str(expr), "the model's decisions "
                                         f"are a function of the position alone, of period {table.period}", True))
            return expr
        step = self._step_output(leaves, keep, target) or self._count_output(everything, keep, target, 1.0)
        if step is not None:
            expr, evidence, reads = step
            self.readings.append(Reading(f"output {o}", "head", "out", reads, str(expr), evidence, True))
            return expr
        if len(leaves) <= 3:
            X = np.stack([self.prog[v][:, P:][keep] for v in leaves], axis=1) if leaves else np.zeros((len(target), 0))
            names = tuple(self.pname[v] for v in leaves)
            expr, evidence, ok = _formula(X, target, names, self.tol_out, widen=widen,
                                          decisions=task.output == "integer", moduli=self.periods)
            if not ok and task.output == "integer" and leaves:
                # a network too imprecise to round right (max of three values through one sub-MLP):
                # read its raw output as a function, the simplest formula within a few percent
                raw = self.ro.y_model[:, :, o][keep]
                expr2, evidence2, ok2 = _formula(X, raw, names, self.tol_out, widen=(1.0, 3.0, 10.0, 30.0))
                f = sp.lambdify([sp.Symbol(nm) for nm in names], expr2, modules=["numpy"])
                with np.errstate(all="ignore"):
                    pred = np.broadcast_to(np.asarray(f(*X.T), dtype=float), raw.shape)
                ok2 = ok2 and np.sqrt(np.mean((pred - raw) ** 2)) <= RAW_READ_DEVIATION * np.sqrt(np.mean(raw**2))
                if ok2:
                    expr, evidence, ok = expr2, f"raw output: {evidence2} (decisions: {evidence})", True
            alt = None if ok else self._as_sums(leaves)
            if alt is not None:   # a counter mod k: a function of the prefix sum, not of the mean
                X3 = np.stack([alt[0][v][:, P:][keep] for v in leaves], axis=1)
                expr3, evidence3, ok3 = _formula(X3, target, tuple(alt[1][v] for v in leaves), self.tol_out,
                                                 widen=widen, decisions=task.output == "integer", moduli=self.periods)
                if ok3:
                    self._keep_sums(leaves, alt[1])
                    expr, evidence, ok = expr3, f"{evidence3} (aggregates read as prefix sums)", True
            reads = ", ".join(self.pname[v] for v in leaves)
        else:
            expr, evidence, ok = self._decomposed_output(o, direct, via, keep, target, widen)
            reads = "linear terms + " + ", ".join(via)
        counted = None if ok else self._count_output(everything, keep, target, COUNTED_AGREEMENT)
        if counted is not None:
            expr, evidence, reads = counted
            self.readings.append(Reading(f"output {o}", "head", "out", reads, str(expr), evidence, True))
            return expr
        fewer_of, most = (through, MAX_FEWER_THROUGH) if absorbed else (leaves, MAX_FEWER)
        if task.output == "integer" and 2 <= len(fewer_of) <= most and (
                absorbed or not self._integral(expr, ok, leaves, keep)):
            # through an unread sub-MLP the reading fails whatever else is found: worth a longer search
            fewer = self._fewer(fewer_of, keep, target, widen, FEWER_TIME_LIMIT * (3 if absorbed else 1))
            if fewer is not None:
                expr, evidence, ok = fewer[0], f"{fewer[1]} (not {expr}, over every variable read)", True
                reads = ", ".join(sorted(str(s) for s in expr.free_symbols))
        rule = self._rule_output(expr, ok, leaves, keep, target)
        if rule is not None:
            expr, evidence, ok = rule, f"the model's decisions are a rule of two-valued variables (not the formula " \
                                       f"{expr}, whose values are not its decisions)", True
        if (rule is None and task.output == "integer" and len(fewer_of) > most
                and 2 <= len(via) <= MAX_FEWER_THROUGH and not self._integral(expr, ok, leaves, keep)):
            # too many variables to search, but the output's sub-MLPs read few: what they read
            # (Dithering's sub-MLP of sum_x and x beside linear terms in t and an unread sub-MLP)
            fewer = self._fewer(sorted(via.values(), key=self.names.index), keep, target, widen,
                                FEWER_TIME_LIMIT * (3 if absorbed else 1))
            if fewer is not None:
                expr, evidence, ok = fewer[0], f"{fewer[1]} (not {expr}, over what its sub-MLPs read)", True
                reads = ", ".join(sorted(str(s) for s in expr.free_symbols))
        if not ok:
            self.failures.append((None, f"output {o}: no formula within tolerance ({evidence})"))
        self.readings.append(Reading(f"output {o}", "head", "out", reads, str(expr), evidence, ok))
        return expr

    def _count_output(self, leaves, keep, target, min_agreement: float) -> tuple[sp.Expr, str, str] | None:
        """An integer output read as the argmax of whole-number scores of the prefix counts of the
        discrete inputs that a prefix mean or sum under the output reads (wtc.extraction.argmax:
        a vote over prefix means), each input alone, then all of them together; keeping at least
        min_agreement of the model's decisions. Each count used gets two lines (the indicator,
        its prefix sum)."""
        if self.task.output != "integer":
            return None
        channels = self._counted_channels(leaves)
        columns = {}                                   # count name -> (input, value, prefix counts (n, T))
        for channel in channels:
            x, base = self.prog[channel][:, self.P:], self.pname[channel]
            for i, v in enumerate(np.unique(x)):
                label = f"{int(v)}".replace("-", "neg") if float(v).is_integer() else f"v{i}"
                name = _unique_name(f"n_{base}_{label}", self.taken | set(columns))
                columns[name] = (channel, v, np.cumsum(x == v, axis=1))
        groups = [[n for n, c in columns.items() if c[0] == channel] for channel in channels]
        for names in groups + ([list(columns)] if len(groups) > 1 else []):
            counts = np.stack([columns[n][2] for n in names], axis=-1)[keep]                 # (kept, K)
            reading = read_argmax(counts, target, tuple(names), min_agreement=min_agreement)
            if reading is None:
                continue
            used = [n for n in names if sp.Symbol(n) in reading.expr().free_symbols]
            for name in used:
                channel, v, _ = columns[name]
                base = self.pname[channel]
                flag = _unique_name(name.replace("n_", "is_", 1), self.taken)
                self.taken.add(name)
                self.lines.append(Line(flag, "expr", expr=sp.Piecewise((1, sp.Eq(sp.Symbol(base), number(v))), (0, True)),
                                       comment=f"1 where {base} = {number(v)}"))
                self.lines.append(Line(name, "sum", flag, comment=f"how often {base} = {number(v)} so far"))
            of = " and ".join(dict.fromkeys(self.pname[columns[n][0]] for n in names))
            evidence = f"the model's decisions as a function of the prefix counts of {of}: {reading.describe()}, " \
                       f"on {reading.agreement:.4f} of them"
            return reading.expr(), evidence, ", ".join(used)
        return None

    def _counted_channels(self, leaves) -> list[str]:
        """The inputs of at most MAX_COUNTED_VALUES values that a prefix mean or sum under the
        leaves reads (through any modules): what the model can have counted."""
        modules = {m.name: m for m in self.ro.modules}
        inputs, found = set(self.model.input_names), []
        todo, seen = [(v, False) for v in leaves], set()
        while todo:
            v, counted = todo.pop()
            if (v, counted) in seen:
                continue
            seen.add((v, counted))
            if v in inputs:
                if counted and v not in found and len(np.unique(self.prog[v][:, self.P:])) <= MAX_COUNTED_VALUES:
                    found.append(v)
            elif v in modules:
                mod = modules[v]
                below = counted or (mod.kind == "aggregate" and not mod.coefficients and mod.op in ("mean", "sum"))
                todo += [(u, below) for u in mod.reads.values()]
        return sorted(found, key=self.model.input_names.index)

    def _through_unread(self, leaves: list[str]) -> list[str]:
        """leaves with each sub-MLP that has no formula replaced by what it reads (again where that
        has none): the output read over those is what the network computes through it (the
        quotient bit of a division by 5, (x + s mod 5) mod 2 of the weighted sum s, where the
        sub-MLP between them, periodic in s, fit no formula of its own)."""
        out, todo = {}, list(leaves)
        while todo:
            v = todo.pop(0)
            if v in self.unread_mlps:
                todo += [u for u in self.unread_mlps[v].reads.values() if u not in todo]
            else:
                out.setdefault(self.pname[v], v)
        return sorted(out.values(), key=self.names.index)

    def _columns(self, leaves, keep) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The leaves' values by program name, aggregates also as prefix sums (a count mod k is a
        function of the sum, not of the mean) -> (columns, sum name -> aggregate)."""
        columns = {self.pname[v]: self.prog[v][:, self.P:][keep] for v in leaves}
        alt = self._as_sums(leaves)
        sums = {} if alt is None else {alt[1][v]: v for v in leaves if v in self.sums}
        columns.update({name: alt[0][v][:, self.P:][keep] for name, v in sums.items()})
        return columns, sums

    def _fewer(self, leaves, keep, target, widen, time_limit: float):
        """integral_formula over one or two of the leaves (and their sums); a sum it uses gets its line."""
        columns, sums = self._columns(leaves, keep)
        fewer = integral_formula(columns, target, self.tol_out, widen=widen, max_size=2, time_limit=time_limit,
                                 moduli=self.periods)
        if fewer is not None:
            used = {str(s) for s in fewer[0].free_symbols}
            self._keep_sums([v for name, v in sums.items() if name in used], {v: n for n, v in sums.items()})
        return fewer

    def _integral(self, expr, ok, leaves, keep) -> bool:
        """Whether a formula read over leaves (or their sums) gives whole numbers on the extraction data."""
        values = values_of(expr, self._columns(leaves, keep)[0], (int(keep.sum()),)) if ok else None
        return values is not None and bool(np.array_equal(values, np.round(values)))

    def _rule_output(self, expr, ok, leaves, keep, target) -> sp.Expr | None:
        """A two-valued output of two-valued variables as its shortest rule (wtc.extraction.logic),
        where the formula read failed or gives values other than the decisions it rounds to."""
        if self.task.output != "integer" or not leaves:
            return None
        columns = {self.pname[v]: self.prog[v][:, self.P:][keep] for v in leaves}
        if ok:
            values = values_of(expr, columns, target.shape)
            if values is None or np.array_equal(values, np.round(values)):
                return None                      # the formula's values are its decisions: keep it
        # a variable of many values the head also reads (t, weakly) is left out: the rule is refused
        # unless the decisions are a function of the two-valued ones alone
        rule = shortest_rule({n: v for n, v in columns.items() if len(np.unique(v)) <= 2}, target)
        return None if rule is None else rule.expr()

    def _step_output(self, leaves, keep, target) -> tuple[sp.Expr, str, str] | None:
        """A two-valued output that is one cut of one variable (wtc.extraction.steps): the variable
        the output reads, or what a chain of one-input sub-MLPs under it reads, where that is an
        input, a route or an aggregate (a sub-MLP's curve is not cut at a number of our choosing)."""
        if self.task.output != "integer" or len(leaves) != 1:
            return None
        by_name = {pn: k for k, pn in self.pname.items() if k in self.prog}
        lines = {ln.name: ln for ln in self.lines}
        v = leaves[0]
        for _ in range(len(lines) + 1):
            line = lines.get(self.pname[v])
            if line is None or line.kind != "expr":
                break
            inputs = [str(s) for s in line.expr.free_symbols]
            if len(inputs) != 1 or inputs[0] not in by_name:
                return None
            v = by_name[inputs[0]]
        values = self.prog[v][:, self.P:][keep]
        if len(np.unique(values)) <= 2:
            return None          # a two-valued variable: its decisions are an affine map, a formula says it
        step = one_step(values, target)
        if step is None:
            return None
        name = self.pname[v]
        return (step.expr(sp.Symbol(name)), f"the model's decisions are one step of {name}: "
                f"{step.describe(name)} (the simplest cut between the values decided each way)", name)

    def _decomposed_output(self, o, direct, via, keep, target, widen):
        """More than 3 variables: the head's direct terms are linear; the sub-MLPs' joint
        contribution is one regression over their inputs (at most MAX_VIA: wtc.sr reads a sum,
        maximum or minimum of all of them, or a threshold of the sum, at any count). Each Pareto candidate of that
        regression, plus the linear terms, is refit and snapped against the target; the simplest
        that scores within slack of the best candidate is kept (decisions for integer outputs)."""
        P = self.P
        if len(via) > MAX_VIA:
            return sp.Float(float(np.mean(target))), f"the sub-MLPs read {len(via)} variables (> {MAX_VIA})", False
        data = {p: self.prog[nm][:, P:][keep] for p, nm in {**direct, **via}.items()}
        binary = {sp.Symbol(k) for k, v in data.items() if set(np.unique(v)) <= {0.0, 1.0}}
        symbols = sorted((sp.Symbol(k) for k in data), key=lambda s: s.name)
        linear = sum((sp.Symbol(p) for p in direct), sp.Integer(0))
        shapes = [sp.Integer(0)]
        if via:
            contribution = sum(self.W[self.names.index(m.name), o] * self.ro.model_values(m.name)[:, P:]
                               for m in self.head_only)
            X = np.stack([self.prog[v][:, P:][keep] for v in via.values()], axis=1)
            c = np.asarray(contribution)[keep]
            if len(c) > MAX_SR_POINTS:      # a fixed subsample: 20480 points cost 12-17 s per fit at five inputs
                pick = np.random.default_rng(0).choice(len(c), MAX_SR_POINTS, replace=False)
                X, c = X[pick], c[pick]
            fit = _sr_fit(X, c, tuple(via), self.tol_out, widen)
            shapes = [row.expr for row in sorted(fit.candidates, key=lambda r: r.complexity)] or [fit.expr]
        integer = self.task.output == "integer"

        def score(pred):   # integer outputs: the model's decisions; real: closeness to its output
            return float(np.mean(np.round(pred) == target)) if integer else -float(np.sqrt(np.mean((pred - target) ** 2)))

        raw = self.ro.y_model[:, :, o][keep]

        def deviation(pred):   # relative rms distance from the model's raw output
            return float(np.sqrt(np.mean((pred - raw) ** 2)) / (np.sqrt(np.mean(raw**2)) + 1e-12))

        def scored_as(expr):   # (expr, score, deviation) on the extraction data
            f = sp.lambdify(symbols, expr, modules=["numpy"])
            with np.errstate(all="ignore"):
                pred = np.broadcast_to(np.asarray(f(*[data[s.name] for s in symbols]), dtype=float), target.shape)
            return expr, score(pred), deviation(pred)

        scored = [scored_as(snap_output(shape + linear, symbols, data, target, self.tol_out, binary, score=score,
                                        slack=DECISION_SLACK / 5 if integer else self.tol_out))
                  for shape in shapes[:12]]
        best = max(sc for _, sc, _ in scored)
        slack = DECISION_SLACK if integer else max(widen) * self.tol_out
        near = [(e, sc, dev) for e, sc, dev in scored if sc >= best - slack]
        if integer and len(symbols) <= MAX_VIA and not any(dev <= MAX_DEVIATION for _, _, dev in near):
            # nothing both rounds like the model and stays near its raw output (sub-MLPs that share
            # a vote among them): one formula of every input for the decisions themselves
            X = np.stack([data[s.name] for s in symbols], axis=1)
            expr, _, ok = _formula(X, target, tuple(s.name for s in symbols), self.tol_out, widen=widen,
                                   decisions=True)
            candidate = scored_as(expr) if ok else None
            if candidate is not None and candidate[1] >= best - slack:
                near.append(candidate)
        # of the readings that round like the model, one that is also close to its raw output (a
        # vote read as a threshold of the sum, not as a weighted sum that happens to round right)
        expr, score, dev = next((c for c in near if c[2] <= MAX_DEVIATION), near[0])
        if integer:
            evidence = f"linear terms + sub-MLPs; agrees with the model's decisions on {score:.4f}"
            if score >= MIN_DECISION_AGREEMENT:
                return expr, evidence, True
            # too imprecise to round right: accept the formula if it reads the raw output closely
            return expr, f"{evidence}; raw output within {dev:.3g} relative rms", dev <= RAW_READ_DEVIATION
        return expr, f"linear terms + sub-MLPs; rmse {-score:.3g}", -score <= max(widen) * self.tol_out

    def _immaterial_misses(self, kept: list[Line], outputs: list[sp.Expr]) -> list[str]:
        """Heads that fit no rule but whose best rule's misses change no output
        (wtc.extraction.equivalence): read as their rule, and their readings say why."""
        routes = {ln.name for ln in kept if ln.kind == "route"}
        plain = set(self.model.input_names) | routes | {POSITION}
        view = {self.pname[k]: v[:, self.P:] for k, v in self.prog.items() if self.pname.get(k) in plain}
        unread = {name: (head, rule, values[:, self.P:]) for name, (head, rule, values) in self.unread.items()
                  if name in routes}
        heads = immaterial_heads(self.task, outputs, view, unread)
        what = "decision" if self.task.output == "integer" else "value"
        self.readings = [dataclasses.replace(r, ok=True, evidence=f"{r.evidence}; its misses change no output's {what}")
                         if r.module in heads and r.kind == "head" else r for r in self.readings]
        return heads

    # ------------------------------------------------------------------ program
    def _assemble(self, outputs: list[sp.Expr]) -> Program:
        """Keep the lines the outputs need, build the program, check it against the model."""
        view = {self.pname[k]: v[:, self.P:] for k, v in self.prog.items() if k in self.pname}
        self.lines, outputs, notes = indicators_under_extremes(self.lines, outputs, view)
        self.readings += [Reading("indicator", "note", note.split(" = ")[0], "extraction data", note,
                                  "read as a formula of its decisions", True) for note in notes]
        needed = set().union(*[{s.name for s in e.free_symbols} for e in outputs])
        kept: list[Line] = []
        for line in reversed(self.lines):
            if line.name in needed:
                kept.append(line)
                needed |= {line.source} if line.source else set()
                if line.rule is not None and line.rule.kind in ("window", "switch", "recent", "compare"):
                    needed.add(line.rule.params["var"])
                    needed.add(line.rule.params.get("query", line.rule.params["var"]))
                if line.expr is not None:
                    needed |= {s.name for s in line.expr.free_symbols}
        kept.reverse()
        task = self.task
        # a module the program does not use cannot make it wrong: its effect on the model's output
        # is what the deviation check below measures
        used = {line.name for line in kept} | needed
        failures = []
        for name, why in self.failures:
            if name is None or name in used:
                failures.append(why)
            else:
                self.readings.append(Reading("unused by the program", "note", name, "", why,
                                             "excluded; see the program vs model check", True))
        self.failures = failures
        immaterial = self._immaterial_misses(kept, outputs)
        self.failures = [f for f in self.failures if not any(f.startswith(f"{h}: pointer fits no") for h in immaterial)]
        # the inputs it is read on (and verified on: the same task's draws) are its domain
        domain = Domain.from_samples(self.x, list(self.model.input_names), task.seq_len, task.any_length)
        self.readings.append(Reading("domain", "note", "", "extraction data", domain.describe(),
                                     f"seen in {self.n} sequences; checked by program(x) and program.py", True))
        source = build_source(task.name, task.n_inputs, task.n_outputs, list(self.model.input_names), kept, outputs,
                              domain=domain)
        program = Program(task.name, source, task.seq_len, task.n_inputs, task.n_outputs, kept, outputs,
                          failures=self.failures, readings=self.readings, model=self.model, domain=domain)
        # the program must reproduce the model it was read from (on the extraction data), up to the
        # network's own imprecision: a program may be exact where the network is only close (a
        # product on a grid, a relu kink), so compare with the raw output, not rounded decisions
        y_model = self.ro.y_model
        try:
            mine = program(self.x).reshape(y_model.shape)
        except (ArithmeticError, ValueError) as exc:   # e.g. math.sqrt of a negative where the fit went below 0
            self.failures.append(f"the program raised {type(exc).__name__} on the extraction data: {exc}")
            self.readings.append(Reading("program vs model", "check", "", "extraction data",
                                         f"the program raised {type(exc).__name__}: {exc}", "", False))
            program.failures, program.ok = self.failures, False
            return program
        valid = np.isfinite(self.y_task)
        diff = (mine - y_model)[valid]
        deviation = float(np.sqrt(np.mean(diff**2)) / (np.sqrt(np.mean(y_model[valid] ** 2)) + 1e-12))
        decisions = agreement(task, mine, y_model)
        # an integer program with every decision the model's reproduces it; the rest is the network's
        # wobble (0.3 where it means 0). A weighted sum that merely rounds like a vote is not integral
        clean = task.output == "integer" and decisions == 1.0 and bool(np.all(mine[valid] == np.round(mine[valid])))
        faithful = deviation <= MAX_DEVIATION or clean
        note = " (an integer program with every decision the model's)" if clean else ""
        self.readings.append(Reading("program vs model", "check", "", "extraction data", f"relative rms deviation "
                                     f"{deviation:.3g}{note}", f"agreement {decisions:.4f} by the task's criterion", faithful))
        if not faithful:
            self.failures.append(f"the program deviates from the model by {deviation:.3g} (relative rms; "
                                 f"agreement {decisions:.4f})")
        elif decisions == 1.0:
            self._misses_the_program_absorbs(kept, deviation)
        program.failures, program.readings, program.ok = self.failures, self.readings, not self.failures
        return program

    def _misses_the_program_absorbs(self, kept: list[Line], deviation: float) -> None:
        """Heads that fit no rule and sub-MLPs that fit no formula, when they are all that is left
        unread and the whole program, with their best rules and formulas, makes every one of the
        model's decisions on the extraction data: read as those. A content head that routes "some
        earlier value above x_t" where its best rule routes the largest one feeds the same
        comparison downstream (wtc.extraction.equivalence decides this from the output formulas
        when they read routed values only); a sub-MLP the output weighs at a tenth beside a residue
        that decides (Dithering's level of the prefix sum) changes no decision. A sub-MLP is
        absorbed only where the program is also within MAX_DEVIATION of the model's raw output."""
        routes = {ln.name for ln in kept if ln.kind == "route"}
        heads = [head for name, (head, rule, _) in self.unread.items()
                 if name in routes and rule.rate >= PROGRAM_IMMATERIAL_RATE]
        mlps = [m for m in self.unread_mlps if any(f.startswith(f"{m}: no formula within tolerance")
                                                   for f in self.failures)] if deviation <= MAX_DEVIATION else []
        absorbed = [f"{h}: pointer fits no" for h in heads] + [f"{m}: no formula within tolerance" for m in mlps]
        rest = [f for f in self.failures if not f.startswith(tuple(absorbed))]
        if rest or not self.failures:
            return
        self.failures = rest
        what = "decision" if self.task.output == "integer" else "value (within the task's tolerance)"
        because = f"with it the whole program reproduces every model {what} on the extraction data"
        self.readings = [dataclasses.replace(r, ok=True, evidence=f"{r.evidence}; read as this rule: {because}")
                         if r.module in heads and r.kind == "head" else
                         dataclasses.replace(r, ok=True, evidence=f"{r.evidence}; read as this formula: {because} "
                                             f"(relative rms deviation {deviation:.3g})")
                         if r.module in mlps and r.kind == "mlp" and r.name else r for r in self.readings]


def _reads(mod) -> str:
    return ", ".join(f"{k}={v}" for k, v in mod.reads.items())


def _distinct_inputs(mod, pname) -> list[str]:
    """A module's inputs, one per program variable (two slots may read the same value)."""
    first = {}
    for v in mod.reads.values():
        first.setdefault(pname[v], v)
    return list(first.values())


def _read_mlp(mod, ro, prog, pname, *, rel_tol: float | None = None, abs_tol: float | None = None,
              time_limit: float | None = None, widen=(1.0, 3.0, 10.0), periods: tuple[int, ...] = ()):
    """A sub-MLP's formula of its inputs (program units) -> (Reading, expression). periods: the
    model's periodic units (the regression's extra moduli, and the residue reading)."""
    P = ro.P
    inputs = _distinct_inputs(mod, pname)
    X = np.stack([prog[v][:, P:].ravel() for v in inputs], axis=1)
    y = ro.model_values(mod.name)[:, P:].ravel()
    rms = float(np.sqrt(np.mean(y**2))) + 1e-12
    tol = abs_tol if abs_tol is not None else rel_tol * rms
    names = tuple(pname[v] for v in inputs)

    def regression(X, y, names):
        return _formula(X, y, names, tol, time_limit=time_limit, widen=widen, moduli=periods)

    expr, evidence, ok = regression(X, y, names)
    poly = None if ok else grid_polynomial(X, y, names, tol)
    if poly is not None:       # a table on a few input values: its interpolating polynomial (wtc.extraction.grid)
        expr, ok = poly, True
        evidence = f"exact on the {len(np.unique(X, axis=0))} input combinations seen (the regression: {evidence})"
    residue = None if ok or not periods else residue_formula(X, y, names, periods, tol, regression, widen)
    if residue is not None:    # a function of one input's residue (wtc.extraction.residues)
        (expr, evidence), ok = residue, True
    return Reading(mod.name, "mlp", "", _reads(mod), str(expr), evidence, ok), expr

"""extract: read a frozen Discrete Transformer out as a Program.

1. Record every variable and pointer on fresh data (readout.read).
2. Live variables: walk back from the output head (contributions above noise), through what each
   live module reads.
3. In stream order: each live pointer head gets a routing rule (routing.fit_head) or is reported
   uninterpretable; aggregate heads are prefix means; each live sub-MLP gets a formula from the
   symbolic regression engine (wtc.sr), with a tolerance derived from how much of its error the
   output can absorb. Downstream modules see the rule's / formula's values, not the network's.
4. The head becomes formulas (compose.snap_output); the program is assembled and returned. A
   module that could not be read is named in program.failures (program.ok is False).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

from wtc import sr
from wtc import tasks as task_registry
from wtc.extract.compose import boolean_reduce, snap_output
from wtc.extract.program import POSITION, Line, Program, build_source
from wtc.extract.readout import head_weights, pad, read
from wtc.extract.routing import fit_head, routed, rule_keys
from wtc.extract.verify import agreement

LIVE_SHARE = 0.1            # live: moves an output by more than this share of the output tolerance
MAX_DEVIATION = 0.05        # program vs model output on the extraction data, relative rms
MIN_DECISION_AGREEMENT = 0.8  # integer outputs: a formula must share this share of the model's decisions
DECISION_SLACK = 0.05         # ... and may trail the best candidate's agreement by this much
MAX_SR_POINTS = 3000
ALONE_TIME_LIMIT = 3.0      # seconds per sub-MLP read alone for the report (its formula is in the output)


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
    span = "run" if p["w"] is None else str(p["w"])
    return f"{p['op']}{span}_{source}" if var == source else f"{source}_at_{p['op']}{span}_{var}"


def extract(model, task, *, n: int = 2048, seed: int = 0, sr_time_limit: float | None = 20.0) -> Program:
    """Read `model` (a frozen single-replica DiscreteTransformer trained on `task`) as a Program."""
    task = task_registry.get(task)
    if getattr(model, "R", 1) != 1:
        raise ValueError(f"extract() reads one model; this one holds {model.R} replicas (use model.replica(i))")
    if not bool(model.frozen):
        raise ValueError("extract() needs a frozen model (wtc.train returns one; or call model.freeze())")
    if (model.seq_len, model.n_inputs, model.n_outputs) != (task.seq_len, task.n_inputs, task.n_outputs):
        raise ValueError(f"model shape (seq_len, n_inputs, n_outputs) = {(model.seq_len, model.n_inputs, model.n_outputs)}"
                         f" does not match task {task.name!r}: {(task.seq_len, task.n_inputs, task.n_outputs)}")
    x, y_task = task.batch(np.random.default_rng([seed, 77]), n)
    ro = read(model, x)
    P, T, names = ro.P, ro.T, ro.names
    W = head_weights(model)                                                     # (V, O)
    scale = model.x_scale.double().numpy()

    # program values (n, P + T) and model = factor * program for linearly scaled variables
    prog: dict[str, np.ndarray] = {}
    factor: dict[str, float] = {}
    pname: dict[str, str] = {}                                                  # stream -> program name
    for i, nm in enumerate(model.input_names):
        prog[nm], factor[nm], pname[nm] = pad(x[:, :, i], P), 1.0 / scale[i], nm
    prog["pos"], factor["pos"], pname["pos"] = pad(np.tile(np.arange(T, dtype=float), (n, 1)), P), 1.0 / max(T - 1, 1), POSITION
    taken = set(pname.values())

    # live variables (preliminary: q/k of content heads count as read)
    tol_out = _output_tolerance(task, y_task)
    # a variable is live when it moves some output by more than a tenth of what the task can notice
    contrib = np.abs(W).max(1) * np.sqrt(np.mean(ro.stream[:, P:] ** 2, axis=(0, 1)))
    live = {names[v] for v in range(len(names)) if contrib[v] > LIVE_SHARE * tol_out}
    for mod in reversed(ro.modules):
        if mod.name in live:
            slots = ["v"] if mod.kind != "mlp" else list(mod.reads)
            if mod.kind == "head" and mod.content:
                slots += ["q", "k"]
            live |= {mod.reads[s] for s in slots}

    lines: list[Line] = []
    readings: list[Reading] = []
    failures: list[str] = []
    exprs: dict[str, sp.Expr] = {}                                              # mlp -> formula
    routes: dict[tuple, str] = {}                                               # (rule, source) -> name
    symbol = {nm: sp.Symbol(pname[nm]) for nm in pname}
    head_only = []

    def _add_mlp(mod, expr, reading):
        exprs[mod.name] = expr
        pname[mod.name] = _unique_name(f"m{len(exprs) - 1}", taken)
        symbol[mod.name] = sp.Symbol(pname[mod.name])
        inputs = _distinct_inputs(mod, pname)
        f = sp.lambdify([sp.Symbol(pname[v]) for v in inputs], expr, modules=["numpy"])
        with np.errstate(all="ignore"):
            out = np.broadcast_to(np.asarray(f(*[prog[v][:, P:] for v in inputs]), dtype=float), (n, T))
        prog[mod.name] = pad(out, P)
        factor[mod.name] = 1.0
        reading.name = pname[mod.name]
        readings.append(reading)
        if not reading.ok:
            failures.append(f"{mod.name}: no formula within tolerance ({reading.evidence})")
        lines.append(Line(pname[mod.name], "expr", expr=expr, comment=reading.finding))

    for mod in ro.modules:
        if mod.name not in live:
            readings.append(Reading(mod.name, mod.kind, "", ", ".join(f"{k}={v}" for k, v in mod.reads.items()),
                                    "dead (no effect on the output)", "", True, live=False))
            continue
        if mod.kind == "head":
            src = mod.reads["v"]
            window = [mod.reads["k"]] if mod.content else []
            view = {pname[k]: v for k, v in prog.items()}
            fit = fit_head(mod.name, ro.pointers[mod.name], pname[src], view, P, T,
                           window_vars=[pname[w] for w in window],
                           query_vars=[pname[mod.reads["q"]]] if mod.content else [])
            best = fit.rule or fit.candidates[0]
            evidence = f"agreement {best.rate:.5f} (99% lower bound {best.lower_bound:.5f}, n={best.n})"
            if fit.rule is None:
                failures.append(f"{mod.name}: pointer fits no routing rule (best: {best.describe()}, "
                                f"agreement {best.rate:.4f})")
                keys = ro.pointers[mod.name]
            else:
                keys = rule_keys(fit.rule, view, P, T)
            prog[mod.name] = pad(routed(prog[src], keys, P), P)
            factor[mod.name] = factor.get(src)
            same = routes.get((repr(best.kind), repr(best.params), src)) if fit.rule is not None else None
            if fit.rule is not None and fit.rule.kind == "offset" and fit.rule.params["d"] == 0:
                pname[mod.name] = pname[src]                                    # reads the current position
            elif same is not None:
                pname[mod.name] = same                                          # another head routes the same
            else:
                var = fit.rule.params.get("var", pname[src]) if fit.rule else pname[src]
                pname[mod.name] = _unique_name(_route_name(best, pname[src], var), taken)
                lines.append(Line(pname[mod.name], "route", pname[src], best, comment=best.describe()))
                if fit.rule is not None:
                    routes[(repr(best.kind), repr(best.params), src)] = pname[mod.name]
            symbol[mod.name] = sp.Symbol(pname[mod.name])
            readings.append(Reading(mod.name, "head", pname[mod.name], f"v={src}" + (f", k={mod.reads['k']}" if window else ""),
                                    best.describe(), evidence, fit.rule is not None))
        elif mod.kind == "aggregate":
            src = mod.reads["v"]
            values = prog[src][:, P:]
            prog[mod.name] = pad(np.cumsum(values, axis=1) / np.arange(1, T + 1), P)
            factor[mod.name] = factor.get(src)
            pname[mod.name] = _unique_name(f"mean_{pname[src]}", taken)
            symbol[mod.name] = sp.Symbol(pname[mod.name])
            lines.append(Line(pname[mod.name], "mean", pname[src], comment="mean over the prefix"))
            readings.append(Reading(mod.name, "aggregate", pname[mod.name], f"v={src}", "mean over the prefix",
                                    "by construction", True))
        else:
            consumers = [m for m in ro.modules if m.name in live and mod.name in m.reads.values()]
            if not consumers:
                head_only.append(mod)                    # read through the output formula below
                symbol[mod.name] = None
                continue
            # an intermediate variable: its own formula, a program line
            reading, expr = _read_mlp(mod, ro, prog, pname, rel_tol=1e-3)
            _add_mlp(mod, expr, reading)

    # each output as one formula of the variables it depends on
    outputs = []
    # integer tasks: the model's decisions (rounded outputs) are what it computes; a network that
    # wobbles around x*y by 0.3 must not teach the regression the wobble
    y_target = ro.y_model if task.output == "real" else np.round(ro.y_model)
    for o in range(task.n_outputs):
        # variables that move this output by more than a tenth of its tolerance, one per program name
        strength = {nm: abs(W[names.index(nm), o]) * float(np.sqrt(np.mean(ro.model_values(nm)[:, P:] ** 2)))
                    for nm in names if nm in live}
        weight = {}
        for nm in names:
            if nm in prog and strength.get(nm, 0.0) > 0.1 * tol_out:
                weight[pname[nm]] = max(weight.get(pname[nm], (0.0, nm))[0] + strength[nm], 0.0), nm
        for m in head_only:
            if strength.get(m.name, 0.0) > 0.1 * tol_out:
                for v in m.reads.values():
                    weight[pname[v]] = weight.get(pname[v], (0.0, v))[0] + strength[m.name], v
        # one regression takes at most 3 variables: keep the strongest (verification judges)
        ranked = sorted(weight.values(), key=lambda wv: -wv[0])
        leaves = [v for _, v in ranked[:3]] if len(ranked) > 3 else [v for _, v in ranked]
        leaves = sorted(leaves, key=names.index)
        keep = np.isfinite(y_task[:, :, o])
        target = y_target[:, :, o][keep]
        if len(leaves) <= 3:
            X = np.stack([prog[v][:, P:][keep] for v in leaves], axis=1) if leaves else np.zeros((len(target), 0))
            # a network is often less precise than the formula it approximates: widen the tolerance
            # (integer outputs: never past what rounding forgives); verification has the last word
            widen = (1.0, 3.0, 6.0) if task.output == "integer" else (1.0, 3.0, 10.0, 30.0, 100.0)
            expr, evidence, ok = _formula(X, target, tuple(pname[v] for v in leaves), tol_out, widen=widen,
                                          decisions=task.output == "integer")
            if not ok:
                failures.append(f"output {o}: no formula within tolerance ({evidence})")
            readings.append(Reading(f"output {o}", "head", "out", ", ".join(pname[v] for v in leaves),
                                    str(expr), evidence, ok))
        else:   # too many variables for one regression: each sub-MLP alone, then compose
            for mod in head_only:
                if mod.name not in exprs:
                    gain = float(np.abs(W[names.index(mod.name)]).max()) * max(len(head_only), 1)
                    reading, e = _read_mlp(mod, ro, prog, pname, abs_tol=tol_out / max(gain, 1e-12))
                    _add_mlp(mod, e, reading)
            c0 = float((model.b_out[0, o] * model.y_scale[o] + model.y_mean[o]).detach())
            expr = sp.Float(c0)
            for nm in names:
                if nm in live and nm in prog:
                    v = names.index(nm)
                    expr += W[v, o] * (exprs[nm] if nm in exprs else factor[nm] * symbol[nm])
            used = [nm for nm in names if nm in live and nm in prog and nm not in exprs]
            data = {pname[nm]: prog[nm][:, P:][keep] for nm in used}
            binary = {sp.Symbol(k) for k, v in data.items() if set(np.unique(v)) <= {0.0, 1.0}}
            syms = sorted({sp.Symbol(k) for k in data}, key=lambda q: q.name)
            expr = snap_output(expr, syms, data, target, tol_out, binary)
            readings.append(Reading(f"output {o}", "head", "out", "composed sub-MLP formulas", str(expr), "", True))
        outputs.append(expr)
    for mod in head_only:   # report each head-only sub-MLP alone too (its formula is inside the output)
        if mod.name not in exprs:
            reading, _ = _read_mlp(mod, ro, prog, pname, rel_tol=1e-2, time_limit=ALONE_TIME_LIMIT, widen=(1.0,))
            reading.name, reading.finding = "(in output)", f"alone: {reading.finding}"
            readings.append(reading)

    # keep only the lines the outputs need (formulas were inlined into the outputs)
    needed = set().union(*[{s.name for s in e.free_symbols} for e in outputs])
    kept: list[Line] = []
    for line in reversed(lines):
        if line.name in needed:
            kept.append(line)
            needed |= {line.source} if line.source else set()
            if line.rule is not None and line.rule.kind in ("window", "switch"):
                needed.add(line.rule.params["var"])
            if line.expr is not None:
                needed |= {s.name for s in line.expr.free_symbols}
    kept.reverse()
    source = build_source(task.name, task.n_inputs, task.n_outputs, list(model.input_names), kept, outputs)
    program = Program(task.name, source, task.seq_len, task.n_inputs, task.n_outputs, kept, outputs,
                      failures=failures, readings=readings, model=model)
    # the program must reproduce the model it was read from (on the extraction data), up to the
    # network's own imprecision: a program may be exact where the network is only close (a product
    # on a grid, a relu kink), so compare with the raw output, not with rounded decisions
    mine = program(x).reshape(ro.y_model.shape)
    valid = np.isfinite(y_task)
    diff = (mine - ro.y_model)[valid]
    deviation = float(np.sqrt(np.mean(diff**2)) / (np.sqrt(np.mean(ro.y_model[valid] ** 2)) + 1e-12))
    decisions = agreement(task, mine, ro.y_model)
    readings.append(Reading("program vs model", "check", "", "extraction data", f"relative rms deviation {deviation:.3g}",
                            f"agreement {decisions:.4f} by the task's criterion", deviation <= MAX_DEVIATION))
    if deviation > MAX_DEVIATION:
        failures.append(f"the program deviates from the model by {deviation:.3g} (relative rms; "
                        f"agreement {decisions:.4f})")
    program.ok = not failures
    return program


def _distinct_inputs(mod, pname) -> list[str]:
    """A module's inputs, one per program variable (two slots may read the same value)."""
    first = {}
    for v in mod.reads.values():
        first.setdefault(pname[v], v)
    return list(first.values())


def _formula(X: np.ndarray, y: np.ndarray, names: tuple[str, ...], tol_abs: float, widen=(1.0, 3.0, 10.0),
             time_limit: float | None = None, decisions: bool = False):
    """Simplest formula y = f(X) within tol_abs (rms), widening the tolerance if nothing passes.

    decisions=True (integer outputs, y = the model's rounded outputs): among the regression's
    Pareto candidates, the simplest whose rounded values agree with y (weighted by how often each
    input occurs) within DECISION_SLACK of the best agreement any candidate reaches: a network that
    rounds wrong on a few inputs must not buy a formula that copies its wobble (seen: x*y plus
    sin/cos terms at +0.5% agreement on product_last2).
    Returns (sympy expression, evidence text, passed)."""
    if X.shape[1] == 0:
        value = float(np.mean(y))
        ok = float(np.sqrt(np.mean((y - value) ** 2))) <= tol_abs
        return sp.nsimplify(value, rational=True, tolerance=tol_abs), "constant", ok
    X, inverse, counts = np.unique(np.round(X, 12), axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    y = np.bincount(inverse, weights=y) / counts                                  # mean per distinct input
    if decisions:
        y = np.round(y)
    if len(y) > MAX_SR_POINTS:
        pick = np.random.default_rng(0).choice(len(y), MAX_SR_POINTS, replace=False)
        X, y, counts = X[pick], y[pick], counts[pick]
    if len(y) < 8:   # e.g. two bits: 4 distinct inputs; repeat them so the regression has its minimum
        reps = -(-8 // len(y))
        X, y, counts = np.tile(X, (reps, 1)), np.tile(y, reps), np.tile(counts, reps) / reps
    rms = float(np.sqrt(np.mean(y**2))) + 1e-12
    fit = None
    for w in widen:
        fit = sr.fit(X, y, names=names, tol=min(1.0, w * tol_abs / rms), time_limit=time_limit)
        if fit.exact:
            break
    evidence = f"rmse {fit.rmse:.3g} (tolerance {fit.tolerance:.3g}), R^2 {fit.r2:.6f}, complexity {fit.complexity}"
    if not decisions:
        return fit.expr, evidence, bool(fit.exact)
    symbols = [sp.Symbol(n) for n in names]
    scored = []
    for row in sorted(fit.candidates, key=lambda r: r.complexity):
        f = sp.lambdify(symbols, row.expr, modules=["numpy"])
        with np.errstate(all="ignore"):
            pred = np.broadcast_to(np.asarray(f(*X.T), dtype=float), y.shape)
        agree = float(np.sum(counts * (np.round(pred) == y)) / np.sum(counts))
        scored.append((row, agree))
    if not scored:
        return fit.expr, evidence, bool(fit.exact)
    best = max(a for _, a in scored)
    row, agree = next((r, a) for r, a in scored if a >= best - DECISION_SLACK)
    evidence = (f"agrees with the model's decisions on {agree:.4f} of inputs (best candidate {best:.4f}); "
                f"complexity {row.complexity}")
    return row.expr, evidence, agree >= MIN_DECISION_AGREEMENT
def _read_mlp(mod, ro, prog, pname, *, rel_tol: float | None = None, abs_tol: float | None = None,
              time_limit: float | None = None, widen=(1.0, 3.0, 10.0)):
    """A sub-MLP's formula of its inputs (program units) -> (Reading, expression)."""
    P = ro.P
    inputs = _distinct_inputs(mod, pname)
    X = np.stack([prog[v][:, P:].ravel() for v in inputs], axis=1)
    y = ro.model_values(mod.name)[:, P:].ravel()
    rms = float(np.sqrt(np.mean(y**2))) + 1e-12
    tol = abs_tol if abs_tol is not None else rel_tol * rms
    expr, evidence, ok = _formula(X, y, tuple(pname[v] for v in inputs), tol, time_limit=time_limit, widen=widen)
    reads = ", ".join(f"{k}={v}" for k, v in mod.reads.items())
    return Reading(mod.name, "mlp", "", reads, str(expr), evidence, ok), expr

"""Symbolic regression benchmark: exact recovery of ground-truth formulas by wtc.sr and its peers.

Each formula is sampled on its domain (n points), relative Gaussian noise is added
(y + level * rms(y) * N(0, 1), levels 0, 1e-3, 1e-2) and every method fits the same data. A fit is
an exact recovery when it is, after rounding every constant of both expressions to 3 decimals,
  - numerically identical to the truth (pointwise relative 1e-6) on dense points over twice the
    domain (an integer grid over twice the range for integer inputs), wherever the truth is
    defined -- so equivalent piecewise forms count and forms that agree only on the data do not;
  - or, failing that but within 1e-2, sympy-equivalent (simplify of the difference is 0).
Peers (pyoperon, gplearn) run with their usual settings on one thread; a peer that fails to import
is skipped. Writes bench/results/sr.csv and bench/results/sr.md (sr_quick.* with --quick).

    python bench/sr.py                     # wtc.sr alone, all formulas, all noise levels
    python bench/sr.py --peers all         # with pyoperon and gplearn (slow: ~10 s per fit each)
    python bench/sr.py --quick             # a subset, for a quick look
    python bench/sr.py --extra             # compositions and integer-domain formulas instead
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import signal
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sympy as sp

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
N_POINTS = 1000
NOISE_LEVELS = (0.0, 1e-3, 1e-2)


@dataclass(frozen=True)
class Formula:
    name: str
    category: str
    expr: str  # sympy syntax over the variable names
    domains: tuple  # per variable: (name, kind, lo, hi) with kind 'u' (uniform) or 'int' ([lo, hi])


def U(name, lo, hi):
    return (name, "u", lo, hi)


def I(name, lo, hi):  # noqa: E743  integers lo..hi inclusive
    return (name, "int", lo, hi)


FORMULAS = [
    # arithmetic and polynomials
    Formula("sum", "arith", "a + b", (U("a", -3, 3), U("b", -3, 3))),
    Formula("affine", "arith", "2*a - 3*b + 1", (U("a", -3, 3), U("b", -3, 3))),
    Formula("xor_bits", "arith", "a + b - 2*a*b", (I("a", 0, 1), I("b", 0, 1))),
    Formula("cubic", "arith", "x**3 - 2*x + 1", (U("x", -2, 2),)),
    Formula("diff_squares", "arith", "a**2 - b**2", (U("a", -3, 3), U("b", -3, 3))),
    Formula("square_sum", "arith", "(a + b)**2", (U("a", -2, 2), U("b", -2, 2))),
    Formula("quad_mix", "arith", "3*a**2 + 2*a*b - b", (U("a", -2, 2), U("b", -2, 2))),
    Formula("sum3", "arith", "a - 2*b + 3*c", (U("a", -3, 3), U("b", -3, 3), U("c", -3, 3))),
    Formula("fahrenheit", "arith", "1.8*T + 32", (U("T", -40, 100),)),
    # products
    Formula("prod_int", "product", "a*b", (I("a", 0, 9), I("b", 0, 9))),
    Formula("prod_plus", "product", "a*b + c", (U("a", -3, 3), U("b", -3, 3), U("c", -3, 3))),
    Formula("prod3", "product", "a*b*c", (U("a", 0, 4), U("b", 0, 4), U("c", 0, 4))),
    Formula("prod3_int", "product", "a*b*c", (I("a", 0, 20), I("b", 0, 20), I("c", 0, 20))),
    Formula("and_or_bits", "product", "a*b + c - a*b*c", (I("a", 0, 1), I("b", 0, 1), I("c", 0, 1))),
    # max / min / abs
    Formula("max", "piecewise", "Max(a, b)", (U("a", -2, 2), U("b", -2, 2))),
    Formula("min", "piecewise", "Min(a, b)", (U("a", -2, 2), U("b", -2, 2))),
    Formula("relu_diff", "piecewise", "Max(a - b, 0)", (U("a", -2, 2), U("b", -2, 2))),
    Formula("abs_diff", "piecewise", "Abs(a - b)", (U("a", -2, 2), U("b", -2, 2))),
    Formula("max3", "piecewise", "Max(a, b, c)", (U("a", -2, 2), U("b", -2, 2), U("c", -2, 2))),
    Formula("min_plus", "piecewise", "Min(a, b) + c", (U("a", -2, 2), U("b", -2, 2), U("c", -2, 2))),
    Formula("max_int", "piecewise", "Max(a, b)", (I("a", 0, 99), I("b", 0, 99))),
    Formula("abs_lin", "piecewise", "Abs(x) + x/2", (U("x", -3, 3),)),
    # ratios
    Formula("ratio", "ratio", "a/b", (U("a", 1, 5), U("b", 1, 5))),
    Formula("parallel", "ratio", "a*b/(a + b)", (U("a", 1, 5), U("b", 1, 5))),
    Formula("lorentz", "ratio", "1/(1 + x**2)", (U("x", -3, 3),)),
    Formula("saturate", "ratio", "x/(1 + x)", (U("x", 0, 4),)),
    Formula("ratio3", "ratio", "a/(b + c)", (U("a", 1, 5), U("b", 1, 5), U("c", 1, 5))),
    Formula("gravity", "ratio", "6.674*a*b/c**2", (U("a", 1, 5), U("b", 1, 5), U("c", 1, 5))),
    # square roots
    Formula("sqrt", "sqrt", "sqrt(x)", (U("x", 0, 4),)),
    Formula("hypot", "sqrt", "sqrt(a**2 + b**2)", (U("a", -3, 3), U("b", -3, 3))),
    Formula("pow15", "sqrt", "x**1.5", (U("x", 0, 4),)),
    Formula("pendulum", "sqrt", "2*pi*sqrt(L/9.81)", (U("L", 0.5, 4),)),
    # exp / log / trig
    Formula("exp_decay", "transcendental", "exp(-x)", (U("x", 0, 4),)),
    Formula("log", "transcendental", "log(x)", (U("x", 0.5, 5),)),
    Formula("log1p", "transcendental", "log(1 + x)", (U("x", 0, 4),)),
    Formula("sin", "transcendental", "sin(x)", (U("x", -3, 3),)),
    Formula("cos_mul", "transcendental", "b*cos(a)", (U("a", -3, 3), U("b", -3, 3))),
    Formula("gauss", "transcendental", "exp(-x**2)", (U("x", -3, 3),)),
    Formula("tanh", "transcendental", "tanh(x)", (U("x", -3, 3),)),
    Formula("x_exp", "transcendental", "x*exp(-x)", (U("x", 0, 5),)),
    # physics-style constants
    Formula("fall", "physics", "100 - 4.905*t**2", (U("t", 0, 4),)),
    Formula("fall_g", "physics", "0.5*9.81*t**2", (U("t", 0, 4),)),
    Formula("projectile", "physics", "v*t - 4.905*t**2", (U("v", 0, 20), U("t", 0, 4))),
    Formula("kinetic", "physics", "0.5*m*v**2", (U("m", 1, 5), U("v", 0, 4))),
    # constants inside nonlinearities
    Formula("exp_half", "inner-constant", "exp(-0.5*x)", (U("x", 0, 4),)),
    Formula("sin_affine", "inner-constant", "sin(2*x + 1)", (U("x", -3, 3),)),
    Formula("lorentz_03", "inner-constant", "1/(1 + 0.3*x**2)", (U("x", -3, 3),)),
    Formula("pow075", "inner-constant", "x**0.75", (U("x", 0.5, 4),)),
    Formula("decay_offset", "inner-constant", "2*exp(-0.3*t) + 1", (U("t", 0, 5),)),
    Formula("gauss_half", "inner-constant", "exp(-0.5*x**2)", (U("x", -3, 3),)),
    Formula("sin3", "inner-constant", "sin(3*x)", (U("x", -2, 2),)),
    Formula("log_half", "inner-constant", "log(1 + 0.5*x)", (U("x", 0, 4),)),
]

# opt-in (--extra): nonlinearities around products and sums with a constant (issue 17 item 9) and
# integer-domain formulas (modulus, floor division, comparisons, thresholds, chained min/max)
EXTRA = [
    Formula("log1p_prod", "composition", "log(1 + a*b)", (U("a", 0, 3), U("b", 0, 3))),
    Formula("ratio_prod", "composition", "a/(1 + a*b)", (U("a", 0, 3), U("b", 0, 3))),
    Formula("sin_sum_mul", "composition", "a*sin(a + b)", (U("a", 0, 3), U("b", 0, 3))),
    Formula("mul_sqrt1p", "composition", "b*sqrt(1 + a**2)", (U("a", -2, 2), U("b", 0, 3))),
    Formula("sqrt1p_prod", "composition", "sqrt(1 + a*b)", (U("a", 0, 3), U("b", 0, 3))),
    Formula("exp_prod", "composition", "exp(-a*b)", (U("a", 0, 2), U("b", 0, 2))),
    Formula("even", "integer", "1 - Mod(x, 2)", (I("x", 0, 99),)),
    Formula("floordiv3", "integer", "floor(x/3)", (I("x", 0, 99),)),
    Formula("mod3", "integer", "Mod(x, 3)", (I("x", 0, 99),)),
    Formula("sum_mod3", "integer", "Mod(a + b, 3)", (I("a", 0, 9), I("b", 0, 9))),
    Formula("ge", "integer", "Piecewise((1, a >= b), (0, True))", (I("a", 0, 9), I("b", 0, 9))),
    Formula("threshold", "integer", "Piecewise((1, x >= 50), (0, True))", (I("x", 0, 99),)),
    Formula("majority", "integer", "Piecewise((1, a + b + c >= 2), (0, True))",
            (I("a", 0, 1), I("b", 0, 1), I("c", 0, 1))),
    Formula("max_min", "integer", "Max(a, Min(b, c))", (I("a", 0, 9), I("b", 0, 9), I("c", 0, 9))),
]

QUICK = ("affine", "xor_bits", "prod_int", "max", "relu_diff", "parallel", "hypot", "exp_decay",
         "fall", "exp_half", "sin_affine", "lorentz_03")


# ---------------------------------------------------------------------------------- data
def symbols(f: Formula):
    return [sp.Symbol(d[0]) for d in f.domains]


def truth_expr(f: Formula) -> sp.Expr:
    return sp.sympify(f.expr, locals={d[0]: sp.Symbol(d[0]) for d in f.domains})


def sample(f: Formula, n: int, rng: np.random.Generator) -> np.ndarray:
    cols = []
    for _, kind, lo, hi in f.domains:
        cols.append(rng.uniform(lo, hi, n) if kind == "u" else rng.integers(lo, hi + 1, n).astype(float))
    return np.stack(cols, 1)


def evaluate(e: sp.Expr, syms, X: np.ndarray) -> np.ndarray:
    fn = sp.lambdify(syms, e, modules="numpy")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*[X[:, i] for i in range(X.shape[1])])
    return np.broadcast_to(np.asarray(out, dtype=np.complex128), (len(X),))


def dense_points(f: Formula) -> np.ndarray:
    """Grid over twice each variable's range (integer grid for integer inputs)."""
    per = {1: 4001, 2: 161, 3: 41}[len(f.domains)]
    axes = []
    for _, kind, lo, hi in f.domains:
        w = hi - lo
        if kind == "int":
            w = max(w, 1)
            axes.append(np.arange(lo - w, hi + w + 1, max(1, (3 * w) // per)))
        else:
            axes.append(np.linspace(lo - w / 2, hi + w / 2, per))
    return np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], 1).astype(float)


# ---------------------------------------------------------------------------------- exactness
def round3(e: sp.Expr, f: Formula) -> sp.Expr:
    """Constants evaluated (2*pi*sqrt(L/9.81) -> 2.006*sqrt(L) for L > 0), then rounded to 3 decimals."""
    pos = {sp.Symbol(d[0]): sp.Symbol(d[0], positive=True) for d in f.domains if d[2] > 0}
    e = e.xreplace(pos).evalf().xreplace({v: k for k, v in pos.items()})
    reps = {}
    for a in e.atoms(sp.Number):
        if isinstance(a, sp.Integer):
            continue
        reps[a] = sp.Rational(str(round(float(a), 3)))
    return e.xreplace(reps)


class _Timeout(Exception):
    pass


def _alarm(sig, frame):
    raise _Timeout


def _max_dev(fe: sp.Expr, ge: sp.Expr, syms, P: np.ndarray) -> float:
    """Max pointwise relative deviation of fe from ge where ge is real and finite (inf if fe is not)."""
    gv, fv = evaluate(ge, syms, P), evaluate(fe, syms, P)
    ok = np.isfinite(gv) & (np.abs(gv.imag) < 1e-12)
    if not ok.any():
        return np.inf
    gv, fv = gv[ok].real, fv[ok]
    if not (np.isfinite(fv).all() and np.all(np.abs(fv.imag) <= 1e-9 * (1 + np.abs(gv)))):
        return np.inf
    scale = np.abs(gv) + np.sqrt(np.mean(gv**2)) + 1e-300
    return float(np.max(np.abs(fv.real - gv) / scale))


def is_exact(found: sp.Expr | None, f: Formula) -> bool:
    if found is None:
        return False
    syms = symbols(f)
    if not found.free_symbols <= set(syms):
        return False
    P = dense_points(f)
    if _max_dev(found, truth_expr(f), syms, P) <= 1e-9:  # identical as written (log(x+2) - log(2))
        return True
    g3, f3 = round3(truth_expr(f), f), round3(found, f)
    dev = _max_dev(f3, g3, syms, P)
    if dev <= 1e-6:
        return True
    if dev > 1e-2:
        return False
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        return sp.simplify(f3 - g3) == 0
    except _Timeout:
        return False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------- methods
def run_wtc(X, y, f: Formula):
    import wtc.sr
    r = wtc.sr.fit(X, y, names=[d[0] for d in f.domains])
    return r.expr, {"passes": r.exact, "complexity": r.complexity, "equation": r.equation}


_OPERON_SYMBOLS = "add,sub,mul,div,constant,variable,square,sqrt,exp,log,sin,cos,tanh,abs"


def run_pyoperon(X, y, f: Formula):
    from pyoperon.sklearn import SymbolicRegressor
    m = SymbolicRegressor(allowed_symbols=_OPERON_SYMBOLS, n_threads=1, max_length=30,
                          max_time=10, random_state=0)
    m.fit(X, y)
    names = [d[0] for d in f.domains]
    s = m.get_model_string(m.model_, 8, names).replace("^", "**")
    loc = {n: sp.Symbol(n) for n in names}
    loc.update({"square": lambda a: a**2, "abs": sp.Abs, "sqrt": sp.sqrt, "exp": sp.exp,
                "log": sp.log, "sin": sp.sin, "cos": sp.cos, "tanh": sp.tanh})
    e = sp.sympify(s, locals=loc)
    return _tidy(e), {"equation": s[:200]}


_GP_FUNCS = ("add", "sub", "mul", "div", "sqrt", "log", "abs", "neg", "inv", "max", "min", "sin", "cos")


def run_gplearn(X, y, f: Formula):
    from gplearn.genetic import SymbolicRegressor
    m = SymbolicRegressor(population_size=1000, generations=20, function_set=_GP_FUNCS,
                          parsimony_coefficient=0.001, random_state=0, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.fit(X, y)
    s = str(m._program)
    names = [d[0] for d in f.domains]
    loc = {f"X{i}": sp.Symbol(n) for i, n in enumerate(names)}
    # gplearn's protected operators behave as the plain ones on the points where they are defined
    loc.update({"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
                "div": lambda a, b: a / b, "sqrt": lambda a: sp.sqrt(sp.Abs(a)),
                "log": lambda a: sp.log(sp.Abs(a)), "abs": sp.Abs, "neg": lambda a: -a,
                "inv": lambda a: 1 / a, "max": sp.Max, "min": sp.Min, "sin": sp.sin, "cos": sp.cos})
    e = sp.sympify(s, locals=loc)
    return _tidy(e), {"equation": s[:200]}


def _tidy(e):
    """Simplify a peer's expression a little (bounded time) so that the rounding sees real constants."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(10)
    try:
        return sp.simplify(e)
    except Exception:
        return e
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


METHODS = {"wtc": run_wtc, "pyoperon": run_pyoperon, "gplearn": run_gplearn}


def available(name: str) -> tuple[bool, str]:
    try:
        if name == "pyoperon":
            import pyoperon.sklearn  # noqa: F401
        elif name == "gplearn":
            import gplearn.genetic  # noqa: F401
        return True, ""
    except Exception as e:  # a missing or broken peer is skipped, not fatal
        return False, f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------- main
def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} formulas")
    ap.add_argument("--peers", default="", help="comma list of peers (pyoperon,gplearn) or 'all'")
    ap.add_argument("--noise", default=",".join(str(v) for v in NOISE_LEVELS), help="noise levels")
    ap.add_argument("--only", default="", help="comma list of formula names")
    ap.add_argument("--n", type=int, default=N_POINTS, help="points per formula")
    ap.add_argument("--out", default=None, help="output stem (default bench/results/sr[_quick|_extra])")
    ap.add_argument("--seed", type=int, default=0, help="offset of the data seeds (robustness checks)")
    ap.add_argument("--extra", action="store_true",
                    help=f"only the {len(EXTRA)} extra formulas (compositions, integer domain)")
    args = ap.parse_args(argv)

    formulas = [f for f in (EXTRA if args.extra else FORMULAS) if (not args.quick or f.name in QUICK)
                and (not args.only or f.name in args.only.split(","))]
    peers = ["pyoperon", "gplearn"] if args.peers == "all" else [p for p in args.peers.split(",") if p]
    methods = ["wtc"]
    skipped = {}
    for p in peers:
        if p not in METHODS:
            ap.error(f"unknown peer {p!r}; known: pyoperon, gplearn")
        ok, why = available(p)
        if ok:
            methods.append(p)
        else:
            skipped[p] = why
            print(f"skipping {p}: {why}", file=sys.stderr)
    levels = [float(v) for v in args.noise.split(",")]
    stem = Path(args.out) if args.out else RESULTS / ("sr_extra" if args.extra else "sr_quick" if args.quick else "sr")
    stem.parent.mkdir(parents=True, exist_ok=True)

    import wtc.sr
    wtc.sr.fit(np.arange(20.0), np.arange(20.0) * 2)  # warm-up (imports) outside the timings

    rows = []
    fields = ["formula", "category", "truth", "noise", "method", "exact", "seconds", "found",
              "passes", "complexity", "error"]
    csv_path = stem.with_suffix(".csv")
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for li, level in enumerate(levels):
            for f in formulas:
                rng = np.random.default_rng(1000 * li + (FORMULAS + EXTRA).index(f) + 100_000 * args.seed)
                X = sample(f, args.n, rng)
                y = evaluate(truth_expr(f), symbols(f), X).real
                y = y + level * np.sqrt(np.mean(y**2)) * rng.standard_normal(len(y))
                for m in methods:
                    t0 = time.perf_counter()
                    err, found, info = "", None, {}
                    try:
                        found, info = METHODS[m](X, y, f)
                    except Exception as e:  # a method that crashes scores a miss, with the reason
                        err = f"{type(e).__name__}: {e}"[:200]
                    secs = time.perf_counter() - t0
                    exact = is_exact(found, f) if found is not None else False
                    row = {"formula": f.name, "category": f.category, "truth": f.expr, "noise": level,
                           "method": m, "exact": int(exact), "seconds": round(secs, 3),
                           "found": info.get("equation", str(found))[:200],
                           "passes": info.get("passes", ""), "complexity": info.get("complexity", ""),
                           "error": err}
                    rows.append(row)
                    w.writerow(row)
                    fh.flush()
                    print(f"[{level:g}] {f.name:14s} {m:9s} {'EXACT' if exact else 'miss ':5s} "
                          f"{secs:6.2f}s  {row['found'][:90]}", flush=True)
    md = summary(rows, methods, levels, skipped, formulas, args.n)
    stem.with_suffix(".md").write_text(md)
    print(md)
    return 0


def summary(rows, methods, levels, skipped, formulas, n) -> str:
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    out = [f"# wtc.sr benchmark ({len(formulas)} formulas, n = {n} points each)", "",
           f"Machine: {machine()}. Date: {date}.", "",
           "Exact recovery (%) and time per formula (s):", "",
           "| method | noise | exact % | inner-constant exact % | median s | max s |",
           "|---|---|---|---|---|---|"]
    for m in methods:
        for lv in levels:
            sel = [r for r in rows if r["method"] == m and r["noise"] == lv]
            if not sel:
                continue
            inner = [r for r in sel if r["category"] == "inner-constant"]
            t = [r["seconds"] for r in sel]
            out.append(f"| {m} | {lv:g} | {100 * np.mean([r['exact'] for r in sel]):.1f} | "
                       f"{100 * np.mean([r['exact'] for r in inner]) if inner else float('nan'):.0f} | "
                       f"{np.median(t):.2f} | {max(t):.2f} |")
    cats = sorted({r["category"] for r in rows})
    out += ["", "wtc.sr exact recovery by category (%):", "",
            "| category | " + " | ".join(f"noise {lv:g}" for lv in levels) + " |",
            "|---|" + "---|" * len(levels)]
    for c in cats:
        cells = []
        for lv in levels:
            sel = [r["exact"] for r in rows if r["method"] == "wtc" and r["noise"] == lv and r["category"] == c]
            cells.append(f"{100 * np.mean(sel):.0f} ({sum(sel)}/{len(sel)})" if sel else "-")
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    misses = [r for r in rows if r["method"] == "wtc" and not r["exact"]]
    if misses:
        out += ["", "wtc.sr misses:", "", "| noise | formula | truth | found | passes tol |", "|---|---|---|---|---|"]
        for r in misses:
            out.append(f"| {r['noise']:g} | {r['formula']} | `{r['truth']}` | `{r['found'][:80]}` | {r['passes']} |")
    if skipped:
        out += ["", "Skipped peers: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

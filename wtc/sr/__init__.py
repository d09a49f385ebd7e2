"""wtc.sr — symbolic regression: the exact simple formula behind a small function's samples.

Built for the sub-MLPs of a Discrete Transformer: 1-3 scalar inputs (bits, small integers or
reals), 10^3-10^4 samples of an approximate network output, and a simple exact formula to find
(a + b - 2ab, max(a, b), a*b, 100 - 4.905 t^2, relu(a - b), exp(-0.5 x), ...) -- or an honest
"nothing simple fits". Python + numpy + sympy, the screen's loops in wtc._C (numba: their
reference); no Julia.

Functional entry point (what the extraction code calls)::

    from wtc import sr
    f = sr.fit(X, y, names=("a", "b"), tol=None, *, max_complexity=20, operators=None,
               time_limit=None, random_state=0, sample_weight=None)   # -> sr.Fit
    f.expr          # sympy expression, simplified, exact rational constants (981/200 for 4.905)
    f.equation      # readable text: '100 - 4.905*t**2'
    f.exact         # True when rmse over all points <= f.tolerance (the simplest such formula)
    f.complexity    # node count of the formula as found
    f.loss, f.rmse, f.max_abs_err, f.r2
    f.tolerance     # the absolute rmse a formula had to reach; f.noise, f.noise_method say why
    f.candidates    # Pareto table: Rows (complexity, loss, score, equation, expr, passes)
    f.note          # why it is not exact, or other caveats ('' when none)
    f.predict(X)    # evaluate the formula

X is (n, k) or (n,), k <= 10 (the search is sized for 1-3); y is (n,). ``tol`` is the relative
rms error a formula may have (rmse <= tol * rms(y)); with ``tol=None`` it is 1.3 x the noise
standard deviation estimated from the data itself (replicated inputs, else local quadratic fits),
plus 1e-9 * rms(y) for noise-free data. "exact" means within the tolerance in rms *and* on every
point (|error| <= 6 x tolerance); when the tolerance rests on a local noise estimate, the
residuals must also look like noise (neighbours must not predict them), and a target on a lattice
that moves by whole steps between neighbours (floor(x/3), x % 3 on integers) is taken as exact
data. A network's smooth approximation error is invisible to these estimates: pass ``tol`` when
you know the error level. Bad input (NaN/inf, shape mismatch, fewer than 8 points, k > 10, bad or
reserved names such as 'sin' or 'pi', max_complexity outside [1, 60], a bad time_limit,
random_state, tol or operators) raises SRError (a ValueError) naming the problem.

Estimator (sklearn / PySR style)::

    m = sr.SymbolicRegressor(max_complexity=20, operators=None, tol=None, variable_names=None,
                             backend="builtin", random_state=0, time_limit=None).fit(X, y)
    m.predict(X); m.sympy(); m.best_; m.equations_   # a DataFrame (pandas installed; else a list of
                                                     # dicts): complexity, loss, score, equation,
                                                     # sympy_format, lambda_format, passes
    m.fit(df, y, sample_weight=w)   # a DataFrame's column names name the variables; weighted loss
    m.sympy(i); m.latex(i); m.get_best(i); m.pytorch(i)   # row i of equations_ (None: the selected)
    m.fit(X, Y)                     # Y (n, k): one search per output; equations_ a list of k tables,
                                    # predict (n, k), sympy() a list, index a list of k row indices
``backend='pysr'`` runs PySR instead (imported lazily, only when PySR, juliacall and a Julia
executable are installed; see ``sr.pysr_available()``); otherwise it raises BackendUnavailable
naming what is missing.

How the builtin engine works (one module each):
- expr: expression trees (nested tuples), numpy evaluation, node count, sympy conversion;
- enumeration: bottom-up enumeration by node count over the k inputs and the constant 1, with
  semantic dedup by hashing rounded values on probe points (data + off-distribution points);
- screen, kernels: y ~ theta0 + sum of up to 3 enumerated terms, all pairs and many triples
  screened in closed form from one Gram matrix (wtc._C.screen; numba_eval, the reference);
- fitting, numbers: refit on all points, each coefficient snapped to the simplest number within
  3 standard errors (integers, short decimals, Stern-Brocot fractions, pi/e/sqrt(2)/log(2)
  multiples), the rest refit;
- transforms: the same for 1/y and y^2 (a*b/(a + b), sqrt(a^2 + b^2));
- inner: constants inside nonlinearities (exp(-0.5 x), sin(2x + 1), x**0.75, 1/(1 + 0.3 x^2)) by
  variable projection: coarse grid, Levenberg-Marquardt, snapping;
- search: operator sets widened only while nothing simple passes: {+,-,*,square} ->
  +{/,max,min,abs,relu} -> +{neg,sqrt,exp,log,sin,cos,tanh}; then transforms, inner constants
  (with explicit compositions u(s), 1/s, x/s, x*u(s) of small polynomial terms: log(1 + a*b));
  on integer inputs with an integer (or lattice) target an integer level comes second:
  x % k, x // k, (a >= b), (a == b) with terms or small constants, max/min/abs, a threshold
  pass (s >= c) and, for at most 64 distinct inputs, an exact-table pass; printed as Python
  (x % 3, x // 3, (a >= b) -> (1 if a >= b else 0) in source);
- select: smallest complexity within tolerance (ties: fewer constant digits), Pareto table,
  scores, sympy simplification; on 0/1 inputs the multilinear canonical form (x**2 == x).
"""
from wtc.sr.api import Fit, fit
from wtc.sr.estimator import NotFittedError, SymbolicRegressor
from wtc.sr.pysr_backend import BackendUnavailable
from wtc.sr.pysr_backend import availability as _pysr_availability
from wtc.sr.pareto import Row


def pysr_available() -> tuple[bool, str]:
    """(usable, what is missing) for backend='pysr', decided without importing PySR."""
    return _pysr_availability()


__all__ = ["Fit", "Row", "fit", "SymbolicRegressor", "NotFittedError", "BackendUnavailable",
           "pysr_available"]

"""A scikit-learn / PySR style estimator around :func:`wtc.sr.fit` (and the optional PySR backend)."""
from __future__ import annotations

from wtc.errors import WtcError

import numpy as np
import sympy as sp

from wtc.sr.api import DEFAULT_MAX_COMPLEXITY, Fit, fit
from wtc.errors import SRError


class NotFittedError(WtcError, RuntimeError):
    """predict/sympy/equations_ used before fit."""


class SymbolicRegressor:
    """Symbolic regression with the usual estimator interface.

    SymbolicRegressor(max_complexity=20, operators=None, tol=None, variable_names=None,
                      backend='builtin', random_state=0, time_limit=None)
      operators    None or 'auto': staged operator sets ({+,-,*,square} -> +{/,max,min,abs,relu}
                   -> +{neg,sqrt,exp,log,sin,cos,tanh}); or a list of names (add sub mul div max
                   min abs relu sq neg sqrt exp log sin cos tanh, or + - * /): one fixed set
      tol          relative rms error a formula may have (rmse <= tol * rms(y)); None: estimated
                   from the data's own noise
      backend      'builtin' (this package) or 'pysr' (needs PySR and Julia installed)
    After fit: ``best_`` (dict: equation, complexity, loss, rmse, max_abs_err, r2, exact),
    ``equations_`` (list of dicts: complexity, loss, score, equation, sympy, passes),
    ``fit_`` (the full :class:`wtc.sr.Fit`), ``sympy()``, ``predict(X)``.
    """

    def __init__(self, max_complexity: int = DEFAULT_MAX_COMPLEXITY, operators=None, tol: float | None = None,
                 variable_names=None, backend: str = "builtin", random_state: int | None = 0,
                 time_limit: float | None = None):
        self.max_complexity = max_complexity
        self.operators = operators
        self.tol = tol
        self.variable_names = variable_names
        self.backend = backend
        self.random_state = random_state
        self.time_limit = time_limit

    # sklearn's clone/get_params protocol, without depending on sklearn
    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in ("max_complexity", "operators", "tol", "variable_names",
                                              "backend", "random_state", "time_limit")}

    def set_params(self, **params) -> SymbolicRegressor:
        for k, v in params.items():
            if k not in self.get_params():
                raise SRError(f"unknown parameter {k!r} for SymbolicRegressor")
            setattr(self, k, v)
        return self

    def fit(self, X, y) -> SymbolicRegressor:
        if self.backend == "builtin":
            self.fit_: Fit = fit(X, y, names=self.variable_names, tol=self.tol,
                                 max_complexity=self.max_complexity, operators=self.operators,
                                 time_limit=self.time_limit, random_state=self.random_state)
        elif self.backend == "pysr":
            from wtc.sr.pysr_backend import fit_pysr  # lazy: importing PySR starts Julia
            self.fit_ = fit_pysr(X, y, names=self.variable_names, tol=self.tol,
                                 max_complexity=self.max_complexity, operators=self.operators,
                                 time_limit=self.time_limit, random_state=self.random_state)
        else:
            raise SRError(f"backend must be 'builtin' or 'pysr', got {self.backend!r}")
        f = self.fit_
        self.best_ = {"equation": f.equation, "complexity": f.complexity, "loss": f.loss, "rmse": f.rmse,
                      "max_abs_err": f.max_abs_err, "r2": f.r2, "exact": f.exact, "tolerance": f.tolerance}
        self.equations_ = [{**r.as_dict(), "sympy": r.expr} for r in f.candidates]
        self.n_features_in_ = len(f.names)
        self.feature_names_in_ = np.array(f.names)
        return self

    def _check(self) -> Fit:
        if not hasattr(self, "fit_"):
            raise NotFittedError("this SymbolicRegressor is not fitted yet: call fit(X, y) first")
        return self.fit_

    def predict(self, X) -> np.ndarray:
        return self._check().predict(X)

    def sympy(self) -> sp.Expr:
        """The selected formula, simplified."""
        return self._check().expr

    def score(self, X, y) -> float:
        """R^2 on (X, y), as sklearn regressors do."""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        r = y - self.predict(X)
        sst = float(np.sum((y - y.mean()) ** 2))
        return 1.0 - float(r @ r) / sst if sst > 0 else float(np.allclose(r, 0))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"SymbolicRegressor({args})"

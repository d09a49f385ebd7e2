"""A scikit-learn / PySR style estimator around :func:`wtc.sr.fit` (and the optional PySR backend)."""
from __future__ import annotations

from wtc.errors import WtcError

import numpy as np
import sympy as sp

from wtc.arguments import no_unknown_keywords
from wtc.sr.api import DEFAULT_MAX_COMPLEXITY, Fit, SRArgumentError, fit
from wtc.errors import SRError
from wtc.sr.data import SRDataTypeError
from wtc.tasks.limits import plain_numbers


class NotFittedError(WtcError, ValueError, AttributeError):
    """predict/sympy/equations_ used before fit (a ValueError and AttributeError, as scikit-learn's)."""


def _conversion_warning():
    try:
        from sklearn.exceptions import DataConversionWarning
        return DataConversionWarning
    except ImportError:
        return UserWarning


def _as_2d(X, what: str = "X") -> np.ndarray:
    """X as a 2-D float array; 1-D and scalar inputs are refused as scikit-learn does."""
    if hasattr(X, "tocsr") or hasattr(X, "todense"):
        raise SRError(f"{what} is a sparse matrix: sparse input is not supported, pass a dense array")
    X = plain_numbers(X, what, SRError)       # text ('1' -> 1.0), dates, masked entries
    try:
        a = np.asarray(X)
    except (TypeError, ValueError) as e:
        raise SRError(f"{what} must be a numeric array: {e}") from None
    if a.dtype.kind == "c":
        raise SRError(f"{what} is complex (Complex data not supported)")
    if a.ndim != 2:
        raise SRError(f"Expected a 2D array for {what}, got shape {a.shape}: Reshape your data with "
                      "X.reshape(-1, 1) for a single feature or X.reshape(1, -1) for a single sample")
    try:
        a = a.astype(np.float64)
    except TypeError as e:
        raise SRDataTypeError(f"{what} must be a numeric array: {e}") from None
    except ValueError as e:
        raise SRError(f"{what} must be a numeric array: {e}") from None
    return a


_NOT_FITTED = []


def _not_fitted_error() -> type:
    """NotFittedError, also scikit-learn's NotFittedError when scikit-learn is installed."""
    if not _NOT_FITTED:
        try:
            from sklearn.exceptions import NotFittedError as SkNotFitted
            _NOT_FITTED.append(type("NotFittedError", (NotFittedError, SkNotFitted), {"__module__": __name__}))
        except ImportError:
            _NOT_FITTED.append(NotFittedError)
    return _NOT_FITTED[0]


class SymbolicRegressor:
    """Symbolic regression with the usual estimator interface.

    SymbolicRegressor(max_complexity=20, operators=None, tol=None, variable_names=None,
                      backend='builtin', random_state=0, time_limit=None)
      operators    None or 'auto': staged operator sets ({+,-,*,square} -> +{/,max,min,abs,relu}
                   -> +{neg,sqrt,exp,log,sin,cos,tanh}; integer data also get mod, floordiv, ge,
                   eq); or a list of names (add sub mul div max min abs relu sq neg sqrt exp log
                   sin cos tanh mod floordiv ge eq, or + - * / % // >= ==): one fixed set
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

    _estimator_type = "regressor"  # scikit-learn < 1.6

    def __sklearn_tags__(self):
        """scikit-learn >= 1.6 estimator tags (imported only when scikit-learn asks)."""
        from sklearn.utils import InputTags, RegressorTags, Tags, TargetTags
        return Tags(estimator_type="regressor", target_tags=TargetTags(required=True),
                    transformer_tags=None, classifier_tags=None, regressor_tags=RegressorTags(),
                    input_tags=InputTags())

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

    def fit(self, X, y=None, **fit_params) -> SymbolicRegressor:
        if "sample_weight" in fit_params:
            raise SRArgumentError("SymbolicRegressor.fit() does not take sample_weight: wtc's SR engine fits "
                                  "every sample with equal weight")
        no_unknown_keywords("SymbolicRegressor.fit() has no argument", fit_params, ("X", "y"), SRArgumentError)
        if y is None:
            raise SRError("SymbolicRegressor requires y to be passed, but the target y is None")
        X = _as_2d(X)
        y_arr = np.asarray(y) if not (hasattr(y, "tocsr") or hasattr(y, "todense")) else y
        if isinstance(y_arr, np.ndarray) and y_arr.ndim == 2 and y_arr.shape[1] == 1:
            import warnings
            warnings.warn("A column-vector y was passed when a 1d array was expected; using y.ravel()",
                          _conversion_warning(), stacklevel=2)
            y = y_arr.ravel()
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
            raise _not_fitted_error()("this SymbolicRegressor is not fitted yet: call fit(X, y) first")
        return self.fit_

    def predict(self, X) -> np.ndarray:
        f = self._check()
        X = _as_2d(X)
        if X.shape[1] != len(f.names):
            raise SRError(f"X has {X.shape[1]} features, but SymbolicRegressor is expecting "
                          f"{len(f.names)} features as input")
        if not np.all(np.isfinite(X)):
            raise SRError("X contains NaN or infinity; predict needs finite inputs")
        return f.predict(X)

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

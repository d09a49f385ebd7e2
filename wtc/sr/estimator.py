"""A scikit-learn / PySR style estimator around :func:`wtc.sr.fit` (and the optional PySR backend)."""
from __future__ import annotations

import time

import numpy as np

from wtc.arguments import no_unknown_keywords
from wtc.errors import SRError, WtcError
from wtc.sr import equations as eqs
from wtc.sr.api import DEFAULT_MAX_COMPLEXITY, Fit, SRArgumentError, check_moduli, check_options, fit
from wtc.sr.data import SRDataTypeError, check_names, check_weights
from wtc.tasks.limits import plain_numbers


class NotFittedError(WtcError, ValueError, AttributeError):
    """predict/sympy/equations_ used before fit (a ValueError and AttributeError, as scikit-learn's)."""


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


def _column_names(X) -> tuple | None:
    """X's column names when X is a table whose columns are all strings (a pandas DataFrame), as
    scikit-learn reads feature names; None otherwise (arrays, integer column labels)."""
    cols = getattr(X, "columns", None)
    if cols is None or hasattr(X, "tocsr"):
        return None
    cols = list(cols)
    return tuple(cols) if cols and all(isinstance(c, str) for c in cols) else None


class SymbolicRegressor:
    """Symbolic regression with the usual estimator interface (scikit-learn and PySR conventions).

    SymbolicRegressor(max_complexity=20, operators=None, tol=None, variable_names=None,
                      backend='builtin', random_state=0, time_limit=None, moduli=())
      operators    None or 'auto': staged operator sets ({+,-,*,square} -> +{/,max,min,abs,relu}
                   -> +{neg,sqrt,exp,log,sin,cos,tanh}; integer data also get mod, floordiv, ge,
                   eq); or a list of names (add sub mul div max min abs relu sq neg sqrt exp log
                   sin cos tanh mod floordiv ge eq, or + - * / % // >= ==): one fixed set
      tol          relative rms error a formula may have (rmse <= tol * rms(y)); None: estimated
                   from the data's own noise
      variable_names  names of X's columns in the equations; default: a DataFrame's column
                   names, else x0, x1, ... (fit(..., variable_names=) overrides both)
      backend      'builtin' (this package) or 'pysr' (needs PySR and Julia installed)
      time_limit   seconds for the whole fit, shared among the outputs
      moduli       whole numbers the integer operators may take as right operand past 2..10
                   (builtin backend): (15,) makes `s % 15` a formula; () or None: none
    fit(X, y, sample_weight=None, *, variable_names=None, weights=None): y (n,) or (n, k); k > 1
    runs one search per output. sample_weight (PySR: weights) scales each point's share of the
    loss; points of weight 0 are left out.
    After fit: ``equations_`` (the Pareto table: a DataFrame with columns complexity, loss, score,
    equation, sympy_format, lambda_format, passes when pandas is installed, else a list of dicts;
    with k outputs a list of k tables), ``best_`` (dict: equation, complexity, loss, rmse,
    max_abs_err, r2, exact, tolerance), ``fit_`` (the full :class:`wtc.sr.Fit`; lists with k
    outputs), ``feature_names_in_``, ``n_features_in_``, ``nout_``.
    Methods (``index``: a row of equations_, None: the selected formula; with k outputs a list
    of k indices, and the answers are lists): ``predict(X, index=None)``, ``sympy(index=None)``,
    ``latex(index=None, precision=None)``, ``get_best(index=None)``, ``pytorch(index=None)``
    (a torch.nn.Module), ``score(X, y)``.
    """

    def __init__(self, max_complexity: int = DEFAULT_MAX_COMPLEXITY, operators=None, tol: float | None = None,
                 variable_names=None, backend: str = "builtin", random_state: int | None = 0,
                 time_limit: float | None = None, moduli=()):
        self.max_complexity = max_complexity
        self.operators = operators
        self.tol = tol
        self.variable_names = variable_names
        self.backend = backend
        self.random_state = random_state
        self.time_limit = time_limit
        self.moduli = moduli

    _estimator_type = "regressor"  # scikit-learn < 1.6

    def __sklearn_tags__(self):
        """scikit-learn >= 1.6 estimator tags (imported only when scikit-learn asks)."""
        from sklearn.utils import InputTags, RegressorTags, Tags, TargetTags
        return Tags(estimator_type="regressor",
                    target_tags=TargetTags(required=True, multi_output=True, single_output=True),
                    transformer_tags=None, classifier_tags=None, regressor_tags=RegressorTags(),
                    input_tags=InputTags())

    def _more_tags(self):  # scikit-learn < 1.6
        return {"multioutput": True}

    # sklearn's clone/get_params protocol, without depending on sklearn
    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in ("max_complexity", "operators", "tol", "variable_names",
                                              "backend", "random_state", "time_limit", "moduli")}

    def set_params(self, **params) -> SymbolicRegressor:
        for k, v in params.items():
            if k not in self.get_params():
                raise SRError(f"unknown parameter {k!r} for SymbolicRegressor")
            setattr(self, k, v)
        return self

    # ------------------------------------------------------------------------------------- fit
    def fit(self, X, y=None, sample_weight=None, *, variable_names=None, weights=None,
            **fit_params) -> SymbolicRegressor:
        no_unknown_keywords("SymbolicRegressor.fit() has no argument", fit_params,
                            ("X", "y", "sample_weight", "variable_names", "weights"), SRArgumentError)
        if y is None:
            raise SRError("SymbolicRegressor requires y to be passed, but the target y is None")
        if weights is not None:
            if sample_weight is not None:
                raise SRArgumentError("pass sample_weight or weights (PySR's name for it), not both")
            sample_weight = weights
        columns = _column_names(X)
        X = _as_2d(X)
        if sample_weight is not None:   # named before X's other limits (wtc.sr.fit checks it again)
            check_weights(sample_weight, len(X))
        names = self._variable_names(columns, variable_names, X.shape[1])
        ys, multi = _outputs(y)
        if self.backend not in ("builtin", "pysr"):
            raise SRError(f"backend must be 'builtin' or 'pysr', got {self.backend!r}")
        if self.backend == "builtin":   # refused before any output's search
            check_options(max_complexity=self.max_complexity, time_limit=self.time_limit,
                          random_state=self.random_state, tol=self.tol, operators=self.operators)
            check_moduli(self.moduli)
        elif check_moduli(self.moduli):
            raise SRError(f"moduli={self.moduli!r} is an option of the builtin backend; "
                          "PySR takes its constants itself")
        started = time.perf_counter()
        fits = []
        for j, yj in enumerate(ys):
            limit = self.time_limit
            if _is_real(limit) and limit > 0:  # the whole fit's limit, shared by the outputs still to fit
                limit = max((limit - (time.perf_counter() - started)) / (len(ys) - j), 1e-3)
            fits.append(self._fit_one(X, yj, names, limit, sample_weight))
        tables = [eqs.table(f) for f in fits]
        self.nout_ = len(fits)
        self.fit_ = fits if multi else fits[0]
        self.best_ = [_best_dict(f) for f in fits] if multi else _best_dict(fits[0])
        self.equations_ = tables if multi else tables[0]
        self.n_features_in_ = X.shape[1]
        self.feature_names_in_ = np.array(columns if columns is not None else fits[0].names, dtype=object)
        self._names_from_frame = columns is not None
        return self

    def _variable_names(self, columns, variable_names, k: int):
        """The names the equations use: fit's variable_names, else the constructor's, else X's
        column names, else None (x0, x1, ...). Bad names are refused by wtc.sr.fit."""
        names = variable_names if variable_names is not None else self.variable_names
        if names is not None:
            return names
        if columns is not None:
            try:
                return check_names(columns, k)
            except SRError as e:
                raise SRError(f"{e} (X's column names are the variable names; pass variable_names= "
                              "to name them otherwise)") from None
        return None

    def _fit_one(self, X, y, names, time_limit, sample_weight) -> Fit:
        args = dict(names=names, tol=self.tol, max_complexity=self.max_complexity, operators=self.operators,
                    time_limit=time_limit, random_state=self.random_state, sample_weight=sample_weight)
        if self.backend == "builtin":
            return fit(X, y, **args, moduli=self.moduli)
        from wtc.sr.pysr_backend import fit_pysr  # lazy: importing PySR starts Julia
        return fit_pysr(X, y, **args)

    # --------------------------------------------------------------------------------- answers
    def _check(self) -> Fit | list:
        if not hasattr(self, "fit_"):
            raise _not_fitted_error()("this SymbolicRegressor is not fitted yet: call fit(X, y) first")
        return self.fit_

    def get_best(self, index=None):
        """The selected formula's row (index None) or row ``index`` of equations_: a pandas Series
        (a dict without pandas) with the table's columns; with several outputs a list of rows,
        ``index`` then a list of row indices, one per output."""
        fits = self._check()
        if isinstance(fits, list):
            return [self._row(f, t, i, j) for j, (f, t, i) in
                    enumerate(zip(fits, self.equations_, eqs.per_output(index, len(fits))))]
        return self._row(fits, self.equations_, index, None)

    @staticmethod
    def _row(f: Fit, tab, index, output):
        return eqs.best_row(f, tab) if index is None else eqs.row_at(tab, index, output)

    def _each(self, index, key: str):
        rows = self.get_best(index)
        return [r[key] for r in rows] if isinstance(rows, list) else rows[key]

    def sympy(self, index=None):
        """The selected formula (simplified), or row ``index`` of equations_ (PySR's sympy(index));
        a list with several outputs."""
        return self._each(index, "sympy_format")

    def latex(self, index=None, precision: int | None = None):
        """LaTeX of sympy(index); ``precision``: significant digits of floating constants (None:
        all the snapped constants have). A list with several outputs."""
        exprs = self.sympy(index)
        return [eqs.latex(e, precision) for e in exprs] if isinstance(exprs, list) else eqs.latex(exprs, precision)

    def pytorch(self, index=None):
        """sympy(index) as a torch.nn.Module: forward(X (n, d)) == predict(X, index) in X's dtype;
        non-integer constants are trainable parameters. A list with several outputs."""
        from wtc.sr.torch_export import to_torch  # lazy: torch loads here
        exprs = self.sympy(index)
        names = tuple(str(s) for s in self._names())
        return [to_torch(e, names) for e in exprs] if isinstance(exprs, list) else to_torch(exprs, names)

    def _names(self) -> tuple:
        fits = self._check()
        return (fits[0] if isinstance(fits, list) else fits).names

    def predict(self, X, index=None) -> np.ndarray:
        """Values of the selected formula (or of row ``index``) on X: (n,), or (n, k) with k outputs."""
        fits = self._check()
        self._check_feature_names(X)
        X = _as_2d(X)
        if X.shape[1] != self.n_features_in_:
            raise SRError(f"X has {X.shape[1]} features, but SymbolicRegressor is expecting "
                          f"{self.n_features_in_} features as input")
        if not np.all(np.isfinite(X)):
            raise SRError("X contains NaN or infinity; predict needs finite inputs")
        if isinstance(fits, list):
            rows = eqs.per_output(index, len(fits))
            return np.stack([self._predict_one(f, t, i, j, X) for j, (f, t, i) in
                             enumerate(zip(fits, self.equations_, rows))], axis=1)
        return self._predict_one(fits, self.equations_, index, None, X)

    @staticmethod
    def _predict_one(f: Fit, tab, index, output, X) -> np.ndarray:
        return f.predict(X) if index is None else eqs.row_at(tab, index, output)["lambda_format"](X)

    def _check_feature_names(self, X) -> None:
        """scikit-learn's rules: a DataFrame's column names must be those seen in fit; a plain array
        after a DataFrame fit, or a DataFrame after an array fit, only warns."""
        import warnings
        columns = _column_names(X)
        if getattr(self, "_names_from_frame", False):
            if columns is None:
                warnings.warn("X does not have valid feature names, but SymbolicRegressor was fitted with "
                              "feature names", UserWarning, stacklevel=3)
            elif list(columns) != list(self.feature_names_in_):
                raise SRError(f"The feature names should match those that were passed during fit: expected "
                              f"{list(self.feature_names_in_)}, got {list(columns)}")
        elif columns is not None:
            warnings.warn("X has feature names, but SymbolicRegressor was fitted without feature names",
                          UserWarning, stacklevel=3)

    def score(self, X, y) -> float:
        """R^2 on (X, y), as sklearn regressors do (with k outputs: the mean over the outputs)."""
        pred = self.predict(X)
        y = np.asarray(y, dtype=np.float64).reshape(pred.shape)
        r2 = []
        for yj, pj in zip(y.T if y.ndim == 2 else [y], pred.T if pred.ndim == 2 else [pred]):
            r = yj - pj
            sst = float(np.sum((yj - yj.mean()) ** 2))
            r2.append(1.0 - float(r @ r) / sst if sst > 0 else float(np.allclose(r, 0)))
        return float(np.mean(r2))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"SymbolicRegressor({args})"


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _outputs(y) -> tuple[list, bool]:
    """The targets one search each fits, and whether y had several outputs. y (n,) and y (n, 1)
    are one output (PySR's convention); y (n, k) is k outputs, fitted column by column."""
    if hasattr(y, "tocsr") or hasattr(y, "todense"):
        return [y], False              # wtc.sr.fit refuses it, naming it
    try:
        a = np.asarray(y)
    except (TypeError, ValueError):
        return [y], False              # ragged: wtc.sr.fit says so
    if a.ndim == 2 and a.shape[1] > 1:
        return [a[:, j] for j in range(a.shape[1])], True
    if a.ndim == 2 and a.shape[1] == 1:
        return [a[:, 0]], False
    if a.ndim > 2:
        raise SRError(f"y must have shape (n,) or (n, k) (k outputs), got shape {a.shape}")
    return [y], False


def _best_dict(f: Fit) -> dict:
    return {"equation": f.equation, "complexity": f.complexity, "loss": f.loss, "rmse": f.rmse,
            "max_abs_err": f.max_abs_err, "r2": f.r2, "exact": f.exact, "tolerance": f.tolerance}

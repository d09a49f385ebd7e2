"""SymbolicRegressor passes scikit-learn's estimator checks (skipped without scikit-learn)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from wtc import sr

sklearn = pytest.importorskip("sklearn")


def test_check_estimator():
    from sklearn.utils.estimator_checks import check_estimator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(sr.SymbolicRegressor(max_complexity=3), on_fail=None, expected_failed_checks={
            # its data have 30 input columns; the builtin engine takes at most 10 (the equivalence of
            # weights and repeated or removed rows is tested in test_sr_pysr_api.py)
            "check_sample_weight_equivalence_on_dense_data": "30 input columns, more than the builtin engine takes"})
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed, failed
    assert any(r["check_name"] == "check_regressor_multioutput" and r["status"] == "passed" for r in results)
    assert sum(r["status"] == "passed" for r in results) >= 40


def test_sklearn_errors_are_wtc_errors():
    from sklearn.exceptions import NotFittedError as SkNotFitted
    m = sr.SymbolicRegressor()
    with pytest.raises(SkNotFitted):
        m.predict(np.zeros((3, 1)))
    with pytest.raises(sr.NotFittedError):
        m.predict(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="Reshape"):
        m.fit(np.arange(10.0), np.arange(10.0))
    with pytest.raises(ValueError, match="requires y"):
        m.fit(np.zeros((10, 1)))
    X = np.arange(20.0).reshape(-1, 1)
    m.fit(X, 2 * X[:, 0])
    with pytest.raises(ValueError, match="features"):
        m.predict(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        m.predict(np.full((3, 1), np.nan))

"""wtc.studies.linear_probe: a convex, deterministic fit scored on held-out rows."""
import numpy as np
import pytest

from wtc.errors import StudyError
from wtc.studies import linear_probe


def _planted(rng, n, d=16, k=5):
    centres = 4.0 * rng.standard_normal((k, d))
    y = rng.integers(0, k, n)
    return centres[y] + rng.standard_normal((n, d)), y


def test_a_linearly_readable_label_is_read_on_fresh_rows():
    x, y = _planted(np.random.default_rng(0), 900)
    r = linear_probe.fit(x[:600], y[:600], x[600:], y[600:], n_classes=5)
    assert r["test_accuracy"] > 0.97 and r["train_accuracy"] > 0.97
    assert (r["n_train"], r["n_test"], r["classes"]) == (600, 300, 5)
    assert r["chance"] == pytest.approx(float((y[600:] == np.bincount(y[:600]).argmax()).mean()))


def test_random_labels_stay_near_chance_on_test_rows_and_the_fit_is_deterministic():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1200, 32))
    y = rng.integers(0, 4, 1200)
    r = linear_probe.fit(x[:800], y[:800], x[800:], y[800:], n_classes=4)
    assert r["test_accuracy"] < 0.25 + 0.08 < r["train_accuracy"]      # memorised, not read
    assert linear_probe.fit(x[:800], y[:800], x[800:], y[800:], n_classes=4) == r


def test_a_constant_feature_is_harmless():
    rng = np.random.default_rng(2)
    x, y = _planted(rng, 400, d=4, k=3)
    x = np.concatenate([x, np.full((400, 1), 7.0)], 1)
    r = linear_probe.fit(x[:300], y[:300], x[300:], y[300:], n_classes=3)
    assert np.isfinite(r["train_loss"]) and r["test_accuracy"] > 0.9


@pytest.mark.parametrize("change, match", [
    (dict(train_y=np.zeros(9, int)), "labels"),
    (dict(test_x=np.zeros((5, 3))), "features"),
    (dict(train_y=np.full(10, 4)), r"\[0, 3\)"),
    (dict(train_x=np.full((10, 4), np.nan)), "NaN"),
    (dict(n_classes=1), "n_classes"),
    (dict(train_x=np.zeros((0, 4)), train_y=np.zeros(0, int)), "no rows"),
    (dict(l2=-1.0), "l2"),
])
def test_bad_input_is_named(change, match):
    args = dict(train_x=np.zeros((10, 4)), train_y=np.zeros(10, int), test_x=np.zeros((5, 4)),
                test_y=np.zeros(5, int), n_classes=3)
    with pytest.raises(StudyError, match=match):
        linear_probe.fit(**{**args, **change})

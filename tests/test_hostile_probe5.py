"""Hostile-input probe 5 ("Trust, round 5", part A): the cases it found, as regression tests. Each
asserts the error type (a WtcError) and that the message names the problem, or the right answer
where the input is legitimate."""
import numpy as np
import pytest
import torch

import wtc
from wtc.errors import SRError, TaskError

RNG = np.random.default_rng(0)
X_REC = RNG.integers(0, 10, (200, 6))              # recorded inputs with enough distinct sequences
Y_REC = np.cumsum(X_REC, axis=1) % 7


def _task(target, sample=None):
    sample = sample or (lambda rng, n: rng.integers(0, 2, (n, 4)))
    return wtc.Task("probe5", sample, target, seq_len=4)


# ----------------------------------------------------------------------------------- 1. not numbers
@pytest.mark.parametrize("bad, match", [
    (np.ma.masked_array(X_REC, mask=X_REC == 3), r"masked array .*filled"),
    (X_REC.astype("datetime64[s]"), "dates or durations"),
    (X_REC.astype("timedelta64[s]"), "dates or durations"),
    (X_REC.astype(str), "text or bytes"),
    (X_REC.astype(bytes), "text or bytes"),
    (X_REC.astype(str).astype(object), "text or bytes"),
    (X_REC.astype(str).tolist(), "text or bytes"),
])
def test_from_arrays_refuses_what_is_not_numbers(bad, match):
    with pytest.raises(TaskError, match=f"task 'data': inputs (is|holds).*{match}"):
        wtc.Task.from_arrays(bad, Y_REC)
    with pytest.raises(TaskError, match=match):
        wtc.Task.from_arrays(X_REC, bad)


def test_from_arrays_takes_a_masked_array_with_nothing_masked():
    a = wtc.Task.from_arrays(np.ma.masked_array(X_REC, mask=False), Y_REC)
    b = wtc.Task.from_arrays(X_REC, Y_REC)
    assert a.fingerprint() == b.fingerprint()


def test_task_refuses_a_target_or_sample_of_strings():
    t = _task(lambda x: np.where(x > 0, "1", "0"))
    with pytest.raises(TaskError, match=r"task 'probe5': target is not numeric: it holds text"):
        t.batch(0, 4)
    t = _task(lambda x: x, sample=lambda rng, n: rng.integers(0, 2, (n, 4)).astype(str))
    with pytest.raises(TaskError, match=r"task 'probe5': sample is not numeric: it holds text"):
        t.draw(0, 4)


def test_program_refuses_strings():
    import sympy as sp

    from wtc.extraction.program import ProgramInputError
    from wtc.extraction.program import build_source
    prog = wtc.Program("demo", build_source("demo", 1, 1, ["x"], [], [sp.Symbol("x") * 2]), 2, 1, 1)
    for bad in (["nan", "inf"], [["nan", "inf"]], np.array([["1", "2"]], dtype=object)):
        with pytest.raises(ProgramInputError, match="is not numeric: it holds text"):
            prog(bad)
    np.testing.assert_array_equal(prog([[1.0, 2.0]]), [[2.0, 4.0]])


@pytest.mark.parametrize("X", [["1", "2"] * 5, np.array(["1", "2"] * 5, dtype=object), [b"1"] * 10])
def test_sr_fit_refuses_lists_and_object_arrays_of_text(X):
    import wtc.sr as sr
    with pytest.raises(SRError, match="X is not numeric: it holds text"):
        sr.fit(X, np.arange(10.0))
    with pytest.raises(SRError, match="y is not numeric: it holds text"):
        sr.fit(np.arange(10.0), X)


# ----------------------------------------------------------------------------------- 2. tensors with grad
def test_tensors_that_require_grad_are_read_as_data():
    xt = torch.tensor(X_REC, dtype=torch.float64, requires_grad=True)
    yt = torch.tensor(Y_REC, dtype=torch.float64, requires_grad=True)
    assert wtc.Task.from_arrays(xt, yt).fingerprint() == wtc.Task.from_arrays(X_REC, Y_REC).fingerprint()
    w = torch.ones((), requires_grad=True)
    t = _task(lambda x: torch.as_tensor(x, dtype=torch.float32) * w,
              sample=lambda rng, n: torch.tensor(rng.integers(0, 2, (n, 4)), dtype=torch.float32, requires_grad=True))
    x, y = t.batch(0, 5)
    np.testing.assert_array_equal(x[..., 0], y[..., 0])


# ----------------------------------------------------------------------------------- 3. SR names, subnormals
@pytest.mark.parametrize("name", ["gamma", "beta", "EulerGamma", "Catalan", "GoldenRatio", "E", "I", "pi", "oo",
                                  "zoo", "nan", "S", "N", "O", "Q", "zeta", "Lambda"])
def test_sr_refuses_names_sympy_reads_as_its_own(name):
    import wtc.sr as sr
    X = RNG.random((40, 2))
    with pytest.raises(SRError, match=f"variable name '{name}' is reserved"):
        sr.fit(X, X[:, 0] + X[:, 1], names=("a", name))


def test_sr_keeps_plain_names():
    import wtc.sr as sr
    X = RNG.random((40, 2))
    assert sr.fit(X, X[:, 0] + X[:, 1], names=("alpha", "mass")).equation == "alpha + mass"


def test_sr_names_subnormal_inputs():
    import wtc.sr as sr
    X = RNG.random((40, 2))
    with pytest.raises(SRError, match=r"X holds subnormal values .*rescale X"):
        sr.fit(X * 1e-310, X[:, 0] + X[:, 1])


# ----------------------------------------------------------------------------------- 11. float32 resolution
def test_from_arrays_refuses_integer_outputs_float32_cannot_resolve():
    with pytest.raises(TaskError, match=r"integer outputs reach 1000000009.*2\*\*24.*subtract an offset"):
        wtc.Task.from_arrays(X_REC, X_REC + 10**9)
    with pytest.raises(TaskError, match=r"distinct inputs 1000000000.0 and 1000000001.0 are the same number in float32"):
        wtc.Task.from_arrays(X_REC + 10**9, Y_REC)
    wtc.Task.from_arrays(X_REC, X_REC + 2**23)               # exact in float32: accepted
    wtc.Task.from_arrays(X_REC, X_REC + 10**9, output="real")  # a relative tolerance: accepted


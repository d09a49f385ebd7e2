"""wtc.lapack: numpy's lstsq / pinv refuse inf or NaN instead of handing them to OpenBLAS's LAPACK,
which spins forever on a matrix mixing inf with finite entries (numpy #32591). Each case runs in a
subprocess with a timeout, so a regression fails here instead of hanging the suite."""
import subprocess
import sys

import numpy as np
import pytest

from wtc import lapack


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("call", [
    "lapack.lstsq(A, np.ones(3))",
    "lapack.pinv(A)",
    "lapack.lstsq(np.ones((3, 3)), np.array([1.0, np.nan, 2.0]))",
])
def test_a_matrix_with_inf_is_refused_not_handed_to_lapack(call):
    done = _run("import numpy as np\nfrom wtc import lapack\n"
                "A = np.array([[np.inf, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])\n"
                f"try:\n    {call}\nexcept np.linalg.LinAlgError as exc:\n    print('refused:', exc)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: ") and "inf or NaN" in done.stdout


def test_a_weighted_fit_whose_gram_matrix_overflows_is_unusable():
    """wtc.sr's weighted least squares on finite columns whose F'F overflows (the case that hung a
    CI worker inside pinv): no fit, at once."""
    done = _run("import numpy as np\nfrom wtc.sr.fitting import _wls\n"
                "x = np.array([1.0, 2.0, 3.0, 4.0])\n"
                "F = np.stack([1e160 * x, np.ones(4), x ** 2], axis=1)\n"   # F'F[0, 0] = inf, the rest finite
                "print(_wls(F, x, np.ones(4)))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_finite_inputs_give_numpys_answers(rng):
    a, b = rng.standard_normal((20, 4)), rng.standard_normal(20)
    np.testing.assert_array_equal(lapack.lstsq(a, b), np.linalg.lstsq(a, b, rcond=None)[0])
    np.testing.assert_array_equal(lapack.pinv(a), np.linalg.pinv(a))

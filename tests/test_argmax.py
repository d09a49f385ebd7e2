"""wtc.extraction.argmax: decisions read as the argmax of whole-number scores of counts."""
import numpy as np
import pytest
import sympy as sp

from wtc.extraction.argmax import MAX_WEIGHT, ArgmaxReading, _whole, predict, read_argmax


def _counts(x: np.ndarray, k: int) -> np.ndarray:
    """(n, T) symbols -> (n * T, k) prefix counts of each symbol."""
    return np.stack([np.cumsum(x == v, axis=1) for v in range(k)], axis=-1).reshape(-1, k)


def _mode(counts: np.ndarray, ties: str) -> np.ndarray:
    """The most frequent symbol, ties to the smaller or the larger: the reference."""
    if ties == "smaller":
        return np.argmax(counts, axis=1).astype(float)
    return (counts.shape[1] - 1 - np.argmax(counts[:, ::-1], axis=1)).astype(float)


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("ties", ["smaller", "larger"])
def test_a_majority_vote_is_read_as_the_argmax_of_the_counts_and_holds_on_longer_sequences(k, ties):
    rng = np.random.default_rng(k)
    counts = _counts(rng.integers(0, k, (2000, 10)), k)
    names = tuple(f"n{v}" for v in range(k))
    reading = read_argmax(counts, _mode(counts, ties), names)
    assert reading is not None and reading.agreement == 1.0
    assert reading.ties == ties and reading.bias is None
    longer = _counts(np.random.default_rng(100 + k).integers(0, k, (500, 40)), k)   # counts never seen
    np.testing.assert_array_equal(predict(reading, longer), _mode(longer, ties))
    f = sp.lambdify([sp.Symbol(n) for n in names], reading.expr(), modules=["numpy"])
    np.testing.assert_array_equal(np.asarray(f(*longer.T), dtype=float), _mode(longer, ties))   # the emitted expression


def test_a_count_threshold_needs_a_bias_and_gets_one():
    rng = np.random.default_rng(0)
    counts = _counts(rng.integers(0, 2, (1000, 12)), 2)
    decisions = (counts[:, 1] >= 3).astype(float)
    reading = read_argmax(counts, decisions, ("n0", "n1"))
    assert reading is not None and reading.bias is not None
    np.testing.assert_array_equal(predict(reading, counts), decisions)
    assert predict(reading, np.array([[50, 2], [0, 3]])).tolist() == [0.0, 1.0]


def test_a_few_wrong_decisions_are_tolerated_only_down_to_min_agreement():
    rng = np.random.default_rng(1)
    counts = _counts(rng.integers(0, 3, (2000, 10)), 3)
    decisions = _mode(counts, "smaller")
    noisy = decisions.copy()
    flip = rng.choice(len(noisy), 40, replace=False)          # 0.2% of the decisions
    noisy[flip] = (noisy[flip] + 1) % 3
    reading = read_argmax(counts, noisy, ("n0", "n1", "n2"), min_agreement=0.99)
    assert reading is not None and 0.99 <= reading.agreement < 1.0
    np.testing.assert_array_equal(predict(reading, counts), decisions)   # the vote, not the noise
    assert reading.weights == ((1, 0, 0), (0, 1, 0), (0, 0, 1)) and reading.bias is None   # nor bent to it
    assert read_argmax(counts, noisy, ("n0", "n1", "n2")) is None          # min_agreement 1: refused


def test_what_no_argmax_of_counts_gives_is_refused():
    rng = np.random.default_rng(2)
    counts = _counts(rng.integers(0, 2, (1000, 12)), 2)
    assert read_argmax(counts, (counts[:, 1] % 3).astype(float), ("n0", "n1")) is None     # a residue
    assert read_argmax(counts, np.zeros(len(counts)), ("n0", "n1")) is None                # one class
    assert read_argmax(counts + 0.5, (counts[:, 1] > 2).astype(float), ("n0", "n1")) is None   # not whole
    with pytest.raises(ValueError, match="features must be"):
        read_argmax(counts, np.zeros(3), ("n0", "n1"))


def test_the_expression_takes_the_first_class_of_the_largest_score():
    reading = ArgmaxReading((2.0, 0.0, 1.0), ((0, 0, 1), (1, 0, 0), (0, 1, 0)), ("a", "b", "c"), None, 1.0)
    f = sp.lambdify(sp.symbols("a b c"), reading.expr(), modules=["numpy"])
    rows = np.array([[3, 3, 3], [5, 1, 5], [1, 4, 4], [0, 2, 1], [2, 0, 1]])
    want = predict(reading, rows)
    assert want.tolist() == [2.0, 2.0, 2.0, 1.0, 0.0]
    assert [float(f(*r)) for r in rows] == want.tolist()
    assert reading.ties == "the first of 2, 0, 1"


def test_weights_scale_to_the_smallest_whole_numbers_or_none():
    np.testing.assert_array_equal(_whole(np.array([0.5, -1.0, 0.25, 0.0])), [2, -4, 1, 0])
    assert _whole(np.zeros(3)) is None
    primes = [p for p in range(2, 64) if all(p % q for q in range(2, p))]
    assert _whole(np.array([1.0 / p for p in primes])) is None        # lcm ~1e26: no int64 overflow, refused
    assert max(abs(_whole(np.array([1 / 61, 1 / 59]))).tolist()) <= MAX_WEIGHT                   # 59, 61
    assert _whole(np.array([1 / 61, 1 / 59, 1 / 53])) is None                        # past MAX_WEIGHT

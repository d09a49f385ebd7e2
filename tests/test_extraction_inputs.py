"""extract / verify / Program / Discovery.save refuse what they cannot use, by name (probe 3)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import wtc
from wtc.discovery import Discovery, DiscoveryError
from wtc.dt import DTConfig
from wtc.errors import WtcError
from wtc.extraction import extract, verify
from wtc.extraction.program import ProgramInputError
from wtc.extraction.reader import ExtractionInputError
from wtc.extraction.verification import VerificationError

TINY = DTConfig(steps=40, hard_steps=10, polish_iters=5, precision_iters=5, replicas=1, max_attempts=1,
                eval_sequences=64, batch_size=32, workers=1, grow=False)


@pytest.fixture(scope="module")
def prev2_model():
    model, _ = wtc.train("prev2", TINY, progress=False)
    return model


def test_extract_refuses_another_tasks_model_and_non_models(prev2_model):
    with pytest.raises(ExtractionInputError, match="trained on task 'prev2', not on 'sum_last2'"):
        extract(prev2_model, "sum_last2")
    with pytest.raises(ExtractionInputError, match="DiscreteTransformer or a torch module built from wtc.dt.layers; torch.nn.Linear holds no DTLayers"):
        extract(torch.nn.Linear(2, 2), "prev2")


def test_verify_refuses_a_program_of_another_task_and_bad_models(prev2_model):
    program = extract(prev2_model, "prev2")
    with pytest.raises(VerificationError, match="read for task 'prev2', not 'sum_last2'"):
        verify(program, "sum_last2", n=64, seed=0)
    with pytest.raises(VerificationError, match="predict"):
        verify(program, "prev2", n=64, seed=0, model=torch.nn.Linear(2, 2))
    with pytest.raises(VerificationError, match="callable"):
        verify("def program(xs): return xs", "prev2", n=64, seed=0)
    assert verify(program, "prev2", n=64, seed=0).n == 64           # its own task still verifies
    assert verify(lambda x: np.zeros(np.shape(x)[:2]), "prev2", n=64, seed=0).n == 64   # any callable does


def test_program_refuses_other_shapes_and_text(prev2_model):
    program = extract(prev2_model, "prev2")
    for bad, match in ((np.zeros((2, 3, 2)), r"takes \(n, T, 1\)"), ("abc", "not a numeric array")):
        with pytest.raises(ProgramInputError, match=match) as err:
            program(bad)
        assert isinstance(err.value, (WtcError, ValueError))


def test_program_and_predict_refuse_complex_ragged_and_non_finite_inputs(prev2_model):
    """Probe 4: a complex input ran on its real part (silently wrong), NaN gave NaN outputs, an
    empty batch came back (0,) and ragged lists were numpy's raw ValueError; bfloat16 is exact in
    float32 and is taken."""
    from wtc.errors import ModelInputError

    program = extract(prev2_model, "prev2")
    x = wtc.tasks.get("prev2").draw(0, 4)[..., 0]
    for call, error in ((program, ProgramInputError), (prev2_model.predict, ModelInputError)):
        with pytest.raises(error, match="is complex"):
            call(x + 1j)
        with pytest.raises(error, match="not a numeric array"):
            call([[1, 2], [3]])
        with pytest.raises(error, match="nan|NaN"):
            call(np.full_like(x, np.nan, dtype=float))
        got = call(torch.tensor(x).bfloat16())
        assert np.array_equal(got, call(x))
    with pytest.raises(ProgramInputError, match=r"holds inf at index \(0, 3, 0\)"):
        bad = x.astype(float)
        bad[0, 3] = np.inf
        program(bad)
    assert program(x[:0]).shape == (0, x.shape[1])


def test_discovery_save_needs_a_directory(tmp_path):
    d = Discovery(wtc.tasks.get("prev2"), None, None, None, None, 0.0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiscoveryError, match="not a directory"):
        d.save(tmp_path / "file")
    with pytest.raises(DiscoveryError, match="directory path, got int"):
        d.save(3)
    assert (d.save(tmp_path / "out") / "summary.json").exists()


def test_verify_checks_twice_the_length_and_prefers_nothing_silently():
    from wtc.tasks.task import shift

    running_max = wtc.tasks.get("running_max")

    def window9(x):                                   # right for T = 10 only: a window, not the prefix
        out = x.copy()
        for d in range(1, 10):
            out = np.maximum(out, shift(x, d))
        return out

    short = verify(window9, running_max, n=300, seed=0)
    assert short.solved and short.holds_longer is False and short.longer["seq_len"] == 20
    assert "does NOT hold" in str(short)
    general = verify(lambda x: np.maximum.accumulate(x, axis=1), running_max, n=300, seed=0)
    assert general.solved and general.holds_longer is True
    fixed = verify(lambda x: np.zeros((len(x), 10)), "sum_last2", n=50, seed=0)   # raises at T = 20: reported
    assert fixed.holds_longer is False and "expected (n, 20, 1)" in fixed.longer["error"]
    assert verify(lambda x: x[:, :, 0] * 0, "free_fall_next", n=50, seed=0).holds_longer is None


def test_a_program_runs_at_any_length(prev2_model):
    program = extract(prev2_model, "prev2")
    x = np.arange(2 * 15, dtype=float).reshape(2, 15)
    assert program(x).shape == (2, 15)

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
    with pytest.raises(ExtractionInputError, match="DiscreteTransformer, got Linear"):
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
    for bad, match in ((np.zeros((2, 3)), r"takes \(n, 10, 1\)"), ("abc", "takes numbers")):
        with pytest.raises(ProgramInputError, match=match) as err:
            program(bad)
        assert isinstance(err.value, (WtcError, ValueError))


def test_discovery_save_needs_a_directory(tmp_path):
    d = Discovery(wtc.tasks.get("prev2"), None, None, None, None, 0.0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiscoveryError, match="not a directory"):
        d.save(tmp_path / "file")
    with pytest.raises(DiscoveryError, match="directory path, got int"):
        d.save(3)
    assert (d.save(tmp_path / "out") / "summary.json").exists()

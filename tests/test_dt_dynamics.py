"""The dt-dynamics study: the two moments read off training curves, and the study end to end."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from wtc.studies.dt_dynamics import DTDynamics, function_first, moments
from wtc.errors import StudyError


def curves(loss, sel, attn):
    n = len(loss)
    return {"step": np.arange(n) * 10, "tau": np.ones(n), "loss": np.asarray(loss, float),
            "metric": np.zeros(n), "sel_entropy": np.asarray(sel, float)[:, None],
            "attn_entropy": np.asarray(attn, float)[:, None]}


def test_moments_are_the_first_crossings():
    c = curves(loss=[1, 0.5, 0.009, 0.02, 0.001], sel=[1, 0.9, 0.5, 0.05, 0.01], attn=[2, 1, 0.5, 0.1, 0.1])
    m = moments(c)
    assert m == {"functional_step": 20, "structural_step": 30} and function_first(m) is True
    late = moments(curves(loss=[1, 0.5, 0.2, 0.1, 0.005], sel=[1, 0.05, 0.05, 0.05, 0.05], attn=[1, 0.1, 0.1, 0, 0]))
    assert late == {"functional_step": 40, "structural_step": 10} and function_first(late) is False
    assert function_first({"functional_step": 5, "structural_step": None}) is True
    assert function_first({"functional_step": None, "structural_step": 5}) is False
    assert function_first({"functional_step": None, "structural_step": None}) is None


def test_bad_configs_are_refused():
    with pytest.raises(StudyError, match="seeds"):
        DTDynamics(seeds=(-1,))
    with pytest.raises(StudyError, match="steps"):
        DTDynamics(steps=0)
    with pytest.raises(Exception, match="unknown task"):
        DTDynamics(tasks=("no_such_task",))


@pytest.mark.slow
def test_quick_study_runs_from_the_cli_and_resumes(tmp_path):
    out = tmp_path / "dyn"
    cmd = [sys.executable, "-m", "wtc", "study", "dt-dynamics", "--quick", "--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    s = json.loads((out / "summary.json").read_text())
    assert len(s["runs"]) == 2 and s["runs_counted"] <= 2 and (out / "dt_dynamics.png").exists()
    if s["runs_counted"]:
        assert 0.0 <= s["function_first_fraction"] <= 1.0
        assert s["function_first_fraction"] == np.mean([r["function_first"] for r in s["runs"]
                                                        if r["function_first"] is not None])
    again = subprocess.run(cmd, check=True, capture_output=True, text=True)   # every run kept: no training
    assert json.loads((out / "summary.json").read_text())["runs"] == s["runs"] and again.returncode == 0

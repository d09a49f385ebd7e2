"""The dt-control study: constraints as configs, where a program computes, and the study end to end."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from wtc.errors import StudyError
from wtc.studies.dt_control import DTControl, computes_in, constraint_config, routes


def reading(module, kind, reads, finding="f", live=True):
    return {"module": module, "kind": kind, "name": "v", "reads": reads, "finding": finding, "live": live, "ok": True}


def test_where_the_arithmetic_happens():
    head = reading("L0.h0", "head", "v=x, q=x, k=x", "offset 1")          # a head's three slots are not arithmetic
    out = reading("output 0", "head", "linear terms + ", "f")
    mlp2 = reading("L0.m0", "mlp", "in0=L0.h0, in1=x", "min")
    mlp1 = reading("L0.m1", "mlp", "in0=L0.h0, in1=L0.h0", "square")       # one variable twice
    assert computes_in([head, out], ["prev1_x + x"]) == "head"
    assert computes_in([head, mlp2, out], ["Min(prev1_x, x)"]) == "mlp"
    assert computes_in([head, dict(mlp2, live=False), mlp1, out], ["prev1_x**2"]) == "mlp"   # the head is linear
    assert computes_in([head, dict(mlp2, live=False), out], ["2*prev2_x - 1"]) == "routing"
    assert computes_in([head, out], ["361*minrun_x/1000 + 17*prev1_x/40 + 37*t/50"]) == "head"
    assert computes_in([head], []) == "none"
    assert routes([head, out, reading("L0.h1", "head", "v=x", "offset 2", live=False)]) == ["L0.h0: offset 1"]


def test_constraints_are_configs_and_bad_ones_are_refused():
    assert constraint_config("no-mlp").n_mlps == (0,) and not constraint_config("no-mlp").grow
    assert constraint_config("mlp-current").read == {"L*.m*": ["x*"]}
    assert constraint_config("one-head").n_heads == (1, 1)
    with pytest.raises(StudyError, match="unknown constraint"):
        DTControl(constraints=("fewer",))
    with pytest.raises(StudyError, match="budget_s"):
        DTControl(budget_s=float("nan"))
    with pytest.raises(Exception, match="unknown task"):
        DTControl(tasks=("no_such_task",))


@pytest.mark.slow
def test_quick_study_runs_from_the_cli_and_resumes(tmp_path):
    out = tmp_path / "ctl"
    cmd = [sys.executable, "-m", "wtc", "study", "dt-control", "--quick", "--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    s = json.loads((out / "summary.json").read_text())
    assert s["runs"] == 2 and set(s["by_task"]["sum_last2"]) == {"default", "no-mlp"}
    no_mlp = next(r for r in s["runs_detail"] if r["constraint"] == "no-mlp")
    assert not any(m["kind"] == "mlp" and m["live"] for m in no_mlp["readings"])
    assert no_mlp["attempts"] == 1                                 # the config's max_attempts caps discover
    if no_mlp["solved"]:                                           # the head adds the two routed values
        assert no_mlp["computes_in"] == "head"
    first = (out / "runs" / "sum_last2_default.json").stat().st_mtime
    subprocess.run(cmd, check=True, capture_output=True, text=True)  # resumed: nothing re-run
    assert (out / "runs" / "sum_last2_default.json").stat().st_mtime == first

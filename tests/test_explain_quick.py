"""`wtc explain --quick`: the smaller effort it documents is the one it runs (weights, slices,
search text, predicate width), explicit --sample / --slices still win, and a quick run never
reuses a full run's results (or the other way round)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from wtc.explain import report
from wtc.models import Transformer, TransformerConfig
from wtc.models.io import save


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("quick")
    save(Transformer(TransformerConfig(n_layers=1, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=256, n_ctx=24),
                     seed=0), d / "model")
    text = d / "text"
    text.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py", "heapq.py", "glob.py",
                 "keyword.py", "numbers.py", "string.py", "copy.py", "struct.py"):
        if (stdlib / name).is_file():
            shutil.copy(stdlib / name, text / name)
    return d


def _explain(setup, out, *extra):
    r = subprocess.run([sys.executable, "-m", "wtc", "explain", str(setup / "model"), "--text", str(setup / "text"),
                        "--out", str(out), "--quiet", *extra], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "summary.json").read_text()), json.loads((out / "explanations.json").read_text())


def test_quick_runs_the_documented_smaller_effort(setup, tmp_path):
    q = report.QUICK
    assert (q.sample, q.k, q.n_search, q.n_slice) < (report.FULL.sample, report.FULL.k, report.FULL.n_search,
                                                      report.FULL.n_slice)
    summary, weights = _explain(setup, tmp_path / "q", "--quick")
    s = summary["settings"]
    assert (s["sample"], s["k"], s["n_search"], s["n_slice"]) == (q.sample, q.k, q.n_search, q.n_slice)
    assert (s["candidates"], s["beam"], s["max_atoms"]) == (q.candidates, q.beam, q.max_atoms)
    assert summary["weights_sampled"] == len(weights) == q.sample and summary["slices"] == q.k
    assert summary["search_positions"] == q.n_search * 24
    for w in weights:
        if w["heldout_score"] is not None:
            assert len(w["slice_scores"]) == q.k
        if w["predicate"]:                       # at most max_atoms atoms joined by AND / OR
            assert w["predicate"].count(" AND ") + w["predicate"].count(" OR ") <= q.max_atoms - 1, w["predicate"]


def test_explicit_options_win_over_quick_and_results_are_not_mixed(setup, tmp_path):
    out = tmp_path / "o"
    summary, weights = _explain(setup, out, "--quick", "--sample", "3", "--slices", "2")
    assert (summary["settings"]["sample"], summary["settings"]["k"]) == (3, 2) and len(weights) == 3
    assert summary["settings"]["max_atoms"] == report.QUICK.max_atoms
    full, _ = _explain(setup, out, "--sample", "3", "--slices", "2")      # same out/: a full run, not the quick one
    assert "max_atoms" not in full["settings"] and full["settings"]["n_search"] == report.FULL.n_search

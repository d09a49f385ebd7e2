"""The sparse-vs-dense study end to end on a tiny corpus and tiny models (seconds)."""
import json

import pytest

from wtc.studies.sparse_dense import SparseDenseStudy, StudyError, run


def _tiny(**kw):
    base = dict(steps=40, batch=8, d_model=32, n_layers=1, ctx=32, sample=5, slices=3, n_search=8, n_slice=4,
                max_bytes=200_000, threads=1)
    return SparseDenseStudy(**{**base, **kw})


def test_study_writes_both_models_and_reuses_finished_work(tmp_path):
    s = run(_tiny(), tmp_path, progress=False)
    saved = json.loads((tmp_path / "summary.json").read_text())
    for kind in ("sparse", "dense"):
        for key in ("weights_scored", "interpretable_fraction", "robust_fraction", "reliability"):
            assert key in saved[kind]
        assert (tmp_path / kind / "model" / "model.safetensors").exists()
        assert (tmp_path / kind / "explain" / "report.md").exists()
    assert s["dense"]["density"] == 1.0
    assert s["sparse"]["density"] < 0.5             # 2% target plus at least 4 per unit of 32 channels
    assert (tmp_path / "sparse_vs_dense.png").exists() and (tmp_path / "report.md").exists()
    again = run(_tiny(), tmp_path, progress=False)  # training and explanations are reused, not redone
    for kind in ("sparse", "dense"):
        assert again[kind]["scores"] == s[kind]["scores"]
        assert again[kind]["heldout_loss"] == s[kind]["heldout_loss"]


@pytest.mark.parametrize("kw", [{"density": 1.0}, {"steps": 0}, {"d_model": 40}])
def test_bad_study_config_is_refused(kw):
    with pytest.raises(StudyError):
        _tiny(**kw)

"""The sparse-vs-dense study end to end on a tiny corpus and tiny models (seconds): four models
(sparse, dense and the two controls) scored by one pipeline under every definition, with intervals."""
import json

import pytest

from wtc.studies.sparse_dense import SparseDenseStudy, StudyError, run, write_summary
from wtc.studies.sparse_dense_defs import DEFINITIONS


def _tiny(**kw):
    base = dict(steps=40, batch=8, d_model=32, n_layers=1, ctx=32, sample=6, slices=3, n_search=8, n_slice=4,
                max_bytes=200_000, threads=1)
    return SparseDenseStudy(**{**base, **kw})


def _fractions_ok(obj):
    for fig in ("interpretable", "robust"):
        f, ci = obj[f"{fig}_fraction"], obj[f"{fig}_ci"]
        assert 0 <= f <= 1 and 0 <= ci[0] <= f <= ci[1] <= 1


def test_study_scores_four_models_under_every_definition_and_reuses_finished_work(tmp_path, monkeypatch):
    s = run(_tiny(), tmp_path, progress=False)
    saved = json.loads((tmp_path / "summary.json").read_text())
    models = {"dense": saved["dense"], "sparse": saved["sparse"], **saved["controls"]}
    assert set(saved["controls"]) == {"random", "shuffled"}
    for kind, obj in models.items():
        for key in ("weights_scored", "interpretable_fraction", "robust_fraction", "reliability", "heldout_loss"):
            assert key in obj, (kind, key)
        assert obj["weights_scored"] > 0
        _fractions_ok(obj)
        assert set(obj["definitions"]) == {d.name for d in DEFINITIONS}
        for row in obj["definitions"].values():
            _fractions_ok(row)
            assert row["robust"] <= row["interpretable"] <= row["weights_scored"] == obj["weights_scored"]
        assert (tmp_path / kind / "model" / "model.safetensors").exists()
        assert (tmp_path / kind / "explain" / "report.md").exists()
    assert s["dense"]["density"] == 1.0 and s["controls"]["random"]["density"] == 1.0
    assert s["sparse"]["density"] < 0.5             # 2% target plus at least 4 per unit of 32 channels
    assert not s["controls"]["random"]["trained"] and s["controls"]["shuffled"]["trained"]
    # the untrained model is far from the trained ones; the shuffled one learns byte frequencies only
    assert s["controls"]["random"]["heldout_loss"] > s["dense"]["heldout_loss"] + 0.5
    assert s["controls"]["shuffled"]["heldout_loss"] > s["dense"]["heldout_loss"]
    assert set(s["verdict"]) == {d.name for d in DEFINITIONS}
    assert (tmp_path / "sparse_vs_dense.png").exists() and "controls near zero" in (tmp_path / "report.md").read_text()
    import wtc.studies.sparse_dense as S

    def no_training(*a, **k):
        raise AssertionError("a finished model was retrained")
    monkeypatch.setattr(S, "train_lm", no_training)   # the saved models are loaded, not retrained
    again = run(_tiny(), tmp_path, progress=False)  # training and explanations are reused, not redone
    for kind in ("sparse", "dense"):
        assert again[kind]["scores"] == s[kind]["scores"]
        assert again[kind]["heldout_loss"] == s[kind]["heldout_loss"]
    for kind in ("random", "shuffled"):
        for key in ("scores", "definitions", "heldout_loss"):
            assert again["controls"][kind][key] == s["controls"][kind][key]
    assert again["finished"]
    from wtc.explain.corpus import build_corpus
    monkeypatch.undo()
    import shutil                                   # a saved model of another training config is not reused
    shutil.copytree(tmp_path / "dense" / "model", tmp_path / "other" / "dense" / "model")
    shutil.copy(tmp_path / "dense" / "figures.json", tmp_path / "other" / "dense" / "figures.json")
    model, fig = S.prepare(_tiny(steps=41), tmp_path / "other", "dense", build_corpus(max_bytes=200_000, seed=0),
                           progress=False)
    assert fig["heldout_loss"] != s["dense"]["heldout_loss"]
    # a run stopped part way reports what it has: cut the random control to 3 weights
    path = tmp_path / "random" / "explain" / "weights.jsonl"
    path.write_text("\n".join(path.read_text().splitlines()[:4]) + "\n")
    part = write_summary(_tiny(), tmp_path, build_corpus(max_bytes=200_000, seed=0))
    assert not part["finished"] and not part["controls"]["random"]["finished"] and part["dense"]["finished"]
    assert part["controls"]["random"]["weights_sampled"] == 3
    _fractions_ok(part["controls"]["random"])


@pytest.mark.parametrize("kw", [{"density": 1.0}, {"steps": 0}, {"d_model": 40}])
def test_bad_study_config_is_refused(kw):
    with pytest.raises(StudyError):
        _tiny(**kw)

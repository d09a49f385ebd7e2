"""Studies reuse finished work (wtc.studies.clock.kept) and compare model paths as the directories
they name (clock.same_path): a rerun of `wtc study agreement` recomputes nothing it has, computes
only what is missing or was computed from other settings, and accepts the same model directory
however it is spelled, while another directory is refused with the field named."""
import json
import os

import pytest

from test_agreement_study import _gpt2_dir, tiny
from wtc.errors import StudyError
from wtc.studies import agreement as A
from wtc.studies import clock as C


def counting(monkeypatch, name):
    calls = []
    real = getattr(A, name)

    def wrapped(*a, **kw):
        calls.append(a)
        return real(*a, **kw)
    monkeypatch.setattr(A, name, wrapped)
    return calls


def without_seconds(summary):
    return {k: v for k, v in summary.items() if k != "seconds"}


def test_a_rerun_reuses_each_finished_model_and_computes_only_what_changed(tmp_path, monkeypatch, capsys):
    a, b = A.ModelSpec("a", 1, 16), A.ModelSpec("b", 1, 16, "RMS", "relu", 1)
    analysed, trained = counting(monkeypatch, "analyse"), counting(monkeypatch, "train_model")
    first = A.run(tiny(models=(a,)), tmp_path, progress=False)
    assert (len(analysed), len(trained)) == (1, 1)
    stamp = (tmp_path / "a" / "analysis.json").stat().st_mtime_ns

    again = A.run(tiny(models=(a,)), tmp_path, progress=True)          # nothing to do: all reused
    assert (len(analysed), len(trained)) == (1, 1)
    assert without_seconds(again) == without_seconds(first)
    assert f"agreement: reusing {tmp_path / 'a' / 'analysis.json'}" in capsys.readouterr().err
    assert (tmp_path / "a" / "analysis.json").stat().st_mtime_ns == stamp

    both = A.run(tiny(models=(a, b)), tmp_path, progress=False)         # a model added: only it is computed
    assert (len(analysed), len(trained)) == (2, 2) and trained[-1][1] == b
    assert both["models"][0] == first["models"][0]

    state = (tmp_path / "b" / "train_state.safetensors").stat().st_mtime_ns
    other = A.run(tiny(models=(a, b), eval_n=30), tmp_path, progress=True)   # analysis settings changed
    assert len(analysed) == 4 and other["eval_n"] == 30
    assert "recomputing" in capsys.readouterr().err
    assert (tmp_path / "b" / "train_state.safetensors").stat().st_mtime_ns == state   # training reused


def test_kept_recomputes_a_row_of_other_settings_or_one_a_kill_left_torn(tmp_path):
    clock, f, calls = C.Clock(tmp_path), tmp_path / "unit" / "row.json", []

    def compute():
        calls.append(1)
        return {"x": (1, 2), "n": len(calls)}
    assert C.kept(f, compute, clock, key={"k": 1}) == {"x": [1, 2], "n": 1}     # as a reader gets it back
    assert C.kept(f, compute, clock, key={"k": 1})["n"] == 1 and len(calls) == 1
    assert C.kept(f, compute, clock, key={"k": 2})["n"] == 2
    f.write_text('{"key": {"k": 2}, "ro')
    assert C.kept(f, compute, clock, key={"k": 2})["n"] == 3
    assert not list(f.parent.glob("*.tmp"))


def test_same_path_compares_the_directories_named(tmp_path, monkeypatch):
    model = tmp_path / "hf" / "gpt2-257"
    model.mkdir(parents=True)
    (tmp_path / "other" / "gpt2-257").mkdir(parents=True)
    os.symlink(model, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    for spelled in ("hf/gpt2-257", str(model), "./hf/../hf/gpt2-257", str(tmp_path / "link")):
        assert C.same_path(str(model), spelled), spelled
    assert C.same_path("gpt2-257", "hf/gpt2-257")           # a relative path an older wtc recorded
    assert not C.same_path(str(model), "other/gpt2-257")
    assert not C.same_path("../gpt2-257", "hf/gpt2-257")
    assert C.same_path(None, None) and not C.same_path(None, "hf/gpt2-257")


def test_the_same_hugging_face_model_from_another_directory_is_reused_and_another_refused(tmp_path, monkeypatch):
    model = tmp_path / "hf" / "gpt2-257"
    _gpt2_dir(model)
    _gpt2_dir(tmp_path / "other" / "gpt2-257")
    cfg = lambda path: A.AgreementStudy(model=path, fit_n=40, eval_n=30, gen_tokens=2)
    out = tmp_path / "out"
    analysed = counting(monkeypatch, "analyse")
    monkeypatch.chdir(tmp_path / "hf")
    first = A.run(cfg("gpt2-257"), out, progress=False)
    assert json.loads((out / "config.json").read_text())["model"] == str(model)   # recorded resolved
    monkeypatch.chdir(tmp_path)
    for spelled in ("hf/gpt2-257", str(model)):
        again = A.run(cfg(spelled), out, progress=False)
        assert len(analysed) == 1 and again["models"] == first["models"]
    # a config.json of an older wtc recorded the path as given: the same directory still matches
    conf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**conf, "model": "gpt2-257"}))
    A.run(cfg(str(model)), out, progress=False)
    assert len(analysed) == 1
    with pytest.raises(StudyError, match=r"different config \(model: .*other/gpt2-257"):
        A.run(cfg("other/gpt2-257"), out, progress=False)

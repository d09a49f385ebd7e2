"""`wtc study`: the registry (wtc.studies) and the one shape every study has; the CLI prints the
figures a study declares (HEADLINE) and resumes."""
import dataclasses
import inspect
import json
import subprocess
import sys

import pytest

from wtc import studies
from wtc.cli import main


def test_the_registry_is_read_without_importing_the_studies():
    code = ("import sys, wtc.studies as s; assert s.names() == ['markov', 'modadd', 'grok-law', 'core-inflation', 'assign-add', 'sparse-vs-dense', 'dt-dynamics', 'dt-control', 'agreement']; "
            "heavy = [m for m in ('torch', 'wtc.studies.modadd') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", studies.names())
def test_every_study_has_the_same_shape(name):
    study = studies.load(name)
    assert study.__name__ == studies.STUDIES[name][0]
    cfg, quick = study.CONFIG(), study.CONFIG.quick()
    assert dataclasses.is_dataclass(cfg) and type(quick) is study.CONFIG and quick != cfg
    params = list(inspect.signature(study.run).parameters)
    assert params[1:] == ["out_dir", "progress"] and inspect.signature(study.run).parameters["progress"].default is True
    assert study.HEADLINE and all(isinstance(k, str) for k in study.HEADLINE)
    assert {"summary.json", "report.md"} <= set(study.OUTPUTS) and any(f.endswith(".png") for f in study.OUTPUTS)


def test_headline_follows_dotted_keys_into_objects_and_lists():
    s = {"a": 1, "b": {"c": [{"d": 2}, {"d": 3}]}, "e": None}
    assert studies.headline(s, ("a", "b.c.-1.d", "b.c.0.d", "e.f", "x", "b.c.9")) == [
        ("a", 1), ("b.c.-1.d", 3), ("b.c.0.d", 2), ("e.f", None), ("x", None), ("b.c.9", None)]
    with pytest.raises(studies.StudyError, match="available: markov"):
        studies.load("nosuch")


def test_cli_runs_a_study_prints_its_headline_and_resumes(tmp_path, monkeypatch, capsys):
    from wtc.studies import markov

    tiny = markov.MarkovStudy(steps=20, sequences=100, eval_sequences=50, seeds=(0, 1), d_model=16, d_mlp=32)
    monkeypatch.setattr(markov.MarkovStudy, "quick", classmethod(lambda cls: tiny))
    args = ["study", "markov", "--quick", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    s = json.loads((tmp_path / "summary.json").read_text())
    assert printed.startswith(f"markov: rank {s['rank']}, baseline_acc [{s['baseline_acc'][0]:.4g}, ")
    assert f"wrote {tmp_path}/summary.json, report.md, markov.png" in printed
    assert (tmp_path / "report.md").exists() and (tmp_path / "seed_1" / "train_state.json").exists()
    stamp = (tmp_path / "seed_0" / "train_state.safetensors").stat().st_mtime_ns
    assert main(args) == 0                                            # finished: the training is reused
    assert (tmp_path / "seed_0" / "train_state.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((tmp_path / "summary.json").read_text())["seeds"][0]["final_loss"] == s["seeds"][0]["final_loss"]
    assert main(args + ["--seed", "3"]) == 2
    assert "--seed does not apply" in capsys.readouterr().err


def test_a_study_dir_with_nothing_computed_takes_another_config(tmp_path):
    from wtc.errors import StudyError
    from wtc.studies.clock import check_config

    check_config(tmp_path, {"a": 1})
    check_config(tmp_path, {"a": 2})                       # only config.json there: nothing to lose
    (tmp_path / "result.json").write_text("{}")
    with pytest.raises(StudyError, match="different config"):
        check_config(tmp_path, {"a": 3})


def test_corpus_option_reaches_the_agreement_config_and_is_refused_elsewhere(tmp_path, monkeypatch, capsys):
    from wtc import studies
    from wtc.cli import main

    seen = {}
    study = studies.load("agreement")
    monkeypatch.setattr(study, "run", lambda cfg, out, progress: seen.setdefault("cfg", cfg) and {"seconds": 0})
    monkeypatch.setattr(studies, "headline", lambda summary, spec: [])
    assert main(["study", "agreement", "--quick", "--quiet", "--corpus", "uniform", "--out", str(tmp_path)]) == 0
    assert seen["cfg"].corpus == "uniform"
    assert main(["study", "markov", "--quick", "--corpus", "graded", "--out", str(tmp_path / "m")]) == 2
    assert "--corpus does not apply" in capsys.readouterr().err

"""`wtc study agreement`: ACE on language models trained on the agreement corpus, or on a local
Hugging Face model directory."""
import json

import numpy as np
import pytest
import torch

from wtc.cli import main
from wtc.errors import StudyError
from wtc.studies import agreement as A
from wtc.tasks.agreement import AgreementCorpus

KEYS = ("name", "rank", "baseline_acc", "keep_acc", "remove_acc", "flip_reversal", "generation_flip")


def tiny(**kw):
    base = dict(models=(A.ModelSpec("a", 1, 16), A.ModelSpec("b", 2, 16, "RMS", "relu", 1)), steps=20,
                train_sentences=400, fit_n=60, eval_n=40, gen_tokens=2)
    return A.AgreementStudy(**{**base, **kw})


def test_training_batches_mark_the_sentence_and_its_verb():
    c = AgreementCorpus()
    x, real, verb = A.sentence_batch(c, 200, 24, seed=0)
    dot = c.ids["."]
    assert (x[:, 0] == dot).all()
    for i in range(len(x)):
        n = int(real[i].sum())                                   # targets: the sentence's words
        words = c.decode(x[i, 1:n + 1])
        assert words[-1] == "." and "." not in words[:-1]
        for t in torch.nonzero(verb[i]).flatten().tolist():
            assert c.number_of(c.vocab[int(x[i, t + 1])]) is not None
    assert 0.6 < float(verb.any(1).double().mean()) < 0.95      # the number-neutral past marks none


def test_spearman_is_a_rank_correlation():
    a = np.random.default_rng(0).normal(size=50)
    assert A.spearman(a, np.exp(a)) == pytest.approx(1.0)
    assert A.spearman(a, -a ** 3) == pytest.approx(-1.0)


def test_study_writes_the_issue_summary_and_resumes(tmp_path):
    s = A.run(tiny(), tmp_path, progress=False)
    assert [m["name"] for m in s["models"]] == ["a", "b"]
    for m in s["models"]:
        assert all(k in m for k in KEYS)
        for k in KEYS[2:]:
            assert 0.0 <= m[k] <= 1.0
        assert len(m["layer_profile"]) == {"a": 1, "b": 2}[m["name"]]
    rho = np.array(s["spearman"])
    assert rho.shape == (2, 2) and np.allclose(np.diag(rho), 1) and np.allclose(rho, rho.T)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["models"][0]["name"] == "a" and (tmp_path / "agreement.png").stat().st_size > 0
    assert "| a |" in (tmp_path / "report.md").read_text()
    stamp = (tmp_path / "b" / "train_state.safetensors").stat().st_mtime_ns
    again = A.run(tiny(), tmp_path, progress=False)                    # finished: reused, same numbers
    assert (tmp_path / "b" / "train_state.safetensors").stat().st_mtime_ns == stamp
    assert again["models"][1]["baseline_acc"] == s["models"][1]["baseline_acc"]
    with pytest.raises(StudyError, match="different config"):
        A.run(tiny(lr=1e-3), tmp_path, progress=False)


def test_the_spearman_set_holds_ambiguous_subjects_in_the_graded_corpus_only(tmp_path):
    """graded: ambiguous-subject sentences join the attractor sentences in the Spearman set, in the
    corpus's share; the attractor sentences alone are spearman_definite. uniform: the set is the
    attractor sentences, as in Session 7."""
    for variant in ("graded", "uniform"):
        cfg = tiny(corpus=variant, models=(A.ModelSpec("a", 1, 16),))
        s = A.run(cfg, tmp_path / variant, progress=False)
        q = AgreementCorpus(variant=variant).ambiguous_share
        n_amb = round(cfg.eval_n * q / (1 - q))
        assert s["corpus"] == variant and s["ambiguous_n"] == n_amb == s["spearman_set"]["ambiguous"]
        assert s["spearman_set"]["attractor"] == s["eval_n"] == cfg.eval_n
        assert s["spearman_definite"] == [[pytest.approx(1.0)]]
        assert (n_amb > 0) == (variant == "graded") == ("prior_spearman" in s)
        assert f"corpus {variant}" in (tmp_path / variant / "report.md").read_text()
    with pytest.raises(StudyError, match="different config"):              # the corpus is part of the run
        A.run(tiny(corpus="graded", models=(A.ModelSpec("a", 1, 16),)), tmp_path / "uniform", progress=False)


def test_config_errors_name_the_field():
    with pytest.raises(StudyError, match="n_ctx"):
        tiny(n_ctx=10)
    with pytest.raises(StudyError, match="unique"):
        tiny(models=(A.ModelSpec("a", 1, 16), A.ModelSpec("a", 2, 16)))
    with pytest.raises(StudyError, match="verb_weight"):
        tiny(verb_weight=float("nan"))
    with pytest.raises(StudyError, match="corpus must be one of graded, uniform"):
        tiny(corpus="english")


@pytest.mark.slow
def test_a_trained_lm_has_a_causal_one_dimensional_agreement_axis(tmp_path):
    """The quick study's first model: agreement learned; the core's axis is sufficient, necessary,
    and flipping it reverses the number, in the readout and in greedy generation."""
    cfg = A.AgreementStudy.quick()
    cfg = A.AgreementStudy(models=cfg.models[:1], steps=cfg.steps, fit_n=cfg.fit_n, eval_n=cfg.eval_n)
    m = A.run(cfg, tmp_path, progress=False)["models"][0]
    assert m["baseline_acc"] >= 0.98 and m["lemma_acc"] >= 0.98
    assert m["axis_rank"] <= 2 and m["keep_acc"] >= m["baseline_acc"] - 0.005
    assert m["remove_acc"] <= 0.6
    assert m["flip_reversal"] >= 0.95 and m["generation_flip"] >= 0.9
    assert m["r2"] >= 0.9


def _gpt2_dir(path, variant=None):
    transformers = pytest.importorskip("transformers")
    from wtc.models.hf import word_tokenizer

    c = AgreementCorpus() if variant is None else AgreementCorpus(variant=variant)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_inner=64,
                                                                 vocab_size=c.d_vocab, n_positions=32))
    model.save_pretrained(path)
    word_tokenizer(c.vocab).save_pretrained(path)
    return c


def test_study_runs_on_a_local_hugging_face_gpt2(tmp_path, monkeypatch, capsys):
    c = _gpt2_dir(tmp_path / "gpt2-random")
    monkeypatch.setattr(A.AgreementStudy, "quick", classmethod(lambda cls: cls(fit_n=40, eval_n=30, gen_tokens=2)))
    out = tmp_path / "out"
    assert main(["study", "agreement", "--quick", "--quiet", "--model", str(tmp_path / "gpt2-random"),
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("agreement: models.0.rank ")
    s = json.loads((out / "summary.json").read_text())
    assert [m["name"] for m in s["models"]] == ["gpt2-random"] and s["spearman"] == [[1.0]]
    m = s["models"][0]
    assert all(k in m for k in KEYS) and m["training"] is None
    assert len(m["layer_profile"]) == 2
    # the model's word tokenizer gives the corpus's own ids: the inputs are the corpus LM's, without its "."
    lm = A.hf_lm(tmp_path / "gpt2-random", c)
    sents = c.eval_set("attractor", 5)
    x, pos = lm.inputs(sents, 24)
    assert [x[i, : pos[i] + 1].tolist() for i in range(5)] == [c.encode(s.prefix) for s in sents]
    assert main(["study", "markov", "--quick", "--model", str(tmp_path / "gpt2-random")]) == 2
    assert "--model does not apply" in capsys.readouterr().err


def test_a_word_tokenizer_of_another_corpus_variant_is_refused_by_name(tmp_path):
    _gpt2_dir(tmp_path / "m", variant="uniform")
    with pytest.raises(StudyError, match="does not know 2[0-9] of the graded corpus's words .*corpus='uniform'"):
        A.hf_lm(tmp_path / "m", AgreementCorpus(variant="graded"))
    assert A.hf_lm(tmp_path / "m", AgreementCorpus(variant="uniform")).name == "m"


def test_a_model_directory_without_a_tokenizer_is_refused(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(StudyError, match="no tokenizer"):
        A.run(A.AgreementStudy(model=str(tmp_path), fit_n=20, eval_n=20), tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "config.json").exists()          # refused before anything was written


def test_cross_model_comparison_separates_the_class_split_from_the_order_inside(rng):
    from wtc.studies.agreement_compare import compare, spearman

    assert spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)          # average ranks: ties share theirs
    assert spearman([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(0.0)
    n = 400
    num = np.repeat([0, 1], n // 2)
    shared = rng.standard_normal(n)
    a = 5 * (2 * num - 1) + shared                               # both separate the classes ...
    b = 5 * (2 * num - 1) + shared + 0.01 * rng.standard_normal(n)   # ... with the same order inside
    c = 5 * (2 * num - 1) + rng.standard_normal(n)               # ... or another one
    margins = [a, b, 3 * c]                                      # c's margin follows c
    out = compare([a, b, c], margins, num, [a[:50], b[:50], c[:50]], [a[:50], b[:50], c[:50]], num[:50])
    rho, within = np.array(out["spearman"]), np.array(out["spearman_within_number"])
    assert rho[0, 1] > 0.99 and within[0, 1] > 0.99
    assert abs(rho[0, 2] - 0.75) < 0.05 and abs(within[0, 2]) < 0.2              # the split alone: 0.75
    assert out["min_spearman"] == pytest.approx(min(rho[0, 2], rho[1, 2]))
    assert out["coordinate_margin_r_within_number"] == pytest.approx([1.0, 1.0, 1.0])
    assert np.array(out["spearman_margin"])[0, 2] == pytest.approx(rho[0, 2])
    assert len(out["spearman_mixed"]) == 3 and out["spearman_mixed"][0][0] == pytest.approx(1.0)

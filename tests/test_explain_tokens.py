"""`wtc explain` on Hugging Face models read through their own tokenizer: a BPE tokenizer trained
here on stdlib text (offline), tiny GPT-2 / GPT-NeoX / LLaMA models built from configs."""
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from wtc.errors import ArgumentError  # noqa: E402
from wtc.explain.conditional import conditional_kl, is_local, matrices  # noqa: E402
from wtc.explain.corpus import build_corpus  # noqa: E402
from wtc.explain.explainer import explain  # noqa: E402
from wtc.explain.predicates import Predicate  # noqa: E402
from wtc.explain.sandbox import check_source, compile_predicate  # noqa: E402
from wtc.explain.token_predicates import TokenAtom, TokenVocab, encode_corpus, token_atoms  # noqa: E402
from wtc.models import hf  # noqa: E402

FILES = ["textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "colorsys.py"]


def bpe_tokenizer(texts, vocab_size=300):
    """A GPT-2-style byte-level BPE trained on `texts`, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A text directory (stdlib files), a BPE tokenizer trained on it, and a 1-layer GPT-2 (untied
    head) whose attention writes nothing, so an embedding weight acts only where its token is."""
    from transformers import GPT2Config, GPT2LMHeadModel

    base = tmp_path_factory.mktemp("bpe")
    text = base / "text"
    text.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for f in FILES:
        shutil.copy(stdlib / f, text / f)
    tok = bpe_tokenizer([(text / f).read_text(errors="replace") for f in FILES])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=32, vocab_size=len(tok),
                                       tie_word_embeddings=False))
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight.zero_()
        model.transformer.h[0].attn.c_proj.bias.zero_()
    d = base / "gpt2"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    corpus = build_corpus(text)
    ids = encode_corpus(corpus, "all", tok)
    return {"dir": d, "text": text, "tok": tok, "corpus": corpus, "ids": ids}


def windows(ids, n, T, start):
    return ids[start:start + n * T].reshape(n, T)


def decoded(tok, row):
    return [tok.decode([int(i)], clean_up_tokenization_spaces=False) for i in row]


def test_token_predicates_equal_their_source_run_on_the_tokenizers_decode(setup):
    tok, ids = setup["tok"], setup["ids"]
    x = windows(ids, 6, 24, 0)
    vocab = TokenVocab.from_tokenizer(tok)
    lib = token_atoms(x, vocab)
    kinds = {a.kind for a in lib}
    assert kinds == {"pos", "class", "ends", "contains", "eq"}
    texts = [decoded(tok, row) for row in x]
    composed = [Predicate((lib[5], lib[-1]), ("", "OR")), Predicate((lib[40], lib[60], lib[-7]), ("NOT", "AND", "AND NOT"))]
    for pred in [Predicate((a,), ("",)) for a in lib] + composed:
        check_source(pred.source)                                   # passes the sandbox whitelist
        f = compile_predicate(pred.source)
        want = np.array([[f(row, p) for p in range(len(row))] for row in texts])
        np.testing.assert_array_equal(pred.evaluate(x), want, err_msg=pred.name)
    # the string atoms are the data's frequent token strings, read as they decode
    common = max(set(texts[0]), key=lambda s: sum(r.count(s) for r in texts))
    assert any(a.kind == "eq" and a.arg == common and a.name == f"token == {json.dumps(common)}" for a in lib)


def test_vocab_refuses_ids_outside_it(setup):
    vocab = TokenVocab.from_tokenizer(setup["tok"])
    with pytest.raises(ArgumentError, match="token ids must lie in"):
        vocab.check(np.array([[0, len(vocab)]]))
    with pytest.raises(ArgumentError, match="2-D"):
        TokenAtom("class", "is a word", 0, vocab).evaluate(np.array([1, 2]))


def test_a_planted_embedding_weight_is_explained_by_its_token_string(setup):
    tok, ids = setup["tok"], setup["ids"]
    model = hf.load(setup["dir"], dtype=torch.float64)
    search = windows(ids, 8, 24, 0)
    slices = [windows(ids, 4, 24, 8 * 24 + k * 96) for k in range(2)]
    vocab = TokenVocab.from_tokenizer(tok)
    # the most frequent word token of the search set (seen in every slice)
    words = [i for i in np.unique(search) if vocab.strings[i].strip().isalpha() and len(vocab.strings[i]) >= 2
             and all((s == i).any() for s in slices)]
    v = max(words, key=lambda i: int((search == i).sum()))
    res = explain(model, search, slices, weights=[("hf.transformer.wte.weight", (int(v), 3))], progress=False)
    (w,) = res["weights"]
    assert w.interpretable and w.heldout_score >= 0.9, (w.predicate, w.heldout_score)
    f = compile_predicate(w.source)
    for x in [search, *slices]:                   # true wherever the token is (the KL lies only there)
        got = np.array([[f(decoded(tok, row), p) for p in range(len(row))] for row in x])
        assert got[x == v].all()
    assert json.dumps(vocab.strings[v]) in w.predicate, w.predicate
    assert res["summary"]["tokenizer"].startswith(type(tok).__name__)     # TokenizersBackend in transformers 5


def _small(kind, V):
    from transformers import (GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig,
                              LlamaForCausalLM)

    torch.manual_seed(1)
    if kind == "gpt2":                                   # tied: the embedding is also the head
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=16, vocab_size=V))
    if kind == "gpt_neox":
        return GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
                                                intermediate_size=32, max_position_embeddings=16, vocab_size=V))
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, max_position_embeddings=16,
                                        vocab_size=V))


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox", "llama"])
def test_module_weights_zeroed_everywhere_equal_the_zeroed_weight(kind):
    """Conditional zeroing at every position is zeroing the weight (each family's matrices, tied
    GPT-2 embedding included); at no position it changes nothing; the untied head is local."""
    model = hf.load(_small(kind, 40).double())
    x = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(0))
    params = dict(model.named_parameters())
    names = matrices(model)
    assert names and all(params[n].ndim == 2 for n in names)
    assert not any("norm" in n or "ln" in n.split(".")[-2] for n in names)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        clean = torch.log_softmax(model(x).double(), -1)
    for name in names:
        p = params[name]
        idx = tuple(int(torch.randint(0, s, (), generator=g)) for s in p.shape)
        if name.endswith(("wte.weight", "embed_in.weight", "embed_tokens.weight")):
            idx = (int(x[0, 2]), idx[1])                                      # a row the tokens reach
        elif name.endswith("wpe.weight"):
            idx = (2, idx[1])
        full, none = conditional_kl(model, x, name, idx, [torch.ones(3, 10, dtype=torch.bool),
                                                          torch.zeros(3, 10, dtype=torch.bool)])
        with torch.no_grad():
            old = p[idx].item()
            p[idx] = 0
            z = torch.log_softmax(model(x).double(), -1)
            p[idx] = old
        ref = (clean.exp() * (clean - z)).sum(-1).clamp_min(0).sum()
        assert float(ref) > 0, name
        torch.testing.assert_close(full, ref, rtol=1e-6, atol=1e-12, msg=name)
        assert float(none) == 0.0, name
    # the untied output matrix (GPT-NeoX's embed_out, named lm_head from transformers 5 on)
    head = next(f"hf.{n}" for n, p in model.hf.named_parameters() if p is model.hf.get_output_embeddings().weight)
    assert [n for n in names if is_local(model, n)] == ([] if kind == "gpt2" else [head])


def test_cli_explains_a_bpe_model_directory(setup, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "wtc", "explain", str(setup["dir"]), "--text", str(setup["text"]),
                        "--sample", "2", "--slices", "2", "--ctx", "16", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "predicates read their decoded strings" in report
    assert summary["settings"]["tokenizer"].startswith(type(setup["tok"]).__name__)
    weights = json.loads((out / "explanations.json").read_text())
    assert len(weights) == 2 and all(w["param"].startswith("hf.") for w in weights)
    for w in weights:                 # every predicate reads token strings: one of its atoms' names
        if w["predicate"]:
            assert "token" in w["predicate"] or "pos <" in w["predicate"]
            assert f"`{w['predicate']}`" in report or w["heldout_score"] is None


def test_cli_refuses_a_model_directory_without_a_tokenizer(tmp_path, setup, capsys):
    from wtc.cli import main

    d = tmp_path / "m"
    _small("gpt2", 40).save_pretrained(d)
    capsys.readouterr()                           # transformers 5 draws a progress bar saving
    assert main(["explain", str(d), "--text", str(setup["text"]), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer" in err and len(err.strip().splitlines()) == 1

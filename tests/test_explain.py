"""Predicate explanations end to end: a planted weight, a diffuse one, external proposers, reliability."""
import numpy as np
import pytest
import torch

from wtc.explain.explainer import explain, reliability
from wtc.explain.sandbox import compile_predicate
from wtc.models import Transformer, TransformerConfig

DOT = ord(".")


def _text(n_windows, T, seed):
    rng = np.random.default_rng(seed)
    words = [b"self", b"os", b"path", b"x", b"value", b"join", b"data", b"(", b")", b"=", b" ", b"\n    "]
    out = bytearray()
    while len(out) < n_windows * T:
        out += words[rng.integers(len(words))]
        if rng.random() < 0.15:
            out += b"."
    return np.frombuffer(bytes(out[: n_windows * T]), np.uint8).reshape(n_windows, T).astype(np.int64)


def planted_model():
    """Byte model whose MLP neuron 0 fires only on '.' tokens (channel 0 of the embedding is the
    '.' indicator, attention writes nothing), and whose channel 1 is a constant at every position."""
    cfg = TransformerConfig(n_layers=1, d_model=16, n_heads=1, d_head=16, d_mlp=8, d_vocab=256, n_ctx=32)
    model = Transformer(cfg, seed=0).double()
    with torch.no_grad():
        model.blocks[0].attn.W_O.zero_()
        model.embed.W_E[:, :2] = 0
        model.embed.W_E[DOT, 0] = 1.0
        model.pos_embed.W_pos[:, :2] = 0
        model.pos_embed.W_pos[:, 1] = 3.0                  # constant channel
        mlp = model.blocks[0].mlp
        mlp.W_in[:2] = 0
        mlp.W_in[:, 0] = 0
        mlp.W_in[0, 0] = 4.0
        mlp.b_in[0] = -1.0                                  # neuron 0: relu(4 [tok == '.'] - 1)
        mlp.W_in[0, 1:] = 0
        mlp.W_out[0, :2] = 0
    return model.eval()


def test_a_planted_weight_is_explained_and_a_diffuse_one_is_not():
    model = planted_model()
    search, slices = _text(16, 32, 0), [_text(6, 32, s) for s in range(1, 11)]
    planted = ("blocks.0.mlp.W_out", (0, 5))
    diffuse = ("unembed.W_U", (1, 7))
    res = explain(model, search, slices, weights=[planted, diffuse], progress=False)
    a, b = res["weights"]
    assert a.param == "blocks.0.mlp.W_out" and a.interpretable and a.robust
    assert a.heldout_score >= 0.9 and all(s >= 0.9 for s in a.slice_scores)
    f = compile_predicate(a.source)                         # the right predicate: true exactly on '.'
    for row in search:
        text = [chr(t) for t in row]
        assert [f(text, i) for i in range(len(row))] == [t == DOT for t in row]
    assert b.total_kl > 0 and not b.interpretable and (b.heldout_score or 0) < 0.75
    assert res["summary"]["weights_scored"] == 2 and res["summary"]["interpretable_fraction"] == 0.5


def test_external_proposer_sources_run_sandboxed_and_bad_ones_are_rejected():
    model = planted_model()
    search, slices = _text(8, 32, 0), [_text(4, 32, s) for s in range(1, 4)]
    seen = {}

    def proposer(contexts):
        seen["contexts"] = contexts
        return ["import os\ndef predicate(tokens, pos):\n    return True",
                "def predicate(tokens, pos):\n    return tokens[pos] == '.'"]

    res = explain(model, search, slices, weights=[("blocks.0.mlp.W_out", (0, 5))], proposer=proposer,
                  builtin=False, progress=False)
    (w,) = res["weights"]
    assert w.proposer == "external" and w.interpretable and "rejected" in w.note and "import" in w.note
    assert all(c.endswith(".") for c in seen["contexts"][:5])         # the contexts end at the important position


def test_reliability_is_one_for_consistent_weights_and_low_for_noise():
    rng = np.random.default_rng(0)
    consistent = np.repeat(rng.random((20, 1)), 10, axis=1) + rng.normal(0, 1e-3, (20, 10))
    assert reliability(consistent) > 0.99
    noise = rng.random((20, 10))
    assert reliability(noise) < 0.2
    assert reliability(np.ones((1, 10))) is None


def test_weights_are_sampled_from_matrices_only_and_nonzero():
    from wtc.explain.explainer import sample_weights
    model = planted_model()
    picks = sample_weights(model, 300, seed=1)
    params = dict(model.named_parameters())
    assert len(picks) == 300 and len(set(picks)) == 300
    assert all(".b_" not in n and params[n][i] != 0 for n, i in picks)
    assert {n for n, _ in picks} <= {"embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.attn.W_K",
                                     "blocks.0.attn.W_V", "blocks.0.mlp.W_in", "blocks.0.mlp.W_out", "unembed.W_U"}
    assert sample_weights(model, 300, seed=1) == picks
    with pytest.raises(KeyError, match="not weight matrices"):
        sample_weights(model, 3, params=["blocks.0.attn.b_Q"])


def test_a_failing_proposer_is_noted_and_the_grammar_still_explains():
    model = planted_model()
    search, slices = _text(8, 32, 0), [_text(4, 32, s) for s in range(1, 4)]

    def broken(contexts):
        raise RuntimeError("proposer exploded")

    res = explain(model, search, slices, weights=[("blocks.0.mlp.W_out", (0, 5))], proposer=broken, progress=False)
    (w,) = res["weights"]
    assert "proposer exploded" in w.note and w.proposer == "grammar" and w.interpretable
    shell = explain(model, search, slices, weights=[("blocks.0.mlp.W_out", (0, 5))], builtin=False, progress=False,
                    proposer="python -c \"import json,sys; json.load(sys.stdin); "
                             "print(json.dumps(['def predicate(tokens, pos):\\n    return tokens[pos] == chr(46)']))\"")
    (w,) = shell["weights"]
    assert w.proposer == "external" and w.interpretable, w.note

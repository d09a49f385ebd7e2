"""The sparse-vs-dense study's definitions, intervals and controls: the `ours` row is the explainer's
answer, a planted weight passes every definition (and the same weight of an untrained model does
not), Wilson intervals, the shuffled-text control's data."""
import json
import math

import numpy as np
import pytest
import torch

from wtc.explain.explainer import Scorer, explain, sample_weights
from wtc.models import Transformer, TransformerConfig
from wtc.scan.inputs import model_sha256
from wtc.scan.engine import scan
from wtc.studies.sparse_dense_controls import shuffle_within_blocks
from wtc.studies.sparse_dense_defs import DEFINITIONS, explain_all, explain_weight, summarise, wilson

DOT = ord(".")
CFG = TransformerConfig(n_layers=1, d_model=16, n_heads=1, d_head=16, d_mlp=8, d_vocab=256, n_ctx=32)


def _text(n_windows, T, seed):
    rng = np.random.default_rng(seed)
    words = [b"self", b"os", b"path", b"x", b"value", b"join", b"data", b"(", b")", b"=", b" ", b"\n    "]
    out = bytearray()
    while len(out) < n_windows * T:
        out += words[rng.integers(len(words))]
        if rng.random() < 0.15:
            out += b"."
    return np.frombuffer(bytes(out[: n_windows * T]), np.uint8).reshape(n_windows, T).astype(np.int64)


def _planted():
    """MLP neuron 0 fires only on '.' (as in test_explain): W_out[0, :] matters exactly there."""
    model = Transformer(CFG, seed=0).double()
    with torch.no_grad():
        model.blocks[0].attn.W_O.zero_()
        model.embed.W_E[:, :2] = 0
        model.embed.W_E[DOT, 0] = 1.0
        model.pos_embed.W_pos[:, :2] = 0
        model.pos_embed.W_pos[:, 1] = 3.0
        mlp = model.blocks[0].mlp
        mlp.W_in[:2] = 0
        mlp.W_in[:, 0] = 0
        mlp.W_in[0, 0] = 4.0
        mlp.b_in[0] = -1.0
        mlp.W_in[0, 1:] = 0
        mlp.W_out[0, :2] = 0
    return model.eval()


def _one(model, weight, search, slices):
    name, index = weight
    t = torch.as_tensor(search)
    mask = torch.zeros(dict(model.named_parameters())[name].shape, dtype=torch.bool)
    mask[index] = True
    kl = scan(model, t, params=[name], weights={name: mask}, keep_positions=True, progress=False)
    kl = kl.position_kl(name, index).reshape(t.shape)
    return explain_weight(name, index, kl, search, Scorer(model, t), [Scorer(model, torch.as_tensor(s)) for s in slices])


def test_a_planted_weight_passes_every_definition_and_the_untrained_one_does_not():
    search, slices = _text(16, 32, 0), [_text(6, 32, s) for s in range(1, 11)]
    planted = ("blocks.0.mlp.W_out", (0, 5))
    rec = _one(_planted(), planted, search, slices)
    for d in DEFINITIONS:
        r = rec["defs"][d.name]
        assert r["interpretable"] and r["robust"], d.name
        assert r["atoms"] <= d.max_atoms and all(0 < c <= d.max_coverage for c in r["slice_coverages"])
        assert r["heldout_score"] >= 0.9
    random = Transformer(CFG, seed=0).double().eval()           # the same weight, untrained
    ctrl = _one(random, planted, search, slices)
    assert ctrl["defs"]["strict"]["heldout_score"] is None or \
        ctrl["defs"]["strict"]["heldout_score"] < rec["defs"]["strict"]["heldout_score"] - 0.2
    assert not ctrl["defs"]["strict"]["robust"]


def test_ours_row_is_the_explainers_answer_and_stricter_rows_pass_fewer(tmp_path):
    model = _planted()
    search, slices = _text(12, 32, 0), [_text(4, 32, s) for s in range(1, 5)]
    weights = sample_weights(model, 14, seed=3) + [("blocks.0.mlp.W_out", (0, 5))]
    ref = explain(model, search, slices, weights=weights, progress=False)["weights"]
    recs = [_one(model, w, search, slices) for w in weights]
    for e, r in zip(ref, recs):
        o = r["defs"].get("ours", {})
        assert (e.param, tuple(e.index)) == (r["param"], tuple(r["index"]))
        assert e.interpretable == bool(o.get("interpretable")) and e.robust == bool(o.get("robust"))
        if e.heldout_score is not None and math.isfinite(e.heldout_score):
            assert o["predicate"] == e.predicate and o["heldout_score"] == pytest.approx(e.heldout_score, abs=1e-9)
    s = summarise(recs)
    rows = s["definitions"]
    assert rows["slice_gate"]["interpretable"] <= rows["ours"]["interpretable"]     # the same choice, one more gate
    for name, row in rows.items():
        assert row["robust"] <= row["interpretable"] <= row["weights_scored"] == s["weights_scored"]
        for fig in ("interpretable", "robust"):
            lo, hi = row[f"{fig}_ci"]
            assert 0 <= lo <= row[f"{fig}_fraction"] <= hi <= 1
    assert s["interpretable_fraction"] == rows["ours"]["interpretable_fraction"]


def test_explain_all_resumes_weight_by_weight(tmp_path):
    model = _planted()
    search, slices = _text(8, 32, 0), [_text(4, 32, s) for s in range(1, 4)]
    full, done = explain_all(model, search, slices, tmp_path / "a", sample=9, progress=False)
    assert done and len(full) == 9
    path = tmp_path / "a" / "weights.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])       # 4 weights kept, the 5th cut by a kill
    again, done = explain_all(model, search, slices, tmp_path / "a", sample=9, progress=False)
    assert done and again == full and len(path.read_text().splitlines()) == 10
    part, done = explain_all(model, search, slices, tmp_path / "b", sample=9, progress=False, budget_s=0.0)
    assert not done and part == []                                   # stopped before the first chunk
    other, _ = explain_all(model, search, slices, tmp_path / "a", sample=9, seed=1, progress=False)  # new settings
    assert sorted((r["param"], tuple(r["index"])) for r in other) == sorted(sample_weights(model, 9, seed=1))
    assert list((tmp_path / "a").glob("weights.stale-*.jsonl"))
    with torch.no_grad():                       # another model (other nonzeros, so another sample) in that place
        model.blocks[0].mlp.W_out[1:] = 0
    moved, done = explain_all(model, search, slices, tmp_path / "a", sample=9, seed=1, progress=False)
    assert done and sorted((r["param"], tuple(r["index"])) for r in moved) == sorted(sample_weights(model, 9, seed=1))
    assert len(list((tmp_path / "a").glob("weights.stale-*.jsonl"))) == 2


def test_records_of_a_model_that_differs_in_the_last_bits_are_set_aside(tmp_path):
    """The same recipe retrained on another CPU gives the same weight sample but other values: its
    records must not be mixed with this model's."""
    model = _planted()
    search, slices = _text(8, 32, 0), [_text(4, 32, s) for s in range(1, 4)]
    first, _ = explain_all(model, search, slices, tmp_path, sample=5, progress=False)
    with torch.no_grad():
        p = model.blocks[0].attn.W_Q
        p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))     # one ulp up, every entry
    assert sample_weights(model, 5) == sample_weights(_planted(), 5)        # the same sample either way
    again, done = explain_all(model, search, slices, tmp_path, sample=5, progress=False)
    assert done and len(list(tmp_path.glob("weights.stale-*.jsonl"))) == 1  # the old records kept aside
    header = json.loads((tmp_path / "weights.jsonl").read_text().splitlines()[0])
    assert header["settings"]["model_sha256"] == model_sha256(model) != model_sha256(_planted())


def test_wilson_interval():
    assert wilson(0, 0) is None
    lo, hi = wilson(0, 10)
    assert lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)          # the textbook value
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    for k, n in [(1, 7), (3, 150), (149, 150), (500, 500)]:
        lo, hi = wilson(k, n)
        assert 0 <= lo <= k / n <= hi <= 1
    assert np.diff(wilson(30, 100)) > np.diff(wilson(300, 1000))      # more weights, a narrower interval
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_shuffle_within_blocks_keeps_each_blocks_bytes_and_destroys_their_order():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, 1000).astype(np.uint8)
    s = shuffle_within_blocks(tokens, 129, seed=0)
    assert s.dtype == tokens.dtype and s.shape == tokens.shape
    for lo in range(0, 1000, 129):
        assert sorted(s[lo:lo + 129]) == sorted(tokens[lo:lo + 129])
    assert (s == tokens).mean() < 0.05
    assert np.array_equal(s, shuffle_within_blocks(tokens, 129, seed=0))
    assert not np.array_equal(s, shuffle_within_blocks(tokens, 129, seed=1))
    with pytest.raises(ValueError):
        shuffle_within_blocks(tokens.reshape(10, 100), 10)

"""Hostile inputs to the per-weight scan and its loaders: each is refused with a ScanError or
CheckpointError that names the problem, or (where legitimate) gives the right answer; a resumed
store refuses another architecture or readout."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wtc import checkpoint_io
from wtc.errors import CheckpointError, ScanError, WtcError
from wtc.models import Transformer, TransformerConfig
from wtc.models.io import load, load_tokens, save
from wtc.scan import scan
from wtc.scan.reference import naive_position_kl


def tiny(act_fn="relu", seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=7, n_ctx=6, act_fn=act_fn)
    return Transformer(cfg).double()


TOKENS = torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]])


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([[1, -1, 2]]), "negative token id"),
    (torch.tensor([[1, 7, 2]]), "vocabulary has 7"),
    (torch.zeros(1, 7, dtype=torch.long), "context is 6"),
    (torch.zeros(0, 3, dtype=torch.long), "empty"),
    (torch.zeros(2, 0, dtype=torch.long), "empty"),
    (torch.zeros(3, dtype=torch.long), r"shape \(B, T\)"),
    (torch.zeros(2, 3, dtype=torch.bool), "dtype"),
    (np.zeros((2, 3), np.complex64), "dtype"),
    (np.array([[1, 2], [3]], dtype=object), "integer"),
])
def test_bad_tokens_are_refused(bad, match):
    with pytest.raises(ScanError, match=match):
        scan(tiny(), bad, params="blocks.0.mlp.W_out", progress=False)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint16, np.int32, np.uint64])
def test_small_integer_dtypes_scan_like_int64(dtype):
    model = tiny()
    want = scan(model, TOKENS, params="unembed.W_U", progress=False).total_kl["unembed.W_U"]
    got = scan(model, TOKENS.numpy().astype(dtype), params="unembed.W_U", progress=False).total_kl["unembed.W_U"]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("kw, match", [({"chunk": -1}, "chunk"), ({"chunk": 0}, "chunk"), ({"chunk": 2.5}, "chunk"),
                                       ({"batch": 0}, "batch"), ({"mass": float("nan")}, "mass"),
                                       ({"mass": "0.9"}, "mass"), ({"readout": 3}, "readout")])
def test_bad_options_are_refused(kw, match):
    with pytest.raises(ScanError, match=match):
        scan(tiny(), TOKENS, params="unembed.W_U", progress=False, **kw)


def test_scan_is_right_where_it_accepts():
    model = tiny()
    res = scan(model, TOKENS, params="blocks.0.mlp.W_in", progress=False, chunk=7)
    want = naive_position_kl(model, TOKENS, "blocks.0.mlp.W_in")
    got = torch.stack([res.position_kl("blocks.0.mlp.W_in", i) for i in range(len(want))])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_resume_refuses_another_architecture_or_readout(tmp_path):
    relu, gelu = tiny("relu"), tiny("gelu")
    gelu.load_state_dict(relu.state_dict())            # same weights, another function
    scan(relu, TOKENS, params="blocks.0.mlp.W_out", out=tmp_path, progress=False)
    with pytest.raises(ScanError, match="architecture"):
        scan(gelu, TOKENS, params="blocks.0.mlp.W_out", out=tmp_path, progress=False)
    with pytest.raises(ScanError, match="readout"):
        scan(relu, TOKENS, params="blocks.0.mlp.W_out", out=tmp_path, progress=False, readout=lambda o: 2 * o)
    scale = 2.0
    other = tmp_path / "closure"
    scan(relu, TOKENS, params="unembed.W_U", out=other, progress=False, readout=lambda o: scale * o)
    scale = 3.0            # the same lambda over another value computes another function
    with pytest.raises(ScanError, match="readout"):
        scan(relu, TOKENS, params="unembed.W_U", out=other, progress=False, readout=lambda o: scale * o)
    again = scan(relu, TOKENS, params="blocks.0.mlp.W_out", out=tmp_path, progress=False)   # same: resumes
    assert again.weights_scanned == 0


def test_resume_refuses_an_edited_or_damaged_store(tmp_path):
    import sqlite3

    model = tiny()
    first = scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "a", progress=False, chunk=7)
    first.store.close()
    db = tmp_path / "a" / "scan.sqlite"
    with sqlite3.connect(str(db)) as conn:                     # one total edited
        conn.execute("UPDATE weights SET total = total * 2 WHERE idx = 3")
    with pytest.raises(ScanError, match=r"rows of blocks.0.mlp.W_in \[0, 7\) do not match"):
        scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "a", progress=False, chunk=7)
    b = scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "b", progress=False, chunk=7)
    b.store.close()
    with sqlite3.connect(str(tmp_path / "b" / "scan.sqlite")) as conn:   # rows lost, marker kept
        conn.execute("DELETE FROM weights WHERE idx >= 7 AND idx < 14")
    with pytest.raises(ScanError, match=r"\[7, 14\) do not match"):
        scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "b", progress=False, chunk=7)
    c = scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "c", progress=False, chunk=7)
    c.store.close()
    with sqlite3.connect(str(tmp_path / "c" / "scan.sqlite")) as conn:   # a marker lost, its rows kept
        conn.execute("DELETE FROM chunks WHERE start = 0")
    with pytest.raises(ScanError, match="outside every finished chunk"):
        scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "c", progress=False, chunk=7)
    again = scan(model, TOKENS, params="blocks.0.mlp.W_in", out=tmp_path / "d", progress=False, chunk=7)
    torch.testing.assert_close(again.total_kl["blocks.0.mlp.W_in"], first.total_kl["blocks.0.mlp.W_in"])


def test_token_files(tmp_path):
    np.save(tmp_path / "u64.npy", np.array([[1, 2], [2**63 + 5, 1]], np.uint64))
    with pytest.raises(ScanError, match="beyond int64"):
        load_tokens(tmp_path / "u64.npy")
    np.save(tmp_path / "neg.npy", np.array([[1, -3]], np.int16))
    with pytest.raises(ScanError, match="negative"):
        load_tokens(tmp_path / "neg.npy")
    np.save(tmp_path / "ok.npy", np.array([[1, 2]], np.uint8))
    assert load_tokens(tmp_path / "ok.npy").dtype == torch.int64
    (tmp_path / "t.txt").write_text("1 2")
    with pytest.raises(ScanError, match=r"\.npy or \.pt"):
        load_tokens(tmp_path / "t.txt")
    with pytest.raises(ScanError, match="no such"):
        load_tokens(tmp_path / "missing.npy")


def test_bad_checkpoints_are_checkpoint_errors(tmp_path):
    d = save(tiny(), tmp_path / "m")
    assert isinstance(load(d), Transformer)
    meta = json.loads((d / "model.json").read_text())
    meta["config"]["act_fn"] = "relu" if meta["config"]["act_fn"] != "relu" else "gelu"
    (d / "model.json").write_text(json.dumps(meta))             # an edit that fits the weights: refused
    with pytest.raises(CheckpointError, match="metadata does not match"):
        load(d)
    (d / "model.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt checkpoint metadata"):
        load(d)
    d3 = save(tiny(), tmp_path / "m3")
    tensors, meta = checkpoint_io.read(d3 / "model")
    checkpoint_io.write_atomic(d3 / "model", tensors, {**meta, "config": {"n_layers": 0}})
    with pytest.raises(CheckpointError, match="TransformerConfig"):
        load(d3)
    checkpoint_io.write_atomic(d3 / "model", tensors, {**meta, "kind": "something else"})
    with pytest.raises(CheckpointError, match="is not a wtc.models.Transformer"):
        load(d3)
    d2 = save(tiny(), tmp_path / "m2")
    (d2 / "model.safetensors").write_bytes((d2 / "model.safetensors").read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt checkpoint tensors"):
        load(d2)
    with pytest.raises(CheckpointError, match="not a wtc transformer checkpoint"):
        load(tmp_path / "nowhere")
    assert issubclass(CheckpointError, WtcError)


class _Tied(torch.nn.Module):
    """A language model whose head weight is tied to its embedding, head registered first (so the
    shared parameter is named head.weight and looks like a plain final linear map)."""

    def __init__(self, head_first: bool):
        super().__init__()
        V, D = 12, 6
        if head_first:
            self.head = torch.nn.Linear(D, V, bias=False)
            self.emb = torch.nn.Embedding(V, D)
            self.emb.weight = self.head.weight
        else:
            self.emb = torch.nn.Embedding(V, D)
            self.head = torch.nn.Linear(D, V, bias=False)
            self.head.weight = self.emb.weight
        self.mix = torch.nn.Linear(D, D)

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.emb(tokens))))


@pytest.mark.parametrize("head_first", [True, False])
def test_a_tied_head_weight_is_scanned_exactly(head_first):
    torch.manual_seed(0)
    model, tokens = _Tied(head_first).double(), torch.randint(0, 12, (3, 5))
    name = "head.weight" if head_first else "emb.weight"
    res = scan(model, tokens, params=name, progress=False)
    want = naive_position_kl(model, tokens, name)
    got = torch.stack([res.position_kl(name, i) for i in range(len(want))])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("readout, match", [(lambda o: (o, o), "got tuple"), (lambda o: o.int(), "torch.int32 tensor"),
                                            (lambda o: "x", "got str")])
def test_a_readout_that_does_not_return_float_logits_is_named(readout, match):
    with pytest.raises(ScanError, match=match):
        scan(tiny(), TOKENS, params="blocks.0.mlp.W_in", readout=readout, progress=False)


class _Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(5, 4)
        self.head = torch.nn.Linear(4, 5)

    def forward(self, tokens):
        return self.head(self.emb(tokens)) + torch.randn(5)


def test_a_model_whose_output_is_random_is_refused():
    with pytest.raises(ScanError, match="different logits for the same tokens"):
        scan(_Noisy(), torch.randint(0, 5, (2, 4)), progress=False)
    dropout = torch.nn.Sequential(torch.nn.Embedding(5, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 5)).train()
    scan(dropout, torch.randint(0, 5, (2, 4)), progress=False)     # scans run the model in eval mode


def test_resume_with_another_chunk_size_scans_only_what_is_missing(tmp_path):
    """A resume refused any change of chunk; chunks are bookkeeping, so it now continues with the new
    size over the ranges no finished chunk covers, and the result equals an uninterrupted scan."""
    import sqlite3

    model = tiny()
    name = "blocks.0.mlp.W_in"
    whole = scan(model, TOKENS, params=name, progress=False, chunk=7)
    scan(model, TOKENS, params=name, out=tmp_path, progress=False, chunk=7)
    db = sqlite3.connect(str(tmp_path / "scan.sqlite"))
    with db:                                  # as if killed: only the chunks at 0, 14 and 35 finished
        kept = (0, 14, 35)
        db.execute(f"DELETE FROM weights WHERE idx NOT IN ({','.join(str(i) for s in kept for i in range(s, s + 7))})")
        db.execute(f"DELETE FROM chunks WHERE start NOT IN {kept}")
    db.close()
    n = whole.total_kl[name].numel()
    resumed = scan(model, TOKENS, params=name, out=tmp_path, progress=False, chunk=5)
    assert resumed.weights_scanned == n - 21
    torch.testing.assert_close(resumed.total_kl[name], whole.total_kl[name], rtol=0, atol=0)
    assert scan(model, TOKENS, params=name, out=tmp_path, progress=False, chunk=3).weights_scanned == 0

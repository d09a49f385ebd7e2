"""scan in the user's words: a wrapped model's own parameter names (a Hugging Face model's, no
`hf.`), a one-line error with the closest names when neither spelling matches; the store's disk
use said before the scan starts (and bounding what is written), a scan refused when it cannot fit."""
from __future__ import annotations

import logging
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from wtc.errors import ScanError, UnknownName
from wtc.models import Transformer, TransformerConfig
from wtc.models.io import save
from wtc.scan import scan
from wtc.scan import store as scan_store
from wtc.scan.names import wrapper_prefix

V, T = 23, 7


def _hf_model():
    transformers = pytest.importorskip("transformers")
    from wtc.models.hf import HFModel

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=V, n_positions=16, n_inner=24)).double().eval()
    return HFModel(hf)


def _tokens(n=3):
    return torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(0))


def test_hf_model_scans_by_its_own_parameter_names():
    model, tokens = _hf_model(), _tokens()
    own = "transformer.h.1.attn.c_proj.weight"
    assert own not in dict(model.named_parameters()) and "hf." + own in dict(model.named_parameters())
    short = scan(model, tokens, params=own, progress=False)
    full = scan(model, tokens, params="hf." + own, progress=False)
    assert list(short.total_kl) == ["hf." + own]                  # results keep the full name
    assert torch.equal(short.total_kl[own], full.total_kl["hf." + own])   # and find it by either spelling
    assert float(short.total_kl[own].sum()) > 0
    assert torch.equal(short.position_kl(own, (2, 3)), full.position_kl("hf." + own, (2, 3)))
    pattern = scan(model, tokens, params="transformer.h.*.attn.c_proj.bias", progress=False)
    assert sorted(pattern.total_kl) == ["hf.transformer.h.0.attn.c_proj.bias", "hf.transformer.h.1.attn.c_proj.bias"]
    mask = torch.zeros(16, 16, dtype=torch.bool)
    mask[0, :4] = True
    some = scan(model, tokens, params=own, weights={own: mask}, progress=False)
    assert some.weights_scanned == 4
    assert torch.equal(some.total_kl[own][mask], full.total_kl["hf." + own][mask])


def test_a_name_matching_neither_spelling_is_one_line_with_the_closest():
    model, tokens = _hf_model(), _tokens()
    with pytest.raises(UnknownName) as err:
        scan(model, tokens, params="transformer.h.1.attn.c_proj.weigth", progress=False)
    msg = str(err.value).strip("'\"")
    assert "\n" not in msg
    assert "no parameter matches 'transformer.h.1.attn.c_proj.weigth'" in msg
    assert "closest: transformer.h.1.attn.c_proj.weight" in msg and "'hf.'" in msg


def test_models_without_a_wrapper_keep_their_exact_names():
    model = Transformer(TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=8, d_vocab=5, n_ctx=4))
    assert wrapper_prefix(n for n, _ in model.named_parameters()) == ""
    with pytest.raises(UnknownName, match="no parameter matches '0.mlp.W_in'"):
        scan(model, torch.zeros(1, 4, dtype=torch.long), params="0.mlp.W_in", progress=False)
    assert wrapper_prefix(["hf.a.weight", "hf.b.bias"]) == "hf."
    assert wrapper_prefix(["hf.a.weight", "bias"]) == ""


def _model_and_tokens():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layers=1, d_model=32, n_heads=2, d_head=8, d_mlp=64, d_vocab=11, n_ctx=16))
    tokens = torch.randint(0, 11, (4, 16), generator=torch.Generator().manual_seed(1))
    return model, tokens


def _store_bytes(directory) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.name.startswith("scan.sqlite"))


@pytest.mark.parametrize("keep", [True, False])
def test_estimated_disk_use_is_said_first_and_bounds_the_store(tmp_path, caplog, keep):
    model, tokens = _model_and_tokens()
    out = tmp_path / "scan"
    with caplog.at_level(logging.INFO, logger="wtc"):
        res = scan(model, tokens, params="blocks.0.mlp.W_in", out=out, keep_positions=keep)
    printed = caplog.text
    m = re.search(r"estimated disk use: ([\d.]+)-([\d.]+) MB for (\d+) weights in (\S+)", printed)
    assert m, printed
    assert int(m.group(3)) == res.weights_scanned == int((model.blocks[0].mlp.W_in != 0).sum())
    assert m.group(4) == str(out)
    est = scan_store.disk_estimate({"blocks.0.mlp.W_in": res.weights_scanned}, tokens.numel(), keep)
    res.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")       # the rows into the file, as at close
    empty = scan_store.ScanStore(tmp_path / "empty" / "scan.sqlite")
    empty.bind(res.store.meta())
    empty.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = _store_bytes(out) - _store_bytes(tmp_path / "empty")
    assert est.low <= rows <= est.high, (est, rows)
    assert abs(float(m.group(1)) - est.low / 1e6) < 0.01 and abs(float(m.group(2)) - est.high / 1e6) < 0.01


def test_quiet_scan_says_nothing_and_a_finished_store_needs_no_estimate(tmp_path, caplog):
    model, tokens = _model_and_tokens()
    with caplog.at_level(logging.INFO, logger="wtc"):
        scan(model, tokens, params="blocks.0.mlp.W_in", out=tmp_path, progress=False)
        assert "estimated disk use" not in caplog.text
        scan(model, tokens, params="blocks.0.mlp.W_in", out=tmp_path)          # everything is in the store
        assert "estimated disk use" not in caplog.text
        scan(model, tokens, params="blocks.0.mlp.W_*", out=tmp_path / "more")
        assert "for 4096 weights" in caplog.text


def test_a_scan_that_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    model, tokens = _model_and_tokens()
    real = scan_store.shutil.disk_usage
    monkeypatch.setattr(scan_store.shutil, "disk_usage", lambda p: real(p)._replace(free=10_000))
    with pytest.raises(ScanError, match=r"needs at least [\d.]+ MB in .* but its filesystem has 0.01 MB free"):
        scan(model, tokens, params="blocks.0.mlp.W_in", out=tmp_path)
    assert scan_store.ScanStore(tmp_path / "scan.sqlite").count() == 0


def test_cli_scan_says_its_disk_use_before_it_starts(tmp_path):
    model, tokens = _model_and_tokens()
    save(model, tmp_path / "model")
    np.save(tmp_path / "tokens.npy", tokens.numpy())
    r = subprocess.run([sys.executable, "-m", "wtc", "scan", str(tmp_path / "model"), "--tokens",
                        str(tmp_path / "tokens.npy"), "--params", "blocks.0.mlp.W_out", "--out", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [ln for ln in r.stderr.splitlines() if "estimated disk use" in ln]     # progress: on stderr
    assert len(said) == 1, r.stderr
    assert re.search(rf"estimated disk use: [\d.]+-[\d.]+ MB for 2048 weights in {re.escape(str(tmp_path / 's'))} ",
                     said[0]), said
    assert r.stderr.index("estimated disk use") < r.stderr.index("0/2048")          # before the first weight
    assert "scanned 2048 weights" in r.stdout

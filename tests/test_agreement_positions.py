"""ACE with per-input positions (sentences of different lengths read at their own verb position)."""
import pytest
import torch

from wtc.ace import extract_core, keep_kl, patched, patched_accuracy, validate
from wtc.errors import AceError
from wtc.models import Transformer, TransformerConfig


def model():
    cfg = TransformerConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=9,
                            normalization="LN")
    return Transformer(cfg, seed=0).double().eval()


def readout(out):            # (B, V) at the chosen positions -> (B, 3)
    return out[:, :3]


def data(n=96):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 11, (n, 9), generator=g), torch.randint(2, 9, (n,), generator=g)


def test_constant_per_input_positions_are_the_int_position():
    m = model()
    x, _ = data()
    pos = torch.full((len(x),), 8)
    a = extract_core(m, x, "blocks.1.hook_resid_post", readout=readout, position=pos, chunk=40)
    b = extract_core(m, x, "blocks.1.hook_resid_post", readout=lambda o: o[:, -1, :3], position=-1)
    assert a.rank == b.rank and torch.allclose(a.s, b.s, rtol=1e-10)
    with torch.no_grad():
        labels = m(x)[:, -1, :3].argmax(-1)
    va = validate(a, m, x, labels, readout=readout)
    vb = validate(b, m, x, labels, readout=lambda o: o[:, -1, :3])
    assert {k: va[k] for k in va if k != "rank"} == {k: vb[k] for k in vb if k != "rank"}


def test_per_input_positions_read_and_patch_each_inputs_own_position():
    m = model()
    x, pos = data()
    core = extract_core(m, x, "blocks.1.hook_resid_post", readout=readout, position=pos, chunk=40)
    # the same Gramians from each position group on its own, merged: H at input i's position
    rows = torch.arange(len(x))
    _, cache = m.run_with_cache(x, names_filter="blocks.1.hook_resid_post")
    H = cache["blocks.1.hook_resid_post"][rows, pos].double()
    assert torch.allclose(core.mean, H.mean(0), atol=1e-12)
    with torch.no_grad():
        clean = m(x)
        labels = clean[rows, pos, :3].argmax(-1)
        with patched(m, core, "flip", rank=core.basis.shape[1], positions=pos):
            flipped = m(x)
    # positions other than each input's own are untouched up to that position (causal)
    for i in range(len(x)):
        assert torch.equal(flipped[i, : pos[i]], clean[i, : pos[i]])
    assert patched_accuracy(m, x, labels, core, "clean", readout=readout) == 1.0
    v = validate(core, m, x, labels, readout=readout)
    assert v["baseline_acc"] == 1.0 and 0 <= v["remove_acc"] <= 1
    assert keep_kl(m, x, core, core.basis.shape[1], readout=readout) < keep_kl(m, x, core, 0, readout=readout)
    with pytest.raises(AceError, match="positions"):
        validate(core, m, x[:10], labels[:10], readout=readout)
    with pytest.raises(AceError, match="positions"):
        extract_core(m, x, "blocks.1.hook_resid_post", readout=readout, position=pos[:5])
    with pytest.raises(AceError, match="positions"):
        patched(m, core, "flip")

"""RMSNorm and AbsTopK in wtc.models.Transformer; weight-sparse LM training (wtc.models.sparse):
the top-k projection against a sort-based reference, the density schedule, dense AdamW moments,
resume equal to an uninterrupted run, and bad configs."""
import json

import numpy as np
import pytest
import torch

from wtc.models import sparse as S
from wtc.models import Transformer
from wtc.models import io as model_io
from wtc.models import training as T
from wtc.models.tl import from_tl_state_dict, to_tl_state_dict
from wtc.models.transformer import RMSNorm


def tiny_cfg(**kw):
    base = {"d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, "d_vocab": 23, "n_ctx": 12}
    return S.lm_config(**{**base, **kw})


def stream(n=3000, vocab=23, seed=0):
    """A token stream with some structure (a noisy ramp), vocab ids < 23."""
    r = np.random.default_rng(seed)
    return ((np.arange(n) + (r.random(n) < 0.2) * r.integers(0, vocab, n)) % vocab).astype(np.uint8)


def train_cfg(**kw):
    base = {"steps": 6, "batch": 4, "lr": 3e-3, "warmup": 2, "density": 0.2, "anneal_frac": 0.5,
            "min_per_unit": 2, "eval_every": 2, "eval_windows": 4, "threads": 1}
    return S.SparseTrainConfig(**{**base, **kw})


# ------------------------------------------------------------------------------ RMSNorm, AbsTopK

def test_rmsnorm_equals_float64_reference_and_the_transformerlens_formula(rng):
    x = torch.from_numpy(rng.normal(size=(3, 5, 16)) * 3 + 1)
    w = torch.from_numpy(rng.normal(size=16))
    norm = RMSNorm(16).double()
    with torch.no_grad():
        norm.w.copy_(w)
    xn, wn = x.numpy(), w.numpy()
    ref = xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + 1e-5) * wn
    torch.testing.assert_close(norm(x), torch.from_numpy(ref), rtol=1e-13, atol=1e-13)
    scale = (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()        # TransformerLens RMSNorm.forward
    torch.testing.assert_close(norm(x), x / scale * w, rtol=0, atol=0)
    # float32 module against the float64 reference
    norm32 = RMSNorm(16)
    with torch.no_grad():
        norm32.w.copy_(w.float())
    torch.testing.assert_close(norm32(x.float()).double(), torch.from_numpy(ref), rtol=1e-5, atol=1e-5)


def test_rms_model_logits_finite_hooks_and_exact_roundtrips(tmp_path):
    cfg = tiny_cfg()
    model = Transformer(cfg, seed=1)
    names = set(model.state_dict())
    assert {"blocks.0.ln1.w", "blocks.1.ln2.w", "ln_final.w"} <= names
    assert not [n for n in names if n.endswith((".ln1.b", ".ln2.b", "ln_final.b"))]
    x = torch.randint(0, cfg.d_vocab, (3, cfg.n_ctx), generator=torch.Generator().manual_seed(0))
    logits, cache = model.run_with_cache(x)
    assert torch.isfinite(logits).all() and logits.shape == (3, cfg.n_ctx, cfg.d_vocab)
    assert cache["ln_final.hook_scale"].shape == (3, cfg.n_ctx, 1)
    resid = cache["blocks.1.hook_resid_post"]
    torch.testing.assert_close(cache["ln_final.hook_normalized"], resid / cache["ln_final.hook_scale"])
    with torch.no_grad():
        for p in model.parameters():                                 # norms away from 1
            p.add_(0.1 * torch.randn_like(p))
    model_io.save(model, tmp_path / "m")
    back = model_io.load(tmp_path / "m")
    assert back.cfg == cfg
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)
    tl_back = from_tl_state_dict(to_tl_state_dict(model), cfg)
    torch.testing.assert_close(tl_back(x), model(x), rtol=0, atol=0)


def test_abstopk_keeps_the_top_quarter_per_position_and_survives_save_load(tmp_path):
    cfg = tiny_cfg(abstopk=0.25)
    model = Transformer(cfg, seed=2).double()
    x = torch.randint(0, cfg.d_vocab, (2, cfg.n_ctx), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(x)
    pre, post = cache["blocks.0.mlp.hook_pre"], cache["blocks.0.mlp.hook_post"]
    act = torch.relu(pre)
    k = round(0.25 * cfg.d_mlp)
    kth = act.sort(-1, descending=True).values[..., k - 1:k]               # the k-th largest per position
    torch.testing.assert_close(post, torch.where(act >= kth, act, 0.0), rtol=0, atol=0)
    assert int((post != 0).sum(-1).max()) <= k
    model_io.save(model, tmp_path / "m")
    back = model_io.load(tmp_path / "m")
    assert back.cfg.mlp_abstopk == 0.25
    torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)


def test_bad_model_options_are_named():
    with pytest.raises(ValueError, match="normalization"):
        tiny_cfg(normalization="RMSPre")
    with pytest.raises(ValueError, match="mlp_abstopk"):
        tiny_cfg(abstopk=1.5)


# ------------------------------------------------------------------------------ projection

def _reference_keep(w: np.ndarray, density: float, m: int, axis: int) -> np.ndarray:
    a = np.abs(w)
    k = round(density * w.size)
    keep = np.zeros(w.size, bool)
    keep[np.argsort(-a.ravel(), kind="stable")[:k]] = True
    keep = keep.reshape(w.shape)
    if m:
        moved = np.moveaxis(a, axis, -1)
        order = np.argsort(-moved, axis=-1, kind="stable")[..., :m]
        unit = np.zeros(moved.shape, bool)
        np.put_along_axis(unit, order, True, axis=-1)
        keep |= np.moveaxis(unit, -1, axis)
    return keep


@pytest.mark.parametrize("density,m", [(0.1, 0), (0.3, 0), (0.05, 4), (0.5, 3)])
def test_project_topk_equals_a_sort_based_reference_and_is_idempotent(density, m):
    model = Transformer(tiny_cfg(), seed=3).double()
    before = {n: p.detach().clone().numpy() for n, p, _ in S.sparse_parameters(model)}
    axes = {n: a for n, _, a in S.sparse_parameters(model)}
    assert set(axes) == {"embed.W_E", "pos_embed.W_pos", "unembed.W_U"} | {
        f"blocks.{l}.{k}" for l in (0, 1) for k in ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "mlp.W_in", "mlp.W_out")}
    dens = S.project_topk(model, density, m)
    params = dict(model.named_parameters())
    bound = S.density_allowance(model, density, m)
    for n, w in before.items():
        keep = _reference_keep(w, density, m, axes[n])
        got = params[n].detach().numpy()
        np.testing.assert_array_equal(got != 0, keep, err_msg=n)
        np.testing.assert_array_equal(got[keep], w[keep], err_msg=n)       # kept weights unchanged
        assert dens[n] == keep.mean() <= bound[n] + 1e-12
        if m:                                                               # every unit keeps >= m
            assert (np.moveaxis(got != 0, axes[n], -1).sum(-1) >= m).all(), n
    # biases and norm weights are untouched
    assert all(float(params[n].detach().abs().min()) > 0 for n in ("blocks.0.ln1.w", "ln_final.w"))
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    S.project_topk(model, density, m)
    for n, p in model.named_parameters():
        assert torch.equal(p, snapshot[n]), n


def test_project_topk_rejects_bad_arguments():
    model = Transformer(tiny_cfg(), seed=0)
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="density"):
            S.project_topk(model, bad)
    with pytest.raises(ValueError, match="min_per_unit"):
        S.project_topk(model, 0.5, -1)


def test_density_schedule_is_linear_from_dense_to_target():
    cfg = train_cfg(steps=100, density=0.1, anneal_frac=0.4)
    assert S.density_schedule(0, cfg) == 1.0
    assert S.density_schedule(40, cfg) == pytest.approx(0.1) and S.density_schedule(100, cfg) == pytest.approx(0.1)
    assert S.density_schedule(20, cfg) == pytest.approx(0.55)
    assert S.density_schedule(10, cfg) == pytest.approx(1 - 0.9 * 0.25)
    d = [S.density_schedule(s, cfg) for s in range(41)]
    assert np.allclose(np.diff(d), -0.9 / 40)
    assert S.density_schedule(50, train_cfg(density=1.0)) == 1.0
    lr = [S.lr_schedule(s, cfg) for s in range(100)]
    assert lr[0] == pytest.approx(cfg.lr / cfg.warmup) and max(lr) == pytest.approx(cfg.lr)
    assert lr[-1] == pytest.approx(cfg.lr * cfg.min_lr_frac)


# ------------------------------------------------------------------------------ training

def test_sparse_training_keeps_density_and_dense_moments(tmp_path):
    model = Transformer(tiny_cfg(), seed=4)
    cfg = train_cfg()
    tokens = stream()
    r = S.train_lm(model, tokens, cfg, out=tmp_path, heldout_tokens=stream(600, seed=1), progress=False)
    assert r["finished"] and r["steps_done"] == 6 and len(r["history"]) == 6
    assert [h["step"] for h in r["history"]] == list(range(1, 7))
    assert r["history"][0]["density"] < 1 and r["history"][-1]["density"] == pytest.approx(0.2)
    assert [e["step"] for e in r["evals"]] == [2, 4, 6]
    assert np.isfinite(r["train_loss"]) and np.isfinite(r["heldout_loss"])
    bound = S.density_allowance(model, 0.2, 2)
    assert set(r["densities"]) == set(bound)
    for n, d in r["densities"].items():
        assert d <= bound[n] + 1e-12 and d == S.nonzero_fraction(model)[n], n
    # AdamW moments stay dense: the optimiser's exp_avg is nonzero where weights were zeroed
    opt = T.read_state(tmp_path / "train_state").optimizer
    for i, (n, p, _) in enumerate(S.sparse_parameters(model)):
        zero = p.detach() == 0
        m1 = opt["state"][i]["exp_avg"]
        assert m1.shape == p.shape
        if n != "embed.W_E":        # rows of tokens never seen get no gradient
            assert bool((m1[zero] != 0).float().mean() > 0.9), n
        assert int((m1 != 0).sum()) > int((~zero).sum()), n
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] and "history" not in summary
    assert len(json.loads((tmp_path / "history.json").read_text())["history"]) == 6
    # dense training stays dense
    dense = Transformer(tiny_cfg(), seed=4)
    r = S.train_lm(dense, tokens, train_cfg(density=1.0, steps=2), progress=False)
    assert all(d == 1.0 for d in r["densities"].values())


def test_resume_after_a_stop_equals_an_uninterrupted_run(tmp_path):
    tokens = stream()
    cfg = train_cfg(steps=7, checkpoint_every=2)
    full = Transformer(tiny_cfg(abstopk=0.25), seed=5)
    r_full = S.train_lm(full, tokens, cfg, out=tmp_path / "full", progress=False)
    part = Transformer(tiny_cfg(abstopk=0.25), seed=5)
    r = S.train_lm(part, tokens, cfg, out=tmp_path / "part", progress=False, stop_after=3)
    assert not r["finished"] and r["steps_done"] == 3
    resumed = Transformer(tiny_cfg(abstopk=0.25), seed=99)            # its own init is overwritten
    r_res = S.train_lm(resumed, tokens, cfg, out=tmp_path / "part", progress=False)
    assert r_res["finished"] and r_res["history"] == r_full["history"]
    for k, v in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k
    a = T.read_state(tmp_path / "full" / "train_state").optimizer
    b = T.read_state(tmp_path / "part" / "train_state").optimizer
    for i, st in a["state"].items():
        assert all(torch.equal(st[key], b["state"][i][key]) for key in st)
    # the finished checkpoint loads as a plain model
    torch.testing.assert_close(T.load_model(tmp_path / "full" / "train_state").state_dict()["unembed.W_U"],
                               full.state_dict()["unembed.W_U"], rtol=0, atol=0)
    # a changed schedule cannot resume silently
    with pytest.raises(ValueError, match="lr"):
        S.train_lm(Transformer(tiny_cfg(abstopk=0.25)), tokens, train_cfg(steps=7, checkpoint_every=2, lr=1e-2),
                   out=tmp_path / "part", progress=False)
    with pytest.raises(ValueError, match="train_tokens"):
        S.train_lm(Transformer(tiny_cfg(abstopk=0.25)), stream(seed=7), cfg, out=tmp_path / "part", progress=False)
    (tmp_path / "part" / "train_state.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt"):
        S.train_lm(Transformer(tiny_cfg(abstopk=0.25)), tokens, cfg, out=tmp_path / "part", progress=False)


@pytest.mark.parametrize("field,value", [
    ("steps", 0), ("batch", 2.5), ("lr", -1e-3), ("lr", float("nan")), ("warmup", 50), ("weight_decay", -0.1),
    ("betas", (0.9, 1.0)), ("betas", (0.9,)), ("density", 0.0), ("density", 1.2), ("anneal_frac", 1.5),
    ("min_per_unit", -1), ("seed", -1), ("threads", 0), ("eval_every", 0), ("grad_clip", 0.0),
    ("min_lr_frac", 2.0), ("ctx", 0)])
def test_bad_train_config_values_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        train_cfg(**{field: value})


def test_bad_tokens_are_named():
    model = Transformer(tiny_cfg(), seed=0)
    cfg = train_cfg(steps=1, warmup=0)
    with pytest.raises(ValueError, match=r"train_tokens.*\[0, 23\)"):
        S.train_lm(model, np.arange(100) % 30, cfg, progress=False)
    with pytest.raises(ValueError, match="train_tokens.*1-D"):
        S.train_lm(model, np.zeros((10, 20), np.int64), cfg, progress=False)
    with pytest.raises(ValueError, match="heldout_tokens.*ctx"):
        S.train_lm(model, stream(), cfg, heldout_tokens=np.zeros(5, np.int64), progress=False)
    with pytest.raises(ValueError, match="ctx"):
        S.train_lm(model, stream(), train_cfg(steps=1, warmup=0, ctx=13), progress=False)

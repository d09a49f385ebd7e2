"""Per-weight ablation scans: native kernels against torch references, the batched scan against
the naive loop, the store (resume after a kill), sharding, and bad inputs."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch import nn

from wtc import _native
from wtc.scan import kl as K
from wtc.scan import scan
from wtc.scan.reference import naive_position_kl
from wtc.models import Transformer, TransformerConfig

C = _native.cpu_module()
needs_native = pytest.mark.skipif(C is None, reason="wtc._C not built")


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def tiny_model(normalization=None, seed=0, abstopk=None):
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=7, n_ctx=6,
                            normalization=normalization, mlp_abstopk=abstopk)
    return Transformer(cfg, seed=seed).double()


@needs_native
@pytest.mark.parametrize("A,N,V", [(1, 1, 2), (3, 17, 5), (4, 9, 131)])
def test_kl_rows_native_matches_reference(rng, A, N, V):
    logits = torch.randn(N, V, generator=rng) * 4
    logp = torch.log_softmax(logits, -1)
    ablated = logits[None] + torch.randn(A, N, V, generator=rng)
    got = torch.from_numpy(C.kl_rows(logp.numpy(), ablated.numpy()))
    want = K.kl_rows_reference(logp, ablated)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert (got >= -1e-12).all()


@needs_native
@pytest.mark.parametrize("A,N,V", [(1, 1, 3), (5, 33, 70)])
def test_kl_rank1_native_matches_materialised_logits(rng, A, N, V):
    logits = torch.randn(N, V, generator=rng) * 3
    logp = torch.log_softmax(logits.double(), -1).float()
    delta = torch.randn(A, N, generator=rng)
    direction = torch.randn(A, V, generator=rng)
    got = torch.from_numpy(C.kl_rank1(logp.numpy(), logits.numpy(), delta.numpy(), direction.numpy()))
    want = K.kl_rows_reference(logp, logits.double()[None] + delta.double()[:, :, None] * direction.double()[:, None])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="direction: size"):
        C.kl_rank1(logp.numpy(), logits.numpy(), delta.numpy(), direction[:, :-1].numpy())


@needs_native
def test_native_kl_has_no_float32_noise_floor(rng):
    """Unchanged logits give KL 0 to ~1e-15, not the ~1e-7 that clean log-probs rounded to float32
    would leave (the KL is a difference of O(1) sums); and a tiny change gives its tiny KL."""
    logits = torch.randn(64, 300, generator=rng) * 5
    logp = torch.log_softmax(logits.double(), -1)
    same = K.kl_rows(logp, logits[None].clone())
    assert same.abs().max() < 1e-13
    assert K.kl_rank1(logp, logits, torch.zeros(2, 64), torch.randn(2, 300, generator=rng)).abs().max() < 1e-13
    ablated = logits[None] + 1e-3 * torch.randn(1, 64, 300, generator=rng)
    # both sides are float64 differences of O(1) sums (~1e-14 apart, depending on the threads'
    # summation order), six orders below the float32 floor this test is about
    torch.testing.assert_close(K.kl_rows(logp, ablated), K.kl_rows_reference(logp, ablated), rtol=1e-6, atol=5e-14)


@pytest.mark.parametrize("normalization", [None, "LN"])
def test_float32_scan_matches_the_naive_loop(normalization):
    """The float32 paths (native KL kernels, reused buffers) against the naive loop of the same
    float32 model, to float32 forward noise."""
    cfg = TransformerConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=8,
                            normalization=normalization, act_fn="gelu")
    model = Transformer(cfg, seed=2)
    tokens = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(3))
    names = [n for n, p in model.named_parameters() if p.ndim >= 2 and bool((p != 0).any())]
    res = scan(model, tokens, params=names, progress=False, batch=3)
    for name in names:
        want = naive_position_kl(model, tokens, name)
        got = torch.stack([res.position_kl(name, i) for i in range(len(want))])
        torch.testing.assert_close(got, want, rtol=5e-3, atol=2e-6)


def test_closed_form_equals_brute_force_float64(rng):
    N, V, D = 13, 6, 5
    h = torch.randn(N, D, generator=rng, dtype=torch.float64)
    W = torch.randn(V, D, generator=rng, dtype=torch.float64)
    W[0, 0] = 1e-7                                           # tiny shift: the cancellation-prone case
    logp = torch.log_softmax(h @ W.T, -1)
    total, closed = K.kl_unembed(logp, h, W, per_position=True)          # every pair, v major
    for v in range(V):
        for j in range(D):
            W2 = W.clone()
            W2[v, j] = 0
            brute = K.kl_rows_reference(logp, torch.log_softmax(h @ W2.T, -1)[None])[0]
            torch.testing.assert_close(closed[v * D + j], brute, rtol=1e-9, atol=1e-14)   # float64 rounding of O(1) sums
            torch.testing.assert_close(total[v * D + j], brute.sum(), rtol=1e-9, atol=1e-14)


@needs_native
def test_closed_form_native_matches_reference(rng):
    N, V, D = 29, 9, 7
    h = torch.randn(N, D, generator=rng)
    W = torch.randn(V, D, generator=rng)
    W[2, 3] = 0.0
    W[1, 1] = 3e-6                                           # series branch
    logp = torch.log_softmax((h @ W.T).double(), -1).float()
    v = torch.randint(0, V, (40,), generator=rng)
    j = torch.randint(0, D, (40,), generator=rng)
    v[:2], j[:2] = torch.tensor([2, 1]), torch.tensor([3, 1])
    total, per = C.kl_unembed(logp.numpy(), h.numpy(), W.numpy(), v.numpy(), j.numpy(), True)
    ref = K.kl_unembed_reference(logp.double(), h.double(), W.double(), v, j)
    torch.testing.assert_close(torch.from_numpy(total), ref.sum(-1), rtol=1e-6, atol=1e-14)
    torch.testing.assert_close(torch.from_numpy(per).double(), ref, rtol=1e-5, atol=1e-12)
    assert total[0] == 0.0 and (per[0] == 0).all()
    assert abs(total[1] - ref[1].sum().item()) <= 1e-6 * ref[1].sum().item()     # relative, at ~1e-12
    with pytest.raises(ValueError, match="outside W"):
        C.kl_unembed(logp.numpy(), h.numpy(), W.numpy(), np.array([V]), np.array([0]), False)


@pytest.mark.parametrize("M,N", [(1, 1), (5, 40), (3, 1000)])
def test_importance_positions_against_a_sort(rng, M, N):
    kl = torch.rand(M, N, generator=rng) ** 4
    if M > 1:
        kl[1] = 0.0                                          # a weight with no effect: empty set
    if N >= 40:
        kl[0, :10] = 0.5                                     # ties, broken by position
    got = K.importance_positions(kl, 0.9)
    want = K.importance_positions_reference(kl, 0.9)
    for g, w, row in zip(got, want, kl.double()):
        np.testing.assert_array_equal(g, w)
        if row.sum() > 0:                                    # minimal: dropping its smallest is not enough
            assert row[g].sum() >= 0.9 * row.sum() * (1 - 1e-9)
            assert row[g].sum() - row[g].min() < 0.9 * row.sum()
        assert (np.diff(g) > 0).all()


def _scan_vs_naive(model, tokens, names, readout=None):
    res = scan(model, tokens, params=names, readout=readout, progress=False, batch=5)
    for name in names:
        want = naive_position_kl(model, tokens, name, readout)            # (n, N)
        p = dict(model.named_parameters())[name]
        for flat in range(p.numel()):
            got = res.position_kl(name, flat)
            torch.testing.assert_close(got, want[flat], rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(res.total_kl[name].flatten(), want.sum(-1), rtol=1e-5, atol=1e-9)
    return res


@pytest.mark.parametrize("normalization,abstopk", [(None, None), ("LN", None), ("RMS", None), (None, 0.25)])
def test_scan_equals_naive_loop_on_every_weight(normalization, abstopk):
    model = tiny_model(normalization, abstopk=abstopk)
    with torch.no_grad():
        model.blocks[0].mlp.W_in[0, :4] = 0.0                # already-zero weights report 0
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(1))
    names = ["embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.attn.W_O", "blocks.1.attn.W_K",
             "blocks.1.attn.W_V", "blocks.0.mlp.W_in", "blocks.1.mlp.W_in", "blocks.1.mlp.W_out", "unembed.W_U"]
    if normalization:
        names.append("blocks.1.ln2.w")
    res = _scan_vs_naive(model, tokens, names)
    assert (res.total_kl["blocks.0.mlp.W_in"][0, :4] == 0).all()
    top = res.top(3)
    assert top[0]["total_kl"] >= top[1]["total_kl"] >= top[2]["total_kl"]


@pytest.mark.parametrize("kw", [dict(n_layers=3, act_fn="gelu", normalization="LN", mlp_layers=(0, 2)),
                                dict(n_layers=3, normalization="RMS", mlp_layers=(1,), bias=False),
                                dict(n_layers=2, act_fn="gelu", mlp_layers=(0,)),
                                dict(n_layers=2, normalization="LN", mlp_abstopk=0.5)])
def test_structured_suffix_equals_naive_loop_on_every_matrix(kw):
    """Every entry of wtc.scan.suffix (rank-1 MLP / W_O / W_V, one-head W_Q / W_K, embedding rows
    from their first reach) through every kind of block after it (no MLP, norms, AbsTopK, GELU)."""
    cfg = TransformerConfig(d_model=8, n_heads=2, d_head=4, d_mlp=12, d_vocab=7, n_ctx=6, **kw)
    model = Transformer(cfg, seed=4).double()
    with torch.no_grad():                                    # non-trivial norm parameters
        for name, p in model.named_parameters():
            if ".w" in name or name.endswith(".b"):
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name)), dtype=p.dtype))
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(5))
    names = [n for n, p in model.named_parameters() if p.ndim >= 2 and n != "unembed.W_U"]
    _scan_vs_naive(model, tokens, names)


def test_embedding_rows_of_absent_tokens_are_exactly_zero():
    model = tiny_model()
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]])      # token 6 never occurs
    res = _scan_vs_naive(model, tokens, ["embed.W_E"])
    assert (res.total_kl["embed.W_E"][6] == 0).all() and (res.total_kl["embed.W_E"][:6] > 0).all()


def test_positional_rows_beyond_the_tokens_are_exactly_zero():
    model = tiny_model()                                     # n_ctx 6
    tokens = torch.randint(0, 7, (2, 4), generator=torch.Generator().manual_seed(3))
    res = _scan_vs_naive(model, tokens, ["pos_embed.W_pos"])
    assert (res.total_kl["pos_embed.W_pos"][4:] == 0).all() and (res.total_kl["pos_embed.W_pos"][:4] > 0).all()


class PlainLM(nn.Module):
    """Any nn.Module: embedding, a GELU MLP, a linear head (nn.Linear weight (V, D))."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(7, 6)
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, 7)

    def forward(self, tokens):
        h = self.emb(tokens)
        h = h + torch.nn.functional.gelu(self.mix(h.cumsum(1)))
        return {"logits": self.head(h)}


def test_scan_any_module_with_readout():
    model = PlainLM().double()
    tokens = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(2))
    _scan_vs_naive(model, tokens, ["emb.weight", "mix.weight", "head.weight"], readout=lambda out: out["logits"])


def test_importance_positions_of_a_scan_hold_the_mass():
    model = tiny_model()
    tokens = torch.randint(0, 7, (4, 6), generator=torch.Generator().manual_seed(4))
    res = scan(model, tokens, params="blocks.1.mlp.W_out", progress=False, keep_positions=False)
    for index in [(0, 0), (5, 3), (11, 7)]:
        kl = res.position_kl("blocks.1.mlp.W_out", index)
        pos = res.importance_positions("blocks.1.mlp.W_out", index)
        assert kl[pos].sum() >= 0.9 * kl.sum() * (1 - 1e-9) and kl[pos].sum() - kl[pos].min() < 0.9 * kl.sum()
        assert len(res.importance_positions("blocks.1.mlp.W_out", index, mass=0.5)) <= len(pos)


def test_bad_inputs_are_named():
    model = tiny_model()
    tokens = torch.randint(0, 7, (2, 6))
    with pytest.raises(KeyError, match="no parameter matches 'blocks.9"):
        scan(model, tokens, params="blocks.9.*", progress=False)
    with pytest.raises(ValueError, match="integer tensor"):
        scan(model, tokens.float(), progress=False)
    with pytest.raises(ValueError, match="logits .B, T, V."):
        scan(model, tokens, readout=lambda out: out[:, -1], progress=False)
    with pytest.raises(ValueError, match="NaN or inf"):
        scan(model, tokens, readout=lambda out: out * float("nan"), progress=False)
    with pytest.raises(ValueError, match="mass"):
        scan(model, tokens, mass=1.5, progress=False)
    with pytest.raises(ValueError, match=r"kl_rows: logp must be \(N, V\)"):
        K.kl_rows(torch.zeros(3, 4), torch.zeros(2, 3, 5))
    if C is not None:
        with pytest.raises(ValueError, match="non-finite"):
            C.kl_rows(np.zeros((3, 4), np.float32), np.full((1, 3, 4), np.nan, np.float32))


SCAN_SCRIPT = r"""
import sys, torch
from wtc.scan import scan
from wtc.models import Transformer, TransformerConfig
cfg = TransformerConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=11, n_ctx=8)
model = Transformer(cfg, seed=0)
tokens = torch.randint(0, 11, (256, 8), generator=torch.Generator().manual_seed(0))
res = scan(model, tokens, params=sys.argv[2].split(","), out=sys.argv[1], batch=8, chunk=64, progress=False)
print("scanned", res.weights_scanned, flush=True)
"""


def test_killed_scan_resumes_without_recomputing(tmp_path):
    params = "blocks.0.mlp.W_in,blocks.1.attn.W_Q,unembed.W_U"
    script = tmp_path / "scan.py"
    script.write_text(SCAN_SCRIPT)
    out = tmp_path / "scan"
    proc = subprocess.Popen([sys.executable, str(script), str(out), params], stdout=subprocess.PIPE)
    db = out / "scan.sqlite"
    deadline = time.time() + 120
    import sqlite3
    done = 0
    while time.time() < deadline and proc.poll() is None:      # kill once a few chunks are committed
        time.sleep(0.05)
        if db.exists():
            try:
                done = sqlite3.connect(str(db)).execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
            except sqlite3.Error:
                continue
            if done >= 3:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait()
    assert done >= 3, "the scan finished before it could be killed; make it bigger"
    resumed = subprocess.run([sys.executable, str(script), str(out), params], capture_output=True, text=True, check=True)
    total = 16 * 32 + 2 * 16 * 8 + 16 * 11
    conn = sqlite3.connect(str(db))
    n_chunks = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    done_rows = conn.execute("SELECT COUNT(*) FROM weights").fetchone()[0]
    scanned_again = int(resumed.stdout.split()[-1])
    assert done_rows == total and scanned_again < total            # resumed, not restarted
    assert n_chunks == 8 + 4 + 3
    # same numbers as an uninterrupted scan
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, str(script), str(fresh), params], check=True, capture_output=True)
    a = dict(((p, i), t) for p, i, t in conn.execute("SELECT param, idx, total FROM weights"))
    b = dict(((p, i), t) for p, i, t in sqlite3.connect(str(fresh / "scan.sqlite")).execute(
        "SELECT param, idx, total FROM weights"))
    assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-12 * max(1.0, abs(b[k])) for k in a)


def test_store_refuses_another_model(tmp_path):
    tokens = torch.randint(0, 7, (2, 6))
    scan(tiny_model(seed=0), tokens, params="unembed.W_U", out=tmp_path, progress=False)
    with pytest.raises(ValueError, match="different model_sha256"):
        scan(tiny_model(seed=1), tokens, params="unembed.W_U", out=tmp_path, progress=False)


DIST_SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
from wtc.scan import scan
from wtc.models import Transformer, TransformerConfig
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=int(sys.argv[3]), world_size=2)
cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=9, n_ctx=6)
model = Transformer(cfg, seed=0).double()
tokens = torch.randint(0, 9, (5, 6), generator=torch.Generator().manual_seed(0))
scan(model, tokens, params=["blocks.0.attn.W_V", "blocks.1.mlp.W_in", "unembed.W_U"], out=sys.argv[1],
     chunk=16, progress=False)
dist.destroy_process_group()
"""


def test_distributed_scan_equals_single_process(tmp_path):
    import sqlite3
    script = tmp_path / "dist.py"
    script.write_text(DIST_SCRIPT)
    out = tmp_path / "dist"
    procs = [subprocess.Popen([sys.executable, str(script), str(out), str(tmp_path / "rendezvous"), str(r)],
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=9, n_ctx=6)
    model = Transformer(cfg, seed=0).double()
    tokens = torch.randint(0, 9, (5, 6), generator=torch.Generator().manual_seed(0))
    single = scan(model, tokens, params=["blocks.0.attn.W_V", "blocks.1.mlp.W_in", "unembed.W_U"],
                  out=tmp_path / "single", chunk=16, progress=False)
    merged = sqlite3.connect(str(out / "scan.sqlite"))
    rows = {(p, i): (t, pos) for p, i, t, pos, _ in merged.execute("SELECT * FROM weights")}
    shard_rows = [sqlite3.connect(str(out / f"scan.rank{r}.sqlite")).execute("SELECT COUNT(*) FROM weights").fetchone()[0]
                  for r in range(2)]
    assert min(shard_rows) > 0 and sum(shard_rows) == len(rows)          # both ranks did work, no overlap
    for name, total in single.total_kl.items():
        for flat, value in enumerate(total.flatten().tolist()):
            t, pos = rows[(name, flat)]
            assert t == value                                             # bit-identical
            np.testing.assert_array_equal(np.frombuffer(pos, np.int32), single.importance_positions(name, flat))


def test_cli_trains_and_scans_with_resume(tmp_path):
    from wtc.cli import main
    assert main(["lm-train", "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "12", "--seq-len", "8",
                 "--steps", "5", "--scan-sequences", "3", "--out", str(tmp_path / "lm"), "--quiet"]) == 0
    args = ["scan", str(tmp_path / "lm" / "model"), "--tokens", str(tmp_path / "lm" / "tokens.npy"),
            "--params", "blocks.0.mlp.W_out,unembed.W_U", "--out", str(tmp_path / "scan"), "--quiet"]
    assert main(args) == 0
    first = json.loads((tmp_path / "scan" / "summary.json").read_text())
    assert first["weights_scanned"] == first["weights_in_store"] == 64 * 16 + 16 * 12
    assert main(args) == 0                                                # a finished scan: nothing to redo
    again = json.loads((tmp_path / "scan" / "summary.json").read_text())
    assert again["weights_scanned"] == 0 and again["weights_in_store"] == first["weights_in_store"]
    assert again["top_weights"] == first["top_weights"]
    from wtc.models.io import load
    with pytest.raises(FileNotFoundError, match="not a wtc transformer checkpoint"):
        load(tmp_path)


def test_fisher_estimate_tracks_small_exact_kl_and_prefilters():
    """For small weights the second-order estimate approaches the exact total KL; a mask limits the
    exact scan to the chosen weights and leaves the rest at 0 (never filled with estimates)."""
    from wtc.scan import fisher_estimate
    model = tiny_model()
    with torch.no_grad():
        model.blocks[1].mlp.W_out.mul_(0.05)                  # small weights: second order dominates
    tokens = torch.randint(0, 7, (6, 6), generator=torch.Generator().manual_seed(5))
    est = fisher_estimate(model, tokens, "blocks.1.mlp.W_out", samples=64)["blocks.1.mlp.W_out"]
    exact = scan(model, tokens, params="blocks.1.mlp.W_out", progress=False).total_kl["blocks.1.mlp.W_out"]
    rel = (est - exact).abs().sum() / exact.abs().sum()
    assert rel < 0.1, rel                                     # measured 0.04 at 64 samples
    mask = est >= est.flatten().topk(10).values[-1]
    part = scan(model, tokens, params="blocks.1.mlp.W_out", weights={"blocks.1.mlp.W_out": mask}, progress=False)
    got = part.total_kl["blocks.1.mlp.W_out"]
    assert part.weights_scanned == int(mask.sum())
    torch.testing.assert_close(got[mask], exact[mask], rtol=1e-9, atol=0)
    assert (got[~mask] == 0).all()
    with pytest.raises(ValueError, match="bool mask"):
        scan(model, tokens, params="blocks.1.mlp.W_out", weights={"blocks.1.mlp.W_out": mask.float()}, progress=False)


def test_scan_counts_kl_only_at_the_chosen_positions():
    model = tiny_model(seed=3)
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(3))
    counted = torch.zeros(3, 6, dtype=torch.bool)
    counted[:, -1] = True
    counted[1, 2] = True
    names = ["embed.W_E", "blocks.0.attn.W_K", "blocks.1.mlp.W_in", "blocks.1.mlp.W_out", "unembed.W_U"]
    res = scan(model, tokens, params=names, positions=counted, progress=False, batch=4)
    for name in names:
        want = naive_position_kl(model, tokens, name) * counted.flatten()          # (n, N)
        for flat in range(dict(model.named_parameters())[name].numel()):
            torch.testing.assert_close(res.position_kl(name, flat), want[flat], rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(res.total_kl[name].flatten(), want.sum(-1), rtol=1e-5, atol=1e-9)
    with pytest.raises(ValueError, match="positions"):
        scan(model, tokens, params=names, positions=torch.ones(3, 5, dtype=torch.bool), progress=False)


# ----------------------------------------------------------------------------- the generic path
# (wtc.scan.generic: "rows" = one forward of A copies of the tokens with per-copy corrections by
# hooks, "vmap" = parameter copies through torch.func, "naive" = zero, forward, restore; the scan
# chooses). Every method against the naive loop, in float64, on fresh random weights and tokens.

from wtc.scan import generic as G                              # noqa: E402


class TupleLM(nn.Module):
    """Hugging Face-like: returns a tuple (logits, hidden); token and position embeddings (positions
    (1, T), broadcast over the batch, as GPT-2's), a LayerNorm module called twice, nn.Linear maps
    with and without bias, token mixing by a causal mean, RMSNorm, a head tied to the embedding."""

    def __init__(self, V=9, D=6, T=5, gen=None):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.ln = nn.LayerNorm(D)
        self.mix = nn.Linear(D, D, bias=False)
        self.up, self.down = nn.Linear(D, 10), nn.Linear(10, D)
        self.norm = nn.RMSNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.ndim == 1 else 0.6) + (p.ndim == 1))

    def forward(self, ids):
        T = ids.shape[1]
        h = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device)[None])
        h = h + self.mix(self.ln(h)).cumsum(1) / torch.arange(1, T + 1, device=ids.device)[:, None]
        h = h + self.down(torch.nn.functional.gelu(self.up(self.ln(h))))
        return self.head(self.norm(h)), h


def _generic_vs_naive(model, tokens, names, readout, force, rtol=1e-6, atol=1e-10):
    """Scan under FORCE=force against wtc.scan.reference on every weight; returns the Generic."""
    G.FORCE = force
    try:
        res = scan(model, tokens, params=names, readout=readout, progress=False, batch=5)
    finally:
        G.FORCE = None
    for name in names:
        want = naive_position_kl(model, tokens, name, readout)
        p = dict(model.named_parameters())[name]
        got = torch.stack([res.position_kl(name, flat) for flat in range(p.numel())])
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        torch.testing.assert_close(res.total_kl[name].flatten(), want.sum(-1), rtol=rtol, atol=atol)
    return res


def _methods(model, tokens, readout, names):
    """The method the generic path picks for each parameter (one batch of each through Generic)."""
    with torch.no_grad():
        clean = readout(model(tokens))
    g = G.Generic(model, tokens, readout, clean, budget=2**25)
    params = dict(model.named_parameters())
    for name in names:
        idx = (params[name].detach().flatten() != 0).nonzero().flatten()[:4]
        g.ablated_logits(name, params[name], idx)
    return g


@pytest.mark.parametrize("force", [None, "rows", "vmap", "naive"])
def test_generic_methods_equal_the_naive_loop(rng, force):
    model = TupleLM(gen=rng).double().eval()
    tokens = torch.randint(0, 9, (3, 5), generator=rng)
    names = [n for n, _ in model.named_parameters()]            # 1-D ones (biases, norm weights) too
    _generic_vs_naive(model, tokens, names, lambda out: out[0], force)


def test_generic_rows_is_chosen_where_it_applies(rng):
    model = TupleLM(gen=rng).double().eval()
    tokens = torch.randint(0, 9, (3, 5), generator=rng)
    names = [n for n, _ in model.named_parameters()]
    g = _methods(model, tokens, lambda out: out[0], names)
    assert g.method == {n: "rows" for n in names}               # the tied head included
    assert {n for n, _ in g.checked} == set(names)              # each agreed with the naive loop


class Awkward(nn.Module):
    """What the rows method must refuse: a raw parameter in an einsum, a Linear weight also read
    outside its module, a module with a caller's hook, an Embedding with max_norm, attention
    through nn.MultiheadAttention (its out_proj weight is read by the attention function)."""

    def __init__(self, V=7, D=4, gen=None):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.capped = nn.Embedding(V, D, max_norm=10.0)
        self.raw = nn.Parameter(torch.randn(D, D, generator=gen))
        self.lin = nn.Linear(D, D)
        self.hooked = nn.Linear(D, D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.head = nn.Linear(D, V)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        self.hooked.register_forward_hook(lambda m, args, out: 1.5 * out)

    def forward(self, ids):
        h = self.emb(ids) + self.capped(ids)
        h = h + torch.tanh(torch.einsum("btd,de->bte", h, self.raw))
        h = h + self.lin(h) + 0.1 * h @ self.lin.weight
        h = torch.tanh(self.hooked(h))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return {"logits": self.head(h) * 1.0}


def test_generic_falls_back_where_rows_cannot_be_exact(rng):
    model = Awkward(gen=rng).double().eval()
    tokens = torch.randint(0, 7, (3, 5), generator=rng)
    names = ["emb.weight", "capped.weight", "raw", "lin.weight", "lin.bias", "hooked.weight",
             "attn.in_proj_weight", "attn.out_proj.weight", "head.bias"]
    readout = lambda out: out["logits"]                         # noqa: E731
    g = _methods(model, tokens, readout, names)
    rows = {n for n, m in g.method.items() if m == "rows"}
    assert rows == {"emb.weight", "lin.bias", "head.bias"}
    assert set(g.method) == set(names) and all(m in ("vmap", "naive") for n, m in g.method.items() if n not in rows)
    _generic_vs_naive(model, tokens, names, readout, None)
    _generic_vs_naive(model, tokens, names, readout, "rows")    # where rows does not apply, it falls back


class BatchMixer(nn.Module):
    """Batch rows not independent (a norm over the batch): the rows method's probe must refuse it."""

    def __init__(self, gen=None):
        super().__init__()
        self.emb, self.head = nn.Embedding(7, 4), nn.Linear(4, 7)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(torch.tanh(h - h.mean(0, keepdim=True)))


def test_generic_rows_refuses_a_model_that_mixes_batch_rows(rng):
    model = BatchMixer(gen=rng).double().eval()
    tokens = torch.randint(0, 7, (3, 5), generator=rng)
    readout = lambda out: out + 0.0                             # noqa: E731  (not the closed form)
    g = _methods(model, tokens, readout, ["emb.weight", "head.bias"])
    assert g._independent is False and set(g.method.values()) <= {"vmap", "naive"}
    _generic_vs_naive(model, tokens, ["emb.weight", "head.weight", "head.bias"], readout, "rows")


def test_generic_float32_rows_matches_the_naive_loop(rng):
    model = TupleLM(gen=rng).eval()
    tokens = torch.randint(0, 9, (4, 5), generator=rng)
    names = ["wte.weight", "up.weight", "ln.weight", "down.bias"]
    _generic_vs_naive(model, tokens, names, lambda out: out[0], "rows", rtol=5e-3, atol=2e-6)


def test_generic_copies_per_forward_double_while_it_pays():
    for per_weight, best in [({1: 1.0, 2: 0.6, 4: 0.4, 8: 0.42, 16: 0.5}, 4),      # 16 clearly worse
                             ({1: 1.0, 2: 0.6, 4: 0.4, 8: 0.43, 16: 0.41}, 4),     # two in a row not better
                             ({1: 1.0, 2: 0.6, 4: 0.4, 8: 0.42, 16: 0.3, 32: 0.2, 64: 0.1}, 64)]:  # the cap
        s = G._Sizes(cap=64)
        for _ in range(20):
            a, timed = s.next(64, 64)
            if s.settled is not None:
                break
            assert timed
            s.record(a, per_weight[a] * a)
        assert s.settled == best and s.next(64, 64) == (best, False)
    small = G._Sizes(cap=64)                                  # the scan's batches hold 3 weights
    for _ in range(8):
        a, timed = small.next(3, 3)
        if timed:
            small.record(a, 0.1 * a ** 0.5)
    assert small.settled == 2
    assert G._Sizes(cap=1).next(10, 10) == (1, True)


def test_gpt2_architecture_scans_exactly(rng):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=8, n_layer=2, n_head=2, vocab_size=11, n_positions=6, n_inner=12)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=rng)))
    model = transformers.GPT2LMHeadModel(cfg).double().eval()
    with torch.no_grad():                                    # non-trivial norm parameters and biases
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=rng, dtype=p.dtype))
    tokens = torch.randint(0, 11, (3, 6), generator=rng)
    readout = lambda out: out.logits                         # noqa: E731
    names = [n for n, _ in model.named_parameters()]         # wte (tied to the head), wpe, Conv1D, LN
    g = _methods(model, tokens, readout, names)
    assert g.method == {n: "rows" for n in names}
    _generic_vs_naive(model, tokens, names, readout, None)


def test_generic_skips_embedding_rows_the_tokens_never_look_up(rng):
    """Rows of tokens absent from the scan's tokens (and positions past their length) change no
    embedding output: their copies start at the tied head (GPT-2's wte) or keep the clean logits
    (wpe, an untied embedding). Every weight still equals the naive loop."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=40, n_positions=10, n_inner=12)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=rng)))
    model = transformers.GPT2LMHeadModel(cfg).double().eval()
    tokens = torch.randint(0, 12, (2, 6), generator=rng)          # ids 12-39 never looked up
    readout = lambda out: out.logits                             # noqa: E731
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    res = _generic_vs_naive(model, tokens, names, readout, None)
    g = G.LAST()
    assert g.method == {n: "rows" for n in names}
    head = g._uses["transformer.wte.weight"][1]                    # the tied head's call: absent rows start there
    assert type(head.module).__name__ == "Linear"
    assert f"transformer.wte.weight@{head.start}" in g._sizes
    assert ("transformer.wte.weight", head.start) in g.checked and ("transformer.wpe.weight", None) in g.checked
    assert res.total_kl["transformer.wpe.weight"][6:].abs().max() == 0      # positions 6-9 are never read
    absent = res.total_kl["transformer.wte.weight"][12:]
    assert (absent > 0).any()                                    # through the head, not zero

    class Untied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin, self.head = nn.Embedding(30, 4), nn.Linear(4, 4), nn.Linear(4, 30)

        def forward(self, ids):
            return self.head(torch.tanh(self.lin(self.emb(ids)))) * 1.0

    untied = Untied().double().eval()
    res = _generic_vs_naive(untied, tokens, ["emb.weight"], lambda out: out + 0.0, None)
    present = torch.zeros(30, dtype=torch.bool)
    present[tokens.unique()] = True
    kl = res.total_kl["emb.weight"]
    assert kl[~present].abs().max() == 0 and (kl[present] > 0).all()


class Aliased(nn.Module):
    """A Linear weight also read through a tensor sharing its memory (invisible to a trace and to
    torch.func): only the naive loop sees both uses, and the first batch's check must show it."""

    def __init__(self, gen=None):
        super().__init__()
        self.emb, self.lin, self.head = nn.Embedding(7, 4), nn.Linear(4, 4), nn.Linear(4, 7)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))

    def make_alias(self):
        self.alias = [self.lin.weight.detach()]                  # not a parameter: no name, no owner
        return self

    def forward(self, ids):
        h = self.emb(ids)
        h = torch.tanh(self.lin(h) + h @ self.alias[0].T)
        return self.head(h) * 1.0


def test_generic_checks_each_parameter_against_the_naive_loop(rng):
    model = Aliased(gen=rng).double().eval().make_alias()
    tokens = torch.randint(0, 7, (3, 5), generator=rng)
    readout = lambda out: out + 0.0                             # noqa: E731
    g = _methods(model, tokens, readout, ["lin.weight", "emb.weight"])
    assert g.method == {"lin.weight": "naive", "emb.weight": "rows"}
    _generic_vs_naive(model, tokens, ["lin.weight", "emb.weight", "head.weight"], readout, None)


class InPlaceLM(nn.Module):
    """In-place writes downstream into module outputs that a scan reuses from its clean pass (the
    first layer's output for the second layer's weights; the weight's own module's output)."""

    def __init__(self, gen=None):
        super().__init__()
        self.emb, self.a, self.b, self.head = nn.Embedding(7, 5), nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(5, 7)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))

    def forward(self, ids):
        h = self.emb(ids)
        u = self.a(h)
        u += h
        v = self.b(torch.tanh(u))
        v.mul_(0.5)
        return self.head(torch.tanh(v + u))


@pytest.mark.parametrize("force", [None, "rows"])
def test_generic_rows_reuses_the_clean_prefix_exactly(rng, force):
    model = InPlaceLM(gen=rng).double().eval()
    tokens = torch.randint(0, 7, (3, 5), generator=rng)
    readout = lambda out: out - out.mean(-1, keepdim=True)     # noqa: E731  (not the closed form)
    names = [n for n, _ in model.named_parameters()]
    g = _methods(model, tokens, readout, names)
    assert g.method == {n: "rows" for n in names}
    prefix = {n: [type(c.module).__name__ for c in g._prefix_calls(g._uses[n][0])] for n in ["b.weight", "head.bias"]}
    assert prefix == {"b.weight": ["Linear", "Embedding", "Linear"], "head.bias": ["Linear", "Embedding", "Linear", "Linear"]}
    _generic_vs_naive(model, tokens, names, readout, force)

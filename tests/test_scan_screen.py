"""wtc.scan.screen (every weight's estimated KL) and scan(..., screen=K).

The oracles: the Fisher diagonal by brute force (one float64 backward per sequence, position and
class), the estimator's expectation by enumerating every label sequence, the exact scan itself in
the quadratic limit, one process against two gloo ranks, an uninterrupted screen against a resumed one.
"""
import csv
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from wtc.errors import ScanError
from wtc.models import Transformer, TransformerConfig
from wtc.scan import scan, screen
from wtc.scan import screening
from wtc.scan.screen_estimators import fisher_diagonal_reference, squared_sequence_gradients

TINY = TransformerConfig(n_layers=1, d_model=4, n_heads=1, d_head=4, d_mlp=8, d_vocab=3, n_ctx=3)
SMALL = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=9, n_ctx=6)


def _tokens(cfg, B, seed=0):
    return torch.randint(0, cfg.d_vocab, (B, cfg.n_ctx), generator=torch.Generator().manual_seed(seed))


def _matrices(model):
    return {n: p for n, p in model.named_parameters() if p.ndim >= 2}


@pytest.mark.parametrize("masked", [False, True])
def test_expected_squared_sequence_gradients_are_the_fisher_diagonal(masked):
    """E_{y ~ p}[sum_b g_b^2] = sum_t sum_v p_tv (d log p_tv)^2 exactly: every label sequence of a
    tiny model enumerated, each weighted by its probability (sqrt(P) on every counted position
    scales g_b by sqrt(P), so the squares sum to sum_y P(y) g_y^2)."""
    model = Transformer(TINY, seed=1).double().eval()
    tokens = _tokens(TINY, 2)
    counted = torch.ones(tokens.shape, dtype=torch.float64)
    if masked:
        counted[0, 1] = counted[1, 0] = 0
    chosen = _matrices(model)
    want = fisher_diagonal_reference(model, chosen, tokens, counted.bool(), lambda o: o)
    got = {n: torch.zeros_like(w) for n, w in want.items()}
    V, T = TINY.d_vocab, TINY.n_ctx
    for b in range(tokens.shape[0]):
        with torch.no_grad():
            p = torch.softmax(model(tokens[b:b + 1])[0], -1)                     # (T, V)
        labels = torch.tensor(list(itertools.product(range(V), repeat=T)))   # every label sequence
        prob = p[torch.arange(T), labels].prod(-1)                            # P(y) over all positions
        weight = prob.sqrt()[:, None] * counted[b][None]
        sq = squared_sequence_gradients(model, chosen, tokens[b:b + 1].repeat(len(labels), 1), labels, weight,
                                        lambda o: o)
        for n in got:
            got[n] += sq[n]
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-14)
        assert want[n].abs().max() > 0


def test_screen_is_half_w_squared_fisher_and_matches_the_exact_scan_in_the_quadratic_limit():
    """Weights shrunk 1000x: the exact KL of zeroing them is 1/2 w^2 F_ii to O(w^3), F from brute force."""
    model = Transformer(TINY, seed=2).double().eval()
    tokens = _tokens(TINY, 2, seed=3)
    name = "blocks.0.mlp.W_in"
    p = dict(model.named_parameters())[name]
    picked = torch.zeros(p.shape, dtype=torch.bool)
    picked.view(-1)[::5] = True
    with torch.no_grad():
        p[picked] *= 1e-3
    F = fisher_diagonal_reference(model, {name: p}, tokens, torch.ones(tokens.shape, dtype=torch.bool), lambda o: o)[name]
    quadratic = 0.5 * p.detach() ** 2 * F
    exact = scan(model, tokens, params=[name], weights={name: picked}, progress=False).total_kl[name]
    np.testing.assert_allclose(exact[picked].numpy(), quadratic[picked].numpy(), rtol=2e-2)
    assert int((exact[picked] > 0).sum()) >= 3          # (a dead ReLU unit gives 0 in both)


def test_screen_shapes_dtypes_and_zero_weights():
    model = Transformer(SMALL, seed=0).eval()
    with torch.no_grad():
        model.blocks[0].mlp.W_in[0, :3] = 0
    est = screen(model, _tokens(SMALL, 5), samples=2, progress=False)
    assert set(est) == {n for n, p in model.named_parameters() if p.ndim >= 2}
    for n, p in model.named_parameters():
        if n in est:
            assert est[n].shape == p.shape and est[n].dtype == torch.float64
            assert bool((est[n] >= 0).all()) and bool(torch.isfinite(est[n]).all())
    assert bool((est["blocks.0.mlp.W_in"][0, :3] == 0).all())
    assert est["unembed.W_U"].sum() > 0


def test_vectorised_and_per_sequence_paths_agree():
    model = Transformer(SMALL, seed=0).double().eval()
    tokens = _tokens(SMALL, 3)
    labels = _tokens(SMALL, 3, seed=9)
    counted = torch.ones(tokens.shape)
    chosen = _matrices(model)
    a = squared_sequence_gradients(model, chosen, tokens, labels, counted, lambda o: o, vectorised=True)
    b = squared_sequence_gradients(model, chosen, tokens, labels, counted, lambda o: o, vectorised=False)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-10, atol=1e-16)


def test_screen_of_a_gpt2_with_readout():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=11,
                                                              n_positions=6)).eval()
    tokens = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(0))
    est = screen(hf, tokens, readout=lambda out: out.logits, samples=2, progress=False)
    assert "transformer.wte.weight" in est and est["transformer.wte.weight"].sum() > 0


def test_resume_equals_uninterrupted(tmp_path, monkeypatch):
    model = Transformer(SMALL, seed=0).eval()
    tokens = _tokens(SMALL, 4)
    whole = screen(model, tokens, samples=3, block=1, progress=False)
    monkeypatch.setattr(screening, "CHECKPOINT_SECONDS", 0.0)            # state written after every block
    real, calls = screening.squared_sequence_gradients, []

    def dies_after_two_blocks(*a, **k):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(screening, "squared_sequence_gradients", dies_after_two_blocks)
    with pytest.raises(KeyboardInterrupt):
        screen(model, tokens, samples=3, block=1, out=tmp_path, progress=False)
    assert sorted(torch.load(tmp_path / "state.pt")["done"]) == [0, 1]
    monkeypatch.setattr(screening, "squared_sequence_gradients", real)
    resumed = screen(model, tokens, samples=3, block=1, out=tmp_path, progress=False)
    for n in whole:
        assert torch.equal(resumed[n], whole[n])                      # the same blocks, draws and order
    with pytest.raises(ScanError, match="different seed"):
        screen(model, tokens, samples=3, block=1, seed=1, out=tmp_path, progress=False)


def test_bad_input_is_one_clear_error():
    model = Transformer(SMALL, seed=0).eval()
    tokens = _tokens(SMALL, 2)
    with pytest.raises(ScanError, match="samples"):
        screen(model, tokens, samples=0)
    with pytest.raises(ScanError, match="positions"):
        screen(model, tokens, positions=torch.zeros(tokens.shape, dtype=torch.bool))
    with pytest.raises(ScanError, match="not both"):
        scan(model, tokens, screen=3, weights={}, progress=False)
    with pytest.raises(ScanError, match="screen"):
        scan(model, tokens, screen=0, progress=False)


def test_scan_with_screen_stores_estimate_and_exact_labelled(tmp_path):
    model = Transformer(SMALL, seed=0).eval()
    tokens = _tokens(SMALL, 5)
    res = scan(model, tokens, screen=10, screen_random=40, out=tmp_path, progress=False)
    rep = res.screen
    est = rep.estimate
    # the top 10 by estimate among nonzero weights are scanned exactly, and 40 drawn at random
    flat = torch.cat([est[n].flatten() for n in est])
    nonzero = torch.cat([dict(model.named_parameters())[n].detach().flatten() != 0 for n in est])
    top_values = torch.sort(flat[nonzero], descending=True).values[:10]
    chosen_top = torch.cat([rep.top[n].flatten() for n in est])
    assert int(chosen_top.sum()) == 10 and torch.equal(torch.sort(flat[chosen_top], descending=True).values, top_values)
    assert int(sum(m.sum() for m in rep.random.values())) == 40
    scanned = {n: rep.top[n] | rep.random[n] for n in est}
    for n in est:                                       # exact KL only where chosen, as the plain scan finds it
        assert bool((res.total_kl[n][~scanned[n]] == 0).all())
    rows = list(csv.DictReader((tmp_path / "screened.csv").open()))
    assert len(rows) == sum(int(m.sum()) for m in scanned.values())
    assert {r["chosen"] for r in rows} <= {"top", "random", "top+random"}
    for r in rows:
        index = tuple(int(i) for i in r["index"].split())
        assert float(r["exact"]) == float(res.total_kl[r["param"]][index])
        assert float(r["estimate"]) == float(est[r["param"]][index])
    from safetensors.torch import load_file
    stored = load_file(str(tmp_path / "screen" / "estimate.safetensors"))
    assert all(torch.equal(stored[n], est[n]) for n in est)
    assert (tmp_path / "screen_vs_exact.png").stat().st_size > 1000
    summary = res.summary()["screen"]
    assert summary["top_k"] == 10 and summary["random_sample"] == 40 and summary["estimator"]
    assert -1 <= summary["spearman_random"] <= 1 and summary["note"]


def test_screen_note_warns_when_the_ranking_is_poor():
    from wtc.scan.screened import _report
    rng = np.random.default_rng(0)
    exact = rng.random(1000)
    flat = rng.random(1000)                             # an estimate unrelated to the exact KL
    rank = np.empty(1000, np.int64)
    rank[np.argsort(-flat)] = np.arange(1000)
    rep = _report(flat, exact, rank, np.argsort(-flat)[:10], np.arange(0, 1000, 2), 1000, 10, 4)
    assert "NOT a reliable ranking" in rep.note and abs(rep.spearman_random) < 0.2


def test_a_perfect_screen_is_trusted_whatever_the_size_of_its_random_sample():
    """A random sample under 100 weights has no top 1% (its best weight is only about the model's
    top 1/R, which a perfect screen often ranks outside its top 5%): the recall is not measured
    then, rather than calling a perfect ranking unreliable."""
    from wtc.scan.screened import _report
    rng = np.random.default_rng(1)
    exact = rng.lognormal(size=5000)
    rank = np.empty(5000, np.int64)
    rank[np.argsort(-exact)] = np.arange(5000)
    for size, recall in ((20, None), (99, None), (200, 1.0)):
        sample = np.sort(rng.choice(5000, size, replace=False))
        rep = _report(exact, exact, rank, np.argsort(-exact)[:10], sample, 5000, 10, 4)
        assert rep.recall_top1pct_in_screen_top5pct == recall and rep.spearman_random == pytest.approx(1.0)
        assert "NOT" not in rep.note and ("not measured" in rep.note) == (recall is None)


DIST_SCRIPT = """
import sys, torch, torch.distributed as dist
from wtc.scan import screen
from wtc.models import Transformer, TransformerConfig
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=int(sys.argv[3]), world_size=2)
cfg = TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=9, n_ctx=6)
model = Transformer(cfg, seed=0).double().eval()
tokens = torch.randint(0, 9, (5, 6), generator=torch.Generator().manual_seed(0))
est = screen(model, tokens, samples=2, block=1, out=sys.argv[1], progress=False)
torch.save(est, sys.argv[1] + f"/result{sys.argv[3]}.pt")
dist.destroy_process_group()
"""


def test_distributed_screen_equals_single_process(tmp_path):
    script = tmp_path / "dist.py"
    script.write_text(DIST_SCRIPT)
    out = tmp_path / "dist"
    out.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), str(out), str(tmp_path / "rendezvous"), str(r)],
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    model = Transformer(SMALL, seed=0).double().eval()
    tokens = torch.randint(0, 9, (5, 6), generator=torch.Generator().manual_seed(0))
    single = screen(model, tokens, samples=2, block=1, progress=False)
    done = [set(torch.load(out / f"state.rank{r}.pt")["done"]) for r in range(2)]
    assert done[0] and done[1] and not done[0] & done[1] and done[0] | done[1] == set(range(5))
    assert json.loads((out / "meta.json").read_text())["world"] == 2
    for r in range(2):
        got = torch.load(out / f"result{r}.pt")
        for n in single:
            torch.testing.assert_close(got[n], single[n], rtol=1e-12, atol=0)


def test_cli_scan_screen(tmp_path):
    from wtc.cli import main
    assert main(["lm-train", "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "12", "--seq-len", "8",
                 "--steps", "5", "--scan-sequences", "3", "--out", str(tmp_path / "lm"), "--quiet"]) == 0
    out = tmp_path / "scan"
    assert main(["scan", str(tmp_path / "lm" / "model"), "--tokens", str(tmp_path / "lm" / "tokens.npy"),
                 "--out", str(out), "--screen", "5", "--screen-random", "30", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["screen"]["top_k"] == 5 and summary["screen"]["random_sample"] == 30
    assert (out / "screened.csv").exists() and (out / "screen_vs_exact.png").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_screen_and_confirmation_on_cuda_equal_the_cpu_ones(tmp_path):
    """The screen draws its labels on the CPU, so on the GPU it estimates the same quantity from the
    same labels; the exact confirmation of the chosen weights equals the CPU's exact KLs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = TransformerConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=64, d_vocab=20, n_ctx=12)
    model = Transformer(cfg, seed=0).eval()
    tokens = torch.randint(0, 20, (6, 12), generator=torch.Generator().manual_seed(0))
    cpu = screen(model, tokens, samples=4, progress=False)
    gpu = screen(model.cuda(), tokens.cuda(), samples=4, progress=False)
    for n in cpu:
        torch.testing.assert_close(gpu[n].cpu(), cpu[n], rtol=1e-3, atol=1e-9)
    res = scan(model, tokens.cuda(), screen=30, screen_random=40, out=tmp_path / "gpu", progress=False)
    chosen = {n: res.screen.top[n] | res.screen.random[n] for n in res.screen.top}
    ref = scan(model.cpu(), tokens, params=list(chosen), weights=chosen, progress=False)
    for n in chosen:
        torch.testing.assert_close(res.total_kl[n].cpu()[chosen[n]], ref.total_kl[n][chosen[n]], rtol=1e-3, atol=1e-8)


def test_a_parameter_that_comes_back_changed_is_put_back_and_screened_per_sequence(monkeypatch):
    """functional_call gives a parameter back as something else (as TransformerLens bridges' q/k/v
    views did in the exact scan): the screen restores the model's own parameters and computes the
    same estimate with one autograd backward per sequence."""
    from wtc.scan import screen_estimators

    model = Transformer(SMALL, seed=0).eval()
    tokens = _tokens(SMALL, 3)
    want = screen(model, tokens, samples=2, progress=False)
    params = dict(model.named_parameters())
    real = screen_estimators.functional_call

    def swaps_back_a_copy(module, values, args):
        out = real(module, values, args)
        target = model.blocks[0].attn
        target._parameters["W_Q"] = torch.nn.Parameter(params["blocks.0.attn.W_Q"].detach().clone())
        return out

    monkeypatch.setattr(screen_estimators, "functional_call", swaps_back_a_copy)
    got = screen(model, tokens, samples=2, progress=False)
    assert all(p is params[n] for n, p in model.named_parameters())
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-6, atol=1e-12)

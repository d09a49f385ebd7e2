"""Issue 39 as a user meets it: `wtc scan DIR --screen K` on Hugging Face model directories (GPT-2,
GPT-NeoX, LLaMA built from configs, a BPE tokenizer trained here: offline), token ids or text read
through the model's own tokenizer, TransformerLens names and their short forms, a killed scan
resumed, and bad input refused in one line."""
import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_explain_tokens import bpe_tokenizer  # noqa: E402
from wtc.cli import main  # noqa: E402
from wtc.errors import ScanError, UnknownName  # noqa: E402
from wtc.models import Transformer, TransformerConfig, hf  # noqa: E402
from wtc.scan import scan, screening, sources  # noqa: E402
from wtc.scan.names import select  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEXT = textwrap.dedent('''
    def wrap(text, width=70):
        """Wrap a single paragraph of text, returning a list of wrapped lines."""
        words = text.split()
        lines, line = [], []
        for word in words:
            if sum(len(w) + 1 for w in line) + len(word) > width:
                lines.append(" ".join(line))
                line = []
            line.append(word)
        return lines + [" ".join(line)] if line else lines
    ''') * 6


def configs(vocab):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig
    return {
        "gpt2": GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=32, vocab_size=vocab),
        "neox": GPTNeoXConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                              max_position_embeddings=32, vocab_size=vocab),
        "llama": LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=32, max_position_embeddings=32, vocab_size=vocab, attention_bias=True,
                             mlp_bias=True, tie_word_embeddings=False),
    }


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A GPT-2, a GPT-NeoX and a LLaMA directory (weights + BPE tokenizer), token ids, a text file."""
    from transformers import AutoModelForCausalLM

    base = tmp_path_factory.mktemp("audit39")
    tok = bpe_tokenizer([TEXT], vocab_size=280)
    out = {}
    for i, (kind, cfg) in enumerate(configs(len(tok)).items()):
        torch.manual_seed(i)
        d = base / kind
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        out[kind] = d
    ids = np.asarray(tok(TEXT, add_special_tokens=False)["input_ids"])
    np.save(base / "tokens.npy", ids[:3 * 12].reshape(3, 12))
    (base / "text.txt").write_text(TEXT)
    return {"base": base, "tok": tok, **out}


def cli(*argv, capsys=None):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("kind", ["gpt2", "neox", "llama"])
def test_cli_screens_a_hugging_face_directory_and_its_exact_values_are_the_scans(dirs, kind, tmp_path):
    out = tmp_path / "out"
    assert cli("scan", dirs[kind], "--tokens", dirs["base"] / "tokens.npy", "--out", out, "--screen", 6,
               "--screen-random", 15, "--quiet")[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["screen"]["top_k"] == 6 and summary["screen"]["random_sample"] == 15
    table = rows(out / "screened.csv")
    assert sum(r["chosen"] in ("top", "top+random") for r in table) == 6
    assert sum(r["chosen"] in ("random", "top+random") for r in table) == 15
    assert (out / "screen_vs_exact.png").stat().st_size > 0
    # the CSV's exact column is what a plain scan of that one weight gives
    model, tokens = hf.load(dirs[kind]), np.load(dirs["base"] / "tokens.npy")
    for r in table[:2]:
        p = dict(model.named_parameters())[r["param"]]
        mask = torch.zeros(p.shape, dtype=torch.bool)
        mask[tuple(int(i) for i in r["index"].split())] = True
        one = scan(model, tokens, params=r["param"], weights={r["param"]: mask}, progress=False)
        torch.testing.assert_close(float(one.total_kl[r["param"]][mask]), float(r["exact"]), rtol=1e-6, atol=1e-12)


def test_text_is_read_through_the_models_tokenizer_in_windows(dirs, tmp_path):
    model = hf.load(dirs["gpt2"])
    got = sources.load_tokens(dirs["base"] / "text.txt", model)
    ids = dirs["tok"](TEXT, add_special_tokens=False)["input_ids"]
    window = min(32, sources.TEXT_WINDOW)
    assert got.shape == (len(ids) // window, window)
    assert got.flatten().tolist() == ids[:got.numel()]
    assert cli("scan", dirs["gpt2"], "--tokens", dirs["base"] / "text.txt", "--out", tmp_path / "o",
               "--params", "transformer.h.1.ln_2.*", "--quiet")[0] == 0
    nonzero = sum(int((p != 0).sum()) for p in select(model, "transformer.h.1.ln_2.*").values())
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["weights_scanned"] == nonzero > 0


def test_bad_input_is_one_clear_line(dirs, tmp_path, capsys):
    lm = tmp_path / "lm"
    assert cli("lm-train", "--layers", 1, "--d-model", 8, "--heads", 2, "--vocab", 6, "--seq-len", 4, "--steps", 2,
               "--scan-sequences", 2, "--out", lm, "--quiet")[0] == 0
    capsys.readouterr()
    toks = dirs["base"] / "tokens.npy"
    n = sum(int((p != 0).sum()) for p in select(hf.load(dirs["neox"]), None).values())
    for argv, expect in [
        ((dirs["neox"], "--params", "gpt_neox.layers.0.mlp.dense_h_to_4hh", "--screen", 5), "closest"),
        ((dirs["neox"], "--screen", n), f"every nonzero weight of the chosen parameters ({n})"),
        ((dirs["neox"], "--screen", n + 10), "scan them all exactly"),
        ((dirs["neox"], "--params", "blocks.0.mlp.W_out"), "TransformerBridge"),
        ((dirs["neox"], "--params", "W_Q", "--screen", 3), "TransformerBridge"),
        ((lm / "model", "--tokens", dirs["base"] / "text.txt"), "has none"),
        ((lm / "model", "--bridge"), "not one"),
        ((lm / "model", "--device", "tpu"), "--device must be"),
    ]:
        argv = argv if "--tokens" in argv else (*argv, "--tokens", toks)
        code, err = cli("scan", *argv, "--out", tmp_path / "bad", "--quiet", capsys=capsys)
        assert code == 2 and expect in err and err.count("\n") == 1, (argv, err)
    for k in ("0", "-2"):
        with pytest.raises(SystemExit) as exc:
            main(["scan", str(dirs["neox"]), "--tokens", str(toks), "--out", str(tmp_path / "bad"), "--screen", k])
        assert exc.value.code == 2
        assert "--screen" in capsys.readouterr().err
    with pytest.raises(ScanError, match="every nonzero weight"):
        scan(hf.load(dirs["llama"]), np.load(toks), screen=10**9, progress=False)


RUNNER = """
import os, signal, sys
from wtc.scan import screening, store
how, argv = sys.argv[1], sys.argv[2:]
screening.block_size = lambda chosen, sequences: 1    # one sequence, one draw per backward: many steps to cut
if how == "exact":        # killed (SIGKILL: nothing runs after) once the first chunk of exact KLs is committed
    real = store.ScanStore.write_chunk
    def write_chunk(self, *a, **k):
        real(self, *a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    store.ScanStore.write_chunk = write_chunk
elif how == "screen":     # killed in the screen's second block (the first one checkpointed)
    screening.CHECKPOINT_SECONDS = 0.0
    real, calls = screening.squared_sequence_gradients, []
    def grads(*a, **k):
        if len(calls) == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        calls.append(1)
        return real(*a, **k)
    screening.squared_sequence_gradients = grads
from wtc.cli import main
sys.exit(main(argv))
"""


def test_a_killed_screened_scan_resumes_to_the_uninterrupted_result(tmp_path):
    """A `wtc scan --screen` process killed with SIGKILL mid-screen, run again and killed mid exact
    scan, then run again to the end, writes what an uninterrupted run writes."""
    lm = tmp_path / "lm"          # a wtc model: the subprocesses start without importing transformers
    assert main(["lm-train", "--layers", "1", "--d-model", "16", "--heads", "2", "--vocab", "12", "--seq-len", "8",
                 "--steps", "5", "--scan-sequences", "3", "--out", str(lm), "--quiet"]) == 0
    argv = ["scan", str(lm / "model"), "--tokens", str(lm / "tokens.npy"), "--screen", "5", "--screen-random", "12",
            "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(how, out):
        return subprocess.run([sys.executable, "-c", RUNNER, how, *argv, "--out", str(out)], env=env,
                              capture_output=True, text=True, timeout=300)

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert run("none", whole).returncode == 0
    for when, blocks_done in (("screen", [0]), ("exact", [0, 1, 2])):
        killed = run(when, cut)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        assert not (cut / "summary.json").exists()
        assert torch.load(cut / "screen" / "state.pt")["done"] == blocks_done
    rerun = run("none", cut)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert (cut / "screened.csv").read_text() == (whole / "screened.csv").read_text()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, cut))
    assert a["screen"] == b["screen"] and a["top_weights"] == b["top_weights"]


def test_an_interrupt_mid_block_keeps_only_whole_blocks(dirs, tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM under the command) between two draw groups of a block: the state saved
    holds the finished blocks only, so the rerun adds nothing twice."""
    model, tokens = hf.load(dirs["gpt2"]), np.load(dirs["base"] / "tokens.npy")
    whole = screening.screen(model, tokens, samples=4, block=1, progress=False)
    monkeypatch.setattr(screening, "GRADIENT_BUDGET", 1)          # one draw per vmap'd backward
    real, calls = screening.squared_sequence_gradients, []

    def interrupted(*a, **k):
        if len(calls) == 6:                                       # block 1, its third draw
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(screening, "squared_sequence_gradients", interrupted)
    with pytest.raises(KeyboardInterrupt):
        screening.screen(model, tokens, samples=4, block=1, out=tmp_path, progress=False)
    assert torch.load(tmp_path / "state.pt")["done"] == [0]
    monkeypatch.setattr(screening, "squared_sequence_gradients", real)
    resumed = screening.screen(model, tokens, samples=4, block=1, out=tmp_path, progress=False)
    for n in whole:
        torch.testing.assert_close(resumed[n], whole[n], rtol=1e-12, atol=0)


# A module tree built as a TransformerLens TransformerBridge builds its own (components holding the
# Hugging Face module as `_original_component`, component names as the adapters of TransformerLens
# 3.x-4.x name them), with no adapter: the names resolve through wtc.scan.bridge_names alone.
LLAMA_COMPONENTS = {"embed": "model.embed_tokens", "ln_final": "model.norm", "unembed": "lm_head",
                    "blocks": ("model.layers", {"ln1": "input_layernorm", "ln2": "post_attention_layernorm",
                                                "attn": ("self_attn", {"q": "q_proj", "k": "k_proj", "v": "v_proj",
                                                                       "o": "o_proj"}),
                                                "mlp": ("mlp", {"gate": "gate_proj", "in": "up_proj",
                                                                "out": "down_proj"})})}
GPT2_COMPONENTS = {"embed": "transformer.wte", "pos_embed": "transformer.wpe", "ln_final": "transformer.ln_f",
                   "unembed": "lm_head",
                   "blocks": ("transformer.h", {"ln1": "ln_1", "ln2": "ln_2", "attn": ("attn", {"o": "c_proj"}),
                                                "mlp": ("mlp", {"in": "c_fc", "out": "c_proj"})})}


class Component(nn.Module):
    def __init__(self, original, subs=None):
        super().__init__()
        self._original_component = original
        for name, spec in (subs or {}).items():
            path, inner = spec if isinstance(spec, tuple) else (spec, None)
            self.add_module(name, Component(original.get_submodule(path), inner))


class FakeBridge(nn.Module):
    def __init__(self, model, components):
        super().__init__()
        for name, child in model.named_children():       # registered first: named_parameters() spells these
            self.add_module(name, child)
        for name, spec in components.items():
            path, inner = spec if isinstance(spec, tuple) else (spec, None)
            if name == "blocks":
                self.blocks = nn.ModuleList(Component(layer, inner) for layer in model.get_submodule(path))
            else:
                self.add_module(name, Component(model.get_submodule(path)))
        self.config = model.config
        self._forward = model.forward

    def forward(self, tokens):
        return self._forward(input_ids=tokens, use_cache=False).logits


LLAMA_NAMES = {"blocks.1.attn.W_Q": "model.layers.1.self_attn.q_proj.weight",
               "blocks.0.attn.W_K": "model.layers.0.self_attn.k_proj.weight",
               "blocks.1.attn.W_V": "model.layers.1.self_attn.v_proj.weight",
               "blocks.0.attn.W_O": "model.layers.0.self_attn.o_proj.weight",
               "blocks.0.attn.b_Q": "model.layers.0.self_attn.q_proj.bias",
               "blocks.1.attn.b_K": "model.layers.1.self_attn.k_proj.bias",
               "blocks.0.attn.b_V": "model.layers.0.self_attn.v_proj.bias",
               "blocks.1.attn.b_O": "model.layers.1.self_attn.o_proj.bias",
               "blocks.0.mlp.W_gate": "model.layers.0.mlp.gate_proj.weight",
               "blocks.1.mlp.W_in": "model.layers.1.mlp.up_proj.weight",
               "blocks.0.mlp.W_out": "model.layers.0.mlp.down_proj.weight",
               "blocks.1.mlp.b_in": "model.layers.1.mlp.up_proj.bias",
               "blocks.0.ln1.w": "model.layers.0.input_layernorm.weight",
               "blocks.1.ln2.w": "model.layers.1.post_attention_layernorm.weight",
               "ln_final.w": "model.norm.weight", "embed.W_E": "model.embed_tokens.weight",
               "unembed.W_U": "lm_head.weight"}
GPT2_NAMES = {"pos_embed.W_pos": "transformer.wpe.weight", "blocks.0.ln1.b": "transformer.h.0.ln_1.bias",
              "blocks.1.attn.W_O": "transformer.h.1.attn.c_proj.weight", "ln_final.b": "transformer.ln_f.bias",
              "blocks.0.mlp.b_out": "transformer.h.0.mlp.c_proj.bias"}


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_transformerlens_names_and_short_forms_select_and_scan_the_bridged_weights(dirs, kind):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(dirs[kind]).eval()
    bridge = FakeBridge(plain, LLAMA_COMPONENTS if kind == "llama" else GPT2_COMPONENTS)
    names, n_layers = (LLAMA_NAMES, 2) if kind == "llama" else (GPT2_NAMES, 2)
    params = dict(plain.named_parameters())
    for tl, hf_name in names.items():
        assert list(select(bridge, tl)) == [hf_name], tl
    short = {"W_Q": "attn.W_Q", "b_in": "mlp.b_in", "W_out": "mlp.W_out", "mlp.W_out": "mlp.W_out",
             "ln1.w": "ln1.w"} if kind == "llama" else {"W_in": "mlp.W_in", "W_O": "attn.W_O", "ln2.b": "ln2.b"}
    for form, full in short.items():
        assert list(select(bridge, form)) == [list(select(bridge, f"blocks.{i}.{full}"))[0] for i in range(n_layers)]
    if kind == "llama":
        assert list(select(bridge, "W_E")) == ["model.embed_tokens.weight"]
        assert list(select(bridge, "W_U")) == ["lm_head.weight"]
        assert len(select(bridge, "blocks.*.attn.W_*")) == 4 * n_layers
    else:
        assert list(select(bridge, "W_pos")) == ["transformer.wpe.weight"]
    tokens = np.load(dirs["base"] / "tokens.npy")
    picked = list(names)[:2] + ["blocks.1.ln2.w" if kind == "llama" else "blocks.0.ln1.b"]
    by_tl = scan(bridge, tokens, params=picked, progress=False)
    by_hf = scan(hf.load(dirs[kind]), tokens, params=[names[n] for n in picked], progress=False)
    for n in picked:
        torch.testing.assert_close(by_tl.total_kl[names[n]], by_hf.total_kl[names[n]], rtol=1e-4, atol=1e-9)
        # the result answers to the name the scan was asked for, as to the parameter's own
        assert by_tl.total_kl[n] is by_tl.total_kl[names[n]]
        index = tuple(int(i) for i in np.unravel_index(int(by_tl.total_kl[n].argmax()), by_tl.total_kl[n].shape))
        torch.testing.assert_close(by_tl.position_kl(n, index).sum(), by_tl.total_kl[n][index].double(),
                                   rtol=1e-5, atol=1e-12)
    # the top weights say the name they were asked by beside the stored one
    top = by_tl.top(len(picked) * 4)
    assert {row["also_named"] for row in top} <= set(picked) and all(names[row["also_named"]] == row["param"] for row in top)
    assert all("also_named" not in row for row in by_hf.top(4))
    assert all(p is params[n] for n, p in bridge.named_parameters())
    with pytest.raises(UnknownName) as err:
        select(bridge, "blocks.0.attn.W_QQ")
    assert "\n" not in str(err.value) and "blocks.0.attn.W_Q" in str(err.value)


def test_short_forms_on_models_with_transformerlens_names():
    model = Transformer(TransformerConfig(n_layers=2, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=10, n_ctx=4))
    assert list(select(model, "W_Q")) == ["blocks.0.attn.W_Q", "blocks.1.attn.W_Q"]
    assert list(select(model, "mlp.b_out")) == ["blocks.0.mlp.b_out", "blocks.1.mlp.b_out"]
    assert list(select(model, "W_E")) == ["embed.W_E"] and list(select(model, "W_U")) == ["unembed.W_U"]
    assert list(select(model, "W_pos")) == ["pos_embed.W_pos"]
    with pytest.raises(UnknownName, match="W_gate"):
        select(model, "W_gate")


def test_spearman_equals_scipys_with_ties():
    stats = pytest.importorskip("scipy.stats")
    from wtc.scan.screened import spearman
    rng = np.random.default_rng(0)
    for trial in range(100):
        n = int(rng.integers(3, 40))
        a = rng.integers(0, 4, n).astype(float) if trial % 2 else rng.normal(size=n)
        b = rng.normal(size=n)
        want = stats.spearmanr(a, b)[0]
        got = spearman(a, b)
        assert (got is None and np.isnan(want)) or got == pytest.approx(want, abs=1e-12)
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1, 2], [2, 1]) is None


def test_screened_scan_under_torchrun_equals_one_process(dirs, tmp_path):
    """`torchrun --nproc_per_node 2 -m wtc scan ... --screen K` (gloo, CPU): the screen and the exact
    scan are sharded over the ranks, rank 0 alone prints and writes, and what it writes is what one
    process writes."""
    argv = ["scan", str(dirs["llama"]), "--tokens", str(dirs["base"] / "tokens.npy"), "--screen", "5",
            "--screen-random", "12", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "wtc", *argv, "--out", str(tmp_path / "dist")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sum(ln.startswith("scanned ") for ln in lines) == 1 and sum(ln.startswith("screen (") for ln in lines) == 1
    assert json.loads((tmp_path / "dist" / "screen" / "meta.json").read_text())["world"] == 2
    assert {p.name for p in (tmp_path / "dist" / "screen").glob("state.rank*.pt")} == {"state.rank0.pt", "state.rank1.pt"}
    assert main(argv + ["--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "dist" / "screened.csv").read_text() == (tmp_path / "one" / "screened.csv").read_text()
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("dist", "one"))
    assert a["screen"] == b["screen"] and a["top_weights"] == b["top_weights"]

def test_a_tied_heads_own_name_selects_masks_and_reads_the_embedding(dirs):
    """GPT-2's head is its token embedding: `lm_head.weight`, in the Hugging Face model's own
    spelling (no wrapper prefix), selects it, keys weights= and reads the result."""
    model, tokens = hf.load(dirs["gpt2"]), np.load(dirs["base"] / "tokens.npy")
    assert list(select(model, "lm_head.weight")) == ["hf.transformer.wte.weight"]
    mask = torch.zeros(model.hf.transformer.wte.weight.shape, dtype=torch.bool)
    mask[int(tokens[0, 3]), :2] = True
    by_head = scan(model, tokens, params="lm_head.weight", weights={"lm_head.weight": mask}, progress=False)
    by_wte = scan(model, tokens, params="transformer.wte.weight", weights={"transformer.wte.weight": mask},
                  progress=False)
    assert torch.equal(by_head.total_kl["lm_head.weight"], by_wte.total_kl["transformer.wte.weight"])
    assert float(by_head.total_kl["lm_head.weight"][mask].min()) > 0

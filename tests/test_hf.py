"""wtc.models.hf: Hugging Face causal LMs with TransformerLens-style hook names; ACE on them.
Tiny randomly initialised models built from configs (nothing is downloaded)."""
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from wtc.ace import extract_core, validate                       # noqa: E402
from wtc.hooks import has_hooks, hook_modules                     # noqa: E402
from wtc.models.hf import HFModel, HFModelError, load, word_tokenizer   # noqa: E402

V, T = 23, 7


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=16, n_head=2, vocab_size=V, n_positions=16, n_inner=24))


def neox(parallel=True):
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        num_hidden_layers=3, hidden_size=16, num_attention_heads=2, intermediate_size=24, vocab_size=V,
        max_position_embeddings=16, use_parallel_residual=parallel))


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=3, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=24,
        vocab_size=V, max_position_embeddings=16))


def gemma2():
    return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        num_hidden_layers=3, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        intermediate_size=24, vocab_size=V, max_position_embeddings=16, attn_implementation="eager"))


MAKERS = {"gpt2": gpt2, "neox_parallel": neox, "neox_sequential": lambda: neox(False), "llama": llama,
          "gemma2": gemma2}


def make(name, seed=0):
    torch.manual_seed(seed)
    return MAKERS[name]().double().eval()


def tokens(n=5, seed=0):
    return torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed))


POINTS = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


@pytest.mark.parametrize("name", MAKERS)
def test_resid_hooks_equal_the_models_hidden_states(name):
    hf = make(name)
    model = HFModel(hf)
    x = tokens()
    with torch.no_grad():
        states = hf(input_ids=x, output_hidden_states=True, use_cache=False).hidden_states
        logits, cache = model.run_with_cache(x)
    n = model.n_layers
    assert len(states) == n + 1
    for i in range(n):
        assert torch.equal(cache[f"blocks.{i}.hook_resid_pre"], states[i])
    for i in range(n - 1):
        assert torch.equal(cache[f"blocks.{i}.hook_resid_post"], states[i + 1])
    # Hugging Face's last hidden state is after the final norm
    assert torch.allclose(model.final_norm(cache[f"blocks.{n - 1}.hook_resid_post"]), states[n], atol=1e-12)
    with torch.no_grad():
        assert torch.equal(logits, hf(input_ids=x, use_cache=False).logits)


@pytest.mark.parametrize("name", MAKERS)
def test_block_points_add_up(name):
    model = HFModel(make(name))
    with torch.no_grad():
        _, c = model.run_with_cache(tokens())
    for i in range(model.n_layers):
        pre, attn, mlp, post = (c[f"blocks.{i}.{p}"] for p in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out",
                                                              "hook_resid_post"))
        if model.layout.parallel:
            assert f"blocks.{i}.hook_resid_mid" not in c
            assert torch.allclose(post, pre + attn + mlp, atol=1e-12)
        else:
            mid = c[f"blocks.{i}.hook_resid_mid"]
            assert torch.equal(mid, pre + attn)
            assert torch.allclose(post, mid + mlp, atol=1e-12)


@pytest.mark.parametrize("name", ["gpt2", "neox_sequential", "llama", "gemma2"])
def test_a_replaced_resid_mid_flows_on(name):
    """Adding d to resid_mid is adding d to attn_out: both change the residual after attention."""
    model = HFModel(make(name))
    d = torch.randn(model.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = tokens()
    with torch.no_grad():
        clean = model(x)
        a = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_mid", lambda v, hook: v + d)])
        b = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_attn_out", lambda v, hook: v + d)])
    assert (a - clean).abs().max() > 1e-3
    assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("name", ["gpt2", "neox_parallel", "llama"])
def test_wrapper_patches_equal_module_patches_and_leave_no_hooks(name):
    hf = make(name)
    model = HFModel(hf)
    x = tokens()
    layers = model.layout.layers
    with torch.no_grad():
        a = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_post", lambda v, hook: 1.5 * v)])
        with hook_modules(hf, [(f"{layers}.0", lambda v, m: 1.5 * v)]):
            b = hf(input_ids=x, use_cache=False).logits
        c = model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_pre", lambda v, hook: 1.5 * v)])
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not has_hooks(hf)


def _readout(out):
    return out[:, -1, :3]


@pytest.mark.parametrize("name", MAKERS)
def test_extract_core_and_validate_on_hf_layers(name):
    hf = make(name)
    model = HFModel(hf)
    x = tokens(64, seed=2)
    core = extract_core(model, x, "blocks.2.hook_resid_post", readout=_readout)
    # the same layer hooked by its Hugging Face path, the readout given the ModelOutput's logits
    raw = extract_core(hf, x, f"{model.layout.layers}.2", readout=_readout)
    assert 1 <= core.rank <= model.d_model and core.rank == raw.rank
    assert torch.allclose(core.s, raw.s, rtol=1e-9, atol=1e-12)
    with torch.no_grad():
        labels = _readout(model(x)).argmax(-1)
    v = validate(core, model, x, labels, readout=_readout)
    assert v["baseline_acc"] == 1.0                            # labels are the model's own predictions
    assert v["minimal_sufficient_rank"] is not None
    # patching through the TL-style point is patching the Hugging Face layer
    w = validate(raw, hf, x, labels, readout=_readout)
    for k in ("keep_acc", "remove_acc", "flip_acc", "minimal_sufficient_rank", "minimal_necessary_rank"):
        assert v[k] == w[k], k
    for p in POINTS[:2] + POINTS[3:]:
        extract_core(model, x[:8], f"blocks.1.{p}", readout=_readout)


def test_load_from_a_directory_with_a_word_tokenizer(tmp_path):
    hf = make("gpt2")
    hf.save_pretrained(tmp_path)
    words = [f"w{i}" for i in range(V - 1)]
    word_tokenizer(words).save_pretrained(tmp_path)
    model = load(tmp_path)
    assert model.tokenizer is not None
    assert model.encode("w3 w0 w21") == [3, 0, 21]
    assert model.encode("zzz") == [V - 1]                      # <unk>
    assert word_tokenizer(words, bos="w4").bos_token_id == 4
    with pytest.raises(HFModelError, match="bos"):
        word_tokenizer(words, bos="nope")
    x = tokens()
    with torch.no_grad():
        assert torch.allclose(model(x).double(), hf(input_ids=x).logits, atol=1e-5)


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(HFModelError, match="not a directory"):
        load(tmp_path / "missing")
    with pytest.raises(HFModelError, match="no config.json"):
        load(tmp_path)
    with pytest.raises(HFModelError, match="model_type"):
        HFModel(torch.nn.Linear(2, 2))
    with pytest.raises(HFModelError, match="causal LM"):
        HFModel(transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=V)))
    model = HFModel(make("gpt2"))
    with pytest.raises(HFModelError, match="token ids"):
        model(torch.full((1, 3), V))
    with pytest.raises(HFModelError, match="no tokenizer"):
        model.encode("w1")


def test_import_wtc_does_not_import_transformers():
    code = "import sys, wtc, wtc.models.hf, wtc.ace; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""TransformerLens 3's TransformerBridge over a local, randomly initialised GPT-2 (optional: skipped
when transformer_lens or transformers is absent; nothing is downloaded)."""
from dataclasses import replace

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens.model_bridge")

from wtc.ace import extract_core, patched  # noqa: E402
from wtc.hooks import hook_modules  # noqa: E402
from wtc.models.tl import load_bridge  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    from wtc.models.hf import word_tokenizer

    d = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=50)).save_pretrained(d)
    word_tokenizer([f"w{i}" for i in range(49)], bos="w0").save_pretrained(d)
    return d


def centred_last(out):
    logits = out.logits if hasattr(out, "logits") else out
    return logits[:, -1] - logits[:, -1].mean(-1, keepdim=True)


def test_bridge_hook_names_are_the_models_hidden_states(gpt2_dir):
    from transformers import AutoModelForCausalLM

    bridge = load_bridge(gpt2_dir)
    hf = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    x = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hs = hf(x, output_hidden_states=True).hidden_states
        torch.testing.assert_close(bridge(x), hf(x).logits, rtol=0, atol=1e-6)
    seen = {}
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"]
    with hook_modules(bridge, [(n, lambda v, m, n=n: seen.__setitem__(n, v.detach())) for n in names]):
        with torch.no_grad():
            bridge(x)
    # hidden_states[i] is the input of block i (the last one has ln_f applied, so it is not compared)
    for n, h in zip(names, (hs[0], hs[1], hs[1])):
        torch.testing.assert_close(seen[n], h, rtol=0, atol=1e-6)


def test_ace_on_the_bridge_equals_ace_on_the_hugging_face_module(gpt2_dir):
    from transformers import AutoModelForCausalLM

    bridge = load_bridge(gpt2_dir)
    hf = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    x = torch.randint(0, 50, (64, 8), generator=torch.Generator().manual_seed(2))
    ours = extract_core(bridge, x, "blocks.1.hook_resid_post", readout=centred_last, energy=0.99, position=-1)
    ref = extract_core(hf, x, "transformer.h.1", readout=centred_last, energy=0.99, position=-1)
    assert ours.rank == ref.rank
    torch.testing.assert_close(ours.s.double(), ref.s.double(), rtol=1e-4, atol=1e-6)
    for mode in ("keep", "remove", "flip"):                # the same patch through either name
        with torch.no_grad(), patched(bridge, ours, mode):
            a = bridge(x)
        with torch.no_grad(), patched(hf, replace(ours, layer="transformer.h.1"), mode):
            b = hf(x).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert (a - bridge(x)).abs().max() > 1e-3                       # and it changes something


def test_load_bridge_refuses_a_directory_without_a_model(tmp_path):
    from wtc.models.hf import HFModelError

    with pytest.raises(HFModelError, match="config.json"):
        load_bridge(tmp_path)

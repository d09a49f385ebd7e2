"""Scans of a TransformerLens TransformerBridge by the names users know (TransformerLens 3.x or 4.x;
skipped when it is absent; a local, randomly initialised GPT-2, nothing downloaded)."""
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("transformer_lens.model_bridge")

from wtc.errors import UnknownName  # noqa: E402
from wtc.models import hf  # noqa: E402
from wtc.models.tl import load_bridge  # noqa: E402
from wtc.scan.engine import scan  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    d = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=16, vocab_size=30)).save_pretrained(d)
    hf.word_tokenizer([f"w{i}" for i in range(29)], bos="w0").save_pretrained(d)
    return d


def totals(model, x, params):
    res = scan(model, x, params=params, progress=False)
    return {n: res.total_kl[n] for n in res.shapes}


def test_transformerlens_and_bridge_names_scan_the_weights_the_hugging_face_model_has(gpt2_dir):
    bridge = load_bridge(gpt2_dir)
    plain = hf.load(gpt2_dir)
    x = torch.randint(0, 30, (2, 8), generator=torch.Generator().manual_seed(0))
    want = totals(plain, x, "transformer.h.1.mlp.c_proj.weight")["hf.transformer.h.1.mlp.c_proj.weight"]
    for name in ("blocks.1.mlp.W_out", "blocks.1.mlp.out.weight", "transformer.h.1.mlp.c_proj.weight"):
        (got,) = totals(bridge, x, name).values()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-9, msg=name)
    assert len(totals(bridge, x, "blocks.*.mlp.W_in")) == 2
    # W_Q is the bridge's q projection (nn.Linear, (out, in)): GPT-2's fused c_attn (in, 3 out), its first third
    c_attn = totals(plain, x, "transformer.h.0.attn.c_attn.weight")["hf.transformer.h.0.attn.c_attn.weight"]
    (q,) = totals(bridge, x, "blocks.0.attn.W_Q").values()
    torch.testing.assert_close(q, c_attn[:, :16].T, rtol=1e-3, atol=1e-9)


def test_a_bridge_stays_usable_after_a_scan_of_its_q_weight(gpt2_dir):
    """The q/k/v weights of a bridge are views of the fused c_attn: torch.func's swap of them came
    back as a plain tensor and broke every later pass; the scan now puts the parameters back and
    zeroes those weights in place instead."""
    bridge = load_bridge(gpt2_dir)
    x = torch.randint(0, 30, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        clean = bridge(x).clone()
    params = dict(bridge.named_parameters())
    first = totals(bridge, x, "blocks.0.attn.W_Q")
    second = totals(bridge, x, "blocks.0.attn.W_Q")
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0)
    assert all(p is params[n] for n, p in bridge.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(bridge(x), clean, rtol=0, atol=0)


def test_a_name_the_bridge_lacks_is_one_line_with_close_names(gpt2_dir):
    bridge = load_bridge(gpt2_dir)
    x = torch.randint(0, 30, (1, 4))
    with pytest.raises(UnknownName) as err:
        scan(bridge, x, params="blocks.1.mlp.W_outt", progress=False)
    assert "\n" not in str(err.value) and "blocks.1.mlp.W_out" in str(err.value)

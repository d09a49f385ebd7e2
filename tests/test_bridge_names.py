"""Names users know for a wrapped model's parameters (wtc.scan.bridge_names), on a module tree built
like a TransformerLens TransformerBridge's (no TransformerLens needed)."""
import pytest
import torch
from torch import nn

from wtc.errors import UnknownName
from wtc.scan import bridge_names
from wtc.scan.names import select


class Component(nn.Module):
    """A bridge component: the wrapped module as `_original_component`, sub-components beside it."""

    def __init__(self, original: nn.Module, **subs):
        super().__init__()
        self._original_component = original
        for k, v in subs.items():
            self.add_module(k, v)


class Adapter:
    """A bridge adapter's mapping: HookedTransformer path -> the wrapped model's path."""
    table = {"mlp.W_out": "mlp.c_proj.weight", "mlp.W_in": "mlp.c_fc.weight", "attn.W_Q": "attn.q.weight"}

    def translate_transformer_lens_path(self, path):
        parts = path.split(".")
        if parts[0] == "embed" and parts[1] == "W_E":
            return "transformer.wte.weight"
        if parts[0] == "blocks" and ".".join(parts[2:]) in self.table:
            return f"transformer.h.{parts[1]}.{self.table['.'.join(parts[2:])]}"
        raise ValueError(path)


def fake_bridge(with_adapter: bool):
    layers = []
    for _ in range(2):
        layer = nn.Module()
        layer.attn = nn.Module()
        layer.attn.q = nn.Linear(8, 8)
        layer.mlp = nn.Module()
        layer.mlp.c_fc, layer.mlp.c_proj = nn.Linear(8, 16), nn.Linear(16, 8)
        layers.append(layer)
    model = nn.Module()
    model.transformer = nn.Module()                       # registered first: named_parameters() spells these
    model.transformer.wte = nn.Embedding(10, 8)
    model.transformer.h = nn.ModuleList(layers)
    model.lm_head = nn.Linear(8, 10, bias=False)
    model.lm_head.weight = model.transformer.wte.weight   # tied
    model.embed = Component(model.transformer.wte)
    model.blocks = nn.ModuleList(
        Component(layer, attn=Component(layer.attn, q=Component(layer.attn.q)),
                  mlp=Component(layer.mlp, **{"in": Component(layer.mlp.c_fc), "out": Component(layer.mlp.c_proj)}))
        for layer in layers)
    if with_adapter:
        model.adapter = Adapter()
    return model


@pytest.mark.parametrize("with_adapter", [True, False])
def test_bridge_and_transformerlens_names_select_the_underlying_parameter(with_adapter):
    model = fake_bridge(with_adapter)
    out1 = model.transformer.h[1].mlp.c_proj.weight
    for name in ["blocks.1.mlp.W_out", "blocks.1.mlp.out.weight", "blocks.1.mlp.out._original_component.weight"]:
        chosen = select(model, name)
        assert list(chosen) == ["transformer.h.1.mlp.c_proj.weight"] and chosen["transformer.h.1.mlp.c_proj.weight"] is out1
    q = select(model, "blocks.*.attn.W_Q")
    assert [p for p in q.values()] == [model.transformer.h[0].attn.q.weight, model.transformer.h[1].attn.q.weight]
    assert list(select(model, "blocks.0.mlp.W_in")) == ["transformer.h.0.mlp.c_fc.weight"]
    assert list(select(model, "lm_head.weight")) == ["transformer.wte.weight"]        # the tied head's own path
    assert list(select(model, "embed.W_E")) == ["transformer.wte.weight"]
    assert list(select(model, "transformer.h.1.mlp.c_proj.weight")) == ["transformer.h.1.mlp.c_proj.weight"]
    # every alias names a parameter the model has, and the parameter it names
    named = dict(model.named_parameters())
    tl_leaves = {n.rsplit(".", 1)[-1] for n in bridge_names.TL_NAMES}
    for alias, full in bridge_names.aliases(model).items():
        if alias.rsplit(".", 1)[-1] in tl_leaves:         # HookedTransformer names: no such attribute path
            continue
        obj = model                         # the path walked, stepping into a component's wrapped module
        for part in alias.split("."):       # where the component itself lacks the step
            while not hasattr(obj, part):
                obj = obj._original_component
            obj = getattr(obj, part)
        assert obj is named[full], alias


def test_a_name_nothing_matches_is_one_line_with_the_closest_names():
    model = fake_bridge(with_adapter=True)
    with pytest.raises(UnknownName) as err:
        select(model, "blocks.1.mlp.W_outt")
    msg = str(err.value)
    assert "\n" not in msg and "'blocks.1.mlp.W_outt'" in msg and "blocks.1.mlp.W_out" in msg
    with pytest.raises(UnknownName):
        select(model, "blocks.1.mlp.W_gate")          # a HookedTransformer name this model lacks


def test_plain_models_keep_their_names():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert bridge_names.aliases(model) == {}
    assert list(select(model, "*.weight")) == ["0.weight", "2.weight"]
    with pytest.raises(UnknownName):
        select(model, "blocks.0.mlp.W_out")
    assert torch.equal(select(model, "2.weight")["2.weight"], model[2].weight)

"""The names users know for the parameters of a TransformerLens TransformerBridge (or any model
whose modules wrap others), so a scan takes them (wtc.scan.names.select falls back to these).

A bridge keeps each Hugging Face module inside a component as `_original_component`, and its
named_parameters() spell a weight the long way round:
`transformer.h.1._original_component.mlp._original_component.c_proj._original_component.weight`.
Other names reach the same parameter object:
  - every module path to it (named_modules without removing duplicates: the bridge's own tree
    `blocks.1.mlp.out` and the wrapped model's `transformer.h.1.mlp.c_proj`) with the
    `_original_component` steps left out: `blocks.1.mlp.out.weight`, `transformer.h.1.mlp.c_proj.weight`
    (and a tied weight's other use: GPT-2's `lm_head.weight` is `transformer.wte.weight`);
  - HookedTransformer names (`blocks.1.mlp.W_out`, `blocks.0.attn.W_Q`, `embed.W_E`, ...), through the
    bridge's own mapping when it has one (`adapter.translate_transformer_lens_path`, TransformerLens
    3.x and 4.x), for the names of TL_NAMES in every block; where it has none (or a pattern such as
    `blocks.*.mlp.W_out`), through TL_TO_BRIDGE, which rewrites the HookedTransformer leaf into the
    bridge component's (`mlp.W_out` -> `mlp.out.weight`).
  - the short forms a TransformerLens user types (wtc.scan.bridge_names.short_form): a bare leaf
    stands for it in every block or its one global place (`W_Q` -> `blocks.*.attn.W_Q`, `W_E` ->
    `embed.W_E`), a block-relative name for it in every block (`mlp.W_out` -> `blocks.*.mlp.W_out`).
A bridge's aliases hold the HookedTransformer name of every bridge parameter TL_TO_BRIDGE reaches
in every block, so a pattern (`blocks.*.attn.W_*`) matches as it does on a HookedTransformer.
A name selects the parameter in its own layout: W_Q of a bridge over GPT-2 is the q projection's
nn.Linear weight (d_head * n_heads, d_model), not HookedTransformer's (n_heads, d_model, d_head), and
results are reported under the parameter's named_parameters() name.
"""
from __future__ import annotations

import fnmatch
import re

from torch import nn

WRAPPED = "_original_component"

# HookedTransformer parameter names: per block (blocks.L. before them) and global
TL_BLOCK_NAMES = ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "attn.b_Q", "attn.b_K", "attn.b_V", "attn.b_O",
                  "mlp.W_in", "mlp.W_gate", "mlp.W_out", "mlp.b_in", "mlp.b_out", "ln1.w", "ln1.b", "ln2.w", "ln2.b")
TL_GLOBAL_NAMES = ("embed.W_E", "pos_embed.W_pos", "unembed.W_U", "unembed.b_U", "ln_final.w", "ln_final.b")
TL_NAMES = TL_BLOCK_NAMES + TL_GLOBAL_NAMES

# HookedTransformer name (its last two steps) -> the TransformerBridge component's parameter
TL_TO_BRIDGE = {
    "attn.W_Q": "attn.q.weight", "attn.W_K": "attn.k.weight", "attn.W_V": "attn.v.weight", "attn.W_O": "attn.o.weight",
    "attn.b_Q": "attn.q.bias", "attn.b_K": "attn.k.bias", "attn.b_V": "attn.v.bias", "attn.b_O": "attn.o.bias",
    "mlp.W_in": "mlp.in.weight", "mlp.W_gate": "mlp.gate.weight", "mlp.W_out": "mlp.out.weight",
    "mlp.b_in": "mlp.in.bias", "mlp.b_out": "mlp.out.bias",
    "ln1.w": "ln1.weight", "ln1.b": "ln1.bias", "ln2.w": "ln2.weight", "ln2.b": "ln2.bias",
    "embed.W_E": "embed.weight", "pos_embed.W_pos": "pos_embed.weight", "unembed.W_U": "unembed.weight",
    "unembed.b_U": "unembed.bias", "ln_final.w": "ln_final.weight", "ln_final.b": "ln_final.bias",
}


BRIDGE_TO_TL = {bridge: tl for tl, bridge in TL_TO_BRIDGE.items()}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")

# a bare HookedTransformer leaf -> its place (HookedTransformer's own model.W_Q, model.W_E, ... properties)
SHORT = {n.split(".")[-1]: ("blocks.*." + n) for n in TL_BLOCK_NAMES if not n.startswith("ln")}
SHORT.update({n.split(".")[-1]: n for n in TL_GLOBAL_NAMES if not n.startswith("ln_final")})


def short_form(pattern: str) -> str | None:
    """The full TransformerLens pattern a short form stands for (`W_Q` -> `blocks.*.attn.W_Q`,
    `mlp.W_out` -> `blocks.*.mlp.W_out`, `ln1.w` -> `blocks.*.ln1.w`), None for any other name."""
    if pattern in SHORT:
        return SHORT[pattern]
    if pattern in TL_BLOCK_NAMES:
        return "blocks.*." + pattern
    return None


def _plain(path: str) -> str:
    """A path without the wrapper steps."""
    return ".".join(p for p in path.split(".") if p != WRAPPED)


def aliases(model: nn.Module) -> dict[str, str]:
    """{other name: named_parameters() name} for every parameter reached by more than its own name
    (module docstring); empty for a model that wraps nothing and has no TransformerLens mapping."""
    canonical = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, str] = {}
    # the module tree's paths, and named_parameters' own (a bridge spells those from the wrapped model)
    paths = [(f"{path}.{leaf}" if path else leaf, p) for path, module in model.named_modules(remove_duplicate=False)
             for leaf, p in module._parameters.items()]
    for full, p in paths + list(model.named_parameters(remove_duplicate=False)):
        if p is None or id(p) not in canonical:
            continue
        for name in sorted({full, _plain(full)}):
            if name != canonical[id(p)]:
                out.setdefault(name, canonical[id(p)])
    translate = getattr(getattr(model, "adapter", None), "translate_transformer_lens_path", None)
    if callable(translate):
        blocks = getattr(model, "blocks", None)
        n_blocks = len(blocks) if isinstance(blocks, (nn.ModuleList, list, tuple)) else 0
        wanted = [f"blocks.{i}.{n}" for i in range(n_blocks) for n in TL_BLOCK_NAMES] + list(TL_GLOBAL_NAMES)
        for tl_name in wanted:
            try:
                remote = translate(tl_name)
            except Exception:           # a name this architecture lacks (W_gate of GPT-2, pos_embed of LLaMA)
                continue
            target = out.get(remote) or (remote if remote in canonical.values() else None)
            if target is not None:
                out.setdefault(tl_name, target)
    if callable(translate) or any(hasattr(m, WRAPPED) for m in model.modules()):
        # a bridge: the HookedTransformer name of each component parameter its tree has (the
        # adapter cannot translate every one: GPT-2's W_Q lies in the fused c_attn)
        for alias, target in list(out.items()) + [(n, n) for n in canonical.values()]:
            m = _BLOCK.fullmatch(alias)
            tl = BRIDGE_TO_TL.get(m.group(2) if m else alias)
            if tl is not None and (m is not None) == (tl in TL_BLOCK_NAMES):
                out.setdefault(f"blocks.{m.group(1)}.{tl}" if m else tl, target)
    return out


def match(model: nn.Module, pattern: str, table: dict[str, str] | None = None) -> list[str]:
    """The named_parameters() names a name / fnmatch pattern selects among the aliases, first as
    written, then with a HookedTransformer leaf rewritten by TL_TO_BRIDGE; [] when none does."""
    table = aliases(model) if table is None else table
    hits = [table[a] for a in table if fnmatch.fnmatchcase(a, pattern)]
    if not hits:
        for tl, bridge in TL_TO_BRIDGE.items():
            if pattern == tl or pattern.endswith("." + tl):
                rewritten = pattern[:len(pattern) - len(tl)] + bridge
                hits = [table[a] for a in table if fnmatch.fnmatchcase(a, rewritten)]
                break
    return list(dict.fromkeys(hits))


def scanned_aliases(model: nn.Module, names) -> dict[str, str]:
    """The aliases of the parameters `names` only (a scan result looks names up in them)."""
    names = set(names)
    return {a: n for a, n in aliases(model).items() if n in names}


__all__ = ["aliases", "match", "scanned_aliases", "short_form", "TL_NAMES", "TL_TO_BRIDGE"]

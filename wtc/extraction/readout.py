"""Reading a frozen Discrete Transformer on data: every variable in program units, every pointer.

Program units: inputs as given, pos as the integer position t, a routed value in the units of its
source, a sub-MLP output in model units (until its formula replaces it). Every variable is 0 at the
pad positions before the start, in program units as in the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Module:
    """One module of the frozen model, as extraction sees it."""

    name: str                        # stream variable it writes: "L0.h1", "L0.a0", "L0.m2"
    kind: str                        # "head" | "aggregate" | "mlp"
    reads: dict[str, str]            # slot -> variable ("q", "k", "v" or "in0", ...)
    content: bool = False            # head may score content (q, k matter)
    layer: int = 0
    index: int = 0
    op: str = ""                     # an aggregate's "mean", "sum" or "per<p>" (DTConfig.agg_ops)
    coefficients: tuple = ()         # a periodic aggregate's c[0 .. p-1] (wtc.dt.periodic)


@dataclass
class Readout:
    x: np.ndarray                    # (n, T, n_in) raw inputs
    y_model: np.ndarray              # (n, T, O) model predictions (task units)
    stream: np.ndarray               # (n, L, V) model units, float64
    pointers: dict[str, np.ndarray]  # head -> (n, T) chosen keys
    names: list[str]
    P: int
    T: int
    modules: list[Module] = field(default_factory=list)

    def model_values(self, name: str) -> np.ndarray:
        return self.stream[:, :, self.names.index(name)]


def modules_of(model) -> list[Module]:
    """The modules of a single-replica frozen model in stream order, with what each reads."""
    structure = model.structure(0)
    out = []
    for layer, block in enumerate(model.blocks):
        if block.attn is not None:
            content = bool(block.attn.content[0] > 0)
            for h, name in enumerate(block.attn.head_names):
                out.append(Module(name, "head", {r: structure[f"{name}.{r}"] for r in "qkv"}, content, layer, h))
            for a, name in enumerate(block.attn.agg_names):
                periodic = block.attn.periodic
                coef = tuple(periodic.coefficients(0, a)) if periodic is not None and a in periodic.heads else ()
                out.append(Module(name, "aggregate", {"v": structure[f"{name}.v"]}, False, layer, a,
                                  block.attn.agg_ops[a], coef))
        if block.mlp is not None:
            for m, name in enumerate(block.mlp.names):
                reads = {f"in{i}": structure[f"{name}.in{i}"] for i in range(block.mlp.k)}
                out.append(Module(name, "mlp", reads, False, layer, m))
    return out


def read(model, x: np.ndarray) -> Readout:
    """Run the frozen single-replica model on raw inputs x (n, T, n_in) and record everything."""
    y, cache = model.run_with_cache(x, names_filter=lambda name: name == "hook_stream"
                                    or name.endswith(".attn.hook_pattern"))
    y = y[0] if y.ndim == (4 if model.n_outputs > 1 else 3) else y
    stream = cache["hook_stream"][0].double().numpy()
    pointers = {}
    for layer, block in enumerate(model.blocks):
        if block.attn is not None and block.attn.H:
            pat = cache[f"blocks.{layer}.attn.hook_pattern"][0]                   # (n, H, T, L)
            idx = pat.argmax(-1).numpy()
            for h, name in enumerate(block.attn.head_names):
                pointers[name] = idx[:, h]
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 2:
        y = y[:, :, None]
    return Readout(x, y, stream, pointers, list(model.variable_names), model.P, model.seq_len, modules_of(model))


@torch.no_grad()
def head_weights(model) -> np.ndarray:
    """(V, O): raw-output change per unit of each variable in model units."""
    return (model.W_out[0] * model.y_scale).double().numpy()


def pad(values: np.ndarray, P: int) -> np.ndarray:
    """(n, T) real-position values -> (n, P + T) with zeros in front."""
    return np.concatenate([np.zeros((values.shape[0], P)), values], axis=1)

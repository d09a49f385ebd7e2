"""A user's torch module built from wtc.dt.layers, as the DiscreteTransformer extract() reads.

The module must hold one DTLayers and one LinearReadout, and compute readout(layers(x)): that is
checked on the task's inputs, not assumed from the module tree (a forward may do anything). When
the output comes from something wtc cannot read (the user's own head, a transform of the inputs
or outputs), extraction is refused, naming what it cannot read: a program built from the DT alone
would silently ignore it.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from wtc.dt.layers import DTLayers, LinearReadout, compose
from wtc.dt.model import DiscreteTransformer
from wtc.errors import WtcError

CHECK_SEQUENCES = 256        # task inputs the user's forward is compared on
AGREEMENT = 1e-4             # max |user - composed| relative to 1 + max |output|: float32 summation order
ADVICE = ("build the model's output as wtc.dt.layers.LinearReadout(DTLayers(x)) (your loss, optimizer and loop "
          "stay yours), or extract a wtc.train model")


def _type_name(module: nn.Module) -> str:
    cls = type(module)
    where = "torch.nn" if cls.__module__.startswith("torch.nn.") else cls.__module__
    return f"{where}.{cls.__qualname__}"


def _is_wtc(module: nn.Module) -> bool:
    return isinstance(module, (DTLayers, LinearReadout))


def foreign_modules(model: nn.Module, prefix: str = "") -> list[str]:
    """"'name' (type)" of each submodule that is neither a wtc layer nor a container of one."""
    out = []
    for name, child in model.named_children():
        path = f"{prefix}{name}"
        if _is_wtc(child):
            continue
        if any(_is_wtc(m) for m in child.modules()):
            out += foreign_modules(child, path + ".")
        else:
            out.append(f"{path!r} ({_type_name(child)})")
    return out


def readable_model(model, task, error: type[WtcError]) -> DiscreteTransformer:
    """The single-replica DiscreteTransformer computing `model`, or `error` naming what wtc
    cannot read."""
    if not isinstance(model, nn.Module):
        raise error(f"extract() reads a wtc DiscreteTransformer or a torch module built from wtc.dt.layers, "
                    f"got {type(model).__name__}")
    named = list(model.named_modules())
    layers = [(n, m) for n, m in named if isinstance(m, DTLayers)]
    readouts = [(n, m) for n, m in named if isinstance(m, LinearReadout)]
    kind = _type_name(model)
    if not layers:
        inner = [n for n, m in named if isinstance(m, DiscreteTransformer)]
        if inner:
            raise error(f"{kind} holds a DiscreteTransformer at {inner[0]!r} whose own head is not the model's "
                        f"output; extract() cannot read the rest: {ADVICE}")
        raise error(f"extract() reads a wtc DiscreteTransformer or a torch module built from wtc.dt.layers; "
                    f"{kind} holds no DTLayers")
    if len(layers) > 1:
        raise error(f"{kind} holds {len(layers)} DTLayers ({', '.join(repr(n) for n, _ in layers)}); "
                    f"extract() reads a model with one")
    if model is layers[0][1]:
        raise error("a DTLayers returns the stream (B, T, V), not a prediction: put a "
                    "wtc.dt.layers.LinearReadout on it and extract the module holding both")
    layer_name, dt = layers[0]
    foreign = foreign_modules(model)
    if len(readouts) != 1:
        what = (f"cannot read {', '.join(foreign)}: the program would ignore it" if foreign and not readouts
                else f"{kind} holds {len(readouts)} LinearReadouts, extract() reads a model with one")
        raise error(f"{what}; {ADVICE}")
    readout_name, readout = readouts[0]
    if not dt.frozen:
        raise error(f"the DTLayers {layer_name!r} is not frozen: call its freeze() (or wtc.dt.layers.finish) "
                    f"when its schedule is done")
    if readout.in_features != dt.out_features:
        raise error(f"the LinearReadout {readout_name!r} reads {readout.in_features} variables, the DTLayers "
                    f"{layer_name!r} writes {dt.out_features}")
    if (dt.seq_len, dt.n_inputs, readout.out_features) != (task.seq_len, task.n_inputs, task.n_outputs):
        raise error(f"model shape (seq_len, n_inputs, n_outputs) = {(dt.seq_len, dt.n_inputs, readout.out_features)} "
                    f"does not match task {task.name!r}: {(task.seq_len, task.n_inputs, task.n_outputs)}")
    composed = compose(dt, readout)
    _check_agreement(model, composed, task, foreign, error)
    composed.train_info = {"embedded": f"{readout_name}({layer_name}) of {kind}"}
    return composed


def _check_agreement(model: nn.Module, composed: DiscreteTransformer, task, foreign: list[str],
                     error: type[WtcError]) -> None:
    """Refuse unless model(x) == LinearReadout(DTLayers(x)) on the task's inputs."""
    x, _ = task.batch(np.random.default_rng([0, 38]), CHECK_SEQUENCES)
    device = composed.W_out.device
    xt = torch.as_tensor(x, dtype=torch.float32, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            got = model(xt)
    except Exception as exc:
        raise error(f"could not run {_type_name(model)} on the task's inputs (a float32 tensor "
                    f"{tuple(xt.shape)}) to check what it computes: {type(exc).__name__}: {exc}") from exc
    finally:
        model.train(was_training)
    with torch.no_grad():
        want = composed.denormalize_outputs(composed(composed.normalize_inputs(xt))[0])[0]   # (B, T, O)
    if not torch.is_tensor(got):
        raise error(f"{_type_name(model)} returned {type(got).__name__}, not a tensor (B, T, n_outputs)")
    if got.shape != want.shape and got.shape == want.shape[:2] and want.shape[2] == 1:
        got = got.unsqueeze(-1)
    if got.shape != want.shape:
        raise error(f"{_type_name(model)} returned shape {tuple(got.shape)}, expected (B, T, n_outputs) = "
                    f"{tuple(want.shape)}")
    diff = float((got.float() - want).abs().max())
    if not diff <= AGREEMENT * (1 + float(want.abs().max())):   # NaN refused too
        what = (f"cannot read {', '.join(foreign)}: the program would ignore it" if foreign else
                f"the forward of {_type_name(model)} changes the inputs or the readout's output, which the "
                f"program would ignore")
        raise error(f"{what} (its output differs from LinearReadout(DTLayers(x)) by up to {diff:.3g} on the "
                    f"task's inputs); {ADVICE}")

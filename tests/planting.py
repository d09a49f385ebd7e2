"""Helpers the tests share: aggregate-head models planted by hand (sum, periodic and prefix-extreme
heads: the selections set so each head reads a chosen variable, frozen, the readout refit to the
task), a program's source run as a user runs it, and a task declared as a user declares one."""
import inspect

import numpy as np
import torch

import wtc

from wtc.dt import DTConfig
from wtc.dt.attempt import Attempt
from wtc.dt.finish import refit_head


def planted_aggregates(task, cfg: DTConfig, setup=None):
    """(model, attempt): a frozen single-replica model of cfg whose head a0 of layer 0 reads x and of
    layer l reads layer l - 1's a0 (a chain: a sum of sums); setup(model), if given, runs before
    the freeze (a periodic head's coefficients)."""
    run = Attempt(task, cfg, seed=0, attempt=0)
    model = run.model
    with torch.no_grad():
        source = "x"
        for layer, block in enumerate(model.blocks):
            sel = block.attn.select
            slot = sel.slot_names.index(f"L{layer}.a0.v")
            sel.logits[0, slot] = -10.0
            sel.logits[0, slot, sel.variable_names.index(source)] = 10.0
            source = f"L{layer}.a0"
        if setup is not None:
            setup(model)
    model.freeze()
    model.eval()
    x, y, valid, _ = run.fit_data
    refit_head(model, x, y, valid)
    return model, run


def run_source(source: str, x: np.ndarray) -> np.ndarray:
    """program.py's `program` on each row of x (n, T), exec'd from source in a fresh namespace
    (only what the source imports), its domain check off where it has one."""
    namespace: dict = {}
    exec(source, namespace)
    program = namespace["program"]
    off = {"check_domain": False} if "check_domain" in inspect.signature(program).parameters else {}
    return np.array([program(row.tolist(), **off) for row in x])


def aggregate_outputs(agg_ops: tuple[str, ...], replicas: int, seq_len: int = 7, batch: int = 5):
    """(model, z, v): a frozen one-layer model of aggregate heads with these ops (one each, all
    reading x) run on random inputs; z (R, B, A, T) what the heads wrote, v (B, T) x in model units."""
    from wtc.dt import DiscreteTransformer
    cfg = DTConfig(n_heads=0, n_agg_heads=len(agg_ops), n_mlps=1, agg_ops=agg_ops, replicas=replicas,
                   read={"L0.a*.v": ["x"]})
    model = DiscreteTransformer(cfg, seq_len=seq_len)
    model.freeze()
    x = torch.randn(batch, seq_len, 1)
    seen = {}
    with model.hooks([("blocks.0.attn.hook_z", lambda z, hook: seen.__setitem__("z", z))]):
        model(x)
    return model, seen["z"], model.normalize_inputs(x)[..., 0]


def sorted_so_far() -> wtc.Task:
    """1 while x_0 <= x_1 <= ... <= x_t (digits 0..3), declared with lambdas as a user declares a task
    (the models in tests/models/sorted_so_far* were trained on it)."""
    return wtc.Task("sorted_so_far", lambda rng, n: rng.integers(0, 4, (n, 10)),
                    lambda x: np.concatenate([np.ones((len(x), 1), int),
                                              np.minimum.accumulate(x[:, 1:] >= x[:, :-1], axis=1)], axis=1),
                    seq_len=10, any_length=True)

"""Linear probes on the Assign-and-Add residual stream: what is linearly readable, where and when.

Five probes (wtc.studies.linear_probe: logistic regression, scored on held-out rows):

  var_at_value       layer-1 residual (after its attention; there is no layer-1 MLP) at each prefix
                     value slot -> which of the 12 variables was assigned there. The authors'
                     per-checkpoint probe (bexoo/assign-and-add, progress_measures.py: the variable
                     from the number); layer 1's previous-token head is what writes it.
  value_at_side      layer-1 residual at a side that is a variable (position 13 or 14) -> the value
                     bound to it (59 classes). Low means the value is not fetched to the side: it is
                     routed to "=" by layer 2 instead.
  operand_at_equals  layer-2 residual before the MLP at "=" -> the left operand's value n.
  sum_before_mlp     the same residual -> (n + m) mod 59: not linearly readable if the MLP adds.
  sum_at_equals      layer-2 residual after the MLP at "=" -> (n + m) mod 59 (the unembedding reads it).

Rows: sequences of all four kinds with any of the 12 variables on either side (a probe reads the
representation, not the training restrictions); the training rows use training pairs, the test
rows held-out pairs (training pairs with another draw when none are held out), so a probe cannot
pass by memorising (n, m) combinations.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from wtc.studies import linear_probe
from wtc.studies.assign_add_analysis import _cache, referenced_positions, value_positions
from wtc.tasks.assign_add import ANSWER_POS, N_VARS, P, PREFIX, VAR0, resolve

L1_RESID = "blocks.0.hook_resid_post"
L2_RESID_MID = "blocks.1.hook_resid_mid"
L2_RESID_POST = "blocks.1.hook_resid_post"
PROBES = ("var_at_value", "value_at_side", "operand_at_equals", "sum_before_mlp", "sum_at_equals")
HOOKS = {"var_at_value": L1_RESID, "value_at_side": L1_RESID, "operand_at_equals": L2_RESID_MID,
         "sum_before_mlp": L2_RESID_MID, "sum_at_equals": L2_RESID_POST}


def probe_sequences(task, n_train: int = 2048, n_test: int = 1024, seed: int = 5) -> dict:
    """{"train": tokens, "test": tokens}: kinds uniform over the four, variables drawn from all 12."""
    every = np.arange(VAR0, VAR0 + N_VARS)
    rng = np.random.default_rng([seed, 61])
    test_pairs = task.heldout_pairs if len(task.heldout_pairs) else task.train_pairs
    out = {}
    for name, pairs, n in (("train", task.train_pairs, n_train), ("test", test_pairs, n_test)):
        kind = rng.integers(0, 4, n)
        tokens, _ = task.build(rng, pairs[rng.integers(0, len(pairs), n)], kind, every, every)
        out[name] = tokens
    return out


def rows(name: str, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sequence index, position, label) of every row probe `name` reads in `tokens`."""
    if name not in PROBES:
        raise KeyError(name)
    tokens = np.asarray(tokens)
    n = len(tokens)
    if name == "var_at_value":
        seq, pos = np.nonzero(value_positions(tokens))
        return seq, pos, tokens[seq, pos - 1] - VAR0
    if name == "value_at_side":
        ref = referenced_positions(tokens)
        seq, side = np.nonzero(tokens[:, PREFIX + 1:PREFIX + 3] >= VAR0)
        return seq, PREFIX + 1 + side, tokens[seq, ref[seq, side]]
    left = tokens[:, PREFIX + 1]
    left = np.where(left >= VAR0, tokens[np.arange(n), referenced_positions(tokens)[:, 0]], left)
    label = left if name == "operand_at_equals" else resolve(tokens)
    return np.arange(n), np.full(n, ANSWER_POS), label


@torch.no_grad()
def linear_probes(model, sequences: dict, probes=PROBES) -> dict:
    """Each probe's linear_probe.fit record (test / train accuracy, chance, row counts) on `model`."""
    hooks = sorted({HOOKS[p] for p in probes})
    caches = {k: _cache(model, sequences[k], hooks) for k in ("train", "test")}
    out = {}
    for name in probes:
        parts = []
        for k in ("train", "test"):
            seq, pos, label = rows(name, sequences[k])
            act = caches[k][HOOKS[name]][torch.as_tensor(seq), torch.as_tensor(pos)]     # (rows, D)
            parts += [act.double().numpy(), label]
        classes = N_VARS if name == "var_at_value" else P
        out[name] = {"hook": HOOKS[name], **linear_probe.fit(*parts, n_classes=classes)}
    return out


TIMELINE = ("var_at_value", "value_at_side")   # per checkpoint: the authors' probe and its contrast


def probe_record(path: Path, task, final, checkpoints: dict, source: str) -> dict:
    """{"final": every probe on the final model, "timeline": [{"step", TIMELINE test accuracies}]}
    over `checkpoints` ({step: a function returning the model}), kept in `path` and reused while
    the source (the run's directory), the checkpoint steps, the task split and the probes are the same."""
    key = {"source": source, "steps": sorted(checkpoints), "probes": list(PROBES), "timeline_probes": list(TIMELINE),
           "task": {"variant": task.variant, "f": task.f, "seed": task.seed}, "sequences": [2048, 1024, 5]}
    if path.exists():
        rec = json.loads(path.read_text())
        if rec.get("key") == key:
            return rec
    seqs = probe_sequences(task, *key["sequences"])
    timeline = []
    for step in key["steps"]:
        got = linear_probes(checkpoints[step](), seqs, TIMELINE)
        timeline.append({"step": step, **{k: v["test_accuracy"] for k, v in got.items()}})
    rec = {"key": key, "final": linear_probes(final, seqs), "timeline": timeline}
    path.write_text(json.dumps(rec))
    return rec


__all__ = ["PROBES", "HOOKS", "TIMELINE", "probe_sequences", "rows", "linear_probes", "probe_record"]

"""Hostile inputs to the Python API (issue 15, second probe): seeds, explain() arguments, user
callbacks; each case asserts the error type and that the message names the problem."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import wtc
from wtc import arguments
from wtc.dt.config import ConfigError
from wtc.errors import ScanError, UnknownName, WtcError
from wtc.explain.explainer import explain, sample_weights
from wtc.models import Transformer, TransformerConfig

BAD_SEEDS = [-1, 1.5, "3", True, 2**63, None]


@pytest.mark.parametrize("bad", BAD_SEEDS)
def test_seed_checks(bad):
    with pytest.raises(ValueError, match="seed must be a seed"):
        arguments.seed(bad)
    assert arguments.seed(np.int64(7)) == 7 and arguments.seed(0) == 0


@pytest.mark.parametrize("bad", [-1, 2.0, True])
def test_train_and_discover_refuse_bad_seeds_before_any_work(bad):
    for run in (lambda: wtc.train("prev2", seed=bad, progress=False), lambda: wtc.discover("prev2", seed=bad)):
        with pytest.raises(ConfigError, match="seed"):
            run()


@pytest.mark.parametrize("bad", [-3, 0.5, False])
def test_verify_refuses_bad_seeds_and_sizes(bad):
    with pytest.raises(ValueError, match="seed"):
        wtc.extraction.verify(lambda x: x[..., 0], "prev2", seed=bad)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        wtc.extraction.verify(lambda x: x[..., 0], "prev2", n=bad)


def _lm():
    cfg = TransformerConfig(n_layers=1, d_model=8, n_heads=1, d_head=8, d_mlp=8, d_vocab=256, n_ctx=16)
    return Transformer(cfg, seed=0)


TOKENS = np.random.default_rng(0).integers(0, 256, (4, 12))


@pytest.mark.parametrize("kw, err, match", [
    ({"search_tokens": TOKENS.astype(np.float32) + 0.7}, ScanError, "search_tokens must be an integer"),
    ({"slices": [TOKENS.astype(np.float64)]}, ScanError, r"slices\[0\] must be an integer"),
    ({"slices": []}, ScanError, "non-empty list"),
    ({"search_tokens": TOKENS + 300}, ScanError, "vocabulary"),
    ({"proposer": 3}, TypeError, "proposer must be None, a callable or a shell command"),
    ({"proposer": "  "}, TypeError, "proposer"),
    ({"proposer_timeout_s": float("inf")}, ValueError, "proposer_timeout_s must be a finite positive"),
    ({"proposer_timeout_s": 0}, ValueError, "proposer_timeout_s"),
    ({"threshold": float("nan")}, ValueError, "threshold must be a number in"),
    ({"max_coverage": 0}, ValueError, "max_coverage"),
    ({"beam": 0}, ValueError, "beam must be a positive integer"),
    ({"max_atoms": 10**9}, ValueError, "max_atoms must be a positive integer <= 16"),
    ({"seed": -1}, ValueError, "seed"),
    ({"sample": 0}, ValueError, "sample must be a positive integer"),
    ({"weights": [("nope", (0, 0))]}, UnknownName, "'nope' is not a parameter"),
    ({"weights": [("embed.W_E", (999, 0))]}, IndexError, "out of range for embed.W_E"),
    ({"weights": [3]}, TypeError, r"\(name, index\) pairs"),
])
def test_explain_refuses_bad_arguments(kw, err, match):
    args = {"search_tokens": TOKENS, "slices": [TOKENS], "sample": 2, "progress": False, **kw}
    with pytest.raises(err, match=match):
        explain(_lm(), args.pop("search_tokens"), args.pop("slices"), **args)


def test_sample_weights_refuses_bad_counts():
    with pytest.raises(ValueError, match="sample must be a positive integer"):
        sample_weights(_lm(), -2)


def test_argument_errors_derive_from_the_callers_type():
    with pytest.raises(ConfigError):
        arguments.positive_int(0, "steps", error=ConfigError)
    assert issubclass(ConfigError, WtcError) and issubclass(ScanError, WtcError)


def test_a_sampler_that_changes_rank_is_refused():
    from wtc.tasks import Task, TaskError

    calls = {"n": 0}

    def sample(rng, n):
        calls["n"] += 1
        x = rng.integers(0, 10, (n, 6)).astype(float)
        return x if calls["n"] % 2 else x[..., None]

    task = Task("switching", sample, lambda x: x[..., 0] if x.ndim == 3 else x, seq_len=6)
    with pytest.raises(TaskError, match="sample returned a 2-d array now but a 3-d one before|"
                                        "3-d array now but a 2-d one before"):
        for seed in range(3):
            task.batch(np.random.default_rng(seed), 4)


@pytest.mark.parametrize("config, seq_len, match", [
    ({}, 400, "GiB of attention scores.*seq_len 400"),
    ({"pad": 10**6}, 10, "pad 1000000"),
    ({"mlp_hidden": 10**6}, 10, "sub-MLP hidden units.*fewer mlp_hidden"),
    ({"batch_size": 10**7}, 10, "batch_size 10000000"),
])
def test_runs_that_cannot_fit_in_memory_are_refused_up_front(config, seq_len, match):
    from wtc.dt import DTConfig
    from wtc.tasks import Task

    task = Task("long", lambda rng, n: rng.random((n, seq_len)), lambda x: x, seq_len=seq_len, output="real")
    for run in (lambda: wtc.train(task, DTConfig(**config), progress=False),
                lambda: wtc.discover(task, config=DTConfig(**config), progress=False)):
        with pytest.raises(ConfigError, match=match):
            run()
    DTConfig().check_size(100)                        # what the built-in sizes need is accepted


@pytest.mark.parametrize("program, match", [(lambda x: 1 / 0, "raised ZeroDivisionError"),
                                            (lambda x: "a", "returned str, not numbers")])
def test_verify_names_a_program_that_fails(program, match):
    from wtc.extraction.verification import VerificationError

    with pytest.raises(VerificationError, match=match):
        wtc.extraction.verify(program, "prev2", n=10)


def test_hooks_must_be_callables_that_keep_the_shape():
    from wtc.errors import HookError, HookTypeError

    model, tokens = _lm(), torch.randint(0, 256, (2, 6))
    with pytest.raises(HookTypeError, match="must be callable"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", 3)])
    with pytest.raises(HookError, match=r"returned \(2, 2, 8\) torch.float32; a hook returns None or a tensor of the shape"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x[:, :2])])
    with pytest.raises(HookError, match="returned str"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: "no")])
    same = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x * 1.0)])
    torch.testing.assert_close(same, model(tokens))


@pytest.mark.parametrize("tokens, match", [(torch.zeros(2, 6), "integer tensor"), (-torch.ones(1, 4, dtype=torch.long),
                                           r"must lie in \[0, 256\)"), (torch.zeros(1, 40, dtype=torch.long), "n_ctx")])
def test_transformer_inputs_are_model_input_errors(tokens, match):
    from wtc.errors import ModelInputError

    with pytest.raises(ModelInputError, match=match):
        _lm()(tokens)


def _ace_case():
    from wtc.ace import extract_core

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=5, n_ctx=6))
    x = torch.randint(0, 5, (64, 6))
    readout = lambda o: o[:, -1, :2]                                  # noqa: E731
    core = extract_core(model, x, "blocks.0.hook_resid_post", readout=readout)
    labels = readout(model(x)).argmax(-1)
    return model, x, readout, core, labels


def test_ace_labels_must_have_the_predictions_shape():
    """(B, 1) labels broadcast against (B,) predictions gave accuracies of 41."""
    from wtc.ace import patched_accuracy, validate
    from wtc.errors import AceError

    model, x, readout, core, labels = _ace_case()
    with pytest.raises(AceError, match=r"labels of shape \(64, 1\) do not match"):
        validate(core, model, x, labels[:, None], readout=readout)
    with pytest.raises(AceError, match="not a class of the readout's 2 outputs"):
        patched_accuracy(model, x, labels + 5, core, "clean", readout=readout)
    assert patched_accuracy(model, x, labels, core, "clean", readout=readout) == 1.0


@pytest.mark.parametrize("rank", [-1, 100, 1.5, True])
def test_ace_ranks_out_of_range_are_refused(rank):
    from wtc.ace import keep_kl, patched
    from wtc.errors import AceError

    model, x, readout, core, _ = _ace_case()
    with pytest.raises(AceError, match="rank must be an integer in"):
        with patched(model, core, "keep", rank=rank):
            model(x)
    with pytest.raises(AceError, match="rank must be an integer in"):
        keep_kl(model, x, core, rank, readout=readout)


@pytest.mark.parametrize("fn, match", [(lambda t, m: 3, "returned int"), (lambda t, m: t[:1], r"returned \(1, "),
                                       (lambda t, m: t.double(), "torch.float64")])
def test_hook_modules_checks_what_hooks_return(fn, match):
    from wtc.errors import HookError
    from wtc.hooks import hook_modules

    model, tokens = _lm(), torch.randint(0, 256, (2, 6))
    with pytest.raises(HookError, match=match):
        with hook_modules(model, [("blocks.0.mlp", fn)]):
            model(tokens)


@pytest.mark.parametrize("hooks, match", [(None, "list of"), (["blocks.0.mlp"], r"\(path, fn\) pairs"),
                                          ([("blocks.0.mlp", 3)], "must be callable")])
def test_hook_modules_refuses_bad_hook_lists_before_attaching(hooks, match):
    from wtc.errors import HookTypeError
    from wtc.hooks import hook_modules

    with pytest.raises(HookTypeError, match=match):
        with hook_modules(_lm(), hooks):
            pass


def test_a_checkpoint_with_its_digests_stripped_is_refused(tmp_path):
    import json

    from wtc.errors import CheckpointError
    from wtc.models.io import load, save

    d = save(_lm(), tmp_path / "m")
    meta = json.loads((d / "model.json").read_text())
    for key in ("_sha256", "_meta_sha256"):
        stripped = {k: v for k, v in meta.items() if k != key}
        (d / "model.json").write_text(json.dumps(stripped))
        with pytest.raises(CheckpointError, match="no sha256 digests"):
            load(d)


@pytest.mark.parametrize("position", [10, -7, torch.full((64,), 9), torch.full((64,), -7)])
def test_ace_positions_outside_the_sequence_are_named(position):
    from wtc.ace import extract_core
    from wtc.errors import AceError

    model, x, _, _, _ = _ace_case()
    with pytest.raises(AceError, match="outside the layer output's 6 positions"):
        extract_core(model, x, "blocks.0.hook_resid_post", readout=lambda o: o[:, -1, :2], position=position)


def test_small_argument_errors_are_wtc_errors(tmp_path):
    from wtc.errors import ArgumentError, CheckpointError, WtcError
    from wtc.extraction.reader import ExtractionInputError

    with pytest.raises(ArgumentError, match="n must be a positive integer"):
        wtc.extraction.verify(lambda x: x[..., 0], "prev2", n=0)
    for bad in (5, None):
        with pytest.raises(CheckpointError, match="a checkpoint is a directory path"):
            wtc.load(bad)
    assert issubclass(ArgumentError, WtcError) and issubclass(ExtractionInputError, WtcError)
    from wtc.tasks import Task, TaskError
    with pytest.raises(TaskError, match="not a numeric array"):
        Task.from_arrays([[1, 2], [1]], [[1, 2], [1]])


def test_sr_refuses_an_empty_operator_list():
    from wtc.errors import SRError

    X = np.random.default_rng(0).uniform(size=(50, 2))
    with pytest.raises(SRError, match="operators is an empty list"):
        wtc.sr.fit(X, X[:, 0] * X[:, 1], operators=[])


@pytest.mark.parametrize("readout, kw, match", [
    (lambda o: 1 / 0, {}, "the readout raised ZeroDivisionError"),
    (lambda o: o[:, -1, :2].detach(), {}, "does not depend on"),
    (lambda o: o[:, -1, :2] * float("nan"), {}, "NaN or inf"),
    (lambda o: o[:, -1, :2].long(), {}, "floating-point tensor"),
    (lambda o: o[:, -1, :2], {"energy": "0.9"}, "energy must be a number"),
])
def test_ace_readouts_that_cannot_work_are_named(readout, kw, match):
    from wtc.ace import extract_core
    from wtc.errors import AceError

    model, x, _, _, _ = _ace_case()
    with pytest.raises(AceError, match=match):
        extract_core(model, x, "blocks.0.hook_resid_post", readout=readout, **kw)


def test_a_scan_readout_that_raises_is_named():
    from wtc.scan import scan

    with pytest.raises(ScanError, match="the readout raised KeyError"):
        scan(_lm(), torch.randint(0, 256, (2, 6)), params="blocks.0.mlp.W_in", readout=lambda o: {}["x"],
             progress=False)

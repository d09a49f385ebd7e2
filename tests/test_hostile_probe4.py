"""Hostile-input probe 4: the cases it found, as regression tests. Each asserts the error type (a
WtcError, or the right answer where the input is legitimate) and that the message names the problem."""
import os

import numpy as np
import pytest
import torch

import wtc
from wtc.errors import (AceError, ArgumentError, CheckpointError, IndexOutOfRange, ModelConfigError,
                        ModelInputError, ScanError, TaskError, TrainConfigError, TrainingError, UnknownName, WtcError)
from wtc.models.transformer import Transformer, TransformerConfig


def _cfg(**kw):
    return TransformerConfig(**{**dict(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=5, n_ctx=6), **kw})


TOKENS = torch.tensor([[1, 2, 3, 4], [0, 1, 2, 3]])
W_OUT = "blocks.0.mlp.W_out"


# ----------------------------------------------------------------------------------- models
@pytest.mark.parametrize("kw, match", [
    ({"d_mlp": True}, "d_mlp must be None or a positive int"),
    ({"mlp_layers": "0"}, "mlp_layers must be None or a list"),
    ({"mlp_layers": 5}, "mlp_layers must be None or a list"),
    ({"mlp_layers": [0.0]}, "mlp_layers must hold block indices"),
    ({"mlp_layers": [0, 0]}, "names a block twice"),
])
def test_transformer_config_refuses_odd_fields(kw, match):
    with pytest.raises(ModelConfigError, match=match):
        _cfg(**kw)


def test_transformer_config_takes_numpy_integers_as_ints():
    cfg = _cfg(n_layers=np.int64(1), d_mlp=np.int64(16), mlp_layers=(np.int64(0),))
    assert type(cfg.n_layers) is int and type(cfg.d_mlp) is int and cfg.mlp_layers == (0,)


@pytest.mark.parametrize("tokens", [[[1, 2], [3]], np.array([[1, 2]], dtype=object), "hello", None])
def test_forward_names_tokens_that_are_not_an_integer_array(tokens):
    with pytest.raises(ModelInputError, match="tokens must be an integer tensor"):
        Transformer(_cfg(), seed=0)(tokens)


def test_forward_takes_unsigned_tokens_and_names_ids_past_int64():
    m = Transformer(_cfg(), seed=0)
    for dtype in (torch.uint16, torch.uint32, torch.uint64):
        torch.testing.assert_close(m(TOKENS.to(dtype)), m(TOKENS))
    with pytest.raises(ModelInputError, match="token ids must lie in"):
        m(np.array([[2**63 + 5]], dtype=np.uint64))
    with pytest.raises(ModelInputError, match="token ids must lie in"):
        m(torch.tensor([[2**63 + 5]], dtype=torch.uint64))


def test_logits_at_names_bad_positions():
    m = Transformer(_cfg(), seed=0)
    with pytest.raises(ModelInputError, match="must be a slice"):
        m.logits_at(TOKENS, 1)
    with pytest.raises(TypeError):                 # also a TypeError, as before
        m.logits_at(TOKENS, 1)
    with pytest.raises(ModelInputError, match="positive step"):
        m.logits_at(TOKENS, slice(None, None, -1))


def test_saving_a_model_with_non_finite_weights_is_refused(tmp_path):
    from wtc.models import io
    m = Transformer(_cfg(), seed=0)
    with torch.no_grad():
        m.embed.W_E[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"non-finite weights .*embed.W_E"):
        io.save(m, tmp_path / "m")
    assert not (tmp_path / "m").exists()


# ----------------------------------------------------------------------------------- scans
def test_scan_of_a_bfloat16_model_runs():
    from wtc.scan import scan
    m = Transformer(_cfg(), seed=0).to(torch.bfloat16)
    r = scan(m, TOKENS, W_OUT, progress=False)
    assert torch.isfinite(r.total_kl[W_OUT]).all() and float(r.total_kl[W_OUT].sum()) > 0


def test_scan_refuses_a_positions_mask_selecting_nothing():
    from wtc.scan import scan
    with pytest.raises(ScanError, match="positions selects no position"):
        scan(Transformer(_cfg(), seed=0), TOKENS, W_OUT, progress=False, positions=torch.zeros(2, 4, dtype=torch.bool))


def test_scan_takes_a_numpy_float_mass():
    from wtc.scan import scan
    m = Transformer(_cfg(), seed=0)
    a = scan(m, TOKENS, W_OUT, progress=False, mass=np.float32(0.5))
    b = scan(m, TOKENS, W_OUT, progress=False, mass=0.5)
    torch.testing.assert_close(a.total_kl[W_OUT], b.total_kl[W_OUT], rtol=0, atol=0)


def test_a_fingerprint_of_float32_weights_is_unchanged():
    """Stores written before bfloat16 support must still resume: the bytes hashed are numpy's."""
    from wtc.scan.inputs import tensor_bytes
    t = torch.randn(3, 4)
    assert tensor_bytes(t) == t.numpy().tobytes()
    assert tensor_bytes(t.T) == t.T.contiguous().numpy().tobytes()
    assert tensor_bytes(torch.zeros(0)) == b""


# ----------------------------------------------------------------------------------- ACE
@pytest.fixture(scope="module")
def ace_setup():
    from wtc.ace import extract_core
    m = Transformer(_cfg(), seed=0)
    X = torch.randint(0, 5, (64, 4), generator=torch.Generator().manual_seed(0))
    core = extract_core(m, X, "blocks.0.hook_resid_post")
    return m, X, core, m(X)[:, -1].argmax(-1)


def test_ace_takes_numpy_scalars_for_its_options(ace_setup):
    from wtc.ace import extract_core, validate
    m, X, core, labels = ace_setup
    c = extract_core(m, X, "blocks.0.hook_resid_post", energy=np.float32(0.99), rank=np.int64(core.rank),
                     position=np.int64(-1), chunk=np.int64(16))
    assert c.rank == core.rank
    torch.testing.assert_close(c.basis, core.basis)
    assert validate(core, m, X, labels, tolerance=np.float32(0.005)) == validate(core, m, X, labels)


def test_ace_names_ragged_labels_and_non_cores(ace_setup):
    from wtc.ace import validate
    from wtc.ace.core import keep_kl, patched_accuracy
    m, X, core, labels = ace_setup
    with pytest.raises(AceError, match="labels must be an integer array"):
        validate(core, m, X, [[1], [2, 3]])
    for call in (lambda: validate("core", m, X, labels), lambda: patched_accuracy(m, X, labels, "core", "keep"),
                 lambda: keep_kl(m, X, "core", 1)):
        with pytest.raises(AceError, match="core must be a Core"):
            call()
    with pytest.raises(AceError, match="inputs are empty"):
        keep_kl(m, X[:0], core, 1)


def test_ace_refuses_complex_values_instead_of_dropping_their_imaginary_part(ace_setup):
    from wtc.ace import compare
    from wtc.ace.compare import cca, principal_angles
    from wtc.ace.gramians import GramianAccumulator
    _, _, core, _ = ace_setup
    z = torch.randn(20, 3, dtype=torch.cfloat)
    with pytest.raises(AceError, match="complex"):
        cca(z, torch.randn(20, 3))
    with pytest.raises(AceError, match="complex"):
        principal_angles(torch.eye(4, dtype=torch.cfloat)[:, :2], torch.eye(4)[:, :2])
    with pytest.raises(AceError, match="complex"):
        core.project(torch.randn(3, 8, dtype=torch.cfloat))
    with pytest.raises(AceError, match="complex"):
        compare([core, core], activations=[torch.randn(20, 8, dtype=torch.cfloat), torch.randn(20, 8)])
    with pytest.raises(AceError, match="complex"):
        GramianAccumulator(3).add(torch.randn(4, 3, dtype=torch.cfloat), torch.randn(4, 2, 3))


def test_gramians_and_balanced_svd_name_nan_and_empty_input():
    from wtc.ace.balanced import balanced_svd
    from wtc.ace.gramians import GramianAccumulator
    acc = GramianAccumulator(3)
    with pytest.raises(AceError, match="NaN"):
        acc.add(torch.full((4, 3), float("nan")), torch.randn(4, 2, 3))
    assert acc.n == 0
    with pytest.raises(ValueError):            # also a ValueError, as documented
        acc.add(torch.full((4, 3), float("nan")), torch.randn(4, 2, 3))
    with pytest.raises(AceError, match="empty"):
        balanced_svd(torch.zeros(0, 0), torch.zeros(0, 0))
    with pytest.raises(AceError, match="dim must be a positive int"):
        GramianAccumulator(True)


# ----------------------------------------------------------------------------------- explain
def _byte_model():
    return Transformer(_cfg(d_vocab=256, n_ctx=8), seed=0)


def test_conditional_kl_refuses_float_and_ragged_tokens_instead_of_truncating():
    from wtc.explain.conditional import conditional_kl
    m = _byte_model()
    tok = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(3, 8, dtype=torch.bool)
    mask[:, 3] = True
    with pytest.raises(ArgumentError, match="integer"):
        conditional_kl(m, tok.float() + 0.7, W_OUT, (0, 0), mask)
    with pytest.raises(ArgumentError, match="integer array"):
        conditional_kl(m, [[1, 2], [3]], W_OUT, (0, 0), mask)
    with pytest.raises(ArgumentError, match=r"clean_logp must be .* \(B, T, V\)"):
        conditional_kl(m, tok, W_OUT, (0, 0), mask, clean_logp=torch.zeros(3, 8, 5))
    # a numpy mask is one mask, as a tensor is
    assert float(conditional_kl(m, tok, W_OUT, (1, 2), mask.numpy())) == float(conditional_kl(m, tok, W_OUT, (1, 2), mask))


def test_explain_argument_errors_are_wtc_errors():
    from wtc.explain import explain
    from wtc.explain.explainer import sample_weights
    m = _byte_model()
    tok = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(UnknownName, match=r"not weight matrices of this model: \['zzz'\]"):
        sample_weights(m, 3, params="zzz")
    with pytest.raises(KeyError):
        sample_weights(m, 3, params=["zzz"])
    assert {n for n, _ in sample_weights(m, 3, params=W_OUT)} == {W_OUT}
    with pytest.raises(WtcError, match="proposer must be None"):
        explain(m, tok, [tok], sample=1, proposer=5, progress=False)
    with pytest.raises(IndexOutOfRange, match="out of range"):
        explain(m, tok, [tok], weights=[(W_OUT, (99, 0))], progress=False)
    with pytest.raises(IndexOutOfRange, match="one entry per dimension"):
        explain(m, tok, [tok], weights=[(W_OUT, 3)], progress=False)
    with pytest.raises(WtcError, match=r"\(name, index\) pairs"):
        explain(m, tok, [tok], weights=[3], progress=False)


# ----------------------------------------------------------------------------------- tasks
def _task(sample=lambda r, n: r.integers(0, 2, (n, 4)), target=lambda x: x, **kw):
    return wtc.Task(kw.pop("name", "t"), sample, target, **{"seq_len": 4, **kw})


@pytest.mark.parametrize("target, output", [(lambda x: x.cumsum(0), "integer"),
                                            (lambda x: x - x.mean(0), "real")])
def test_a_target_computed_across_the_batch_is_refused(target, output):
    with pytest.raises(TaskError, match="depends on the other sequences in the batch"):
        _task(target=target, output=output).fingerprint()


def test_a_sampler_ignoring_its_rng_is_refused():
    with pytest.raises(TaskError, match="must draw from the rng it is given"):
        _task(sample=lambda r, n: np.random.randint(0, 2, (n, 4))).fingerprint()


def test_builtin_and_data_tasks_still_fingerprint():
    for name in ("parity_last2", "running_mean", "select_by_flag"):
        assert len(wtc.tasks.get(name).fingerprint()) == 64
    x = np.random.default_rng(0).integers(0, 3, (100, 5))
    assert len(wtc.Task.from_arrays(x, np.roll(x, 1, 1)).fingerprint()) == 64


def test_a_ragged_sample_is_a_task_error():
    with pytest.raises(TaskError, match="sample is not a numeric array"):
        _task(sample=lambda r, n: [[1, 2], [3]]).batch(0, 2)


def test_bfloat16_tensors_and_numpy_float_shares_are_taken():
    t = _task(sample=lambda r, n: torch.rand(n, 4, dtype=torch.bfloat16), target=lambda x: x * 2, output="real")
    x, y = t.batch(0, 3)
    np.testing.assert_array_equal(y[..., 0], 2 * x[..., 0])
    rec = np.random.default_rng(0).integers(0, 3, (100, 5))
    a = wtc.Task.from_arrays(torch.tensor(rec).bfloat16(), torch.tensor(np.roll(rec, 1, 1)).bfloat16())
    b = wtc.Task.from_arrays(rec, np.roll(rec, 1, 1), heldout=np.float32(0.25))
    assert a.size == wtc.Task.from_arrays(rec, np.roll(rec, 1, 1)).size and b.heldout.size > 0


# ----------------------------------------------------------------------------------- training
def _trainer(loss=None, **kw):
    import torch.nn.functional as F
    from wtc.models.training import TrainConfig, Trainer
    m = Transformer(_cfg(), seed=0)

    def batch(step):
        return torch.randint(0, 5, (4, 6), generator=torch.Generator().manual_seed(step))

    loss = loss or (lambda b: F.cross_entropy(m(b)[:, :-1].reshape(-1, 5), b[:, 1:].reshape(-1)))
    return Trainer(m, kw.pop("cfg", TrainConfig(steps=2)), batch, loss, progress=False, **kw)


def test_trainer_refuses_a_complex_loss_and_absurd_thread_counts():
    with pytest.raises(TrainingError, match="loss_fn must return a scalar tensor"):
        _trainer(loss=lambda b: torch.tensor(1 + 1j, requires_grad=True)).run()
    with pytest.raises(TrainConfigError, match="threads must be a positive integer <= 4096"):
        _trainer(threads=10**6)


def test_train_config_takes_numpy_floats_as_floats():
    from wtc.models.training import TrainConfig
    cfg = TrainConfig(steps=2, lr=np.float32(1e-3), weight_decay=np.float32(0))
    assert type(cfg.lr) is float and type(cfg.weight_decay) is float
    assert _trainer(cfg=cfg).run().finished


def test_a_checkpoint_path_under_a_broken_link_or_a_file_is_refused_up_front(tmp_path):
    os.symlink(tmp_path / "missing", tmp_path / "broken")
    with pytest.raises(TrainConfigError, match="broken symbolic link"):
        _trainer(path=tmp_path / "broken" / "state")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainConfigError, match="not a directory"):
        _trainer(path=tmp_path / "file" / "sub" / "state")


def test_write_atomic_names_a_parent_it_cannot_create(tmp_path):
    from wtc.checkpoint_io import write_atomic
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot be made a directory"):
        write_atomic(tmp_path / "file" / "state", {"a": torch.zeros(2)}, {})


# ----------------------------------------------------------------------------------- studies
@pytest.mark.parametrize("kw, match", [
    ({"lr": float("inf")}, "lr must be a finite number"),
    ({"lr": "1e-3"}, "lr must be a finite number"),
    ({"weight_decay": float("inf")}, "weight_decay must be a finite number"),
    ({"phase_jump": "x"}, "phase_jump must be a finite number"),
    ({"scan_sequences": -1}, "scan_sequences must be an int >= 0"),
    ({"scan_attention_sample": 2.5}, "scan_attention_sample must be an int >= 0"),
    ({"sweep_steps": True}, "sweep_steps must be an int >= 0"),
    ({"seed": -1}, "seed must be a seed"),
    ({"union_seed": 2.5}, "union_seed must be a seed"),
    ({"model_init": "tl"}, "model_init must be one of authors, wtc-v1"),
])
def test_assign_add_study_config_names_bad_fields(kw, match):
    from wtc.errors import StudyError
    from wtc.studies.assign_add import AssignAddStudy
    with pytest.raises(StudyError, match=match):
        AssignAddStudy(**kw)


@pytest.mark.parametrize("kw, match", [
    ({"lr": float("nan")}, "lr must be a finite number"),
    ({"lr": -1.0}, "lr must be > 0"),
    ({"lr": "1e-3"}, "lr must be a finite number"),
    ({"density": "0.1"}, "density must be a finite number"),
    ({"abstopk": -1.0}, "abstopk must be None or a fraction"),
    ({"abstopk": float("inf")}, "abstopk must be a finite number"),
    ({"seed": True}, "seed must be a seed"),
    ({"max_bytes": 0}, "max_bytes must be None or a positive int"),
])
def test_sparse_dense_study_config_names_bad_fields(kw, match):
    from wtc.errors import StudyError
    from wtc.studies.sparse_dense import SparseDenseStudy
    with pytest.raises(StudyError, match=match):
        SparseDenseStudy(**kw)


def test_study_configs_still_take_their_defaults_and_quick():
    from wtc.studies.assign_add import AssignAddStudy
    from wtc.studies.sparse_dense import SparseDenseStudy
    for cls in (AssignAddStudy, SparseDenseStudy):
        assert cls() == cls() and cls.quick() == cls.quick()
    assert SparseDenseStudy(abstopk=None).abstopk is None


# ----------------------------------------------------------------------------------- sparse training
def test_sparse_helpers_name_bad_arguments():
    from wtc.models import sparse as sp
    w = torch.randn(4, 8)
    for kw, match in [({"density": float("nan")}, "density must be a finite number"),
                      ({"density": 0.5, "axis": 5}, r"axis must be an int in \[-2, 2\)"),
                      ({"density": 0.5, "min_per_unit": -1}, "min_per_unit must be a non-negative int")]:
        with pytest.raises(ArgumentError, match=match):
            sp.topk_mask(w, **kw)
    with pytest.raises(ArgumentError, match="NaN or inf"):
        sp.topk_mask(torch.full((4, 8), float("nan")), 0.5)
    assert sp.topk_mask(w, 0).sum() == 4 * 4 and sp.topk_mask(w, 2) is None     # as before
    with pytest.raises(ArgumentError, match="density must be a number in"):
        sp.project_topk(Transformer(_cfg(), seed=0), 0)
    with pytest.raises(WtcError, match="model must be a torch.nn.Module"):
        sp.project_topk("model", 0.5)


def test_sparse_windows_refuse_float_short_and_empty_tokens():
    from wtc.models import sparse as sp
    with pytest.raises(ModelInputError, match="1-D integer array"):
        sp.batch_windows(np.arange(100) * 0.5, 4, 2, 0, 0)          # was truncated to integers
    with pytest.raises(ModelInputError, match="a window needs ctx"):
        sp.batch_windows(np.arange(10) % 5, 20, 2, 0, 0)
    with pytest.raises(ArgumentError, match="n must be a positive integer"):
        sp.eval_windows(np.arange(100) % 5, 4, 0)
    with pytest.raises(ModelInputError, match="non-empty"):
        sp.lm_loss(Transformer(_cfg(), seed=0), torch.zeros(0, 6, dtype=torch.long))
    x, y = sp.batch_windows(np.arange(100) % 5, 4, 2, 0, 0)
    assert x.shape == y.shape == (2, 4) and torch.equal(x[:, 1:], y[:, :-1])


# ----------------------------------------------------------------------------------- fisher
def test_fisher_estimate_checks_samples_and_the_readout():
    from wtc.scan import fisher_estimate
    m = Transformer(_cfg(), seed=0)
    with pytest.raises(ScanError, match=r"samples must be a positive integer <= 100000"):
        fisher_estimate(m, TOKENS, W_OUT, samples=10**9)                 # ran (practically) for ever
    with pytest.raises(ScanError, match="the readout raised ZeroDivisionError"):
        fisher_estimate(m, TOKENS, W_OUT, readout=lambda o: 1 / 0)
    with pytest.raises(ScanError, match="floating-point tensor"):
        fisher_estimate(m, TOKENS, W_OUT, readout=lambda o: o.argmax(-1))
    with pytest.raises(ScanError, match="NaN or inf"):
        fisher_estimate(m, TOKENS, W_OUT, readout=lambda o: o * float("nan"))
    with pytest.raises(ScanError, match="readout must be a callable"):
        fisher_estimate(m, TOKENS, W_OUT, readout=3)
    a = fisher_estimate(m, TOKENS, W_OUT, samples=2)[W_OUT]
    b = fisher_estimate(m, TOKENS, W_OUT, samples=2, readout=lambda o: o)[W_OUT]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.isfinite(a).all() and float(a.sum()) > 0


# ----------------------------------------------------------------------------------- hooks, and plain errors now wtc errors
def test_a_hook_returning_a_tensor_on_another_device_is_named():
    from wtc.errors import HookError
    m = Transformer(_cfg(), seed=0)
    with pytest.raises(HookError, match="returned a tensor on meta"):
        m.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", lambda v, h: torch.empty_like(v, device="meta"))])
    assert not m.hook_embed.has_hooks


def test_argument_errors_of_helpers_are_wtc_errors_and_keep_their_builtin_type():
    from wtc.explain import predicate_search, sandbox
    from wtc.explain.predicates import check_tokens
    from wtc.scan.kl import kl_rows
    from wtc.tasks.assign_add import AssignAdd
    tok = np.zeros((2, 4), dtype=np.int64)
    cases = [
        (lambda: sandbox.evaluate(5, [["a"]]), TypeError, "predicate source must be a str"),
        (lambda: check_tokens(np.full((2, 4), 300)), ValueError, "byte values 0..255"),
        (lambda: predicate_search.search(tok, np.zeros((2, 4))), ValueError, "kl sums to 0"),
        (lambda: predicate_search.search(tok, np.zeros((3, 4))), ValueError, "kl must have the shape"),
        (lambda: kl_rows(torch.full((2, 3), float("nan")).double(), torch.zeros(1, 2, 3)), ValueError, "non-finite"),
        (lambda: AssignAdd(f=2.0), ValueError, "AssignAdd.f"),
    ]
    for call, builtin, match in cases:
        with pytest.raises(WtcError, match=match):
            call()
        with pytest.raises(builtin):
            call()


def test_corpus_manifest_that_is_not_an_object_and_negative_slice_seeds_are_named(tmp_path):
    from wtc.explain.corpus import Corpus, CorpusError, slice_starts
    (tmp_path / "m.json").write_text("[]")
    with pytest.raises(CorpusError, match="a corpus manifest is a JSON object, got list"):
        Corpus.from_manifest(tmp_path / "m.json")
    with pytest.raises(CorpusError, match="seed must be a non-negative integer, got -1"):
        slice_starts(1000, 10, 2, 2, seed=-1)
    assert slice_starts(1000, 10, 2, 2, seed=np.int64(3)).shape == (2, 2)


def test_from_tl_state_dict_names_what_does_not_fit():
    from wtc.models.tl import from_tl_state_dict, to_tl_state_dict
    m = Transformer(_cfg(), seed=0)
    sd = to_tl_state_dict(m)
    torch.testing.assert_close(from_tl_state_dict(sd, _cfg())(TOKENS), m(TOKENS), rtol=0, atol=0)
    cases = [({**sd, "embed.W_E": torch.zeros(6, 8)}, "does not fit this TransformerConfig"),
             ({**sd, "embed.W_E": torch.full((5, 8), float("nan"))}, r"non-finite values .*embed.W_E"),
             ({k: v.long() for k, v in sd.items()}, "real floating-point tensors"),
             ({**sd, "embed.W_E": sd["embed.W_E"].to(torch.cfloat)}, "real floating-point tensors"),
             ({**sd, "embed.W_E": sd["embed.W_E"].double()}, "mix dtypes"),
             ({k: v.numpy() for k, v in sd.items()}, "values must be tensors"),
             ([1, 2], "state must be a state dict")]
    for state, match in cases:
        with pytest.raises(ModelConfigError, match=match):
            from_tl_state_dict(state, _cfg())


def test_scan_store_names_bad_paths_and_identities(tmp_path):
    from wtc.scan.store import ScanStore
    with pytest.raises(ScanError, match="non-empty str or Path, got 5"):
        ScanStore(5)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ScanError, match="cannot create its directory"):
        ScanStore(tmp_path / "file" / "scan.sqlite")
    with pytest.raises(ScanError, match="identity must be JSON data"):
        ScanStore(tmp_path / "ok.sqlite").bind({"a": object()})


def test_markov_source_names_bad_arguments_before_allocating():
    from wtc.models.lm import MarkovSource
    for args, kw, match in [((4.5, 8), {}, "vocab must be an int"), ((4, True), {}, "seq_len must be an int"),
                            ((4, 8), {"seed": -1}, "seed must be a seed"),
                            ((10**9, 8), {}, "vocab must be at most 16384")]:
        with pytest.raises(ArgumentError, match=match):
            MarkovSource(*args, **kw)
    src = MarkovSource(np.int64(4), 8, seed=np.int64(1))
    assert src.sample(np.random.default_rng(0), 3).shape == (3, 8)


def test_study_configs_take_numpy_scalars_as_python_numbers():
    import json
    from dataclasses import asdict
    from wtc.studies.assign_add import AssignAddStudy
    from wtc.studies.sparse_dense import SparseDenseStudy
    a = AssignAddStudy(lr=np.float32(0.001), scan_sequences=np.int64(64), seed=np.int64(3))
    s = SparseDenseStudy(lr=np.float32(0.003), density=np.float64(0.02), abstopk=np.float32(0.25), seed=np.int64(1))
    assert type(a.lr) is float and type(a.scan_sequences) is int and type(a.seed) is int
    assert type(s.lr) is float and type(s.abstopk) is float and type(s.seed) is int
    json.dumps(asdict(a)), json.dumps(asdict(s))          # config.json can be written


_WRITER = """
import sys, torch
from wtc.checkpoint_io import write_atomic, read
stem, me = sys.argv[1], int(sys.argv[2])
bad = 0
for i in range(60):
    write_atomic(stem, {"a": torch.full((2000,), float(me * 1000 + i))}, {"who": me, "i": i})
    t, meta = read(stem)
    bad += float(t["a"][0]) != meta["who"] * 1000 + meta["i"]
print("mismatches", bad)
"""


@pytest.mark.skipif(os.name != "posix", reason="the pair lock uses fcntl")
def test_two_processes_saving_into_one_checkpoint_stem_do_not_collide(tmp_path):
    """Two runs into one directory interleaved the renames of their temporary files: raw
    FileNotFoundErrors in write_atomic and read, readers meeting a half-written .json.tmp."""
    import subprocess
    import sys
    stem = str(tmp_path / "state")
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, stem, str(k)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in (1, 2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "mismatches 0" in out
    from wtc.checkpoint_io import read
    t, meta = read(stem)
    assert float(t["a"][0]) == meta["who"] * 1000 + meta["i"]


def test_reading_a_missing_checkpoint_leaves_no_lock_file(tmp_path):
    from wtc.checkpoint_io import read
    with pytest.raises(CheckpointError, match="missing"):
        read(tmp_path / "nothing")
    assert list(tmp_path.iterdir()) == []


def _interrupted_scan(model, out, after=2):
    """A scan into `out` stopped (KeyboardInterrupt) after `after` chunks."""
    import wtc.scan.engine as engine
    from wtc.scan import scan
    orig, calls = engine._chunk, {"n": 0}

    def chunk(*a, **k):
        calls["n"] += 1
        if calls["n"] > after:
            raise KeyboardInterrupt
        return orig(*a, **k)
    engine._chunk = chunk
    try:
        scan(model, TOKENS_8, W_OUT, out=out, chunk=64, progress=False)
    except KeyboardInterrupt:
        pass
    finally:
        engine._chunk = orig


TOKENS_8 = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(0))


def _model_8():
    return Transformer(_cfg(d_model=16, d_head=8, d_mlp=32, d_vocab=11, n_ctx=8), seed=0)


def test_a_scan_resumed_with_other_hooks_is_refused(tmp_path):
    """A hook changes the function scanned: resuming without it mixed two functions' KLs (up to 40%
    off on the chunks done before the interruption)."""
    from wtc.scan import scan
    m = _model_8()
    m.add_hook("blocks.0.hook_attn_out", lambda v, hook: v * 0)
    _interrupted_scan(m, tmp_path / "s")
    m.reset_hooks()
    with pytest.raises(ScanError, match="different hooks"):
        scan(m, TOKENS_8, W_OUT, out=tmp_path / "s", chunk=64, progress=False)
    # with the same hook it resumes, and gives what an uninterrupted hooked scan gives
    m.add_hook("blocks.0.hook_attn_out", lambda v, hook: v * 0)
    resumed = scan(m, TOKENS_8, W_OUT, out=tmp_path / "s", chunk=64, progress=False).total_kl[W_OUT]
    fresh = scan(m, TOKENS_8, W_OUT, chunk=64, progress=False).total_kl[W_OUT]
    torch.testing.assert_close(resumed, fresh, rtol=0, atol=1e-12)


def test_a_store_written_before_hooks_were_recorded_still_resumes(tmp_path):
    from wtc.scan import scan
    from wtc.scan.store import ScanStore
    m = _model_8()
    _interrupted_scan(m, tmp_path / "s")
    store = ScanStore(tmp_path / "s" / "scan.sqlite")
    with store.db:
        store.db.execute("DELETE FROM meta WHERE key = 'hooks'")    # as an older wtc wrote it
    store.close()
    resumed = scan(m, TOKENS_8, W_OUT, out=tmp_path / "s", chunk=64, progress=False).total_kl[W_OUT]
    torch.testing.assert_close(resumed, scan(m, TOKENS_8, W_OUT, chunk=64, progress=False).total_kl[W_OUT],
                               rtol=0, atol=1e-12)


def test_study_helpers_raise_study_errors_that_stay_value_errors():
    from wtc.errors import StudyError
    from wtc.studies.sparse_dense_controls import shuffle_within_blocks
    from wtc.studies.sparse_dense_defs import wilson
    for call, match in [(lambda: shuffle_within_blocks(np.zeros((2, 2), dtype=np.int64), 4, 0), "must be 1-D"),
                        (lambda: shuffle_within_blocks(np.zeros(8, dtype=np.int64), 1, 0), "block must be an int >= 2"),
                        (lambda: wilson(5, 3), "need 0 <= k <= n")]:
        with pytest.raises(StudyError, match=match):
            call()
        with pytest.raises(ValueError):
            call()


def test_ace_runs_a_model_left_in_train_mode_in_eval_mode_and_restores_it():
    """With dropout active, extract_core found a core of another rank and validate a baseline of 0.81
    for a model whose eval accuracy is 1.0."""
    import torch.nn as nn
    from wtc.ace import extract_core, validate

    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.d, self.l, self.o = nn.Embedding(7, 16), nn.Dropout(0.5), nn.Linear(16, 16), nn.Linear(16, 5)

        def forward(self, t):
            return self.o(torch.relu(self.l(self.d(self.e(t)))))

    torch.manual_seed(0)
    m = Drop()
    X = torch.randint(0, 7, (64, 4), generator=torch.Generator().manual_seed(0))
    m.eval()
    ref = extract_core(m, X, "l")
    labels = m(X)[:, -1].argmax(-1)
    m.train()
    m.o.eval()                                      # a mixed state comes back as it was
    core = extract_core(m, X, "l")
    torch.testing.assert_close(core.s, ref.s)
    assert validate(core, m, X, labels)["baseline_acc"] == 1.0
    assert m.training and m.d.training and not m.o.training


def test_fisher_estimate_runs_in_eval_mode_and_restores_the_mode():
    from wtc.scan import fisher_estimate
    m = Transformer(_cfg(), seed=0)
    ref = fisher_estimate(m.eval(), TOKENS, W_OUT, samples=2)[W_OUT]
    m.train()
    torch.testing.assert_close(fisher_estimate(m, TOKENS, W_OUT, samples=2)[W_OUT], ref, rtol=0, atol=0)
    assert m.training


def test_explain_leaves_the_model_in_the_mode_it_was_given():
    from wtc.explain import explain
    m = _byte_model().train()
    tok = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(0))
    explain(m, tok, [tok], sample=1, progress=False)
    assert m.training


_IDENTITY = """
import functools
from wtc.scan.inputs import readout_identity
comprehension = lambda out: out[..., [i for i in range(3)]]
partial = functools.partial(lambda out, k: out * k, k=2)
class Readout:
    def __call__(self, out):
        return out
print(readout_identity(comprehension), readout_identity(partial), readout_identity(Readout()))
"""


def test_readout_identities_are_the_same_in_every_process():
    """A readout with a comprehension (a nested code object, whose repr holds its address), a
    functools.partial or a plain callable object got another identity after every restart, so its
    scans could never be resumed ('a different readout')."""
    import subprocess
    import sys
    runs = [subprocess.run([sys.executable, "-c", _IDENTITY], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
    from wtc.scan.inputs import readout_identity
    import functools
    f = lambda out, k: out * k                                    # noqa: E731
    assert readout_identity(functools.partial(f, k=2)) != readout_identity(functools.partial(f, k=3))


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "nul\x00"])
def test_task_names_with_control_characters_are_refused(name):
    with pytest.raises(TaskError, match="task name must be printable"):
        _task(name=name)
    assert _task(name="τάσκ ✓ / 1").name == "τάσκ ✓ / 1"


def test_transformer_refuses_tokens_on_another_device_and_runs_on_meta():
    """Meta-device tokens were a raw RuntimeError (from the id range check); a model built on the
    meta device still runs for shapes."""
    import torch

    from wtc.errors import ModelInputError
    from wtc.models.transformer import Transformer, TransformerConfig

    cfg = TransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=16, n_ctx=8)
    model = Transformer(cfg, seed=0)
    with pytest.raises(ModelInputError, match="tokens are on meta, the model on cpu"):
        model(torch.zeros(2, 4, dtype=torch.long, device="meta"))
    with torch.device("meta"):
        shapes = Transformer(cfg, seed=0)
    assert shapes(torch.zeros(2, 4, dtype=torch.long, device="meta")).shape == (2, 4, 16)

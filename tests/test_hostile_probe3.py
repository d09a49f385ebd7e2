"""Hostile inputs, third probe: each case an error of wtc's own type (a WtcError) whose message
names the problem, or, for a legitimate input, the right answer."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import wtc
from wtc import checkpoint_io
from wtc.errors import CheckpointError, StudyError, TaskError, TrainConfigError, TrainingError, WtcError
from wtc.models.training import Eval, TrainConfig, Trainer


# ---------------------------------------------------------------------------- Hugging Face models

@pytest.fixture(scope="module")
def gpt2_dirs(tmp_path_factory):
    """Tiny GPT-2 directories with the agreement corpus's word tokenizer: ok, a short context, NaN
    weights, a weights file missing layer 1."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    from wtc.models.hf import word_tokenizer
    from wtc.tasks.agreement import AgreementCorpus

    c = AgreementCorpus()
    root = tmp_path_factory.mktemp("hf")

    def make(name, n_positions=32, nan=False):
        torch.manual_seed(0)
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_inner=32,
                                                                 vocab_size=c.d_vocab, n_positions=n_positions))
        if nan:
            with torch.no_grad():
                m.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
        m.save_pretrained(root / name)
        word_tokenizer(c.vocab).save_pretrained(root / name)
        return root / name

    make("ok")
    make("short", n_positions=8)
    make("nan", nan=True)
    d = make("missing")
    w = load_file(d / "model.safetensors")
    save_file({k: v for k, v in w.items() if ".h.1." not in k}, d / "model.safetensors", metadata={"format": "pt"})
    return root


@pytest.mark.parametrize("name, match", [("short", r"context \(8 positions\) is shorter than the study's n_ctx=24"),
                                         ("nan", r"weight transformer\.h\.0\.mlp\.c_fc\.weight holds NaN"),
                                         ("missing", r"lacks 12 of the model's parameters")])
def test_agreement_on_an_unusable_model_is_one_line_before_anything_is_written(gpt2_dirs, tmp_path, capsys, name,
                                                                               match):
    from wtc.cli import main

    out = tmp_path / "out"
    assert main(["study", "agreement", "--quick", "--quiet", "--model", str(gpt2_dirs / name), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wtc: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    import re
    assert re.search(match, err), err
    assert not (out / "config.json").exists()
    from wtc.studies import agreement as A
    from wtc.tasks.agreement import AgreementCorpus
    with pytest.raises(WtcError, match=match):
        A.hf_lm(gpt2_dirs / name, AgreementCorpus(), n_ctx=24)


def test_hf_loading_prints_nothing_and_refuses_random_initialised_weights(gpt2_dirs, capfd):
    from wtc.models.hf import HFModelError, load

    capfd.readouterr()
    with pytest.raises(HFModelError, match="lacks 12 .*transformer.h.1.*initialise them at random"):
        load(gpt2_dirs / "missing")
    out, err = capfd.readouterr()
    assert out == "" and err == ""           # transformers' "Some weights ... newly initialized" held back
    assert load(gpt2_dirs / "ok", dtype="float64").hf.dtype == torch.float64      # a dtype named as transformers takes it


def test_hf_forward_and_load_refuse_unknown_arguments_by_name(gpt2_dirs):
    from wtc.models.hf import HFModel, HFModelError, load

    m = load(gpt2_dirs / "ok")
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(HFModelError, match="unknown keyword argument.*'atention_mask'.*attention_mask"):
        m(x, atention_mask=torch.ones(1, 4))
    with pytest.raises(HFModelError, match="return_dict cannot be passed"):
        m(x, return_dict=False)
    assert torch.equal(m(x, attention_mask=torch.ones(1, 4)), m(x))           # a named argument still works
    with pytest.raises(HFModelError, match="dtype must be None or a floating-point torch.dtype.*int32"):
        load(gpt2_dirs / "ok", dtype=torch.int32)
    with pytest.raises(HFModelError, match="dtype must be .*'half-ish'"):
        load(gpt2_dirs / "ok", dtype="half-ish")
    with pytest.raises(HFModelError, match="tokenizer must be None or a transformers tokenizer, got int"):
        HFModel(m.hf, tokenizer=3)
    with pytest.raises(HFModelError, match="takes no tokenizer= or dtype="):
        load(m, dtype=torch.float64)


# ---------------------------------------------------------------------------- the training loop

def _trainer(**kw):
    m = torch.nn.Linear(2, 1)
    return Trainer(m, kw.pop("cfg", TrainConfig(steps=2)), lambda s: torch.ones(3, 2),
                   lambda b: m(b).pow(2).mean(), progress=False, **kw)


@pytest.mark.parametrize("kw, error, match", [
    ({"threads": 0}, TrainConfigError, "threads must be a positive integer, got 0"),
    ({"threads": 1.5}, TrainConfigError, "threads must be a positive integer, got 1.5"),
    ({"threads": True}, TrainConfigError, "threads must be a positive integer, got True"),
    ({"identity": {"a": object()}}, TrainConfigError, "identity must be JSON data.*object"),
    ({"identity": {"a": {1, 2}}}, TrainConfigError, "identity must be JSON data.*set"),
    ({"identity": {"a": float("nan")}}, TrainConfigError, "identity must be JSON data.*Out of range"),
    ({"identity": {(1, 2): 3}}, TrainConfigError, "identity must be JSON data.*tuple"),
    ({"identity": [1, 2]}, TrainConfigError, "identity must be a dict.*list"),
    ({"cfg": {"steps": 3}}, TypeError, r"cfg must be a TrainConfig \(TrainConfig\(\*\*d\) for a dict\), got dict"),
    ({"cfg": None}, TypeError, "cfg must be a TrainConfig, got NoneType"),
    ({"evals": (3,)}, TypeError, "evals must be a tuple of Eval"),
    ({"evals": Eval("a", lambda t: {})}, TypeError, "evals must be a tuple of Eval"),
    ({"rngs": [np.random.default_rng()]}, TypeError, "rngs must be a dict"),
    ({"rngs": {"g": 3}}, TypeError, r"rngs\['g'\] must be a numpy or torch Generator"),
    ({"decay": 3}, TypeError, "decay must be None or callable, got int"),
    ({"post_step": 3}, TypeError, "post_step must be None or callable, got int"),
    ({"path": 3}, TypeError, "path must be None or a path"),
    ({"path": "ckpt.v1"}, TrainConfigError, "suffix '.v1'"),
])
def test_trainer_arguments_are_named(kw, error, match):
    with pytest.raises(error, match=match) as e:
        _trainer(**kw)
    assert isinstance(e.value, WtcError)


def test_trainer_model_must_be_a_module():
    with pytest.raises(TrainConfigError, match="model must be a torch.nn.Module, got int"):
        Trainer(3, TrainConfig(steps=1), lambda s: 0, lambda b: 0)


@pytest.mark.parametrize("kw, match", [
    ({"every": 0}, "every must be None or a positive integer, got 0"),
    ({"every": -1}, "every must be None or a positive integer, got -1"),       # ran at every step
    ({"at": "12"}, "at must be a collection of step numbers"),
    ({"at": (1.5,)}, "at must be a collection of step numbers"),
    ({"fn": 3}, "fn must be callable"),
    ({"name": 3}, "Eval.name must be a non-empty str, got 3"),
    ({"show": "loss"}, "show must be a tuple of record keys"),
])
def test_eval_arguments_are_named(kw, match):
    args = {"name": "a", "fn": lambda t: {}, **kw}
    with pytest.raises(TrainConfigError, match=match):
        Eval(**args)


def test_post_step_cannot_overwrite_the_recorded_loss_or_give_text(tmp_path):
    with pytest.raises(TrainingError, match=r"post_step returned \['loss'\], which the trainer records itself"):
        _trainer(post_step=lambda t: {"loss": 5.0}).run()          # the history's loss was 5.0 at every step
    with pytest.raises(TrainingError, match="post_step must return str keys with numbers, got 'x': 'a'"):
        _trainer(post_step=lambda t: {"x": "a"}).run()
    r = _trainer(post_step=lambda t: {"density": 0.5}).run()
    assert r.history["density"] == [0.5, 0.5] and r.history["loss"][0] != 0.5


def test_an_eval_record_that_cannot_be_checkpointed_is_named(tmp_path):
    with pytest.raises(TrainingError, match="Eval 'a' must return JSON data.*Tensor"):
        _trainer(path=tmp_path / "s", evals=(Eval("a", lambda t: {"x": torch.tensor(1.0)}, every=1),)).run()
    r = _trainer(evals=(Eval("a", lambda t: {"x": torch.tensor(1.0)}, every=1),)).run()     # no checkpoint: kept
    assert len(r.metrics["a"]) == 2


# ---------------------------------------------------------------------------- checkpoint_io

@pytest.mark.parametrize("tensors, meta, match", [
    ({"a": np.zeros(3)}, {}, "tensor 'a' must be a torch.Tensor, got ndarray"),
    ({"a": 1.0}, {}, "tensor 'a' must be a torch.Tensor, got float"),
    ({1: torch.zeros(2)}, {}, "tensor names must be str, got 1"),
    ([torch.zeros(2)], {}, "tensors must be a dict"),
    ({"a": torch.zeros(2).to_sparse()}, {}, "only dense tensors"),
    ({"a": torch.zeros(2)}, [1], "meta must be a dict, got list"),
    ({"a": torch.zeros(2)}, {"x": object()}, "meta must be JSON data"),
    ({"a": torch.zeros(2)}, {1: 2}, "meta keys must be str"),
    ({"a": torch.zeros(2)}, {"_sha256": 1}, r"meta keys \['_sha256'\] are reserved"),
])
def test_write_atomic_refuses_what_it_cannot_write_before_writing(tmp_path, tensors, meta, match):
    with pytest.raises(CheckpointError, match=match):
        checkpoint_io.write_atomic(tmp_path / "c", tensors, meta)
    assert list(tmp_path.iterdir()) == []                    # no .tmp file left behind


def test_checkpoint_stems_with_a_dot_would_share_files_and_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"suffix '\.1'.*run\.safetensors"):
        checkpoint_io.write_atomic(tmp_path / "run.1", {"a": torch.zeros(2)}, {})
    with pytest.raises(CheckpointError, match="non-empty str or Path, got 5"):
        checkpoint_io.read(5)
    t = torch.arange(4.0)                                    # views of one storage (tied weights) are written
    checkpoint_io.write_atomic(tmp_path / "shared", {"a": t, "b": t[:2], "c": t}, {"v": 1})
    back, meta = checkpoint_io.read(tmp_path / "shared")
    assert torch.equal(back["a"], t) and torch.equal(back["b"], t[:2]) and torch.equal(back["c"], t) and meta == {"v": 1}


# ---------------------------------------------------------------------------- data tasks

@pytest.mark.parametrize("where", ["inputs", "outputs"])
@pytest.mark.parametrize("values", [lambda: 2**60 + np.arange(200 * 4, dtype=np.int64).reshape(200, 4),
                                    lambda: (2**60 + np.arange(200 * 4, dtype=np.int64).reshape(200, 4)).astype(np.uint64),
                                    lambda: np.array([[2**70 + 4 * i + j for j in range(4)] for i in range(200)],
                                                     dtype=object),
                                    lambda: np.full((200, 4), 2**53 + 1)])
def test_from_arrays_refuses_integers_float64_cannot_hold(where, values):
    big = values()
    small = np.arange(200 * 4).reshape(200, 4)
    x, y = (big, small % 5) if where == "inputs" else (small, big)
    with pytest.raises(TaskError, match=f"{where} hold the integer .* cannot represent exactly"):
        wtc.Task.from_arrays(x, y)


def test_from_arrays_takes_large_integers_float64_holds():
    x = 2**52 + np.arange(200 * 4, dtype=np.int64).reshape(200, 4)
    # held exactly in float64, but the DT reads inputs in float32, where these merge (probe 5): refused, named
    with pytest.raises(TaskError, match="the same number in float32"):
        wtc.Task.from_arrays(x, x % 3)
    x = 2**23 + np.arange(200 * 4, dtype=np.int64).reshape(200, 4)      # float32-exact: taken
    t = wtc.Task.from_arrays(x, x % 3)
    s = t.sample(np.random.default_rng(0), 5)
    assert np.array_equal(t.target(s), s % 3)


# ---------------------------------------------------------------------------- probe 3: tasks

def _ints_task(**kw):
    base = dict(name="t", sample=lambda rng, n: rng.integers(0, 10, (n, 6)), target=lambda x: x, seq_len=6)
    return wtc.Task(**{**base, **kw})


def test_integer_samples_reach_target_as_integers():
    """x is what sample returned: x & 1 on an integer sampler (target got float64: TypeError)."""
    t = _ints_task(name="bits", target=lambda x: x & 1)
    x, y = t.batch(0, 20)
    assert np.array_equal(y[..., 0], x[..., 0].astype(np.int64) & 1)
    tb = _ints_task(name="not", sample=lambda rng, n: rng.integers(0, 2, (n, 6)).astype(bool), target=lambda x: ~x)
    x, y = tb.batch(0, 20)
    assert np.array_equal(y[..., 0], 1 - x[..., 0])
    assert _ints_task(name="prev2").fingerprint() == _ints_task(name="prev2").fingerprint()
    tu = _ints_task(name="u8", sample=lambda rng, n: rng.integers(0, 10, (n, 6)).astype(np.uint8), target=lambda x: x - 5)
    x, y = tu.batch(0, 20)
    assert np.array_equal(y[..., 0], x[..., 0] - 5)            # int64 arithmetic: no uint8 wrap-around


def test_a_random_target_is_refused():
    t = _ints_task(name="noisy", target=lambda x: x + np.random.default_rng().integers(0, 2, x.shape))
    with pytest.raises(TaskError, match="gave other values for the same inputs"):
        t.fingerprint()


@pytest.mark.parametrize("rng, match", [("seed", "rng .* must be a seed"), (-1, "rng .* must be a seed"),
                                        (1.5, "rng .* must be a seed")])
def test_task_draw_refuses_bad_rngs(rng, match):
    with pytest.raises(TaskError, match=match):
        _ints_task().draw(rng, 2)


def test_task_score_and_verification_refuse_what_they_cannot_score():
    t = _ints_task()
    with pytest.raises(TaskError, match="prediction is complex"):
        t.score(np.zeros((3, 6)) + 1j, np.zeros((3, 6)))          # was scored on the real part: accuracy 1.0
    with pytest.raises(TaskError, match="holds no sequences"):
        t.score(np.zeros((0, 6)), np.zeros((0, 6)))
    with pytest.raises(TaskError, match="prediction is not a numeric array"):
        t.score(np.full((3, 6), "a"), np.zeros((3, 6)))
    with pytest.raises(TaskError, match="target holds NaN or inf at a valid position"):
        t.score(np.zeros((3, 6)), np.full((3, 6), np.nan))
    with pytest.raises(TaskError, match="inputs is not a numeric array"):
        t.check_inputs([[1, 2], [3]])
    for n in (0, -5, 2.0):
        with pytest.raises(TaskError, match="positive number of sequences"):
            t.verification(n)


def test_task_heldout_and_description_are_checked():
    with pytest.raises(TaskError, match="heldout must be a task of the same shape.*seq_len is 5, not 6"):
        _ints_task(heldout=_ints_task(seq_len=5, sample=lambda rng, n: np.zeros((n, 5))))
    with pytest.raises(TaskError, match="output is 'real', not 'integer'"):
        _ints_task(heldout=_ints_task(output="real"))
    with pytest.raises(TaskError, match="description must be a str, got int"):
        _ints_task(description=3)


def test_from_arrays_refuses_unknown_keywords_and_empty_records():
    x = np.arange(200 * 5).reshape(200, 5) % 10
    with pytest.raises(TaskError, match="unknown keyword argument.*'seq_len'.*takes name, output, valid_from"):
        wtc.Task.from_arrays(x, x, seq_len=5)
    with pytest.raises(TaskError, match="inputs are empty"):
        wtc.Task.from_arrays(np.zeros((0, 5)), np.zeros((0, 5)))


def test_dtconfig_per_layer_counts_must_be_integers():
    from wtc.dt.config import ConfigError
    with pytest.raises(ConfigError, match="n_mlps must be a non-negative integer or one per layer"):
        wtc.DTConfig(n_mlps=0.5)
    assert wtc.DTConfig(n_heads=np.int64(2)).n_heads == (2,)


def test_sr_fit_predict_names_bad_inputs():
    from wtc.errors import SRError
    f = wtc.sr.fit(np.arange(20.0)[:, None], 2 * np.arange(20.0), max_complexity=3)
    with pytest.raises(SRError, match="X must be a numeric array"):
        f.predict(np.full((3, 1), "a"))
    with pytest.raises(SRError, match="X is complex"):
        f.predict(np.zeros((2, 1)) + 1j)


# ---------------------------------------------------------------------------- probe 3: models, hooks, scans

@pytest.fixture(scope="module")
def tiny():
    from wtc.models import Transformer, TransformerConfig
    m = Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=8, d_vocab=6, n_ctx=5), seed=0)
    return m.eval(), torch.randint(0, 6, (4, 5), generator=torch.Generator().manual_seed(0))


def test_user_hooks_that_raise_are_named_and_leave_no_hooks(tiny):
    from wtc.errors import HookError, HookNameError
    from wtc.hooks import has_hooks, hook_modules
    m, tok = tiny
    with pytest.raises(HookError, match="hook on 'blocks.0.hook_resid_post' raised ZeroDivisionError"):
        m.run_with_hooks(tok, fwd_hooks=[("blocks.0.hook_resid_post", lambda t, hook: 1 / 0)])
    with pytest.raises(HookError, match="raised TypeError.*called as fn\\(tensor, hook\\)"):
        m.run_with_hooks(tok, fwd_hooks=[("blocks.0.hook_resid_post", lambda t: t)])
    with pytest.raises(HookError, match="names_filter filter raised ZeroDivisionError"):
        m.run_with_cache(tok, names_filter=lambda n: 1 / 0)
    with pytest.raises(HookError, match="fwd_hooks must be .*pairs"):
        m.run_with_hooks(tok, fwd_hooks=["blocks.0.hook_resid_post"])
    with pytest.raises(HookError, match="fwd_hooks must be a list of .* pairs, got dict"):
        m.run_with_hooks(tok, fwd_hooks={"blocks.0.hook_resid_post": lambda t, hook: t})
    with pytest.raises(HookNameError, match="matches none of Transformer's hook points"):
        m.add_hook(lambda n: False, lambda t, hook: t)
    with pytest.raises(HookError, match="hook on module 'blocks.0' raised ZeroDivisionError"):
        with hook_modules(m, [("blocks.0", lambda t, mod: 1 / 0)]):
            m(tok)
    assert not has_hooks(m)


def test_transformer_takes_any_integer_tokens_and_refuses_a_dict_config(tiny):
    from wtc.errors import ModelConfigError
    from wtc.models import Transformer
    m, tok = tiny
    for dtype in (torch.uint8, torch.int8, torch.int16):
        assert torch.equal(m(tok.to(dtype)), m(tok))
    with pytest.raises(ModelConfigError, match=r"cfg must be a TransformerConfig \(TransformerConfig\(\*\*d\)"):
        Transformer({"n_layers": 1})
    with pytest.raises(ModelConfigError, match="seed must be a seed"):
        Transformer(seed=-1)


def test_model_io_names_bad_arguments(tiny, tmp_path):
    from wtc.models import io as mio
    m, _ = tiny
    with pytest.raises(CheckpointError, match="save writes a wtc.models.Transformer, got Linear"):
        mio.save(torch.nn.Linear(2, 2), tmp_path / "lin")
    with pytest.raises(CheckpointError, match="extra must be None or a dict"):
        mio.save(m, tmp_path / "x", extra=[1])
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file; a checkpoint is a directory"):
        mio.save(m, tmp_path / "file")
    with pytest.raises(CheckpointError, match="non-empty str or Path, got 3"):
        mio.load(3)
    with pytest.raises(WtcError, match="token file must be a str or Path"):
        mio.load_tokens(3)


def test_scan_arguments_and_result_lookups_are_wtc_errors(tiny, tmp_path):
    from wtc.errors import IndexOutOfRange, ScanError
    from wtc.scan import fisher_estimate, importance_positions, kl_rows, scan
    m, tok = tiny
    w = "blocks.0.attn.W_Q"
    for kw, match in [({"params": []}, "params must be None"), ({"params": [3]}, "params must be None"),
                      ({"keep_positions": "no"}, "keep_positions must be None, True or False"),
                      ({"out": 3}, "out must be None or a directory path"),
                      ({"progress": "no"}, "progress must be True or False")]:
        with pytest.raises(ScanError, match=match):
            scan(m, tok, **{"progress": False, **kw})
    (tmp_path / "f").write_text("x")
    with pytest.raises(ScanError, match="is a file; the scan store is a directory"):
        scan(m, tok, params=[w], out=tmp_path / "f", progress=False)
    with pytest.raises(ScanError, match="model must be a torch.nn.Module, got int"):
        scan(3, tok)
    r = scan(m, tok, params=[w], progress=False)
    with pytest.raises(IndexOutOfRange, match=r"flat index -1 out of range"):
        r.position_kl(w, -1)
    with pytest.raises(IndexError, match=r"index \(0,\) out of range"):
        r.position_kl(w, (0,))
    for bad in (True, 1.5, "0"):
        with pytest.raises(ScanError, match="index must be a flat int or a tuple of ints"):
            r.position_kl(w, bad)
    with pytest.raises(ScanError, match="mass must be a number in"):
        r.importance_positions(w, 0, mass=0)
    for k in (-1, 1.5):
        with pytest.raises(ScanError, match="k must be a non-negative integer"):
            r.top(k)                              # -1 returned every weight, 1.5 a raw sqlite IntegrityError
    with pytest.raises(ScanError, match="logp must be"):
        kl_rows(torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(ScanError, match="kl must be a tensor"):
        importance_positions(torch.rand(5))
    with pytest.raises(WtcError, match="samples must be a positive integer, got 0"):
        fisher_estimate(m, tok, [w], samples=0)     # returned zeros as the estimate
    with pytest.raises(WtcError, match="seed"):
        fisher_estimate(m, tok, [w], seed=-1)
    with pytest.raises(WtcError, match="negative token id"):
        fisher_estimate(m, tok - 1, [w])


def test_conditional_ablation_arguments_are_wtc_errors(tiny):
    from wtc.errors import IndexOutOfRange, UnknownName
    from wtc.explain import conditional_kl, zeroed_at
    m, tok = tiny
    w, msk = "blocks.0.attn.W_Q", torch.ones(4, 5, dtype=torch.bool)
    with pytest.raises(UnknownName, match="conditional ablation supports wtc Transformer matrices"):
        conditional_kl(m, tok, "nope", (0, 0, 0), [msk])
    with pytest.raises(IndexOutOfRange, match=r"index \(0, 0, -1\) out of range"):
        conditional_kl(m, tok, w, (0, 0, -1), [msk])
    with pytest.raises(WtcError, match="mask must be shaped like the tokens"):
        conditional_kl(m, tok, w, (0, 0, 0), [torch.ones(3, 5, dtype=torch.bool)])
    with pytest.raises(WtcError, match="values other than 0 and 1"):
        conditional_kl(m, tok, w, (0, 0, 0), [torch.full((4, 5), 0.3)])
    with pytest.raises(WtcError, match="non-empty list"):
        conditional_kl(m, tok, w, (0, 0, 0), [])
    with pytest.raises(WtcError, match="clean_logp must be"):
        conditional_kl(m, tok, w, (0, 0, 0), [msk], clean_logp=torch.zeros(2, 2))
    with pytest.raises(WtcError, match="index must be a tuple of ints"):
        with zeroed_at(m, w, 1.5, msk, tok):
            pass
    ones = torch.ones(4, 5)                                   # a 0/1 float mask is the bool one
    assert torch.equal(conditional_kl(m, tok, w, (0, 0, 0), [ones]), conditional_kl(m, tok, w, (0, 0, 0), [msk]))


# ---------------------------------------------------------------------------- probe 3: ACE

def test_subspace_comparisons_refuse_bases_that_are_not_orthonormal():
    from wtc.ace import cca, compare, principal_angles, projector_overlap
    from wtc.errors import AceError
    Q = torch.linalg.qr(torch.randn(8, 3, generator=torch.Generator().manual_seed(0)))[0]
    with pytest.raises(AceError, match="Q1's columns are not orthonormal"):
        projector_overlap(3 * Q, Q)                    # was 9.0 for an overlap in [0, 1]
    with pytest.raises(AceError, match="Q1's columns are not orthonormal"):
        principal_angles(3 * Q, Q)
    with pytest.raises(AceError, match="spaces of different dimension"):
        principal_angles(Q, torch.eye(5)[:, :2])
    with pytest.raises(AceError, match=r"\(D, r\) tensor"):
        projector_overlap(torch.randn(8), Q)
    assert abs(projector_overlap(Q, Q) - 1) < 1e-6 and float(principal_angles(Q, Q).max()) < 1e-3
    with pytest.raises(AceError, match=r"CCA needs X as a \(N, features\) tensor"):
        cca(torch.randn(10), torch.randn(10, 2))
    with pytest.raises(AceError, match="CCA: X holds NaN"):
        cca(torch.full((10, 2), float("nan")), torch.randn(10, 2))
    with pytest.raises(AceError, match="compare needs a list of Core"):
        compare([1, 2])


def test_sequential_operator_refuses_fits_that_say_nothing():
    from wtc.ace import sequential_operator, shift_operator
    from wtc.errors import AceError
    g = torch.Generator().manual_seed(0)
    with pytest.raises(AceError, match="2 transitions for 3 coordinates"):
        sequential_operator(torch.randn(1, 3, 3, generator=g))      # gave R^2 = 1 for any Z
    with pytest.raises(AceError, match=r"\(B, T, r\) tensor"):
        sequential_operator(torch.randn(10, 3))
    with pytest.raises(AceError, match="does not change"):
        sequential_operator(torch.ones(4, 5, 2))
    with pytest.raises(AceError, match="Z holds NaN"):
        sequential_operator(torch.full((4, 5, 2), float("nan")))
    with pytest.raises(AceError, match="oracle must be"):
        sequential_operator(torch.randn(4, 5, 2, generator=g), oracle=torch.randn(3))
    with pytest.raises(AceError, match=r"\(p, r\) tensor"):
        shift_operator(torch.randn(5))
    with pytest.raises(AceError, match="reps hold NaN"):
        shift_operator(torch.full((7, 2), float("nan")))
    Z = torch.randn(8, 6, 2, generator=g)
    assert -1 <= sequential_operator(Z)["r2"] <= 1


def test_balanced_svd_and_energy_refuse_matrices_that_are_not_gramians():
    from wtc.ace import balanced_svd, rank_for_energy
    from wtc.errors import AceError
    with pytest.raises(AceError, match="cov is not symmetric"):
        balanced_svd(torch.tensor([[1.0, 2.0], [0.0, 1.0]]), torch.eye(2))
    with pytest.raises(AceError, match="not positive semidefinite"):
        balanced_svd(-torch.eye(3), torch.eye(3))     # returned an empty core
    with pytest.raises(AceError, match="jitter must be a finite number >= 0"):
        balanced_svd(torch.eye(3), torch.eye(3), jitter=-1)
    with pytest.raises(AceError, match="must be torch tensors"):
        balanced_svd(np.eye(3), np.eye(3))
    with pytest.raises(AceError, match="singular values"):
        rank_for_energy(torch.tensor([3.0, -2.0, 1.0]), 0.9)
    with pytest.raises(AceError, match="total .* is less than the energy in s"):
        rank_for_energy(torch.tensor([3.0, 2.0, 1.0]), 0.9, total=1.0)
    assert rank_for_energy(torch.tensor([3.0, 2.0, 1.0]), 0.9) == 2


def test_extract_core_refuses_a_readout_blind_to_the_layer(tiny):
    from wtc.ace import extract_core
    from wtc.errors import AceError
    m, tok = tiny
    tok = tok.repeat(4, 1)
    with pytest.raises(AceError, match="does not depend on blocks.0.hook_resid_post.*Jacobian there is zero"):
        extract_core(m, tok, "blocks.0.hook_resid_post", readout=lambda o: o[:, -1, :2] * 0 + 1)
    with pytest.raises(AceError, match="model must be a torch.nn.Module"):
        extract_core(3, tok, "blocks.0.hook_resid_post")
    core = extract_core(m, tok, "blocks.0.hook_resid_post", readout=lambda o: o[:, -1, :2])
    with pytest.raises(AceError, match=r"activations must be \(\.\.\., 8\)"):
        core.project(torch.zeros(3, 5))


# ---------------------------------------------------------------------------- probe 3: DT training, explain, CLI

@pytest.mark.parametrize("kw, match", [({"progress": "no"}, "progress must be True or False"),
                                       ({"resume": "no"}, "resume must be True or False"),   # bool("no") resumed
                                       ({"resume": True}, "resume=True continues the checkpoints in checkpoint_dir"),
                                       ({"checkpoint_dir": 3}, "checkpoint_dir must be None or a directory path, got 3")])
def test_dt_train_flags_are_checked_before_any_work(kw, match):
    from wtc.dt.config import ConfigError
    with pytest.raises(ConfigError, match=match):
        wtc.train("prev2", wtc.DTConfig(steps=1, replicas=1, max_attempts=1), **kw)


def test_dt_train_and_save_refuse_a_file_for_a_directory(tmp_path):
    from wtc.dt import checkpoint
    from wtc.dt.config import ConfigError
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        wtc.train("prev2", wtc.DTConfig(steps=1, replicas=1, max_attempts=1), checkpoint_dir=tmp_path / "f")
    with pytest.raises(CheckpointError, match="save writes a DiscreteTransformer, got Linear"):
        checkpoint.save(torch.nn.Linear(2, 2), tmp_path / "m")


def test_transformer_configs_too_large_to_build_are_refused_at_once():
    from wtc.errors import ModelConfigError
    from wtc.models import TransformerConfig
    with pytest.raises(ModelConfigError, match="would hold up to ~.* parameters"):
        TransformerConfig(n_layers=10**9)            # built 1e9 blocks (or a 1e9-entry tuple) for minutes
    with pytest.raises(ModelConfigError, match="parameters"):
        TransformerConfig(d_vocab=10**12)            # a raw allocation error


def test_a_failing_proposer_is_counted_in_the_summary(tiny):
    from wtc.explain import explain
    m, _ = tiny
    rng = np.random.default_rng(0)
    toks, sl = rng.integers(0, 6, (16, 5)), [rng.integers(0, 6, (8, 5)) for _ in range(2)]
    r = explain(m, toks, sl, sample=2, progress=False, proposer=lambda contexts: 1 / 0, builtin=True)
    s = r["summary"]
    scored = sum(e.total_kl > 1e-12 for e in r["weights"])
    assert scored >= 1 and s["proposer_failures"] == scored and "ZeroDivisionError" in s["proposer_error"]
    assert "proposer_failures" not in explain(m, toks, sl, sample=2, progress=False)["summary"]


@pytest.mark.parametrize("argv, match", [(["lm-train", "--d-model", "6", "--heads", "4"], "must be a multiple of --heads"),
                                         (["lm-train", "--layers", str(10**9)], "parameters")])
def test_cli_lm_train_refuses_shapes_it_cannot_build(tmp_path, capsys, argv, match):
    from wtc.cli import main
    assert main([*argv, "--out", str(tmp_path / "lm")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wtc: error: ") and match in err and err.count("\n") == 1


def test_importance_positions_refuse_what_is_not_a_kl():
    from wtc.errors import ScanError
    from wtc.scan import importance_positions
    with pytest.raises(ScanError, match="kl must be finite and >= 0"):
        importance_positions(-torch.rand(2, 5))          # gave empty position sets
    with pytest.raises(ScanError, match="kl must be finite and >= 0"):
        importance_positions(torch.full((2, 5), float("nan")))
    kl = torch.tensor([[0.0, 3.0, 1.0, -1e-9]])
    assert importance_positions(kl, mass=0.7)[0].tolist() == [1]


def test_task_callables_calling_sys_exit_and_huge_integer_targets_are_task_errors():
    import sys
    with pytest.raises(TaskError, match=r"target\(x\) raised SystemExit"):
        _ints_task(name="exits", target=lambda x: sys.exit(3)).batch(0, 3)
    with pytest.raises(TaskError, match=r"sample\(rng, 2\) raised SystemExit"):
        _ints_task(name="exits2", sample=lambda rng, n: sys.exit(3)).draw(0, 2)
    with pytest.raises(TaskError, match="output='integer' but the target reaches .*past 2\\*\\*53"):
        _ints_task(name="huge", target=lambda x: x * 0 + 2**60).batch(0, 3)
    y = _ints_task(name="huge_real", output="real", target=lambda x: x * 0 + 2.0**60).batch(0, 3)[1]
    assert (y == 2.0**60).all()


@pytest.mark.parametrize("make, error, match", [
    (lambda: wtc.DTConfig(stpes=3), "ConfigError", r"DTConfig has no field 'stpes' \(did you mean \['steps'\]\?\)"),
    (lambda: TrainConfig(steps=1, lerning_rate=2), "TrainConfigError", "TrainConfig has no field 'lerning_rate'"),
    (lambda: __import__("wtc.models", fromlist=["TransformerConfig"]).TransformerConfig(d_modle=3), "ModelConfigError",
     "TransformerConfig has no field 'd_modle'"),
])
def test_config_typos_are_named(make, error, match):
    with pytest.raises(WtcError, match=match) as e:
        make()
    assert type(e.value).__name__ == error


def test_configs_still_copy_replace_and_pickle():
    import copy
    import dataclasses
    import pickle
    c = wtc.DTConfig(steps=5)
    assert dataclasses.replace(c, lr=0.02).lr == 0.02 and pickle.loads(pickle.dumps(c)) == c
    assert copy.deepcopy(c) == c and wtc.DTConfig(**c.to_dict()) == c and TrainConfig(7).steps == 7

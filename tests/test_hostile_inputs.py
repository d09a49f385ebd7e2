"""Hostile inputs to the public API: wtc.Task, DTConfig, wtc.sr.fit, wtc.tasks.get. Each bad input
is a WtcError whose message names the problem; legitimate extremes give the right answer.
Property-based cases are bounded (max_examples) so CI stays fast."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wtc
from wtc.dt.config import ConfigError, DTConfig
from wtc.errors import SRError, WtcError
from wtc.tasks import Task, TaskError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _task(sample=None, target=None, **kw):
    sample = sample or (lambda rng, n: rng.integers(0, 2, (n, 5)))
    target = target or (lambda x: x)
    return Task("t", sample, target, seq_len=5, **kw)


# ---------------------------------------------------------------------- DTConfig
NUMBER_FIELDS = ["lr", "tau_start", "tau_end", "hard_lr_scale", "content_fraction", "redundancy_penalty",
                 "weight_decay", "offset_prior"]
BOOL_FIELDS = ["qk_position", "gumbel", "straight_through", "grow"]
INT_FIELDS = ["steps", "hard_steps", "polish_iters", "refine_steps", "precision_iters", "batch_size", "replicas",
              "max_attempts", "eval_sequences", "mlp_inputs", "mlp_hidden", "ple_bins", "n_layers"]


@pytest.mark.parametrize("name", NUMBER_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1", None, True])
def test_dtconfig_refuses_non_finite_numbers(name, value):
    with pytest.raises(ConfigError, match=name):
        DTConfig(**{name: value})


@pytest.mark.parametrize("name", BOOL_FIELDS)
@pytest.mark.parametrize("value", [0, 1, "yes", None, 1.0])
def test_dtconfig_refuses_non_bool_flags(name, value):
    with pytest.raises(ConfigError, match=name):
        DTConfig(**{name: value})


@FAST
@given(name=st.sampled_from(INT_FIELDS),
       value=st.one_of(st.booleans(), st.floats(allow_nan=True), st.integers(max_value=-1), st.text(max_size=3)))
def test_dtconfig_refuses_bad_integers(name, value):
    if isinstance(value, float) and value.is_integer() and value >= 1:
        value = value + 0.5
    with pytest.raises(ConfigError, match=name):
        DTConfig(**{name: value})


def test_read_pattern_matching_nothing_is_refused():
    from wtc.dt.model import DiscreteTransformer
    with pytest.raises(ConfigError, match="matches no selection slot"):
        DiscreteTransformer(DTConfig(read={"L3.m*": ["x"]}), seq_len=5)
    with pytest.raises(ConfigError, match="match no variable|no readable variable"):
        DiscreteTransformer(DTConfig(read={"L0.m*": ["y*"]}), seq_len=5)
    DiscreteTransformer(DTConfig(read={"L0.m*": ["x", "L0.h*"]}), seq_len=5)     # a good one builds


# ---------------------------------------------------------------------- Task
def test_task_refuses_bool_valid_from_and_complex_and_huge_values():
    with pytest.raises(TaskError, match="valid_from"):
        _task(valid_from=True)
    with pytest.raises(TaskError, match="complex"):
        _task(sample=lambda rng, n: rng.normal(size=(n, 5)) + 1j).draw(0, 4)
    with pytest.raises(TaskError, match="complex"):
        _task(target=lambda x: x + 1j, output="real").batch(0, 4)
    with pytest.raises(TaskError, match="float32"):
        _task(sample=lambda rng, n: np.full((n, 5), 1e300), output="real").draw(0, 4)
    with pytest.raises(TaskError, match="float32"):
        _task(target=lambda x: x * 1e35, output="real").batch(0, 4)


def test_target_receives_what_sample_produced():
    seen = []

    def target(x):
        seen.append(x.shape)
        return x[..., 0]                   # natural code for a sampler that returns (n, T, 1)

    t = _task(sample=lambda rng, n: rng.integers(0, 2, (n, 5, 1)), target=target)
    x, y = t.batch(0, 3)
    assert seen[-1] == (3, 5, 1) and y.shape == (3, 5, 1)
    np.testing.assert_array_equal(y[..., 0], x[..., 0])
    t2 = _task()
    t2.batch(0, 3)                         # (n, T) samplers still get (n, T)


@FAST
@given(bad=st.one_of(st.integers(), st.lists(st.text(max_size=3), max_size=2), st.none(), st.floats()))
def test_tasks_get_refuses_non_names(bad):
    with pytest.raises(TaskError):
        wtc.tasks.get(bad)


@FAST
@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 7), st.integers(1, 3)))
def test_wrong_sample_shapes_are_named(shape):
    t = _task(sample=lambda rng, n: np.zeros(shape))
    if shape[1:] in ((5, 1),) and shape[0] == 4:
        t.draw(0, 4)
        return
    with pytest.raises(TaskError, match="sample"):
        t.draw(0, 4)


# ---------------------------------------------------------------------- SR
@pytest.mark.parametrize("scale", [1e-200, 1e-9, 1e15, 1e160])
def test_sr_fits_identity_and_products_at_any_scale(scale):
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 2, 120) * scale
    fit = wtc.sr.fit(x, 3 * x)
    assert fit.exact and fit.equation == "3*x", (scale, fit)
    np.testing.assert_allclose(fit.predict(x), 3 * x, rtol=1e-12)


def test_sr_mixed_scales():
    rng = np.random.default_rng(1)
    X = rng.uniform(1, 2, (150, 2)) * np.array([1e8, 1e-5])
    fit = wtc.sr.fit(X, X[:, 0] * X[:, 1] + 3000, names=("a", "b"))
    assert fit.exact and str(fit.expr) == "a*b + 3000", fit


@FAST
@given(bad=st.sampled_from(["nan", "inf", "complex", "ragged", "names", "few"]))
def test_sr_refuses_bad_data(bad):
    x = np.linspace(1, 2, 30)
    args = {"nan": (np.r_[x[:-1], np.nan], x), "inf": (x, np.r_[x[:-1], np.inf]),
            "complex": (x + 1j, x), "ragged": ([[1, 2], [3]], [1, 2]),
            "names": (np.c_[x, x], x), "few": (x[:1], x[:1])}[bad]
    kw = {"names": ("a", "a")} if bad == "names" else {}
    with pytest.raises(SRError):
        wtc.sr.fit(*args, **kw)


def test_every_error_here_is_a_wtc_error():
    for cls in (ConfigError, TaskError, SRError):
        assert issubclass(cls, WtcError) and issubclass(cls, ValueError)


# ---------------------------------------------------------------------- ACE
def _ace_setup():
    import torch
    from wtc.models import Transformer, TransformerConfig
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=8, d_vocab=5, n_ctx=4))
    tokens = torch.randint(0, 5, (16, 4))
    return model, tokens


@pytest.mark.parametrize("kw, match", [({"position": "bogus"}, "position"), ({"position": 1.5}, "position"),
                                       ({"chunk": 0}, "chunk"), ({"chunk": -3}, "chunk"), ({"rank": -1}, "rank"),
                                       ({"energy": 1.5}, "energy"), ({"layer": 3}, "layer")])
def test_extract_core_refuses_bad_options(kw, match):
    from wtc.ace import extract_core
    from wtc.errors import AceError
    model, tokens = _ace_setup()
    args = {"layer": "blocks.0.hook_resid_post", "readout": lambda out: out[:, -1], **kw}
    with pytest.raises(AceError, match=match):
        extract_core(model, tokens, args.pop("layer"), **args)


def test_validate_refuses_labels_that_do_not_fit():
    import torch
    from wtc.ace import extract_core, validate
    from wtc.errors import AceError
    model, tokens = _ace_setup()
    core = extract_core(model, tokens, "blocks.0.hook_resid_post", readout=lambda out: out[:, -1])
    ro = lambda out: out[:, -1]   # noqa: E731
    with pytest.raises(AceError, match="one row per input"):
        validate(core, model, tokens, torch.zeros(3, dtype=torch.long), readout=ro)
    with pytest.raises(AceError, match="integer class ids"):
        validate(core, model, tokens, torch.zeros(16), readout=ro)
    with pytest.raises(AceError, match="no label is scored"):
        validate(core, model, tokens, -torch.ones(16, dtype=torch.long), readout=ro)
    assert 0 <= validate(core, model, tokens, torch.zeros(16, dtype=torch.long), readout=ro)["baseline_acc"] <= 1


# ---------------------------------------------------------------------- checkpoints
def _frozen_dt():
    from wtc.dt.model import DiscreteTransformer
    model = DiscreteTransformer(DTConfig(replicas=1), seq_len=5)
    model.freeze()
    return model.eval()


def test_a_flipped_bit_in_a_checkpoint_is_refused(tmp_path):
    from wtc.dt import checkpoint
    from wtc.errors import CheckpointError
    checkpoint.save(_frozen_dt(), tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x10                                   # one bit of the last tensor's data
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        checkpoint.load(tmp_path / "m")


def test_corrupt_structure_indices_are_refused(tmp_path):
    from wtc.checkpoint_io import write_atomic
    from wtc.dt import checkpoint
    from wtc.errors import CheckpointError
    model = _frozen_dt()
    for bad in (10**6, -5):
        state = {k: v.clone() for k, v in model.state_dict().items()}
        key = next(k for k in state if k.endswith("frozen_index"))
        state[key][0, 0] = bad
        write_atomic(tmp_path / "m" / "model", state, checkpoint.model_meta(model))   # digests match: a
        with pytest.raises(CheckpointError, match="frozen selection index"):          # structural check
            checkpoint.load(tmp_path / "m")


def test_transformer_checkpoint_digests(tmp_path):
    import torch
    from wtc.errors import CheckpointError
    from wtc.models import Transformer, TransformerConfig
    from wtc.models.io import load, save
    d = save(Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_vocab=5, n_ctx=4)), tmp_path / "t")
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-2] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load(d)
    assert torch.is_tensor(next(iter(Transformer(TransformerConfig()).state_dict().values())))


# ---------------------------------------------------------------------- found by a hostile probe
def test_resume_refuses_another_task_of_the_same_name(tmp_path):
    from wtc.errors import CheckpointError
    sample = lambda rng, n: rng.integers(0, 2, (n, 5))                     # noqa: E731
    first = Task("same", sample, lambda x: x, seq_len=5)
    other = Task("same", sample, lambda x: 1 - x, seq_len=5)
    cfg = DTConfig(steps=5, hard_steps=2, replicas=2, max_attempts=1, eval_sequences=64, polish_iters=5,
                   precision_iters=0, workers=1)
    wtc.train(first, cfg, checkpoint_dir=tmp_path, progress=False)
    assert first.fingerprint() != other.fingerprint()
    with pytest.raises(CheckpointError, match="another task named 'same'"):
        wtc.train(other, cfg, checkpoint_dir=tmp_path, resume=True, progress=False)


def test_predict_refuses_what_float32_cannot_hold():
    from wtc.dt.model import DiscreteTransformer
    from wtc.errors import ModelInputError
    model = DiscreteTransformer(DTConfig(replicas=1), seq_len=4)
    for bad, match in [(np.full((1, 4), 1e39), "float32"), (np.zeros((1, 4)) + 1j, "complex"),
                       (np.zeros((0, 4)), "no sequences"), (np.zeros((1, 5)), "shape")]:
        with pytest.raises(ModelInputError, match=match):
            model.predict(bad)
    for kw in ({"replica": 3}, {"replica": "0"}, {"batch_size": 0}):
        with pytest.raises(ModelInputError):
            model.predict(np.zeros((1, 4)), **kw)


def test_config_of_the_wrong_type_is_refused():
    from wtc.dt.config import ConfigTypeError
    for bad in (0, "tiny", {"steps": 5}):
        with pytest.raises(ConfigTypeError, match="DTConfig"):
            wtc.discover("prev2", config=bad, progress=False)


def test_validate_refuses_labels_outside_the_readout():
    import torch
    from wtc.ace import extract_core, validate
    from wtc.errors import AceError
    model, tokens = _ace_setup()
    ro = lambda out: out[:, -1]   # noqa: E731
    core = extract_core(model, tokens, "blocks.0.hook_resid_post", readout=ro)
    with pytest.raises(AceError, match="not a class"):
        validate(core, model, tokens, torch.full((16,), 99), readout=ro)
    with pytest.raises(AceError, match="-1 for 'not scored'"):
        validate(core, model, tokens, torch.full((16,), -5), readout=ro)
    with pytest.raises(AceError, match="tolerance"):
        validate(core, model, tokens, torch.zeros(16, dtype=torch.long), readout=ro, tolerance=float("nan"))


def test_task_tiers_and_overrides():
    with pytest.raises(TaskError, match="tier"):
        wtc.tasks.names(tier="bogus")
    t = Task("prev2", lambda rng, n: rng.integers(0, 2, (n, 5)), lambda x: x, seq_len=5)
    wtc.tasks.register(t, overwrite=True)
    try:
        assert wtc.tasks.names().count("prev2") == 1 and "prev2" not in wtc.tasks.names(tier="must")
        assert wtc.tasks.get("prev2") is t
    finally:
        wtc.tasks._USER.pop("prev2")


def test_trainer_run_refuses_bad_stops():
    import torch
    from wtc.errors import TrainConfigError
    from wtc.models.training import TrainConfig, Trainer
    model = torch.nn.Linear(2, 1)
    tr = Trainer(model, TrainConfig(steps=3), lambda step: torch.ones(4, 2), lambda b: model(b).square().mean(),
                 progress=False)
    for kw in ({"stop_after": -1}, {"stop_after": 0}, {"budget_s": float("nan")}, {"budget_s": -1}):
        with pytest.raises(TrainConfigError):
            tr.run(**kw)


def test_checkpoint_metadata_that_is_not_an_object_is_refused(tmp_path):
    from wtc.dt import checkpoint
    from wtc.errors import CheckpointError
    checkpoint.save(_frozen_dt(), tmp_path / "m")
    (tmp_path / "m" / "model.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        checkpoint.load(tmp_path / "m")

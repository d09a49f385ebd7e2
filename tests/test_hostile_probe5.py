"""Hostile-input probe 5 ("Trust, round 5", part A): the cases it found, as regression tests. Each
asserts the error type (a WtcError) and that the message names the problem, or the right answer
where the input is legitimate."""
import numpy as np
import pytest
import torch

import wtc
from wtc.errors import SRError, TaskError, WtcError

RNG = np.random.default_rng(0)
X_REC = RNG.integers(0, 10, (200, 6))              # recorded inputs with enough distinct sequences
Y_REC = np.cumsum(X_REC, axis=1) % 7


def _task(target, sample=None):
    sample = sample or (lambda rng, n: rng.integers(0, 2, (n, 4)))
    return wtc.Task("probe5", sample, target, seq_len=4)


# ----------------------------------------------------------------------------------- 1. not numbers
@pytest.mark.parametrize("bad, match", [
    (np.ma.masked_array(X_REC, mask=X_REC == 3), r"masked array .*filled"),
    (X_REC.astype("datetime64[s]"), "dates or durations"),
    (X_REC.astype("timedelta64[s]"), "dates or durations"),
    (X_REC.astype(str), "text or bytes"),
    (X_REC.astype(bytes), "text or bytes"),
    (X_REC.astype(str).astype(object), "text or bytes"),
    (X_REC.astype(str).tolist(), "text or bytes"),
])
def test_from_arrays_refuses_what_is_not_numbers(bad, match):
    with pytest.raises(TaskError, match=f"task 'data': inputs (is|holds).*{match}"):
        wtc.Task.from_arrays(bad, Y_REC)
    with pytest.raises(TaskError, match=match):
        wtc.Task.from_arrays(X_REC, bad)


def test_from_arrays_takes_a_masked_array_with_nothing_masked():
    a = wtc.Task.from_arrays(np.ma.masked_array(X_REC, mask=False), Y_REC)
    b = wtc.Task.from_arrays(X_REC, Y_REC)
    assert a.fingerprint() == b.fingerprint()


def test_task_refuses_a_target_or_sample_of_strings():
    t = _task(lambda x: np.where(x > 0, "1", "0"))
    with pytest.raises(TaskError, match=r"task 'probe5': target is not a numeric array: it holds text"):
        t.batch(0, 4)
    t = _task(lambda x: x, sample=lambda rng, n: rng.integers(0, 2, (n, 4)).astype(str))
    with pytest.raises(TaskError, match=r"task 'probe5': sample is not a numeric array: it holds text"):
        t.draw(0, 4)


def test_program_refuses_strings():
    import sympy as sp

    from wtc.extraction.program import ProgramInputError
    from wtc.extraction.program import build_source
    prog = wtc.Program("demo", build_source("demo", 1, 1, ["x"], [], [sp.Symbol("x") * 2]), 2, 1, 1)
    for bad in (["nan", "inf"], [["nan", "inf"]], np.array([["1", "2"]], dtype=object)):
        with pytest.raises(ProgramInputError, match="is not a numeric array: it holds text"):
            prog(bad)
    np.testing.assert_array_equal(prog([[1.0, 2.0]]), [[2.0, 4.0]])


@pytest.mark.parametrize("X", [["1", "2"] * 5, np.array(["1", "2"] * 5, dtype=object), [b"1"] * 10])
def test_sr_fit_refuses_lists_and_object_arrays_of_text(X):
    import wtc.sr as sr
    with pytest.raises(SRError, match="X is not a numeric array: it holds text"):
        sr.fit(X, np.arange(10.0))
    with pytest.raises(SRError, match="y is not a numeric array: it holds text"):
        sr.fit(np.arange(10.0), X)


# ----------------------------------------------------------------------------------- 2. tensors with grad
def test_tensors_that_require_grad_are_read_as_data():
    xt = torch.tensor(X_REC, dtype=torch.float64, requires_grad=True)
    yt = torch.tensor(Y_REC, dtype=torch.float64, requires_grad=True)
    assert wtc.Task.from_arrays(xt, yt).fingerprint() == wtc.Task.from_arrays(X_REC, Y_REC).fingerprint()
    w = torch.ones((), requires_grad=True)
    t = _task(lambda x: torch.as_tensor(x, dtype=torch.float32) * w,
              sample=lambda rng, n: torch.tensor(rng.integers(0, 2, (n, 4)), dtype=torch.float32, requires_grad=True))
    x, y = t.batch(0, 5)
    np.testing.assert_array_equal(x[..., 0], y[..., 0])


# ----------------------------------------------------------------------------------- 3. SR names, subnormals
@pytest.mark.parametrize("name", ["gamma", "beta", "EulerGamma", "Catalan", "GoldenRatio", "E", "I", "pi", "oo",
                                  "zoo", "nan", "S", "N", "O", "Q", "zeta", "Lambda"])
def test_sr_refuses_names_sympy_reads_as_its_own(name):
    import wtc.sr as sr
    X = RNG.random((40, 2))
    with pytest.raises(SRError, match=f"variable name '{name}' is reserved"):
        sr.fit(X, X[:, 0] + X[:, 1], names=("a", name))


def test_sr_keeps_plain_names():
    import wtc.sr as sr
    X = RNG.random((40, 2))
    assert sr.fit(X, X[:, 0] + X[:, 1], names=("alpha", "mass")).equation == "alpha + mass"


def test_sr_names_subnormal_inputs():
    import wtc.sr as sr
    X = RNG.random((40, 2))
    with pytest.raises(SRError, match=r"X holds subnormal values .*rescale X"):
        sr.fit(X * 1e-310, X[:, 0] + X[:, 1])


# ----------------------------------------------------------------------------------- 11. float32 resolution
def test_from_arrays_refuses_integer_outputs_float32_cannot_resolve():
    with pytest.raises(TaskError, match=r"integer outputs reach 1000000009.*2\*\*24.*subtract an offset"):
        wtc.Task.from_arrays(X_REC, X_REC + 10**9)
    with pytest.raises(TaskError, match=r"distinct inputs 1000000000.0 and 1000000001.0 are the same number in float32"):
        wtc.Task.from_arrays(X_REC + 10**9, Y_REC)
    wtc.Task.from_arrays(X_REC, X_REC + 2**23)               # exact in float32: accepted
    wtc.Task.from_arrays(X_REC, X_REC + 10**9, output="real")  # a relative tolerance: accepted



# ----------------------------------------------------------------------------------- 4, 5. proposer
def _alive(pid: int) -> bool:
    """Whether pid runs (a killed orphan may stay a zombie where PID 1 does not reap: not running)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_proposer_command_gets_no_secret_and_its_own_directory(tmp_path, monkeypatch):
    from wtc.explain.proposer import run_command
    monkeypatch.setenv("WTC_PROBE5_SECRET", "hunter2")
    monkeypatch.chdir(tmp_path)
    out = run_command("""sh -c 'echo x > F; printf "[\\"%s\\", \\"%s\\", \\"%s\\", \\"%s\\", \\"%s\\"]" "$WTC_PROBE5_SECRET" "$HOME" "$PWD" "$(env | wc -l)" "$(cat "$PWD/F")"'""",
                      ["ctx"], 10)
    secret, home, cwd, n_env, written = out
    assert secret == "" and home == cwd and cwd != str(tmp_path)
    assert written == "x"                       # the relative write landed in its own directory
    assert int(n_env) <= 5                      # PATH, HOME, LANG (and what sh itself sets: PWD, SHLVL)
    assert not (tmp_path / "F").exists()
    import os
    assert not os.path.exists(cwd)              # its directory is removed after the call


def test_proposer_children_die_with_it():
    import time

    from wtc.explain.proposer import run_command
    t0 = time.monotonic()
    pids = run_command("""sh -c 'p=""; for i in 1 2 3; do sleep 260 & p="$p $!"; done; printf "[\\"%s\\"]" "$p"'""",
                       [], 20)
    assert time.monotonic() - t0 < 10           # returned with the shell, not when the sleeps end
    pids = [int(p) for p in pids[0].split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_proposer_errors_are_one_line():
    from wtc.explain.proposer import ProposerError, ProposerTimeout, run_command
    with pytest.raises(ProposerTimeout, match=r"'sleep 30' timed out after 0.5 s"):
        run_command("sleep 30", [], 0.5)
    with pytest.raises(ProposerError, match=r"failed \(exit status 3\): oops"):
        run_command("sh -c 'echo oops >&2; exit 3'", [], 10)
    with pytest.raises(ProposerError, match="printed no JSON"):
        run_command("echo hello", [], 10)
    with pytest.raises(ProposerError, match="could not start"):
        run_command("wtc-no-such-command-probe5", [], 10)


def test_a_hung_proposer_is_given_up_after_its_first_timeout(capsys):
    from test_explain import _text, planted_model

    from wtc.explain.explainer import explain
    model = planted_model()
    search, slices = _text(8, 32, 0), [_text(4, 32, s) for s in range(1, 3)]
    weights = [("blocks.0.mlp.W_out", (0, 5)), ("blocks.0.mlp.W_out", (0, 6)), ("blocks.0.mlp.W_out", (0, 7))]
    res = explain(model, search, slices, weights=weights, proposer="sleep 30", proposer_timeout_s=0.5)
    notes = [w.note for w in res["weights"]]
    assert "timed out after 0.5 s" in notes[0]
    assert all("not asked (it timed out earlier)" in n and "timed out after" not in n for n in notes[1:])
    assert all(w.proposer == "grammar" and w.interpretable for w in res["weights"])   # the built-in search went on
    s = res["summary"]
    assert s["proposer_failures"] == 1 and "timed out after 0.5 s on weight 1 of 3" in s["proposer_gave_up"]
    assert capsys.readouterr().out.count("was not asked again") == 1
    with pytest.raises(WtcError, match="proposer_timeout_s"):
        explain(model, search, slices, weights=weights[:1], proposer="sleep 30", proposer_timeout_s=0)


def test_cli_explain_takes_a_proposer_timeout():
    from wtc.cli import build_parser
    args = build_parser().parse_args(["explain", "ckpt", "--out", "o", "--proposer", "x", "--proposer-timeout", "2.5"])
    assert args.proposer_timeout == 2.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["explain", "ckpt", "--out", "o", "--proposer-timeout", "0"])


# ----------------------------------------------------------------------------------- 6. limits, empty scans
@pytest.mark.parametrize("memory_bytes", [0, -1, 1.5, True, "1"])
def test_sandbox_refuses_memory_limits_that_are_not_positive_integers(memory_bytes):
    from wtc.errors import ArgumentError
    from wtc.explain import sandbox
    with pytest.raises(ArgumentError, match=r"memory_bytes must be a positive integer"):
        sandbox.evaluate("def predicate(tokens, pos):\n    return True", [["a"]], memory_bytes=memory_bytes)


def test_sandbox_takes_a_numpy_integer_memory_limit():
    from wtc.explain import sandbox
    out = sandbox.evaluate("def predicate(tokens, pos):\n    return tokens[pos] == 'a'", [["a", "b"]],
                           memory_bytes=np.int64(1 << 30))
    assert out.tolist() == [True, False]


def test_scan_of_a_model_without_weight_matrices_is_an_error():
    from wtc.errors import ScanError
    from wtc.scan import scan

    class BiasOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = torch.nn.Parameter(torch.arange(1.0, 6.0))

        def forward(self, tokens):
            return torch.zeros(tokens.shape + (5,)) + self.b

    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ScanError, match=r"no weight matrices to scan .*: b\); name the parameters"):
        scan(BiasOnly(), tokens, progress=False)
    assert scan(BiasOnly(), tokens, params="b", progress=False).summary()["weights_scanned"] == 5


# ----------------------------------------------------------------------------------- 8. checkpoints
def _saved_dt(directory):
    from wtc.dt import DTConfig, DiscreteTransformer, checkpoint
    checkpoint.save(DiscreteTransformer(DTConfig(), seq_len=4, replicas=2), directory)
    return directory


def _rewrite_meta(directory, **changes):
    """Edit model.json and re-digest it, as a determined user would (the digest then passes)."""
    import json

    from wtc.checkpoint_io import meta_digest
    f = directory / "model.json"
    meta = {**json.loads(f.read_text()), **changes}
    meta["_meta_sha256"] = meta_digest(meta)
    f.write_text(json.dumps(meta))


@pytest.mark.parametrize("field, value", [("replicas", -3), ("replicas", 0), ("seq_len", 2.5), ("n_outputs", True),
                                          ("config", None), ("config", {"replicas": -3})])
def test_an_edited_model_json_is_a_checkpoint_error_naming_the_field(tmp_path, field, value):
    from wtc.dt import checkpoint
    from wtc.errors import CheckpointError
    d = _saved_dt(tmp_path / "m")
    _rewrite_meta(d, **{field: value})
    with pytest.raises(CheckpointError, match=f"model.json.*{field}" if field != "config" or value is None
                       else "model.json.*replicas"):
        checkpoint.load(d)


@pytest.mark.parametrize("kind, what", [("dir", "a directory"), ("fifo", r"a FIFO \(named pipe\)"),
                                        ("loop", "a symbolic link loop"), ("broken", "a broken symbolic link"),
                                        ("missing", "checkpoint file missing")])
def test_what_stands_in_place_of_model_json_is_named(tmp_path, kind, what):
    import os

    from wtc.dt import checkpoint
    from wtc.errors import CheckpointError
    d = _saved_dt(tmp_path / "m")
    j = d / "model.json"
    j.unlink()
    {"dir": lambda: j.mkdir(), "fifo": lambda: os.mkfifo(j), "loop": lambda: os.symlink(j, j),
     "broken": lambda: os.symlink(d / "nowhere", j), "missing": lambda: None}[kind]()
    with pytest.raises(CheckpointError, match=what):
        checkpoint.load(d)


def test_train_resume_into_a_file_is_one_error(tmp_path, capsys):
    from wtc.cli import main
    (tmp_path / "checkpoints").write_text("not a directory")
    assert main(["train", "parity_last2", "--out", str(tmp_path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "checkpoints is a file, not a checkpoint directory" in err and "nothing to resume" not in err
    assert err.count("\n") == 1


# ----------------------------------------------------------------------------------- 9. ACE readouts
@pytest.mark.parametrize("readout", [lambda o: o[:, -1] - o[:, -1].mean(0), lambda o: torch.softmax(o[:, -1], 0),
                                     lambda o: o[:, -1][:3]])
def test_ace_names_a_readout_that_mixes_the_batch(readout):
    from wtc.ace import extract_core
    from wtc.errors import AceError
    from wtc.models.transformer import Transformer, TransformerConfig
    m = Transformer(TransformerConfig(n_layers=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, d_vocab=5, n_ctx=6), seed=0)
    X = torch.randint(0, 5, (32, 4), generator=torch.Generator().manual_seed(0))
    with pytest.raises(AceError, match="the readout mixes the batch"):
        extract_core(m, X, "blocks.0.hook_resid_post", readout=readout)
    core = extract_core(m, X, "blocks.0.hook_resid_post", readout=lambda o: o[:, -1] - o[:, -1].mean(-1, keepdim=True))
    assert core.rank >= 1                        # a per-row centring is fine


# ----------------------------------------------------------------------------------- 10. token files
def test_token_files_that_are_not_arrays_are_one_line_errors_without_unsafe_advice(tmp_path):
    import pickle
    import warnings

    from wtc.errors import ScanError
    from wtc.models.io import load_tokens
    (tmp_path / "text.npy").write_text("1 2 3\n4 5 6\n")
    np.save(tmp_path / "objects.npy", np.array([[1, 2]], dtype=object))
    (tmp_path / "raw.pt").write_bytes(pickle.dumps([[1, 2], [3, 4]], protocol=4))
    cases = [("text.npy", "is not a .npy array file"), ("objects.npy", "holds an array of Python objects"),
             ("raw.pt", "is not a tensor file wtc loads safely")]
    for name, match in cases:
        with warnings.catch_warnings(record=True) as caught, pytest.raises(ScanError, match=match) as err:
            warnings.simplefilter("always")
            load_tokens(tmp_path / name)
        assert not caught, [str(w.message) for w in caught]
        assert "\n" not in str(err.value) and "allow_pickle" not in str(err.value) and "weights_only=False" not in str(err.value)
    torch.save(torch.tensor([[1, 2], [3, 4]]), tmp_path / "ok.pt")
    np.save(tmp_path / "ok.npy", np.array([[1, 2], [3, 4]], dtype=np.int32))
    for name in ("ok.pt", "ok.npy"):
        assert load_tokens(tmp_path / name).tolist() == [[1, 2], [3, 4]]


def test_sr_estimator_refuses_text_too():
    from wtc.sr.estimator import SymbolicRegressor
    x = np.arange(20.0).reshape(-1, 1)
    with pytest.raises(SRError, match="X is not a numeric array: it holds text"):
        SymbolicRegressor().fit(x.astype(str), 2 * x[:, 0])
    fitted = SymbolicRegressor().fit(x, 2 * x[:, 0])
    np.testing.assert_allclose(fitted.predict(np.array([[3.0]])), [6.0])
    with pytest.raises(SRError, match="X is not a numeric array: it holds text"):
        fitted.predict(np.array([["3"]]))


def test_the_report_says_the_proposer_was_given_up():
    from wtc.explain.report import markdown
    s = {"weights_sampled": 3, "weights_scored": 3, "threshold": 0.75, "interpretable_fraction": 1.0,
         "slices": 2, "robust_fraction": 1.0, "reliability": None, "mean_heldout_score": 0.9, "search_positions": 256,
         "max_coverage": 0.5, "seconds": 1.0, "examples": [],
         "proposer_gave_up": "the proposer timed out after 0.5 s on weight 1 of 3 and was not asked again"}
    assert "- external proposer: the proposer timed out after 0.5 s on weight 1 of 3" in markdown(s, "m")
    assert "external proposer" not in markdown({**s, "proposer_gave_up": None}, "m")

"""wtc study modadd: the data split, unit-circle / frequency-mode counting on hand-built operators,
a tiny end-to-end run (summary fields, the weight-decay-0 branch, resume), bad arguments."""
import json
import math

import numpy as np
import pytest
import torch

from wtc.ace import shift_operator
from wtc.models.training import read_state
from wtc.studies.modadd import (
    ModAddStudy,
    StudyError,
    _bisect,
    _fork_epoch,
    all_pairs,
    class_means,
    run,
    split,
    unit_circle_stats,
)


@pytest.mark.parametrize("p,frac", [(7, 0.5), (13, 0.3)])
def test_split_is_seeded_disjoint_and_covers_every_pair(p, frac, rng):
    seed = int(rng.integers(2**31))
    train, test = split(p, frac, seed)
    again = split(p, frac, seed)
    assert torch.equal(train, again[0]) and torch.equal(test, again[1])
    assert len(train) == int(frac * p * p)
    assert set(train.tolist()).isdisjoint(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(p * p))
    assert not torch.equal(train, split(p, frac, seed + 1)[0])
    x, y = all_pairs(p)
    assert len({tuple(r) for r in x.tolist()}) == p * p and x.min() == 0 and x.max() == p - 1
    assert [int(v) for v in y] == [(a + b) % p for a, b in x.tolist()]


def rotation(radius, k, p):
    t = 2 * math.pi * k / p
    return radius * np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])


def block_diag(*blocks):
    n = sum(b.shape[0] for b in blocks)
    A, i = np.zeros((n, n)), 0
    for b in blocks:
        A[i:i + len(b), i:i + len(b)] = b
        i += len(b)
    return A


def test_unit_circle_fraction_and_modes_of_a_hand_built_operator():
    p = 53
    tol = math.sin(math.pi / p)
    A = block_diag(rotation(1, 3, p), rotation(1, 7, p), rotation(1, 11, p),
                   rotation(1 - 0.9 * tol, 5, p),         # inside the band: on the circle, mode 5
                   rotation(1 + 1.1 * tol, 2, p),         # just outside the band
                   rotation(0.5, 9, p),                   # well inside the disc
                   np.array([[1.0]]),                     # on the circle, but frequency 0: not a mode
                   np.array([[-0.3]]))
    ev = np.linalg.eigvals(A)
    frac, modes = unit_circle_stats(ev, p)
    assert frac == pytest.approx(9 / 14) and modes == 4
    pairs = [[e.real, e.imag] for e in ev]                   # the [re, im] form summary.json uses
    assert unit_circle_stats(pairs, p) == (frac, modes)
    assert unit_circle_stats([], p) == (None, 0)


def test_class_means_of_a_fourier_code_give_a_pure_rotation(rng):
    """Samples code (a + b) with frequencies ks plus a nuisance term in a alone that averages to
    zero over each class: the class means are exactly the Fourier code, whose shift operator is a
    rotation with eigenvalues exp(+-2 pi i k / p)."""
    p, ks = 13, [2, 5]
    x, y = all_pairs(p)
    c = y.double()
    code = torch.cat([torch.stack([torch.cos(2 * math.pi * k * c / p), torch.sin(2 * math.pi * k * c / p)], 1)
                      for k in ks], 1)
    g = torch.from_numpy(rng.standard_normal((p, code.shape[1])))
    nuisance = (g - g.mean(0))[x[:, 0]]                      # every class holds each a once
    Z = code + nuisance
    reps = class_means(Z, y, p)
    loop = torch.stack([Z[y == k].mean(0) for k in range(p)])
    torch.testing.assert_close(reps, loop)
    torch.testing.assert_close(reps, code[torch.arange(p)], rtol=0, atol=1e-12)   # rows 0..p-1: a = 0, b = c
    op = shift_operator(reps)
    assert unit_circle_stats(op["eigenvalues"], p) == (1.0, len(ks))
    assert sorted(set(op["frequency_bins"])) == ks
    with pytest.raises(StudyError, match="no analysis samples"):
        class_means(Z[y != 3], y[y != 3], p)


def test_bisect_and_fork_point():
    assert _bisect(lambda r: r >= 5, 0, 12) == 5
    assert _bisect(lambda r: r >= 0, 0, 12) == 0
    assert _bisect(lambda r: False, 0, 12) is None
    recs = [{"epoch": e, "test_acc": t} for e, t in ((0, 0.02), (10, 0.05), (20, 0.3), (30, 0.04), (40, 1.0))]
    assert _fork_epoch(recs, 0.1) == 10                      # the last one before the first rise, not epoch 30
    assert _fork_epoch(recs, 0.01) is None


def tiny(**kw):
    base = {"p": 7, "d_model": 16, "n_heads": 2, "d_mlp": 32, "batch": 8, "epochs": 20, "wd0_epochs": 10,
            "checkpoint_every": 10, "curve_every": 5, "fork_below": 1.0}
    return ModAddStudy(**{**base, **kw})


def test_tiny_run_writes_the_summary_and_the_wd0_branch(tmp_path):
    cfg = tiny()
    summary = run(cfg, tmp_path, progress=False)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["checkpoints"] == json.loads(json.dumps(summary["checkpoints"]))
    spe = on_disk["steps_per_epoch"]
    assert spe == math.ceil(int(0.5 * 49) / 8) and on_disk["n_train"] + on_disk["n_test"] == 49
    cks = on_disk["checkpoints"]
    assert [c["step"] for c in cks] == [0, 10 * spe, 20 * spe]
    for c in cks + on_disk["wd0_branch"]["checkpoints"]:
        assert isinstance(c["step"], int) and isinstance(c["rank"], int) and isinstance(c["n_modes"], int)
        assert 0 <= c["train_acc"] <= 1 and 0 <= c["test_acc"] <= 1
        assert 1 <= c["rank"] <= 6                         # centred logits: at most p - 1 directions
        assert c["unit_circle_fraction"] is None or 0 <= c["unit_circle_fraction"] <= 1
        assert 0 <= c["n_modes"] <= (7 - 1) // 2
        assert c["necessary_rank"] is None or isinstance(c["necessary_rank"], int)
    first = next((c["step"] for c in cks if c["test_acc"] >= 0.99), None)
    assert on_disk["grok_step"] == first
    wd0 = on_disk["wd0_branch"]
    assert wd0["fork_step"] == 20 * spe                    # fork_below=1.0: the last checkpoint
    assert [c["step"] for c in wd0["checkpoints"]] == [20 * spe, 30 * spe]
    assert isinstance(on_disk["seconds"], float) and on_disk["seconds"] > 0
    state = read_state(tmp_path / "checkpoints" / "wd0" / "train_state")          # the branch's latest: epoch 30
    assert state.step == 30 * spe and all(g["weight_decay"] == 0.0 for g in state.optimizer["param_groups"])
    state = read_state(tmp_path / "checkpoints" / "main" / "epoch_000020" / "train_state")   # the fork point's
    assert state.step == 20 * spe and all(g["weight_decay"] == 1.0 for g in state.optimizer["param_groups"])
    for png in ("modadd.png", "modadd_eigenvalues.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert "| main |" in (tmp_path / "report.md").read_text()


def test_resumed_training_equals_an_uninterrupted_run(tmp_path):
    short, resumed, whole = tmp_path / "a", tmp_path / "a", tmp_path / "b"
    run(tiny(epochs=10, wd0_epochs=0), short, progress=False)
    model_file = short / "checkpoints" / "main" / "epoch_000010" / "model.safetensors"
    stamp = model_file.stat().st_mtime_ns
    again = run(tiny(epochs=10, wd0_epochs=0), short, progress=False)    # nothing left to do
    assert model_file.stat().st_mtime_ns == stamp and [c["epoch"] for c in again["checkpoints"]] == [0, 10]
    a = run(tiny(epochs=20, wd0_epochs=0), resumed, progress=False)      # continues from epoch 10
    assert model_file.stat().st_mtime_ns == stamp
    b = run(tiny(epochs=20, wd0_epochs=0), whole, progress=False)
    # same weights bit for bit; the float64 spectra may differ in the last ulp (LAPACK), even between two fresh runs
    for ca, cb in zip(a["checkpoints"], b["checkpoints"], strict=True):
        assert ca.keys() == cb.keys()
        for k in ca:
            if k in ("eigenvalues", "shift_residual"):
                np.testing.assert_allclose(np.asarray(ca[k], float), np.asarray(cb[k], float), rtol=1e-9, atol=1e-12)
            else:
                assert ca[k] == cb[k], k
    from safetensors.torch import load_file
    wa = load_file(str(resumed / "checkpoints" / "main" / "epoch_000020" / "model.safetensors"))
    wb = load_file(str(whole / "checkpoints" / "main" / "epoch_000020" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wb)
    with pytest.raises(StudyError, match="d_mlp"):
        run(tiny(d_mlp=64), whole, progress=False)


@pytest.mark.parametrize("kw,field", [({"p": 2}, "p"), ({"p": 5.0}, "p"), ({"train_frac": 0.0}, "train_frac"),
                                      ({"train_frac": 1.0}, "train_frac"), ({"energy": 1.5}, "energy"),
                                      ({"d_model": 15}, "d_model"), ({"batch": 0}, "batch"),
                                      ({"analysis_samples": 50}, "analysis_samples"), ({"lr": 0.0}, "lr"),
                                      ({"weight_decay": -1.0}, "weight_decay"), ({"threads": 0}, "threads"),
                                      ({"fork_below": float("nan")}, "fork_below"), ({"epochs": True}, "epochs")])
def test_bad_arguments_are_named(kw, field):
    with pytest.raises(StudyError, match=field):
        tiny(**kw)


def test_bad_output_directory_and_cli_errors(tmp_path, capsys):
    from wtc.cli import main
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StudyError, match="not a directory"):
        run(tiny(), f, progress=False)
    assert main(["study", "modadd", "--quick", "--quiet", "--out", str(f)]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["study", "nosuch", "--out", str(tmp_path)]) == 2
    assert "modadd" in capsys.readouterr().err

"""wtc study grok-law: the log-log fits on synthetic laws, the grokking-step definition, a tiny
sweep end to end (resumed in pieces = uninterrupted, extended max_steps continues), bad configs."""
import json

import numpy as np
import pytest

from wtc.errors import StudyError
from wtc.studies import grok_law_fit, load
from wtc.studies.grok_law import GrokLawStudy, grok_steps, run


def grid(rng, noise):
    w = np.repeat([0.5, 1.0, 2.0, 4.0], 3)
    p = np.tile([23.0, 31.0, 41.0], 4)
    return w, p, 5e4 / (w * p) * np.exp(noise * rng.standard_normal(len(w)))


def test_fit_recovers_the_inverse_law_exactly_without_noise(rng):
    w, p, tau = grid(rng, 0.0)
    f = grok_law_fit.fit_all(w, p, tau)
    for k in ("omega", "p", "product"):
        assert f[f"exponent_{k}"] == pytest.approx(-1.0, abs=1e-9)
        lo, hi = f[f"ci_{k}"]
        assert hi - lo < 1e-6
    assert f["prefactor_product"] == pytest.approx(5e4, rel=1e-9)
    assert f["r2_joint"] == pytest.approx(1.0)
    assert all(v["exponent_omega"] == pytest.approx(-1.0) for v in f["per_p"].values())


def test_fit_with_noise_covers_the_true_exponents_and_separates_omega_from_p(rng):
    w, p, _ = grid(rng, 0.0)
    covered = []
    for _ in range(1000):
        tau = 7e3 * w ** -1.0 * p ** -0.5 * np.exp(0.1 * rng.standard_normal(len(w)))
        f = grok_law_fit.fit_all(w, p, tau)
        covered.append([f["ci_omega"][0] <= -1.0 <= f["ci_omega"][1], f["ci_p"][0] <= -0.5 <= f["ci_p"][1]])
    share = np.mean(covered, 0)
    # 95% intervals, 1000 fresh draws: misses ~ Binomial(1000, 0.05), 50 +- 6.9, so a share outside
    # (0.91, 0.985) has odds of about 1e-6 (200 draws at (0.88, 0.995) failed once: 0.995 is one miss);
    # 90% or 99% intervals fall outside
    assert (share > 0.91).all() and (share < 0.985).all()
    # the omega exponent is not confused with p's
    f = grok_law_fit.fit_all(w, p, 7e3 * w ** -1.0 * p ** -0.5)
    assert f["exponent_omega"] == pytest.approx(-1.0) and f["exponent_p"] == pytest.approx(-0.5)


def test_ols_without_residual_dof_or_variation():
    one = np.ones(3)
    assert grok_law_fit.ols(np.column_stack([one, [1.0, 2.0, 3.0]]), np.array([1.0, 2.0, 3.5]))["dof"] == 1
    exact = grok_law_fit.ols(np.column_stack([one[:2], [1.0, 2.0]]), np.array([1.0, 2.0]))
    assert exact["coef"] == pytest.approx([0.0, 1.0]) and exact["ci"] is None
    assert grok_law_fit.ols(np.column_stack([one, one]), np.array([1.0, 2.0, 3.0]))["coef"] is None
    f = grok_law_fit.fit_all([1.0, 2.0], [23, 23], [100.0, 50.0])      # one modulus: no p exponent
    assert f["exponent_p"] is None and f["per_p"]["23"]["exponent_omega"] == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        grok_law_fit.fit_all([1.0], [23], [0.0])


def test_grok_step_is_the_first_generalising_step_at_or_after_memorisation():
    pts = [{"step": s, "train_acc": tr, "test_acc": te} for s, tr, te in
           [(0, 0.0, 0.96), (20, 0.5, 0.2), (40, 0.995, 0.3), (60, 1.0, 0.94), (80, 1.0, 0.951), (100, 1.0, 1.0)]]
    assert grok_steps(pts, 0.99, 0.95) == (40, 80)          # step 0's lucky test accuracy precedes memorisation
    assert grok_steps(pts[:4], 0.99, 0.95) == (40, None)
    assert grok_steps(pts[:2], 0.99, 0.95) == (None, None)
    both = [{"step": 20, "train_acc": 1.0, "test_acc": 1.0}]
    assert grok_steps(both, 0.99, 0.95) == (20, 20)


TINY = dict(moduli=(7, 11), weight_decays=(1.0, 2.0), n_layers=1, d_model=16, n_heads=2, d_mlp=32, lr=1e-2,
            eval_every=10, chunk=20, test_threshold=1.0)


def test_tiny_sweep_in_pieces_equals_uninterrupted(tmp_path):
    whole = run(GrokLawStudy(**TINY, max_steps=80), tmp_path / "whole", progress=False)
    run(GrokLawStudy(**TINY, max_steps=30), tmp_path / "pieces", progress=False)
    pieces = run(GrokLawStudy(**TINY, max_steps=80), tmp_path / "pieces", progress=False)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in whole["runs"]]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in pieces["runs"]] == strip
    assert json.loads((tmp_path / "whole" / "curves.json").read_text()) == \
        json.loads((tmp_path / "pieces" / "curves.json").read_text())
    assert whole["n_runs"] == 4 and whole["n_grokked"] + whole["n_censored"] == 4
    for r in whole["runs"]:
        assert r["redundancy"] == (r["p"] - 1) // 2 and r["n_train"] == int(GrokLawStudy.train_frac * r["p"] ** 2)
        assert r["grokked"] == (r["grok_step"] is not None)
        if not r["grokked"]:
            assert r["steps_trained"] == 80
    for name in ("summary.json", "report.md", "grok_law.png"):
        assert (tmp_path / "whole" / name).stat().st_size > 0


def test_a_run_stops_once_grokked_and_its_fit_uses_it(tmp_path):
    # thresholds any network meets at once: every run "groks" at its first evaluation after memorising
    cfg = GrokLawStudy(**{**TINY, "test_threshold": 0.01}, train_threshold=0.01, max_steps=200)
    s = run(cfg, tmp_path, progress=False)
    assert s["n_grokked"] == 4
    for r in s["runs"]:
        assert r["grok_step"] is not None and r["steps_trained"] <= r["grok_step"] + cfg.chunk
    assert s["fit"]["grok"]["n"] == sum(r["grok_step"] > 0 for r in s["runs"])


def test_bad_configs_and_registry(tmp_path):
    for bad in (dict(moduli=()), dict(moduli=(3,)), dict(weight_decays=(0.0,)), dict(weight_decays=(1.0, 1.0)),
                dict(seeds=(-1,)), dict(lr=0), dict(d_model=10, n_heads=4), dict(test_threshold=1.5)):
        with pytest.raises(StudyError):
            GrokLawStudy(**bad)
    assert load("grok-law").CONFIG is GrokLawStudy
    run(GrokLawStudy(**TINY, max_steps=20), tmp_path, progress=False)
    with pytest.raises(StudyError, match="different config"):
        run(GrokLawStudy(**{**TINY, "lr": 2e-2}, max_steps=20), tmp_path, progress=False)

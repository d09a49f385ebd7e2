"""Assign-and-Add as the authors define it (bexoo/assign-and-add): the training distribution, the
exhaustive 2-var union, and their released checkpoints read into wtc (skipped without the data)."""
import math
import random

import numpy as np
import pytest
import torch

from wtc.errors import CheckpointError
from wtc.studies import assign_add_analysis as an
from wtc.tasks import assign_add as aa
from wtc.tasks.assign_add import AssignAdd

L, R = aa.PREFIX + 1, aa.PREFIX + 2


def _kinds(x):
    lv, rv = x[:, L] >= aa.VAR0, x[:, R] >= aa.VAR0
    return np.select([~lv & ~rv, lv & ~rv, ~lv & rv], [0, 1, 2], 3)


def _expected_shares(r, n_left_ok=10, n_right_ok=10):
    # per training pair: 12 0-var rows, a 1-var row per variable allowed on that side, one 2-var row
    # per variable allowed on the left kept with probability r (the authors' perm table)
    w = np.array([12, n_left_ok, n_right_ok, n_left_ok * r], float)
    return w / w.sum()


def test_authors_defaults_are_theirs():
    task = AssignAdd()
    assert task.variant == "authors" and task.r == 1.0 and task.seed == 42
    assert task.no_right == ("a", "b") and task.no_left == ("k", "l")
    assert len(task.train_pairs) == math.floor(0.7 * 59 * 59) == 2436
    # their split: random.Random(42).sample over the pairs in row-major order
    pool = [(a, b) for a in range(59) for b in range(59)]
    assert {tuple(p) for p in task.train_pairs.tolist()} == set(random.Random(42).sample(pool, 2436))
    assert len(task.var_pairs("valid")) == 10 * 10 - 8        # x in a-j, y in c-l, x != y


@pytest.mark.parametrize("r", [1.0, 0.2])
def test_training_distribution_matches_the_definitions(r):
    task = AssignAdd(r=r)
    exp = _expected_shares(r)
    if r == 1.0:
        np.testing.assert_allclose(exp, [12 / 42, 10 / 42, 10 / 42, 10 / 42])
        np.testing.assert_allclose(exp, [0.2857, 0.2381, 0.2381, 0.2381], atol=5e-5)
    else:
        assert exp[3] == pytest.approx(2 / 34) and exp[3] == pytest.approx(0.0588, abs=1e-4)
    # the row table keeps each 2-var row with probability r (binomial over 24360 rows)
    n_rows = 10 * len(task.train_pairs)
    kept = int((task.rows[:, 0] == 3).sum())
    assert abs(kept - r * n_rows) <= 4 * math.sqrt(n_rows * r * (1 - r)) + 1e-9
    np.testing.assert_allclose(task.kind_shares(), exp, atol=0.002)
    x, y = task.sample_train(np.random.default_rng(5), 40000)
    assert (aa.resolve(x) == y).all()
    share = np.bincount(_kinds(x), minlength=4) / len(x)
    np.testing.assert_allclose(share, task.kind_shares(), atol=4 * math.sqrt(0.25 / len(x)))
    # restrictions: a, b never on the right, k, l never on the left
    assert not np.isin(x[:, L], task.left_barred).any() and not np.isin(x[:, R], task.right_barred).any()
    assert set(task.left_barred.tolist()) == {aa.var_token("k"), aa.var_token("l")}
    # every resolved pair is a training pair
    ref = an.referenced_positions(x)
    rows = np.arange(len(x))
    assert task.is_train[x[rows, ref[:, 0]], x[rows, ref[:, 1]]].all()


def test_assignment_counts_and_pad_placement():
    task = AssignAdd()
    x, _ = task.sample_train(np.random.default_rng(6), 60000)
    kind = _kinds(x)
    n_assign = (x[:, : aa.PREFIX] >= aa.VAR0).sum(1)
    two = kind == 3
    # 2-var: k = max(U{1..6}, 2), so exactly 2 assignments with probability 2/6
    p2 = (n_assign[two] == 2).mean()
    assert abs(p2 - 1 / 3) < 4 * math.sqrt(2 / 9 / two.sum())
    # other kinds: U{1..6}
    np.testing.assert_allclose(np.bincount(n_assign[~two], minlength=7)[1:] / (~two).sum(), np.full(6, 1 / 6),
                               atol=0.012)
    # each of the 12 - 2k PADs independently in one of the k + 1 gaps: with k = 1 the leading PADs
    # are Binomial(10, 1/2) (mean 5, variance 2.5); a shuffled order would make them U{0..10} (variance 10)
    one = n_assign == 1
    lead = np.argmax(x[one, : aa.PREFIX] != aa.PAD, axis=1)
    assert abs(lead.mean() - 5) < 0.1 and abs(lead.var() - 2.5) < 0.3
    # k = 2: PADs before / between / after are multinomial(8; 1/3 each): each gap has mean 8/3
    k2 = n_assign == 2
    pref = x[k2, : aa.PREFIX]
    is_var = pref >= aa.VAR0
    first = np.argmax(is_var, 1)
    second = aa.PREFIX - 1 - np.argmax(is_var[:, ::-1], 1)
    gaps = np.stack([first, second - first - 2, aa.PREFIX - second - 2], 1)
    np.testing.assert_allclose(gaps.mean(0), np.full(3, 8 / 3), atol=0.08)
    np.testing.assert_allclose(gaps.var(0), np.full(3, 8 * (1 / 3) * (2 / 3)), atol=0.2)
    # the wtc-v1 layout (a shuffled order) differs measurably
    v1, _ = AssignAdd(variant="wtc-v1").sample_train(np.random.default_rng(6), 60000)
    one = (v1[:, : aa.PREFIX] >= aa.VAR0).sum(1) == 1
    assert np.argmax(v1[one, : aa.PREFIX] != aa.PAD, axis=1).var() > 6


def test_generation_is_deterministic_under_its_seed():
    a = AssignAdd(r=0.3)
    b = AssignAdd(r=0.3)
    np.testing.assert_array_equal(a.rows, b.rows)
    xa, ya = a.sample_train(np.random.default_rng(9), 512)
    xb, yb = b.sample_train(np.random.default_rng(9), 512)
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
    xc, _ = a.sample_train(np.random.default_rng(10), 512)
    assert (xa != xc).any()
    ea, eb = a.exhaustive_2var_union(), b.exhaustive_2var_union()
    for u, v in zip(ea, eb):
        np.testing.assert_array_equal(u, v)
    other = AssignAdd(r=0.3, seed=43)
    assert {tuple(p) for p in other.train_pairs.tolist()} != {tuple(p) for p in a.train_pairs.tolist()}


def test_exhaustive_union_counts_and_categories():
    task = AssignAdd()
    tokens, labels, cat = task.exhaustive_2var_union()
    n_held, n_train = len(task.heldout_pairs), len(task.train_pairs)
    assert (n_held, n_train) == (1045, 2436)
    # variable pairs, counted from the rule: left x, right y, x != y; x "bad" in k, l; y "bad" in a, b
    names = "abcdefghijkl"
    counts = [0, 0, 0]
    for x in names:
        for y in names:
            if x != y:
                counts[(x in "kl") + (y in "ab")] += 1
    assert counts == [92, 36, 4]
    sizes = [n_held * counts[0], n_train * counts[1], n_train * counts[2]]
    assert sizes == [96140, 87696, 9744] and sum(sizes) == 193580 == len(tokens)
    np.testing.assert_array_equal(np.bincount(cat), sizes)
    np.testing.assert_allclose(np.array(sizes) / sum(sizes), [0.497, 0.453, 0.050], atol=5e-4)
    assert task.union_size() == dict(zip(aa.UNION_CATEGORIES, sizes))
    assert (aa.resolve(tokens) == labels).all()
    assert (tokens[:, L] >= aa.VAR0).all() and (tokens[:, R] >= aa.VAR0).all() and (tokens[:, L] != tokens[:, R]).all()
    # each (n1, n2, x, y) exactly once, and in its category
    ref = an.referenced_positions(tokens)
    rows = np.arange(len(tokens))
    n1, n2 = tokens[rows, ref[:, 0]], tokens[rows, ref[:, 1]]
    key = ((n1 * 59 + n2) * 74 + tokens[:, L]) * 74 + tokens[:, R]
    assert len(np.unique(key)) == len(key)
    bad = np.isin(tokens[:, L], task.left_barred).astype(int) + np.isin(tokens[:, R], task.right_barred)
    seen = task.is_train[n1, n2]
    np.testing.assert_array_equal(bad[seen], cat[seen])
    assert (~seen == (cat == 0)).all() and (bad[~seen] == 0).all()
    # the authors' evaluation builder: 2-var sequences have 2-6 assignments, uniformly
    n_assign = (tokens[:, : aa.PREFIX] >= aa.VAR0).sum(1)
    np.testing.assert_allclose(np.bincount(n_assign, minlength=7)[2:] / len(n_assign), np.full(5, 0.2), atol=0.005)
    # the sampled union pool weighs the categories as the exhaustive one
    ux, uy = task.sample_union(np.random.default_rng(0), 20000)
    ref = an.referenced_positions(ux)
    rows = np.arange(len(ux))
    held = ~task.is_train[ux[rows, ref[:, 0]], ux[rows, ref[:, 1]]]
    assert abs(held.mean() - 0.4966) < 0.015 and (aa.resolve(ux) == uy).all()


def test_compose_refuses_bad_requests():
    task = AssignAdd()
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="distinct"):
        task.compose(rng, np.array([[1, 2]]), np.array([3]), np.array([62]), np.array([62]), np.array([2]))
    with pytest.raises(ValueError, match="assignments"):
        task.compose(rng, np.array([[1, 2]]), np.array([3]), np.array([62]), np.array([63]), np.array([1]))


def test_additive_fourier_fit_finds_the_additive_form_only():
    n, m = np.meshgrid(np.arange(59), np.arange(59), indexing="ij")
    n, m = n.ravel(), m.ravel()
    w = 2 * np.pi / 59
    cols = [np.cos(w * 5 * n + 0.3) + 0.5 * np.cos(w * 5 * m + 1.0) + 2.0,    # additive, k = 5
            np.cos(w * 9 * n) + np.cos(w * 9 * m + 2),                          # additive, k = 9, equal amplitudes
            np.cos(w * 5 * (n + m)),                                            # a product term: not additive
            np.random.default_rng(0).normal(size=n.size)]
    res = an.additive_fourier_fit(torch.tensor(np.stack(cols, 1)))
    assert res["alive"] == 4 and res["fit_fraction"] == 0.5
    assert res["frequency_counts"] == {5: 1, 9: 1}
    assert res["median_amplitude_ratio"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="pre-activations"):
        an.additive_fourier_fit(torch.zeros(5, 2))
    grid = an.pad_grid()
    assert (grid[:, : aa.PREFIX] == aa.PAD).all() and (aa.resolve(grid) == (n + m) % 59).all()


# ---------------------------------------------------------------- the authors' checkpoints

A = pytest.importorskip("wtc.studies.assign_add_authors")
HAVE = A.DEFAULT_DIR.is_dir() and (A.DEFAULT_DIR / A.FINAL).exists()
needs_data = pytest.mark.skipif(not HAVE, reason=f"the authors' checkpoints are not in {A.DEFAULT_DIR}")


@needs_data
def test_authors_final_model_reads_as_the_readme_says():
    """README figures (measured with wtc's metrics): 0-var held-out 0.9943, exhaustive 2-var union
    0.983 (20k subsample). Here: the exact 0-var set and a 20k uniform sample of the union."""
    torch.set_num_threads(1)
    model = A.load_checkpoint(A.DEFAULT_DIR / A.FINAL)
    assert model.unembed.W_U.shape == (128, aa.VOCAB)
    # the function is theirs: their 59 logits, and the extra 15 outputs never win nor carry mass
    state = torch.load(A.DEFAULT_DIR / A.FINAL, weights_only=True)
    task = A.authors_task()
    x, y = task.sample_union(np.random.default_rng(1), 20000)
    with torch.no_grad():
        logits = model.logits_at(torch.from_numpy(x[:256]), slice(15, 16))[:, 0]
        assert logits.softmax(-1)[:, aa.P:].max() == 0
        resid = model.run_with_cache(torch.from_numpy(x[:256]))[1]["blocks.1.hook_resid_post"][:, 15]
        torch.testing.assert_close(logits[:, : aa.P], resid @ state["unembed.W_U"] + state["unembed.b_U"],
                                   rtol=1e-4, atol=1e-4)        # float32, another summation order
    x0, y0 = task.pools(n=1)["0var_heldout"]
    acc0 = float((A.predictions(model, x0) == y0).mean())
    assert len(x0) == 1045 and abs(acc0 - 0.9943) <= 0.004             # a few sequences of 1045
    acc_u = float((A.predictions(model, x) == y).mean())
    assert abs(acc_u - 0.983) < 0.006


@needs_data
def test_authors_timeline_matches_the_readme():
    """Virtual addition 0.98 by step 3001; 1-var held-out 0.60 -> 0.96 between steps 5301 and 5401;
    restricted pools near 0.75 from 8k to 14.5k steps, 1.0 by 16k. Also the split is theirs: early
    on, training pairs are far ahead of held-out pairs."""
    torch.set_num_threads(1)
    task = A.authors_task()
    pools = task.pools(n=512)
    ck = A.checkpoints()
    acc = {s: A.pool_accuracy(A.load_checkpoint(ck[s]), pools) for s in (1001, 5301, 5401, 12001, 16001)}
    # step 1001 (measured: train 1.000, held-out 0.824): the held-out pairs of seed 42 are the ones
    # it has not seen; the "held-out" pairs of another split are mostly its training pairs (0.948)
    assert acc[1001]["0var_train"] - acc[1001]["0var_heldout"] > 0.12
    other = AssignAdd(seed=7).pools(n=1)["0var_heldout"]
    assert A.pool_accuracy(A.load_checkpoint(ck[1001]), {"h": other})["h"] > acc[1001]["0var_heldout"] + 0.08
    assert acc[5301]["1var_heldout"] < 0.75 and acc[5401]["1var_heldout"] > 0.9
    assert 0.6 < acc[12001]["1var_restricted"] < 0.9 and acc[16001]["1var_restricted"] > 0.97
    va = an.virtual_addition(A.load_checkpoint(ck[3001]), pools["2var_valid"][0])
    assert va > 0.95
    # weights: layer-2 QK identity on all 12 variables through layer-1 OV by the end (measured: 11
    # of 12 at 8001, 12 from 14501), not at initialisation; layer-1 previous-token QK on 11 of 11
    # prefix positions from step 3001 (measured), 2 at initialisation
    start, final = A.load_checkpoint(ck[1]), A.load_checkpoint(ck["final"])
    assert an.qk_identity(final)["identity_rows"] == 12 and an.qk_identity(final)["min_margin"] > 0
    assert an.qk_identity(start)["identity_rows"] < 6
    assert an.prev_token_qk(final)["prev_token_positions"] == 11
    assert an.prev_token_qk(start)["prev_token_positions"] < 6


@needs_data
def test_authors_final_model_probes_read_their_mechanism():
    """Linear probes on their final model (measured: the variable at its value slot 1.000, the sum
    after the layer-2 MLP 0.990, the sum before it 0.024, the bound value at a side 0.049) against
    the untrained model (0.52 / 0.01 / 0.01 / 0.28): layer 1 writes each value's variable into its
    slot, the sum exists only after the MLP, and values are routed to "=", not fetched to the sides."""
    from wtc.studies import assign_add_probes as probes
    from wtc.studies.assign_add import AssignAddStudy, make_model

    torch.set_num_threads(1)
    seqs = probes.probe_sequences(A.authors_task())
    final = probes.linear_probes(A.load_checkpoint(A.DEFAULT_DIR / A.FINAL), seqs)
    untrained = probes.linear_probes(make_model(AssignAddStudy()), seqs, ("var_at_value",))
    acc = {k: v["test_accuracy"] for k, v in final.items()}
    assert acc["var_at_value"] > 0.99 > 0.7 > untrained["var_at_value"]["test_accuracy"]
    assert acc["sum_at_equals"] > 0.97 and acc["sum_before_mlp"] < 0.1
    assert acc["value_at_side"] < 0.15


def test_a_bad_authors_file_is_a_checkpoint_error(tmp_path):
    p = tmp_path / "model_state_dict.pth"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable"):
        A.load_checkpoint(p)
    torch.save({"unembed.W_U": torch.zeros(128, 74), "unembed.b_U": torch.zeros(74)}, p)
    with pytest.raises(CheckpointError, match="not the authors"):
        A.load_checkpoint(p)

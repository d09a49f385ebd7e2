"""Assign-and-Add: the task generator, the analyses and the study's resume (tiny runs)."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wtc.models.training import read_state
from wtc.studies import assign_add_analysis as an
from wtc.studies import assign_add_probes as probes
from wtc.studies.assign_add import AssignAddStudy, StudyError, make_model, run
from wtc.tasks import assign_add as aa
from wtc.tasks.assign_add import AssignAdd


def _sides(tokens):
    return tokens[:, aa.PREFIX + 1], tokens[:, aa.PREFIX + 2]


def test_training_batches_are_well_formed_and_respect_the_split(rng):
    task = AssignAdd(f=0.7, r=0.3, seed=int(rng.integers(1000)), variant="wtc-v1")
    x, y = task.sample_train(rng, 4000)
    assert x.shape == (4000, aa.SEQ_LEN) and x.dtype == np.int64
    assert x.min() >= 0 and x.max() < aa.VOCAB
    assert (aa.resolve(x) == y).all()                                # every label follows from the tokens
    assert (x[:, aa.PREFIX] == aa.PLUS).all() and (x[:, aa.ANSWER_POS] == aa.EQUALS).all()
    left, right = _sides(x)
    # the resolved pair is never a held-out pair
    ref = an.referenced_positions(x)
    rows = np.arange(len(x))
    n1, n2 = x[rows, ref[:, 0]], x[rows, ref[:, 1]]
    assert task.is_train[n1, n2].all()
    # positional restrictions hold in training
    assert not np.isin(left, task.left_barred).any()
    assert not np.isin(right, task.right_barred).any()
    two = (left >= aa.VAR0) & (right >= aa.VAR0)
    assert (left[two] != right[two]).all()
    assert abs(two.mean() - 0.3) < 0.04                               # the 2-var share r
    n_assign = (x[:, : aa.PREFIX] >= aa.VAR0).sum(1)
    assert n_assign.min() >= 1 and n_assign.max() <= 6
    assert (n_assign[two] >= 2).all()
    # each variable is assigned at most once
    for row in x[:200]:
        heads = row[: aa.PREFIX][row[: aa.PREFIX] >= aa.VAR0]
        assert len(set(heads.tolist())) == len(heads)


@pytest.mark.parametrize("variant", ["authors", "wtc-v1"])
def test_surface_forms_are_fresh_every_batch(variant):
    task = AssignAdd(variant=variant)
    a, _ = task.sample_train(np.random.default_rng(1), 256)
    b, _ = task.sample_train(np.random.default_rng(2), 256)
    assert len({r.tobytes() for r in a} & {r.tobytes() for r in b}) < 5


@pytest.mark.parametrize("variant", ["authors", "wtc-v1"])
def test_pools_cover_the_held_out_pairs_and_the_restricted_positions(variant):
    task = AssignAdd(seed=3, variant=variant)
    pools = task.pools(n=256)
    x, y = pools["0var_heldout"]
    pairs = {tuple(p) for p in np.stack(_sides(x), 1).tolist()}
    assert pairs == {tuple(p) for p in task.heldout_pairs.tolist()} and len(x) == len(task.heldout_pairs)
    n_train = int(0.7 * 59 * 59) if variant == "authors" else round(0.7 * 59 * 59)     # floor vs round
    assert len(task.heldout_pairs) == 59 * 59 - n_train
    for name, (px, py) in pools.items():
        assert (aa.resolve(px) == py).all(), name
    left, right = _sides(pools["2var_restricted2"][0])
    assert np.isin(left, task.left_barred).all() and np.isin(right, task.right_barred).all()
    left, right = _sides(pools["1var_restricted"][0])
    assert (np.isin(left, task.left_barred) | np.isin(right, task.right_barred)).all()
    held = pools["2var_heldout"][0]
    ref = an.referenced_positions(held)
    rows = np.arange(len(held))
    assert not task.is_train[held[rows, ref[:, 0]], held[rows, ref[:, 1]]].any()
    if variant == "wtc-v1":
        assert len(pools["2var_union"][0]) == sum(len(pools[k][0]) for k in aa.TWO_VAR_POOLS)
    else:                                    # a sample of the exhaustive union: no in-distribution part
        ux = pools["2var_union"][0]
        ref = an.referenced_positions(ux)
        rows = np.arange(len(ux))
        seen = task.is_train[ux[rows, ref[:, 0]], ux[rows, ref[:, 1]]]
        barred = np.isin(_sides(ux)[0], task.left_barred) | np.isin(_sides(ux)[1], task.right_barred)
        assert not (seen & ~barred).any() and not (~seen & barred).any()


@pytest.mark.parametrize("kwargs, match", [({"f": 0.0}, "training fraction"), ({"r": 1.5}, "keep-probability"),
                                           ({"r": 1.5, "variant": "wtc-v1"}, "2-var share"),
                                           ({"variant": "v9"}, "variant"),
                                           ({"no_left": ("a",), "no_right": ("a",)}, "both sides"),
                                           ({"no_left": ("z",)}, "a-l")])
def test_bad_task_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AssignAdd(**kwargs)


def test_constant_twin_keeps_the_label_and_has_no_variables_in_the_core(rng):
    task = AssignAdd()
    x, y = task.sample_train(rng, 500)
    twin = an.constant_twin(x)
    assert (aa.resolve(twin) == y).all()
    assert (twin[:, aa.PREFIX + 1: aa.PREFIX + 3] < aa.P).all()
    assert (twin[:, : aa.PREFIX] == x[:, : aa.PREFIX]).all()


def test_frequency_analysis_finds_planted_frequencies():
    a, b = np.meshgrid(np.arange(59), np.arange(59), indexing="ij")
    a, b = a.ravel(), b.ravel()
    w = 2 * np.pi / 59
    noise = np.random.default_rng(0).normal(size=a.size)
    cols = [np.cos(w * 5 * (a + b) + 0.3), np.sin(w * 5 * (a - b)), np.cos(w * 7 * a) + np.cos(w * 7 * b),
            noise, np.zeros(a.size)]
    res = an.frequency_analysis(torch.tensor(np.stack(cols, 1)))
    assert res["alive"] == 4 and res["single_frequency"] == 3
    assert res["frequency_counts"] == {5: 2, 7: 1}
    assert res["key_frequencies"] == [5]          # a key frequency needs at least two neurons
    with pytest.raises(ValueError, match="pre-activations"):
        an.frequency_analysis(torch.zeros(10, 3))


def test_phases_finds_a_jump_and_ignores_a_plateau():
    curve = [{"step": s, "acc": 0.3 if s < 5000 else (0.95 if s >= 5500 else 0.6), "flat": 0.5}
             for s in range(0, 10001, 250)]
    found = an.phases(curve, ["acc", "flat"], window=1000, jump=0.2)
    assert len(found) == 1
    p = found[0]
    assert p["metric"] == "acc" and 4000 <= p["start_step"] <= 5000 and 5500 <= p["end_step"] <= 6000
    assert p["steepest_step"] in (5000, 5500)


def test_logits_at_equals_the_full_forward_and_the_model_has_no_biases():
    model = make_model(AssignAddStudy()).double()
    assert not any(n.split(".")[-1].startswith("b_") for n, _ in model.named_parameters())
    assert "blocks.0.mlp.W_in" not in dict(model.named_parameters())
    x = torch.from_numpy(AssignAdd().sample_train(np.random.default_rng(0), 32)[0])
    torch.testing.assert_close(model.logits_at(x, slice(15, 16)), model(x)[:, 15:16], rtol=1e-12, atol=1e-12)


def test_authors_model_init_is_their_hooked_transformer_with_59_outputs():
    """model_init "authors": every weight N(0, 0.64 / d_model) (TransformerLens's gpt2 init), the 15
    non-number outputs zero weights and bias NEG, so the loss is the 59-way cross-entropy; "wtc-v1"
    is the Transformer's own init, unchanged."""
    from wtc.models import Transformer
    from wtc.studies.assign_add_authors import NEG

    model = make_model(AssignAddStudy(seed=5))
    std = 0.8 / 128 ** 0.5
    for name, p in model.named_parameters():
        w = (p[:, :aa.P] if name == "unembed.W_U" else p).detach()
        assert abs(float(w.std()) / std - 1) < 0.06, name
        assert abs(float(w.mean())) < 0.2 * std, name
    assert (model.unembed.W_U[:, aa.P:] == 0).all() and (model.unembed.b_U[aa.P:] == NEG).all()
    assert (model.unembed.b_U[:aa.P] == 0).all()
    again, other = make_model(AssignAddStudy(seed=5)), make_model(AssignAddStudy(seed=6))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(model.embed.W_E, other.embed.W_E)
    x, y = (torch.from_numpy(a) for a in AssignAdd().sample_train(np.random.default_rng(1), 64))
    logits = model.double().logits_at(x, slice(15, 16))[:, 0]
    torch.testing.assert_close(F.cross_entropy(logits, y), F.cross_entropy(logits[:, :aa.P], y), rtol=1e-12, atol=0)
    assert int(logits.argmax(-1).max()) < aa.P
    v1 = make_model(AssignAddStudy(seed=5, model_init="wtc-v1"))
    ref = Transformer(v1.cfg, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(v1.state_dict().values(), ref.state_dict().values()))


def test_routing_rates_read_the_attention_patterns():
    """With the attention patterns forced to the ideal routing, both rates are 1."""
    task = AssignAdd()
    x, _ = task.sample_train(np.random.default_rng(0), 64)
    model = make_model(AssignAddStudy())
    vals = an.value_positions(x)
    ref = an.referenced_positions(x)

    def ideal_l1(out, hook):
        p = torch.zeros_like(out)
        for i in range(len(x)):
            for t in range(16):
                p[i, 0, t, t - 1 if vals[i, t] else t] = 1.0
        return p

    def ideal_l2(out, hook):
        p = out.clone()
        p[:, 0, 15] = 0
        for i in range(len(x)):
            p[i, 0, 15, ref[i, 0]] = 0.6
            p[i, 0, 15, ref[i, 1]] = 0.4
        return p

    with model.hooks([(an.L1_PATTERN, ideal_l1), (an.L2_PATTERN, ideal_l2)]):
        r = an.routing(model, x)
    assert r["l1_prev_token_rate"] == 1.0 and r["l2_value_routing_rate"] == 1.0
    assert r["l2_value_attention_mass"] == pytest.approx(1.0)
    plain = an.routing(model, x)                     # an untrained model routes nowhere in particular
    assert plain["l2_value_routing_rate"] < 0.5


def test_virtual_addition_matches_a_real_forward_when_routing_is_ideal():
    """value_vectors: with layer-2 attention split 1/2-1/2 over the two values, the real MLP input at
    '=' differs from the virtual one only by the deviations of the actual residuals from their means."""
    task = AssignAdd()
    x, _ = task.sample_train(np.random.default_rng(0), 256)
    model = make_model(AssignAddStudy()).double()
    v, r_eq = an.value_vectors(model, x)
    assert v.shape == (59, 128) and r_eq.shape == (128,)
    attn = model.blocks[1].attn
    _, cache = model.run_with_cache(torch.from_numpy(x))
    resid = cache[an.L2_RESID_PRE]
    rows, cols = np.nonzero(an.value_positions(x))
    direct = (resid[rows, cols] @ attn.W_V[0] + attn.b_V[0]) @ attn.W_O[0]      # the head's per-position output
    torch.testing.assert_close(direct.mean(0), v[torch.from_numpy(x[rows, cols])].mean(0), rtol=1e-9, atol=1e-9)
    acc = an.virtual_addition(model, x)
    assert 0.0 <= acc <= 1.0


@pytest.mark.parametrize("variant", aa.VARIANTS)
def test_probe_rows_read_the_labels_the_sequences_define(variant):
    task = AssignAdd(variant=variant)
    seqs = probes.probe_sequences(task, n_train=300, n_test=200)
    test_pairs = {tuple(p) for p in task.heldout_pairs}
    for name, x in seqs.items():
        labels = aa.resolve(x)
        assert (labels >= 0).all()
        read = {probe: probes.rows(probe, x) for probe in probes.PROBES}
        for i, seq in enumerate(x[:60]):                      # the environment read token by token
            env = {int(seq[t]): int(seq[t + 1]) for t in range(aa.PREFIX - 1)
                   if seq[t] >= aa.VAR0 and seq[t + 1] < aa.P}
            n, m = (int(v) if v < aa.P else env[int(v)] for v in seq[aa.PREFIX + 1:aa.PREFIX + 3])
            if name == "test":
                assert (n, m) in test_pairs                  # the test rows use held-out pairs
            for probe in probes.PROBES:
                seq_i, pos, lab = read[probe]
                got = {(int(q), int(l)) for s_, q, l in zip(seq_i, pos, lab) if s_ == i}
                want = {"var_at_value": {(t + 1, int(seq[t]) - aa.VAR0) for t in range(aa.PREFIX - 1)
                                         if seq[t] >= aa.VAR0 and seq[t + 1] < aa.P},
                        "value_at_side": {(q, env[int(seq[q])]) for q in (aa.PREFIX + 1, aa.PREFIX + 2)
                                          if seq[q] >= aa.VAR0},
                        "operand_at_equals": {(aa.ANSWER_POS, n)},
                        "sum_before_mlp": {(aa.ANSWER_POS, (n + m) % aa.P)},
                        "sum_at_equals": {(aa.ANSWER_POS, (n + m) % aa.P)}}[probe]
                assert got == want, (probe, aa.decode(seq))
    assert {len(np.unique(x[:, aa.PREFIX + 1][x[:, aa.PREFIX + 1] >= aa.VAR0])) for x in seqs.values()} == {12}


def test_study_defaults_are_the_authors_run():
    cfg = AssignAddStudy()
    assert (cfg.variant, cfg.model_init, cfg.steps, cfg.checkpoint_every, cfg.eval_every) == \
        ("authors", "authors", 40000, 100, 100)
    assert (cfg.lr, cfg.weight_decay, cfg.batch, cfg.r, cfg.f) == (1e-3, 0.02, 512, 1.0, 0.7)
    assert cfg.no_right == ("a", "b") and cfg.no_left == ("k", "l")
    assert len(cfg.sweep_f) >= 6 and len(cfg.sweep_r) >= 6
    assert (cfg.sweep_steps, cfg.sweep_level) == (30000, 0.9)       # the authors' sweep length (train.py MAX_STEPS)
    task = cfg.task()
    assert task.seed == 42 and task.variant == "authors"
    v1 = AssignAddStudy(variant="wtc-v1", seed=3).task()
    assert (v1.r, v1.no_right, v1.no_left, v1.seed) == (0.25, ("a", "b", "c"), ("d", "e", "f"), 3)


def _tiny(**kw):
    base = dict(steps=30, eval_every=10, checkpoint_every=10, sweep_steps=0, pool_size=32, threads=1,
                d_model=16, d_mlp=32)
    return AssignAddStudy(**{**base, **kw})


def test_study_resume_reproduces_an_uninterrupted_run(tmp_path):
    straight = run(_tiny(sweep_steps=10, sweep_f=(0.5,), sweep_r=()), tmp_path / "a", progress=False)
    sw = straight["sweeps"]
    assert [(p["panel"], p["f"], p["steps"], p.get("main_run", False)) for p in sw] == \
        [("f", 0.5, 10, False), ("f", 0.7, 10, True), ("r", 0.7, 10, True)]
    assert [(p["steps_run"], p["reached_at"]) for p in sw] == [(10, None)] * 3      # a tiny run: no level reached
    assert straight["sweep_thresholds"]["f"] == {"metric": "0var_heldout", "level": 0.9, "reached": [],
                                                 "not_reached": [0.5, 0.7], "bracket": [0.7, None],
                                                 "failed_above": [], "monotone": True}
    assert "acc_2var_union_exhaustive" not in sw[2]           # the main run's step 10 is not its end
    assert straight["targets_met"] == {"0var_heldout": False, "2var_union": False}
    run(_tiny(steps=20), tmp_path / "b", progress=False)
    resumed = run(_tiny(), tmp_path / "b", progress=False)
    sa = read_state(tmp_path / "a/train_state")
    wa = sa.optimizer                                                       # both at step 30
    wb = read_state(tmp_path / "b/train_state").optimizer
    assert (sa.model_state["unembed.W_U"][:, aa.P:] == 0).all()             # trained, still the 59-way head
    for k in wa["state"]:
        torch.testing.assert_close(wa["state"][k]["exp_avg"], wb["state"][k]["exp_avg"], rtol=0, atol=0)
    assert straight["pools"] == resumed["pools"]
    s = json.loads((tmp_path / "b/summary.json").read_text())
    assert s["variant"] == "authors" and s["config"]["no_left"] == ["k", "l"] and s["config"]["r"] == 1.0
    ue = s["union_exhaustive"]
    assert ue["union_n"] == 193580 and s["acc_2var_union_exhaustive"] == ue["acc_2var_union_exhaustive"]
    assert ue["acc_2var_union_exhaustive"] == pytest.approx(
        sum(ue[f"union_{c}"] * ue[f"union_{c}_n"] for c in aa.UNION_CATEGORIES) / ue["union_n"])
    for key in ("acc_0var_heldout", "acc_2var_union", "acc_2var_union_exhaustive", "steps", "seconds", "phases", "l1_prev_token_rate",
                "l2_value_routing_rate", "key_frequencies"):
        assert key in s
    assert s["steps"] == 30 and [c["step"] for c in json.loads((tmp_path / "b/curve.json").read_text())] == \
        [0, 10, 20, 30]
    assert (tmp_path / "b/assign_add.png").exists() and (tmp_path / "b/report.md").exists()
    assert set(s["probes"]["final"]) == set(probes.PROBES)
    assert [t["step"] for t in s["probes"]["timeline"]] == [0, 10, 20, 30]
    assert all(0 <= r["test_accuracy"] <= 1 and r["n_test"] > 0 for r in s["probes"]["final"].values())
    ws = s["weight_scan"]
    assert sum(v["share"] for v in ws["per_matrix"].values()) == pytest.approx(1.0)
    assert "blocks.0.mlp.W_in" not in ws["per_matrix"] and ws["per_matrix"]["unembed.W_U"]["estimated"] is False
    assert ws["top"][0]["total_kl"] >= ws["top"][-1]["total_kl"] > 0
    with pytest.raises(StudyError, match="different config"):
        run(_tiny(f=0.6), tmp_path / "b", progress=False)


def test_a_sweep_point_stops_at_its_panels_level_and_thresholds_bracket_it(tmp_path):
    """A sweep point stops at the first evaluation where its panel's accuracy reaches sweep_level
    (a rerun reuses it; another level trains it on); an r point carries the exhaustive union of the
    model it ends with; the threshold bracket sits between the values that failed and succeeded."""
    import wtc.studies.assign_add as A

    cfg = _tiny(sweep_steps=30, sweep_f=(0.5,), sweep_r=(0.5,), steps=10, sweep_level=1e-9)   # met at once
    rec = A._sweep_point(tmp_path, cfg, "f", 0.5, progress=False)
    assert (rec["panel"], rec["metric"], rec["f"], rec["r"]) == ("f", "0var_heldout", 0.5, 1.0)
    assert (rec["steps_run"], rec["reached_at"], rec["reached_at_exact"], rec["step"]) == (10, 10, True, 10)
    assert A._sweep_point(tmp_path, cfg, "f", 0.5, progress=False) == rec
    more = A._sweep_point(tmp_path, replace(cfg, sweep_level=1.0), "f", 0.5, progress=False)   # never met
    assert (more["steps_run"], more["reached_at"], more["level"]) == (30, None, 1.0)
    back = A._sweep_point(tmp_path, cfg, "f", 0.5, progress=False)     # trained past the level by the other rule:
    assert (back["steps_run"], back["reached_at"], back["step"]) == (30, 10, 10)   # read where it reached it
    assert back["0var_heldout"] == rec["0var_heldout"]
    rp = A._sweep_point(tmp_path, cfg, "r", 0.5, progress=False)
    assert (rp["panel"], rp["metric"], rp["f"], rp["r"], rp["steps_run"]) == ("r", "2var_union", 0.7, 0.5, 10)
    assert 0 <= rp["acc_2var_union_exhaustive"] <= 1
    pts = [{"panel": "f", "f": f, "r": cfg.r, "reached_at": (100 if f >= 0.3 else None)} for f in (0.1, 0.2, 0.3, 0.5)]
    pts += [{"panel": "r", "f": cfg.f, "r": r, "reached_at": (100 if r in (0.2, 0.5) else None)} for r in (0.0, 0.1, 0.2, 0.5)]
    th = A.thresholds(pts, cfg)
    assert th["f"]["bracket"] == [0.2, 0.3] and th["r"]["bracket"] == [0.1, 0.2]
    assert th["r"]["not_reached"] == [0.0, 0.1] and th["f"]["metric"] == "0var_heldout"
    assert th["r"]["monotone"] and th["r"]["failed_above"] == []
    # a point stuck above a success (seen: r 0.5 failed at 30k steps where 0.3 and 1.0 generalised)
    # keeps the bracket where the lowest success puts it and says the panel is not monotone
    stuck = [{**p, "reached_at": None} if p["panel"] == "r" and p["r"] == 0.5 else p for p in pts]
    stuck.append({"panel": "r", "f": cfg.f, "r": 1.0, "reached_at": 200})
    th = A.thresholds(stuck, cfg)["r"]
    assert th["bracket"] == [0.1, 0.2] and th["failed_above"] == [0.5] and not th["monotone"]
    assert th["not_reached"] == [0.0, 0.1, 0.5] and th["reached"] == [0.2, 1.0]


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"eval_every": 7, "checkpoint_every": 10}, {"r": 2.0},
                                    {"sweep_f": (1.5,)}, {"sweep_r": (-0.1,)}, {"variant": "v2"},
                                    {"no_left": ("a",)}, {"sweep_level": 0.0}, {"sweep_level": True},
                                    {"sweep_f": (0.7,)}, {"sweep_r": (1.0,)}])
def test_bad_study_config_is_refused(kwargs):
    with pytest.raises(StudyError):
        _tiny(**kwargs)

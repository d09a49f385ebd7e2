"""wtc study core-inflation: the log-spaced schedule, a tiny run end to end, a run interrupted and
resumed (and extended) equals an uninterrupted one, bad configs."""
import pytest

from wtc.errors import StudyError
from wtc.models.training import read_state
from wtc.studies import load
from wtc.studies.core_inflation import CoreInflationStudy, run, run_until, schedule

TINY = dict(p=7, n_layers=1, d_model=16, n_heads=2, d_mlp=32, lr=1e-2, batch=8, first=4, per_decade=3,
            save_every=7)


def test_schedule_is_log_spaced_and_independent_of_the_length():
    s = schedule(100, 4, 10000)
    assert s[:2] == [0, 100] and s[-1] == 10000
    ratios = [b / a for a, b in zip(s[1:-1], s[2:-1])]
    assert all(abs(r - 10 ** 0.25) < 0.02 for r in ratios)
    assert [x for x in schedule(100, 4, 30000) if x <= 10000][:-1] == s[:-1]   # only the last point moves
    assert schedule(5, 2, 3) == [0, 3]


def strip(s):
    """The records, floats to 1e-12 (the weights are exact; a least-squares fit in the analysis can
    differ in its last bit between processes)."""
    return [{k: pytest.approx(v, rel=1e-12, abs=1e-15) if isinstance(v, float) else v for k, v in r.items()}
            for r in s["records"]]


def test_interrupted_and_extended_runs_equal_an_uninterrupted_one(tmp_path):
    whole = run(CoreInflationStudy(**TINY, steps=60), tmp_path / "whole", progress=False)
    part = run_until(CoreInflationStudy(**TINY, steps=60), tmp_path / "pieces", 23, progress=False)
    assert part["steps_trained"] == 23 and not part["finished"]
    assert read_state(tmp_path / "pieces" / "train_state").step == 23
    done = run(CoreInflationStudy(**TINY, steps=60), tmp_path / "pieces", progress=False)
    assert done["finished"] and done["records"] == strip(whole)
    # extension: 30 then 60 updates; the schedule is the same, 30 (the first run's last) is extra
    run(CoreInflationStudy(**TINY, steps=30), tmp_path / "ext", progress=False)
    ext = run(CoreInflationStudy(**TINY, steps=60), tmp_path / "ext", progress=False)
    assert [r for r in ext["records"] if r["step"] != 30] == strip(whole)
    assert [r["step"] for r in whole["records"]] == schedule(4, 3, 60)
    for r in whole["records"]:
        assert 0 <= r["rank"] <= r["max_rank"] <= 6 and r["max_rank"] >= 1
        for k in ("sufficient_rank", "necessary_rank"):
            assert r[k] is None or 0 <= r[k] <= r["max_rank"]
    for name in ("summary.json", "report.md", "inflation.png"):
        assert (tmp_path / "whole" / name).stat().st_size > 0


def test_summary_reads_ranks_after_grokking():
    from wtc.studies.core_inflation import summarise

    def rec(step, test, nec):
        return {"step": step, "epoch": step, "train_acc": 1.0, "test_acc": test, "rank": nec, "sufficient_rank": 4,
                "necessary_rank": nec, "n_modes": 2}
    s = summarise(CoreInflationStudy(steps=500), [rec(0, 0.1, 40), rec(100, 0.995, 6), rec(300, 1.0, 18),
                                                   rec(500, 1.0, 24), rec(700, 1.0, 30)])
    assert s["grok_step"] == 100 and s["final"]["step"] == 500 and s["necessary_growth"] == 4.0
    assert s["after_grok"]["necessary_rank"] == {"min": 6, "max": 24}
    assert s["after_grok"]["sufficient_rank"] == {"min": 4, "max": 4}


def test_bad_configs_and_a_changed_config(tmp_path):
    for bad in (dict(steps=0), dict(first=0), dict(per_decade=0), dict(p=2), dict(weight_decay=-1.0),
                dict(train_frac=0.0), dict(d_model=10, n_heads=4)):
        with pytest.raises(StudyError, match="CoreInflationStudy"):
            CoreInflationStudy(**bad)
    assert load("core-inflation").CONFIG is CoreInflationStudy
    run(CoreInflationStudy(**TINY, steps=8), tmp_path, progress=False)
    with pytest.raises(StudyError, match="different config"):
        run(CoreInflationStudy(**{**TINY, "lr": 2e-2}, steps=8), tmp_path, progress=False)

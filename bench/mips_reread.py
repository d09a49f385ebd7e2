"""Read the MIPS suite's saved models again with this engine: what a change to extraction changes,
without training anything.

    python bench/mips_reread.py DIR [DIR ...] [--tasks A,B] [--out DIR] [--seed 0]

DIRs are suite result directories (bench/results/mips/...), later ones overriding earlier ones
per task as `mips_suite.py --table --latest` merges them. For every task whose directory holds its
best model (model/), the model is loaded, read out (wtc.extract) and the program verified as
discover verifies it (wtc.verify: fresh draws at T, 2T and 4T, exhaustive where the alphabet is
small); one JSON per task under --out (a rerun skips finished tasks), then a table of the recorded
verdict beside the new one, with the reading of the outputs. Nothing is trained, so a task that
changes here changes because of the reading alone.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "mips"


def reread(task_dir: Path, name: str, seed: int) -> dict:
    import wtc
    from wtc.tasks import mips

    task = mips.get(name)
    model = wtc.load(task_dir / "model")
    t0 = time.perf_counter()
    program = wtc.extract(model, task)
    read_s = time.perf_counter() - t0
    v = wtc.verify(program, task, seed=seed)
    outputs = [r.finding for r in program.readings if r.module.startswith("output")]
    return {"name": name, "from": str(task_dir.parent.name), "read_s": round(read_s, 1),
            "program_ok": program.ok, "solved": bool(program.ok and v.solved), "accuracy": v.accuracy,
            "holds_2T": v.holds_longer, "holds_4T": v.holds_longest,
            "exhaustive": v.exhaustive_ok, "outputs": outputs, "failures": program.failures}


def main() -> int:
    from wtc import suite

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+", help="suite result directories, later overriding earlier")
    p.add_argument("--tasks", default=None, help="comma-separated paper names (default: every task with a model)")
    p.add_argument("--out", default=None, help="where the per-task results go (default bench/results/mips/reread)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    from wtc.errors import WtcError
    from wtc.tasks import mips

    full = suite.mips()
    try:
        rows = suite.collect(full, a.dirs, latest=True)
        for name in a.tasks.split(",") if a.tasks else []:
            mips.entry(name)                  # an unknown name is an error, with the close ones
    except WtcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = {}
    for d in map(Path, a.dirs):
        for name in rows:
            if (d / name / "model").is_dir():
                where[name] = d / name
    names = a.tasks.split(",") if a.tasks else [i.name for i in full.items if i.name in where]
    out = Path(a.out) if a.out else RESULTS / "reread"
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(json.dumps({"machine": machine(), "date": stamp()}, indent=2))
    table = ["| task | recorded | now | read s | outputs now |", "|---|---|---|---|---|"]
    changed = []
    for name in names:
        path = out / f"{name}.json"
        if not path.exists():
            if name not in where:
                print(f"{name}: no saved model in {a.dirs}", file=sys.stderr)
                continue
            path.write_text(json.dumps(reread(where[name], name, a.seed), indent=2, default=str))
        r = json.loads(path.read_text())
        before = bool(rows[name]["solved"])
        mark = "" if before == r["solved"] else " **changed**"
        if mark:
            changed.append(name)
        table.append(f"| {name} | {'solved' if before else 'no'} | {'solved' if r['solved'] else 'no'}{mark} | "
                     f"{r['read_s']} | {'; '.join(r['outputs'])} |")
        print(table[-1], flush=True)
    (out / "results.md").write_text("\n".join(table) + "\n")
    print(f"changed: {', '.join(changed) or 'none'}; table in {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

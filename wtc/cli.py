"""The `wtc` command (also `python -m wtc`)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _cmd_tasks(args) -> int:
    from wtc import tasks

    for name in tasks.names():
        t = tasks.get(name)
        print(f"{name:18s} {tasks.tier(name):8s} {t.output:8s} inputs={t.n_inputs} T={t.seq_len}  {t.description}")
    return 0


def _cmd_backends(args) -> int:
    from wtc import backends

    for b in backends():
        print(b)
    return 0


def _cmd_train(args) -> int:
    import numpy as np

    from wtc import tasks
    from wtc.dt import DTConfig, checkpoint
    from wtc.dt.train import train

    task = tasks.get(args.task)
    overrides = {k: v for k, v in (("steps", args.steps), ("replicas", args.replicas),
                                   ("max_attempts", args.attempts)) if v is not None}
    config = DTConfig(**overrides)
    out = Path(args.out) if args.out else None
    t0 = time.perf_counter()
    model, history = train(task, config, seed=args.seed, budget_s=args.budget, progress=not args.quiet,
                           checkpoint_dir=out / "checkpoints" if out else None, resume=args.resume)
    seconds = time.perf_counter() - t0
    x, y = task.batch(np.random.default_rng([args.seed, 999]), 10000)
    score = task.score(model.predict(x), y)
    metric = "accuracy" if task.output == "integer" else "max_rel_err"
    print(f"{task.name}: {metric} = {score[metric]:.6g} on 10000 fresh sequences "
          f"({'solved' if score['solved'] else 'NOT solved'}; {seconds:.1f}s, attempt {history.attempt}, "
          f"replica {history.replica})")
    live = model.structure()
    print("structure:", ", ".join(f"{k}<-{v}" for k, v in live.items()))
    if out:
        checkpoint.save(model, out / "model", extra=getattr(model, "train_info", {}))
        history.plot(out / "training.png")
        summary = {"task": task.name, "seed": args.seed, "seconds": seconds, "metric": metric,
                   "score": score, "attempt": history.attempt, "replica": history.replica,
                   "structure": live, "config": config.to_dict()}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"wrote {out}/summary.json, training.png, model/")
    return 0 if score["solved"] else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wtc", description="weights to code: Discrete Transformers read out as programs")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("tasks", help="list the built-in tasks").set_defaults(func=_cmd_tasks)
    sub.add_parser("backends", help="report native/CUDA/Triton backends").set_defaults(func=_cmd_backends)
    t = sub.add_parser("train", help="train a Discrete Transformer on a task and print its fresh-data score")
    t.add_argument("task")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--budget", type=float, default=None, help="wall-time budget in seconds")
    t.add_argument("--steps", type=int, default=None, help="annealing steps per attempt")
    t.add_argument("--replicas", type=int, default=None, help="population size per attempt")
    t.add_argument("--attempts", type=int, default=None, help="maximum attempts (populations)")
    t.add_argument("--out", default=None, help="directory for checkpoint, plot and summary.json")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoints in --out")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=_cmd_train)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, KeyError) as exc:
        from wtc.tasks import TaskError
        from wtc.dt.config import ConfigError
        from wtc.dt.checkpoint import CheckpointError
        if isinstance(exc, (TaskError, ConfigError, CheckpointError)):
            print(f"wtc: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

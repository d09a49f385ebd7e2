"""The `wtc` command (also `python -m wtc`)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from wtc import arguments
from wtc import cli_options as options
from wtc.errors import WtcError


def _cmd_tasks(args) -> int:
    from wtc import tasks

    for name in tasks.names():
        t = tasks.get(name)
        print(f"{name:18s} {tasks.tier(name):8s} {t.output:8s} inputs={t.n_inputs} T={t.seq_len}  {t.description}")
    return 0


def _cmd_backends(args) -> int:
    from wtc import backends

    print(*backends(), sep="\n")
    return 0


def _cmd_train(args) -> int:
    from wtc.dt import DTConfig, checkpoint
    from wtc.discovery import remove_replaced
    from wtc.dt.train import train

    if args.resume and not args.out:
        raise CLIError("--resume continues the checkpoints in --out: give --out DIR")
    task = options.task(args)
    overrides = {k: v for k, v in (("steps", args.steps), ("replicas", args.replicas),
                                   ("max_attempts", args.attempts)) if v is not None}
    config = DTConfig(**overrides)
    out = Path(args.out) if args.out else None
    if args.resume and (out / "checkpoints").exists() and not (out / "checkpoints").is_dir():   # one error, no note first
        raise CLIError(f"--resume: {out}/checkpoints is a file, not a checkpoint directory; move it or give another --out")
    if args.resume and not (out / "checkpoints").is_dir():
        print(f"wtc: note: nothing to resume in {out}/checkpoints; starting afresh", file=sys.stderr)
    from wtc import provenance

    t0, run = time.perf_counter(), provenance.record(task, args.seed, config)
    model, history = train(task, config, seed=args.seed, budget_s=args.budget, progress=not args.quiet,
                           checkpoint_dir=out / "checkpoints" if out else None, resume=args.resume)
    seconds = time.perf_counter() - t0
    fresh = task.score_fresh(model.predict, 10000, [args.seed, 999])
    score = fresh.score
    metric = "accuracy" if task.output == "integer" else "max_rel_err"
    print(f"{task.name}: {metric} = {score[metric]:.6g} on {fresh.describe()} "
          f"({'solved' if score['solved'] else 'NOT solved'}; {seconds:.1f}s, attempt {history.attempt}, "
          f"replica {history.replica})")
    live = model.structure()
    print("structure:", ", ".join(f"{k}<-{v}" for k, v in live.items()))
    if out:
        checkpoint.save(model, out / "model", extra=getattr(model, "train_info", {}))
        history.plot(out / "training.svg")
        remove_replaced(out)
        summary = {"task": task.name, "seed": args.seed, "seconds": seconds, "metric": metric,
                   "score": score, "attempt": history.attempt, "replica": history.replica,
                   "structure": live, **{k: v for k, v in run.to_dict().items() if k != "task"}}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"wrote {out}/summary.json, training.svg, model/")
    return 0 if score["solved"] else 1


def _cmd_discover(args) -> int:
    from wtc.threads import cores
    from wtc.worker_pool import Prestarted

    if args.all and (args.task or args.module):
        raise CLIError(f"give a TASK or --all, not both (got {args.task or args.module!r} and --all)")
    if args.suite and (args.task or args.module or args.all):
        raise CLIError("give a TASK, --all or --suite, one of them")
    for flag, value in (("--shard", args.shard), ("--tasks", args.tasks)):
        if value and not (args.all or args.suite):
            raise CLIError(f"{flag} works on a suite: give --suite NAME or --all")
    if args.all or args.suite:
        return _discover_suite(args)
    if not args.task and not args.module:
        raise CLIError("give a TASK or --all")
    task = options.task(args)
    forking = hasattr(os, "fork")      # workers forked after this import (allow_fork): none prestarted
    with Prestarted(cores() if cores() > 1 and not forking else 0, preload=("wtc.discover_job",)) as ready:
        from wtc.discovery import Discovery, DiscoveryError, discover
        if forking:
            from wtc.dt.workers import allow_fork
            allow_fork()

        if args.out:           # before the work: an output in the way fails now, not after minutes
            try:
                Discovery.check_directory(args.out)
            except DiscoveryError as exc:
                raise CLIError(str(exc).replace("save(): ", "--out: ")) from None

        d = discover(task, seed=args.seed, budget_s=args.budget, progress=not args.quiet, prestarted=ready)
    print(d.program.source if d.program is not None else "(no program)")
    print(d.verification)
    for failure in (d.program.failures if d.program is not None else []):
        print(f"  unreadable: {failure}")
    if args.out:
        d.save(args.out)
        print(f"wrote {args.out}/program.py, report.md, training.svg, summary.json, model/")
    return 0 if d.solved else 1


def _discover_suite(args) -> int:
    """--all (the built-in suite) or --suite NAME, through wtc.suite: resumable, sharded."""
    from wtc import suite

    which = suite.get(args.suite or "builtin")
    out = Path(args.out or ("discover-all" if args.all else f"discover-{which.name}"))
    rows = suite.run(which, out, seed=args.seed, budget_s=args.budget, shard=suite.parse_shard(args.shard),
                     only=args.tasks.split(",") if args.tasks else None, progress=not args.quiet)
    print((out / "results.md").read_text(), end="")
    must = [r["solved"] for r in rows if r["columns"].get("tier") == "must"] if args.all else []
    return 0 if all(must) else 1          # --all fails where a must task is not solved


def _cmd_suite_table(args) -> int:
    from wtc import suite

    which = suite.get(args.suite or suite.suite_of(args.dirs))
    out = Path(args.out or args.dirs[0])
    suite.write_table(which, args.dirs, out, latest=args.latest)
    print((out / "results.md").read_text(), end="")
    print(f"wrote {out}/results.md, results.csv, results.json")
    return 0


def _cmd_lm_train(args) -> int:
    import numpy as np

    from wtc.models import Transformer, TransformerConfig
    from wtc.models.io import save
    from wtc.models.lm import MarkovSource, train_lm

    for flag, value in (("--vocab", args.vocab), ("--seq-len", args.seq_len)):
        if value < 2:
            raise CLIError(f"{flag} must be at least 2 (a Markov stream needs two tokens and a next one), got {value}")
    if args.d_model % args.heads:
        raise CLIError(f"--d-model ({args.d_model}) must be a multiple of --heads ({args.heads}): each head gets "
                       "d_model / heads dimensions")

    cfg = TransformerConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                            d_head=args.d_model // args.heads, d_mlp=4 * args.d_model, d_vocab=args.vocab,
                            n_ctx=args.seq_len)
    model = Transformer(cfg, seed=args.seed)
    source = MarkovSource(args.vocab, args.seq_len, seed=args.seed)
    out = Path(args.out)
    state = out / "train_state"          # resumed by a rerun (wtc.models.training checkpoints it)
    try:
        losses = train_lm(model, source, args.steps, batch=args.batch, seed=args.seed, progress=not args.quiet,
                          path=state)
    except KeyboardInterrupt:
        from wtc.checkpoint_io import exists
        from wtc.models.training import read_state

        kept = f"training state at step {read_state(state).step} kept in {state}.safetensors/.json; run the " \
               "same command again to resume" if exists(state) else "nothing was checkpointed yet"
        print(f"\nwtc: interrupted: {kept}", file=sys.stderr)
        return 130
    save(model, out / "model", extra={"source": "markov", "steps": args.steps, "final_loss": losses[-1] if losses else None})
    np.save(out / "tokens.npy", source.sample(np.random.default_rng([args.seed, 1]), args.scan_sequences).numpy())
    n = sum(p.numel() for p in model.parameters())
    print(f"trained {n} weights for {args.steps} steps (loss {losses[0] if losses else float('nan'):.3f} -> "
          f"{losses[-1] if losses else float('nan'):.3f}); wrote {out}/model and {out}/tokens.npy")
    return 0


def _cmd_scan(args) -> int:
    from wtc.scan import scan, sources

    model = sources.load_model(args.checkpoint, bridge=args.bridge, device=sources.start(args.device))
    tokens = sources.load_tokens(args.tokens, model)
    params = args.params.split(",") if args.params else None
    t0 = time.perf_counter()
    try:
        result = scan(model, tokens, params=params, out=args.out, batch=args.batch, mass=args.mass,
                      progress=not args.quiet, screen=args.screen, screen_random=args.screen_random)
    except KeyboardInterrupt:
        print(f"\n{sources.interrupted(args.out, screened=args.screen is not None)}", file=sys.stderr)
        return 130
    if not sources.rank0():                  # under torchrun: rank 0 writes and says what was found
        return 0
    summary = result.summary()
    summary["seconds_total"] = round(time.perf_counter() - t0, 3)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"scanned {summary['weights_scanned']} weights in this run ({summary['weights_in_store']} in the store) "
          f"in {summary['seconds']:.1f}s; wrote {args.out}/summary.json")
    for row in summary["top_weights"][:5]:
        also = f" [{row['also_named']}; index in the stored layout]" if "also_named" in row else ""
        print(f"  {row['param']}{row['index']}: total KL {row['total_kl']:.4g}{also}")
    if result.screen is not None:
        print(f"screen (estimates, not exact): {result.screen.note}; {args.out}/screened.csv, {args.out}/screen_vs_exact.png")
    return 0


def _cmd_explain(args) -> int:
    from wtc.explain import report as explain_report
    from wtc.models import io as model_io
    from wtc.explain.corpus import build_corpus

    from pathlib import Path

    if (Path(args.checkpoint) / "config.json").is_file():        # a Hugging Face model directory
        from wtc.models import hf
        model = hf.load(args.checkpoint)
        if model.tokenizer is None:
            print(f"wtc: error: {args.checkpoint} has no tokenizer files; explain reads a Hugging Face model "
                  "through its own tokenizer", file=sys.stderr)
            return 2
    else:
        model = model_io.load(args.checkpoint)
        if model.cfg.d_vocab != 256:
            print(f"wtc: error: explain works on byte-level models (vocab 256) and Hugging Face model directories "
                  f"with a tokenizer; {args.checkpoint} has vocab {model.cfg.d_vocab}", file=sys.stderr)
            return 2
    corpus = build_corpus(root=args.text, seed=args.seed)
    effort = explain_report.QUICK if args.quick else explain_report.FULL     # --sample / --slices still win
    s = explain_report.run(model, corpus, args.out, sample=args.sample or effort.sample, seed=args.seed,
                           k=args.slices or effort.k, ctx=args.ctx, n_search=effort.n_search, n_slice=effort.n_slice,
                           candidates=effort.candidates, beam=effort.beam, max_atoms=effort.max_atoms,
                           proposer=args.proposer, progress=not args.quiet, label=str(args.checkpoint),
                           proposer_timeout_s=args.proposer_timeout)
    print(f"{s['weights_scored']} weights scored: interpretable {s['interpretable_fraction']}, robust "
          f"{s['robust_fraction']}, reliability {s['reliability']} ({s['seconds']}s); wrote {args.out}/summary.json, "
          f"report.md, explanations.json")
    if s.get("proposer_failures"):
        print(f"wtc: warning: the proposer failed for {s['proposer_failures']} of {s['weights_sampled']} weights "
              f"(first: {s.get('proposer_error')}); those weights had only the built-in predicates", file=sys.stderr)
    if s.get("proposer_gave_up"):
        print(f"wtc: warning: {s['proposer_gave_up']}", file=sys.stderr)
    return 0


def _cmd_study(args) -> int:
    """Run a registered study (wtc.studies) and print the summary figures it declares (HEADLINE)."""
    import dataclasses

    from wtc import studies

    if args.name not in studies.STUDIES:
        print(f"wtc: error: unknown study {args.name!r} (available: {', '.join(studies.names())})", file=sys.stderr)
        return 2
    study = studies.load(args.name)
    cfg = study.CONFIG.quick() if args.quick else study.CONFIG()
    if args.seed is not None:
        if "seed" not in {f.name for f in dataclasses.fields(cfg)}:
            seeds = getattr(cfg, "seeds", None)
            print(f"wtc: error: the {args.name} study runs its own seeds{f' {seeds}' if seeds else ''}; --seed "
                  "does not apply", file=sys.stderr)
            return 2
        cfg = dataclasses.replace(cfg, seed=args.seed)
    for field, value, why in (("model", args.model, "trains its own models"),
                              ("corpus", args.corpus, "has no text corpus")):
        if value is None:
            continue
        if field not in {f.name for f in dataclasses.fields(cfg)}:
            print(f"wtc: error: the {args.name} study {why}; --{field} does not apply", file=sys.stderr)
            return 2
        cfg = dataclasses.replace(cfg, **{field: value})
    out = Path(args.out or f"study-{args.name}")
    summary = study.run(cfg, out, progress=not args.quiet)

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return f"[{', '.join(fmt(x) for x in v)}]" if isinstance(v, (list, tuple)) else str(v)

    figures = ", ".join(f"{k} {fmt(v)}" for k, v in studies.headline(summary, study.HEADLINE))
    print(f"{args.name}: {figures} ({summary.get('seconds')}s); wrote {out}/{', '.join(study.OUTPUTS)}")
    return 0


class CLIError(WtcError, ValueError):
    """Command-line arguments that do not fit together."""


def _check_writable(out: Path) -> None:
    """CLIError unless `out` is (or can be made) a directory this process can write files in."""
    import tempfile

    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".wtc-write-check-"):
            pass
    except OSError as exc:
        raise CLIError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `wtc train: error: ...` and a pointer to --help (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _argument(convert, ok, what: str):
    """An argparse type: convert the text, then check it; the error names what was expected."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


_integer = _argument(int, lambda v: True, "an integer")
_seed = _argument(int, lambda v: 0 <= v < arguments.SEED_LIMIT, "a seed (a non-negative integer)")
_positive = _argument(int, lambda v: v >= 1, "a positive integer")
# nan, inf, 0 and negative budgets never stop or never start
_seconds = _argument(float, lambda v: math.isfinite(v) and v > 0, "a budget: a finite positive number of seconds")
_fraction = _argument(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="wtc", description="weights to code: Discrete Transformers read out as programs")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks for errors (also WTC_DEBUG=1)")
    p.add_argument("--version", action="version", version=options.VERSION)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("tasks", help="list the built-in tasks").set_defaults(func=_cmd_tasks)
    sub.add_parser("backends", help="report native/CUDA/Triton backends").set_defaults(func=_cmd_backends)
    t = sub.add_parser("train", help="train a Discrete Transformer on a task and print its fresh-data score")
    options.task_arguments(t)
    t.add_argument("--seed", type=_seed, default=0, help="seed of the whole run (data, init, noise; default 0)")
    t.add_argument("--budget", type=_seconds, default=None, help="wall-time budget in seconds (a new attempt "
                   "starts only if the time left covers one more)")
    t.add_argument("--steps", type=_positive, default=None, help="annealing steps per attempt")
    t.add_argument("--replicas", type=_positive, default=None, help="population size per attempt")
    t.add_argument("--attempts", type=_positive, default=None, help="maximum attempts (populations)")
    t.add_argument("--out", default=None, help="directory for checkpoint, plot and summary.json")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoints in --out")
    options.verbosity(t)
    t.set_defaults(func=_cmd_train)
    d = sub.add_parser("discover", help="train, extract and verify a program for a task (or --all)")
    options.task_arguments(d)
    d.add_argument("--all", action="store_true", help="every built-in task; writes results.md/json")
    d.add_argument("--suite", default=None, help="a task suite (mips: the 62-task MIPS benchmark); resumable, "
                   "one result per task in --out, results.md/csv/json")
    d.add_argument("--shard", default=None, metavar="I/N", help="with --suite or --all: run every N-th task from "
                   "the I-th (1-based)")
    d.add_argument("--tasks", default=None, metavar="A,B", help="with --suite or --all: only these, in this order")
    d.add_argument("--seed", type=_seed, default=0, help="seed of the whole run (data, init, noise, "
                   "verification; default 0)")
    d.add_argument("--budget", type=_seconds, default=None, help="seconds per task (default 600)")
    d.add_argument("--out", default=None, help="directory for program.py, report.md, plots, summary.json")
    options.verbosity(d)
    d.set_defaults(func=_cmd_discover)
    st = sub.add_parser("suite-table", help="one table from the result directories of a suite's shards")
    st.add_argument("dirs", nargs="+", help="result directories (written by wtc discover --suite / --all)")
    st.add_argument("--suite", default=None, help="the suite (default: the one the results name)")
    st.add_argument("--out", default=None, help="where results.md/csv/json go (default: the first directory)")
    st.add_argument("--latest", action="store_true", help="runs made one after another: a task keeps the last row")
    st.set_defaults(func=_cmd_suite_table)
    s = sub.add_parser("scan", help="per-weight ablation scan of a transformer checkpoint (resumable)")
    s.add_argument("checkpoint", help="directory written by wtc.models.io.save (or `wtc lm-train`), or a local "
                                      "Hugging Face model directory")
    s.add_argument("--tokens", required=True, help="(B, T) integer tokens, .npy or .pt; or a text file (.txt, .md, .py) "
                                                   "read through the model's own tokenizer (wtc.scan.sources)")
    s.add_argument("--params", default=None, help="comma-separated names or patterns (default: all matrices)")
    s.add_argument("--bridge", action="store_true", help="read a Hugging Face directory as a TransformerLens bridge")
    s.add_argument("--device", default=None, help="cpu (default), cuda or cuda:N; under torchrun the ranks share the work")
    s.add_argument("--out", required=True, help="directory for scan.sqlite and summary.json; rerun to resume")
    s.add_argument("--batch", type=_positive, default=None, help="ablated copies per forward (default: by memory)")
    s.add_argument("--mass", type=_fraction, default=0.9, help="KL share the importance positions hold, in (0, 1]")
    s.add_argument("--screen", type=_positive, default=None, metavar="K",
                   help="estimate every weight's KL first (wtc.scan.screen) and scan exactly only its top K plus a "
                        "random sample (screened.csv, screen_vs_exact.png)")
    s.add_argument("--screen-random", type=_positive, default=None, metavar="R",
                   help="weights drawn uniformly and scanned exactly beside the top K (default max(K, 200))")
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=_cmd_scan)
    from wtc.studies import STUDIES

    listing = "; ".join(f"{n}: {d}" for n, (_, d) in STUDIES.items())
    # help= strings are %-formatted by argparse (a "95%" in a description broke `wtc --help`)
    st = sub.add_parser("study", help=f"run a study ({listing.replace('%', '%%')}; all resumable)",
                        description=f"Studies: {listing}. All resumable.")
    st.add_argument("name", metavar="NAME", help=" | ".join(STUDIES))
    st.add_argument("--quick", action="store_true", help="fewer training steps (durations above)")
    st.add_argument("--out", default=None, help="directory for summary.json, report.md and plots (default "
                                                "study-NAME); a rerun resumes from the checkpoints there")
    st.add_argument("--seed", type=int, default=None, help="seed of the study (default: its config's, 0)")
    st.add_argument("--model", default=None, metavar="DIR", help="a local Hugging Face model directory to analyse "
                                                                 "instead of trained models (agreement)")
    st.add_argument("--corpus", default=None, choices=("graded", "uniform"),
                    help="agreement corpus: graded number evidence (default) or the uniform draw of session 7")
    st.add_argument("--quiet", action="store_true")
    st.set_defaults(func=_cmd_study)
    ex = sub.add_parser("explain", help="explain single weights of a byte-level model or a Hugging Face model (read "
                                        "through its own tokenizer) by predicates, scored by conditional "
                                        "zero-ablation on held-out text")
    ex.add_argument("checkpoint", help="directory written by wtc.models.io.save (e.g. a sparse-vs-dense model/), or "
                                       "a local Hugging Face model directory with its tokenizer files")
    ex.add_argument("--ctx", type=_positive, default=None, help="tokens per held-out window (default: the model's "
                                                                "context; at most 64 with a tokenizer)")
    ex.add_argument("--sample", type=_positive, default=None, help="weights to explain (uniform over nonzero weights; "
                                                                   "default 100, 20 with --quick)")
    ex.add_argument("--quick", action="store_true", help="a first look in a minute or two: 20 weights, half the search "
                    "text, 4 slices of 8 windows, 3 candidates, beam 5, at most 2 atoms (robust fractions are not "
                    "comparable with a full run; wtc.explain.report.QUICK)")
    ex.add_argument("--out", required=True, help="directory for summary.json, report.md, explanations.json")
    ex.add_argument("--text", default=None, help="directory of text files (default: the Python stdlib sources)")
    ex.add_argument("--slices", type=_positive, default=None, help="disjoint held-out slices for robustness "
                                                                   "(default 10, 4 with --quick)")
    ex.add_argument("--proposer", default=None, help="command proposing predicate sources (JSON contexts on stdin, "
                    "JSON list of sources on stdout). Contained, not jailed: it gets only PATH, LANG and HOME (a "
                    "fresh temporary working directory, removed after), its own process group (killed when it "
                    "returns), CPU / memory / file-size limits; it still runs as you, so it can read your files, "
                    "write where you can by absolute path and use the network. Its predicates run in the AST sandbox")
    ex.add_argument("--proposer-timeout", type=_seconds, default=60.0, metavar="SECONDS",
                    help="seconds the proposer may take per weight (default 60); after its first timeout it is not "
                         "asked again and the built-in search goes on alone")
    ex.add_argument("--seed", type=_seed, default=0)
    ex.add_argument("--quiet", action="store_true")
    ex.set_defaults(func=_cmd_explain)
    lm = sub.add_parser("lm-train", help="train a token transformer on a Markov stream (a model to scan); its training "
                                         "state in --out is checkpointed every minute and on Ctrl-C / SIGTERM, and "
                                         "a rerun of the same command resumes it")
    lm.add_argument("--layers", type=_positive, default=2)
    lm.add_argument("--d-model", type=_positive, default=128)
    lm.add_argument("--heads", type=_positive, default=4)
    lm.add_argument("--vocab", type=_positive, default=64)
    lm.add_argument("--seq-len", type=_positive, default=64)
    lm.add_argument("--steps", type=_positive, default=200)
    lm.add_argument("--batch", type=_positive, default=32)
    lm.add_argument("--scan-sequences", type=_positive, default=16, help="sequences written to tokens.npy")
    lm.add_argument("--seed", type=_seed, default=0)
    lm.add_argument("--out", required=True)
    lm.add_argument("--quiet", action="store_true")
    lm.set_defaults(func=_cmd_lm_train)
    return p


def run() -> None:
    """The `wtc` command and `python -m wtc`: main(), then exit without the interpreter's teardown.

    Every output is written and closed by then (the commands write files in `with` blocks and
    join their workers); tearing down torch and its thread pools took 1.5-2 s on a loaded 2-core
    machine, which a user waits for after the answer is printed."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:          # a closed pipe (`wtc tasks | head`): nothing more to deliver
            pass
    os._exit(code if isinstance(code, int) else 0)


def main(argv: list[str] | None = None) -> int:
    """Run the command. A user error (any wtc.WtcError, a missing or unreadable file) prints one line,
    `wtc: error: ...`, and exits with status 2; `--debug` (or WTC_DEBUG=1) shows the traceback."""
    from wtc.errors import WtcError

    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("WTC_DEBUG", "") not in ("", "0")
    if argv is None:              # run as the command: SIGTERM cleans up like Ctrl-C (workers stopped)
        import signal

        def terminate(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, terminate)
    try:
        if getattr(args, "out", None) == "":
            raise CLIError("--out must name a directory, got an empty string")
        if getattr(args, "out", None):
            _check_writable(Path(args.out))       # before the work, not after it
        with options.logging_for(args):          # progress to stderr; the results stay on stdout
            return args.func(args)
    except (WtcError, OSError) as exc:
        if debug:
            raise
        what = exc if isinstance(exc, WtcError) or not getattr(exc, "filename", None) else \
            f"{exc.strerror or exc}: {exc.filename}"
        print(f"wtc: error: {what}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("wtc: interrupted (work checkpointed so far is kept; rerun to resume where supported)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Task suites run through `discover`, resumably and in shards, and their tables.

    wtc discover --all                      the built-in tasks (suite "builtin")
    wtc discover --suite mips --shard 1/4   every 4th task of the MIPS benchmark, from the first
    wtc suite-table DIR [DIR ...]           one table from the result directories of all shards

A suite is a list of `SuiteItem`s (a task and the columns printed beside it: a tier, a paper's
published outcome). `run` discovers each task of a shard in turn and writes DIR/<task>/ (what
Discovery.save writes) and DIR/<task>/result.json (its row, written last: a task with a result is
finished, and a rerun skips it; one whose discover raised is recorded with its error and tried
again). After each task the table of everything in DIR is rewritten
(results.md, results.csv, results.json). `table` merges result directories (the shards of one
run, on one machine or several) into the same table a single run would have written.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from wtc.errors import WtcError

RESULT = "result.json"


class SuiteError(WtcError, ValueError):
    """A suite, shard or result directory that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class SuiteItem:
    """One task of a suite: `name` (also its directory), `make()` the task (a wtc.Task or a
    registered name), `columns` shown beside wtc's result (e.g. {"MIPS": True, "GPT-4": None})."""

    name: str
    make: Callable[[], object]
    columns: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    """A named list of tasks; `published`: totals a paper reports (shown under the table)."""

    name: str
    items: tuple[SuiteItem, ...]
    published: dict = field(default_factory=dict)
    note: str = ""

    def shard(self, index: int, count: int) -> list[SuiteItem]:
        """Shard `index` of `count` (1-based): the items at positions index-1, index-1+count, ..."""
        if not (isinstance(count, int) and isinstance(index, int)) or count < 1 or not 1 <= index <= count:
            raise SuiteError(f"a shard is i/n with 1 <= i <= n, got {index}/{count}")
        return list(self.items[index - 1::count])


def builtin() -> Suite:
    """wtc's built-in tasks (tiers must, stretch, wider): what `wtc discover --all` runs."""
    from wtc import tasks
    return Suite("builtin", tuple(SuiteItem(n, lambda n=n: n, {"tier": tasks.tier(n)}) for n in tasks.names()))


def mips() -> Suite:
    """The 62 tasks of the MIPS benchmark (wtc.tasks.mips), with the published outcomes."""
    from wtc.tasks import mips as m
    items = tuple(SuiteItem(e.name, e.task, {"MIPS": e.mips_solved, "GPT-4": e.gpt4_solved}) for e in m.SUITE)
    return Suite("mips", items, published={"MIPS": m.PUBLISHED["mips_solved"], "GPT-4": m.PUBLISHED["gpt4_solved"],
                                         "tasks": m.PUBLISHED["tasks"]},
                 note=f"Published outcomes: {m.PAPER}. Per task: {m.OUTCOMES_SOURCE}.")


SUITES: dict[str, Callable[[], Suite]] = {"builtin": builtin, "mips": mips}


def get(name: str) -> Suite:
    """The suite called `name` ('builtin', 'mips')."""
    if name not in SUITES:
        raise SuiteError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    return SUITES[name]()


def parse_shard(text: str | None) -> tuple[int, int]:
    """'i/n' -> (i, n); None -> (1, 1)."""
    if text is None:
        return 1, 1
    head, slash, tail = str(text).partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        raise SuiteError(f"--shard takes i/n (e.g. 2/4), got {text!r}") from None
    if not slash or count < 1 or not 1 <= index <= count:
        raise SuiteError(f"--shard takes i/n with 1 <= i <= n, got {text!r}")
    return index, count


# ---------------------------------------------------------------- failure classes
def failure_class(row: dict) -> str | None:
    """Why a task is not solved, in one of a few words (None when solved): 'error' (discover
    raised), 'no attempt finished' (the budget), 'not learned' (no replica of any attempt
    computes the task), 'not read' (a model computes it; parts could not be read as a program),
    'read wrong' (the program read does not verify on fresh data), 'fails exhaustively' (right on
    the sample, wrong on some enumerated sequence)."""
    if row.get("solved"):
        return None
    if row.get("error"):
        return "error"
    attempts = row.get("attempts") or []
    if not attempts:
        return "no attempt finished"
    learned = any(a.get("replicas_solved", 0) > 0 for a in attempts)
    if not learned:
        return "not learned"
    if row.get("accuracy") is None and row.get("max_rel_err") is None or row.get("failures"):
        return "not read"
    exhaustive = row.get("exhaustive")
    if exhaustive is not None and not exhaustive.get("solved", True):
        return "fails exhaustively"
    return "read wrong"


def body_lines(source: str | None) -> int | None:
    """Lines of the algorithm in a program's source: the statements of `program` without its
    docstring and its domain check (Program.n_lines counts the whole file, DOMAIN check included)."""
    import ast
    if not source:
        return None
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "program":
            body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))
                    and not (isinstance(b, ast.If) and isinstance(b.test, ast.Name) and b.test.id == "check_domain")]
            return sum(b.end_lineno - b.lineno + 1 for b in body)
    return None


def result_row(item: SuiteItem, suite: str, summary: dict, seed: int, source: str | None = None) -> dict:
    """The row kept for one task: discover's summary figures, the program's body lines and the
    suite's columns."""
    keep = ("task", "solved", "seconds", "program_lines", "accuracy", "max_rel_err", "agrees_with_model",
            "holds_at_twice_the_length", "holds_at_four_times_the_length", "exhaustive", "failures", "attempts",
            "budget_s", "error")
    row = {"suite": suite, "name": item.name, "seed": seed, **{k: summary.get(k) for k in keep},
           "body_lines": body_lines(source), "columns": dict(item.columns)}
    row["failure_class"] = failure_class(row)
    return row


# ---------------------------------------------------------------- running
def finished(out: Path, name: str) -> dict | None:
    """The result row of `name` in `out`, or None when it has not finished there."""
    path = Path(out) / name / RESULT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"{path}: unreadable result ({exc}); remove it to run the task again") from None


def run(suite: Suite, out, *, seed: int = 0, budget_s: float | None = None, shard: tuple[int, int] = (1, 1),
        only: Sequence[str] | None = None, progress: bool = True,
        echo: Callable[[str], None] = print) -> list[dict]:
    """Discover every task of the shard not finished in `out` yet, one after another; returns the
    rows of the shard's tasks (finished before or now). `only`: these tasks of the shard, in this
    order (the table stays the whole suite's). A task whose discover raises a wtc error gets a row
    with `error` (a rerun tries it again)."""
    from wtc import discovery            # looked up at call time: tests replace discovery.discover

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = suite.shard(*shard)
    if only is not None:
        by_name = {i.name: i for i in items}
        missing = [n for n in only if n not in by_name]
        if missing:
            raise SuiteError(f"not tasks of suite {suite.name!r} shard {shard[0]}/{shard[1]}: {', '.join(missing)}")
        items = [by_name[n] for n in dict.fromkeys(only)]
    rows = []
    for item in items:
        done = finished(out, item.name)
        if done is not None and not done.get("error"):     # an error is tried again
            if done.get("seed") != seed or done.get("suite") != suite.name:
                raise SuiteError(f"{out / item.name / RESULT} holds a result of suite {done.get('suite')!r} seed "
                                 f"{done.get('seed')}, not {suite.name!r} seed {seed}; use another --out")
            echo(f"{item.name}: finished before ({'solved' if done['solved'] else 'not solved'}); skipped")
            rows.append(done)
            continue
        try:
            d = discovery.discover(item.make(), seed=seed, budget_s=budget_s, progress=progress)
        except WtcError as exc:         # a task that cannot run is a result of the suite, not its end
            row = result_row(item, suite.name, {"task": item.name, "solved": False, "error": str(exc)}, seed)
            (out / item.name).mkdir(exist_ok=True)
            _write_json(out / item.name / RESULT, row)
            echo(f"{item.name}: error: {exc}")
            rows.append(row)
            continue
        d.save(out / item.name)
        row = result_row(item, suite.name, d.summary(), seed, d.program.source if d.program is not None else None)
        _write_json(out / item.name / RESULT, row)
        rows.append(row)
        echo(f"{item.name:26s} {'solved' if row['solved'] else 'NOT solved':10s} {row['seconds']:7.1f}s  "
             f"{row['body_lines'] or '-'} lines" + (f"  ({row['failure_class']})" if row["failure_class"] else ""))
        write_table(suite, [out], out)
    write_table(suite, [out], out)
    return rows


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


# ---------------------------------------------------------------- tables
def collect(suite: Suite, dirs, *, latest: bool = False) -> dict[str, dict]:
    """The finished rows of `suite` in the result directories `dirs` (the shards of one run), by
    task name; a task finished in two directories with other results is an error, unless `latest`
    (runs after one another, e.g. of a newer engine): then the last directory's row is kept."""
    rows: dict[str, tuple[dict, Path]] = {}
    known = {i.name for i in suite.items}
    for d in map(Path, dirs):
        if not d.is_dir():
            raise SuiteError(f"{d}: not a directory of suite results")
        for path in sorted(d.glob(f"*/{RESULT}")):
            row = finished(d, path.parent.name)
            if row.get("suite") != suite.name or row.get("name") not in known:
                raise SuiteError(f"{path}: a result of suite {row.get('suite')!r}, task {row.get('name')!r}, "
                                 f"not of suite {suite.name!r}")
            if "body_lines" not in row:          # rows written before body lines were counted: from program.py
                program = path.parent / "program.py"
                row["body_lines"] = body_lines(program.read_text()) if program.is_file() else None
            if row["name"] in rows and not latest and _comparable(rows[row["name"]][0]) != _comparable(row):
                raise SuiteError(f"{row['name']} has two different results: in {rows[row['name']][1]} and in {d}")
            rows[row["name"]] = (row, d)
    return {k: v[0] for k, v in rows.items()}


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "attempts"}


def _mark(v) -> str:
    return "?" if v is None else ("yes" if v is True else "no" if v is False else str(v))


def _exhaustive_cell(e: dict | None) -> str:
    if not e:
        return "-"
    return f"{e['agree']}/{e['sequences']} up to {e['max_length']}"


HEADER = ("task", "wtc", "seconds", "lines", "fresh accuracy", "2T", "4T", "exhaustive", "failure class")


def table_rows(suite: Suite, rows: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells, one row per task of the suite in its order ('not run' where no result)."""
    extra = list(dict.fromkeys(k for i in suite.items for k in i.columns))
    cells = []
    for item in suite.items:
        r = rows.get(item.name)
        if r is None:
            line = [item.name, "not run", "", "", "", "", "", "", ""]
        else:
            acc = r.get("accuracy")
            line = [item.name, "solved" if r["solved"] else "no", f"{r['seconds']:.0f}" if r.get("seconds") else "",
                    str(r.get("body_lines") or "-"), "-" if acc is None else f"{acc:.4f}",
                    _mark(r.get("holds_at_twice_the_length")), _mark(r.get("holds_at_four_times_the_length")),
                    _exhaustive_cell(r.get("exhaustive")), r.get("failure_class") or ""]
        cells.append(line + [_mark(item.columns.get(k)) for k in extra])
    return list(HEADER) + extra, cells


def totals(suite: Suite, rows: dict[str, dict]) -> list[str]:
    """Plain lines: how many ran and were solved by wtc, each published column's count (per task
    where every task's outcome is known, else the published total), and wtc's solved tasks among
    those a published column marks unsolved."""
    n = len(suite.items)
    solved = [i for i in suite.items if rows.get(i.name, {}).get("solved")]
    lines = [f"wtc: {len(solved)} solved of {sum(i.name in rows for i in suite.items)} run ({n} in the suite)"]
    extra = list(dict.fromkeys(k for i in suite.items for k in i.columns))
    for k in extra:
        values = [i.columns.get(k) for i in suite.items]
        if not all(isinstance(v, bool) for v in values):
            if k in suite.published:
                lines.append(f"{k}: {suite.published[k]}/{suite.published.get('tasks', n)} published "
                             "(per task unknown here)")
            continue
        lines.append(f"{k}: {sum(values)}/{n}")
        beyond = [i.name for i in solved if i.columns.get(k) is False]
        lines.append(f"wtc solved where {k} did not: {len(beyond)}" + (f" ({', '.join(beyond)})" if beyond else ""))
    return lines


def markdown(suite: Suite, rows: dict[str, dict]) -> str:
    """The table (every task of the suite, 'not run' where no result) and the totals under it."""
    header, cells = table_rows(suite, rows)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c) + " |" for c in cells]
    out += [""] + [f"- {line}" for line in totals(suite, rows)]
    if suite.note:
        out += ["", suite.note]
    return "\n".join(out) + "\n"


def csv_text(suite: Suite, rows: dict[str, dict]) -> str:
    """The table's cells as CSV (no totals)."""
    header, cells = table_rows(suite, rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(cells)
    return buf.getvalue()


def write_table(suite: Suite, dirs, out, *, latest: bool = False) -> dict[str, dict]:
    """results.md, results.csv and results.json (the rows, in suite order) in `out` from the
    result directories `dirs`; returns the rows."""
    rows = collect(suite, dirs, latest=latest)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(markdown(suite, rows))
    (out / "results.csv").write_text(csv_text(suite, rows))
    _write_json(out / "results.json", [rows[i.name] for i in suite.items if i.name in rows])
    return rows


def suite_of(dirs) -> str:
    """The suite the results in `dirs` belong to (all of them one suite)."""
    names = set()
    for d in map(Path, dirs):
        for path in Path(d).glob(f"*/{RESULT}"):
            names.add(finished(d, path.parent.name).get("suite"))
    if len(names) != 1:
        raise SuiteError("no suite results in " + ", ".join(map(str, dirs)) if not names
                         else f"results of several suites ({', '.join(sorted(map(str, names)))}); give --suite")
    return names.pop()

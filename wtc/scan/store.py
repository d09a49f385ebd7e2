"""On-disk results of a per-weight scan: one SQLite file, written chunk by chunk.

Each chunk of weights is committed in one transaction together with its "done" marker, so a
killed scan loses at most the chunk in flight, never half of one, and a resumed scan skips every
committed chunk (nothing computed twice). A scan refuses to resume into a store made for another
model, token set or configuration, naming the field that differs.

Each chunk's marker carries a sha256 of its rows, checked on resume and when a result is read,
so an edited, truncated or half-copied store is an error naming the chunk, not wrong numbers.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wtc.errors import ScanError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (param TEXT NOT NULL, start INTEGER NOT NULL, stop INTEGER NOT NULL,
                                   sha256 TEXT NOT NULL, PRIMARY KEY (param, start));
CREATE TABLE IF NOT EXISTS weights (param TEXT NOT NULL, idx INTEGER NOT NULL, total REAL NOT NULL,
                                    positions BLOB NOT NULL, position_kl BLOB, PRIMARY KEY (param, idx));
"""

# What one weight's row costs on disk besides its blobs and its parameter's name (written twice:
# the row and the primary-key index): the record header, idx, total, b-tree cells. Measured on
# SQLite 3 with 4 KiB pages: 40-47 bytes for small rows (ROW_MIN_BYTES is below that: the low
# estimate is a floor); rows past a page spill to overflow pages, whose slack PAGE_SLACK covers in
# the high estimate (measured 4.6-5.5 KB for 4.1-5.3 KB of blobs; high 4.8-6.2 KB).
ROW_MIN_BYTES = 32
ROW_BYTES = 64
PAGE_SLACK = 1.15


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes a scan's rows will take in its store: `low` if every weight's importance positions
    were one position, `high` if they were every position (the count depends on the KL found);
    the per-position KL (when kept) is exact in both."""
    weights: int
    low: int
    high: int

    def describe(self) -> str:
        lo, hi = _mb(self.low), _mb(self.high)
        return f"{lo} MB" if lo == hi else f"{lo}-{hi} MB"


def _mb(n: int) -> str:
    return f"{n / 1e6:.3g}" if n < 1e8 else f"{n / 1e6:.0f}"


def disk_estimate(rows: dict[str, int], n_positions: int, keep_positions: bool) -> DiskEstimate:
    """What writing `rows` ({parameter name: weights to write}) adds to a store, for N =
    n_positions positions per weight: importance positions int32 (1..N of them), the full
    per-position KL float32 (N) when kept (ScanStore.write_chunk)."""
    full = 4 * n_positions if keep_positions else 0
    low = high = 0
    for name, count in rows.items():
        named = 2 * len(name.encode()) + full
        low += count * (ROW_MIN_BYTES + named + 4)
        high += int(count * PAGE_SLACK * (ROW_BYTES + named + 4 * n_positions))
    return DiskEstimate(sum(rows.values()), low, high)


def free_bytes(directory: str | Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem holding `directory` (or its nearest
    existing parent)."""
    d = Path(directory).absolute()
    while not d.exists() and d != d.parent:
        d = d.parent
    return shutil.disk_usage(d).free


def check_space(directory: str | Path, estimate: DiskEstimate) -> int:
    """The free bytes at `directory`; ScanError when even the least the store will grow by does not fit."""
    free = free_bytes(directory)
    need = estimate.low
    if need > free:
        raise ScanError(f"the scan needs at least {_mb(need)} MB in {directory} ({estimate.weights} weights; "
                        f"{estimate.describe()} in the store) but its filesystem has {_mb(free)} MB free: free some "
                        "space, scan fewer weights (params=, weights=) or give another out=")
    return free


class ScanStore:
    """weights(param, idx, total KL, importance positions int32, full per-position KL float32 or NULL)."""

    def __init__(self, path: str | Path):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ScanError(f"a scan store path must be a non-empty str or Path, got {path!r}")
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ScanError(f"{self.path}: cannot create its directory ({exc.strerror or exc})") from None
        try:
            self.db = sqlite3.connect(str(self.path), timeout=60)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            columns = {r[1] for r in self.db.execute("PRAGMA table_info(chunks)")}
        except sqlite3.Error as exc:   # not a database, a directory, a store of another program
            raise ScanError(f"{self.path} is not a usable scan store ({exc}); use a new output directory") from None
        if "sha256" not in columns:
            raise ScanError(f"{self.path}: a scan store from an older wtc (no chunk digests); use a new output directory")

    def close(self) -> None:
        self.db.close()

    # -- identity of the scan
    def bind(self, meta: dict) -> None:
        """Record what this store is for, or check that it matches a previous run."""
        old = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        try:
            new = {k: json.dumps(v, sort_keys=True) for k, v in meta.items()}
        except (TypeError, ValueError) as exc:
            raise ScanError(f"{self.path}: the scan's identity must be JSON data: {exc}") from None
        if old:
            for key, value in new.items():
                if key in old and old[key] != value:
                    raise ScanError(f"{self.path}: this store was written for a different {key} "
                                     f"({old[key][:80]} != {value[:80]}); use a new output directory")
            # a key this wtc records as null may be absent from a store written before it recorded it
            missing = {k for k in set(new) - set(old) if new[k] != "null"}
            if missing:
                raise ScanError(f"{self.path}: store lacks {sorted(missing)}; use a new output directory")
            return
        with self.db:
            self.db.executemany("INSERT INTO meta VALUES (?, ?)", new.items())

    def meta(self) -> dict:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}

    # -- chunks
    def done_chunks(self, param: str) -> set[int]:
        return {r[0] for r in self.db.execute("SELECT start FROM chunks WHERE param = ?", (param,))}

    def todo_ranges(self, param: str, size: int, chunk: int) -> list[tuple[int, int]]:
        """The flat-index ranges of [0, size) no finished chunk covers, cut into pieces of at most
        `chunk`: a resume may use another chunk size than the run it continues."""
        done = sorted(self.db.execute("SELECT start, stop FROM chunks WHERE param = ?", (param,)).fetchall())
        out, at = [], 0
        for start, stop in done + [(size, size)]:
            out += [(a, min(a + chunk, start)) for a in range(at, start, chunk)]
            at = max(at, stop)
        return out

    def write_chunk(self, param: str, start: int, stop: int, idx: np.ndarray, totals: np.ndarray,
                    positions: list[np.ndarray], position_kl: np.ndarray | None) -> None:
        """Rows for the nonzero weights of flat indices [start, stop), committed with the marker."""
        rows = []
        for i, (w, total, pos) in enumerate(zip(idx.tolist(), totals.tolist(), positions)):
            full = None if position_kl is None else position_kl[i].astype(np.float32).tobytes()
            rows.append((param, w, float(total), np.asarray(pos, np.int32).tobytes(), full))
        with self.db:                                    # one transaction: rows + marker, or nothing
            self.db.executemany("INSERT OR REPLACE INTO weights VALUES (?, ?, ?, ?, ?)", rows)
            self.db.execute("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)",
                            (param, start, stop, _rows_digest(r[1:] for r in rows)))

    def verify(self) -> None:
        """ScanError naming the first chunk whose rows differ from its digest, or rows outside any chunk."""
        counted = 0
        for param, start, stop, digest in self.db.execute("SELECT * FROM chunks ORDER BY param, start").fetchall():
            rows = self.db.execute("SELECT idx, total, positions, position_kl FROM weights WHERE param = ? AND "
                                   "idx >= ? AND idx < ? ORDER BY idx", (param, start, stop)).fetchall()
            counted += len(rows)
            if _rows_digest(rows) != digest:
                raise ScanError(f"{self.path}: the rows of {param} [{start}, {stop}) do not match their recorded "
                                f"sha256 (the store was edited or damaged); use a new output directory")
        if counted != self.count():
            raise ScanError(f"{self.path}: {self.count() - counted} weight rows lie outside every finished chunk "
                            f"(the store was edited or damaged); use a new output directory")

    def merge_from(self, other: "ScanStore") -> None:
        """Copy another store's chunks and weights (shards of a distributed scan) into this one."""
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO weights VALUES (?, ?, ?, ?, ?)",
                                other.db.execute("SELECT * FROM weights"))
            self.db.executemany("INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?)",
                                other.db.execute("SELECT * FROM chunks"))

    # -- reading
    def totals(self, param: str, shape: tuple[int, ...]) -> np.ndarray:
        out = np.zeros(int(np.prod(shape)), np.float64)
        for idx, total in self.db.execute("SELECT idx, total FROM weights WHERE param = ?", (param,)):
            out[idx] = total
        return out.reshape(shape)

    def weight(self, param: str, idx: int):
        """(total, importance positions, per-position KL or None) of one weight, or None if absent."""
        row = self.db.execute("SELECT total, positions, position_kl FROM weights WHERE param = ? AND idx = ?",
                              (param, idx)).fetchone()
        if row is None:
            return None
        full = None if row[2] is None else np.frombuffer(row[2], np.float32)
        return row[0], np.frombuffer(row[1], np.int32), full

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM weights").fetchone()[0]

    def top(self, k: int) -> list[tuple[str, int, float]]:
        return list(self.db.execute("SELECT param, idx, total FROM weights ORDER BY total DESC LIMIT ?", (k,)))


def _rows_digest(rows) -> str:
    """sha256 of (idx, total, positions, per-position KL) rows in idx order."""
    h = hashlib.sha256()
    for idx, total, positions, full in sorted(rows, key=lambda r: r[0]):
        h.update(struct.pack("<qdq", idx, total, len(positions)))
        h.update(positions)
        h.update(b"-" if full is None else full)
    return h.hexdigest()

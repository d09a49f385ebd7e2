"""A real text corpus available offline: Python source files, byte-tokenized, split by file.

(Over 500 lines because this docstring specifies file selection, cap, split and manifest exactly;
the code is under 500.)

    corpus = build_corpus()                       # the stdlib sources installed with the interpreter
    corpus = build_corpus("~/src/project", pattern="**/*.py")      # any directory of text files
    train = corpus.tokens("train")                # numpy uint8, read-only: bytes of every file + separator
    x = windows(train, ctx=129, n=64, rng=np.random.default_rng(0))   # (64, 129) int64 training windows
    parts = slices(corpus.tokens("heldout"), ctx=128, n_windows=256, k_slices=10, seed=0)
    corpus.save_manifest("run/corpus.json"); Corpus.from_manifest("run/corpus.json")  # re-checked

Files. ``build_corpus`` walks ``root`` (default: ``stdlib_root()``) without following symbolic links,
keeps the regular files whose posix path relative to ``root`` matches ``pattern`` ("**" stands for
zero or more directories, "*", "?" and "[...]" stay inside one path component), skips directories
whose name matches an ``exclude`` entry (fnmatch, case-sensitive; directory names only, not file
names), and lists the rest sorted by relative posix path. Contents are bytes: a file need not be
valid UTF-8. Files that cannot be read and empty files are left out and listed in ``Corpus.skipped``.

Default exclusions (``DEFAULT_EXCLUDE``): ``test``, ``tests`` (the stdlib test suites are half of
the stdlib, huge and repetitive), ``idlelib`` (an application, not library code),
``site-packages``, ``dist-packages`` (third-party packages, not the stdlib), ``__pycache__``,
``pydoc_data`` (one 750 kB string literal of documentation), ``encodings`` (mostly generated codec
tables) and ``.*`` (hidden directories such as .git or .venv in user trees). Pass ``exclude=()`` to
keep everything.

Cap. ``max_bytes`` bounds the total size of the files' contents (separators not counted): files are
taken in the order of sha256("order", seed, path) and the longest prefix of that order that fits is
kept. The subset is a stable pseudo-random sample, and a smaller cap gives a subset of a larger one.

Split. A file is held out iff u(seed, path) < heldout_frac, where u is the first 8 bytes of
sha256("split", seed, path) read as a fraction of 2^64: stable across runs, machines and Python
versions (never ``hash()``), independent of the cap order, and a file keeps its side whatever the
cap and whatever other files are present.

Tokens. The tokenizer is byte-level (``ByteTokenizer``: vocab 256, token = byte value; nothing to
train, nothing to download). ``Corpus.tokens(split)`` is the concatenation, in path order, of each
file's bytes followed by ``separator`` (default one NUL byte, b"\\x00": it never occurs in source
text, so it marks a file boundary unambiguously and costs one token; the 256-byte vocabulary has no
spare special token). Token arrays are numpy (uint8 for a split, int64 for windows);
``torch.from_numpy`` turns them into tensors without a copy.

Manifest. ``Corpus.manifest()`` records the root, the options, every file (path, size, sha256,
split), the skipped files and per-split totals, plus ``sha256``: the hash of the canonical JSON of
the manifest without ``root``, ``python`` and ``skipped`` (where the files were found, not what
they are), so the same stdlib on two machines has the same hash. ``verify()`` and ``tokens()``
re-hash the files and raise ``CorpusError`` naming the first file that changed.
"""
from __future__ import annotations

from wtc.errors import WtcError

import fnmatch
import hashlib
import json
import math
import os
import platform
import re
import stat
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_SEPARATOR",
    "SPLITS",
    "ByteTokenizer",
    "Corpus",
    "CorpusError",
    "CorpusFile",
    "build_corpus",
    "slice_starts",
    "slices",
    "stdlib_root",
    "windows",
]

FORMAT = "wtc.corpus/1"
DEFAULT_EXCLUDE: tuple[str, ...] = (
    "test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "pydoc_data",
    "encodings", ".*",
)
DEFAULT_SEPARATOR = b"\x00"
SPLITS = ("train", "heldout", "all")
_UNHASHED = ("root", "python", "skipped", "sha256")   # manifest keys left out of its sha256


class CorpusError(WtcError, ValueError):
    """A corpus cannot be built, read or checked; the message names the root, file or argument."""


def stdlib_root() -> Path:
    """The directory of the Python standard library sources of the running interpreter."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "os.py").is_file():
        raise CorpusError(f"the standard library sources are not installed at {root} (no os.py there; "
                          "some distributions ship only .pyc files): pass root= a directory of text files")
    return root


@dataclass(frozen=True)
class CorpusFile:
    """One file of a corpus: its path relative to the root (posix), size in bytes and sha256 (hex)."""
    path: str
    size: int
    sha256: str


# ---------------------------------------------------------------------------------------------------
# building

def _unit(tag: str, seed: int, path: str) -> float:
    """A stable pseudo-random number in [0, 1) for (tag, seed, path)."""
    digest = hashlib.sha256(f"{tag}\0{seed}\0{path}".encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _is_heldout(seed: int, path: str, heldout_frac: float) -> bool:
    return _unit("split", seed, path) < heldout_frac


def _component_regex(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = part.find("]", i + 2 if part[i + 1:i + 2] in ("!", "]") else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = part[i + 1:j]
                neg = body.startswith("!")
                body = body[1:] if neg else body
                body = body.replace("\\", "\\\\")
                out.append(f"[{'^/' if neg else ''}{body}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _pattern_regex(pattern: str) -> re.Pattern:
    """Compile a glob over relative posix paths; "**" is zero or more whole directories."""
    if not isinstance(pattern, str) or not pattern:
        raise CorpusError(f"pattern must be a non-empty glob such as '**/*.py', got {pattern!r}")
    parts = pattern.split("/")
    if pattern.startswith("/") or ".." in parts or "" in parts:
        raise CorpusError(f"pattern {pattern!r} must be relative to the root, without '..' or empty parts")
    rx = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            rx.append(".*" if last else "(?:[^/]+/)*")
        else:
            rx.append(_component_regex(part) + ("" if last else "/"))
    return re.compile("".join(rx), re.DOTALL)


def _candidates(root: Path, pattern: str, exclude: Sequence[str]) -> tuple[list[str], list[dict]]:
    """Relative posix paths of the regular files under root that match; skipped directories."""
    regex = _pattern_regex(pattern)
    found: list[str] = []
    skipped: list[dict] = []

    def onerror(err: OSError) -> None:
        rel = Path(err.filename).relative_to(root).as_posix() if err.filename else "?"
        skipped.append({"path": rel + "/", "reason": f"unreadable directory: {err.strerror or err}"})

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        # os.walk does not descend into links to directories when followlinks=False
        dirnames[:] = sorted(d for d in dirnames
                             if not any(fnmatch.fnmatchcase(d, pat) for pat in exclude))
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not regex.fullmatch(rel):
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError as err:
                skipped.append({"path": rel, "reason": f"cannot stat: {err.strerror or err}"})
                continue
            if stat.S_ISREG(st.st_mode):          # symbolic links, fifos, sockets ... are left out
                found.append(rel)
    found.sort()
    skipped.sort(key=lambda s: s["path"])
    return found, skipped


def _read(root: Path, rel: str) -> bytes:
    with open(root / rel, "rb") as f:
        return f.read()


def _check_options(heldout_frac, seed, max_bytes, separator, exclude) -> tuple:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise CorpusError(f"seed must be an integer, got {seed!r}")
    if isinstance(heldout_frac, bool) or not isinstance(heldout_frac, (int, float, np.floating)) \
            or not math.isfinite(heldout_frac) or not 0.0 < heldout_frac < 1.0:
        raise CorpusError(f"heldout_frac must be a number strictly between 0 and 1, got {heldout_frac!r}")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer))
                                  or max_bytes < 1):
        raise CorpusError(f"max_bytes must be None or a positive integer, got {max_bytes!r}")
    if not isinstance(separator, (bytes, bytearray)):
        raise CorpusError(f"separator must be bytes (e.g. b'\\x00'), got {type(separator).__name__}")
    if isinstance(exclude, str):
        exclude = (exclude,)
    exclude = tuple(exclude)
    if not all(isinstance(e, str) and e for e in exclude):
        raise CorpusError(f"exclude must be a sequence of non-empty directory-name patterns, got {exclude!r}")
    return (float(heldout_frac), int(seed), None if max_bytes is None else int(max_bytes),
            bytes(separator), exclude)


def build_corpus(root: str | os.PathLike | None = None, pattern: str = "**/*.py", heldout_frac: float = 0.2,
                 seed: int = 0, max_bytes: int | None = None, exclude: Sequence[str] = DEFAULT_EXCLUDE,
                 separator: bytes = DEFAULT_SEPARATOR, progress: bool = False) -> Corpus:
    """Build a corpus of the files under ``root`` (None: the stdlib) matching ``pattern``.

    Deterministic: the same files and options give the same file list, split, tokens and manifest
    hash. Reads every file once (to hash it); ``progress`` shows a tqdm bar while reading. See the
    module docstring for the walk, the exclusions, the ``max_bytes`` cap and the split. Raises
    CorpusError if root is not a directory, no file matches, or either split is empty.
    """
    heldout_frac, seed, max_bytes, separator, exclude = _check_options(
        heldout_frac, seed, max_bytes, separator, exclude)
    source = "stdlib" if root is None else "directory"
    root = stdlib_root() if root is None else Path(root).expanduser()
    if not root.is_dir():
        raise CorpusError(f"corpus root {root} is not a directory")
    root = root.resolve()
    paths, skipped = _candidates(root, pattern, exclude)
    where = f"under {root} matching {pattern!r} (exclude={list(exclude)})"
    if not paths:
        raise CorpusError(f"no files {where}")

    files: list[CorpusFile] = []
    iterator: Iterable[str] = paths
    if progress:
        from tqdm.auto import tqdm
        iterator = tqdm(paths, desc="corpus", unit="file")
    for rel in iterator:
        try:
            data = _read(root, rel)
        except OSError as err:
            skipped.append({"path": rel, "reason": f"unreadable: {err.strerror or err}"})
            continue
        if not data:
            skipped.append({"path": rel, "reason": "empty"})
            continue
        files.append(CorpusFile(rel, len(data), hashlib.sha256(data).hexdigest()))
    skipped.sort(key=lambda s: s["path"])
    if not files:
        raise CorpusError(f"all {len(paths)} files {where} are empty or unreadable")

    if max_bytes is not None:
        kept, total = set(), 0
        for f in sorted(files, key=lambda f: (_unit("order", seed, f.path), f.path)):
            if total + f.size > max_bytes:
                break
            kept.add(f.path)
            total += f.size
        if not kept:
            smallest = min(f.size for f in files)
            raise CorpusError(f"max_bytes={max_bytes} keeps no file {where} (the first file in the cap "
                              f"order is larger; the smallest file has {smallest} bytes)")
        files = [f for f in files if f.path in kept]

    corpus = Corpus(root=root, files=files, pattern=pattern, seed=seed, heldout_frac=heldout_frac,
                    max_bytes=max_bytes, exclude=exclude, separator=separator, skipped=skipped,
                    source=source)
    for split in ("train", "heldout"):
        if not corpus.split_files(split):
            other = "train" if split == "heldout" else "heldout"
            raise CorpusError(f"the {split} split is empty: all {len(files)} files {where} fell in {other} "
                              f"(heldout_frac={heldout_frac}, seed={seed}); use more files or another "
                              "heldout_frac / seed")
    return corpus


# ---------------------------------------------------------------------------------------------------
# the corpus

@dataclass(eq=False)
class Corpus:
    """Files under ``root`` with their split; tokens are read on demand and checked against the hashes.

    ``files`` is sorted by path; ``train_files`` and ``heldout_files`` partition it (same order).
    """
    root: Path
    files: list[CorpusFile]
    pattern: str = "**/*.py"
    seed: int = 0
    heldout_frac: float = 0.2
    max_bytes: int | None = None
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    separator: bytes = DEFAULT_SEPARATOR
    skipped: list[dict] = field(default_factory=list)
    source: str = "directory"
    train_files: list[CorpusFile] = field(init=False)
    heldout_files: list[CorpusFile] = field(init=False)
    _cache: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.files = sorted(self.files, key=lambda f: f.path)
        held = [_is_heldout(self.seed, f.path, self.heldout_frac) for f in self.files]
        self.train_files = [f for f, h in zip(self.files, held) if not h]
        self.heldout_files = [f for f, h in zip(self.files, held) if h]

    def __repr__(self) -> str:
        return (f"Corpus(root={str(self.root)!r}, pattern={self.pattern!r}, files={len(self.files)} "
                f"(train {len(self.train_files)}, heldout {len(self.heldout_files)}), "
                f"bytes train {self.n_bytes('train')}, heldout {self.n_bytes('heldout')})")

    def split_files(self, split: str) -> list[CorpusFile]:
        """The files of 'train', 'heldout' or 'all'."""
        if split == "train":
            return self.train_files
        if split == "heldout":
            return self.heldout_files
        if split == "all":
            return self.files
        raise CorpusError(f"unknown split {split!r}; one of {', '.join(SPLITS)}")

    def n_bytes(self, split: str = "all") -> int:
        """Total size of the split's file contents (separators not counted)."""
        return sum(f.size for f in self.split_files(split))

    def n_tokens(self, split: str = "all") -> int:
        """Length of ``tokens(split)``: contents plus one separator per file."""
        files = self.split_files(split)
        return sum(f.size for f in files) + len(files) * len(self.separator)

    def _read_checked(self, f: CorpusFile) -> bytes:
        try:
            data = _read(self.root, f.path)
        except OSError as err:
            raise CorpusError(f"corpus file {f.path} under {self.root} cannot be read: {err}") from None
        if len(data) != f.size or hashlib.sha256(data).hexdigest() != f.sha256:
            raise CorpusError(f"corpus file {f.path} under {self.root} changed since the corpus was built "
                              f"(recorded {f.size} bytes, sha256 {f.sha256[:12]}...; now {len(data)} bytes, "
                              f"sha256 {hashlib.sha256(data).hexdigest()[:12]}...)")
        return data

    def tokens(self, split: str) -> np.ndarray:
        """The split's tokens: each file's bytes followed by ``separator``, in path order.

        A read-only numpy uint8 array (token = byte value), cached on the corpus. Every file is
        checked against its recorded sha256 as it is read (CorpusError names a changed file).
        """
        files = self.split_files(split)
        if split not in self._cache:
            parts = []
            for f in files:
                parts.append(self._read_checked(f))
                parts.append(self.separator)
            arr = np.frombuffer(b"".join(parts), dtype=np.uint8)   # over immutable bytes: read-only
            self._cache[split] = arr
        return self._cache[split]

    def verify(self) -> None:
        """Re-hash every file; raise CorpusError naming the first (in path order) that changed."""
        for f in self.files:
            self._read_checked(f)

    def manifest(self) -> dict:
        """A JSON-able record of the corpus (see the module docstring); ``sha256`` identifies it."""
        heldout = {f.path for f in self.heldout_files}
        m = {
            "format": FORMAT,
            "root": str(self.root),
            "source": self.source,
            "python": platform.python_version() if self.source == "stdlib" else None,
            "pattern": self.pattern,
            "exclude": list(self.exclude),
            "seed": self.seed,
            "heldout_frac": self.heldout_frac,
            "max_bytes": self.max_bytes,
            "separator": self.separator.hex(),
            "tokenizer": {"kind": "byte", "vocab_size": ByteTokenizer.vocab_size},
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256,
                       "split": "heldout" if f.path in heldout else "train"} for f in self.files],
            "skipped": list(self.skipped),
            "n_files": {s: len(self.split_files(s)) for s in ("train", "heldout")},
            "bytes": {s: self.n_bytes(s) for s in ("train", "heldout")},
            "tokens": {s: self.n_tokens(s) for s in ("train", "heldout")},
        }
        m["sha256"] = _manifest_hash(m)
        return m

    def save_manifest(self, path: str | os.PathLike) -> Path:
        """Write ``manifest()`` as JSON (parent directories created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.manifest(), indent=1) + "\n")
        return path

    @classmethod
    def from_manifest(cls, manifest: dict | str | os.PathLike, root: str | os.PathLike | None = None,
                      verify: bool = True) -> Corpus:
        """Rebuild a corpus from a manifest (dict or JSON file), at ``root`` (default: the recorded root).

        Checks the manifest's own sha256 and, with ``verify``, every file's contents.
        """
        if not isinstance(manifest, dict):
            try:
                manifest = json.loads(Path(manifest).read_text())
            except (OSError, ValueError) as err:
                raise CorpusError(f"cannot read corpus manifest {manifest}: {err}") from None
        if not isinstance(manifest, dict):
            raise CorpusError(f"a corpus manifest is a JSON object, got {type(manifest).__name__}")
        try:
            if manifest.get("format") != FORMAT:
                raise CorpusError(f"not a {FORMAT} manifest (format={manifest.get('format')!r})")
            if _manifest_hash(manifest) != manifest["sha256"]:
                raise CorpusError("corpus manifest was edited: its sha256 does not match its contents")
            corpus = cls(root=Path(root if root is not None else manifest["root"]).expanduser(),
                         files=[CorpusFile(f["path"], int(f["size"]), f["sha256"]) for f in manifest["files"]],
                         pattern=manifest["pattern"], seed=int(manifest["seed"]),
                         heldout_frac=float(manifest["heldout_frac"]), max_bytes=manifest["max_bytes"],
                         exclude=tuple(manifest["exclude"]), separator=bytes.fromhex(manifest["separator"]),
                         skipped=list(manifest.get("skipped", [])), source=manifest.get("source", "directory"))
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, CorpusError):
                raise
            raise CorpusError(f"malformed corpus manifest: {type(err).__name__}: {err}") from None
        recorded = {f["path"]: f["split"] for f in manifest["files"]}
        for f in corpus.heldout_files:
            if recorded[f.path] != "heldout":
                raise CorpusError(f"manifest split of {f.path} disagrees with the split rule")
        if verify:
            corpus.verify()
        return corpus


def _manifest_hash(m: dict) -> str:
    body = {k: v for k, v in m.items() if k not in _UNHASHED}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


# ---------------------------------------------------------------------------------------------------
# tokenizer

class ByteTokenizer:
    """Byte-level tokenizer: vocab 256, token id = byte value. Nothing to train or download.

    ``encode`` takes bytes as they are and text as UTF-8 (errors="surrogateescape", so text made by
    ``decode(ids, errors="surrogateescape")`` encodes back to exactly ``ids`` whatever the bytes).
    ``decode`` gives UTF-8 text for people (errors="replace" by default: invalid bytes become U+FFFD);
    ``decode_bytes`` is exact. For per-token display ``token_text(id)`` is the one-character latin-1
    string of the byte (chr(id)), and ``texts(ids)`` a list of them, one per token, so
    "".join(texts(ids)).encode("latin-1") == bytes(ids).
    """
    vocab_size = 256

    def encode(self, text: str | bytes | bytearray | memoryview) -> np.ndarray:
        """Token ids (int64, 1-D) of text (UTF-8) or bytes."""
        if isinstance(text, str):
            data = text.encode("utf-8", "surrogateescape")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise CorpusError(f"encode takes str or bytes, got {type(text).__name__}")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    @staticmethod
    def _check(ids) -> np.ndarray:
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise CorpusError(f"token ids must be 1-D, got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise CorpusError(f"token ids must be integers, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            bad = arr[(arr < 0) | (arr > 255)][0]
            raise CorpusError(f"token id {int(bad)} is outside the byte vocabulary 0..255")
        return arr.astype(np.uint8)

    def decode_bytes(self, ids) -> bytes:
        """The exact bytes of the ids."""
        return self._check(ids).tobytes()

    def decode(self, ids, errors: str = "replace") -> str:
        """The ids as UTF-8 text (``errors`` as in bytes.decode)."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def token_text(self, token_id: int) -> str:
        """One-character latin-1 string of one token (e.g. 10 -> '\\n', 233 -> 'é')."""
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < 256:
            raise CorpusError(f"token id must be an integer in 0..255, got {token_id!r}")
        return chr(int(token_id))

    def texts(self, ids) -> list[str]:
        """One one-character string per token (see ``token_text``)."""
        return [chr(int(i)) for i in self._check(ids)]


# ---------------------------------------------------------------------------------------------------
# windows

def _check_tokens(tokens, ctx: int, name: str = "tokens") -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise CorpusError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise CorpusError(f"{name} must be integers, got dtype {arr.dtype}")
    if isinstance(ctx, bool) or not isinstance(ctx, (int, np.integer)) or ctx < 1:
        raise CorpusError(f"ctx must be a positive integer, got {ctx!r}")
    if ctx > len(arr):
        raise CorpusError(f"ctx={ctx} is larger than the data ({len(arr)} tokens)")
    return arr


def _check_count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise CorpusError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def windows(tokens: np.ndarray, ctx: int, n: int, rng: np.random.Generator,
            return_starts: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``n`` random contiguous windows of ``ctx`` tokens, (n, ctx) int64, starts uniform (with replacement).

    For next-token training take ctx + 1 and split into inputs x[:, :-1] and targets x[:, 1:].
    Windows may cross file boundaries (the separator then appears inside). With ``return_starts``
    also returns the (n,) start positions.
    """
    arr = _check_tokens(tokens, ctx)
    n = _check_count(n, "n")
    if not isinstance(rng, np.random.Generator):
        raise CorpusError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    starts = rng.integers(0, len(arr) - ctx + 1, size=n)
    out = arr[starts[:, None] + np.arange(ctx)].astype(np.int64)
    return (out, starts) if return_starts else out


def slice_starts(n_tokens: int, ctx: int, n_windows: int, k_slices: int, seed: int = 0) -> np.ndarray:
    """Start positions (k_slices, n_windows), int64, of windows that never overlap one another.

    The data is cut into n_tokens // ctx consecutive windows (from an offset drawn in the slack at the
    end), and k_slices * n_windows of them are drawn without replacement, seeded by ``seed``
    (numpy PCG64: deterministic for a given seed); each row is sorted.
    """
    n_tokens = _check_count(n_tokens, "n_tokens")
    ctx = _check_count(ctx, "ctx")
    n_windows = _check_count(n_windows, "n_windows")
    k_slices = _check_count(k_slices, "k_slices")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise CorpusError(f"seed must be a non-negative integer, got {seed!r}")
    m = n_tokens // ctx
    need = n_windows * k_slices
    if need > m:
        raise CorpusError(f"{k_slices} slices of {n_windows} disjoint windows of {ctx} tokens need "
                          f"{need * ctx} tokens; the data has {n_tokens} ({m} such windows)")
    rng = np.random.default_rng(seed)
    offset = int(rng.integers(0, n_tokens - m * ctx + 1))
    chosen = rng.choice(m, size=need, replace=False)
    starts = offset + ctx * chosen.astype(np.int64).reshape(k_slices, n_windows)
    return np.sort(starts, axis=1)


def slices(tokens: np.ndarray, ctx: int, n_windows: int, k_slices: int, seed: int = 0) -> list[np.ndarray]:
    """``k_slices`` disjoint sets of ``n_windows`` windows of ``ctx`` tokens, each (n_windows, ctx) int64.

    No token position appears in two windows (within or across slices); deterministic in ``seed``.
    Meant for the held-out split: ``slices(corpus.tokens("heldout"), ...)``. Positions:
    ``slice_starts(len(tokens), ctx, n_windows, k_slices, seed)``.
    """
    arr = _check_tokens(tokens, ctx)
    starts = slice_starts(len(arr), ctx, n_windows, k_slices, seed)
    idx = np.arange(ctx)
    return [arr[row[:, None] + idx].astype(np.int64) for row in starts]

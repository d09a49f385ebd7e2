"""A checkpoint file pair: <path>.safetensors for tensors, <path>.json for everything else.
Nothing is unpickled. Used by the DT's checkpoints (wtc.dt.checkpoint) and the training state of
token transformers (wtc.models.training).

Both files carry the same random pair id (safetensors metadata, JSON key "_pair"), so a torn pair
is recognised: a kill between the two renames of write_atomic leaves the new tensors beside the old
JSON, and the new JSON is then still complete under <path>.json.tmp, so read() finishes the commit.

Integrity: the JSON holds a sha256 digest of every tensor (key "_sha256"), checked on read, so one
flipped bit in a weight is a CheckpointError naming the tensor, not a silently different model.
The metadata is covered too (key "_meta_sha256", over its canonical JSON): an edited config that
happens to fit the tensors (another activation, another task) would load as a different model, so
an edit is refused. A pair without digests (stripped, or written by another program) is refused.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from wtc.errors import CheckpointError

_PAIR = "_pair"
_DIGESTS = "_sha256"
_META_DIGEST = "_meta_sha256"


def meta_digest(meta: dict) -> str:
    """sha256 of the metadata's canonical JSON (sorted keys, the pair id and digests left out)."""
    body = {k: v for k, v in meta.items() if k not in (_PAIR, _META_DIGEST)}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (what a reader gets back)."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: digest(v) for k, v in tensors.items()}


def check_digests(tensors: dict[str, torch.Tensor], expected: dict[str, str] | None, where) -> None:
    """CheckpointError naming the first tensor whose bytes, dtype or shape differ from the digest."""
    if expected is None:
        return
    missing, extra = set(expected) - set(tensors), set(tensors) - set(expected)
    if missing or extra:
        raise CheckpointError(f"{where}: tensors {sorted(missing)[:5]} missing / {sorted(extra)[:5]} unexpected "
                              f"against the recorded digests")
    for k in sorted(tensors):
        if digest(tensors[k]) != expected[k]:
            raise CheckpointError(f"{where}: tensor {k!r} does not match its recorded sha256 (the file was "
                                  f"changed or corrupted after it was written)")


def stem(path) -> Path:
    """The pair's stem as a Path. Its files are stem.with_suffix(...): a stem with another suffix
    ("run.1") would share its files with every stem that differs only there ("run.2"), so it is refused."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise CheckpointError(f"a checkpoint path must be a non-empty str or Path, got {path!r}")
    path = Path(path)
    if path.suffix not in ("", ".safetensors", ".json"):
        raise CheckpointError(f"checkpoint stem {str(path)!r} has the suffix {path.suffix!r}: its files would be "
                              f"{path.with_suffix('.safetensors').name} / .json, shared with any stem differing "
                              "only after the last dot; name a stem without a dot")
    return path


def _checked(tensors, meta) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors (dense, on the CPU) and the metadata as a reader gets them back (JSON), refusing
    what cannot be written faithfully, before anything is."""
    if not isinstance(tensors, dict):
        raise CheckpointError(f"tensors must be a dict of name -> torch.Tensor, got {type(tensors).__name__}")
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise CheckpointError(f"tensor names must be str, got {k!r}")
        if not isinstance(v, torch.Tensor):
            raise CheckpointError(f"tensor {k!r} must be a torch.Tensor, got {type(v).__name__} (torch.as_tensor it)")
        if v.layout != torch.strided:
            raise CheckpointError(f"tensor {k!r} is {v.layout}; only dense tensors can be written (.to_dense() it)")
    if not isinstance(meta, dict):
        raise CheckpointError(f"meta must be a dict, got {type(meta).__name__}")
    bad = [k for k in meta if not isinstance(k, str)]
    if bad:
        raise CheckpointError(f"meta keys must be str (JSON would turn {bad[0]!r} into {str(bad[0])!r}), got {bad[:3]}")
    taken = sorted({_PAIR, _DIGESTS, _META_DIGEST} & set(meta))
    if taken:
        raise CheckpointError(f"meta keys {taken} are reserved for the pair's id and digests")
    try:
        meta = json.loads(json.dumps(meta))         # what a reader gets back (tuples -> lists, ...)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"meta must be JSON data: {exc}") from None
    out, seen = {}, {}
    for k, v in tensors.items():
        v = v.detach().contiguous().cpu()
        ptr = (v.untyped_storage().data_ptr(), v.untyped_storage().nbytes()) if v.numel() else None
        if ptr is not None and ptr in seen:
            v = v.clone()                           # safetensors refuses shared memory; a copy reads back the same
        seen.setdefault(ptr, k)
        out[k] = v
    return out, meta


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on <path>.lock for one write or read of the pair: two processes saving into
    one stem (two runs into one directory) would otherwise interleave the renames of their
    temporary files (raw FileNotFoundErrors, a reader meeting a half-written .json.tmp). Where no
    lock file can be made (a read-only directory, no fcntl) the operation runs unlocked."""
    try:
        import fcntl
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                 # closing releases the lock


def write_atomic(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Write <path>.safetensors and <path>.json so that a crash never leaves a half-written pair."""
    path = stem(path)
    tensors, meta = _checked(tensors, meta)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:                   # a file or a broken symbolic link where a directory must be
        raise CheckpointError(f"cannot write the checkpoint {path}: {path.parent} cannot be made a directory "
                              f"({exc.strerror or exc})") from None
    with _locked(path):
        _write(path, tensors, meta)


def _write(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    pair = uuid.uuid4().hex
    tmp_t, tmp_j = path.with_suffix(".safetensors.tmp"), path.with_suffix(".json.tmp")
    try:
        save_file(tensors, str(tmp_t), metadata={_PAIR: pair})
        meta = {**meta, _DIGESTS: digests(tensors)}
        tmp_j.write_text(json.dumps({**meta, _PAIR: pair, _META_DIGEST: meta_digest(meta)}, indent=1))
    except OSError as exc:                   # disk full, read-only, a directory in the way: the old pair is intact
        raise CheckpointError(f"cannot write the checkpoint {path}: {exc.strerror or exc}") from exc
    os.replace(tmp_t, path.with_suffix(".safetensors"))
    os.replace(tmp_j, path.with_suffix(".json"))


def exists(path: Path) -> bool:
    """Whether a pair (possibly one whose commit read() will finish) is at path."""
    path = stem(path)
    return path.with_suffix(".safetensors").is_file() and (
        path.with_suffix(".json").is_file() or path.with_suffix(".json.tmp").is_file())


def _json(f: Path) -> dict:
    try:
        meta = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupt checkpoint metadata {f}: {exc}") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(f"corrupt checkpoint metadata {f}: a JSON object was expected, got {type(meta).__name__}")
    return meta


def _not_a_file(f: Path) -> str:
    """Why `f` is not a checkpoint file: missing, or what stands in its place (a directory, a FIFO,
    a symbolic link loop ...), so that the fix is not looked for in the wrong place."""
    import errno
    import stat

    try:
        st = os.lstat(f)
    except FileNotFoundError:
        return f"checkpoint file missing: {f}"
    except OSError as exc:
        return f"checkpoint file {f} cannot be read: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        try:
            os.stat(f)
        except OSError as exc:
            what = "a symbolic link loop" if exc.errno == errno.ELOOP else "a broken symbolic link"
            return f"checkpoint file {f} is {what}, not a file"
        st = os.stat(f)
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    what = next((name for test, name in kinds if test(st.st_mode)), "something else")
    return f"checkpoint file {f} is {what}, not a file"


def read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    path = stem(path)
    if not path.with_suffix(".safetensors").is_file():
        return _read(path)                   # names what is missing (and leaves no lock file behind)
    with _locked(path):
        return _read(path)


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    tfile, jfile = path.with_suffix(".safetensors"), path.with_suffix(".json")
    for f in (tfile, jfile):
        if not f.is_file() and not (f == jfile and path.with_suffix(".json.tmp").is_file()):
            raise CheckpointError(_not_a_file(f))
    try:
        with safe_open(str(tfile), framework="pt") as f:
            pair = (f.metadata() or {}).get(_PAIR)
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"corrupt checkpoint tensors {tfile}: {exc}") from exc
    meta = _json(jfile) if jfile.is_file() else {}
    if pair is not None and meta.get(_PAIR) != pair:
        pending = path.with_suffix(".json.tmp")
        if pending.is_file() and _json(pending).get(_PAIR) == pair:      # killed between the renames
            os.replace(pending, jfile)
            meta = _json(jfile)
        else:
            raise CheckpointError(f"checkpoint {tfile} and {jfile} are from different saves; delete them")
    meta.pop(_PAIR, None)
    recorded = meta.pop(_META_DIGEST, None)
    if recorded is None or _DIGESTS not in meta:      # stripped digests would make every check optional
        raise CheckpointError(f"{jfile}: no sha256 digests (edited, or written by another program); a wtc "
                              "checkpoint records them, so this one cannot be trusted")
    if recorded != meta_digest(meta):
        raise CheckpointError(f"{jfile}: the metadata does not match its recorded sha256 (the file was edited "
                              f"or corrupted after it was written)")
    check_digests(tensors, meta.pop(_DIGESTS, None), tfile)
    return tensors, meta

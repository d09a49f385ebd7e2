"""The offline text corpus (stdlib or any directory), its split, manifest, byte tokenizer and windows."""
import hashlib
import json

import numpy as np
import pytest

from wtc.explain import corpus as cp
from wtc.explain.corpus import (
    ByteTokenizer,
    Corpus,
    CorpusError,
    build_corpus,
    slice_starts,
    slices,
    windows,
)


def _write_tree(root, n=200, seed=0):
    """n small .py files in nested directories, plus things a corpus must leave out."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        d = root / f"pkg{i % 7}" / ("sub" if i % 3 else "")
        d.mkdir(parents=True, exist_ok=True)
        body = "".join(chr(c) for c in rng.integers(32, 127, size=int(rng.integers(5, 300))))
        (d / f"m{i}.py").write_text(f"# module {i}\nx = {body!r}\n")
    (root / "top.py").write_text("print('top level')\n")
    (root / "latin.py").write_bytes(b"s = '\xe9\xff\x80'  # not UTF-8\n")         # kept, as bytes
    (root / "empty.py").write_bytes(b"")                                          # skipped: empty
    (root / "notes.txt").write_text("not python\n")                               # pattern mismatch
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("assert True\n")                    # excluded dir
    (root / ".git").mkdir()
    (root / ".git" / "hook.py").write_text("hidden\n")                            # excluded (.*)
    try:
        (root / "link.py").symlink_to(root / "top.py")                            # symlinks skipped
        (root / "linkdir").symlink_to(root / "pkg0", target_is_directory=True)
    except OSError:
        pass
    return root


@pytest.fixture
def tree(tmp_path):
    return _write_tree(tmp_path / "src")


def test_user_directory_files_split_and_tokens(tree):
    c = build_corpus(tree, heldout_frac=0.3, seed=1)
    paths = [f.path for f in c.files]
    assert paths == sorted(paths) and len(paths) == 202                 # 200 + top.py + latin.py
    assert "top.py" in paths and "latin.py" in paths                     # "**/" matches zero directories
    assert not any(p.startswith(("tests/", ".git/", "linkdir/")) or p in ("link.py", "notes.txt", "empty.py")
                   for p in paths)
    assert {"path": "empty.py", "reason": "empty"} in c.skipped
    # the split is by file, disjoint, covers everything, roughly the asked fraction
    train, held = {f.path for f in c.train_files}, {f.path for f in c.heldout_files}
    assert train and held and not train & held and train | held == set(paths)
    assert abs(len(held) / len(paths) - 0.3) < 0.12
    # tokens: each file's bytes then the separator, in path order
    for split, files in (("train", c.train_files), ("heldout", c.heldout_files), ("all", c.files)):
        expect = b"".join((tree / f.path).read_bytes() + cp.DEFAULT_SEPARATOR for f in files)
        tok = c.tokens(split)
        assert tok.dtype == np.uint8 and tok.tobytes() == expect and len(tok) == c.n_tokens(split)
        assert not tok.flags.writeable
    # another seed gives another split of the same files
    other = build_corpus(tree, heldout_frac=0.3, seed=2)
    assert [f.path for f in other.files] == paths and {f.path for f in other.heldout_files} != held


def test_builds_are_deterministic_and_manifest_matches_files(tree, tmp_path):
    a, b = build_corpus(tree, seed=3), build_corpus(tree, seed=3)
    ma = a.manifest()
    assert ma == b.manifest()
    assert np.array_equal(a.tokens("train"), b.tokens("train"))
    assert np.array_equal(a.tokens("heldout"), b.tokens("heldout"))
    for entry in ma["files"]:
        data = (tree / entry["path"]).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert ma["bytes"]["train"] + ma["bytes"]["heldout"] == sum(len((tree / e["path"]).read_bytes())
                                                                for e in ma["files"])
    assert ma["n_files"] == {"train": len(a.train_files), "heldout": len(a.heldout_files)}
    # the manifest round-trips through a file, and its hash does not depend on where the files are
    path = a.save_manifest(tmp_path / "out" / "corpus.json")
    back = Corpus.from_manifest(path)
    assert back.manifest() == ma
    moved = tmp_path / "moved"
    tree.rename(moved)
    assert Corpus.from_manifest(path, root=moved).manifest()["sha256"] == ma["sha256"]
    edited = json.loads(path.read_text())
    edited["seed"] = 4
    with pytest.raises(CorpusError, match="edited"):
        Corpus.from_manifest(edited, root=moved)


def test_verify_and_tokens_catch_a_modified_file(tree, tmp_path):
    c = build_corpus(tree)
    c.verify()
    manifest = c.manifest()
    victim = c.heldout_files[0].path
    with open(tree / victim, "ab") as f:
        f.write(b"# changed\n")
    with pytest.raises(CorpusError, match=victim.replace(".", r"\.")):
        c.verify()
    with pytest.raises(CorpusError, match="changed"):
        c.tokens("heldout")
    with pytest.raises(CorpusError, match="changed"):
        Corpus.from_manifest(manifest)
    (tree / victim).unlink()
    with pytest.raises(CorpusError, match="cannot be read"):
        c.verify()


def test_max_bytes_takes_a_stable_nested_subset(tree):
    full = build_corpus(tree, heldout_frac=0.3)
    big, small = build_corpus(tree, heldout_frac=0.3, max_bytes=20_000), \
        build_corpus(tree, heldout_frac=0.3, max_bytes=8_000)
    assert big.n_bytes() <= 20_000 and small.n_bytes() <= 8_000
    assert {f.path for f in small.files} <= {f.path for f in big.files} < {f.path for f in full.files}
    held = {f.path for f in full.heldout_files}
    assert all((f.path in held) == (f in big.heldout_files) for f in big.files)   # a file keeps its side
    assert big.manifest() == build_corpus(tree, heldout_frac=0.3, max_bytes=20_000).manifest()


def test_pattern_and_exclusions(tree):
    sub = build_corpus(tree, pattern="pkg1/sub/*.py", heldout_frac=0.5)
    assert sub.files and all(f.path.startswith("pkg1/sub/") for f in sub.files)
    everything = build_corpus(tree, pattern="**/*.py", exclude=())
    assert any(f.path == "tests/test_x.py" for f in everything.files)
    assert any(f.path == ".git/hook.py" for f in everything.files)
    assert not any(f.path.startswith("linkdir/") or f.path == "link.py" for f in everything.files)


def test_errors_name_what_is_wrong(tree, tmp_path):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(CorpusError, match="no files under .*nothing.*'\\*\\*/\\*\\.py'"):
        build_corpus(tmp_path / "nothing")
    with pytest.raises(CorpusError, match="not a directory"):
        build_corpus(tmp_path / "missing")
    for bad in (0, 1, 1.5, -0.1, float("nan"), "0.2", True):
        with pytest.raises(CorpusError, match="heldout_frac"):
            build_corpus(tree, heldout_frac=bad)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.py").write_text("x = 1\n")
    with pytest.raises(CorpusError, match="split is empty.*one.*a"):     # one file: one split is empty
        build_corpus(tmp_path / "one")
    with pytest.raises(CorpusError, match="max_bytes"):
        build_corpus(tree, max_bytes=0)
    with pytest.raises(CorpusError, match="keeps no file"):
        build_corpus(tree, max_bytes=1)
    with pytest.raises(CorpusError, match="pattern"):
        build_corpus(tree, pattern="../*.py")
    c = build_corpus(tree)
    with pytest.raises(CorpusError, match="unknown split"):
        c.tokens("test")
    tok = c.tokens("heldout")
    with pytest.raises(CorpusError, match="larger than the data"):
        windows(tok, len(tok) + 1, 4, np.random.default_rng(0))
    with pytest.raises(CorpusError, match="larger than the data"):
        slices(tok, len(tok) + 1, 1, 1)
    with pytest.raises(CorpusError, match="n must"):
        windows(tok, 8, 0, np.random.default_rng(0))
    with pytest.raises(CorpusError, match="ctx"):
        windows(tok, 0, 4, np.random.default_rng(0))
    with pytest.raises(CorpusError, match="rng"):
        windows(tok, 8, 4, 0)
    with pytest.raises(CorpusError, match="need"):
        slices(tok, 8, len(tok) // 8, 2)


def test_byte_tokenizer_round_trips():
    tok = ByteTokenizer()
    assert tok.vocab_size == 256
    text = "def f(x):\n    return x + 1  # ascii\n"
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and list(ids) == [ord(c) for c in text]
    assert tok.decode(ids) == text and np.array_equal(tok.encode(tok.decode(ids)), ids)
    every = np.arange(256)
    assert np.array_equal(tok.encode(tok.decode_bytes(every)), every)
    assert np.array_equal(tok.encode(tok.decode(every, errors="surrogateescape")), every)
    assert "\ufffd" in tok.decode(every)                                   # display form replaces
    texts = tok.texts(every)
    assert all(len(t) == 1 for t in texts) and "".join(texts).encode("latin-1") == bytes(range(256))
    assert tok.token_text(10) == "\n" and tok.token_text(233) == "é"
    assert list(tok.encode("é")) == [0xC3, 0xA9]                           # text is UTF-8
    with pytest.raises(CorpusError, match="256|0..255"):
        tok.decode([65, 256])
    with pytest.raises(CorpusError, match="0..255"):
        tok.token_text(-1)
    with pytest.raises(CorpusError, match="str or bytes"):
        tok.encode(3)


def test_windows_are_contiguous_pieces_of_the_data(rng):
    data = rng.integers(0, 256, size=5000).astype(np.uint8)
    x, starts = windows(data, 33, 50, rng, return_starts=True)
    assert x.shape == (50, 33) and x.dtype == np.int64
    for row, s in zip(x, starts):
        assert np.array_equal(row, data[s:s + 33])
    assert windows(data, 5000, 2, rng).shape == (2, 5000)                  # ctx == len: the whole data
    seed = int(rng.integers(1 << 30))
    assert np.array_equal(windows(data, 8, 5, np.random.default_rng(seed)),
                          windows(data, 8, 5, np.random.default_rng(seed)))


def test_slices_are_disjoint_and_deterministic(rng):
    data = rng.integers(0, 256, size=3001).astype(np.uint8)
    seed = int(rng.integers(1 << 30))
    parts = slices(data, 16, 18, 10, seed=seed)
    starts = slice_starts(len(data), 16, 18, 10, seed=seed)
    assert len(parts) == 10 and all(p.shape == (18, 16) and p.dtype == np.int64 for p in parts)
    covered = [set() for _ in parts]
    for k, (p, row) in enumerate(zip(parts, starts)):
        for w, s in zip(p, row):
            assert np.array_equal(w, data[s:s + 16])
            covered[k] |= set(range(s, s + 16))
    assert sum(len(c) for c in covered) == 10 * 18 * 16 == len(set().union(*covered))  # no position twice
    again = slices(data, 16, 18, 10, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    full = slice_starts(len(data), 16, len(data) // 16, 1, seed=seed)                   # every window fits
    assert len(np.unique(full)) == len(data) // 16


def test_stdlib_corpus():
    try:
        root = cp.stdlib_root()
    except CorpusError as err:
        pytest.skip(str(err))
    a, b = build_corpus(), build_corpus()
    assert a.root == root.resolve() and a.source == "stdlib"
    assert a.manifest() == b.manifest() and a.manifest()["python"]
    assert len(a.files) > 100 and a.n_bytes("train") > 10 ** 6 and a.n_bytes("heldout") > 10 ** 5
    assert not any(set(f.path.split("/")[:-1]) & {"test", "tests", "idlelib", "site-packages"}
                   for f in a.files)
    assert "os.py" in {f.path for f in a.files}
    held = a.tokens("heldout")
    assert np.array_equal(held, b.tokens("heldout")) and len(held) == a.n_tokens("heldout")
    assert held[-1] == 0 and (held == 0).sum() == len(a.heldout_files)    # NUL only as the separator

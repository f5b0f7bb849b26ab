"""Datasets made of parts: PartWriter, merge_parts and ``tokenfeed merge``.

The contract (docs/format.md, "Datasets made of parts"): each part is published whole or
not at all, a rerun replaces its part, the merge copies no token data, orders documents
by part then by write order, refuses parts that do not make one dataset, and is atomic
and idempotent; the same parts give the same fingerprint.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from typing import List

import numpy as np
import pytest

import tokenfeed
from conftest import assert_docs_equal, documents
from tokenfeed import _core
from tokenfeed.cli import main


def part_docs(k: int, n: int, vocab: int = 1000) -> List[np.ndarray]:
    rng = np.random.default_rng(100 + k)
    return [rng.integers(0, vocab, size=int(rng.integers(0, 50))) for _ in range(n)]


def write_parts(path, sizes, vocab: int = 1000, order=None, **kw) -> List[List[np.ndarray]]:
    docs = [part_docs(k, n, vocab) for k, n in enumerate(sizes)]
    for k in (order if order is not None else range(len(sizes))):
        with tokenfeed.PartWriter(path, part=k, parts=len(sizes), vocab_size=vocab, **kw) as w:
            w.add_documents(docs[k])
    return docs


def test_merge_orders_by_part_then_write_order(tmp_path):
    # parts written out of order (as concurrent tasks finish); one part is empty
    docs = write_parts(tmp_path / "ds", [7, 0, 12, 5], order=[2, 0, 3, 1], shard_tokens=100)
    ds = tokenfeed.merge_parts(tmp_path / "ds")
    assert_docs_equal(documents(ds), [d for part in docs for d in part])
    ds.verify()
    # every part is a dataset of its own too
    for k, part in enumerate(docs):
        if part:
            assert_docs_equal(documents(tokenfeed.open(tmp_path / "ds" / "parts" / f"part-{k:05d}")), part)
    man = (tmp_path / "ds" / "tokenfeed.manifest").read_text()
    assert man.startswith("tokenfeed-manifest 2\n")
    names = [line.split()[1] for line in man.splitlines() if line.startswith("shard ")]
    assert names and all(n.startswith("parts/part-") for n in names)
    assert [n.split("/")[1] for n in names] == sorted(n.split("/")[1] for n in names)  # part order


def test_writer_datasets_keep_manifest_version_1(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "w", vocab_size=100) as w:
        w.add_document([1, 2, 3])
    assert (tmp_path / "w" / "tokenfeed.manifest").read_text().startswith("tokenfeed-manifest 1\n")


def test_merge_copies_no_token_data(tmp_path):
    write_parts(tmp_path / "ds", [40, 40], shard_tokens=200)
    shard_inodes = {os.stat(p).st_ino for p in (tmp_path / "ds" / "parts").rglob("*.tfs")}
    ds = tokenfeed.merge_parts(tmp_path / "ds")
    assert {os.stat(f["path"]).st_ino for f in ds.files()} == shard_inodes
    assert sorted(os.listdir(tmp_path / "ds")) == ["parts", "tokenfeed.manifest"]


def test_same_parts_same_fingerprint_and_idempotent_merge(tmp_path):
    write_parts(tmp_path / "a", [9, 4, 6])
    write_parts(tmp_path / "b", [9, 4, 6], order=[1, 2, 0])  # same input, same part count, other run
    fa = tokenfeed.merge_parts(tmp_path / "a").fingerprint
    assert tokenfeed.merge_parts(tmp_path / "b").fingerprint == fa
    man = tmp_path / "a" / "tokenfeed.manifest"
    before = (man.read_bytes(), os.stat(man).st_ino)
    assert tokenfeed.merge_parts(tmp_path / "a").fingerprint == fa
    assert (man.read_bytes(), os.stat(man).st_ino) == before  # the same parts: left untouched
    # fewer, larger parts hold the same documents but are other shards: another fingerprint
    docs = [d for k, n in enumerate([9, 4, 6]) for d in part_docs(k, n)]
    with tokenfeed.PartWriter(tmp_path / "c", part=0, parts=1, vocab_size=1000) as w:
        w.add_documents(docs)
    c = tokenfeed.merge_parts(tmp_path / "c")
    assert_docs_equal(documents(c), docs)
    assert c.fingerprint != fa


def test_rerun_of_a_part_replaces_it_whole(tmp_path):
    write_parts(tmp_path / "ds", [5, 5])
    with tokenfeed.PartWriter(tmp_path / "ds", part=1, parts=2, vocab_size=1000) as w:
        w.add_document([7, 7, 7])
    ds = tokenfeed.merge_parts(tmp_path / "ds")
    assert ds.num_documents == 6
    assert list(ds.document(5)) == [7, 7, 7]
    assert sorted(os.listdir(tmp_path / "ds" / "parts")) == ["part-00000", "part-00001"]  # nothing left behind


def test_failed_part_publishes_nothing(tmp_path):
    write_parts(tmp_path / "ds", [5, 5])
    with pytest.raises(RuntimeError):
        with tokenfeed.PartWriter(tmp_path / "ds", part=1, parts=2, vocab_size=1000) as w:
            w.add_document([1, 2])
            raise RuntimeError("task failed")
    # the earlier complete attempt of part 1 stays; no staging directory is left
    assert sorted(os.listdir(tmp_path / "ds" / "parts")) == ["part-00000", "part-00001"]
    assert tokenfeed.merge_parts(tmp_path / "ds").num_documents == 10
    with pytest.raises(ValueError, match="vocab_size"):  # ids checked before anything is written
        with tokenfeed.PartWriter(tmp_path / "ds", part=0, parts=2, vocab_size=1000) as w:
            w.add_document([1000])


def test_killed_part_leaves_only_a_hidden_staging_dir(tmp_path):
    """SIGKILL in the middle of a part: no part appears; the rerun cleans up and publishes."""
    out = tmp_path / "ds"
    write_parts(out, [3, 3, 3], order=[0, 2])
    code = textwrap.dedent(f"""
        import os, signal, numpy as np, tokenfeed
        w = tokenfeed.PartWriter({str(out)!r}, part=1, parts=3, vocab_size=1000, shard_tokens=10)
        for j in range(50):
            w.add_document(np.arange(5) + j)
            if j == 20:  # some shards renamed inside the staging directory, one open
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    names = sorted(os.listdir(out / "parts"))
    assert ".part-00001.lock" in names  # a killed attempt cannot remove its lock file: the next one does
    names.remove(".part-00001.lock")
    assert names[1:] == ["part-00000", "part-00002"] and len(names) == 3
    assert names[0].startswith(".part-00001.") and names[0].endswith(".tmp")
    assert any(n.endswith(".tfs") for n in os.listdir(out / "parts" / names[0]))  # it died mid-write
    with pytest.raises(ValueError, match=r"1 of 3 parts missing \(1\)"):
        tokenfeed.merge_parts(out)
    # the rerun of part 1 removes what the killed attempt left
    docs1 = part_docs(1, 3)
    with tokenfeed.PartWriter(out, part=1, parts=3, vocab_size=1000) as w:
        w.add_documents(docs1)
    assert sorted(os.listdir(out / "parts")) == ["part-00000", "part-00001", "part-00002"]
    ds = tokenfeed.merge_parts(out)
    assert_docs_equal(documents(ds), part_docs(0, 3) + docs1 + part_docs(2, 3))


def test_merge_refuses_parts_that_are_not_one_dataset(tmp_path):
    write_parts(tmp_path / "missing", [3, 3, 3], order=[0, 2])
    with pytest.raises(ValueError, match=r"1 of 3 parts missing \(1\).*run them again"):
        tokenfeed.merge_parts(tmp_path / "missing")

    write_parts(tmp_path / "dup", [3, 3])
    shutil.copytree(tmp_path / "dup" / "parts" / "part-00001", tmp_path / "dup" / "parts" / "part-1")
    with pytest.raises(ValueError, match="part 1 twice"):
        tokenfeed.merge_parts(tmp_path / "dup")

    write_parts(tmp_path / "counts", [3, 3])
    with tokenfeed.PartWriter(tmp_path / "counts", part=0, parts=3, vocab_size=1000) as w:
        w.add_document([1])
    with pytest.raises(ValueError, match="different part counts"):
        tokenfeed.merge_parts(tmp_path / "counts")

    for name, kw in (("vocab", dict(vocab_size=2000)), ("dtype", dict(vocab_size=1000, dtype="uint32")),
                     ("meta", dict(vocab_size=1000, metadata={"eod_id": 3}))):
        write_parts(tmp_path / name, [3, 3])
        with tokenfeed.PartWriter(tmp_path / name, part=1, parts=2, **kw) as w:
            w.add_document([1, 2])
        key = {"vocab": "vocab_size", "dtype": "dtype", "meta": "metadata"}[name]
        with pytest.raises(ValueError, match=f"part-00001: {key}: expected .* as in part-00000"):
            tokenfeed.merge_parts(tmp_path / name)
        assert not (tmp_path / name / "tokenfeed.manifest").exists()

    with pytest.raises(ValueError, match="no such directory"):
        tokenfeed.merge_parts(tmp_path / "nothing")


def test_merge_refuses_writer_dataset_without_overwrite(tmp_path):
    out = tmp_path / "ds"
    with tokenfeed.DatasetWriter(out, vocab_size=1000) as w:
        w.add_document([1, 2, 3])
    docs = write_parts(out, [4, 4])
    with pytest.raises(FileExistsError, match="not a merge of parts"):
        tokenfeed.merge_parts(out)
    assert tokenfeed.open(out).num_documents == 1  # untouched
    ds = tokenfeed.merge_parts(out, overwrite=True)
    assert_docs_equal(documents(ds), docs[0] + docs[1])


def test_core_merge_refuses_paths_leaving_the_dataset(tmp_path):
    write_parts(tmp_path / "ds", [2])
    for bad in ("../ds/parts/part-00000", "/etc", "parts//part-00000", "parts/./part-00000", ""):
        with pytest.raises(ValueError):
            _core.merge(str(tmp_path / "ds"), [bad])
    with pytest.raises(ValueError, match="each part once"):
        _core.merge(str(tmp_path / "ds"), ["parts/part-00000", "parts/part-00000"])
    with pytest.raises(tokenfeed.FormatError, match="no manifest"):
        _core.merge(str(tmp_path / "ds"), ["parts/part-00009"])


def test_part_writer_argument_checks(tmp_path):
    with pytest.raises(ValueError):
        tokenfeed.PartWriter(tmp_path, part=2, parts=2, vocab_size=10)
    with pytest.raises(TypeError):
        tokenfeed.PartWriter(tmp_path, part=0.0, parts=2, vocab_size=10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tokenfeed.PartWriter(tmp_path, part=0, parts=1, vocab_size=10, metadata={"x": object()})


def test_cli_merge(tmp_path, capsys):
    docs = write_parts(tmp_path / "ds", [6, 2])
    assert main(["merge", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "merged 2 part(s)" in out and f"{sum(len(d) for d in docs[0] + docs[1]):,} tokens" in out
    assert "8 documents" in out
    assert main(["inspect", str(tmp_path / "ds")]) == 0
    assert "  parts/part-00001/shard-" in capsys.readouterr().out  # shards shown inside their parts
    shutil.rmtree(tmp_path / "ds" / "parts" / "part-00001")
    assert main(["merge", str(tmp_path / "ds")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokenfeed: error:") and "1 of 2 parts missing" in err
    info = json.loads((tmp_path / "ds" / "parts" / "part-00000" / "part.json").read_text())
    assert (info["part"], info["parts"], info["documents"]) == (0, 2, 6)


def test_noop_merge_writes_nothing(tmp_path, capsys):
    """Merging the same parts again compares the manifests first and takes the directory's lock
    only when it has something to write: a merged dataset on read-only storage merges (as a
    no-op) without error. Root writes through permissions, so the lock file's creation is made
    to fail here by a directory standing where it would be created."""
    write_parts(tmp_path / "ds", [6, 2])
    fp = tokenfeed.merge_parts(tmp_path / "ds").fingerprint
    man = tmp_path / "ds" / "tokenfeed.manifest"
    before = (man.read_bytes(), os.stat(man).st_ino)
    (tmp_path / "ds" / ".tokenfeed.lock").mkdir()
    os.chmod(tmp_path / "ds", 0o555)
    try:
        assert tokenfeed.merge_parts(tmp_path / "ds").fingerprint == fp
        assert main(["merge", str(tmp_path / "ds")]) == 0
        assert "merged 2 part(s)" in capsys.readouterr().out
        assert (man.read_bytes(), os.stat(man).st_ino) == before
        # a merge with something to write still needs the lock, and says so
        shutil.rmtree(tmp_path / "ds" / "parts" / "part-00001")
        with tokenfeed.PartWriter(tmp_path / "ds", part=1, parts=2, vocab_size=1000) as w:
            w.add_document([7, 7, 7])
        with pytest.raises(OSError, match="lock"):
            tokenfeed.merge_parts(tmp_path / "ds")
        assert (man.read_bytes(), os.stat(man).st_ino) == before
    finally:
        os.chmod(tmp_path / "ds", 0o755)

"""The files of a multi-file dataset are mapped on first touch and unmapped again past a
process-wide bound ($TOKENFEED_MAX_OPEN_SHARDS): 10^5 shards read under ``ulimit -n 1024``
with a bounded number of mappings, and a shard changed after open is an error naming it on
first touch, never other tokens."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tokenfeed
from conftest import aged as _aged
from conftest import forbid_listing as _no_listing
from conftest import llmc_shard_set as _llmc_set
from conftest import write_llmc


def _run(code: str, env_extra: dict, timeout: float = 600) -> str:
    env = dict(os.environ)
    env.update(env_extra)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_100k_shards_under_ulimit_1024(tmp_path):
    n, per = 100_000, 4
    d = tmp_path / "many"
    d.mkdir()
    base = np.arange(per, dtype=np.int64)
    for i in range(n):
        (d / f"s{i:06d}.bin").write_bytes(((base + i) % 65536).astype(np.uint16).tobytes())
    out = _run(f"""
        import resource, numpy as np, tokenfeed
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        ds = tokenfeed.open({str(d / "*.bin")!r}, dtype="uint16")
        assert ds.num_files == {n} and ds.num_tokens == {n * per}
        rng = np.random.default_rng(0)
        for i in rng.integers(0, {n}, size=3000):
            i = int(i)
            got = ds.tokens(i * {per}, (i + 1) * {per})
            assert list(got) == [(i + k) % 65536 for k in range({per})], (i, got)
        loader = tokenfeed.Loader(ds, seq_len=63, batch_size=8, seed=1, output="numpy", backend="pread")
        for _ in range(50):
            next(loader)
        loader.close()
        with open("/proc/self/maps") as f:
            maps = sum(1 for _ in f)
        print(maps)
    """, {"TOKENFEED_MAX_OPEN_SHARDS": "256"})
    assert int(out.split()[-1]) < 2000  # the bound, not one mapping per shard


def _stream_digest(ds, backend):
    import hashlib
    h = hashlib.sha256()
    with tokenfeed.Loader(ds, seq_len=31, batch_size=4, seed=0, output="numpy", backend=backend) as l:
        for _ in range(20):
            h.update(np.ascontiguousarray(next(l)["tokens"]).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_stream_unchanged_under_a_bound_of_three(tmp_path, backend):
    files = []
    for i in range(40):
        p = tmp_path / f"shard_{i:03d}.bin"
        write_llmc(str(p), (np.arange(100) + 1000 * i).astype(np.uint16))
        files.append(str(p))
    out = _run(f"""
        import sys, numpy as np, tokenfeed
        sys.path[:0] = [{os.path.dirname(__file__)!r}, {os.path.dirname(os.path.dirname(__file__))!r}]
        from test_lazy_shards import _stream_digest
        ds = tokenfeed.open({str(tmp_path / "shard_*.bin")!r})
        for i in range(40):
            assert (ds.tokens(i * 100, i * 100 + 100) == np.arange(100) + 1000 * i).all()
        print(_stream_digest(ds, {backend!r}))
    """, {"TOKENFEED_MAX_OPEN_SHARDS": "3"})
    # with every file mapped (40 files, under the default bound)
    assert out.split()[-1] == _stream_digest(tokenfeed.open(files), backend)


def test_shard_changed_after_open_is_an_error_naming_it(tmp_path):
    files = []
    for i in range(10):
        p = tmp_path / f"shard_{i:02d}.bin"
        write_llmc(str(p), np.full(64, i, dtype=np.uint16))
        files.append(str(p))
    out = _run(f"""
        import os, numpy as np, tokenfeed
        from conftest import write_llmc
        ds = tokenfeed.open({files!r})
        # rewritten in place after open: same size, other tokens
        write_llmc({files[5]!r}, np.full(64, 99, dtype=np.uint16))
        st = os.stat({files[5]!r})
        os.utime({files[5]!r}, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert (ds.tokens(0, 64) == 0).all()
        try:
            ds.tokens(5 * 64, 6 * 64)
        except tokenfeed.FormatError as e:
            print("ERR", e)
        else:
            print("no error")
    """, {"TOKENFEED_MAX_OPEN_SHARDS": "1", "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)), os.environ.get("PYTHONPATH", "")])})
    assert "ERR" in out, out
    assert files[5] in out and "changed" in out


def test_catalog_written_once_then_read(tmp_path, monkeypatch):
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    files = _llmc_set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin")
    first = tokenfeed.open(spec)
    written = sorted(os.listdir(cat))
    assert len(written) == 1 and written[0].endswith(".tfcat")
    second = tokenfeed.open(spec)  # from the catalog: nothing parsed
    assert second.fingerprint == first.fingerprint and second.num_tokens == first.num_tokens
    assert second.num_documents == first.num_documents and second.paths == files
    assert np.array_equal(second.tokens(0, second.num_tokens), first.tokens(0, first.num_tokens))
    assert _stream_digest(second, "pread") == _stream_digest(first, "pread")
    assert _stream_digest(second, "mmap") == _stream_digest(first, "mmap")


def _native_set(d):
    """A tokenfeed dataset of several shards."""
    rng = np.random.default_rng(0)
    with tokenfeed.DatasetWriter(str(d), vocab_size=1000, shard_tokens=64) as w:
        for _ in range(30):
            w.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 40))))
    return d


def test_native_dataset_from_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "catalog"))
    d = _native_set(tmp_path / "native")
    _aged([str(p) for p in d.iterdir()])
    a = tokenfeed.open(str(d))
    assert a.num_files > 2 and os.listdir(tmp_path / "catalog")
    b = tokenfeed.open(str(d))
    assert b.fingerprint == a.fingerprint and b.num_documents == a.num_documents
    for i in range(a.num_documents):
        assert np.array_equal(a.document(i), b.document(i))
    assert a.find_document(a.num_tokens - 1) == b.find_document(b.num_tokens - 1)
    b.verify()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_native_shards_unmapped_under_the_bound_keep_their_checksums(tmp_path, compression):
    """A shard unmapped again under the bound keeps its header's checksums (the format's
    private state outlives its mappings, its pointers into them do not): the dataset's
    catalog is then written from the shards as opened, each checked against the manifest
    by those checksums, and read back; verify still finds a damaged shard."""
    d = tmp_path / "native"
    rng = np.random.default_rng(1)
    kw = dict(compression="zstd", block_tokens=16) if compression else {}
    with tokenfeed.DatasetWriter(str(d), vocab_size=1000, shard_tokens=64, **kw) as w:
        for _ in range(30):
            w.add_document(rng.integers(0, 1000, size=int(rng.integers(5, 40))))
    (d / "tokenfeed.catalog").unlink()
    out = _run(f"""
        import numpy as np, tokenfeed
        ds = tokenfeed.open({str(d)!r})
        assert ds.num_files > 3
        whole = ds.tokens(0, ds.num_tokens)  # every shard mapped in turn, all but one unmapped again
        ds.verify()
        print("CAT", ds._core.write_dataset_catalog({str(d)!r}))
        again = tokenfeed.open({str(d)!r})
        assert again.fingerprint == ds.fingerprint
        assert np.array_equal(again.tokens(0, again.num_tokens), whole)
        again.verify()
        print("OK")
    """, {"TOKENFEED_MAX_OPEN_SHARDS": "1", "TOKENFEED_CATALOG_DIR": ""})
    assert "OK" in out and str(d / "tokenfeed.catalog") in out
    # the catalog's entries carry the checksums: a damaged shard is still found by verify
    shard = sorted(p for p in d.iterdir() if p.name.startswith("shard"))[1]
    b = bytearray(shard.read_bytes())
    b[4096 + 3] ^= 0xFF
    shard.write_bytes(bytes(b))
    with pytest.raises(tokenfeed.FormatError, match=shard.name):
        tokenfeed.open(str(d)).verify()


@pytest.mark.parametrize("flags", [1, 2, 3])
def test_planted_entry_claiming_what_its_format_has_not_is_refused(tmp_path, monkeypatch, flags):
    """An entry of the node's catalog that says an llm.c file is stored in compressed
    blocks (flag 1) or carries a format's private checksums (flag 2), sealed again, is no
    entry: the format's row has no blocks and no private state, so the catalog is not used
    and the files are parsed, read right and verified, never failing as "changed"."""
    import struct
    import xxhash
    cdir = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cdir))
    files = []
    for i in range(6):
        p = tmp_path / f"shard_{i:03d}.bin"
        write_llmc(str(p), (np.arange(40 + 7 * i) + 100 * i).astype(np.uint16))
        files.append(str(p))
    _aged(files)
    ref = tokenfeed.open(files)
    (cat,) = [cdir / n for n in os.listdir(cdir)]
    b = bytearray(cat.read_bytes())
    assert b[:8] == b"TFCATLG1"
    # shard 3's record: flags (u32), then num_tokens and num_docs, ..., block_tokens, num_blocks
    key = struct.pack("<QQ", 40 + 7 * 3, 1)
    at = b.find(key)
    assert at > 0 and b.find(key, at + 1) < 0
    b[at - 4] |= flags
    b[at + 40:at + 56] = struct.pack("<QQ", 16, 3)
    b[-8:] = xxhash.xxh64_intdigest(bytes(b[:-8]), seed=0).to_bytes(8, "little")
    cat.write_bytes(bytes(b))
    ds = tokenfeed.open(files)
    assert np.array_equal(ds.tokens(0, ds.num_tokens), ref.tokens(0, ref.num_tokens))
    assert not any(f["compressed"] for f in ds.files())
    ds.verify()
    # and the catalog is written again as the files are
    assert cat.read_bytes() != bytes(b) and cat.read_bytes()[at - 4] & 3 == 0


@pytest.mark.parametrize("blocks", [(16, 1 << 40), (16, 0), (0, 4)])
def test_planted_entry_with_blocks_its_counts_do_not_give_is_refused(tmp_path, monkeypatch, blocks):
    """A compressed shard's entry in the node's catalog whose block size and block count do
    not agree with its token count (what its header would give), sealed again, is no entry:
    the engine sizes its block cache by the entries before any shard is touched."""
    import struct
    import xxhash
    cdir = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cdir))
    d = tmp_path / "native"
    with tokenfeed.DatasetWriter(str(d), vocab_size=1000, shard_tokens=64, compression="zstd", block_tokens=16) as w:
        for i in range(12):
            w.add_document(np.arange(10 + i) % 1000)
    _aged([str(p) for p in d.iterdir()] + [str(d)])
    ref = tokenfeed.open(str(d))
    want = ref.tokens(0, ref.num_tokens)
    (cat,) = [cdir / n for n in os.listdir(cdir)]
    b = bytearray(cat.read_bytes())
    f0 = ref.files()[0]
    key = struct.pack("<QQ", f0["num_tokens"], f0["num_documents"])
    at = b.find(key)
    assert at > 0 and b[at - 4] & 1  # compressed
    assert struct.unpack_from("<QQ", b, at + 40) == (16, -(-f0["num_tokens"] // 16))
    b[at + 40:at + 56] = struct.pack("<QQ", *blocks)
    b[-8:] = xxhash.xxh64_intdigest(bytes(b[:-8]), seed=0).to_bytes(8, "little")
    cat.write_bytes(bytes(b))
    ds = tokenfeed.open(str(d))
    assert np.array_equal(ds.tokens(0, ds.num_tokens), want)
    with tokenfeed.Loader(ds, seq_len=15, batch_size=2, seed=0, output="numpy") as l:
        next(l)
    assert struct.unpack_from("<QQ", cat.read_bytes(), at + 40) == (16, -(-f0["num_tokens"] // 16))


def test_stale_catalog_entry_refreshed(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "catalog"))
    files = _llmc_set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin")
    tokenfeed.open(spec)
    write_llmc(files[3], np.full(77, 7, dtype=np.uint16))  # another size and tokens
    _aged([files[3]])
    ds = tokenfeed.open(spec)
    assert ds.num_tokens == 11 * 50 + 77
    assert (ds.tokens(3 * 50, 3 * 50 + 77) == 7).all()
    fresh = tokenfeed.open(files)  # a list of the same files: parsed, not from that catalog
    assert ds.fingerprint == fresh.fingerprint


def test_file_changed_after_the_catalog_was_read(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "catalog"))
    files = _llmc_set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin")
    tokenfeed.open(spec)
    ds = tokenfeed.open(spec)  # from the catalog: no file mapped yet
    write_llmc(files[4], np.full(50, 9, dtype=np.uint16))  # same size, other tokens
    _aged([files[4]], 30)
    with pytest.raises(tokenfeed.FormatError, match=re.escape(files[4]) + ".*changed"):
        ds.tokens(4 * 50, 5 * 50)
    assert (ds.tokens(0, 50) == np.arange(50)).all()  # the others read on


def _catalogued_then_damaged(tmp_path, monkeypatch):
    """A set opened once (its catalog written), then one byte of that catalog flipped:
    (spec, the first open's dataset, the catalog's path, its damaged bytes)."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    _llmc_set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin")
    ref = tokenfeed.open(spec)
    (name,) = os.listdir(cat)
    blob = bytearray((cat / name).read_bytes())
    blob[100] ^= 0xFF
    (cat / name).write_bytes(bytes(blob))
    return spec, ref, cat / name, bytes(blob)


def test_damaged_catalog_is_ignored_and_replaced(tmp_path, monkeypatch):
    spec, ref, path, blob = _catalogued_then_damaged(tmp_path, monkeypatch)
    ds = tokenfeed.open(spec)
    assert ds.fingerprint == ref.fingerprint
    assert path.read_bytes() != blob  # written again


def test_no_catalog_when_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", "off")
    _llmc_set(tmp_path / "d")
    tokenfeed.open(str(tmp_path / "d" / "shard_*.bin"))
    assert not (tmp_path / "catalog").exists()


def test_catalog_in_a_directory_others_can_write_is_not_used(tmp_path, monkeypatch):
    """A catalog says where every token lies: in a directory another user can write it is
    neither read nor written, and the open parses the files."""
    spec, ref, path, planted = _catalogued_then_damaged(tmp_path, monkeypatch)  # what another user could leave
    os.chmod(path.parent, 0o777)
    ds = tokenfeed.open(spec)
    assert ds.fingerprint == ref.fingerprint
    assert np.array_equal(ds.tokens(0, ds.num_tokens), ref.tokens(0, ref.num_tokens))
    assert path.read_bytes() == planted  # not read (it would be rewritten), not written
    os.chmod(path.parent, 0o700)
    tokenfeed.open(spec)
    assert path.read_bytes() != planted  # a private directory again: used


def test_catalog_directory_is_private_whatever_the_umask(tmp_path):
    """Under umask 002 the node's catalog directory (and its missing parents) is still made
    0700 and its files 0600, so it is used: the second open of a shard set lists nothing."""
    cat = tmp_path / "home" / "cache" / "catalog"
    files = _aged_set(tmp_path / "d")
    out = _run(f"""
        import os, stat, warnings
        os.umask(0o002)
        warnings.simplefilter("error")  # a refused catalog directory warns
        import tokenfeed
        spec = {str(tmp_path / "d" / "shard_*.bin")!r}
        first = tokenfeed.open(spec)
        os.environ["TOKENFEED_FAULT_NO_LISTING"] = "1"  # (test builds: a listing now fails the open)
        second = tokenfeed.open(spec)
        assert second.fingerprint == first.fingerprint and second.num_files == {len(files)}
        cat = {str(cat)!r}
        modes = [os.stat(p).st_mode & 0o777 for p in (cat, os.path.dirname(cat))]
        modes += [os.stat(os.path.join(cat, n)).st_mode & 0o777 for n in sorted(os.listdir(cat))]
        print(" ".join(f"{{m:o}}" for m in modes))
        """, {"TOKENFEED_CATALOG_DIR": str(cat)})
    modes = out.split()
    assert modes[:2] == ["700", "700"] and len(modes) == 4 and set(modes[2:]) == {"600"}, out


def test_refused_catalog_directory_is_said_once(tmp_path, monkeypatch):
    """A catalog directory others may write (made group-writable under umask 002 by an older
    version, or a team directory) is refused: a PerformanceWarning names it and says why, once."""
    cat = tmp_path / "catalog"
    cat.mkdir(mode=0o700)
    os.chmod(cat, 0o775)
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    _aged_set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin")
    with pytest.warns(tokenfeed.PerformanceWarning, match=re.escape(str(cat)) + ".*0775 lets others write it"):
        tokenfeed.open(spec)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenfeed.open(spec)  # said once
    assert os.listdir(cat) == []  # neither read nor written


# ---- shard sets from the catalog: no listing, no stat of each file at open -------------------

def _aged_set(d, n=12, per=50):
    """An llm.c shard set whose files and directory are old enough to be trusted."""
    files = _llmc_set(d, n, per)
    _aged([str(d)])
    return files


@pytest.mark.parametrize("form", ["glob", "directory"])
def test_shard_set_opened_from_the_catalog_without_listing(tmp_path, monkeypatch, form):
    import pickle

    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    files = _aged_set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin") if form == "glob" else str(tmp_path / "d") + "/"
    first = tokenfeed.open(spec)
    assert len(os.listdir(cat)) == 2  # the files' catalog, and the set's
    with monkeypatch.context() as m:
        _no_listing(m)
        second = tokenfeed.open(spec)
    assert second.fingerprint == first.fingerprint and second.num_files == len(files)
    assert second.paths == files == first.paths
    assert _stream_digest(second, "pread") == _stream_digest(first, "pread")
    assert _stream_digest(second, "mmap") == _stream_digest(first, "mmap")
    again = pickle.loads(pickle.dumps(second))  # what a spawned DataLoader worker receives
    assert again.fingerprint == first.fingerprint and again.paths == files


def test_a_file_added_to_the_directory_is_seen(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "catalog"))
    d = tmp_path / "d"
    files = _aged_set(d)
    spec = str(d / "shard_*.bin")
    tokenfeed.open(spec)
    extra = str(d / "shard_999.bin")
    write_llmc(extra, np.full(30, 5, dtype=np.uint16))
    _aged([extra])  # the directory's own modification time is now
    ds = tokenfeed.open(spec)
    assert ds.paths == files + [extra] and ds.num_tokens == 12 * 50 + 30
    os.unlink(files[0])
    ds = tokenfeed.open(spec)
    assert ds.paths == files[1:] + [extra]


def test_file_changed_in_place_under_a_trusted_set(tmp_path, monkeypatch):
    """The set's directory unchanged, a file rewritten in place under its name: the open
    trusts the catalog (no stat of each file), the first touch of that file is an error
    naming it, and the catalog entry is dropped, so the next open sees the new file."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    d = tmp_path / "d"
    files = _aged_set(d)
    spec = str(d / "shard_*.bin")
    tokenfeed.open(spec)
    dir_id = os.stat(d)
    write_llmc(files[4], np.full(77, 9, dtype=np.uint16))  # in place: another size, other tokens
    _aged([files[4]], 30)
    assert os.stat(d).st_mtime_ns == dir_id.st_mtime_ns  # nothing the set's identity shows
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(spec)  # trusted: the old description
        assert (ds.tokens(0, 50) == np.arange(50)).all()  # other files read on
        with pytest.raises(tokenfeed.FormatError, match=re.escape(files[4]) + ".*changed"):
            ds.tokens(4 * 50, 5 * 50)
    fresh = tokenfeed.open(spec)  # the stale entry is gone: listed and parsed again
    assert fresh.num_tokens == 11 * 50 + 77
    assert (fresh.tokens(4 * 50, 4 * 50 + 77) == 9).all()
    assert fresh.fingerprint == tokenfeed.open(files).fingerprint


def test_no_set_catalog_for_a_directory_modified_just_now(tmp_path, monkeypatch):
    """A directory modified within the last seconds could change again unseen by its
    modification time: its set is listed on every open until it settles."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    _llmc_set(tmp_path / "d")  # files aged, the directory not
    spec = str(tmp_path / "d" / "shard_*.bin")
    tokenfeed.open(spec)
    assert len(os.listdir(cat)) == 1  # the files' catalog only
    _aged([str(tmp_path / "d")])
    tokenfeed.open(spec)
    assert len(os.listdir(cat)) == 2


def test_nested_glob_lists_each_directory_once_and_is_catalogued(tmp_path, monkeypatch):
    """A glob whose wildcards span directories lists each directory once and records every
    one of them: the next open lists none, and a file or directory added to any is seen."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    (tmp_path / "a").mkdir()
    files = _aged_set(tmp_path / "a" / "d")
    more = _aged_set(tmp_path / "a" / "e", 3)
    _aged([str(tmp_path / "a")])
    spec = str(tmp_path / "a" / "*" / "shard_*.bin")
    first = tokenfeed.open(spec)
    assert first.paths == files + more
    with monkeypatch.context() as m:
        _no_listing(m)
        again = tokenfeed.open(spec)  # from the catalog
    assert again.paths == files + more and again.fingerprint == first.fingerprint
    extra = str(tmp_path / "a" / "e" / "shard_999.bin")
    write_llmc(extra, np.full(30, 5, dtype=np.uint16))
    assert tokenfeed.open(spec).paths == files + more + [extra]  # e/ changed: listed again
    _aged_set(tmp_path / "a" / "f", 2)
    assert tokenfeed.open(spec).num_files == 12 + 3 + 1 + 2  # a/ changed: a new directory seen
    for k in range(9):  # more directories than a listing first has room for
        _aged_set(tmp_path / "a" / f"g{k}", 1)
    _aged([str(tmp_path / "a")])
    wide = tokenfeed.open(spec)
    assert wide.num_files == 12 + 3 + 1 + 2 + 9 and wide.paths == sorted(wide.paths)
    tokenfeed.open(files[:5])  # a list of files: a files' catalog, no set
    with monkeypatch.context() as m:
        _no_listing(m)
        with pytest.raises(OSError, match="listed"):
            tokenfeed.open(files[:5] + [str(tmp_path / "a" / "f") + "/"])


def test_native_dataset_trusts_its_manifest(tmp_path, monkeypatch):
    """A tokenfeed dataset's catalog is trusted while its manifest is unchanged: a shard
    damaged in place is found on first touch, naming it."""
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "catalog"))
    d = _native_set(tmp_path / "native")
    _aged([str(p) for p in d.iterdir()] + [str(d)])
    a = tokenfeed.open(str(d))
    shard = a.files()[1]
    with open(shard["path"], "r+b") as f:  # same size, in place
        f.seek(0)
        f.write(b"\0" * 8)
    _aged([shard["path"]], 30)
    b = tokenfeed.open(str(d))
    with pytest.raises(tokenfeed.FormatError, match=re.escape(shard["path"])):
        b.tokens(shard["first_token"], shard["first_token"] + shard["num_tokens"])


def test_catalog_directory_stays_under_its_bound(tmp_path, monkeypatch):
    """$TOKENFEED_CATALOG_MAX bounds the node's catalog directory: past it, the catalogs used
    least recently are deleted, and an open whose catalog went parses its files again."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    monkeypatch.setenv("TOKENFEED_CATALOG_MAX", "5K")
    sets = [_llmc_set(tmp_path / f"d{k}", n=20) for k in range(4)]
    ref = [tokenfeed.open(files).fingerprint for files in sets]

    def used():
        return sum(os.path.getsize(cat / n) for n in os.listdir(cat))

    for k, files in enumerate(sets):
        assert tokenfeed.open(files).fingerprint == ref[k]
        assert used() <= 5000
    assert len(os.listdir(cat)) < len(sets)  # the oldest went
    assert tokenfeed.open(sets[0]).fingerprint == ref[0]  # parsed again, catalogued again
    assert used() <= 5000


@pytest.mark.parametrize("bound", ["1.5G", "1T", "2TB", "0.5MiB", " 64 kib ", "3000000000"])
def test_catalog_bound_reads_sizes_as_every_size_setting_does(tmp_path, monkeypatch, bound):
    """$TOKENFEED_CATALOG_MAX is read by the parser of every size setting (fractions, K/M/G/T
    with or without B, KiB/MiB/...): a bound of 1.5G keeps every small catalog, never one."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    monkeypatch.setenv("TOKENFEED_CATALOG_MAX", bound)
    sets = [_llmc_set(tmp_path / f"d{k}", n=20) for k in range(3)]
    for files in sets:
        tokenfeed.open(files)
    assert len([n for n in os.listdir(cat) if n.endswith(".tfcat")]) == len(sets)


@pytest.mark.parametrize("bad", ["1.5X", "lots", "-1G", "1.2.3G", "G"])
def test_catalog_bound_that_is_not_a_size_is_refused(tmp_path, monkeypatch, bad):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "catalog"))
    monkeypatch.setenv("TOKENFEED_CATALOG_MAX", bad)
    files = _llmc_set(tmp_path / "d", n=3)
    with pytest.raises(ValueError, match=r"TOKENFEED_CATALOG_MAX.*" + re.escape(repr(bad)[1:-1]) + r".*1\.5TiB.*KiB"):
        tokenfeed.open(files)
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", "off")  # no catalog: the bound is not read
    assert tokenfeed.open(files).num_files == 3


def test_one_size_parser():
    """The Python options (cache_limit, --keep) and the C library's variables share one parser."""
    from tokenfeed import _core
    from tokenfeed.remote._remote import parse_size
    for text, want in [("1.5G", 1_500_000_000), ("1T", 10 ** 12), ("2KiB", 2048), ("1.5TiB", 3 << 39),
                       ("7", 7), ("10kb", 10_000), (".5GiB", 1 << 29), ("18446744073709551615", 2 ** 64 - 1)]:
        assert _core.parse_size(text, "x") == parse_size(text) == want, text
    with pytest.raises(ValueError, match="more bytes than 64 bits"):
        _core.parse_size("18446744073709551616", "x")
    with pytest.raises(ValueError, match="x: cannot read '5 parsecs' as a size"):
        _core.parse_size("5 parsecs", "x")


@pytest.mark.test_hooks
def test_large_node_catalog_is_compressed_and_read_back(tmp_path, monkeypatch):
    """A node's catalog over 4 MiB is stored zstd-compressed (in a build with zstd; a test
    build lowers the size to 64 KiB): opened from it without listing or reading a file, the
    set is the same; damaged, it is ignored and written again."""
    cat = tmp_path / "catalog"
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    monkeypatch.setenv("TOKENFEED_TEST_CATALOG_PACK_ABOVE", str(64 << 10))
    files = _aged_set(tmp_path / "d", n=600, per=8)
    spec = str(tmp_path / "d" / "shard_*.bin")
    first = tokenfeed.open(spec)
    (name,) = [n for n in os.listdir(cat) if n.endswith(".tfcat")]
    blob = (cat / name).read_bytes()
    if tokenfeed.build_info()["zstd"]["compiled"]:
        assert blob[:8] == b"TFCATZS1" and len(blob) < 600 * 161 // 4, len(blob)
    with monkeypatch.context() as m:
        _no_listing(m)
        second = tokenfeed.open(spec)
    assert second.paths == files and second.fingerprint == first.fingerprint
    assert _stream_digest(second, "pread") == _stream_digest(first, "pread")
    damaged = bytearray(blob)
    damaged[len(damaged) // 2] ^= 0xFF
    (cat / name).write_bytes(bytes(damaged))
    third = tokenfeed.open(spec)  # parsed again, not read from the damaged catalog
    assert third.fingerprint == first.fingerprint and third.paths == files
    assert (cat / name).read_bytes() != bytes(damaged)  # written again


# ---- metadata system calls at start-up: O(1) per rank, whatever the number of shards -------------

_META_CALLS = ("stat", "lstat", "fstat", "newfstatat", "statx", "open", "openat", "access", "faccessat",
               "faccessat2", "readlink", "readlinkat", "getdents64")


def _strace() -> str:
    import shutil

    exe = shutil.which("strace")
    if exe is None:
        pytest.skip("strace is not installed (apt-get install strace): it counts the open's system calls")
    if subprocess.run([exe, "-f", "-o", os.devnull, "true"], capture_output=True).returncode != 0:
        pytest.skip("strace cannot trace here (no ptrace in this container)")
    return exe


def _count_meta_calls(spec: str, env_extra: dict, *, immutable: bool = False, data_dir: str = "",
                      open_kw: str = "") -> dict:
    """Metadata system calls of a fresh process, after `import tokenfeed`: opening spec (the node's
    catalog already holding it) and its first batch; and those of the open alone that name a
    file under data_dir."""
    code = textwrap.dedent(f"""
        import os, tokenfeed
        os.path.exists("/tokenfeed-mark-start")
        ds = tokenfeed.open({spec!r}, immutable={immutable!r}{open_kw})
        os.path.exists("/tokenfeed-mark-opened")
        # (one thread, one batch ahead: the calls of the first batch, not of those assembled after it)
        loader = tokenfeed.Loader(ds, seq_len=64, batch_size=8, seed=0, output="numpy", num_threads=1,
                                  prefetch_batches=1)
        next(iter(loader))
        os.path.exists("/tokenfeed-mark-end")
        loader.close()
    """)
    import tempfile

    fd, trace = tempfile.mkstemp(prefix="tokenfeed-trace-")
    os.close(fd)
    env = dict(os.environ)
    env.update(env_extra)
    r = subprocess.run([_strace(), "-f", "-qq", "-o", trace, "-e", "trace=" + ",".join(_META_CALLS),
                        sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(trace) as f:
        lines = [ln for ln in f if "resumed>" not in ln and "+++" not in ln and "---" not in ln]
    os.unlink(trace)
    start = next(i for i, ln in enumerate(lines) if "tokenfeed-mark-start" in ln)
    opened = next(i for i, ln in enumerate(lines) if "tokenfeed-mark-opened" in ln)
    end = next(i for i, ln in enumerate(lines) if "tokenfeed-mark-end" in ln)
    return {"total": end - start - 2, "open": lines[start + 1:opened], "open_calls": opened - start - 1,
            "open_on_data": [ln for ln in lines[start + 1:opened] if data_dir and data_dir in ln]}


def _many_llmc(d, n: int, per: int = 64) -> None:
    os.makedirs(d, exist_ok=True)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, per
    body = header.tobytes() + np.arange(per, dtype=np.uint16).tobytes()
    for i in range(n):
        with open(os.path.join(str(d), f"s_{i:06d}.bin"), "wb") as f:
            f.write(body)
    names = [os.path.join(str(d), f"s_{i:06d}.bin") for i in range(n)]
    _aged(names + [str(d)])


@pytest.mark.parametrize("n", [10, 10_000])
def test_second_open_and_first_batch_make_a_bounded_number_of_metadata_calls(tmp_path, n):
    """A set opened again on a node that holds its catalog, as a glob and as a directory, and its
    first batch: at most 64 metadata system calls after import, for 10 shards as for 10^4 (a
    shared file system answers each with a round trip to a metadata server all ranks share)."""
    _strace()
    d = tmp_path / "d"
    _many_llmc(d, n, per=1024)
    env = {"TOKENFEED_CATALOG_DIR": str(tmp_path / "catalog")}
    for spec in (str(d / "s_*.bin"), str(d) + "/"):
        _run(f"import tokenfeed; tokenfeed.open({spec!r})", env)  # the first open records the set
        got = _count_meta_calls(spec, env)
        assert got["total"] <= 64, (spec, got["total"], "".join(got["open"]))


def test_immutable_open_looks_at_no_directory(tmp_path, monkeypatch):
    """immutable=True: a set this node catalogued opens without a call on the data's file system
    (not even the directory's identity) before its files are touched; a file modified since is
    still an error naming it at first touch, and a file added is not seen (the documented risk)."""
    d = tmp_path / "d"
    _many_llmc(d, 20)
    env = {"TOKENFEED_CATALOG_DIR": str(tmp_path / "catalog")}
    spec = str(d / "s_*.bin")
    _run(f"import tokenfeed; tokenfeed.open({spec!r})", env)
    try:
        got = _count_meta_calls(spec, env, immutable=True, data_dir=str(d))
    except pytest.skip.Exception:
        got = None
    if got is not None:
        assert got["open_on_data"] == [], "".join(got["open_on_data"])
        assert got["total"] <= 64
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", env["TOKENFEED_CATALOG_DIR"])
    extra = str(d / "s_999999.bin")
    write_llmc(extra, np.full(30, 5, dtype=np.uint16))
    victim = str(d / "s_000004.bin")
    write_llmc(victim, np.full(64, 9, dtype=np.uint16))  # same size, other tokens
    _aged([victim], 30)
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(spec, immutable=True)
        assert ds.num_files == 20  # the file added is not seen: the caller vouched for the set
        assert (ds.tokens(0, 64) == np.arange(64)).all()
        with pytest.raises(tokenfeed.FormatError, match=re.escape(victim) + ".*changed"):
            ds.tokens(4 * 64, 5 * 64)
    _aged([extra, str(d)])  # (settled: the open below records the set again)
    assert tokenfeed.open(spec).num_files == 21  # without immutable: the directory changed, listed again
    gone = str(d / "s_000007.bin")
    os.unlink(gone)
    ds = tokenfeed.open(spec, immutable=True)  # the set as recorded by the open just above
    assert ds.num_files == 21
    with pytest.raises(FileNotFoundError, match=re.escape(gone)):
        ds.tokens(7 * 64, 8 * 64)  # a file removed since: an error naming it at its first touch


@pytest.mark.parametrize("form", ["llm.c glob", "llm.c directory", "npy directory", "megatron directory",
                                  "raw directory with .index", "raw glob with eos_id"])
def test_first_open_probes_no_companion_file_per_shard(tmp_path, form):
    """Listing a set shows which companion files exist (.idx, .index, .tfdocs, .csv.gz): the first
    open (the node's catalog off) asks for no name that is not there, whatever the number of
    shards, and makes a bounded number of calls per shard (those that read it)."""
    _strace()
    n = 60
    d = tmp_path / "d"
    d.mkdir()
    kw = ""
    for i in range(n):
        p = str(d / f"p_{i:04d}")
        toks = np.arange(100, dtype=np.uint16)
        if form.startswith("llm.c"):
            write_llmc(p + ".bin", toks)
        elif form.startswith("npy"):
            np.save(p + ".npy", toks)
        elif form.startswith("megatron"):
            from conftest import write_megatron
            write_megatron(p, [toks[:50], toks[50:]])
        elif "index" in form:
            toks.tofile(p + ".ds")
            np.array([50, 100], dtype=np.uint64).tofile(p + ".ds.index")
            kw = ", dtype='uint16'"
        else:
            toks.tofile(p + ".ds")
            kw = ", dtype='uint16', eos_id=7"
    spec = str(d / ("*.bin" if form == "llm.c glob" else "*.ds")) if "glob" in form else str(d) + "/"
    got = _count_meta_calls(spec, {"TOKENFEED_CATALOG_DIR": "off"}, data_dir=str(d), open_kw=kw)
    missing = [ln for ln in got["open_on_data"] if "ENOENT" in ln]
    assert len(missing) <= 12, "".join(missing)  # (the spec itself; the first files checked for text)
    per = 8 if "eos_id" in form else 6  # (eos_id: its index also looked for in the node's index directory)
    assert got["open_calls"] <= per * n + 64, "".join(got["open"][:40])



def _resident_pages(path: str, offsets: list) -> list:
    """Whether the page cache holds the pages of path at these byte offsets (mincore over a
    mapping of our own: residency is the file's, whoever mapped it, and mapping reads nothing)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size, page = os.path.getsize(path), mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    fd = os.open(path, os.O_RDONLY)
    try:
        p = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert p not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            assert libc.mincore(p, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(p, size)
    finally:
        os.close(fd)
    return [bool(vec[off // page] & 1) for off in offsets]


def test_opening_a_large_shard_reads_no_more_than_its_end_pages(tmp_path):
    """Opening a large shard reads its first and last pages (header, fingerprint, the check that
    a mapped file still holds what was read) and no page around them: a fault under the
    default advice would read the kernel's read-around window with it, a random read of tens
    of pages per shard that made opening 10^4 shards on a cold page cache ten times slower.
    A sparse shard: its pages past the header are in no cache until read."""
    import mmap
    path = tmp_path / "big.bin"
    n = 8 << 20  # 16 MiB of tokens: far past any read-ahead of the header's page
    write_llmc(path, np.arange(64, dtype=np.uint16))
    header = np.fromfile(path, dtype=np.int32, count=256)
    header[2] = n
    with open(path, "r+b") as fh:
        fh.write(header.tobytes())
        fh.truncate(1024 + 2 * n)  # a hole from token 64 on
    size, page = os.path.getsize(path), mmap.PAGESIZE
    ds = tokenfeed.open(str(path))
    assert ds.num_tokens == n
    assert np.array_equal(np.asarray(ds.tokens(0, 64)), np.arange(64))
    near_end = [size - k * page for k in (2, 4, 8, 16, 32)]
    resident = _resident_pages(str(path), [0, size - 1] + near_end)
    assert resident[0], "the header's page was read, so the cache holds it"
    assert not any(resident[2:]), f"pages before the last were read at open: {resident[2:]}"
    assert int(np.asarray(ds.tokens(n - 4, n)).sum()) == 0  # and the end reads (zeros: the hole)

"""A shard set's catalog beside its data (``tokenfeed index DIR|GLOB``, ``tokenfeed.build_catalog``):
every machine that reads the data opens the set from it without listing the directory or reading
a file; a directory changed since is listed again (with a warning to rebuild), a file changed in
place is an error naming it on first touch, and the catalog holds on another machine's copy of
the files (identities by size and modification time)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tokenfeed
from conftest import ROOT, write_llmc
from conftest import aged as _aged
from conftest import forbid_listing as _no_listing
from conftest import llmc_shard_set as _set


def _digest(ds):
    import hashlib
    h = hashlib.sha256()
    with tokenfeed.Loader(ds, seq_len=31, batch_size=4, seed=0, output="numpy", backend="pread") as l:
        for _ in range(12):
            h.update(np.ascontiguousarray(next(l)["tokens"]).tobytes())
    return h.hexdigest()


@pytest.fixture(autouse=True)
def no_node_catalog(monkeypatch):
    """Only the catalog beside the data: the node's own would answer first."""
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", "off")


@pytest.mark.parametrize("form", ["glob", "directory"])
def test_opened_from_the_catalog_beside_the_data(tmp_path, monkeypatch, form):
    files = _set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin") if form == "glob" else str(tmp_path / "d")
    ref = tokenfeed.open(spec)
    written = tokenfeed.build_catalog(spec)
    assert os.path.dirname(written) == str(tmp_path / "d")
    assert os.path.basename(written).startswith(".tokenfeed-catalog-")
    assert tokenfeed.open(str(tmp_path / "d")).paths == files  # the catalog is not data: a listing skips it
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(spec)
    assert ds.paths == files and ds.fingerprint == ref.fingerprint and ds.num_tokens == ref.num_tokens
    assert _digest(ds) == _digest(ref)


def test_keyed_by_pattern_and_options(tmp_path, monkeypatch):
    _set(tmp_path / "d")
    tokenfeed.build_catalog(str(tmp_path / "d" / "shard_00*.bin"))
    with monkeypatch.context() as m:
        _no_listing(m)
        assert tokenfeed.open(str(tmp_path / "d" / "shard_00*.bin")).num_files == 10
        with pytest.raises((AssertionError, OSError), match="listed"):  # another pattern: not this catalog
            tokenfeed.open(str(tmp_path / "d" / "shard_*.bin"))


def test_a_changed_directory_is_listed_again_with_a_warning(tmp_path):
    d = tmp_path / "d"
    files = _set(d)
    spec = str(d / "shard_*.bin")
    tokenfeed.build_catalog(spec)
    extra = str(d / "shard_999.bin")
    write_llmc(extra, np.full(30, 5, dtype=np.uint16))
    with pytest.warns(tokenfeed.PerformanceWarning, match="older than its directory.*tokenfeed index") as seen:
        ds = tokenfeed.open(spec)
    assert ds.paths == files + [extra] and ds.num_tokens == 12 * 50 + 30
    # a sentence for the user, not an OSError's repr
    assert not any(str(w.message).startswith("[Errno") for w in seen), [str(w.message) for w in seen]


def test_a_file_changed_in_place_is_an_error_naming_it(tmp_path, monkeypatch):
    d = tmp_path / "d"
    files = _set(d)
    spec = str(d / "shard_*.bin")
    tokenfeed.build_catalog(spec)
    write_llmc(files[4], np.full(50, 9, dtype=np.uint16))  # same size, other tokens, in place
    _aged([files[4]], 30)
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(spec)
    assert (ds.tokens(0, 50) == np.arange(50)).all()
    with pytest.raises(tokenfeed.FormatError, match=re.escape(files[4]) + ".*tokenfeed index.*changed"):
        ds.tokens(4 * 50, 5 * 50)
    tokenfeed.build_catalog(spec)  # rebuilt: the new tokens
    assert (tokenfeed.open(spec).tokens(4 * 50, 5 * 50) == 9).all()


@pytest.mark.parametrize("size", ["same size", "longer"])
def test_a_file_changed_in_place_says_first_to_rebuild_the_catalog(tmp_path, monkeypatch, size):
    """Every later open believes the catalog (the old token count): opening again cannot help,
    so the error leads with the command that rebuilds the catalog, then says what differs."""
    d = tmp_path / "d"
    files = _set(d)
    spec = str(d / "shard_*.bin")
    tokenfeed.build_catalog(spec)
    write_llmc(files[4], np.full(50 if size == "same size" else 80, 9, dtype=np.uint16))
    _aged([files[4]], 30)
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(spec)
    with pytest.raises(tokenfeed.FormatError) as ei:
        ds.tokens(4 * 50, 5 * 50)
    msg = str(ei.value)
    first = msg.split(". ")[0]
    assert files[4] in first and f"tokenfeed index '{d}/" in first, msg
    assert "open the dataset again" not in msg.split("tokenfeed index")[0], msg
    assert "changed" in msg  # what differs, after


def test_holds_on_another_machines_copy(tmp_path, monkeypatch):
    """Another machine sees the same files with other device and inode numbers (NFS, a
    parallel file system): the catalog compares sizes and modification times."""
    d = tmp_path / "d"
    files = _set(d)
    tokenfeed.build_catalog(str(d / "shard_*.bin"))
    copy = tmp_path / "copy"
    shutil.copytree(d, copy, copy_function=shutil.copy2)  # new inodes, same times
    st = os.stat(d)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(copy).st_size == st.st_size  # the same names: the same directory size
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(str(copy / "shard_*.bin"))
    assert ds.paths == [str(copy / os.path.basename(f)) for f in files]
    assert (ds.tokens(0, ds.num_tokens) == tokenfeed.open(files).tokens(0, ds.num_tokens)).all()


def test_build_catalog_refuses_what_it_cannot_describe(tmp_path):
    files = _set(tmp_path / "d")
    with pytest.raises(ValueError, match="one local directory"):
        tokenfeed.build_catalog(files[0])
    with pytest.raises(ValueError, match="one local directory"):
        tokenfeed.build_catalog(str(tmp_path / "*" / "shard_*.bin"))


def test_cli_writes_the_catalog(tmp_path):
    _set(tmp_path / "d")
    r = subprocess.run([sys.executable, "-m", "tokenfeed", "index", str(tmp_path / "d" / "shard_*.bin")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, TOKENFEED_CATALOG_DIR="off"))
    assert r.returncode == 0, r.stderr
    assert "catalog" in r.stdout and ".tokenfeed-catalog-" in r.stdout
    # what it found: the files, their format and dtype, the tokens and documents
    ds = tokenfeed.open(str(tmp_path / "d" / "shard_*.bin"))
    assert f"{ds.num_files} files (llm.c, uint16), {ds.num_tokens:,} tokens, {ds.num_documents:,} documents" \
        in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "tokenfeed", "index", str(tmp_path / "d" / "shard_000.bin"),
                        "--eos-id", "3"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0 and "--dtype" in r.stderr


def test_a_catalog_planted_by_another_user_is_not_read(tmp_path, monkeypatch):
    """In a directory anyone may create files in, a catalog owned by neither the user opening
    the set nor the directory's owner is ignored: the set is listed instead."""
    d = tmp_path / "d"
    files = _set(d)
    written = tokenfeed.build_catalog(str(d / "shard_*.bin"))
    if os.geteuid() == 0:
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(written, nobody.pw_uid, nobody.pw_gid)  # as if "nobody" had left it there
        with monkeypatch.context() as m:
            _no_listing(m)
            with pytest.raises((AssertionError, OSError), match="listed"):
                tokenfeed.open(str(d / "shard_*.bin"))
    assert tokenfeed.open(str(d / "shard_*.bin")).paths == files  # listed, or (this user's) read


def _open_in_child(spec: str, env: dict, timeout: float = 120) -> dict:
    """tokenfeed.open(spec) in a child process, bounded (a hang fails the test rather than the
    suite): its files, the warnings it gave and how much its peak resident memory grew during
    the open (the growth, not the peak: a sanitizer's own memory makes the peak large)."""
    import json
    import textwrap
    code = textwrap.dedent(f"""
        import json, resource, warnings
        import tokenfeed
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ds = tokenfeed.open({spec!r})
        print(json.dumps({{"paths": ds.paths, "warnings": [str(x.message) for x in w],
                           "rss_growth_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}}))
        """)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _as_nobody(path: str) -> None:
    """Make path another user's (nobody's) when root; as an ordinary user, one others may write."""
    if os.geteuid() == 0:
        import pwd
        nobody = pwd.getpwnam("nobody")
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    else:
        os.chmod(path, 0o666)


@pytest.mark.parametrize("planted", ["fifo", "sparse"])
def test_a_fifo_or_huge_file_under_the_catalogs_name_is_refused_unread(tmp_path, planted):
    """Under the predictable name of a set's catalog in a directory others may write, a FIFO
    neither blocks the open nor is read, and a 2 GiB sparse file is refused (another user's)
    before a byte is read: the open lists the set, with a warning saying why."""
    d = tmp_path / "d"
    files = _set(d)
    spec = str(d / "shard_*.bin")
    name = tokenfeed.build_catalog(spec)
    os.unlink(name)
    if planted == "fifo":
        os.mkfifo(name, 0o644)
    else:
        with open(name, "wb") as f:
            f.truncate(2 << 30)  # no disk used
    _as_nobody(name)
    _aged([str(d)])
    got = _open_in_child(spec, {"TOKENFEED_CATALOG_DIR": "off"})
    assert got["paths"] == files
    why = "FIFO" if planted == "fifo" else "belongs to user nobody" if os.geteuid() == 0 else "lets others write it"
    assert any(os.path.basename(name) in w and why in w for w in got["warnings"]), got["warnings"]
    assert got["rss_growth_kib"] < 1 << 20, got["rss_growth_kib"]  # the 2 GiB were not read (a whole read is ~2 GiB)


def test_a_fifo_under_the_node_catalogs_names_does_not_block(tmp_path):
    """The node's catalog and set record are read without blocking on what stands under their
    names: a FIFO there is not a catalog, and the set is parsed (and catalogued again)."""
    cat = tmp_path / "catalog"
    files = _set(tmp_path / "d")
    _aged([str(tmp_path / "d")])
    spec = str(tmp_path / "d" / "shard_*.bin")
    assert _open_in_child(spec, {"TOKENFEED_CATALOG_DIR": str(cat)})["paths"] == files
    names = sorted(os.listdir(cat))
    assert {n.rsplit(".", 1)[1] for n in names} == {"tfcat", "tfset"}
    for n in names:
        os.unlink(cat / n)
        os.mkfifo(cat / n, 0o600)
    assert _open_in_child(spec, {"TOKENFEED_CATALOG_DIR": str(cat)})["paths"] == files


def test_a_catalog_of_other_options_is_said_unused(tmp_path):
    """A catalog built without --format goes unused by an open that names the format (another
    key): said once, naming the catalog and the option that differs; likewise the directory
    opened after its glob's index."""
    from tokenfeed import PerformanceWarning

    d = tmp_path / "d"
    _set(d)
    spec = str(d / "shard_*.bin")
    tokenfeed.build_catalog(spec)
    with pytest.warns(PerformanceWarning, match=r"\.tokenfeed-catalog-.*format: the catalog's None, this open's 'llm.c'"):
        ds = tokenfeed.open(spec, format="llm.c")
    assert ds.num_files == 12
    with pytest.warns(PerformanceWarning, match=r"\.tokenfeed-catalog-.*another glob"):
        assert tokenfeed.open(str(d)).num_files == 12


def _catalog_version(path):
    with open(path, "rb") as f:
        head = f.read(16)
    assert head[:8] == b"TFCATLG1"
    return int.from_bytes(head[8:12], "little"), int.from_bytes(head[12:16], "little")


@pytest.mark.test_hooks
def test_a_large_catalog_beside_the_data_is_stored_compressed(tmp_path, monkeypatch):
    """Every open of the set reads the catalog beside the data whole: past a size (4 MiB, here
    lowered by a test build's hook) its file records are stored compressed. The same set's
    catalog in the uncompressed form (what smaller sets, and earlier versions, write) is read as
    before; a compressed one damaged anywhere, or cut short, is no catalog: the set is listed."""
    files = _set(tmp_path / "d", n=200)
    spec = str(tmp_path / "d" / "shard_*.bin")
    ref = tokenfeed.open(files)
    plain = tokenfeed.build_catalog(spec)
    assert _catalog_version(plain) == (3, 3)
    plain_size = os.path.getsize(plain)
    monkeypatch.setenv("TOKENFEED_TEST_CATALOG_PACK_ABOVE", "1024")
    _aged([str(tmp_path / "d")])
    packed = tokenfeed.build_catalog(spec)
    assert packed == plain
    version, flags = _catalog_version(packed)
    assert version == 4 and flags & 16
    assert os.path.getsize(packed) * 3 < plain_size, (os.path.getsize(packed), plain_size)
    with monkeypatch.context() as m:
        _no_listing(m)
        ds = tokenfeed.open(spec)
    assert ds.paths == files and ds.fingerprint == ref.fingerprint and _digest(ds) == _digest(ref)
    good = open(packed, "rb").read()
    for damaged in (good[:60] + bytes([good[60] ^ 1]) + good[61:],  # the frame
                    good[:-9] + bytes([good[-9] ^ 1]) + good[-8:],  # the directory's identity
                    good[:len(good) // 2]):  # cut short
        with open(packed, "r+b") as f:  # in place: the directory keeps its identity
            f.truncate(0)
            f.write(damaged)
        _aged([packed, str(tmp_path / "d")])
        assert tokenfeed.open(spec).paths == files
    # huge lengths in an otherwise sealed header are no catalog either
    import xxhash
    hostile = bytearray(good)
    hostile[40:48] = (1 << 62).to_bytes(8, "little")
    hostile[-8:] = xxhash.xxh64_intdigest(bytes(hostile[:-8]), seed=0).to_bytes(8, "little")
    with open(packed, "r+b") as f:
        f.write(hostile)
    assert tokenfeed.open(spec).paths == files


def test_an_unchanged_set_leaves_the_node_record_as_it_was(tmp_path, monkeypatch):
    """The node's record of a set whose directories did not change is kept as it is (the same
    file, not written again) by every open that finds it so, opened from the catalog beside
    the data or from the node's own."""
    cat = tmp_path / "catalog"
    files = _set(tmp_path / "d")
    spec = str(tmp_path / "d" / "shard_*.bin")
    tokenfeed.build_catalog(spec)
    import time
    time.sleep(2.2)  # the directory settles (a node's record trusts none changed in the last 2 s)
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(cat))
    assert tokenfeed.open(spec).paths == files
    (rec,) = [cat / n for n in os.listdir(cat) if n.endswith(".tfset")]
    before = os.stat(rec)
    for _ in range(3):
        assert tokenfeed.open(spec).paths == files
    # (a write goes to a new file renamed over the old: another inode; a read only marks the
    # record used, its times, for the directory's trimming)
    assert os.stat(rec).st_ino == before.st_ino

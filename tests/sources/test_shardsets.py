"""Shard sets: a directory of foreign token files or a glob opens as its files in sorted name
order, local and remote; a directory that mixes formats or holds none is refused with what it
holds; opening a list of remote llm.c shards learns everything from one listing."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tokenfeed
from conftest import write_llmc, write_megatron
from remote_util import INTERRUPTIBLE, FaultProxy, bucket, moto  # noqa: F401  (fixtures)


def _tokens(ds):
    return ds.tokens(0, ds.num_tokens)


def _shards(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50000, size=int(rng.integers(5, 40)), dtype=np.uint16) for _ in range(n)]


def _same_as_list(ds, files):
    ref = tokenfeed.open(files)
    assert ds.paths == files
    assert ds.fingerprint == ref.fingerprint and ds.num_documents == ref.num_documents
    assert np.array_equal(_tokens(ds), _tokens(ref))


def test_npy_directory_and_glob_sorted(tmp_path):
    d = tmp_path / "npy"
    d.mkdir()
    shards = _shards(12)
    for i in reversed(range(12)):  # written out of order: the set is sorted by name
        np.save(d / f"part-{i:03d}.npy", shards[i])
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".hidden.npy").write_bytes(b"")
    (d / "README.md").write_text("# a dataset card\n")
    (d / "index.json").write_text("{}")
    (d / "part-000.csv.gz").write_bytes(b"")  # OLMo's document metadata beside its .npy
    (d / "part-001.npy.tfdocs").write_bytes(b"")  # a document index beside its file
    files = [str(d / f"part-{i:03d}.npy") for i in range(12)]
    for spec in (str(d), str(d) + "/", str(d / "*.npy"), str(d / "part-00?.npy")):
        ds = tokenfeed.open(spec)
        assert ds.format == "npy" and ds.num_files == (12 if "?" not in spec else 10)
        _same_as_list(ds, files[:ds.num_files])
    assert np.array_equal(_tokens(tokenfeed.open(str(d))), np.concatenate(shards))


def test_llmc_megatron_raw_directories(tmp_path):
    shards = _shards(4, seed=1)
    llmc, mg, raw = tmp_path / "llmc", tmp_path / "mg", tmp_path / "raw"
    for p in (llmc, mg, raw):
        p.mkdir()
    for i, s in enumerate(shards):
        write_llmc(llmc / f"train_{i:06d}.bin", s, 1)
        write_megatron(str(mg / f"text_{i}"), [s[:3], s[3:]], 8)
        s.tofile(raw / f"t{i}.ds")
        np.array([3, len(s)], dtype=np.uint64).tofile(raw / f"t{i}.ds.index")
    ds = tokenfeed.open(str(llmc))
    assert ds.format == "llm.c"
    _same_as_list(ds, [str(llmc / f"train_{i:06d}.bin") for i in range(4)])
    ds = tokenfeed.open(str(mg))
    assert ds.format == "megatron" and ds.num_documents == 8
    _same_as_list(ds, [str(mg / f"text_{i}.bin") for i in range(4)])
    assert tokenfeed.open(str(mg / "*")).num_documents == 8  # both files of a pair: one entry
    ds = tokenfeed.open(str(raw), dtype="uint16")
    assert ds.format == "raw" and ds.num_documents == 8  # the datatrove indexes belong to their files
    assert np.array_equal(_tokens(ds), np.concatenate(shards))


def test_mixed_or_empty_directory_says_what_it_found(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    np.save(d / "a.npy", np.arange(4, dtype=np.uint16))
    write_llmc(d / "b.bin", np.arange(4), 1)
    write_llmc(d / "c.bin", np.arange(4), 1)
    with pytest.raises(tokenfeed.FormatError, match=r"more than one format: 2 \.bin files \(b\.bin, c\.bin\); "
                                                    r"1 \.npy files \(a\.npy\)"):
        tokenfeed.open(str(d))
    assert tokenfeed.open(str(d / "*.bin")).num_files == 2  # a glob picks one format out
    e = tmp_path / "empty"
    (e / "train").mkdir(parents=True)
    (e / "_SUCCESS").write_bytes(b"")
    (e / "README.md").write_bytes(b"")
    with pytest.raises(tokenfeed.FormatError, match=r"no manifest .*found 1 subdirectories \(train\) and 2 files "
                                                    r"that are not token data \(README\.md, _SUCCESS\)"):
        tokenfeed.open(str(e))
    with pytest.raises(FileNotFoundError, match="no file or directory matches"):
        tokenfeed.open(str(tmp_path / "nothing-*.bin"))


def test_hostile_specs_and_planted_entries(tmp_path):
    """What another user or a mistake may put in a spec or a directory: a FIFO under a data name
    (never opened: listing does not hang on it), a symlink to a shard elsewhere (followed, as a
    file), a name that holds '*' itself (that file), an unclosed '[' and a pattern longer than
    any path (no match, said), a wildcard over directories that matches files too."""
    d = tmp_path / "d"
    d.mkdir()
    for i in range(3):
        write_llmc(d / f"shard_{i}.bin", np.arange(10) + 10 * i, 1)
    os.mkfifo(d / "shard_9.bin")  # a FIFO: neither a data file nor opened
    outside = tmp_path / "outside.bin"
    write_llmc(outside, np.arange(5) + 90, 1)
    os.symlink(outside, d / "shard_5.bin")
    ds = tokenfeed.open(str(d / "shard_*.bin"))
    assert ds.paths == [str(d / f"shard_{i}.bin") for i in (0, 1, 2, 5)] and ds.num_tokens == 35
    assert tokenfeed.open(str(d) + "/").num_files == 4
    star = d / "lit*.bin"
    write_llmc(star, np.arange(7), 1)
    assert tokenfeed.open(str(star)).paths == [str(star)]  # a name that exists is that name
    with pytest.raises(FileNotFoundError, match="no file or directory matches"):
        tokenfeed.open(str(d / "shard_[0-9.bin"))
    with pytest.raises(FileNotFoundError, match="xxxx"):  # (the message, cut short, names it)
        tokenfeed.open(str(d / ("x" * 5000 + "*.bin")))
    with pytest.raises(FileNotFoundError):
        tokenfeed.open(str(tmp_path / "no-such-dir" / "*.bin"))
    (tmp_path / "e").mkdir()
    write_llmc(tmp_path / "e" / "shard_7.bin", np.arange(4), 1)
    got = tokenfeed.open(str(tmp_path / "*" / "shard_[57].bin"))  # (outside.bin is no directory)
    assert got.paths == [str(d / "shard_5.bin"), str(tmp_path / "e" / "shard_7.bin")]


def test_unfinished_native_write_still_reported(tmp_path):
    w = tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=100, shard_tokens=10)
    w.add_documents([np.arange(8) for _ in range(5)])
    w.close()
    os.unlink(tmp_path / "ds" / "tokenfeed.manifest")
    with pytest.raises(tokenfeed.FormatError, match="no manifest.*write did not finish"):
        tokenfeed.open(str(tmp_path / "ds"))


def _llmc_dir(d, shards, extra=None):
    """A directory of llm.c shards shard_0000.bin, ... (and extra files: name -> tokens as .npy)."""
    d.mkdir()
    for i, s in enumerate(shards):
        write_llmc(d / f"shard_{i:04d}.bin", s, 1)
    for name, toks in (extra or {}).items():
        np.save(d / name, toks)
    return str(d)


def test_remote_glob_and_directory(moto, bucket, tmp_path):  # noqa: F811
    shards = _shards(20, seed=2)
    local = tmp_path / "tokens"
    moto.upload_dir(bucket, "tokens", _llmc_dir(local, shards, {"extra.npy": shards[0]}))
    kw = {"cache_dir": str(tmp_path / "cache"), "endpoint_url": moto.endpoint}
    want = [f"s3://{bucket}/tokens/shard_{i:04d}.bin" for i in range(20)]
    ds = tokenfeed.open(f"s3://{bucket}/tokens/*.bin", **kw)
    assert ds.paths == want and ds.format == "llm.c"
    assert np.array_equal(_tokens(ds), np.concatenate(shards))
    assert ds.fingerprint == tokenfeed.open(str(local / "*.bin")).fingerprint
    with pytest.raises(tokenfeed.FormatError, match=r"more than one format: 20 \.bin files"):
        tokenfeed.open(f"s3://{bucket}/tokens/", **kw)
    moto.upload_dir(bucket, "npy", _npy_set(tmp_path, shards[:3]))
    ds = tokenfeed.open(f"s3://{bucket}/npy/", **kw)
    assert ds.format == "npy" and ds.num_files == 3
    with pytest.raises(FileNotFoundError, match="no object matches"):
        tokenfeed.open(f"s3://{bucket}/tokens/*.npz", **kw)


def _npy_set(tmp_path, shards):
    d = tmp_path / "npyset"
    d.mkdir()
    for i, s in enumerate(shards):
        np.save(d / f"{i}.npy", s)
    return str(d)


def test_remote_llmc_list_needs_no_probe_per_file(moto, bucket, tmp_path):  # noqa: F811
    """A list of llm.c URLs: one listing of their prefix shows every size, and shows that no
    <shard>/tokenfeed.manifest exists, so open sends no HEAD request per file."""
    local = tmp_path / "t"
    local.mkdir()
    for i, s in enumerate(_shards(24, seed=3)):
        write_llmc(local / f"s{i:03d}.bin", s, 1)
    moto.upload_dir(bucket, "t", str(local))
    p = FaultProxy(moto.port)
    try:
        urls = [f"s3://{bucket}/t/s{i:03d}.bin" for i in range(24)]
        ds = tokenfeed.open(urls, cache_dir=str(tmp_path / "cache"), endpoint_url=p.endpoint)
        assert ds.num_files == 24
        assert p.requests.get("HEAD", 0) == 0, p.requests
    finally:
        p.stop()


def test_remote_not_found_names_what_was_looked_for(moto, bucket, tmp_path):  # noqa: F811
    url = f"s3://{bucket}/nothing/here.bin"
    with pytest.raises(OSError) as ei:
        tokenfeed.open(url, cache_dir=str(tmp_path / "c"), endpoint_url=moto.endpoint)
    msg = str(ei.value)
    assert f"{url}/tokenfeed.manifest" in msg and f"s3://{bucket}/nothing/here.idx" in msg, msg
    assert "/.idx" not in msg and "end the URL with" not in msg
    with pytest.raises(OSError, match=rf"end the URL with / or give a glob: s3://{bucket}/nothing/\*\.bin"):
        tokenfeed.open(f"s3://{bucket}/nothing", cache_dir=str(tmp_path / "c"), endpoint_url=moto.endpoint)


def test_glob_dataset_pickles_as_its_files(tmp_path):
    import pickle

    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.arange(i, i + 5, dtype=np.uint16))
    ds = tokenfeed.open(str(tmp_path / "*.npy"))
    np.save(tmp_path / "3.npy", np.arange(5, dtype=np.uint16))  # a file added later is not picked up
    again = pickle.loads(pickle.dumps(ds))
    assert again.paths == ds.paths and again.fingerprint == ds.fingerprint


# ---- a remote set listed once per node ------------------------------------------------

_OPEN_GLOB = r"""
import sys, numpy as np, tokenfeed
url, cache, endpoint = sys.argv[1:4]
ds = tokenfeed.open(url, cache_dir=cache, endpoint_url=endpoint)
print(ds.num_files, int(np.asarray(ds.tokens(0, ds.num_tokens), dtype=np.int64).sum()))
"""


def _listings(p):
    """GETs of a bucket itself: listings."""
    return sum(v for k, v in p.gets.items() if k[0].count("/") == 1)


@pytest.fixture
def remote_glob(moto, bucket, tmp_path):  # noqa: F811
    shards = _shards(24, seed=5)
    moto.upload_dir(bucket, "tokens", _llmc_dir(tmp_path / "tokens", shards))
    p = FaultProxy(moto.port)
    yield f"s3://{bucket}/tokens/*.bin", p, np.concatenate(shards)
    p.stop()


def _listing_record(cache):
    """The name (without extension) of the node's one recorded listing in cache's meta/."""
    (name,) = [n for n in os.listdir(cache / "meta") if n.endswith(".tflist")]
    return name[: -len(".tflist")]


@pytest.mark.parametrize("given", ["glob", "directory"])
def test_remote_set_restart_lists_by_the_listing_rule(remote_glob, tmp_path, monkeypatch, given):
    """A restart opening the same glob (or directory URL) reads the node's recorded listing and
    sends no request while that listing is trusted (younger than $TOKENFEED_LISTING_MAX_AGE, or
    immutable=True); past it, one listing, which also checks the node's metadata record."""
    url, p, tokens = remote_glob
    if given == "directory":
        url = url.rsplit("/", 1)[0] + "/"
    kw = {"cache_dir": str(tmp_path / "cache"), "endpoint_url": p.endpoint}
    first = tokenfeed.open(url, **kw)
    assert _listings(p) == 1
    p.reset_counts()
    again = tokenfeed.open(url, **kw)  # within the default 60 s
    assert sum(p.requests.values()) == 0, p.requests
    assert again.paths == first.paths and again.fingerprint == first.fingerprint
    monkeypatch.setenv("TOKENFEED_LISTING_MAX_AGE", "0")  # no listing trusted by its age
    p.reset_counts()
    again = tokenfeed.open(url, **kw)
    assert _listings(p) == 1 and sum(p.requests.values()) == 1, p.requests  # expansion and check: one listing
    assert again.paths == first.paths and again.fingerprint == first.fingerprint
    p.reset_counts()
    again = tokenfeed.open(url, immutable=True, **kw)  # the caller vouches: any age
    assert sum(p.requests.values()) == 0, p.requests
    assert again.paths == first.paths and np.array_equal(_tokens(again), tokens)


def test_remote_set_sees_an_object_added_once_its_listing_is_not_trusted(remote_glob, moto, bucket, tmp_path,
                                                                         monkeypatch):  # noqa: F811
    """A recorded listing is used only while it is trusted: an object added meanwhile joins the
    set at the first open that lists again (past the listing's age), never before."""
    url, p, tokens = remote_glob
    cache = tmp_path / "cache"
    kw = {"cache_dir": str(cache), "endpoint_url": p.endpoint}
    assert tokenfeed.open(url, **kw).num_files == 24
    write_llmc(tmp_path / "late.bin", np.arange(7, dtype=np.uint16), 1)
    moto.put(bucket, "tokens/shard_9999.bin", (tmp_path / "late.bin").read_bytes())
    assert tokenfeed.open(url, **kw).num_files == 24  # as this node listed it: no listing
    monkeypatch.setenv("TOKENFEED_LISTING_MAX_AGE", "0")
    assert tokenfeed.open(url, immutable=True, **kw).num_files == 24  # vouched for
    p.reset_counts()
    ds = tokenfeed.open(url, **kw)
    assert _listings(p) == 1 and ds.num_files == 25


def test_processes_of_a_node_list_a_remote_set_once(remote_glob, tmp_path):
    """Processes of a node opening the same remote glob together list it once between them (the
    first lists and records the listing, the others wait for it and read it) and read its
    metadata once: the node sends the requests of one process."""
    import subprocess
    import sys

    url, p, tokens = remote_glob
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def run(cache, k):
        p.reset_counts()
        procs = [subprocess.Popen([sys.executable, "-c", _OPEN_GLOB, url, str(cache), p.endpoint], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(k)]
        outs = [pr.communicate(timeout=300) for pr in procs]
        for pr, (_, err) in zip(procs, outs):
            assert pr.returncode == 0, err
        assert {o.strip() for o, _ in outs} == {f"24 {int(tokens.astype(np.int64).sum())}"}
        return _listings(p), p.requests.get("GET", 0) + p.requests.get("HEAD", 0)

    alone = run(tmp_path / "alone", 1)
    assert alone[0] == 1  # one listing: the glob's expansion, whose sizes and versions the open uses
    assert run(tmp_path / "shared", 4) == alone


def test_remote_listing_record_ignores_a_planted_symlink(remote_glob, tmp_path):
    """The recorded listing and its lock are opened without following symlinks: one planted under
    the record's name is neither read nor written through."""
    url, p, tokens = remote_glob
    cache = tmp_path / "cache"
    kw = {"cache_dir": str(cache), "endpoint_url": p.endpoint}
    first = tokenfeed.open(url, **kw)
    name = _listing_record(cache) + ".tflist"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.remove(cache / "meta" / name)
    os.symlink(victim, cache / "meta" / name)
    p.reset_counts()
    ds = tokenfeed.open(url, **kw)  # not read through the link: listed again, and the link replaced, not followed
    assert _listings(p) == 1 and ds.paths == first.paths
    assert np.array_equal(_tokens(ds), tokens)
    assert victim.read_text() == "keep"
    assert not os.path.islink(cache / "meta" / name)


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-cache", "fifo", "renamed-object"])
def test_remote_listing_record_damaged_or_planted_is_listed_again(remote_glob, tmp_path, damage):
    """A recorded listing that does not verify (a byte changed, cut short, sealed by another
    cache's key, not a regular file, or naming other objects) is ignored: the set is listed
    again, and the open reads exactly the set's files."""
    url, p, tokens = remote_glob
    cache = tmp_path / "cache"
    kw = {"cache_dir": str(cache), "endpoint_url": p.endpoint}
    first = tokenfeed.open(url, **kw)
    rec = cache / "meta" / (_listing_record(cache) + ".tflist")
    data = bytearray(rec.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        rec.write_bytes(bytes(data))
    elif damage == "truncate":
        rec.write_bytes(bytes(data[: len(data) - 9]))
    elif damage == "other-cache":
        other = tmp_path / "other"
        tokenfeed.open(url, cache_dir=str(other), endpoint_url=p.endpoint)
        rec.write_bytes((other / "meta" / (_listing_record(other) + ".tflist")).read_bytes())
    elif damage == "fifo":
        os.remove(rec)
        os.mkfifo(rec, 0o600)
    else:  # a record that names shard_0000.bin as shard_0001.bin and back: its seal no longer holds
        a, b = bytes(data).find(b"shard_0000.bin"), bytes(data).find(b"shard_0001.bin")
        data[a + 9], data[b + 9] = data[b + 9], data[a + 9]
        rec.write_bytes(bytes(data))
    p.reset_counts()
    ds = tokenfeed.open(url, **kw)
    assert _listings(p) == 1, p.requests
    assert ds.paths == first.paths and ds.fingerprint == first.fingerprint
    assert np.array_equal(_tokens(ds), tokens)


_HOLD_LOCK = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""

# (Ctrl-C reaches the child even when the test run started with SIGINT ignored)
_OPEN_WAITING = INTERRUPTIBLE + r"""
import sys, tokenfeed
print("opening", flush=True)
try:
    tokenfeed.open(sys.argv[1], cache_dir=sys.argv[2], endpoint_url=sys.argv[3])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(0)
sys.exit(3)
"""


def test_waiting_for_another_process_listing_answers_ctrl_c_and_takes_over(remote_glob, tmp_path):
    """A process waiting for another one of the node to list the set answers Ctrl-C; when the
    lister dies without a record, the waiter lists the set itself."""
    import signal
    import subprocess
    import sys
    import threading

    url, p, tokens = remote_glob
    cache = tmp_path / "cache"
    kw = {"cache_dir": str(cache), "endpoint_url": p.endpoint}
    first = tokenfeed.open(url, **kw)
    key = _listing_record(cache)
    os.remove(cache / "meta" / (key + ".tflist"))  # the next open must list
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(cache / "meta" / (key + ".lock"))],
                              stdout=subprocess.PIPE, text=True, env=env)  # "another process" lists the set
    try:
        assert holder.stdout.readline().strip() == "held"
        child = subprocess.Popen([sys.executable, "-c", _OPEN_WAITING, url, str(cache), p.endpoint], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "opening"
        threading.Event().wait(2.0)  # (interrupted whether or not it reached the wait by then)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0 and "interrupted" in out, (child.returncode, out, err)
        p.reset_counts()
        threading.Timer(1.0, holder.kill).start()  # the lister dies without writing a record
        ds = tokenfeed.open(url, **kw)  # waits for it, then lists itself
        assert _listings(p) == 1 and ds.paths == first.paths
        assert np.array_equal(_tokens(ds), tokens)
    finally:
        holder.kill()
        holder.wait()


def test_remote_glob_expanded_by_the_core(remote_glob, moto, bucket, tmp_path):  # noqa: F811
    """The core expands a remote glob from its listing by the rules of local sets: a wildcard in a
    directory part too, companion objects (a Megatron .idx, a datatrove .index) joined to their
    data object, names starting with '.' and '_' left out, sorted names."""
    from tokenfeed import _core
    from tokenfeed.remote import _remote

    url, p, tokens = remote_glob
    d = tmp_path / "mixed"
    d.mkdir()
    write_megatron(str(d / "a"), [np.arange(5), np.arange(3)])
    write_megatron(str(d / "b"), [np.arange(4)])
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".hidden.bin").write_bytes(b"x")
    moto.upload_dir(bucket, "mixed/x", str(d))
    moto.upload_dir(bucket, "mixed/y", str(d))
    store = _remote.get_store(**_remote.store_options(cache_dir=str(tmp_path / "cache"), endpoint_url=p.endpoint))
    ds = _core.Dataset([f"s3://{bucket}/mixed/*/[ab]*"], remote=store)  # (.idx: companions)
    got = [f["path"] for f in ds.files()]
    assert got == [f"s3://{bucket}/mixed/{s}/{n}.bin" for s in ("x", "y") for n in ("a", "b")]
    assert ds.info["format"] == "megatron"
    ds = _core.Dataset([f"s3://{bucket}/mixed/x/"], remote=store)  # a directory URL: the .bin/.idx pairs
    assert [f["path"] for f in ds.files()] == [f"s3://{bucket}/mixed/x/{n}.bin" for n in ("a", "b")]
    listed = store.list(f"s3://{bucket}/mixed/")  # the node's recorded listing of the prefix
    assert [u for u, _, _ in listed] == sorted(u for u, _, _ in listed) and len(listed) == 12

"""Another local user, and a second run of the same job, against the writers and the cache.

Shared team directories and node caches are common on clusters, so these attacks come from
another account: where the tests run as root, the attacker's steps run in a forked child
that has switched to the user ``nobody`` (``as_attacker``), working through a directory
descriptor opened before the switch (it can write the shared directory it is handed, as
the other account could, without needing to reach it by path). Run as an ordinary user,
the same steps run as that user: the files planted and the directories swapped are the
same, so the writers' and the cache's answers are too (only the check of who owns a
file needs the second account, and ``test_cache_swapped_under_a_running_job`` makes the
files another user's when it can). Loopback servers only (moto), bounded loops.
"""
from __future__ import annotations

import errno
import os
import pwd
import struct
import subprocess
import sys
import traceback
from typing import Callable, Dict, List

import numpy as np
import pytest
import xxhash

import tokenfeed
from tokenfeed import cli
from tokenfeed.sources._convert import CONVERT_LOCK
from tokenfeed.common._lock import RunLock
from remote_util import bucket, moto  # noqa: F401  (fixtures)

ROOT = os.geteuid() == 0


def as_attacker(directory: str, fn: Callable[[int], None]) -> None:
    """Run fn(dir_fd) as another user (``nobody``) when root, else as this user; dir_fd is ``directory``."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not ROOT:
            fn(dfd)
            return
        nobody = pwd.getpwnam("nobody")
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                fn(dfd)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the attacker's steps failed (see stderr)"
    finally:
        os.close(dfd)


def shared_dir(path) -> str:
    """A team directory every user can write (no sticky bit: the case the attacks need)."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)
    return str(path)


def precious(tmp_path) -> str:
    home = tmp_path / "home"
    home.mkdir()
    p = home / "precious.ckpt"
    p.write_bytes(b"the victim's checkpoint")
    os.chmod(p, 0o600)
    return str(p)


def docs_of(ds: tokenfeed.Dataset) -> List[np.ndarray]:
    return [np.asarray(ds.document(i)).copy() for i in range(ds.num_documents)]


# --------------------------------------------------------------------------- writer: planted symlinks


def test_writer_temporary_files_do_not_follow_planted_symlinks(tmp_path):
    out = shared_dir(tmp_path / "team" / "ds")
    victim = precious(tmp_path)
    docs = [np.arange(100, dtype=np.uint16) + j for j in range(8)]
    w = tokenfeed.DatasetWriter(out, vocab_size=1000, shard_tokens=100)
    w.add_document(docs[0])
    w.add_document(docs[1])  # shard 0 is renamed into place: its name shows the run id
    run = next(n for n in os.listdir(out) if n.startswith("shard-")).split("-")[1]

    def plant(dfd: int) -> None:
        # every name a writer could have picked next by counting: shards 2.., and the manifest's
        for k in range(2, 10):
            os.symlink(victim, f".shard-{run}-{k:05d}.tfs.tmp", dir_fd=dfd)
        for k in range(4):
            os.symlink(victim, f".tokenfeed.manifest.{k:08x}.tmp", dir_fd=dfd)

    as_attacker(out, plant)
    for d in docs[2:]:
        w.add_document(d)
    w.close()
    with open(victim, "rb") as f:
        assert f.read() == b"the victim's checkpoint"
    got = docs_of(tokenfeed.open(out))
    assert len(got) == len(docs) and all(np.array_equal(a, b) for a, b in zip(got, docs))
    # the planted links are still links, to the same file (nothing was written through them)
    assert all(os.readlink(os.path.join(out, n)) == victim for n in os.listdir(out) if n.endswith(".tmp"))


def test_writer_stops_at_a_planted_final_name_and_says_so(tmp_path):
    """A symlink planted at a future shard's final name: the writer stops with EEXIST, naming
    the file, what it is and its owner, and leaves the link alone (not followed, not replaced)."""
    out = shared_dir(tmp_path / "team" / "ds")
    victim = precious(tmp_path)
    w = tokenfeed.DatasetWriter(out, vocab_size=1000, shard_tokens=100)
    w.add_document(np.arange(100, dtype=np.uint16))
    w.add_document(np.arange(100, dtype=np.uint16))  # shard 0 is renamed into place: its name shows the run id
    run = next(n for n in os.listdir(out) if n.startswith("shard-")).split("-")[1]
    names = [f"shard-{run}-{k:05d}.tfs" for k in range(2, 10)]
    as_attacker(out, lambda dfd: [os.symlink(victim, n, dir_fd=dfd) for n in names])
    with pytest.raises(FileExistsError) as ei:
        for j in range(8):
            w.add_document(np.arange(100, dtype=np.uint16) + j)
        w.close()
    msg = str(ei.value)
    owner = "owned by user nobody" if ROOT else "owned by this user"
    assert f"{out}/{names[0]} already exists (a symbolic link, {owner})" in msg, msg
    assert "this writer did not create it" in msg and "not followed" in msg, msg
    with open(victim, "rb") as f:
        assert f.read() == b"the victim's checkpoint"
    assert all(os.readlink(os.path.join(out, n)) == victim for n in names)


@pytest.mark.test_hooks
def test_writer_never_opens_a_planted_name(tmp_path):
    """Even a symlink under the exact temporary name (fixed by a test hook) is never opened."""
    out = shared_dir(tmp_path / "team" / "ds")
    victim = precious(tmp_path)
    suffix = "0123456789abcdef"
    as_attacker(out, lambda dfd: os.symlink(victim, f".tokenfeed.manifest.{suffix}.tmp", dir_fd=dfd))
    code = f"import tokenfeed; tokenfeed.DatasetWriter({out!r}, vocab_size=10).close()"  # the manifest is all
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TOKENFEED_FAULT_TMP_NAME=suffix))
    assert p.returncode == 0, p.stderr
    with open(victim, "rb") as f:
        assert f.read() == b"the victim's checkpoint"
    assert os.path.islink(os.path.join(out, f".tokenfeed.manifest.{suffix}.tmp"))
    with open(os.path.join(out, "tokenfeed.manifest")) as f:
        assert f.read().startswith("tokenfeed-manifest 1\n")


def _manifest(lines: List[str], version: int = 2) -> bytes:
    text = f"tokenfeed-manifest {version}\ndtype uint16\nvocab_size 1000\nnum_shards {len(lines)}\n" + "".join(lines)
    return (text + f"end {xxhash.xxh64(text.encode(), seed=0).intdigest():016x}\n").encode()


def plant_manifest_through_links(dfd: int, victim: str) -> None:
    """A merged dataset's manifest naming the victim's file behind a symlink to its directory
    (``lnk/precious.ckpt``) and through a symlink named as a shard (``direct.ckpt``)."""
    os.symlink(os.path.dirname(victim), "lnk", dir_fd=dfd)
    os.symlink(victim, "direct.ckpt", dir_fd=dfd)
    fd = os.open("m.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
    os.write(fd, _manifest([f"shard lnk/precious.ckpt 10 1 {0:016x} {0:016x}\n",
                            f"shard direct.ckpt 10 1 {0:016x} {0:016x}\n"]))
    os.close(fd)
    os.rename("m.tmp", "tokenfeed.manifest", src_dir_fd=dfd, dst_dir_fd=dfd)


def test_overwrite_never_deletes_through_a_symlinked_directory(tmp_path):
    out = shared_dir(tmp_path / "team" / "ds")
    victim = precious(tmp_path)
    with tokenfeed.DatasetWriter(out, vocab_size=1000) as w:
        w.add_document(np.arange(10))

    as_attacker(out, lambda dfd: plant_manifest_through_links(dfd, victim))
    with tokenfeed.DatasetWriter(out, vocab_size=1000, overwrite=True) as w:
        w.add_document(np.arange(20))
    assert os.path.exists(victim), "overwrite deleted a file through a symlinked directory"
    assert os.path.islink(os.path.join(out, "direct.ckpt"))  # a symlink named as a shard is not deleted either
    assert np.array_equal(tokenfeed.open(out).document(0), np.arange(20))


# --------------------------------------------------------------------------- two runs into one output


def test_second_convert_into_the_same_output_is_refused(tmp_path, capsys):
    src = tmp_path / "src"
    with tokenfeed.DatasetWriter(src, vocab_size=1000) as w:
        w.add_documents([np.arange(50) + j for j in range(20)])
    out = tmp_path / "out"
    out.mkdir()
    # the first run is still going: it holds OUT's lock and has written a shard and a temporary file
    mine = [out / "shard-0badf00d-00000.tfs", out / ".shard-0badf00d-00001.tfs.00112233aabbccdd.tmp"]
    for p in mine:
        p.write_bytes(b"the other run's bytes")
    with RunLock(str(out), CONVERT_LOCK, "the first run"):
        rc = cli.main(["convert", str(src), str(out)])
        err = capsys.readouterr().err
        assert rc != 0 and "another process is writing here" in err and "pid" in err
        assert all(p.read_bytes() == b"the other run's bytes" for p in mine)
        assert not (out / "tokenfeed.manifest").exists()
    # once the first run is gone (its lock with it), a run goes through and cleans up
    assert cli.main(["convert", str(src), str(out)]) == 0
    assert not any(p.exists() for p in mine)
    assert not (out / CONVERT_LOCK).exists() and not (out / ".tokenfeed.lock").exists()
    assert tokenfeed.open(out).num_documents == 20


def test_second_writer_or_merge_into_one_directory_is_refused(tmp_path):
    out = tmp_path / "ds"
    first = tokenfeed.DatasetWriter(out, vocab_size=1000, shard_tokens=50)
    first.add_documents([np.arange(40) + j for j in range(5)])
    before = sorted(os.listdir(out))
    with pytest.raises(OSError) as ei:
        tokenfeed.DatasetWriter(out, vocab_size=1000, overwrite=True)
    assert ei.value.errno == errno.EBUSY and "another process is writing here" in str(ei.value)
    with pytest.raises(OSError) as ei:
        tokenfeed._core.merge(str(out), ["parts/part-00000"], overwrite=True)
    assert ei.value.errno == errno.EBUSY
    assert sorted(os.listdir(out)) == before  # nothing of the first writer was touched
    first.add_document(np.arange(7))
    first.close()
    assert tokenfeed.open(out).num_documents == 6
    assert ".tokenfeed.lock" not in os.listdir(out)


def test_second_attempt_of_a_running_part_is_refused(tmp_path):
    out = tmp_path / "ds"
    a = tokenfeed.PartWriter(out, part=0, parts=1, vocab_size=1000)
    a.add_document(np.arange(30))
    with pytest.raises(OSError) as ei:
        tokenfeed.PartWriter(out, part=0, parts=1, vocab_size=1000)
    assert ei.value.errno == errno.EBUSY and "part 0" in str(ei.value)
    a.close()
    ds = tokenfeed.merge_parts(out)
    assert np.array_equal(ds.document(0), np.arange(30))


# --------------------------------------------------------------------------- the cache


def _remote_dataset(moto, bucket, tmp_path, n_tokens=1_200_000):  # noqa: F811
    rng = np.random.default_rng(5)
    src = tmp_path / "src"
    with tokenfeed.DatasetWriter(src, vocab_size=50000, chunk_checksum_bytes=0) as w:
        # no chunk checksum table: as .npy, Megatron, llm.c and raw files, the trailer is all there is
        for _ in range(n_tokens // 4000):
            w.add_document(rng.integers(0, 50000, 4000, dtype=np.uint16))
    moto.upload_dir(bucket, "ds", str(src))
    return tokenfeed.open(src), f"s3://{bucket}/ds/"


def _forge(path: str, magic: bytes) -> None:
    """Rewrite a chunk file as [7, 7, ...] with a trailer made as an unkeyed XXH64 of it."""
    with open(path, "rb") as f:
        b = f.read()
    data, t = bytes(len(b) - 40), b[-40:]
    data = np.full(len(data) // 2, 7, dtype=np.uint16).tobytes()
    head = magic + t[8:32]
    forged = data + head + struct.pack("<Q", xxhash.xxh64(data + head, seed=0).intdigest())
    with open(path, "wb") as f:
        f.write(forged)


def _chunk_files(cache: str) -> List[str]:
    out = []
    for root, _d, files in os.walk(os.path.join(cache, "objects")):
        out += [os.path.join(root, f) for f in files if f.endswith(".c")]
    return sorted(out)


def test_forged_chunk_fails_its_keyed_trailer(moto, bucket, tmp_path):  # noqa: F811
    local, url = _remote_dataset(moto, bucket, tmp_path)
    cache = str(tmp_path / "cache")
    opts = dict(cache_dir=cache, endpoint_url=moto.endpoint, chunk_size=64 << 10)
    remote = tokenfeed.open(url, **opts)
    n = remote.num_tokens
    assert np.array_equal(remote.tokens(0, n), local.tokens(0, n))
    del remote
    tokenfeed.remote._remote._stores.clear()  # a new process: nothing mapped yet
    files = _chunk_files(cache)
    with open(files[0], "rb") as f:
        magic = f.read()[-40:-32]
    for p in files:  # forged with the layout's own magic and every field right: only the key is missing
        _forge(p, magic)
    again = tokenfeed.open(url, **opts)
    assert np.array_equal(again.tokens(0, n), local.tokens(0, n))
    assert again.cache_stats()["refetches"] == len(files)


def forge_cache(cache: str) -> Dict[str, bytes]:
    """What an attacker computes for every chunk file of ``cache`` (object ids and chunk
    indices are predictable): the chunk as [7, 7, ...] with an unkeyed XXH64 trailer, by the
    file's path relative to the cache."""
    rel = [os.path.relpath(p, cache) for p in _chunk_files(cache)]
    with open(os.path.join(cache, rel[0]), "rb") as f:
        magic = f.read()[-40:-32]
    forged = {}
    for r in rel:
        with open(os.path.join(cache, r), "rb") as f:
            b = f.read()
        data = np.full((len(b) - 40) // 2, 7, dtype=np.uint16).tobytes()
        head = magic + b[-32:-8]
        forged[r] = data + head + struct.pack("<Q", xxhash.xxh64(data + head, seed=0).intdigest())
    return forged


def swap_in_cache(dfd: int, forged: Dict[str, bytes]) -> None:
    """The attacker's steps in the cache's parent (``dfd``): move ``cache`` aside and make a
    new one holding the forged chunk files."""
    os.rename("cache", "cache.victim", src_dir_fd=dfd, dst_dir_fd=dfd)
    os.mkdir("cache", 0o700, dir_fd=dfd)
    top = os.open("cache", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
    for name in ("objects", "tmp", "procs"):
        os.mkdir(name, 0o700, dir_fd=top)
    for r, body in forged.items():
        d, f = os.path.split(r)
        cur = top
        for part in d.split(os.sep):
            try:
                os.mkdir(part, 0o700, dir_fd=cur)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            if cur != top:
                os.close(cur)
            cur = nxt
        fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=cur)
        os.write(fd, body)
        os.close(fd)
        os.close(cur)
    os.close(top)


def test_cache_swapped_under_a_running_job(moto, bucket, tmp_path):  # noqa: F811
    local, url = _remote_dataset(moto, bucket, tmp_path, n_tokens=3_000_000)
    parent = shared_dir(tmp_path / "team")  # the attacker can write the cache's parent
    cache = os.path.join(parent, "cache")
    opts = dict(cache_dir=cache, endpoint_url=moto.endpoint, chunk_size=64 << 10)
    remote = tokenfeed.open(url, **opts)
    n = remote.num_tokens
    assert np.array_equal(remote.tokens(0, n), local.tokens(0, n))  # > 64 chunks: more than a process keeps mapped
    forged = forge_cache(cache)
    assert len(forged) > 64
    as_attacker(parent, lambda dfd: swap_in_cache(dfd, forged))
    # the running job reads everything again (its mappings do not hold it all), and a reopen
    # with the same options reuses its store: neither may ever see the forged bytes
    for reader in (remote, tokenfeed.open(url, **opts)):
        try:
            got = reader.tokens(0, n)
        except PermissionError as e:
            assert "replaced" in str(e) and cache in str(e)
        else:
            assert np.array_equal(got, local.tokens(0, n)), "forged chunks were served"
    if ROOT:
        assert os.stat(cache).st_uid == pwd.getpwnam("nobody").pw_uid


def test_old_layout_cache_is_rebuilt_never_misread(moto, bucket, tmp_path):  # noqa: F811
    import fcntl

    local, url = _remote_dataset(moto, bucket, tmp_path, n_tokens=40_000)
    old = tmp_path / "old"
    for d in ("objects/00000000000000010000000000000002", "tmp", "procs"):
        (old / d).mkdir(parents=True)
    (old / "tokenfeed-cache").write_text("tokenfeed-cache 1\n")
    (old / "index").write_bytes(b"TFCIDX01" + bytes(100))
    (old / "objects/00000000000000010000000000000002/00000000.c").write_bytes(bytes(100))
    os.chmod(old, 0o700)
    # read only (`tokenfeed cache show`): refused, saying why
    with pytest.raises(OSError, match="layout 1"):
        tokenfeed._core.cache_info(str(old))
    # a process of the older version still has it open: refused, nothing removed
    slot = os.open(old / "procs" / "0.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(slot, fcntl.LOCK_EX)
    with pytest.raises(tokenfeed.FormatError, match="still in use by a process of an older tokenfeed"):
        tokenfeed.open(url, cache_dir=old, endpoint_url=moto.endpoint)
    assert (old / "index").read_bytes().startswith(b"TFCIDX01")
    os.close(slot)
    # once it is gone: emptied and made again in this layout, and read right
    ds = tokenfeed.open(url, cache_dir=old, endpoint_url=moto.endpoint)
    assert np.array_equal(ds.tokens(0, ds.num_tokens), local.tokens(0, local.num_tokens))
    assert (old / "tokenfeed-cache").read_text() == "tokenfeed-cache 2\n"
    assert not (old / "objects/00000000000000010000000000000002").exists()


# --------------------------------------------------------------------------- a full cache disk


@pytest.mark.test_hooks
def test_full_cache_disk_is_reported_to_the_loader(moto, bucket, tmp_path, monkeypatch):  # noqa: F811
    local, url = _remote_dataset(moto, bucket, tmp_path, n_tokens=400_000)
    monkeypatch.setenv("TOKENFEED_FAULT_CACHE", "enospc:1")  # the first chunk written: the disk is full
    cache = str(tmp_path / "full")
    remote = tokenfeed.open(url, cache_dir=cache, endpoint_url=moto.endpoint, chunk_size=64 << 10)
    it = iter(tokenfeed.Loader(remote, seq_len=64, batch_size=2, seed=1, shuffle="full", output="numpy"))
    with pytest.raises(OSError) as ei:
        for _ in range(2000):  # small samples: read straight from the store while chunks land
            next(it)
    assert ei.value.errno == errno.ENOSPC and cache in str(ei.value) and "cache_limit" in str(ei.value)


def test_default_cache_limit_is_the_same_for_every_process(moto, bucket, tmp_path):  # noqa: F811
    local, url = _remote_dataset(moto, bucket, tmp_path, n_tokens=40_000)
    cache = tmp_path / "not" / "yet"  # the first process creates it
    first = tokenfeed.open(url, cache_dir=cache, endpoint_url=moto.endpoint).cache_stats()["cache_limit"]
    tokenfeed.remote._remote._stores.clear()  # another process, on a node where the cache exists now
    second = tokenfeed.open(url, cache_dir=cache, endpoint_url=moto.endpoint).cache_stats()["cache_limit"]
    assert first == second
    st = os.statvfs(cache)
    assert first < st.f_bavail * st.f_frsize  # fits the disk it is on

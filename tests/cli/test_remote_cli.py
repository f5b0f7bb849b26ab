"""The command line on remote datasets (inspect, verify with progress, cache show/prune), and
remote datasets in forked DataLoader workers and with every read backend."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tokenfeed
from remote_util import bucket, moto  # noqa: F401  (fixtures)
from tokenfeed import cli

try:
    from torch.utils.data import IterableDataset
except ImportError:  # the tests that need torch skip
    IterableDataset = None  # type: ignore[assignment,misc]


@pytest.fixture
def remote_ds(moto, bucket, tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    with tokenfeed.DatasetWriter(tmp_path / "src", vocab_size=1000, shard_tokens=40_000) as w:
        for _ in range(300):
            w.add_document(rng.integers(0, 1000, size=int(rng.integers(50, 500))))
    # without the dataset's catalog, so that every shard's tokens go through the cache (a shard
    # of at most 64 KiB known from the catalog keeps the bytes of its first read instead)
    os.remove(tmp_path / "src" / "tokenfeed.catalog")
    moto.upload_dir(bucket, "d", str(tmp_path / "src"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    monkeypatch.setenv("TOKENFEED_CACHE_DIR", str(tmp_path / "cache"))
    return tokenfeed.open(tmp_path / "src"), f"s3://{bucket}/d/", str(tmp_path / "cache")


def test_inspect_and_verify_remote(remote_ds, capsys):
    local, url, cache = remote_ds
    assert cli.main(["inspect", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fingerprint"] == local.fingerprint and info["num_tokens"] == local.num_tokens
    assert cli.main(["verify", url, "--progress"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("OK") and local.fingerprint in out
    assert "verify" in err  # the progress bar of the fetch and check


def test_cache_show_and_prune(remote_ds, capsys):
    local, url, cache = remote_ds
    ds = tokenfeed.open(url)
    ds.tokens(0, ds.num_tokens)
    assert cli.main(["cache", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["cache_dir"] == cache and shown["chunks"] >= ds.num_files and shown["processes"] == 1
    urls = {o["url"] for o in shown["objects_detail"]}
    assert urls == {f["path"] for f in ds.files()}
    assert cli.main(["cache", "show"]) == 0
    assert url in capsys.readouterr().out
    # emptying is refused while a process (this one) has the cache open
    assert cli.main(["cache", "prune", "--all"]) == 1
    assert "has the cache open" in capsys.readouterr().err
    assert cli.main(["cache", "prune", "--keep", "10KB"]) == 0
    assert tokenfeed._core.cache_info(cache)["bytes"] <= 10_000
    # what was evicted comes back on demand, and the bytes are right
    assert np.array_equal(ds.tokens(0, ds.num_tokens), local.tokens(0, local.num_tokens))
    assert cli.main(["cache", "prune"]) == 1  # neither --keep nor --all
    capsys.readouterr()


def test_cache_refused_when_not_private(tmp_path, capsys):
    d = tmp_path / "c"
    d.mkdir()
    (d / "tokenfeed-cache").write_text("tokenfeed-cache 1\n")
    os.chmod(d, 0o777)
    assert cli.main(["cache", "show", str(d)]) == 1
    assert "writable by every user" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["mmap", "pread", "io_uring"])
def test_backends_read_remote_the_same(remote_ds, backend):
    local, url, _ = remote_ds
    ds = tokenfeed.open(url)
    kw = dict(seq_len=64, batch_size=4, seed=3, shuffle=True, backend=backend, output="numpy")
    a, b = iter(tokenfeed.Loader(ds, **kw)), iter(tokenfeed.Loader(local, **kw))
    for _ in range(30):
        assert np.array_equal(next(a)["input_ids"], next(b)["input_ids"])


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_dataloader_workers(remote_ds, context):
    """DataLoader workers of TokenBatches stream the same batches with any start method: the
    batches are made in the consuming process, so a worker never uses the object-store client.
    Code that reads the dataset inside a fork()ed child cannot use the client once the parent
    has (its runtime's threads are not copied) and fails with an error that says what to do."""
    torch = pytest.importorskip("torch")
    import multiprocessing

    from tokenfeed.torch import TokenBatches

    local, url, cache = remote_ds
    ds = tokenfeed.open(url)
    ds.tokens(0, 10)  # the client has made requests in this process
    kw = dict(seq_len=64, batch_size=4, seed=5, shuffle=True, epochs=1)

    def first(d, n=21, wrap=False):
        tb = TokenBatches(d, **kw)
        dl = torch.utils.data.DataLoader(Inner(tb) if wrap else tb, batch_size=None, num_workers=2,
                                         multiprocessing_context=multiprocessing.get_context(context))
        out = []
        for i, b in enumerate(dl):
            out.append(np.asarray(b["input_ids"]).copy())
            if i + 1 == n:
                break
        return out

    if context == "fork":  # before the chunks are in the node's cache, where a child finds them
        q = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(target=_read_in_child, args=(ds, q))
        child.start()
        try:
            msg = q.get(timeout=120)
        finally:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
        assert "forked" in msg and "spawn" in msg, msg
    got, want = first(ds), first(local)
    assert len(got) == len(want) == 21
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    if context == "spawn":
        assert all(np.array_equal(x, y) for x, y in zip(first(ds, wrap=True), want))


def _read_in_child(ds, q):
    """In a fork()ed child: read tokens no request has fetched yet; report what happened."""
    try:
        ds.tokens(ds.num_tokens - 10, ds.num_tokens)
        q.put("read without an error")
    except Exception as e:  # the message is what the test checks
        q.put(str(e))


class Inner(IterableDataset if IterableDataset is not None else object):  # type: ignore[misc]
    """Another dataset over TokenBatches: its worker code reads the batches itself."""

    def __init__(self, tb):
        self.tb = tb

    def __iter__(self):
        yield from self.tb


def test_inspect_remote_without_obstore_is_one_line(monkeypatch, capsys, tmp_path):
    """Without obstore, `inspect s3://...` says what is missing and how to get it, in one line
    (the traceback only with --debug)."""
    import sys
    from tokenfeed.common._extras import pip_hint
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore raises ImportError
    monkeypatch.setenv("TOKENFEED_CACHE_DIR", str(tmp_path / "cache"))
    assert cli.main(["inspect", "s3://bucket/ds/"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    # the install hint names the package with its version bound (the one pip_hint gives everywhere)
    assert "needs obstore" in err and pip_hint("remote") in err
    with pytest.raises(ImportError):
        cli.main(["--debug", "inspect", "s3://bucket/ds/"])

"""The Loader on zstd-compressed data: the workers' shared block cache gives the same
stream as the uncompressed twin (threads, cache sizes, seeks and resume), decodes
each block about once per window with the block shuffle, reports what it decoded
and what a configuration will cost, and warns when that cost is large."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tokenfeed

pytestmark = pytest.mark.skipif(not tokenfeed.build_info()["zstd"]["usable"], reason="zstd not compiled in")

SEQ, B = 32, 4
BLOCK_TOKENS = 512


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """~120 K tokens of varied documents, plain and zstd, several shards each."""
    root = tmp_path_factory.mktemp("ztwin")
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 30000, size=int(n), dtype=np.uint16) for n in rng.integers(0, 700, size=350)]
    out = []
    for name, comp in (("plain", None), ("zstd", "zstd")):
        with tokenfeed.DatasetWriter(root / name, vocab_size=30000, shard_tokens=25_000, compression=comp,
                                     block_tokens=BLOCK_TOKENS) as w:
            for d in docs:
                w.add_document(d)
        out.append(tokenfeed.open(root / name))
    return out


def stream(ds, n, **kw):
    ld = tokenfeed.Loader(ds, seq_len=SEQ, batch_size=B, seed=3, output="numpy", dtype="uint16",
                          block_size=4, window_blocks=4, **kw)
    got = [next(ld)["tokens"].copy() for _ in range(n)]
    st = ld.stats()
    ld.close()
    return got, st


@pytest.mark.filterwarnings("ignore::tokenfeed.PerformanceWarning")  # tiny caches and blocks on purpose
@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("cache", [None, 3 * BLOCK_TOKENS * 2, 1], ids=["auto", "3-blocks", "1-byte"])
def test_same_stream_as_uncompressed(twin, shuffle, threads, cache):
    plain, zstd = twin
    ref, _ = stream(plain, 60, shuffle=shuffle, num_threads=threads)
    got, st = stream(zstd, 60, shuffle=shuffle, num_threads=threads, zstd_cache_bytes=cache)
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))
    z = st["zstd"]
    assert z is not None and z["tokens_used"] >= 60 * B * (SEQ + 1) and z["blocks_decoded"] > 0
    assert 0 < z["cache_allocated"] <= z["cache_bytes"]
    if cache == 1:
        assert z["cache_bytes"] == BLOCK_TOKENS * 2  # one entry: the others decode privately
    elif cache:
        assert z["cache_bytes"] == cache


@pytest.mark.filterwarnings("ignore::tokenfeed.PerformanceWarning")
def test_resume_and_seek_on_compressed_data(twin):
    plain, zstd = twin
    kw = dict(seq_len=SEQ, batch_size=B, seed=11, shuffle="block", block_size=4, window_blocks=4,
              output="numpy", num_threads=4, zstd_cache_bytes=5 * BLOCK_TOKENS * 2)
    a = tokenfeed.Loader(zstd, **kw)
    for _ in range(37):
        next(a)
    state = a.state_dict()
    want = [next(a)["tokens"].copy() for _ in range(25)]
    # a plain loader resumes the zstd loader's state: same dataset fingerprint, same stream
    b = tokenfeed.Loader(plain, **kw)
    b.load_state_dict(state)
    assert all(np.array_equal(x, next(b)["tokens"]) for x in want)
    # and a zstd loader that seeks back and forth (blocks of other windows cached) agrees too
    c = tokenfeed.Loader(zstd, **kw)
    for pos in (900 * B, 12 * B, 37 * B):
        c.load_state_dict(dict(state, position=pos))
        d = tokenfeed.Loader(plain, **kw)
        d.load_state_dict(dict(state, position=pos))
        for _ in range(10):
            assert np.array_equal(next(c)["tokens"], next(d)["tokens"])
        d.close()
    for ld in (a, b, c):
        ld.close()


def test_block_shuffle_decodes_each_block_about_once(twin):
    _, zstd = twin
    ld = tokenfeed.Loader(zstd, seq_len=SEQ, batch_size=B, seed=1, shuffle="block", block_size=64, window_blocks=4,
                          output="numpy", epochs=1, num_threads=2)
    n = sum(1 for _ in ld)
    z = ld.stats()["zstd"]
    assert z["tokens_used"] == n * B * (SEQ + 1)
    blocks = -(-zstd.num_tokens // BLOCK_TOKENS) + len(zstd.files())
    assert z["blocks_decoded"] <= 2 * blocks
    assert z["decode_ratio"] < 1.3 and z["decode_model"] < 1.3 and z["note"] == ""
    assert z["cache_waits"] >= 0 and z["cache_hits"] > z["cache_misses"]


def test_small_explicit_cache_warns(twin):
    _, zstd = twin
    with pytest.warns(tokenfeed.PerformanceWarning, match="zstd_cache_bytes gives 3 KiB") as rec:
        ld = tokenfeed.Loader(zstd, seq_len=SEQ, batch_size=B, shuffle="block", block_size=64, output="numpy",
                              zstd_cache_bytes=3 * BLOCK_TOKENS * 2)
    assert rec[0].filename == __file__  # points at the line that created the loader
    next(ld)
    ld.close()


def test_full_shuffle_on_large_blocks_warns(twin):
    _, zstd = twin
    # seq_len 15 on 512-token blocks: each sample decodes ~(512 + 15) / 16 = 33x its tokens
    # warned when the loader is created: the prediction needs no batch
    with pytest.warns(tokenfeed.PerformanceWarning, match="full shuffle"):
        ld = tokenfeed.Loader(zstd, seq_len=15, batch_size=B, seed=1, shuffle="full", output="numpy",
                              zstd_cache_bytes=4 * BLOCK_TOKENS * 2)
    z = ld.stats()["zstd"]
    assert z["decode_model"] > 8 and "--block-tokens" in z["note"]
    for _ in range(100):
        next(ld)
    assert 16 < ld.stats()["zstd"]["decode_ratio"] < 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per loader
        next(ld)
        ld.stats()
    ld.close()


def test_no_warning_and_no_zstd_stats_when_cheap(twin):
    plain, zstd = twin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ld = tokenfeed.Loader(zstd, seq_len=SEQ, batch_size=B, shuffle="block", output="numpy")
        next(ld)
        assert ld.stats()["zstd"]["decode_model"] < 2
        ld.close()
        lp = tokenfeed.Loader(plain, seq_len=SEQ, batch_size=B, output="numpy")
        next(lp)
        assert lp.stats()["zstd"] is None
        lp.close()


def test_zstd_cache_bytes_is_checked(twin):
    _, zstd = twin
    with pytest.raises(ValueError, match="zstd_cache_bytes"):
        tokenfeed.Loader(zstd, seq_len=SEQ, batch_size=B, zstd_cache_bytes=-1)
    with pytest.raises(TypeError, match="zstd_cache_bytes"):
        tokenfeed.Loader(zstd, seq_len=SEQ, batch_size=B, zstd_cache_bytes=1.5)

#!/usr/bin/env python3
"""Generate the seed corpus of the fuzz targets in tests/fuzz/corpus/<target>/.

Seeds are small valid files of every format (written with tokenfeed's own
writer, numpy.save, or byte layouts of the foreign formats) plus a few
malformed ones, packed the way each target reads its input (see the comment
at the top of each tests/fuzz/fuzz_<target>.c and fuzz_split in
fuzz_util.h). Deterministic: re-running rewrites the same files.

Files named crash-*, leak-*, timeout-*, oom-* or regress-* are regression
inputs saved from fuzzing runs; this script never touches them.

    python tests/fuzz/make_corpus.py           # (re)write the seeds
"""
from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import tokenfeed  # noqa: E402


def chunks(*parts: bytes) -> bytes:
    """The container of fuzz_split: u16 length + bytes per chunk."""
    out = b""
    for p in parts:
        assert len(p) <= 0xFFFF, len(p)
        out += struct.pack("<H", len(p)) + p
    return out


def save(target: str, name: str, data: bytes) -> None:
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def docs(rng: np.random.Generator, n: int, vocab: int, mean: int = 12, empty: bool = False) -> list:
    lens = rng.integers(1, 2 * mean, size=n)
    if empty:
        lens[::3] = 0
    return [rng.integers(0, vocab, size=int(k)) for k in lens]


def native_dataset(tmp: str, name: str, vocab: int, ds: list, **kw) -> tuple[bytes, list[bytes]]:
    """(manifest bytes, shard bytes in manifest order)."""
    path = os.path.join(tmp, name)
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, **kw) as w:
        for d in ds:
            w.add_document(d)
    man = open(os.path.join(path, "tokenfeed.manifest"), "rb").read()
    shards = []
    for line in man.decode().splitlines():
        if line.startswith("shard "):
            shards.append(open(os.path.join(path, line.split()[1]), "rb").read())
    return man, shards


def megatron(tokens_per_doc: list, dtype: np.dtype, code: int, multimodal: bool = False) -> tuple[bytes, bytes]:
    """MMIDIDX v1 .idx and .bin (megatron/core/datasets/indexed_dataset.py)."""
    isz = np.dtype(dtype).itemsize
    sizes = np.array([len(t) for t in tokens_per_doc], dtype=np.int32)
    ptrs = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes):
        ptrs[1:] = np.cumsum(sizes[:-1].astype(np.int64) * isz)
    doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    idx += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
    idx += sizes.tobytes() + ptrs.tobytes() + doc_idx.tobytes()
    if multimodal:
        idx += bytes(len(sizes))
    body = b"".join(np.asarray(t, dtype=dtype).tobytes() for t in tokens_per_doc)
    return idx, body


def llmc(tokens: np.ndarray, new: bool = False) -> bytes:
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = (20240801, 7, len(tokens)) if new else (20240520, 1, len(tokens))
    return hdr.tobytes() + np.asarray(tokens, dtype=np.uint32 if new else np.uint16).tobytes()


def npy(arr: np.ndarray, version=None) -> bytes:
    """arr as a .npy file, header version `version` (None: the oldest that holds the
    header, as np.save writes it)."""
    import io

    b = io.BytesIO()
    np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()


def catalog_seeds() -> None:
    """fuzz_catalog: byte 0 picks the catalog, the rest replaces it (see the target)."""
    import glob
    import time

    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "set")
        cat = os.path.join(tmp, "catalog")
        os.makedirs(d)
        os.makedirs(cat, mode=0o700)
        paths = []
        for i, name in enumerate(("a.bin", "b.bin", "c.bin")):
            hdr = np.zeros(256, dtype=np.int32)
            hdr[:3] = (20240520, 1, 40)
            p = os.path.join(d, name)
            with open(p, "wb") as f:
                f.write(hdr.tobytes() + (np.arange(40, dtype=np.uint16) + 100 * i).tobytes())
            paths.append(p)
        old = time.time() - 60
        for p in paths + [d]:
            os.utime(p, (old, old))
        env = os.environ.get("TOKENFEED_CATALOG_DIR")
        os.environ["TOKENFEED_CATALOG_DIR"] = cat
        try:
            ds = tokenfeed.open(paths)
            st = os.stat(d)
            ds._core.catalog_set([os.path.join(d, "*.bin")], [d], [(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)])
            beside = ds._core.write_data_catalog(d + "/", "*.bin")
        finally:
            if env is None:
                del os.environ["TOKENFEED_CATALOG_DIR"]
            else:
                os.environ["TOKENFEED_CATALOG_DIR"] = env
        for kind, f in ((0, glob.glob(os.path.join(cat, "*.tfcat"))[0]), (1, glob.glob(os.path.join(cat, "*.tfset"))[0]),
                        (2, beside)):
            with open(f, "rb") as fh:
                blob = fh.read()
            save("catalog", f"kind{kind}", bytes([kind]) + blob)
            save("catalog", f"kind{kind}_truncated", bytes([kind]) + blob[: len(blob) // 2])
            bad = bytearray(blob)
            bad[8] ^= 0xFF  # another version
            save("catalog", f"kind{kind}_bad_version", bytes([kind]) + bytes(bad))
            save("catalog", f"kind{kind}_raw_sum", bytes([kind | 4]) + blob)
        # the node's catalog stored compressed (over 4 MiB in a real one), bytes kept as given
        with open(glob.glob(os.path.join(cat, "*.tfcat"))[0], "rb") as fh:
            packed = compressed_catalog(fh.read())
        save("catalog", "kind0_compressed", bytes([0 | 4 | 8]) + packed)
        save("catalog", "kind0_compressed_truncated", bytes([0 | 4 | 8]) + packed[: len(packed) - 7])


def remote_catalog_seeds() -> None:
    """fuzz_remote_catalog: byte 0's bit 2 XORs the rest into a real catalog the target writes
    (all-zero rest: that catalog as it is); otherwise the rest is the catalog."""
    save("remote_catalog", "real", bytes([4]))
    save("remote_catalog", "real_entry_flags", bytes([4]) + bytes(40) + bytes([0x08]))
    save("remote_catalog", "real_count", bytes([4]) + bytes(24) + bytes([0x05]))
    save("remote_catalog", "real_kept_sum", bytes([4 | 1]) + bytes(60) + bytes([0x11]))
    save("remote_catalog", "real_other_key", bytes([4 | 2]) + bytes(16) + bytes([0xFF]))
    save("remote_catalog", "header_only", bytes([0]) + b"TFCATLG1" + struct.pack("<IIQQQ", 3, 10, 0, 3, 0) + bytes(8))


def compressed_catalog(blob: bytes) -> bytes:
    """A catalog as the node stores a large one: "TFCATZS1", its length, one zstd frame."""
    import zstandard

    return b"TFCATZS1" + len(blob).to_bytes(8, "little") + zstandard.ZstdCompressor(level=1).compress(blob)


def main() -> None:
    rng = np.random.default_rng(1234)
    tmp = tempfile.mkdtemp(prefix="tf-corpus-")
    catalog_seeds()
    remote_catalog_seeds()
    try:
        # ---- native shards and manifests
        man1, sh1 = native_dataset(tmp, "u16", 50257, docs(rng, 20, 50257))
        man8, sh8 = native_dataset(tmp, "u8", 200, docs(rng, 10, 200, empty=True))
        man32, sh32 = native_dataset(tmp, "u32", 100000, docs(rng, 6, 100000), dtype="uint32")
        manz, shz = native_dataset(tmp, "zstd", 50257, docs(rng, 30, 50257, mean=40), compression="zstd",
                                   block_tokens=64)
        manm, shm = native_dataset(tmp, "multi", 1000, docs(rng, 40, 1000), shard_tokens=100)
        mane, she = native_dataset(tmp, "emptydocs", 300, [np.zeros(0, int), np.arange(5), np.zeros(0, int)])
        for name, sh in [("u16", sh1[0]), ("u8_emptydocs", sh8[0]), ("u32", sh32[0]), ("zstd", shz[0]),
                         ("multi0", shm[0]), ("only_empty_docs", she[0])]:
            save("native_header", name, b"\x00" + sh)
        save("native_header", "header_only_prefix", b"\x01" + sh1[0][:256])
        bad = bytearray(sh1[0])
        bad[48:56] = struct.pack("<Q", 1 << 62)  # tokens_offset past the end
        save("native_header", "bad_tokens_offset", b"\x00" + bytes(bad))
        bad = bytearray(shz[0])
        bad[96:104] = struct.pack("<Q", 1)  # block_tokens disagrees with blocks_bytes
        save("native_header", "bad_block_tokens", b"\x00" + bytes(bad))
        save("native_header", "truncated", b"\x00" + sh1[0][:300])
        save("native_header", "bad_checksum_kept", b"\x00" + sh1[0][:248] + b"\x01" + sh1[0][249:])

        for name, m in [("u16", man1), ("u8", man8), ("u32", man32), ("zstd", manz), ("multi", manm)]:
            save("manifest", name, m)
        save("manifest", "truncated", manm[: len(manm) // 2])
        save("manifest", "bad_version", man1.replace(b"tokenfeed-manifest 1", b"tokenfeed-manifest 9"))
        save("manifest", "bad_count", man1.replace(b"num_shards 1", b"num_shards 99999999999"))
        save("manifest", "dup_name", manm.replace(manm.split(b"\n")[5].split(b" ")[1], manm.split(b"\n")[4].split(b" ")[1]))
        # version 2: a dataset made of parts (shard names are paths into parts/)
        merged = os.path.join(tmp, "merged")
        prng = np.random.default_rng(99)  # its own generator: the seeds after these stay as they were
        for k, n in enumerate((5, 0, 7)):
            with tokenfeed.PartWriter(merged, part=k, parts=3, vocab_size=1000, shard_tokens=60) as pw:
                for d in docs(prng, n, 1000):
                    pw.add_document(d)
        tokenfeed.merge_parts(merged)
        man2 = open(os.path.join(merged, "tokenfeed.manifest"), "rb").read()
        save("manifest", "v2_parts", man2)
        save("manifest", "v2_dotdot", man2.replace(b"shard parts/", b"shard parts/../", 1))
        save("manifest", "v2_absolute", man2.replace(b"shard parts/", b"shard /parts/", 1))
        save("manifest", "v2_empty_component", man2.replace(b"shard parts/", b"shard parts//", 1))
        save("manifest", "v1_with_slash", man2.replace(b"tokenfeed-manifest 2", b"tokenfeed-manifest 1"))

        # ---- .npy
        for name, arr, ver in [("u16", rng.integers(0, 50257, 50).astype(np.uint16), None),
                               ("u8", rng.integers(0, 255, 9).astype(np.uint8), None),
                               ("i32", rng.integers(0, 1 << 20, 17).astype(np.int32), None),
                               ("u32_v2", rng.integers(0, 1 << 20, 17).astype(np.uint32), (2, 0)),
                               ("i64_v3", rng.integers(0, 1 << 20, 5).astype(np.int64), (3, 0)),
                               ("empty", np.zeros(0, np.uint16), None),
                               ("bigendian", rng.integers(0, 9, 5).astype(">u2"), None),
                               ("2d", np.zeros((2, 3), np.uint16), None),
                               ("float", np.zeros(4, np.float32), None)]:
            save("npy_header", name, npy(arr, ver))
        good = npy(np.arange(10, dtype=np.uint16))
        save("npy_header", "truncated_header", good[:40])
        save("npy_header", "fortran", good.replace(b"False", b"True "))

        # ---- Megatron pairs: chunk 0 .idx, chunk 1 .bin, chunk 2 control
        mdocs = docs(rng, 12, 30000, empty=True)
        for name, dt, code, mm in [("u16", np.uint16, 8, False), ("i32", np.int32, 4, False),
                                   ("u8", np.uint8, 1, False), ("multimodal", np.uint16, 8, True),
                                   ("i64", np.int64, 5, False)]:
            d = [np.asarray(x) % 250 for x in mdocs] if code == 1 else mdocs
            idx, body = megatron(d, dt, code, mm)
            save("megatron", name, chunks(idx, body, b"\x07"))
            save("dataset", "megatron_" + name, b"\x02" + struct.pack("<I", 0x1234) + chunks(idx, body))
        idx, body = megatron(mdocs, np.uint16, 8)
        save("megatron", "truncated_idx", chunks(idx[:-5], body))
        save("megatron", "short_bin", chunks(idx, body[:-2]))
        badp = bytearray(idx)
        badp[34 + 4 * 12: 34 + 4 * 12 + 8] = struct.pack("<q", -8)
        save("megatron", "negative_pointer", chunks(bytes(badp), body))

        # ---- llm.c
        for name, b in [("gpt2", llmc(rng.integers(0, 50257, 100))), ("llama3", llmc(rng.integers(0, 128256, 60), True)),
                        ("empty", llmc(np.zeros(0, int)))]:
            save("llmc", name, b)
        g = llmc(rng.integers(0, 50257, 40))
        save("llmc", "truncated", g[:-3])
        save("llmc", "negative_count", g[:8] + struct.pack("<i", -1) + g[12:])
        save("llmc", "wrong_version", g[:4] + struct.pack("<i", 7) + g[8:])

        # ---- datatrove: byte 0 = dtype/ctl, chunk 0 = tokens, chunk 1 = index
        toks = np.concatenate(docs(rng, 8, 50000)).astype(np.uint16)
        ends = np.cumsum([0] + [3, 0, 10, 7]).astype(np.uint64)
        ends = np.cumsum(rng.integers(0, 20, 8)).astype(np.uint64)
        toks = rng.integers(0, 50000, int(ends[-1])).astype(np.uint16)
        save("datatrove", "u16_index", b"\x01" + chunks(toks.tobytes(), ends.tobytes()))
        save("datatrove", "u16_noindex", b"\x01" + chunks(toks.tobytes()))
        save("datatrove", "u32_index", b"\x02" + chunks(toks.astype(np.uint32).tobytes(), ends.tobytes()))
        save("datatrove", "bad_last_end", b"\x01" + chunks(toks.tobytes(), (ends + 1).tobytes()))
        save("datatrove", "nonmonotonic", b"\x01" + chunks(toks.tobytes(), ends[::-1].copy().tobytes()))
        save("datatrove", "index_not_x8", b"\x01" + chunks(toks.tobytes(), ends.tobytes()[:-3]))

        # ---- nemo_nanogpt: byte 0 = ctl (bit 0: format forced), chunk 0 = shard, chunk 1 = .bos.idx
        nrng = np.random.default_rng(2788)  # its own generator: the seeds after these stay as they were
        ntoks = nrng.integers(0, 50000, 300).astype(np.uint16)
        nhdr = np.zeros(256, np.int32)
        nhdr[:4] = (278895051, 1, len(ntoks), 2)
        nshard = nhdr.tobytes() + ntoks.tobytes()
        nbos = np.array([0, 40, 41, 200], np.int32).tobytes()
        save("nemo_nanogpt", "u16_bos", b"\x00" + chunks(nshard, nbos))
        save("nemo_nanogpt", "u16_nobos", b"\x01" + chunks(nshard))
        nhdr[3] = 4
        save("nemo_nanogpt", "u32_bos", b"\x01" + chunks(nhdr.tobytes() + ntoks.astype(np.uint32).tobytes(), nbos))
        save("nemo_nanogpt", "lead_bos", b"\x00" + chunks(nshard, nbos[4:]))
        save("nemo_nanogpt", "bos_unsorted", b"\x00" + chunks(nshard, nbos[::-1]))
        save("nemo_nanogpt", "bos_past_end", b"\x00" + chunks(nshard, np.array([0, 300], np.int32).tobytes()))
        save("nemo_nanogpt", "bos_odd", b"\x00" + chunks(nshard, nbos[:-1]))
        save("nemo_nanogpt", "truncated", b"\x00" + chunks(nshard[:-1], nbos))

        # ---- docindex: byte 0 = dtype | eos << 3 | flags, chunk 0 = tokens, chunk 1 = .tfdocs
        erng = np.random.default_rng(99)  # its own generator: the seeds after these stay as they were
        etoks = np.concatenate([np.append(d_ + 1, 0) for d_ in docs(erng, 8, 1000)]).astype(np.uint16)
        ep = os.path.join(tmp, "eos.bin")
        etoks.tofile(ep)
        with open(tokenfeed.build_index(ep, dtype="uint16", eos_id=0), "rb") as f:
            ix = f.read()
        save("docindex", "u16_index", b"\x01" + chunks(etoks.tobytes(), ix))
        save("docindex", "u16_build", b"\x01" + chunks(etoks.tobytes()))
        save("docindex", "u32_build_eos3", bytes([0x02 | 3 << 3]) + chunks(etoks.astype(np.uint32).tobytes()))
        save("docindex", "count_too_big", b"\x81" + chunks(etoks.tobytes(), ix[:40] + struct.pack("<Q", 1 << 60)
                                                              + ix[48:]))
        save("docindex", "truncated", b"\x81" + chunks(etoks.tobytes(), ix[:-8]))
        save("docindex", "bad_version", b"\x01" + chunks(etoks.tobytes(), ix[:8] + struct.pack("<I", 9) + ix[12:]))
        v2 = ix[:8] + struct.pack("<I", 2) + ix[12:56] + bytes(40) + ix[64:]  # as if built from OLMo's metadata
        save("docindex", "version2", b"\x81" + chunks(etoks.tobytes(), v2))

        # ---- whole datasets: kind, ctl (u32), chunks (fuzz_dataset.c)
        def ds(kind: int, ctl: int, *parts: bytes) -> bytes:
            return bytes([kind]) + struct.pack("<I", ctl) + chunks(*parts)

        save("dataset", "native_dir_u16", ds(0, 0, man1, *sh1))
        save("dataset", "native_dir_multi", ds(0, 0x2345, manm, *shm))
        save("dataset", "native_dir_zstd_sep", ds(0, 0x80 | 0x20 | 7, manz, *shz))
        save("dataset", "native_dir_emptydocs", ds(0, 0x40 | 1, man8, *sh8))
        save("dataset", "native_dir_missing_shard", ds(0, 0, manm, *shm[:1]))
        save("dataset", "native_files", ds(1, 3, sh1[0], sh32[0], shz[0]))
        save("dataset", "llmc_files", ds(3, 0x1f, llmc(rng.integers(0, 50257, 100)), llmc(rng.integers(0, 128256, 30), True)))
        save("dataset", "npy_files", ds(4, 0x0c00, npy(np.arange(33, dtype=np.uint16)), npy(np.arange(7, dtype=np.int32))))
        save("dataset", "mixed", ds(5, 0x9999, sh1[0], llmc(rng.integers(0, 50257, 20)), npy(np.arange(9, dtype=np.uint8)),
                                    rng.integers(0, 60000, 31).astype(np.uint16).tobytes()))
        save("dataset", "one_token", ds(4, 0, npy(np.arange(1, dtype=np.uint16))))
        cache_seeds()
    finally:
        shutil.rmtree(tmp)


# ---- the chunk cache (fuzz_cache.c): 4 control bytes, then chunks: header,
# records, operations, commit data, file names, file bytes. The index layout
# is remote_cache.c's (idx_hdr / idx_rec).
M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def cache_key(b: int) -> tuple[int, int, int]:
    """key_of() of fuzz_cache.c: (oid_lo, oid_hi, chunk)."""
    return 1 + (b & 3), 0x5EED if (b >> 2) & 1 else 0, (b >> 3) & 3


def cache_index(nslots: int, recs: list, used=None, dirty: int = 0, procs=()) -> tuple[bytes, bytes]:
    """(header, records) of an index whose records sit where lookups find them.
    recs: (key byte, state, bytes, next_use, need_slot, need_gen, stamp)."""
    table = [b""] * nslots
    for kb, state, nbytes, next_use, need_slot, need_gen, stamp in recs:
        lo, hi, ch = cache_key(kb)
        i = mix64(lo ^ mix64(hi + ch)) & (nslots - 1)
        while table[i]:
            i = (i + 1) & (nslots - 1)
        table[i] = struct.pack("<QQIIHHIIIQQQ", lo, hi, ch, state, 0, need_slot, 0, need_gen, 0, nbytes,
                               next_use, stamp)
    records = b"".join(r or bytes(64) for r in table)
    present = [r for r in recs if r[1] == 2]
    hdr = b"TFCIDX02" + struct.pack("<IIQQQQQQQQQ", 2, 64, nslots, len(recs) if used is None else used, 0,
                                     sum(r[2] for r in recs), len(present), dirty, len(recs), 0, len(recs))
    hdr += bytes(40)
    for gen, position, pid in procs:
        hdr += struct.pack("<QQqQ", gen, position, pid, 0)
    return hdr, records


def cache_ops(*ops: tuple[int, int, int]) -> bytes:
    return b"".join(bytes(o) for o in ops)


def cache_seeds() -> None:
    def seed(name: str, ctl: bytes, hdr: bytes = b"", recs: bytes = b"", ops: bytes = b"", data: bytes = b"",
             names: bytes = b"", body: bytes = b"") -> None:
        save("cache", name, ctl + chunks(hdr, recs, ops, data, names, body))

    data = bytes(range(256))
    # commit (with and without a mapping), look up, map, publish, evict under
    # a 40-byte limit, forget, a second process, abort of a reservation
    life = cache_ops((1, 0, 20), (0x23, 0, 20), (0, 0, 0), (5, 0, 20), (1, 8, 30), (2, 8, 30), (8, 0, 9),
                     (9, 0, 0), (1, 16, 40), (0x83, 16, 40), (0x0B, 0, 3), (0x41, 1, 10), (0x44, 1, 10),
                     (0x42, 2, 12), (6, 2, 0x0C), (7, 8, 0), (0x0B, 0, 0), (9, 0, 0))
    seed("fresh", bytes([3, 5, 0, 1]), ops=life, data=data)
    seed("fresh_roomy", bytes([3, 200, 16, 0]), ops=life, data=data)
    # the index of a cache after a few commits (records found by lookups;
    # no chunk files: maps answer ENOENT)
    hdr, recs = cache_index(16, [(0, 2, 21, M64, 0, 0, 1), (8, 2, 31, 7, 0, 1, 2), (1, 1, 11, 5, 0, 1, 3)],
                            procs=[(1, 0, 0)])
    seed("index_commits", bytes([0, 5, 0, 1]), hdr, recs, life, data)
    seed("index_verbatim", bytes([2, 5, 0, 1]), hdr.ljust(16384, b"\0"), recs, life, data)
    seed("index_dirty_rebuild", bytes([4, 5, 0, 1]), hdr[:56] + struct.pack("<Q", 1) + hdr[64:], recs, life, data,
         b"k\x00\nk\x08\nt0-1-0.tmp\nt7-99-1.info\n", bytes(8) + b"\x00" * 40)
    # malformed: a record count past the table (compaction), states and slots
    # out of range, a header whose nslots * 64 wraps around, a wrong size
    seed("index_used_huge", bytes([0, 5, 0, 1]), hdr[:24] + struct.pack("<Q", (1 << 58) + 1) + hdr[32:], recs, life,
         data)
    bad = bytearray(recs)
    for i in range(0, len(bad), 64):
        if bad[i + 20]:
            bad[i + 20] = 7 if i % 128 else bad[i + 20]
            bad[i + 24:i + 28] = struct.pack("<HH", 300, 0xFFFF)
    seed("index_bad_states", bytes([0, 5, 0, 1]), hdr, bytes(bad), life, data)
    seed("index_nslots_wraps", bytes([1, 5, 0, 1]), hdr[:16] + struct.pack("<Q", 1 << 58) + hdr[24:], b"", life, data)
    seed("index_wrong_size", bytes([1, 5, 0, 1]), hdr, recs[:-64], life, data)
    seed("index_bad_magic", bytes([2, 5, 0, 1]), b"TFCIDX01" + hdr[8:], recs, life, data)
    # temporary file and object directory names the cleanup and the rebuild parse
    names = (b"t0-1-0.tmp\nt4294967296-1-x.tmp\nt-1-2-\nt300-0-3.tmp\nt1-4294967295-9.info\nt 12-3\n"
             b"o00000000000000000000000000000001/00000000.c\no0000000000005eed0000000000000002/0000000g.c\n"
             b"oZZ/abc\nofffffffffffffffffffffffffffffffff/ffffffff.c\np0.lock\npx\n")
    seed("odd_names_dirty", bytes([4, 5, 0, 1]), hdr[:56] + struct.pack("<Q", 1) + hdr[64:], recs, life, data, names,
         bytes(100))
    seed("odd_names_fresh", bytes([3, 5, 0, 0]), ops=life, data=data, names=names, body=bytes(41))
    seed("stray_file", bytes([3, 5, 0, 0]), ops=life, data=data, names=b"xnotes.txt\n")
    # a committed chunk rewritten behind the cache's back, then mapped
    seed("chunk_overwritten", bytes([3, 50, 0, 1]),
         ops=cache_ops((2, 0, 20), (10, 0, 3), (2, 8, 30), (0x2A, 8, 0), (2, 16, 5), (10, 16, 200), (5, 16, 5)),
         data=data, body=b"\xff\x00garbage")


# ---- loader states (fuzz_state.c): byte 0 = order (bit 0), own state written
# over (bit 1, offset in bytes 1-2), lenient (bit 2); then the state's bytes.
def state_seeds() -> None:
    plain = (b'{"format_version": 2, "dataset_fingerprint": "0000000000000000", "config_fingerprint": '
             b'"0000000000000000", "position": 6, "config": {"seq_len": 10, "global_batch": 2}, '
             b'"skipped": [[8, 12]], "weights_history": null, "order": null}')
    save("state", "plain_wrong_fingerprints", b"\x00" + plain)
    save("state", "not_json", b"\x00not json")
    save("state", "nan", b"\x00" + plain.replace(b'"position": 6', b'"position": NaN'))
    save("state", "key_twice", b"\x00" + plain.replace(b'"position": 6', b'"position": 6, "position": 8'))
    save("state", "deep", b"\x00" + b"[" * 40 + b"]" * 40)
    save("state", "many_members", b"\x00{" + b", ".join(b'"k%d": %d' % (i, i) for i in range(1100)) + b"}")
    save("state", "many_skips", b"\x00" + plain.replace(b"[[8, 12]]", b"[" + b", ".join(
        b"[%d, %d]" % (4 * i, 4 * i + 2) for i in range(3000)) + b"]"))
    save("state", "own_plain", b"\x02\x00\x00")
    save("state", "own_mixture", b"\x03\x00\x00")
    save("state", "own_mixture_lenient", b"\x07\x00\x00")
    save("state", "own_history_zeros", b"\x03\xff\xff" + b'[[4, [0.0, 0.0]]], "order": null}')
    save("state", "own_flags_cut", b"\x06\x40\x00" + b'}')
    save("state", "own_utf8_tail", b"\x03\x10\x00" + "\u00e9\u00e9".encode())
    # the weights a mixture began with (weights_initial): of another size, and a schedule with an anchor
    mixed = plain.replace(b'"global_batch": 2}', b'"global_batch": 2, "weights": [0.25, 0.75]}').replace(
        b'"weights_history": null', b'"weights_history": [[4, [0.25, 0.75]]], "weights_initial": INITIAL')
    save("state", "initial_other_size", b"\x00" + mixed.replace(b"INITIAL", b"[[0.5], null, null, null]"))
    save("state", "initial_schedule", b"\x00" + mixed.replace(
        b"INITIAL", b'[[[0.5, 0.5], [0.1, 0.9]], [0, 3], "linear", [2, [1, 1]]]'))
    save("state", "initial_bad_anchor", b"\x04" + mixed.replace(b"INITIAL", b'[[0.5, 0.5], null, null, [2, [1]]]'))


def columns_seeds() -> None:
    """Metadata column files (tokenfeed.sources._views.write_columns): every type, missing values, and a
    filter text after the 0xFF 0xFE separator of fuzz_columns.c."""
    from tokenfeed.sources import _views

    tmp = tempfile.mkdtemp(prefix="tf-corpus-cols-")
    try:
        p = os.path.join(tmp, "c")
        _views.write_columns(p, 6, {"a": ["en", "de", "en", None, "fr", "en"], "b": [1.5, None, 3.0, 0.0, -1.0, 2.0],
                                    "n": [1, 2, None, 4, 5, 6], "u": ["x", "yy", "", "zzz", "w", "v"]},
                             types={"a": "category", "u": "string"})
        with open(p, "rb") as f:
            full = f.read()
        save("columns", "all_types", full)
        save("columns", "all_types_filter", full + b"\xff\xfe" + b"a in ('en', 'fr') and not (b < 1 or n == 2)")
        save("columns", "truncated", full[: len(full) // 2])
        _views.write_columns(p, 0, {})
        with open(p, "rb") as f:
            save("columns", "empty", f.read())
        _views.write_columns(p, 3, {"a": [1, 2, 3]})
        with open(p, "rb") as f:
            save("columns", "int_filter", f.read() + b"\xff\xfe" + b"a >= 2 or (a == 1.0 and not a != 1)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def olmo_meta_seeds() -> None:
    """OLMo's document metadata (fuzz_olmo_meta.c): byte 0 = token count pick | cut << 3 | gzip << 7,
    then the CSV text (or with bit 7, the bytes of x.csv.gz: gzip members, read through zlib)."""
    import gzip

    rows = b"0,6,id-a,s3://bucket/x.json.gz,1\n6,9,\"q,\"\"x\"\"\ny\",2\r\n12,20\n"
    save("olmo_meta", "rows_100", b"\x03" + rows)
    save("olmo_meta", "rows_cut_7", bytes([0x03 | 6 << 3]) + rows)
    save("olmo_meta", "no_newline", b"\x02" + b"0,3\n3,7")
    save("olmo_meta", "overlap", b"\x03" + b"0,10\n5,20\n")
    save("olmo_meta", "header", b"\x03" + b"start,end\n0,10\n")
    save("olmo_meta", "overflow", b"\x06" + b"0,99999999999999999999\n")
    save("olmo_meta", "open_quote", b"\x03" + b'0,10,"abc\n')
    mtime = {"mtime": 0}
    save("olmo_meta", "gzip_members", bytes([0x83]) + gzip.compress(rows[:30], **mtime) + gzip.compress(rows[30:], **mtime))
    save("olmo_meta", "gzip_truncated", bytes([0x83]) + gzip.compress(rows, **mtime)[:-5])
    save("olmo_meta", "gzip_trailing", bytes([0x83]) + gzip.compress(rows, **mtime) + b"\x00\x01")


if __name__ == "__main__":
    main()
    state_seeds()
    columns_seeds()
    olmo_meta_seeds()

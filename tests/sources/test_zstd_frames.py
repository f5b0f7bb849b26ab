"""Compressed shards are standard zstd: every block is one frame that the stock
``zstd`` tool and an independent zstd binding decode on their own, the token
section is exactly those frames back to back, and ``verify()`` refuses a shard
whose blocks are not such frames even when the tokens still read correctly."""
from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import tokenfeed

xxhash = pytest.importorskip("xxhash")
zstandard = pytest.importorskip("zstandard")

pytestmark = pytest.mark.skipif(not tokenfeed.build_info()["zstd"]["usable"], reason="zstd not compiled in")

ZSTD_CLI = shutil.which("zstd")


def write(path, tokens, dtype, block_tokens, docs=5):
    vocab = {np.uint8: 256, np.uint16: 65000, np.uint32: 1 << 20}[dtype]
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, dtype=np.dtype(dtype).name, compression="zstd",
                                 block_tokens=block_tokens,
                                 # no per-chunk checksum table: the variants below rewrite the token
                                 # section, which that table (docs/format.md) would then refuse first
                                 chunk_checksum_bytes=0) as w:
        for part in np.array_split(tokens, docs):
            w.add_document(part)
    shards = sorted(p for p in os.listdir(path) if p.endswith(".tfs"))
    assert len(shards) == 1
    return os.path.join(path, shards[0])


class Shard:
    """The fields of docs/format.md that locate the frames."""

    def __init__(self, data: bytes):
        self.data = data
        (self.tok_off, self.tok_bytes, self.docs_off, self.docs_bytes, self.blk_off, self.blk_bytes,
         self.block_tokens) = struct.unpack_from("<7Q", data, 48)
        self.num_tokens = struct.unpack_from("<Q", data, 32)[0]
        self.itemsize = {1: 1, 2: 2, 3: 4}[struct.unpack_from("<I", data, 20)[0]]
        table = np.frombuffer(data, dtype="<u8", count=self.blk_bytes // 8, offset=self.blk_off).reshape(-1, 2)
        self.table = [(int(o), int(s)) for o, s in table]

    def frame(self, k: int) -> bytes:
        o, s = self.table[k]
        return self.data[self.tok_off + o:self.tok_off + o + s]

    def section(self) -> bytes:
        return self.data[self.tok_off:self.tok_off + self.tok_bytes]

    def block_bytes(self, k: int) -> int:
        return min(self.block_tokens, self.num_tokens - k * self.block_tokens) * self.itemsize

    def rebuilt(self, frames: list, gaps: dict = {}, order: list | None = None) -> bytes:
        """The same shard with these block payloads (block k = frames[k]), laid out in `order`
        with gaps[k] zero bytes before block k; header, table and checksums fixed up."""
        order = order if order is not None else list(range(len(frames)))
        sec = bytearray()
        offs = [0] * len(frames)
        for k in order:
            sec += b"\0" * gaps.get(k, 0)
            offs[k] = len(sec)
            sec += frames[k]
        docs = self.data[self.docs_off:self.docs_off + self.docs_bytes]
        table = b"".join(struct.pack("<QQ", offs[k], len(frames[k])) for k in range(len(frames)))
        docs_off = -(-(self.tok_off + len(sec)) // 8) * 8
        blk_off = docs_off + len(docs)
        out = bytearray(self.data[:self.tok_off]) + sec
        out += b"\0" * (docs_off - len(out)) + docs + table
        struct.pack_into("<Q", out, 56, len(sec))
        struct.pack_into("<Q", out, 64, docs_off)
        struct.pack_into("<Q", out, 80, blk_off)
        struct.pack_into("<Q", out, 120, xxhash.xxh64_intdigest(table))
        struct.pack_into("<Q", out, 128, len(out))
        struct.pack_into("<Q", out, 248, xxhash.xxh64_intdigest(bytes(out[:248])))
        return bytes(out)


CASES = [(np.uint16, 1000), (np.uint8, 64), (np.uint32, 4096), (np.uint16, 65536), (np.uint16, 1)]


@pytest.mark.parametrize("dtype,block_tokens", CASES, ids=[f"{np.dtype(d).name}-{b}" for d, b in CASES])
def test_every_block_is_a_standard_frame(tmp_path, dtype, block_tokens):
    rng = np.random.default_rng(block_tokens)
    n = 9000 if block_tokens > 1 else 300
    hi = {np.uint8: 256, np.uint16: 65000, np.uint32: 1 << 20}[dtype]
    tokens = (rng.zipf(1.3, n) % hi).astype(dtype)
    sh = Shard(open(write(tmp_path / "d", tokens, dtype, block_tokens), "rb").read())
    raw = tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    assert len(sh.table) == -(-n // block_tokens)
    dctx = zstandard.ZstdDecompressor()
    pos = 0
    for k in range(len(sh.table)):
        f = sh.frame(k)
        p = zstandard.get_frame_parameters(f)
        assert p.content_size == sh.block_bytes(k) and p.has_checksum and p.dict_id == 0
        start = k * block_tokens * sh.itemsize
        assert dctx.decompress(f) == raw[start:start + sh.block_bytes(k)]
        assert sh.table[k][0] == pos  # back to back, in block order
        pos += sh.table[k][1]
    assert pos == sh.tok_bytes
    # the whole section is a multi-frame zstd stream of all the tokens
    with dctx.stream_reader(io.BytesIO(sh.section()), read_across_frames=True) as r:
        assert r.read() == raw


@pytest.mark.skipif(ZSTD_CLI is None, reason="the zstd command-line tool is not installed (apt install zstd)")
@pytest.mark.parametrize("dtype,block_tokens", CASES[:3], ids=[f"{np.dtype(d).name}-{b}" for d, b in CASES[:3]])
def test_zstd_cli_decodes_blocks(tmp_path, dtype, block_tokens):
    rng = np.random.default_rng(7)
    hi = {np.uint8: 256, np.uint16: 65000, np.uint32: 1 << 20}[dtype]
    tokens = (rng.zipf(1.2, 7000) % hi).astype(dtype)
    sh = Shard(open(write(tmp_path / "d", tokens, dtype, block_tokens), "rb").read())
    raw = tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes()

    def cli(data: bytes) -> bytes:
        r = subprocess.run([ZSTD_CLI, "-d", "-c", "-q"], input=data, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout

    for k in sorted({0, 1, len(sh.table) // 2, len(sh.table) - 1}):
        start = k * block_tokens * sh.itemsize
        assert cli(sh.frame(k)) == raw[start:start + sh.block_bytes(k)], f"block {k}"
    assert cli(sh.section()) == raw
    # zstd --test checks every frame's content checksum
    p = tmp_path / "section.zst"
    p.write_bytes(sh.section())
    assert subprocess.run([ZSTD_CLI, "-t", "-q", str(p)], capture_output=True, timeout=60).returncode == 0


def _variant(tmp_path, name, data):
    d = tmp_path / name
    d.mkdir()
    p = d / "shard.tfs"
    p.write_bytes(data)
    return p


def _payloads(sh, compress):
    out = []
    for k in range(len(sh.table)):
        out.append(compress(zstandard.ZstdDecompressor().decompress(sh.frame(k)), k))
    return out


@pytest.fixture()
def shard(tmp_path):
    rng = np.random.default_rng(3)
    tokens = (rng.zipf(1.3, 6000) % 60000).astype(np.uint16)
    return Shard(open(write(tmp_path / "orig", tokens, np.uint16, 1000), "rb").read()), tokens


def _c(level=3, **kw):
    return zstandard.ZstdCompressor(level=level, **kw)


VARIANTS = {
    # frames that decode, but are not what docs/format.md promises
    "no-checksum": (lambda sh: sh.rebuilt(_payloads(sh, lambda b, k: _c(write_checksum=False).compress(b))),
                    "content checksum"),
    "no-content-size": (lambda sh: sh.rebuilt(_payloads(
        sh, lambda b, k: _c(write_checksum=True, write_content_size=False).compress(b))), "content size"),
    "two-frames-per-block": (lambda sh: sh.rebuilt(_payloads(
        sh, lambda b, k: _c(write_checksum=True).compress(b[:len(b) // 2]) +
        _c(write_checksum=True).compress(b[len(b) // 2:]))), "content size"),
    "skippable-frame-after": (lambda sh: sh.rebuilt(_payloads(
        sh, lambda b, k: _c(write_checksum=True).compress(b) + struct.pack("<II", 0x184D2A50, 4) + b"tail")),
        "exactly one zstd frame"),
    "gap-between-blocks": (lambda sh: sh.rebuilt([sh.frame(k) for k in range(len(sh.table))], gaps={2: 16}),
                           "back to back"),
    "blocks-out-of-order": (lambda sh: sh.rebuilt([sh.frame(k) for k in range(len(sh.table))],
                                                  order=[1, 0] + list(range(2, len(sh.table)))), "back to back"),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_verify_refuses_nonstandard_frames(tmp_path, shard, name):
    sh, tokens = shard
    make, phrase = VARIANTS[name]
    p = _variant(tmp_path, name, make(sh))
    ds = tokenfeed.open(str(p))
    # reading still gives the right tokens: the frames decode ...
    assert np.array_equal(ds.tokens(0, ds.num_tokens), tokens)
    # ... but verify() says the shard is not standard frames, naming the file and block
    with pytest.raises(tokenfeed.FormatError) as e:
        ds.verify(threads=1, progress=False)
    msg = str(e.value)
    assert str(p) in msg and "block" in msg and phrase in msg, msg


def test_verify_accepts_the_writers_frames(tmp_path, shard):
    sh, tokens = shard
    # the unchanged shard, rebuilt by the helper, verifies: the variants above fail for their change only
    p = _variant(tmp_path, "same", sh.rebuilt([sh.frame(k) for k in range(len(sh.table))]))
    assert open(p, "rb").read() == sh.data
    tokenfeed.open(str(p)).verify(threads=1, progress=False)


def literal_kinds(frame: bytes) -> list:
    """The Literals_Block_Type (RFC 8878 3.1.1.3.1.1: 0 raw, 1 RLE, 2 Huffman, 3 treeless) of every
    compressed block of a frame; raw and RLE blocks carry no literals section and are left out."""
    fhd = frame[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + ((1 if single else 0), 2, 4, 8)[fcs_flag]
    kinds = []
    while True:
        bh = int.from_bytes(frame[pos:pos + 3], "little")
        last, btype, size = bh & 1, (bh >> 1) & 3, bh >> 3
        pos += 3
        if btype == 2:
            kinds.append(frame[pos] & 3)
        pos += 1 if btype == 1 else size
        if last:
            return kinds


def zipf_ids(n: int, vocab: int, seed: int) -> np.ndarray:
    """i.i.d. Zipf(1.1) ids over a shuffled vocabulary, as the benchmark's generated data."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -1.1)
    return rng.permutation(vocab)[np.searchsorted(cdf / cdf[-1], rng.random(n)).clip(0, vocab - 1)]


def written_kinds(path, tokens, dtype, vocab, **kw):
    with tokenfeed.DatasetWriter(str(path), vocab_size=vocab, dtype=np.dtype(dtype).name, compression="zstd",
                                 **kw) as w:
        for part in np.array_split(tokens.astype(dtype), 7):
            w.add_document(part)
    ds = tokenfeed.open(str(path))
    assert np.array_equal(ds.tokens(0, ds.num_tokens), tokens.astype(dtype))
    ds.verify(threads=1, progress=False)
    shards = sorted(p for p in os.listdir(path) if p.endswith(".tfs"))
    sh = Shard(open(os.path.join(path, shards[0]), "rb").read())
    dctx = zstandard.ZstdDecompressor()
    kinds = []
    for k in range(len(sh.table)):
        f = sh.frame(k)
        assert dctx.decompress(f) == tokens[k * sh.block_tokens:(k + 1) * sh.block_tokens].astype(
            np.dtype(dtype).newbyteorder("<")).tobytes()
        kinds += literal_kinds(f)
    return kinds


def test_default_frames_store_literals_raw_where_huffman_gains_little(tmp_path):
    # uint16 ids of a 50k vocabulary: Huffman coding of the literals saves a few percent and
    # doubles the decoding time of a small frame, so the default (level 3) stores them raw
    tokens = zipf_ids(300_000, 50257, 1)
    kinds = written_kinds(tmp_path / "d", tokens, np.uint16, 50257)
    assert kinds and set(kinds) == {0}, kinds
    # a level above 3 leaves the choice to zstd, which codes them
    kinds = written_kinds(tmp_path / "l5", tokens, np.uint16, 50257, level=5)
    assert 2 in kinds, kinds


def test_huffman_literals_kept_where_they_pay(tmp_path):
    # ids of a few hundred common tokens: the high byte is nearly always 0 or 1, and Huffman
    # coding makes each frame far more than a fifth smaller, so it is kept
    rng = np.random.default_rng(2)
    small = np.minimum(rng.geometric(0.02, 64 * 2048) - 1, 60000)
    kinds = written_kinds(tmp_path / "d", small, np.uint16, 65000)
    assert kinds and set(kinds) <= {2, 3} and 2 in kinds, kinds
    # the choice is made per 64 blocks of a shard: data that changes kind mid-way switches
    mixed = np.concatenate([zipf_ids(64 * 2048, 50257, 3), small, zipf_ids(64 * 2048, 50257, 4)])
    kinds = written_kinds(tmp_path / "m", mixed, np.uint16, 65000)
    assert set(kinds[:64]) == {0} and 2 in kinds[64:128] and set(kinds[128:]) == {0}, kinds

"""Corrupted and truncated files of every format: each header field of each
format is overwritten in turn with hostile values, and files are truncated at
many offsets.

Every case must end in one of:
  - tokenfeed.FormatError at open, whose message names the file;
  - FormatError from verify() naming the file (payload and checksum fields
    that an O(1) open does not read);
  - a dataset whose tokens are exactly the original ones (a change that does
    not alter the data, such as a larger vocab_size).
Anything else (another exception type, silently different tokens, a crash)
fails. Round trips of valid files are tests/sources/test_formats.py's job.
"""
from __future__ import annotations

import faulthandler
import os
import struct

import numpy as np
import pytest

import tokenfeed

xxhash = pytest.importorskip("xxhash")


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def outcome(path, name, want_tokens, **open_kw) -> str:
    """Open path and classify what happens (see the module docstring)."""
    try:
        ds = tokenfeed.open(path, **open_kw)
    except tokenfeed.FormatError as e:
        assert name in str(e), f"message does not name {name}: {e}"
        return "open"
    try:
        ds.verify(threads=1, progress=False)
    except tokenfeed.FormatError as e:
        assert name in str(e), f"message does not name {name}: {e}"
        return "verify"
    try:
        got = ds.tokens(0, ds.num_tokens).astype(np.int64)
    except tokenfeed.FormatError as e:  # pragma: no cover - verify reads everything first
        assert name in str(e)
        return "read"
    assert np.array_equal(got, np.asarray(want_tokens, dtype=np.int64)), \
        f"{name}: opened and verified, but the tokens differ from the original (silent garbage)"
    return "benign"


def hostile(orig: int, width: int, signed: bool = False) -> list[int]:
    """Values to put in an integer field of `width` bytes that held orig."""
    top = (1 << (8 * width)) - 1
    vals = {0, 1, top, orig ^ 1, (orig + 1) & top, (orig - 1) & top, 1 << (8 * width - 1), orig ^ (1 << (8 * width - 2))}
    vals.discard(orig)
    return sorted(vals)


def put(buf: bytearray, off: int, width: int, v: int) -> None:
    buf[off:off + width] = v.to_bytes(width, "little")


def truncation_points(n: int, marks=()) -> list[int]:
    pts = set(range(0, min(n, 64))) | set(range(0, n, max(1, n // 97))) | {n - 1, n - 2, n - 8}
    for m in marks:
        pts |= {m - 1, m, m + 1}
    return sorted(p for p in pts if 0 <= p < n)


# ------------------------------------------------------------------ native

NATIVE_FIELDS = [  # (name, offset, width) per docs/format.md
    ("magic", 0, 8), ("version", 8, 4), ("header_size", 12, 4), ("flags", 16, 4), ("dtype", 20, 4),
    ("vocab_size", 24, 8), ("num_tokens", 32, 8), ("num_docs", 40, 8), ("tokens_offset", 48, 8),
    ("tokens_bytes", 56, 8), ("docs_offset", 64, 8), ("docs_bytes", 72, 8), ("blocks_offset", 80, 8),
    ("blocks_bytes", 88, 8), ("block_tokens", 96, 8), ("tokens_checksum", 104, 8),
    ("docs_checksum", 112, 8), ("blocks_checksum", 120, 8), ("file_size", 128, 8),
    ("reserved", 136, 8), ("reserved_end", 240, 8), ("header_checksum", 248, 8),
]


@pytest.fixture(scope="module", params=["plain", "zstd"])
def native_shard(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("native")
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, 5000, size=int(n)) for n in rng.integers(0, 300, size=40)]
    kw = dict(compression="zstd", block_tokens=256) if request.param == "zstd" else {}
    with tokenfeed.DatasetWriter(d / "ds", vocab_size=5000, **kw) as w:
        for doc in docs:
            w.add_document(doc)
    shard = [f for f in os.listdir(d / "ds") if f.endswith(".tfs")]
    assert len(shard) == 1
    data = (d / "ds" / shard[0]).read_bytes()
    if request.param == "zstd" and not tokenfeed.build_info()["zstd"]["usable"]:
        pytest.skip("zstd not built")
    return d, data, np.concatenate(docs)


def tokens_compressed(data: bytes) -> bool:
    return bool(struct.unpack_from("<I", data, 16)[0] & 1)


def fix_header(buf: bytearray) -> None:
    put(buf, 248, 8, xxhash.xxh64_intdigest(bytes(buf[:248]), seed=0))


@pytest.mark.parametrize("fix_checksum", [False, True], ids=["as-is", "checksum-fixed"])
@pytest.mark.parametrize("field,off,width", NATIVE_FIELDS, ids=[f[0] for f in NATIVE_FIELDS])
def test_native_header_field(native_shard, tmp_path, field, off, width, fix_checksum):
    _, data, tokens = native_shard
    orig = int.from_bytes(data[off:off + width], "little")
    seen = set()
    for i, v in enumerate(hostile(orig, width)):
        buf = bytearray(data)
        put(buf, off, width, v)
        if fix_checksum and field != "header_checksum":
            fix_header(buf)
        p = tmp_path / f"{field}-{i}.tfs"
        p.write_bytes(bytes(buf))
        r = outcome(p, p.name, tokens)
        seen.add(r)
        if not fix_checksum and field != "header_checksum":
            assert r == "open", f"{field}={v:#x}: the header checksum should have refused it"
    must_refuse = {"magic", "version", "header_size", "num_tokens", "num_docs", "tokens_offset", "docs_offset",
                   "docs_bytes", "file_size", "reserved", "reserved_end", "header_checksum"}
    if not tokens_compressed(data):
        must_refuse.add("tokens_bytes")  # compressed: the section size is only bounded by the blocks
    if field in must_refuse:
        assert seen == {"open"}, f"{field}: every hostile value must be refused at open, got {seen}"


def test_native_header_checksum_covers_every_byte(native_shard, tmp_path):
    _, data, tokens = native_shard
    for k in range(0, 256):
        buf = bytearray(data)
        buf[k] ^= 0x40
        p = tmp_path / f"bit{k}.tfs"
        p.write_bytes(bytes(buf))
        assert outcome(p, p.name, tokens) == "open"


def test_native_payload_bytes(native_shard, tmp_path):
    """Flip bytes in the token section, document index and block table: an O(1)
    open may accept them, verify() must not."""
    _, data, tokens = native_shard
    tok_off, tok_bytes = struct.unpack_from("<QQ", data, 48)
    docs_off, docs_bytes = struct.unpack_from("<QQ", data, 64)
    blk_off, blk_bytes = struct.unpack_from("<QQ", data, 80)
    spots = [tok_off, tok_off + tok_bytes // 2, tok_off + tok_bytes - 1, docs_off, docs_off + docs_bytes - 1,
             docs_off + docs_bytes // 2]
    if blk_bytes:
        spots += [blk_off, blk_off + 8, blk_off + blk_bytes - 1, blk_off + blk_bytes // 2]
    for k in spots:
        for mask in (0x01, 0x80):
            buf = bytearray(data)
            buf[k] ^= mask
            p = tmp_path / f"payload{k}-{mask}.tfs"
            p.write_bytes(bytes(buf))
            assert outcome(p, p.name, tokens) in ("open", "verify")


def test_native_truncated(native_shard, tmp_path):
    _, data, tokens = native_shard
    tok_off, tok_bytes = struct.unpack_from("<QQ", data, 48)
    docs_off = struct.unpack_from("<Q", data, 64)[0]
    for n in truncation_points(len(data), [256, tok_off, tok_off + tok_bytes, docs_off]):
        p = tmp_path / f"trunc{n}.tfs"
        p.write_bytes(data[:n])
        assert outcome(p, p.name, tokens) == "open", f"truncated at {n}"
    # appended bytes are refused too (file_size)
    p = tmp_path / "appended.tfs"
    p.write_bytes(data + b"\0")
    assert outcome(p, p.name, tokens) == "open"


def test_native_manifest_corruption(native_shard, tmp_path):
    d, _, tokens = native_shard
    man = (d / "ds" / "tokenfeed.manifest").read_bytes()
    shard = [f for f in os.listdir(d / "ds") if f.endswith(".tfs")][0]
    lines = man.split(b"\n")
    variants = {"truncated-" + str(n): man[:n] for n in truncation_points(len(man))}
    for i, line in enumerate(lines[:-1]):
        for j, repl in enumerate([b"", line + b" extra", line.replace(b" ", b"  "), line[:-1] + b"Z",
                                  line.replace(b"1", b"2"), b"x" * 300]):
            if repl != line:
                variants[f"line{i}-{j}"] = b"\n".join(lines[:i] + [repl] + lines[i + 1:])
    for k, body in variants.items():
        dd = tmp_path / k
        dd.mkdir()
        (dd / shard).symlink_to(d / "ds" / shard)
        (dd / "tokenfeed.manifest").write_bytes(body)
        r = outcome(dd, "tokenfeed.manifest", tokens)
        assert r == "open", f"manifest variant {k} was accepted"


# ---------------------------------------------------------------- Megatron

MEGATRON_FIELDS = [("magic", 0, 9), ("version", 9, 8), ("dtype_code", 17, 1), ("sequence_count", 18, 8),
                   ("document_count", 26, 8)]


def megatron_files(tokens_per_doc, dtype=np.uint16, code=8):
    isz = np.dtype(dtype).itemsize
    sizes = np.array([len(t) for t in tokens_per_doc], dtype=np.int32)
    ptrs = np.zeros(len(sizes), dtype=np.int64)
    ptrs[1:] = np.cumsum(sizes[:-1].astype(np.int64) * isz)
    doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(sizes), len(doc_idx)) + sizes.tobytes()
           + ptrs.tobytes() + doc_idx.tobytes())
    body = b"".join(np.asarray(t, dtype=dtype).tobytes() for t in tokens_per_doc)
    return idx, body


@pytest.fixture(scope="module")
def megatron():
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 30000, size=int(n)) for n in rng.integers(1, 200, size=30)]
    idx, body = megatron_files(docs)
    return idx, body, np.concatenate(docs)


def write_pair(tmp_path, name, idx, body):
    (tmp_path / f"{name}.idx").write_bytes(idx)
    (tmp_path / f"{name}.bin").write_bytes(body)
    return tmp_path / name


@pytest.mark.parametrize("field,off,width", MEGATRON_FIELDS, ids=[f[0] for f in MEGATRON_FIELDS])
def test_megatron_header_field(megatron, tmp_path, field, off, width):
    idx, body, tokens = megatron
    orig = int.from_bytes(idx[off:off + width], "little")
    for i, v in enumerate(sorted(set(hostile(orig, width)) | ({1, 2, 3, 4, 5, 6, 7, 9} if field == "dtype_code" else set()))):
        buf = bytearray(idx)
        put(buf, off, width, v)
        prefix = write_pair(tmp_path, f"{field}{i}", bytes(buf), body)
        r = outcome(prefix, prefix.name, tokens, format="megatron")
        if field == "dtype_code" and v == 3:  # int16: same item size, same values for ids < 2**15
            continue
        assert r == "open", f"{field}={v:#x} accepted ({r})"


def test_megatron_index_entries(megatron, tmp_path):
    """Sequence sizes and pointers are read lazily: a bad entry may pass open but
    must be refused by a document read or verify(), never crash. (A smaller but
    non-negative size is a plausible index with a gap: only "no crash" holds.)"""
    idx, body, tokens = megatron
    n = 30
    sizes = [34, 34 + 4 * (n // 2), 34 + 4 * n - 4]
    ptrs = [34 + 4 * n, 34 + 4 * n + 8 * (n // 2), 34 + 12 * n - 8]
    cases = [(off, 4, v, True) for off in sizes for v in (-1, 2**31 - 1, -2**31)]
    cases += [(off, 8, v, True) for off in ptrs for v in (-1, 1 << 40, 3, -2**63)]
    cases += [(off, 4, v, False) for off in sizes for v in (0, 3)]
    for k, (off, w, v, must_refuse) in enumerate(cases):
        buf = bytearray(idx)
        put(buf, off, w, v & ((1 << (8 * w)) - 1))
        prefix = write_pair(tmp_path, f"entry{k}", bytes(buf), body)
        try:
            ds = tokenfeed.open(prefix, format="megatron")
        except tokenfeed.FormatError as e:
            assert prefix.name in str(e)
            continue
        for i in range(len(ds)):
            try:
                ds[i]
            except tokenfeed.FormatError as e:
                assert prefix.name in str(e)
        if must_refuse:
            with pytest.raises(tokenfeed.FormatError, match=prefix.name):
                ds.verify(threads=1, progress=False)
        else:
            try:
                ds.verify(threads=1, progress=False)
            except tokenfeed.FormatError as e:
                assert prefix.name in str(e)


def test_megatron_truncated(megatron, tmp_path):
    idx, body, tokens = megatron
    for n in truncation_points(len(idx), [9, 17, 18, 26, 34]):
        prefix = write_pair(tmp_path, f"idx{n}", idx[:n], body)
        assert outcome(prefix, prefix.name, tokens, format="megatron") == "open", f".idx truncated at {n}"
    for n in truncation_points(len(body)):
        prefix = write_pair(tmp_path, f"bin{n}", idx, body[:n])
        assert outcome(prefix, prefix.name, tokens, format="megatron") == "open", f".bin truncated at {n}"


# ------------------------------------------------------------------- llm.c

def llmc_bytes(tokens, new=False):
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = (20240801, 7, len(tokens)) if new else (20240520, 1, len(tokens))
    return hdr.tobytes() + np.asarray(tokens, dtype=np.uint32 if new else np.uint16).tobytes()


@pytest.mark.parametrize("new", [False, True], ids=["gpt2", "llama3"])
@pytest.mark.parametrize("field,off", [("magic", 0), ("version", 4), ("num_tokens", 8)])
def test_llmc_header_field(tmp_path, new, field, off):
    tokens = np.random.default_rng(5).integers(0, 50000, size=777)
    data = llmc_bytes(tokens, new)
    orig = int.from_bytes(data[off:off + 4], "little")
    vals = hostile(orig, 4) + [20240520, 20240801, 20240522, 1, 7]
    for i, v in enumerate(sorted(set(vals) - {orig})):
        buf = bytearray(data)
        put(buf, off, 4, v)
        p = tmp_path / f"{field}{i}.bin"
        p.write_bytes(bytes(buf))
        for kw in ({}, {"format": "llm.c"}):
            assert outcome(p, p.name, tokens, **kw) == "open", f"{field}={v} accepted"


@pytest.mark.parametrize("new", [False, True], ids=["gpt2", "llama3"])
def test_llmc_truncated(tmp_path, new):
    tokens = np.random.default_rng(5).integers(0, 50000, size=500)
    data = llmc_bytes(tokens, new)
    for n in truncation_points(len(data), [4, 8, 12, 1024]):
        p = tmp_path / f"t{n}.bin"
        p.write_bytes(data[:n])
        assert outcome(p, p.name, tokens, format="llm.c") == "open", f"truncated at {n}"
        if n >= 12:  # with detection (shorter files have no magic to detect)
            assert outcome(p, p.name, tokens) == "open", f"truncated at {n}"


# -------------------------------------------------------------------- .npy

def npy_bytes(arr, version=None):
    import io

    b = io.BytesIO()
    if version is None:
        np.save(b, arr)
    else:
        np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()


@pytest.mark.parametrize("version", [(1, 0), (2, 0)], ids=["v1", "v2"])
def test_npy_header_fields(tmp_path, version):
    tokens = np.random.default_rng(9).integers(0, 30000, size=321).astype(np.uint16)
    data = npy_bytes(tokens, version)
    hl_w = 2 if version == (1, 0) else 4
    start = 8 + hl_w
    hl = int.from_bytes(data[8:start], "little")
    header = data[start:start + hl]
    cases = {}
    for i in range(6):
        b = bytearray(data)
        b[i] ^= 0x20
        cases[f"magic{i}"] = bytes(b)
    for mj, mn in [(0, 0), (4, 0), (1, 1), (255, 255), (3 - version[0], 0)]:
        cases[f"version{mj}.{mn}"] = data[:6] + bytes([mj, mn]) + data[8:]
    for v in hostile(hl, hl_w):
        cases[f"header_len{v}"] = data[:8] + v.to_bytes(hl_w, "little") + data[start:]
    n = len(tokens)
    repl = {
        "descr_f4": (b"'<u2'", b"'<f4'"), "descr_be": (b"'<u2'", b"'>u2'"), "descr_u8": (b"'<u2'", b"'<u8'"),
        "descr_u4": (b"'<u2'", b"'<u4'"), "descr_struct": (b"'<u2'", b"[('a','<u2')]"),
        "descr_obj": (b"'<u2'", b"'|O '"), "descr_empty": (b"'<u2'", b"''"), "descr_unterminated": (b"'<u2'", b"'<u2 "),
        "shape_more": (f"({n},)".encode(), f"({n + 1},)".encode()),
        "shape_less": (f"({n},)".encode(), f"({n - 1},)".encode()),
        "shape_2d": (f"({n},)".encode(), f"({n}, 1)".encode()),
        "shape_0d": (f"({n},)".encode(), b"()"), "shape_huge": (f"({n},)".encode(), b"(99999999999999999999999,)"),
        "shape_neg": (f"({n},)".encode(), f"(-{n},)".encode()),
        "fortran_garbage": (b"False", b"Maybe"), "brace": (b"{", b"["), "key_dup": (b"'shape'", b"'descr'"),
        "key_extra": (b"'shape'", b"'shapes'"),
    }
    for k, (a, b) in repl.items():
        assert a in header, (k, header)
        h = header.replace(a, b, 1)
        # keep the total length so only the field changes (pad/trim spaces before the newline)
        h = (h.rstrip(b"\n").rstrip(b" ") + b" " * max(0, hl - len(h.rstrip(b"\n").rstrip(b" ")) - 1) + b"\n")
        cases[k] = data[:8] + len(h).to_bytes(hl_w, "little") + h + data[start + hl:]
    for k, body in cases.items():
        p = tmp_path / f"{k}.npy"
        p.write_bytes(body)
        r = outcome(p, p.name, tokens)
        assert r == "open", f"{k} accepted ({r})"
    # accepted variants that do not change the data
    for k, (a, b) in {"fortran_true": (b"False", b"True "), "descr_i2": (b"'<u2'", b"'<i2'")}.items():
        p = tmp_path / f"{k}.npy"
        p.write_bytes(data[:start] + header.replace(a, b) + data[start + hl:])
        assert outcome(p, p.name, tokens) in ("open", "benign")


def test_npy_truncated(tmp_path):
    tokens = np.arange(200, dtype=np.uint32)
    data = npy_bytes(tokens)
    for n in truncation_points(len(data), [6, 8, 10, 128]):
        p = tmp_path / f"t{n}.npy"
        p.write_bytes(data[:n])
        assert outcome(p, p.name, tokens, format="npy") == "open", f"truncated at {n}"


# ------------------------------------------------------- datatrove (raw + .index)

def test_datatrove_index_corruption(tmp_path):
    rng = np.random.default_rng(2)
    ends = np.cumsum(rng.integers(1, 50, size=20)).astype(np.uint64)
    tokens = rng.integers(0, 60000, size=int(ends[-1])).astype(np.uint16)
    cases = {"last_plus": ends.copy(), "last_minus": ends.copy(), "backwards": ends.copy(), "huge": ends.copy()}
    cases["last_plus"][-1] += 1
    cases["last_minus"][-1] -= 1
    cases["backwards"][5] = ends[10]
    cases["huge"][3] = 2**63
    for k, e in cases.items():
        p = tmp_path / f"{k}.ds"
        tokens.tofile(p)
        e.tofile(str(p) + ".index")
        assert outcome(p, p.name, tokens, dtype="uint16") in ("open", "verify"), k
    for n in (1, 7, 9, len(ends) * 8 - 1):
        p = tmp_path / f"short{n}.ds"
        tokens.tofile(p)
        with open(str(p) + ".index", "wb") as f:
            f.write(ends.tobytes()[:n])
        assert outcome(p, p.name, tokens, dtype="uint16") == "open"

"""Headerless token files split at an end-of-document id (open(..., eos_id=N)): concat rows
find their documents in their own tokens, the document index (tokenfeed index) gives them to
best-fit and document packing, and a stale index is refused."""
import gzip
import os

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core
from tokenfeed.cli import main as cli_main

EOS = 0
PAD = 4095
L = 32


def write_docs(path, docs, dtype=np.uint16, eos=EOS):
    """Documents (ids >= 1), each followed by eos, as a headerless token file."""
    np.concatenate([np.append(np.asarray(d), eos) for d in docs]).astype(dtype).tofile(path)


def make_docs(n, seed, lo=2, hi=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, size=int(k)) for k in rng.integers(lo, hi, size=n)]


def expected_extras(stream, i):
    """Concat extras of row i computed from the document boundaries of the whole stream."""
    row = stream[i * L:i * L + L + 1]
    starts = [b for b in range(1, L + 1) if row[b - 1] == EOS]
    pos = np.zeros(L, np.int32)
    last = 0
    for t in range(L):
        if t in starts:
            last = t
        pos[t] = t - last
    cu = [0] + [b for b in starts if b < L] + [L]
    cu += [L] * (L + 1 - len(cu))
    mask = np.array([0 if (t + 1) in starts else 1 for t in range(L)], np.uint8)
    return pos, np.array(cu, np.int32), mask


def rows(ds, packing="concat", **kw):
    ld = tokenfeed.Loader(ds, seq_len=L, batch_size=1, shuffle=False, epochs=1, packing=packing, **kw,
                          position_ids=True, cu_seqlens=True, loss_mask=True, device="cpu")
    return [{k: np.asarray(v)[0] for k, v in b.items()} for b in ld]


@pytest.mark.parametrize("indexed", [False, True])
def test_concat_rows_see_every_document(tmp_path, indexed):
    paths = []
    for f in range(3):  # documents continue across files: the stream is one
        p = tmp_path / f"part-{f}.bin"
        write_docs(p, make_docs(40, f))
        paths.append(str(p))
    if indexed:
        for p in paths:
            tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    ds = tokenfeed.open(paths, dtype="uint16", eos_id=EOS)
    stream = np.concatenate([np.fromfile(p, np.uint16) for p in paths])
    got = rows(ds)
    assert len(got) == (len(stream) - 1) // L
    for i, b in enumerate(got):
        pos, cu, mask = expected_extras(stream, i)
        assert np.array_equal(b["position_ids"], pos), i
        assert np.array_equal(b["cu_seqlens"], cu), i
        assert np.array_equal(b["loss_mask"], mask), i
    nseg = sum(int(b["num_seqs"][0]) for b in got)
    assert nseg >= 120  # a document per eos, not one per file


def test_index_gives_documents_and_keeps_the_fingerprint(tmp_path):
    p = str(tmp_path / "a.bin")
    docs = make_docs(100, 1)
    write_docs(p, docs)
    before = tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    with pytest.raises(ValueError, match="tokenfeed index"):  # not known without the index (never "1")
        before.num_documents
    other_eos = tokenfeed.open(p, dtype="uint16", eos_id=7).fingerprint
    assert tokenfeed.build_index(p, dtype="uint16", eos_id=EOS) == p + ".tfdocs"
    ds = tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    assert ds.num_documents == len(docs)
    for j, d in enumerate(docs):
        assert np.array_equal(ds[j], np.append(d, EOS))
    # the index leaves the fingerprint alone (a run may build it midway); the eos id does not
    assert ds.fingerprint == before.fingerprint
    assert other_eos != ds.fingerprint
    assert tokenfeed.open(p, dtype="uint16").fingerprint != ds.fingerprint


@pytest.mark.parametrize("form", ["file", "list", "glob", "directory"])
def test_documents_without_the_index_are_never_counted_per_file(tmp_path, form):
    """Without its document index, a file split at an eos id has no document count: the count,
    document(), find_document() and len() raise naming `tokenfeed index` (never one document
    per file, nor the whole file as document 0), while a concat loader still finds each row's
    documents in its tokens; once the index is built they give every document."""
    d = tmp_path / "d"
    d.mkdir()
    docs = [make_docs(30, 10 + f) for f in range(3)]
    paths = []
    for f in range(3):
        p = d / f"part-{f}.bin"
        write_docs(p, docs[f])
        paths.append(str(p))
    spec = {"file": paths[0], "list": paths, "glob": str(d / "part-*.bin"), "directory": str(d)}[form]
    want = docs[0] if form == "file" else [x for f in docs for x in f]
    ds = tokenfeed.open(spec, dtype="uint16", eos_id=EOS)
    cmd = r"tokenfeed index .*part-0\.bin --dtype uint16 --eos-id 0"
    for get in (lambda: ds.num_documents, lambda: len(ds), lambda: ds.document(0), lambda: ds[0],
                lambda: ds.find_document(5)):
        with pytest.raises(ValueError, match=cmd):
            get()
    assert ds and "no document index" in repr(ds)
    got = rows(ds)  # concat rows: their documents from their own tokens
    assert sum(int(b["num_seqs"][0]) for b in got) >= len(want)
    for p in paths:
        tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    ds = tokenfeed.open(spec, dtype="uint16", eos_id=EOS)
    assert ds.num_documents == len(ds) == len(want)
    for j in (0, 7, len(want) - 1):
        assert np.array_equal(ds.document(j), np.append(want[j], EOS))
    assert ds.find_document(len(want[0])) == 0 and ds.find_document(len(want[0]) + 1) == 1


@pytest.mark.parametrize("packing", ["best_fit", "document"])
def test_document_packing_needs_and_uses_the_index(tmp_path, packing):
    p = str(tmp_path / "a.bin")
    docs = make_docs(150, 2, hi=L)  # each fits a row with its eos
    write_docs(p, docs)
    with pytest.raises(ValueError, match="tokenfeed index .*--eos-id 0"):
        tokenfeed.Loader(tokenfeed.open(p, dtype="uint16", eos_id=EOS), seq_len=L, batch_size=1, packing=packing)
    assert cli_main(["index", p, "--dtype", "uint16", "--eos-id", str(EOS), "-q"]) == 0
    ds = tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    got = []
    for b in rows(ds, packing, pad_id=PAD):
        toks = b["tokens"][b["tokens"] != PAD].tolist()
        while toks:  # the row's documents, each closed by its eos
            k = toks.index(EOS) + 1
            got.append(tuple(toks[:k]))
            toks = toks[k:]
    want = [tuple(np.append(d, EOS).tolist()) for d in docs]
    assert sorted(got) == sorted(want)  # every document, whole, once


def test_changed_file_is_refused(tmp_path):
    p = str(tmp_path / "a.bin")
    write_docs(p, make_docs(20, 3))
    tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    with open(p, "ab") as f:
        f.write(np.array([5, EOS], np.uint16).tobytes())
    with pytest.raises(tokenfeed.FormatError, match="stale.*tokenfeed index"):
        tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    # same size, other content and time: refused too
    tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.write(np.array([9], np.uint16).tobytes())
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(tokenfeed.FormatError, match="stale"):
        tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)  # rebuilding makes it usable again
    assert tokenfeed.open(p, dtype="uint16", eos_id=EOS).num_documents == 21
    with pytest.raises(tokenfeed.FormatError, match="eos id 0, opened with dtype uint16 and eos id 5"):
        tokenfeed.open(p, dtype="uint16", eos_id=5)


def test_damaged_or_symlinked_index_is_refused(tmp_path):
    p = str(tmp_path / "a.bin")
    write_docs(p, make_docs(20, 4))
    ip = tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    raw = bytearray(open(ip, "rb").read())
    raw[-3] ^= 1
    open(ip, "wb").write(raw)
    with pytest.raises(tokenfeed.FormatError, match="checksum"):
        tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    good = tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    os.rename(good, str(tmp_path / "elsewhere"))
    os.symlink(str(tmp_path / "elsewhere"), good)
    with pytest.raises(OSError, match="symlink"):
        tokenfeed.open(p, dtype="uint16", eos_id=EOS)
    # building replaces the link itself, never writing through it
    tokenfeed.build_index(p, dtype="uint16", eos_id=EOS)
    assert not os.path.islink(good)


def test_olmo_metadata_gives_the_documents(tmp_path):
    """OLMo's tokenizer writes x.csv.gz ("start,end" per document) beside x.npy: the index
    follows it rather than the eos scan."""
    p = tmp_path / "part-0-00000.npy"
    docs = make_docs(30, 5)
    write_docs(p, docs, dtype=np.uint32)
    spans, s = [], 0
    for d in docs[:10]:
        spans.append((s, s + len(d) + 1))
        s += len(d) + 1
    spans.append((s, sum(len(d) + 1 for d in docs)))  # the metadata joins the last 20 documents
    with gzip.open(tmp_path / "part-0-00000.csv.gz", "wt") as f:
        f.writelines(f"{a},{b},doc{k},src,1\n" for k, (a, b) in enumerate(spans))
    tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    ds = tokenfeed.open(str(p), dtype="uint32", eos_id=EOS)
    assert ds.num_documents == 11
    assert [ds._core.document(j)[1] for j in range(11)] == [b - a for a, b in spans]


def test_eos_id_checked():
    with pytest.raises(ValueError, match="eos_id"):
        tokenfeed.open("x.bin", dtype="uint16", eos_id=-1)
    assert "build_index" in tokenfeed.__all__
    assert callable(_core.build_doc_index)


# ---- OLMo's document metadata, read by the C library -------------------------------------------

def _olmo_reference_ends(meta, num_tokens):
    """What OLMo-core's iter_document_indices gives, as cumulative ends: the end column of each
    row of the gzip'd CSV, and a last document for the tokens after the last row."""
    import csv
    import io

    with gzip.open(meta, "rb") as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
        ends = [int(r[1]) for r in csv.reader(text)]
    if ends and ends[-1] < num_tokens:
        ends.append(num_tokens)
    return ends


def _index_ends(ix_path):
    """The document ends an index file holds (version 1: 64-byte header; 2: 96)."""
    b = open(ix_path, "rb").read()
    hs = 96 if int.from_bytes(b[8:12], "little") == 2 else 64
    return np.frombuffer(b[hs:], dtype="<u8").tolist()


def _olmo_file(tmp_path, num_tokens, name="part-0-00000"):
    p = tmp_path / f"{name}.npy"
    np.arange(1, num_tokens + 1, dtype=np.uint32).tofile(p)  # (no eos: the documents come from the metadata)
    return p, tmp_path / f"{name}.csv.gz"


def test_olmo_metadata_read_in_c_matches_the_reference(tmp_path):
    """Rows with extra fields, quoted fields holding commas, quotes and newlines, CRLF line ends,
    a file of several gzip members, gaps between documents and tokens after the last row: the
    index the C library builds holds the ends OLMo-core's reading of the CSV gives."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    extra = st.one_of(st.text(alphabet="abc/-_.0123456789 ", max_size=12),
                      st.text(alphabet='ab,"\n\r ', max_size=8).map(lambda s: '"' + s.replace('"', '""') + '"'))

    case = iter(range(1 << 30))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 50), st.lists(extra, max_size=3)), min_size=1,
                    max_size=40),
           st.integers(0, 20), st.booleans(), st.booleans(), st.integers(1, 4))
    def check(docs, tail, crlf, final_newline, members):
        d = tmp_path / f"case{next(case)}"
        d.mkdir()
        lines, s = [], 0
        for gap, n, rest in docs:
            a = s + gap
            lines.append(",".join([str(a), str(a + n)] + rest))
            s = a + n
        num_tokens = s + tail
        p, meta = _olmo_file(d, num_tokens)
        nl = "\r\n" if crlf else "\n"
        text = nl.join(lines) + (nl if final_newline else "")
        raw = text.encode()
        cuts = sorted({len(raw) * k // members for k in range(members + 1)})
        meta.write_bytes(b"".join(gzip.compress(raw[a:b]) for a, b in zip(cuts, cuts[1:])))
        ix = tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
        assert _index_ends(ix) == _olmo_reference_ends(meta, num_tokens)
        ds = tokenfeed.open(str(p), dtype="uint32", eos_id=EOS)
        assert ds.num_documents == len(_olmo_reference_ends(meta, num_tokens))

    check()


def test_olmo_metadata_several_gzip_members(tmp_path):
    """gzip allows a file of several members (what `cat a.gz b.gz` makes): every member is read."""
    p, meta = _olmo_file(tmp_path, 100)
    meta.write_bytes(gzip.compress(b"0,10,a\n10,40,b\n") + gzip.compress(b"40,70,c\n") + gzip.compress(b""))
    ix = tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    assert _index_ends(ix) == [10, 40, 70, 100]


def _bomb():
    return gzip.compress(b"0,1," + b"x" * 60000 + b"\n" + (b"1,2," + b"y" * 60000 + b"\n") * 40)


@pytest.mark.parametrize("name,raw,match", [
    ("empty file", b"", r"empty \(0 bytes\)"),
    ("plain text", b"0,10\n", r"not a valid gzip"),
    ("no rows", gzip.compress(b""), r"no document rows"),
    ("header", gzip.compress(b"start,end,id\n0,10,a\n"), r"line 1, field start: 's' .*no header line"),
    ("negative", gzip.compress(b"-1,10\n"), r"line 1, field start: negative"),
    ("not a number", gzip.compress(b"0,10\n10,2x0\n"), r"line 2, field end: 'x' where a digit"),
    ("overflow", gzip.compress(b"0,10\n10,99999999999999999999\n"), r"line 2, field end: the number overflows"),
    ("start past end", gzip.compress(b"0,10\n30,20\n"), r"line 2, field start: start 30 is past end 20"),
    ("overlap", gzip.compress(b"0,10\n5,20\n"), r"line 2, field start: start 5 overlaps the previous document"),
    ("empty document", gzip.compress(b"0,10\n10,10\n"), r"line 2, field end: a document of no tokens"),
    ("past the tokens", gzip.compress(b"0,10\n10,101\n"), r"line 2, field end: end 101 is past the 100 tokens"),
    ("one field", gzip.compress(b"0,10\n10\n"), r"line 2, field end: missing"),
    ("empty end", gzip.compress(b"0,10\n10,\n"), r"line 2, field end: empty"),
    ("blank line", gzip.compress(b"0,10\n\n10,20\n"), r"line 2, field start: a blank line"),
    ("lone CR", gzip.compress(b"0,10\r10,20\n"), r"line 1, field end: a carriage return not followed"),
    ("open quote", gzip.compress(b'0,10,"abc\n'), r"ends inside a quoted field"),
    ("long row", gzip.compress(b"0,10," + b"z" * 70000 + b"\n"), r"line 1.*longer than 65536 bytes"),
    ("truncated", gzip.compress(b"".join(b"%d,%d\n" % (k, k + 1) for k in range(99)))[:-12], r"truncated"),
    ("corrupt", (lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:])(gzip.compress(b"0,10\n10,20\n30,40\n" * 9)),
     r"not a valid gzip"),
    ("bad crc", (lambda b: b[:-8] + bytes([b[-8] ^ 1]) + b[-7:])(gzip.compress(b"0,10\n10,20\n")), r"not a valid gzip"),
    ("garbage after a member", gzip.compress(b"0,10\n") + b"\x00" * 8, r"not a valid gzip .*member 2"),
    ("bomb", _bomb(), r"decompresses to more than"),
])
def test_olmo_metadata_hostile_refused(tmp_path, name, raw, match):
    """Bytes from disk are checked: every damaged or hostile metadata file is refused with a
    message naming the file (and the line and field), and no index is written."""
    p, meta = _olmo_file(tmp_path, 100)
    meta.write_bytes(raw)
    with pytest.raises(tokenfeed.FormatError, match=match) as ei:
        tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    assert str(meta) in str(ei.value)
    assert not os.path.exists(str(p) + ".tfdocs")


def test_olmo_metadata_planted_symlink_and_fifo(tmp_path):
    """The metadata is never read through a symlink, and a FIFO planted under its name does not
    hold the build."""
    p, meta = _olmo_file(tmp_path, 100)
    real = tmp_path / "elsewhere.gz"
    real.write_bytes(gzip.compress(b"0,10\n"))
    os.symlink(real, meta)
    with pytest.raises(OSError, match="symlink"):
        tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    os.unlink(meta)
    os.mkfifo(meta)
    with pytest.raises(ValueError, match="not a regular file"):
        tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    assert not os.path.exists(str(p) + ".tfdocs")


def test_olmo_index_refused_when_the_metadata_changes(tmp_path):
    """An index built from the metadata records it: rewritten, replaced or removed, the index is
    refused with the rebuild command (the documents would be another file's), and rebuilding
    follows the new metadata."""
    p, meta = _olmo_file(tmp_path, 100)
    meta.write_bytes(gzip.compress(b"0,10\n10,50\n"))
    ix = tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    assert _index_ends(ix) == [10, 50, 100]
    assert tokenfeed.open(str(p), dtype="uint32", eos_id=EOS).num_documents == 3
    st = os.stat(meta)
    meta.write_bytes(gzip.compress(b"0,20\n20,50\n"))  # rewritten in place
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(tokenfeed.FormatError, match=r"metadata .*changed since the index was built.*tokenfeed index"):
        tokenfeed.open(str(p), dtype="uint32", eos_id=EOS).num_documents
    tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    assert _index_ends(ix) == [20, 50, 100]
    new = tmp_path / "new.gz"
    new.write_bytes(gzip.compress(b"0,20\n20,60\n"))
    os.utime(new, ns=(os.stat(meta).st_atime_ns, os.stat(meta).st_mtime_ns))  # same time, another inode
    os.rename(new, meta)
    with pytest.raises(tokenfeed.FormatError, match=r"changed since the index was built"):
        tokenfeed.open(str(p), dtype="uint32", eos_id=EOS).num_documents
    os.unlink(meta)
    with pytest.raises(tokenfeed.FormatError, match=r"which is gone"):
        tokenfeed.open(str(p), dtype="uint32", eos_id=EOS).num_documents
    tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)  # now by the eos scan: no eos, one document
    assert _index_ends(ix) == [100]
    assert tokenfeed.open(str(p), dtype="uint32", eos_id=EOS).num_documents == 1


@pytest.mark.parametrize("value,match", [
    ("/nonexistent/libz.so.1", r"TOKENFEED_ZLIB=/nonexistent/libz.so.1 could not be loaded"),
    ("libm.so.6", r"libm.so.6 is not zlib"),
])
def test_olmo_metadata_without_zlib_says_what_to_do(tmp_path, value, match):
    """zlib is loaded at run time; when it cannot be, building the index of OLMo data with its
    metadata fails with the reason and what to do (install zlib, set TOKENFEED_ZLIB, or delete
    the metadata), never falls back to other documents silently."""
    import subprocess
    import sys

    p, meta = _olmo_file(tmp_path, 100)
    meta.write_bytes(gzip.compress(b"0,10\n"))
    code = ("import tokenfeed, sys\n"
            "try:\n"
            f"    tokenfeed.build_index({str(p)!r}, dtype='uint32', eos_id=0)\n"
            "except OSError as e:\n"
            "    print(e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TOKENFEED_ZLIB=value),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    import re
    assert re.search(match, r.stdout), r.stdout
    assert "needs zlib at run time" in r.stdout and "delete" in r.stdout
    assert not os.path.exists(str(p) + ".tfdocs")


def test_index_command_reads_olmo_metadata(tmp_path, capsys):
    """`tokenfeed index` over OLMo data: the documents of each file's metadata; a damaged metadata
    file stops the command with the message naming it, the line and the field."""
    p, meta = _olmo_file(tmp_path, 100)
    meta.write_bytes(gzip.compress(b"0,30,a\n30,64,b\n"))
    q, qmeta = _olmo_file(tmp_path, 50, name="part-0-00001")
    qmeta.write_bytes(gzip.compress(b"0,20\n15,50\n"))
    assert cli_main(["index", str(p), "--dtype", "uint32", "--eos-id", str(EOS), "-q"]) == 0
    assert _index_ends(str(p) + ".tfdocs") == [30, 64, 100]
    assert cli_main(["index", str(q), "--dtype", "uint32", "--eos-id", str(EOS), "-q"]) != 0
    err = capsys.readouterr().err
    assert str(qmeta) in err and "line 2, field start: start 15 overlaps" in err
    assert not os.path.exists(str(q) + ".tfdocs")


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:60] + bytes([b[60] ^ 1]) + b[61:], r"header checksum"),  # the recorded metadata size
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), r"document ends checksum"),
    (lambda b: b[:-8], r"size: does not match"),
    (lambda b: b[:8] + (3).to_bytes(4, "little") + b[12:], r"header checksum|version"),
])
def test_olmo_index_damaged_refused(tmp_path, damage, match):
    """A version-2 index (built from the metadata) damaged on disk is refused like any other."""
    p, meta = _olmo_file(tmp_path, 100)
    meta.write_bytes(gzip.compress(b"0,10\n10,50\n"))
    ix = tokenfeed.build_index(p, dtype="uint32", eos_id=EOS)
    b = open(ix, "rb").read()
    assert int.from_bytes(b[8:12], "little") == 2 and len(b) == 96 + 3 * 8
    with open(ix, "wb") as f:
        f.write(damage(b))
    with pytest.raises(tokenfeed.FormatError, match=match):
        tokenfeed.open(str(p), dtype="uint32", eos_id=EOS).num_documents

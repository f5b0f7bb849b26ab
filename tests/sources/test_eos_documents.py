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

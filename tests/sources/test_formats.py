"""Sources layer: native round trips (Hypothesis), foreign formats written by
independent writers following each published layout (and by Megatron's own
builder when megatron-core is installed), lists, verify."""
from __future__ import annotations

import os
import subprocess
import sys


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokenfeed
from conftest import MEGATRON_CODES, aged, write_llmc, write_megatron, write_nemo_nanogpt

VOCAB_DTYPES = {256: np.uint8, 50257: np.uint16, 128256: np.uint32, 2**32 - 1: np.uint32}


def check_documents(ds, docs):
    assert ds.num_documents == len(docs)
    assert ds.num_tokens == sum(len(d) for d in docs)
    for i, d in enumerate(docs):
        got = ds.document(i)
        assert np.array_equal(got, np.asarray(d)), f"document {i}"
    if ds.num_tokens:
        assert np.array_equal(ds.tokens(0, ds.num_tokens), np.concatenate([np.asarray(d) for d in docs]))


@st.composite
def documents(draw):
    vocab = draw(st.sampled_from(sorted(VOCAB_DTYPES)))
    n = draw(st.integers(1, 12))
    docs = []
    for _ in range(n):
        kind = draw(st.sampled_from(["empty", "one", "short", "long"]))
        length = {"empty": 0, "one": 1, "short": draw(st.integers(2, 50)),
                  "long": draw(st.integers(5000, 70000))}[kind]
        seed = draw(st.integers(0, 2**32 - 1))
        docs.append(np.random.default_rng(seed).integers(0, vocab, size=length, dtype=np.uint64))
    if sum(len(d) for d in docs) == 0:
        docs.append(np.array([vocab - 1], dtype=np.uint64))
    return vocab, docs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=documents(), shard_tokens=st.sampled_from([100, 10_000, 1 << 28]),
       compression=st.sampled_from([None, "zstd"]))
def test_native_roundtrip_property(tmp_path_factory, case, shard_tokens, compression):
    vocab, docs = case
    path = tmp_path_factory.mktemp("rt") / "ds"
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, shard_tokens=shard_tokens, compression=compression,
                                 block_tokens=4096) as w:
        for d in docs:
            w.add_document(d)
    ds = tokenfeed.open(path)
    assert ds.dtype == np.dtype(VOCAB_DTYPES[vocab])
    assert ds.vocab_size == vocab
    assert ds.format == "tokenfeed"
    check_documents(ds, docs)
    ds.verify(progress=False)


def test_writer_rejects_out_of_vocab_with_document_number(tmp_path):
    with pytest.raises(ValueError, match="document 2"):
        with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=100) as w:
            w.add_document([1, 2])
            w.add_document([3])
            w.add_document([5, 100])
    with pytest.raises(ValueError, match="document 0"):
        with tokenfeed.DatasetWriter(tmp_path / "ds2", vocab_size=100) as w:
            w.add_document([-1])
    assert not (tmp_path / "ds" / "tokenfeed.manifest").exists()


def test_writer_rejects_floats_and_2d(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=100) as w:
        with pytest.raises(TypeError):
            w.add_document(np.array([1.5, 2.0]))
        with pytest.raises(ValueError):
            w.add_document(np.zeros((2, 2), dtype=np.int64))
        w.add_document([1])


def test_aborted_write_leaves_previous_dataset(tmp_path):
    path = tmp_path / "ds"
    with tokenfeed.DatasetWriter(path, vocab_size=50) as w:
        w.add_document([1, 2, 3])
    fp = tokenfeed.open(path).fingerprint
    with pytest.raises(RuntimeError):
        with tokenfeed.DatasetWriter(path, vocab_size=50, overwrite=True) as w:
            w.add_document([4, 5])
            raise RuntimeError("crash mid-write")
    ds = tokenfeed.open(path)
    assert ds.fingerprint == fp and np.array_equal(ds.document(0), [1, 2, 3])
    with pytest.raises(OSError):
        tokenfeed.DatasetWriter(path, vocab_size=50)  # exists, overwrite not given


def test_compressed_and_plain_share_fingerprint(tmp_path):
    docs = [np.arange(i * 10, dtype=np.int64) % 1000 for i in range(1, 30)]
    for name, comp in (("a", None), ("b", "zstd")):
        with tokenfeed.DatasetWriter(tmp_path / name, vocab_size=1000, compression=comp, block_tokens=64) as w:
            w.add_documents(docs)
    a, b = tokenfeed.open(tmp_path / "a"), tokenfeed.open(tmp_path / "b")
    assert a.fingerprint == b.fingerprint
    assert b.files()[0]["compressed"]
    check_documents(b, docs)


# ------------------------------------------------ foreign formats, independent writers

@pytest.mark.parametrize("code", sorted(MEGATRON_CODES))
def test_megatron_all_dtype_codes(tmp_path, code):
    rng = np.random.default_rng(code)
    dt = np.dtype(MEGATRON_CODES[code])
    hi = 100 if dt.itemsize == 1 else 30000
    docs = [rng.integers(0, hi, size=n).astype(dt) for n in (5, 0, 1, 300, 17)]
    write_megatron(tmp_path / "mg", docs, code)
    for p in (tmp_path / "mg", f"{tmp_path / 'mg'}.bin", f"{tmp_path / 'mg'}.idx"):
        ds = tokenfeed.open(p)
        assert ds.format == "megatron" and ds.dtype == dt
        check_documents(ds, docs)


def test_what_a_local_name_is_survives_links_fifos_and_directories(tmp_path):
    """The resolution of a local name follows symbolic links as open does (a linked pair and a
    linked dataset directory open), and never reads a planted FIFO or a directory as a pair's
    .idx: x.bin is then the file it is, without a hang."""
    docs = [np.arange(1, 9, dtype=np.uint16), np.arange(40, 43, dtype=np.uint16)]
    write_megatron(tmp_path / "real", docs)
    os.symlink(tmp_path / "real.bin", tmp_path / "link.bin")
    os.symlink(tmp_path / "real.idx", tmp_path / "link.idx")
    for name in ("link", "link.bin", "link.idx"):
        ds = tokenfeed.open(tmp_path / name)
        assert ds.format == "megatron" and ds.num_tokens == 11
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=100) as w:
        w.add_documents(docs)
    os.symlink(tmp_path / "ds", tmp_path / "ds.idx")  # a directory named like a companion
    assert tokenfeed.open(tmp_path / "ds.idx").format == "tokenfeed"
    write_llmc(tmp_path / "f.bin", np.arange(7, 17, dtype=np.uint16))
    os.mkfifo(tmp_path / "f.idx")  # no writer: reading it would block
    ds = tokenfeed.open(tmp_path / "f.bin")
    assert ds.format == "llm.c" and ds.tokens(0, 3).tolist() == [7, 8, 9]
    with pytest.raises(FileNotFoundError, match="nor a Megatron pair"):
        tokenfeed.open(tmp_path / "f")  # the FIFO is no .idx: nothing is named f
    os.unlink(tmp_path / "f.idx")
    os.mkdir(tmp_path / "f.idx")
    assert tokenfeed.open(tmp_path / "f.bin").format == "llm.c"
    with pytest.raises(tokenfeed.FormatError, match="no manifest"):
        tokenfeed.open(tmp_path / "f.idx")
    with pytest.raises(tokenfeed.FormatError, match="no Megatron dataset here"):
        tokenfeed.open(tmp_path / "f.bin", format="megatron")
    # in a shard set's listing a FIFO is a name beside f.bin like any other: its first bytes are
    # asked for without waiting for a writer (a child, so that a hang fails the test)
    os.rmdir(tmp_path / "f.idx")
    os.mkfifo(tmp_path / "f.idx")
    code = f"import tokenfeed; ds = tokenfeed.open({str(tmp_path / 'f*.bin')!r}); print(ds.format, ds.num_tokens)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TOKENFEED_CATALOG_DIR": "off"})
    assert r.returncode == 0 and r.stdout.split() == ["llm.c", "10"], r.stdout + r.stderr


def test_resolve_path_answers_what_the_open_reads(tmp_path):
    """_core.resolve_path is the open's resolution: the kind and path it names agree with what
    tokenfeed.open reads, and its refusals are the open's exceptions."""
    from tokenfeed import _core
    write_megatron(tmp_path / "m", [np.arange(1, 9, dtype=np.uint16)])
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=100) as w:
        w.add_documents([np.arange(1, 9, dtype=np.uint16)])
    write_llmc(tmp_path / "m", np.arange(7, 17, dtype=np.uint16))  # a file named like the prefix
    cases = {"m.idx": ("pair", "m", "megatron"), "m": ("file", "m", "llm.c"), "ds/": ("dataset", "ds", "tokenfeed")}
    for name, (kind, where, fmt) in cases.items():
        assert _core.resolve_path(tmp_path / name) == (kind, str(tmp_path / where)), name
        assert tokenfeed.open(tmp_path / name).format == fmt
    assert _core.resolve_path(str(tmp_path / "m"), format="megatron") == ("pair", str(tmp_path / "m"))
    assert _core.resolve_path(os.fsencode(tmp_path / "m.bin"), "raw") == ("file", str(tmp_path / "m.bin"))
    with pytest.raises(FileNotFoundError, match="nor a Megatron pair"):
        _core.resolve_path(tmp_path / "nothing")
    with pytest.raises(ValueError, match="local paths only"):
        _core.resolve_path("s3://bucket/m.bin")
    with pytest.raises(ValueError, match="format='nope'"):
        _core.resolve_path(tmp_path / "m", format="nope")
    with pytest.raises(ValueError, match="embedded null"):
        _core.resolve_path("m\0.bin")


def test_megatron_own_builder(tmp_path):
    from megatron.core.datasets import indexed_dataset as idx_mod  # megatron-core: in the test extra
    import torch
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50000, size=n) for n in (10, 1, 250, 3)]
    b = idx_mod.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.uint16)
    for d in docs:
        b.add_document(torch.tensor(d), [len(d)])
    b.finalize(str(tmp_path / "m.idx"))
    theirs = idx_mod.IndexedDataset(str(tmp_path / "m"))
    ours = tokenfeed.open(tmp_path / "m")
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        assert np.array_equal(ours[i], theirs[i])
        assert ours[i].dtype == theirs[i].dtype


@pytest.mark.parametrize("version", [1, 7])
def test_llmc_both_headers(tmp_path, version):
    toks = np.random.default_rng(version).integers(0, 50257 if version == 1 else 128256, size=1000)
    write_llmc(tmp_path / "s.bin", toks, version)
    ds = tokenfeed.open(tmp_path / "s.bin")
    assert ds.format == "llm.c" and ds.dtype == (np.uint16 if version == 1 else np.uint32)
    check_documents(ds, [toks])


def test_raw_nanogpt_and_datatrove_index(tmp_path):
    docs = [np.arange(n, dtype=np.uint16) for n in (4, 0, 9, 1)]
    flat = np.concatenate(docs)
    flat.tofile(tmp_path / "train.bin")                                   # nanoGPT
    ds = tokenfeed.open(tmp_path / "train.bin", dtype="uint16")
    assert ds.format == "raw" and ds.num_documents == 1
    assert np.array_equal(ds.tokens(0, len(flat)), flat)
    flat.tofile(tmp_path / "x.ds")                                        # datatrove
    np.cumsum([len(d) for d in docs]).astype(np.uint64).tofile(tmp_path / "x.ds.index")
    ds = tokenfeed.open(tmp_path / "x.ds", dtype="uint16")
    check_documents(ds, docs)
    with pytest.raises(tokenfeed.FormatError, match="dtype"):
        tokenfeed.open(tmp_path / "train.bin")                          # headerless needs dtype


NEMO_MAGIC = 278895051


def _nemo_docs(seed, n=7, vocab=50000):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(k)) for k in rng.integers(1, 300, size=n)]


@pytest.mark.parametrize("itemsize", [2, 4])
def test_nemo_nanogpt_with_and_without_bos_idx(tmp_path, itemsize):
    docs = _nemo_docs(itemsize, vocab=50000 if itemsize == 2 else 163840)
    flat = write_nemo_nanogpt(tmp_path / "shard_000.bin", docs, itemsize, bos_idx=False)
    ds = tokenfeed.open(tmp_path / "shard_000.bin")                     # detected by its magic
    assert ds.format == "nemo-nanogpt" and ds.dtype == (np.uint16 if itemsize == 2 else np.uint32)
    check_documents(ds, [flat])                                         # no sidecar: one document
    fp_without = ds.fingerprint
    write_nemo_nanogpt(tmp_path / "shard_000.bin", docs, itemsize, bos_idx=True)
    assert (tmp_path / "shard_000.bos.idx").exists()                    # with_suffix, as AutoModel names it
    for fmt in (None, "nemo-nanogpt", "nanogpt"):
        ds = tokenfeed.open(tmp_path / "shard_000.bin", format=fmt)
        check_documents(ds, docs)                                       # documents start at the BOS positions
        starts = np.fromfile(tmp_path / "shard_000.bos.idx", dtype=np.int32)
        assert [ds.find_document(int(p)) for p in starts] == list(range(len(docs)))
        assert ds.fingerprint != fp_without                             # the sidecar is part of what was read


def test_nemo_nanogpt_tokens_before_the_first_bos_are_a_document(tmp_path):
    docs = _nemo_docs(3)
    flat = write_nemo_nanogpt(tmp_path / "s.bin", docs, bos_idx=False)
    starts = np.cumsum([len(d) for d in docs[:-1]]).astype(np.int32)    # no BOS at 0
    starts.tofile(tmp_path / "s.bos.idx")
    ds = tokenfeed.open(tmp_path / "s.bin")
    check_documents(ds, docs)
    assert np.array_equal(ds.tokens(0, len(flat)), flat)


def test_nemo_nanogpt_many_shards_and_the_node_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFEED_CATALOG_DIR", str(tmp_path / "cat"))
    all_docs, paths = [], []
    for i in range(3):
        d = _nemo_docs(10 + i)
        write_nemo_nanogpt(tmp_path / f"s{i}.bin", d, bos_idx=i != 1)  # the middle one without a sidecar
        all_docs += d if i != 1 else [np.concatenate(d)]
        paths.append(tmp_path / f"s{i}.bin")
    aged([*paths, *tmp_path.glob("*.bos.idx"), tmp_path])
    for _ in range(2):                                                  # parsed, then from the catalog
        ds = tokenfeed.open(paths)
        check_documents(ds, all_docs)
    # a sidecar that appears beside the shard read without one is seen, not the catalog's old entry
    d1 = _nemo_docs(11)
    write_nemo_nanogpt(tmp_path / "s1.bin", d1, bos_idx=True)
    aged([*tmp_path.glob("s1.*"), tmp_path])
    ds = tokenfeed.open(paths)
    assert ds.num_documents == len(all_docs) - 1 + len(d1)


def test_nemo_nanogpt_directory_and_glob_with_sidecars(tmp_path):
    """A directory (and a glob) of NeMo shards with their .bos.idx sidecars is one set of
    shards: each sidecar is known from the listing as its shard's companion, not taken for
    a data file of another format; the documents are the sidecars'."""
    all_docs = []
    for i in range(3):
        d = _nemo_docs(20 + i)
        write_nemo_nanogpt(tmp_path / f"shard_{i:03d}.bin", d, bos_idx=True)
        all_docs += d
    for spec in (tmp_path, str(tmp_path / "shard_*.bin")):
        ds = tokenfeed.open(spec)
        assert ds.format == "nemo-nanogpt" and len(ds.files()) == 3, (spec, ds.files())
        check_documents(ds, all_docs)


def _nemo_bytes(tmp_path, docs=None):
    docs = docs or _nemo_docs(5)
    write_nemo_nanogpt(tmp_path / "s.bin", docs)
    return bytearray((tmp_path / "s.bin").read_bytes()), docs


@pytest.mark.parametrize("word, value, field", [
    (1, 2, "version"), (3, 3, "bytes per token"), (3, 0, "bytes per token"), (2, -5, "num_tokens"),
    (2, 1 << 30, "file size"), (2, 0x7FFFFFFF, "file size")])
def test_nemo_nanogpt_hostile_header(tmp_path, word, value, field):
    b, _ = _nemo_bytes(tmp_path)
    b[4 * word:4 * word + 4] = np.int32(value).tobytes()
    (tmp_path / "s.bin").write_bytes(bytes(b))
    with pytest.raises(tokenfeed.FormatError, match=f"s.bin: {field}"):
        tokenfeed.open(tmp_path / "s.bin")


def test_nemo_nanogpt_truncated_and_forced(tmp_path):
    b, _ = _nemo_bytes(tmp_path)
    (tmp_path / "s.bin").write_bytes(bytes(b[:-2]))                   # one token short
    with pytest.raises(tokenfeed.FormatError, match="file size"):
        tokenfeed.open(tmp_path / "s.bin")
    (tmp_path / "s.bin").write_bytes(bytes(b[:600]))                  # inside the header
    with pytest.raises(tokenfeed.FormatError, match="header"):
        tokenfeed.open(tmp_path / "s.bin", format="nemo-nanogpt")
    write_llmc(tmp_path / "l.bin", np.arange(10), 1)                    # another format, forced
    with pytest.raises(tokenfeed.FormatError, match="magic: expected 278895051"):
        tokenfeed.open(tmp_path / "l.bin", format="nemo-nanogpt")


@pytest.mark.parametrize("bad, msg", [
    ("unsorted", "BOS position 3"), ("repeated", "BOS position 1"), ("negative", "BOS position 0"),
    ("past_end", "BOS position"), ("odd_size", "multiple of 4")])
def test_nemo_nanogpt_hostile_bos_idx(tmp_path, bad, msg):
    _, docs = _nemo_bytes(tmp_path)
    n = sum(len(d) for d in docs)
    starts = np.fromfile(tmp_path / "s.bos.idx", dtype=np.int32)
    if bad == "unsorted":
        starts[2], starts[3] = starts[3], starts[2]
    elif bad == "repeated":
        starts[1] = starts[0]
    elif bad == "negative":
        starts[0] = -1
    elif bad == "past_end":
        starts[-1] = n
    raw = starts.tobytes() + (b"\x01" if bad == "odd_size" else b"")
    (tmp_path / "s.bos.idx").write_bytes(raw)
    with pytest.raises(tokenfeed.FormatError, match=msg) as e:
        tokenfeed.open(tmp_path / "s.bin")
    assert "s.bos.idx" in str(e.value)                                  # names the sidecar, not the shard


def test_nemo_nanogpt_bos_idx_of_an_empty_shard_refused(tmp_path):
    write_nemo_nanogpt(tmp_path / "e.bin", [], bos_idx=False)
    np.array([0], np.int32).tofile(tmp_path / "e.bos.idx")
    write_llmc(tmp_path / "l.bin", np.arange(10), 1)
    with pytest.raises(tokenfeed.FormatError, match="e.bos.idx: BOS position 0"):
        tokenfeed.open([tmp_path / "e.bin", tmp_path / "l.bin"])


def test_format_names_come_from_the_c_table():
    from tokenfeed import _core
    from tokenfeed.cli import build_parser

    names = _core.Dataset.formats()
    assert names[:5] == ("tokenfeed", "megatron", "llm.c", "raw", "npy") and "nemo-nanogpt" in names
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "inspect" in a.choices)
    fmt = next(a for a in sub.choices["inspect"]._actions if a.dest == "format")
    assert list(fmt.choices) == list(names)                             # the CLI reads the table
    with pytest.raises(ValueError, match="nemo-nanogpt"):              # the error lists the table's names
        tokenfeed.open(__file__, format="parquet")


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int32", "int64"])
def test_npy(tmp_path, dtype):
    a = np.random.default_rng(1).integers(0, 120, size=333).astype(dtype)
    np.save(tmp_path / "a.npy", a)
    ds = tokenfeed.open(tmp_path / "a.npy")
    assert ds.format == "npy" and ds.dtype == np.dtype(dtype)
    check_documents(ds, [a])


def test_list_of_formats_concatenates_in_order(tmp_path):
    a = np.arange(10, dtype=np.uint16)
    b = np.arange(100, 120, dtype=np.uint16)
    write_llmc(tmp_path / "a.bin", a, 1)
    np.save(tmp_path / "b.npy", b)
    with tokenfeed.DatasetWriter(tmp_path / "c", vocab_size=65536) as w:
        w.add_document([7, 8, 9])
    ds = tokenfeed.open([tmp_path / "a.bin", tmp_path / "b.npy", tmp_path / "c"])
    check_documents(ds, [a, b, np.array([7, 8, 9])])
    assert [f["format"] for f in ds.files()] == ["llm.c", "npy", "tokenfeed"]
    # a sample that crosses all three files
    l = tokenfeed.Loader(ds, seq_len=32, batch_size=1, shuffle=False, output="numpy")
    assert np.array_equal(next(l)["tokens"][0], ds.tokens(0, 33))


def test_zero_copy_views_are_read_only(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(50, dtype=np.uint16))
    ds = tokenfeed.open(tmp_path / "a.npy")
    v = ds.tokens(5, 10)
    assert not v.flags.writeable and not v.flags.owndata
    del ds
    assert list(v) == [5, 6, 7, 8, 9]  # the view keeps the mapping alive


def test_verify_catches_flipped_byte_and_names_the_shard(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=1000, shard_tokens=100) as w:
        for i in range(10):
            w.add_document(np.arange(50) + i)
    ds = tokenfeed.open(tmp_path / "ds")
    ds.verify(progress=False)
    shard = ds.files()[2]["path"]
    del ds
    with open(shard, "r+b") as f:
        f.seek(4096 + 10)
        byte = f.read(1)
        f.seek(4096 + 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    ds = tokenfeed.open(tmp_path / "ds")          # open checks headers only
    with pytest.raises(tokenfeed.FormatError, match=shard.split("/")[-1]):
        ds.verify(progress=False)

"""Views: metadata columns beside a dataset, filters at load time, mixtures by column,
provenance with metadata (docs/views.md)."""
from __future__ import annotations

import collections
import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core
from tokenfeed.sources import _views
from tokenfeed.cli import main

from conftest import assert_resumes_exactly, numpy_loader, take_tokens, write_llmc, write_megatron

LANGS = ["en", "de", "fr", "en", "es"]
PAD = 0


def meta_of(i: int) -> dict:
    return {"url": f"https://example.org/{i}", "lang": LANGS[i % 5], "quality": (i * 7 % 10) / 10,
            "cluster": i // 4, "domain": "code" if i % 3 == 0 else "web"}


def write_meta_dataset(path, n=400, seed=0, vocab=1000, max_len=60):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, vocab, size=int(rng.integers(1, max_len))) for _ in range(n)]
    with tokenfeed.DatasetWriter(path, vocab_size=vocab) as w:
        for i, d in enumerate(docs):
            w.add_document(d, meta=meta_of(i))
    return tokenfeed.open(path), docs


@pytest.fixture
def meta_ds(tmp_path):
    return write_meta_dataset(tmp_path / "ds")


def reference(n, pred):
    return np.array([i for i in range(n) if pred(meta_of(i))], dtype=np.uint64)


def served_documents(loader, steps):
    """Counter of document ids (and tokens of each) in the first ``steps`` steps, from explain."""
    docs: collections.Counter = collections.Counter()
    for s in range(steps):
        for row in loader.explain(s):
            for seg in row:
                docs[seg.document] += seg.stop - seg.start
    return docs


# --------------------------------------------------------------------------- columns


def test_writer_meta_columns_types_and_values(meta_ds):
    ds, _ = meta_ds
    cols = ds.columns()
    assert cols.types == {"url": "string", "lang": "category", "quality": "float64", "cluster": "int64",
                          "domain": "category"}
    assert cols.num_documents == ds.num_documents == 400
    assert cols.dataset_fingerprint == ds.fingerprint
    ids = [0, 7, 399]
    assert cols.values("url", ids) == [meta_of(i)["url"] for i in ids]
    assert cols.values("lang", ids) == [meta_of(i)["lang"] for i in ids]
    assert cols.values("quality", ids) == [meta_of(i)["quality"] for i in ids]
    assert cols.values("cluster", ids) == [meta_of(i)["cluster"] for i in ids]


def test_missing_values_satisfy_no_comparison(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        w.add_document([1, 2, 3], meta={"lang": "en", "score": 1, "q": 0.5})
        w.add_document([4, 5])  # no metadata: missing values
        w.add_document([6], meta={"lang": "de"})
    ds = tokenfeed.open(tmp_path / "d")
    cols = ds.columns()
    assert cols.values("score", [0, 1, 2]) == [1, None, None]
    assert cols.values("q", [1]) == [None]
    # two distinct strings in three documents: a string column, where a missing value is ""
    assert cols.types["lang"] == "string" and cols.values("lang", [1]) == [""]
    for where, want in [("score >= 0", [1, 0, 0]), ("score != 5", [1, 0, 0]), ("not score == 1", [0, 1, 1]),
                        ("q < 1 or lang == 'de'", [1, 0, 1]), ("lang not in ('fr')", [1, 1, 1]),
                        ("lang in ('en', 'de')", [1, 0, 1]), ("q not in (0.5)", [0, 0, 0])]:
        assert cols.eval(where).astype(int).tolist() == want, where


@pytest.mark.parametrize("where, pred", [
    ("lang == 'en' and quality >= 0.5", lambda m: m["lang"] == "en" and m["quality"] >= 0.5),
    ("lang in ('de', 'fr') or cluster < 3", lambda m: m["lang"] in ("de", "fr") or m["cluster"] < 3),
    ("not (domain == 'code') and quality > 0.25", lambda m: m["domain"] != "code" and m["quality"] > 0.25),
    ("url == 'https://example.org/17'", lambda m: m["url"] == "https://example.org/17"),
    ("url in ('https://example.org/3', \"https://example.org/5\", 'nope')",
     lambda m: m["url"] in ("https://example.org/3", "https://example.org/5")),
    ("url < 'https://example.org/2'", lambda m: m["url"] < "https://example.org/2"),
    ("cluster not in (1, 2, 3) and lang != 'es'", lambda m: m["cluster"] not in (1, 2, 3) and m["lang"] != "es"),
    ("quality <= 0.3 or quality >= 0.9 and cluster >= 50", lambda m: m["quality"] <= 0.3 or (m["quality"] >= 0.9
                                                                                          and m["cluster"] >= 50)),
    ("lang > 'en'", lambda m: m["lang"] > "en"),
    ("cluster == 5.0", lambda m: m["cluster"] == 5),
])
def test_filter_language_matches_numpy_reference(meta_ds, where, pred):
    ds, _ = meta_ds
    got = np.flatnonzero(ds.columns().eval(where))
    assert got.tolist() == reference(400, pred).tolist()


@pytest.mark.parametrize("where, needle", [
    ("lang = 'en'", "expected a comparison"),
    ("lang == en", "expected a number or a quoted string"),
    ("lang == 'en", "unterminated string"),
    ("quality >= 'x'", "column quality is float64"),
    ("lang == 3", "column lang is category"),
    ("nosuch == 1", "no column named \"nosuch\""),
    ("(lang == 'en'", "expected ')'"),
    ("lang == 'en' lang", "unexpected text"),
    ("lang in 'en'", "expected '(' after 'in'"),
    ("not " * 100 + "lang == 'en'", "nested more than 64 deep"),
    ("", "expected a column name"),
])
def test_bad_filters_say_what_and_where(meta_ds, where, needle):
    ds, _ = meta_ds
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        ds.filter(where)
    assert needle in str(e.value)


# --------------------------------------------------------------------------- filtered loaders

MODES = [("concat", {}), ("concat", {"separator_id": 0}), ("best_fit", {"pad_id": PAD}),
         ("document", {"pad_id": PAD})]


@pytest.mark.filterwarnings("ignore:.*pads")
@pytest.mark.parametrize("packing, extra", MODES)
def test_filtered_loader_serves_exactly_the_selected_documents(meta_ds, packing, extra):
    ds, docs = meta_ds
    where = "lang == 'en' and quality >= 0.5"
    ref = reference(400, lambda m: m["lang"] == "en" and m["quality"] >= 0.5)
    view = ds.filter(where)
    assert view.num_documents == len(ref) and (view.document_ids == ref).all()
    assert view.num_tokens == sum(len(docs[i]) for i in ref)
    # seq_len 64: every document (at most 59 tokens) fits one sample, so packings keep each whole
    # one sample a step: no sample of the epoch is left out of a partial last batch
    ld = numpy_loader(view, seq_len=64, batch_size=1, packing=packing, epochs=1, **extra)
    steps = 0
    rows = []
    for b in ld:
        rows.append(b["tokens"].copy())
        steps += 1
    served = served_documents(ld, steps)
    assert set(served) <= set(ref.tolist())
    if packing != "concat":  # every document whole, once
        assert sorted(served) == ref.tolist()
        assert all(served[d] == len(docs[d]) for d in ref)
    else:  # the documents starting before the tail the last sample cannot hold
        sep = 1 if extra else 0
        vs = np.cumsum([0] + [len(docs[i]) + sep for i in ref])[:-1]
        end = ld.num_samples * 64 + 1
        assert sorted(served) == [int(d) for d, v in zip(ref, vs) if v < end]
    # the tokens are the documents' own
    for s in range(steps):
        for r, row in enumerate(ld.explain(s)):
            for seg in row:
                want = docs[seg.document][seg.start:seg.stop]
                assert (rows[s][r][seg.offset:seg.offset + len(want)] == want).all()
    # Loader(where=) says the same
    same = numpy_loader(ds, where=where, seq_len=64, batch_size=1, packing=packing, epochs=1, **extra)
    assert all(np.array_equal(a, next(same)["tokens"]) for a in rows)


def test_unshuffled_concat_view_is_the_selected_documents_in_order(meta_ds):
    ds, docs = meta_ds
    view = ds.filter("domain == 'web'")
    stream = np.concatenate([docs[i] for i in view.document_ids])
    ld = numpy_loader(view, seq_len=32, batch_size=1, shuffle="none", epochs=1)
    for k, b in enumerate(ld):
        assert (b["tokens"][0] == stream[k * 32:k * 32 + 33]).all()
    assert k + 1 == (len(stream) - 1) // 32


def test_view_rows_of_many_documents_in_a_batch_are_the_selected_documents_in_order(meta_ds):
    # rows of 256 tokens over documents of ~30 tokens cross about ten documents each, more than
    # the engine prefetches, and a batch of 8 reads each row with the next one's spans computed
    ds, docs = meta_ds
    view = ds.filter("domain == 'web'")
    stream = np.concatenate([docs[i] for i in view.document_ids])
    L, B = 256, 8
    ld = numpy_loader(view, seq_len=L, batch_size=B, shuffle="none", epochs=1, num_threads=1)
    rows = 0
    for b in ld:
        for t in b["tokens"]:
            assert (t == stream[rows * L:rows * L + L + 1]).all()
            rows += 1
    assert rows == (len(stream) - 1) // L // B * B


@pytest.mark.parametrize("sep", [None, 7])
def test_view_concat_rows_match_the_reference_with_empty_and_long_documents(tmp_path, sep):
    # The order locates a row of a view through a stride index of the view's stream (a few
    # documents per stride) before its binary search: empty documents (several at one stream
    # position without separators), documents longer than a row, strides holding none or many
    # documents, shuffled rows. Tokens, position ids and the loss mask match NumPy's.
    rng = np.random.default_rng(5)
    lens = [0 if i % 4 == 1 else int(rng.choice([1, 3, 9, 40, 150])) for i in range(500)]
    docs = [rng.integers(8, 1000, size=n) for n in lens]
    with tokenfeed.DatasetWriter(tmp_path / "ds", vocab_size=1000) as w:
        for d in docs:
            w.add_document(d)
    ds = tokenfeed.open(tmp_path / "ds")
    keep = np.array([(i * 37) % 5 < 3 for i in range(500)])
    view = ds.filter(keep)
    L = 16
    parts, starts, at = [], [], 0
    for i in np.flatnonzero(keep):
        d = docs[i] if sep is None else np.append(docs[i], sep)
        if len(d):
            starts.append(at)
        parts.append(d)
        at += len(d)
    stream = np.concatenate(parts)
    starts = np.array(starts)
    n = (len(stream) - 1) // L
    extra = {} if sep is None else {"separator_id": sep}
    ld = numpy_loader(view, seq_len=L, batch_size=5, shuffle="none", epochs=1, position_ids=True, loss_mask=True,
                      **extra)
    i = 0
    for b in ld:
        for r, row in enumerate(b["tokens"]):
            p0 = i * L
            assert np.array_equal(row, stream[p0:p0 + L + 1])
            inside = starts[(starts > p0) & (starts <= p0 + L)] - p0
            want_pos = np.arange(L) - np.array([max([0] + [s for s in inside if s <= t]) for t in range(L)])
            assert np.array_equal(b["position_ids"][r], want_pos)
            want_mask = np.ones(L, dtype=bool)
            want_mask[inside - 1] = False
            assert np.array_equal(b["loss_mask"][r].astype(bool), want_mask)
            i += 1
    assert i == n // 5 * 5


@pytest.mark.parametrize("packing, extra", MODES)
def test_filtered_order_resumes_exactly_and_is_elastic(meta_ds, packing, extra):
    ds, _ = meta_ds
    view = ds.filter("quality >= 0.4", exclude={"lang": ["fr"]})
    kw = dict(seq_len=16, batch_size=4, packing=packing, seed=3, **extra)
    state, whole = assert_resumes_exactly(view, 3, 4, **kw)
    assert state["dataset_fingerprint"] == view.fingerprint
    halves = [take_tokens(numpy_loader(view, dp_rank=r, dp_size=2, **dict(kw, batch_size=2)), 7) for r in (0, 1)]
    for k in range(7):
        assert np.array_equal(np.concatenate([halves[0][k], halves[1][k]]), whole[k])


def test_selection_enters_the_fingerprint_and_states_refuse_another(meta_ds):
    ds, _ = meta_ds
    a, b = ds.filter("lang == 'en'"), ds.filter("lang == 'de'")
    assert len({ds.fingerprint, a.fingerprint, b.fingerprint}) == 3
    assert ds.filter("lang == 'en'").fingerprint == a.fingerprint  # a pure function of the selection
    # the selection, however it was reached
    assert a.filter("quality >= 0.5").fingerprint == ds.filter("lang == 'en' and quality >= 0.5").fingerprint
    ld = numpy_loader(a, seq_len=16, batch_size=2)
    take_tokens(ld, 2)
    st = ld.state_dict()
    with pytest.raises(tokenfeed.StateError):
        numpy_loader(b, seq_len=16, batch_size=2).load_state_dict(st)
    with pytest.raises(tokenfeed.StateError):
        numpy_loader(ds, seq_len=16, batch_size=2).load_state_dict(st)


def test_mask_exclude_ids_and_values(meta_ds):
    ds, _ = meta_ds
    mask = np.zeros(400, dtype=bool)
    mask[::7] = True
    v = ds.filter(mask, exclude=[0, 14, 399])
    assert v.document_ids.tolist() == [i for i in range(0, 400, 7) if i not in (0, 14, 399)]
    v2 = ds.filter(exclude={"url": ["https://example.org/1", "https://example.org/2"], "cluster": [10]})
    assert v2.document_ids.tolist() == [i for i in range(400) if i not in (1, 2) and i // 4 != 10]
    # a view of a view selects among the view's documents; ids stay the dataset's
    v3 = v2.filter("lang == 'en'")
    assert v3.document_ids.tolist() == [i for i in v2.document_ids.tolist() if meta_of(i)["lang"] == "en"]
    assert np.array_equal(v3.document(0), ds.document(int(v3.document_ids[0])))
    with pytest.raises(ValueError, match="one per document"):
        ds.filter(np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="document ids"):
        ds.filter(exclude=[400])
    with pytest.raises(ValueError, match="keeps none"):
        ds.filter("cluster < 0")


def test_view_pickles_and_orders_that_reproduce_other_loaders_refuse_it(meta_ds):
    import pickle

    ds, _ = meta_ds
    v = ds.filter("lang == 'en'")
    w = pickle.loads(pickle.dumps(v))
    assert w.fingerprint == v.fingerprint and (w.document_ids == v.document_ids).all()
    with pytest.raises(ValueError, match="cannot read a view"):
        numpy_loader(v, seq_len=8, batch_size=1, order="olmo", pad_id=0)


# --------------------------------------------------------------------------- foreign formats, attach


def sha(paths):
    out = {}
    for p in paths:
        with open(p, "rb") as f:
            out[str(p)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_attach_to_megatron_and_llmc_leaves_token_files_identical(tmp_path, capsys):
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 5000, size=int(rng.integers(2, 50))) for _ in range(120)]
    prefix = tmp_path / "mg_text_document"
    write_megatron(prefix, docs)
    table = tmp_path / "meta.jsonl"
    with open(table, "w") as f:
        for i in range(120):
            f.write(json.dumps({"doc_index": i, **meta_of(i)}) + "\n")
    before = sha([f"{prefix}.bin", f"{prefix}.idx"])
    assert main(["meta", "attach", str(prefix), str(table), "--key", "doc_index"]) == 0
    assert sha([f"{prefix}.bin", f"{prefix}.idx"]) == before
    ds = tokenfeed.open(prefix)
    assert ds.columns_path == f"{prefix}.columns"
    view = ds.filter("lang == 'en' and quality >= 0.5")
    ref = reference(120, lambda m: m["lang"] == "en" and m["quality"] >= 0.5)
    assert view.document_ids.tolist() == ref.tolist()
    ld = numpy_loader(view, seq_len=8, batch_size=1, packing="document", pad_id=0, epochs=1)
    n = sum(1 for _ in ld)
    assert sorted(served_documents(ld, n)) == ref.tolist()
    # a second table keyed by url adds a column; the first ones stay
    csv_path = tmp_path / "scores.csv"
    with open(csv_path, "w") as f:
        f.write("url,toxicity\n")
        for i in range(0, 120, 2):
            f.write(f"https://example.org/{i},{i / 1000}\n")
    assert main(["meta", "attach", str(prefix), str(csv_path), "--key", "url"]) == 0
    cols = ds.columns()
    assert cols.values("toxicity", [0, 1, 4]) == [0.0, None, 0.004]
    assert cols.values("lang", [3]) == [meta_of(3)["lang"]]
    assert sha([f"{prefix}.bin", f"{prefix}.idx"]) == before

    # llm.c files: each file a document
    d = tmp_path / "llmc"
    d.mkdir()
    files = []
    for k in range(6):
        p = d / f"shard_{k:02d}.bin"
        write_llmc(p, rng.integers(0, 50000, size=300))
        files.append(p)
    before = sha(files)
    lds = tokenfeed.open([str(p) for p in files])
    lds.attach_columns([{"doc_index": k, "split": "val" if k == 0 else "train"} for k in range(6)])
    assert sha(files) == before
    v = tokenfeed.open([str(p) for p in files]).filter("split == 'train'")
    assert v.document_ids.tolist() == [1, 2, 3, 4, 5]


def test_attach_parquet_if_pyarrow(tmp_path, meta_ds):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    ds, _ = meta_ds
    pq.write_table(pa.table({"doc_index": [1, 3], "flag": [1, 0]}), tmp_path / "t.parquet")
    ds.attach_columns(str(tmp_path / "t.parquet"))
    assert ds.columns().values("flag", [0, 1, 3]) == [None, 1, 0]


def test_attach_refuses_bad_tables(tmp_path, meta_ds):
    ds, _ = meta_ds
    with pytest.raises(ValueError, match="doc_index 400 is not a document index"):
        ds.attach_columns([{"doc_index": 400, "x": 1}])
    with pytest.raises(ValueError, match="two rows name document 3"):
        ds.attach_columns([{"doc_index": 3, "x": 1}, {"doc_index": 3, "x": 2}])
    with pytest.raises(ValueError, match="names no document"):
        ds.attach_columns([{"url": "https://nowhere", "x": 1}], key="url")
    with pytest.raises(ValueError, match="no column 'nokey'"):
        ds.attach_columns([{"nokey": 1}], key="nokey")
    with pytest.raises(ValueError, match="column name"):
        ds.attach_columns({"not": [1] * 400})
    with pytest.raises(ValueError, match="a table to attach"):
        ds.attach_columns(str(tmp_path / "t.xlsx"))


# --------------------------------------------------------------------------- attacks on the column file


def rewrite(path, fn):
    with open(path, "rb") as f:
        b = bytearray(f.read())
    fn(b)
    with open(path, "wb") as f:
        f.write(b)


def test_columns_checked_where_used(meta_ds):
    ds, _ = meta_ds
    p = ds.columns_path
    with open(p, "rb") as f:
        good = f.read()
    # a flipped byte in the last column's payload: found when that column is used, not before
    rewrite(p, lambda b: b.__setitem__(len(b) - 3, b[len(b) - 3] ^ 0xFF))
    cols = ds.columns()
    assert cols.eval("cluster >= 0").sum() == 400  # another column still reads
    with pytest.raises(tokenfeed.FormatError, match="column domain: checksum"):
        cols.eval("domain == 'web'")
    # header or directory bytes
    with open(p, "wb") as f:
        f.write(good)
    rewrite(p, lambda b: b.__setitem__(70, b[70] ^ 1))
    with pytest.raises(tokenfeed.FormatError, match="header_checksum"):
        ds.columns()
    # truncated
    with open(p, "wb") as f:
        f.write(good[: len(good) // 2])
    with pytest.raises(tokenfeed.FormatError, match="outside the"):
        ds.columns()
    with open(p, "wb") as f:
        f.write(good[:40])
    with pytest.raises(tokenfeed.FormatError, match="header"):
        ds.columns()
    with open(p, "wb") as f:
        f.write(b"NOTCOLS!" + good[8:])
    with pytest.raises(tokenfeed.FormatError, match="magic"):
        ds.columns()


def test_columns_of_other_data_are_refused(tmp_path, meta_ds):
    ds, _ = meta_ds
    other, _ = write_meta_dataset(tmp_path / "other", n=400, seed=5)
    os.replace(other.columns_path, ds.columns_path)  # planted: same count, other data
    with pytest.raises(tokenfeed.FormatError, match="dataset_fingerprint"):
        ds.filter("lang == 'en'")
    small, _ = write_meta_dataset(tmp_path / "small", n=10)
    os.replace(small.columns_path, ds.columns_path)
    with pytest.raises(tokenfeed.FormatError, match="num_documents"):
        ds.filter("lang == 'en'")


def forge(n, entries, names=b"", payload=b""):
    """A column file with a valid header checksum over hand-made directory entries."""
    dir_ = b"".join(entries)
    head = b"TFCOLS1\0" + struct.pack("<IIQQQQQ", 1, len(entries), n, 0, 64, 0, 0)
    head += struct.pack("<Q", _core.hash64(dir_, _core.hash64(head, 0)))
    return head + dir_ + names + payload


def entry(name_off, name_len, typ, secs, checksum):
    e = struct.pack("<QQII", name_off, name_len, typ, 0)
    for off, ln in secs:
        e += struct.pack("<QQ", off, ln)
    return e + struct.pack("<Q", checksum)


def test_forged_structure_is_refused_even_with_good_checksums():
    n = 3
    # string offsets going backwards, checksummed as they are
    offs = struct.pack("<4Q", 0, 5, 2, 6)
    data = b"abcdef\0\0"
    base = 64 + 80 + 8  # header, one entry, name padded to 8
    h = _core.hash64(b"", _core.hash64(data[:6], _core.hash64(offs, 0)))
    blob = forge(n, [entry(144, 1, 3, [(base, 32), (base + 32, 6), (0, 0)], h)], b"s" + b"\0" * 7, offs + data)
    c = _core.columns_from_bytes(blob)
    with pytest.raises(tokenfeed.FormatError, match="string offset 2 is out of order"):
        _core.columns_eval(c, "s == 'x'")
    # category codes past the dictionary
    codes = struct.pack("<3I", 0, 7, 0) + b"\0" * 4
    dic = struct.pack("<2Q", 0, 2)
    h = _core.hash64(b"en", _core.hash64(dic, _core.hash64(codes[:12], 0)))
    blob = forge(n, [entry(144, 1, 4, [(base, 12), (base + 16, 16), (base + 32, 2)], h)], b"c" + b"\0" * 7,
                 codes + dic + b"en")
    c = _core.columns_from_bytes(blob)
    with pytest.raises(tokenfeed.FormatError, match="category code 7"):
        _core.columns_values(c, "c", [1])
    # hostile sizes: a section far past the end, counts that overflow
    blob = forge(1 << 62, [entry(144, 1, 1, [(base, 1 << 61), (0, 0), (0, 0)], 0)], b"x" + b"\0" * 7)
    with pytest.raises(tokenfeed.FormatError):
        _core.columns_from_bytes(blob)
    two = 64 + 2 * 80 + 8
    blob = forge(2, [entry(224, 1, 1, [(two, 16), (0, 0), (0, 0)], 0)] * 2, b"x" + b"\0" * 7, b"\0" * 16)
    with pytest.raises(tokenfeed.FormatError, match="already column 0"):
        _core.columns_from_bytes(blob)
    blob = forge(2, [entry(1 << 63, 4, 1, [(base, 16), (0, 0), (0, 0)], 0)], b"x" + b"\0" * 7, b"\0" * 16)
    with pytest.raises(tokenfeed.FormatError, match="name"):
        _core.columns_from_bytes(blob)


def test_random_bytes_never_crash():
    rng = np.random.default_rng(7)
    good = bytes(_views._MAGIC) + struct.pack("<IIQQQQQ", 1, 1, 4, 0, 64, 0, 0)
    for k in range(400):
        blob = bytearray(good + rng.integers(0, 256, size=int(rng.integers(0, 300)), dtype=np.uint8).tobytes())
        for _ in range(int(rng.integers(0, 4))):
            if blob:
                blob[int(rng.integers(0, len(blob)))] = int(rng.integers(0, 256))
        try:
            c = _core.columns_from_bytes(bytes(blob))
        except (tokenfeed.FormatError, ValueError):
            continue
        for name, _ in _core.columns_info(c)["columns"]:
            try:
                _core.columns_values(c, name, [0])
            except (tokenfeed.FormatError, IndexError):
                pass


def test_writing_columns_replaces_a_planted_symlink_and_never_follows_it(tmp_path, meta_ds):
    ds, _ = meta_ds
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.unlink(ds.columns_path)
    os.symlink(victim, ds.columns_path)
    ds.attach_columns({"x": list(range(400))})
    assert victim.read_bytes() == b"keep me"
    assert not os.path.islink(ds.columns_path)
    assert ds.columns().values("x", [5]) == [5]


def test_rewriting_a_dataset_without_meta_drops_its_stale_columns(tmp_path):
    write_meta_dataset(tmp_path / "d", n=20)
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=1000, overwrite=True) as w:
        w.add_document([1, 2, 3])
    assert not os.path.exists(tmp_path / "d" / "tokenfeed.columns")


# --------------------------------------------------------------------------- mixtures by column


def test_mixture_of_views_of_one_dataset(meta_ds):
    ds, _ = meta_ds
    code, web = ds.filter("domain == 'code'"), ds.filter("domain == 'web'")
    ld = numpy_loader([code, web], weights=[0.3, 0.7], seq_len=8, batch_size=10, source_ids=True, seed=2,
                      packing="best_fit", pad_id=PAD)
    for step in range(12):
        b = next(ld)
        assert (np.bincount(b["source_ids"], minlength=2) == [3, 7]).all()
        for row, segs in enumerate(ld.explain(step)):
            for seg in segs:
                assert meta_of(seg.document)["domain"] == ("code", "web")[seg.source]
    # set_weights resumes exactly
    kw = dict(weights=[0.3, 0.7], seq_len=8, batch_size=10, seed=2)
    a = numpy_loader([code, web], **kw)
    take_tokens(a, 3)
    a.set_weights([0.5, 0.5])
    take_tokens(a, 2)
    st = json.loads(json.dumps(a.state_dict()))
    want = take_tokens(a, 4)
    b = numpy_loader([code, web], **kw)
    b.load_state_dict(st)
    assert all(np.array_equal(x, y) for x, y in zip(want, take_tokens(b, 4)))


def test_loader_where_applies_to_each_source_of_a_mixture(tmp_path):
    a, _ = write_meta_dataset(tmp_path / "a", n=100)
    b, _ = write_meta_dataset(tmp_path / "b", n=100, seed=3)
    ld = numpy_loader([a, b], weights=[1, 1], where="lang == 'de'", seq_len=8, batch_size=4)
    assert [d.num_documents for d in ld.dataset] == [20, 20]


# --------------------------------------------------------------------------- provenance


def test_explain_returns_each_segments_metadata(meta_ds, capsys, tmp_path):
    ds, _ = meta_ds
    where = "quality >= 0.5"
    ld = numpy_loader(ds, where=where, seq_len=16, batch_size=2, seed=4)
    rows = ld.explain(3, columns=["url", "lang"])
    for row in rows:
        for seg in row:
            assert seg.meta == {"url": meta_of(seg.document)["url"], "lang": meta_of(seg.document)["lang"]}
            assert meta_of(seg.document)["quality"] >= 0.5
    take_tokens(ld, 2)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(ld.state_dict()))
    assert main(["explain", str(ds.paths[0]), "--state", str(state), "--where", where, "--step", "3",
                 "--columns", "url,lang", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    segs = [s for r in out["rows"] for s in r["segments"]]
    assert [s["meta"]["url"] for s in segs] == [seg.meta["url"] for row in rows for seg in row]
    # where, by a column value
    doc = rows[0][0].document
    assert main(["where", str(ds.paths[0]), "--state", str(state), "--where", where,
                 "--url", meta_of(doc)["url"], "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["rows"]
    assert any(h["step"] == 3 for h in hits)
    # a document the filter leaves out is in no step
    out_doc = int(np.flatnonzero(~ds.columns().eval(where))[0])
    assert ld.where(out_doc) == []


def test_meta_show_cli(meta_ds, capsys):
    ds, _ = meta_ds
    assert main(["meta", "show", str(ds.paths[0]), "--where", "lang == 'en'", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["selected"] == 160 and out["columns"]["lang"] == "category"


# --------------------------------------------------------------------------- convert --meta


@pytest.mark.filterwarnings("ignore:.*pads")
def test_convert_jsonl_with_meta_then_filter_every_packing(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from conftest import tokenizer_json

    words = "the quick brown fox jumps over a lazy dog while loaders feed tokens".split()
    rng = np.random.default_rng(3)
    texts = [" ".join(words[int(i)] for i in rng.integers(0, len(words), size=int(rng.integers(2, 20))))
             for _ in range(300)]
    tok = tokenizer_json(tmp_path, texts[:100])
    rows = [{"text": t, "url": f"https://site/{i}", "lang": LANGS[i % 5], "quality": (i * 7 % 10) / 10}
            for i, t in enumerate(texts)]
    rows[5]["quality"] = None  # a null: a missing value
    with open(tmp_path / "in.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    out = tmp_path / "ds"
    assert main(["convert", str(tmp_path / "in.jsonl"), str(out), "--tokenizer", tok, "--meta", "url,lang,quality",
                 "--workers", "1", "--chunk-mb", "0.002"]) == 0
    capsys.readouterr()
    ds = tokenfeed.open(out)
    cols = ds.columns()
    assert cols.values("url", np.arange(300)) == [r["url"] for r in rows]
    assert cols.values("quality", [5]) == [None]
    ref = np.array([i for i, r in enumerate(rows) if r["lang"] == "en" and (r["quality"] or -1) >= 0.5])
    view = ds.filter("lang == 'en' and quality >= 0.5")
    assert view.document_ids.tolist() == ref.tolist()
    for packing, extra in MODES:
        ld = numpy_loader(view, seq_len=64, batch_size=1, packing=packing, epochs=1, **extra)
        n = sum(1 for _ in ld)
        served = served_documents(ld, n)
        assert set(served) <= set(ref.tolist())
        if packing != "concat":
            assert sorted(served) == ref.tolist()
            assert all(served[d] == len(ds.document(int(d))) for d in ref)


@pytest.mark.filterwarnings("ignore::tokenfeed.PerformanceWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_view_through_torch_dataloader_workers(meta_ds, workers):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from tokenfeed.torch import TokenBatches

    ds, _ = meta_ds
    v = ds.filter("lang == 'en'")
    want = take_tokens(numpy_loader(v, seq_len=16, batch_size=4, seed=1), 3)
    for data, kw in ((v, {}), (ds, {"where": "lang == 'en'"})):
        dl = DataLoader(TokenBatches(data, seq_len=16, batch_size=4, seed=1, **kw), batch_size=None,
                        num_workers=workers)
        it = iter(dl)
        for k in range(3):
            b = next(it)
            got = torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1).numpy()
            assert np.array_equal(got, want[k])


def test_selection_kept_in_the_node_catalog_and_checked(meta_ds, monkeypatch):
    ds, _ = meta_ds
    calls = []
    real = _views.Columns.eval
    monkeypatch.setattr(_views.Columns, "eval", lambda self, w: calls.append(w) or real(self, w))
    where = "lang == 'de' and cluster > 20"
    a = ds.filter(where, exclude={"url": ["https://example.org/81"]})
    b = tokenfeed.open(ds.paths[0]).filter(where, exclude={"url": ["https://example.org/81"]})
    assert len(calls) == 1  # the second open read the kept selection
    assert (a.document_ids == b.document_ids).all() and a.fingerprint == b.fingerprint
    sel_dir = _views.selection_dir()
    files = [os.path.join(sel_dir, f) for f in os.listdir(sel_dir)]
    mine = [f for f in files if _views.load_selection(int(os.path.basename(f)[:16], 16)) is not None
            and len(_views.load_selection(int(os.path.basename(f)[:16], 16))) == a.num_documents]
    assert mine
    # a damaged or truncated copy is not used: the selection is computed again, the same
    for damage in (lambda b: b.__setitem__(40, b[40] ^ 1), lambda b: b.__delitem__(slice(-8, None))):
        for f in mine:
            rewrite(f, damage)
        calls.clear()
        c = ds.filter(where, exclude={"url": ["https://example.org/81"]})
        assert len(calls) == 1 and (c.document_ids == a.document_ids).all()
    # columns rewritten (another column attached): another key, evaluated again
    ds.attach_columns({"extra": list(range(400))})
    calls.clear()
    d = ds.filter(where, exclude={"url": ["https://example.org/81"]})
    assert len(calls) == 1 and (d.document_ids == a.document_ids).all()
    # another filter, another exclusion, another view to select within: other keys
    calls.clear()
    ds.filter(where)
    ds.filter(where, exclude=[5])
    ds.filter("lang == 'en'").filter(where.replace("de", "en"))
    assert len(calls) == 4


def test_column_file_truncated_while_mapped_is_an_error_not_a_crash(meta_ds):
    """In a child process, as the other attacks that truncate a mapped file: a SIGBUS that
    escaped the guard would end that process only, and show here as its exit status."""
    import subprocess
    import sys
    import textwrap

    ds, _ = meta_ds
    body = textwrap.dedent("""
        import os, sys, tokenfeed
        ds = tokenfeed.open(sys.argv[1])
        cols = ds.columns()                    # mapped, header checked
        os.truncate(ds.columns_path, 200)
        for what, fn in (("EVAL", lambda: cols.eval("quality >= 0.5")),
                         ("VALUES", lambda: cols.values("url", [399]))):
            try:
                fn()
                print("NO ERROR from", what)
            except OSError as e:
                print(what, "|", e)
        print("DONE")
    """)
    r = subprocess.run([sys.executable, "-c", body, str(ds.paths[0])], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
    assert "DONE" in r.stdout, r.stdout
    for what in ("EVAL", "VALUES"):
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(what)), "")
        assert "truncated while mapped" in line, r.stdout


# --------------------------------------------------------------------------- loss weights


def write_marked(path, n=150, seed=0):
    """Documents whose every token is its index + 1 (so a label names its document), with a
    quality per document."""
    rng = np.random.default_rng(seed)
    q = rng.random(n).round(3)
    with tokenfeed.DatasetWriter(path, vocab_size=n + 2) as w:
        for i in range(n):
            w.add_document(np.full(int(rng.integers(1, 30)), i + 1), meta={"quality": float(q[i]),
                                                                          "domain": "code" if i % 3 == 0 else "web"})
    return tokenfeed.open(path), q


@pytest.mark.filterwarnings("ignore:.*pads")
@pytest.mark.parametrize("packing, extra", MODES)
@pytest.mark.parametrize("balance", ["none", "tokens"])
def test_loss_weights_from_a_column_match_the_reference_per_token(tmp_path, packing, extra, balance):
    ds, q = write_marked(tmp_path / "m")
    view = ds.filter("quality >= 0.2")
    kw = dict(seq_len=24, batch_size=4, packing=packing, seed=5, loss_weights="quality", **extra)
    if balance != "none":
        kw.update(balance=balance, dp_size=2, dp_rank=1, batch_size=2)
    ld = numpy_loader(view, **kw)
    for _ in range(6):
        b = next(ld)
        labels = b["labels"].astype(np.int64)
        want = np.where(labels > 0, q[np.maximum(labels - 1, 0)], 0).astype(np.float32)
        assert b["loss_weights"].dtype == np.float32
        assert np.array_equal(b["loss_weights"], want)


@pytest.mark.filterwarnings("ignore:.*pads")
@pytest.mark.parametrize("packing, extra", MODES)
@pytest.mark.parametrize("cp, warmup", [((2, 0), 0), ((2, 1), 0), ((4, 3), 0), ((1, 0), 5)])
def test_loss_weights_from_a_column_with_context_parallelism_and_warmup(tmp_path, packing, extra, cp, warmup):
    """Each context-parallel rank's share of a row's weights, and a warmup's shorter rows, against
    the reference per token: the weight of the document each label belongs to."""
    ds, q = write_marked(tmp_path / "m")
    kw = dict(seq_len=32, batch_size=4, packing=packing, seed=5, loss_weights="quality", cp_size=cp[0],
              cp_rank=cp[1], **extra)
    if warmup:
        kw.update(warmup_steps=warmup, warmup_min_seq_len=8)
    ld = numpy_loader(ds.filter("quality >= 0.2"), **kw)
    shapes = set()
    for _ in range(8):
        b = next(ld)
        labels = b["labels"].astype(np.int64)
        shapes.add(labels.shape)
        want = np.where(labels > 0, q[np.maximum(labels - 1, 0)], 0).astype(np.float32)
        assert b["loss_weights"].shape == labels.shape and b["loss_weights"].dtype == np.float32
        assert np.array_equal(b["loss_weights"], want)
    assert (len(shapes) > 1) == bool(warmup)  # the warmup's rows did change length


@pytest.mark.filterwarnings("ignore:.*pads")
@pytest.mark.parametrize("packing, extra", MODES)
@pytest.mark.parametrize("cp", [(2, 0), (2, 1), (4, 3)])
def test_loss_weights_from_a_column_in_the_thd_layout(tmp_path, packing, extra, cp):
    """Context parallelism in the THD layout: every sequence of a row padded to a multiple of
    2 x cp_size, each rank taking its two chunks of each; the weights follow the tokens entry by
    entry (the document of each label; 0 on the padding entries), against the reference per
    token, also after documents are taken down (their labels weigh 0)."""
    ds, q = write_marked(tmp_path / "m")
    kw = dict(seq_len=32, batch_size=3, packing=packing, seed=5, loss_weights="quality", cp_size=cp[0],
              cp_rank=cp[1], cu_seqlens=True, loss_mask=True, **extra)
    ld = numpy_loader(ds.filter("quality >= 0.2"), **kw)
    gone: list = []
    for step in range(8):
        if step == 4:
            gone = sorted({int(x) - 1 for x in np.unique(b["labels"]) if x > 0})[::2]
            ld.exclude(gone)
        b = next(ld)
        labels = b["labels"].astype(np.int64)
        assert labels.ndim == 1 and b["loss_weights"].shape == labels.shape
        assert b["loss_weights"].dtype == np.float32
        want = np.where(labels > 0, q[np.maximum(labels - 1, 0)], 0).astype(np.float32)
        assert np.array_equal(b["loss_weights"], want), step
        if gone:  # tokens of the taken-down documents are pad (0) everywhere: their labels weigh 0
            assert not np.isin(labels - 1, gone).any()
    # the same share as a whole sample's weights cut by tf_cp_thd_positions, against NumPy's
    # own split of a sequence: padded to a multiple of 2 x cp, chunks r and 2cp - 1 - r
    c, r = cp
    for seg in ([32], [5, 27], [1, 1, 30], [7, 9, 16]):
        got = np.frombuffer(_core.cp_thd_positions(seg, c, r), dtype=np.int64)
        ref, start = [], 0
        for s_ in seg:
            p_ = -(-s_ // (2 * c)) * 2 * c
            h = p_ // (2 * c)
            for u0 in (r * h, (2 * c - 1 - r) * h):
                ref += [start + u if u < s_ else -1 for u in range(u0, u0 + h)]
            start += s_
        assert got.tolist() == ref, seg


def test_cp_thd_positions_refuses_hostile_input():
    with pytest.raises(ValueError, match="cp_rank"):
        _core.cp_thd_positions([4], 2, 2)
    with pytest.raises(ValueError, match="cp_rank"):
        _core.cp_thd_positions([4], 0, 0)
    with pytest.raises(ValueError, match="sequence 1"):
        _core.cp_thd_positions([4, -1], 2, 0)
    with pytest.raises(ValueError, match="sequence 0"):
        _core.cp_thd_positions([1 << 62], 2, 0)
    with pytest.raises(TypeError):
        _core.cp_thd_positions(5, 2, 0)
    assert _core.cp_thd_positions([], 2, 0) == b""


@pytest.mark.parametrize("balance", ["none", "tokens", "cp", "cp-thd"])
def test_loss_weights_per_source_of_a_mixture_of_views(tmp_path, balance):
    ds, _ = write_marked(tmp_path / "m")
    code, web = ds.filter("domain == 'code'"), ds.filter("domain == 'web'")
    kw = dict(weights=[0.5, 0.5], loss_weights=[2.0, 0.25], source_ids=True, seq_len=16, batch_size=4, seed=1)
    if balance == "cp-thd":  # each rank's THD entries: its source's weight, 0 on the padding entries
        kw.update(cp_size=2, cp_rank=1, cu_seqlens=True)
        ld = numpy_loader([code, web], **kw)
        for _ in range(5):
            b = next(ld)
            labels = b["labels"].astype(np.int64)
            want = np.where(labels > 0, np.where((labels - 1) % 3 == 0, 2.0, 0.25), 0).astype(np.float32)
            assert np.array_equal(b["loss_weights"], want)
        return
    if balance == "cp":  # each context-parallel rank's share of every row
        kw.update(cp_size=2, cp_rank=1)
    elif balance != "none":
        kw.update(balance=balance, dp_size=2, dp_rank=0, batch_size=2)
    ld = numpy_loader([code, web], **kw)
    for _ in range(5):
        b = next(ld)
        want = np.array([2.0, 0.25], dtype=np.float32)[b["source_ids"]][:, None] * np.ones_like(b["labels"],
                                                                                             dtype=np.float32)
        assert np.array_equal(b["loss_weights"], want)
        # and the rows' documents are the source's (token i + 1 is document i)
        docs = b["labels"].astype(np.int64) - 1
        for r, s in enumerate(b["source_ids"]):
            assert all((d % 3 == 0) == (s == 0) for d in docs[r] if d >= 0)


def test_loss_weights_refused_where_not_supported(tmp_path):
    ds, _ = write_marked(tmp_path / "m")
    with pytest.raises(ValueError, match="one finite weight"):
        numpy_loader(ds, seq_len=8, batch_size=2, loss_weights=[1.0])
    with pytest.raises(ValueError, match="one finite weight"):
        numpy_loader([ds, ds], weights=[1, 1], seq_len=8, batch_size=2, loss_weights=[1.0, -1.0])
    ld = numpy_loader(ds, seq_len=8, batch_size=2, loss_weights="domain")
    with pytest.raises(ValueError, match="no number column 'domain'"):
        next(ld)


# --------------------------------------------------------------------------- takedown mid-run


@pytest.mark.filterwarnings("ignore:.*pads")
@pytest.mark.parametrize("packing, extra", MODES)
def test_takedown_mid_run(tmp_path, packing, extra):
    ds, _ = write_marked(tmp_path / "m")
    pad = 0
    kw = dict(seq_len=16, batch_size=4, packing=packing, seed=2, loss_mask=True, **extra)
    N, steps = 3, 12
    ref_loader = numpy_loader(ds, **kw)
    plain = [{k: v.copy() for k, v in next(ref_loader).items()} for _ in range(steps)]
    # the documents of steps N.. that we take down: a few that do appear there
    seen = sorted({int(d) - 1 for b in plain[N:] for d in np.unique(b["tokens"]) if d > 0})
    gone = seen[::5]
    ld = numpy_loader(ds, **kw)
    got = [{k: v.copy() for k, v in next(ld).items()} for _ in range(N)]
    ld.exclude(gone)
    st = json.loads(json.dumps(ld.state_dict()))
    assert st["excluded"] == [[N * 4, 0, gone]]
    got += [{k: v.copy() for k, v in next(ld).items()} for _ in range(steps - N)]
    for k in range(steps):
        held = set(int(d) - 1 for d in np.unique(plain[k]["tokens"]) if d > 0) & set(gone)
        if k < N or not held:  # before the takedown, or a batch that held none of them: unchanged
            assert np.array_equal(got[k]["tokens"], plain[k]["tokens"]), k
        else:  # never served; their places kept (padding), everything else as it was
            assert not (set(int(d) - 1 for d in np.unique(got[k]["tokens"]) if d > 0) & set(gone))
            same = ~np.isin(plain[k]["tokens"] - 1, gone) | (plain[k]["tokens"] == 0)
            assert np.array_equal(got[k]["tokens"][same], plain[k]["tokens"][same])
            assert (got[k]["tokens"][~same] == pad).all()
            lab_gone = ~same[:, 1:]
            assert (got[k]["loss_mask"][lab_gone] == 0).all()
    # kill and resume after N: the same stream; and on 2 ranks (elastic), the same rows
    resumed = numpy_loader(ds, **kw)
    resumed.load_state_dict(st)
    for k in range(N, steps):
        assert np.array_equal(next(resumed)["tokens"], got[k]["tokens"])
    halves = []
    for r in (0, 1):
        h = numpy_loader(ds, **dict(kw, batch_size=2, dp_size=2, dp_rank=r))
        h.load_state_dict(st)
        halves.append([next(h)["tokens"].copy() for _ in range(steps - N)])
    for k in range(steps - N):
        assert np.array_equal(np.concatenate([halves[0][k], halves[1][k]]), got[N + k]["tokens"])
    # where() says it: rows from step N on are marked
    d = gone[0]
    hits = resumed.where(d)
    assert hits and all(("excluded" in h) == (h["position"] >= N * 4) for h in hits)


def test_takedown_state_checks_and_refusals(tmp_path):
    ds, _ = write_marked(tmp_path / "m")
    ld = numpy_loader(ds, seq_len=8, batch_size=2)
    assert ld.state_dict()["excluded"] is None  # always present
    st = ld.state_dict()
    for bad in ([[0, 0, [150]]], [[0, 1, [1]]], [[-1, 0, [1]]], "x", [[0, 0, ["a"]]], [[0, 0]]):
        with pytest.raises(tokenfeed.StateError, match="excluded"):
            numpy_loader(ds, seq_len=8, batch_size=2).load_state_dict(dict(st, excluded=bad))
    with pytest.raises(ValueError, match="document ids"):
        ld.exclude([150])
    # kept by the C order: a pickled loader (a DataLoader worker) and a reweighted mixture keep it
    ld.exclude([4, 2, 4])
    assert ld.state_dict()["excluded"] == [[0, 0, [2, 4]]]
    assert pickle.loads(pickle.dumps(ld)).state_dict()["excluded"] == [[0, 0, [2, 4]]]
    mix = numpy_loader([ds, ds], weights=[1, 1], seq_len=8, batch_size=2)
    mix.exclude([7], source=1)
    mix.set_weights([1, 3])
    assert mix.state_dict()["excluded"] == [[0, 1, [7]]]
    # more takedowns than a state may hold: refused by exclude(), so every saved state loads again
    for _ in range(4095):
        ld.exclude([1])
    with pytest.raises(ValueError, match="TF_STATE_MAX_EXCLUDED"):
        ld.exclude([1])
    full = ld.state_dict()
    assert len(full["excluded"]) == 4096
    numpy_loader(ds, seq_len=8, batch_size=2).load_state_dict(full)


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("cp_rank", [0, 1])
def test_takedown_with_context_parallelism(tmp_path, thd, cp_rank):
    # The engine blanks the whole sample before each context-parallel rank's share is cut
    # from it, in the default layout and in THD: a rank's tokens of a taken-down document
    # are pad, their labels out of the loss, and everything else (the other documents, the
    # positions, cu_seqlens) is what the run without the takedown serves.
    ds, _ = write_marked(tmp_path / "m")  # token i + 1 is document i
    kw = dict(seq_len=16, batch_size=4, seed=2, loss_mask=True, position_ids=True, cp_size=2, cp_rank=cp_rank,
              cu_seqlens=thd)
    N, steps = 2, 8
    ref = numpy_loader(ds, **kw)
    plain = [{k: np.copy(v) for k, v in next(ref).items()} for _ in range(steps)]
    seen = sorted({int(d) - 1 for b in plain[N:] for d in np.unique(b["input_ids"]) if d > 0})
    gone = seen[::3]
    ld = numpy_loader(ds, **kw)
    got = [{k: np.copy(v) for k, v in next(ld).items()} for _ in range(N)]
    ld.exclude(gone)
    st = ld.state_dict()
    got += [{k: np.copy(v) for k, v in next(ld).items()} for _ in range(steps - N)]
    hit = 0
    for k in range(steps):
        p, g = plain[k], got[k]
        assert set(p) == set(g)
        if k < N:
            assert all(np.array_equal(p[key], g[key]) for key in p), k
            continue
        for key in ("input_ids", "labels"):
            out = np.isin(p[key].astype(np.int64) - 1, gone)
            hit += int(out.sum())
            assert np.array_equal(g[key], np.where(out, 0, p[key])), (k, key)
        lab_out = np.isin(p["labels"].astype(np.int64) - 1, gone)
        assert np.array_equal(g["loss_mask"].astype(bool), p["loss_mask"].astype(bool) & ~lab_out), k
        for key in set(p) - {"input_ids", "labels", "loss_mask"}:
            assert np.array_equal(p[key], g[key]), (k, key)
    assert hit  # the takedown did touch this rank's share
    resumed = numpy_loader(ds, **kw)
    resumed.load_state_dict(st)
    for k in range(N, steps):
        b = next(resumed)
        assert all(np.array_equal(b[key], got[k][key]) for key in b), k


def test_cli_takes_documents_down_in_a_saved_state(tmp_path, capsys):
    # `tokenfeed exclude` adds a takedown at the position a saved state resumes from: a resume
    # from the new state never serves those documents and serves everything else as the run
    # without them would; the state is checked against DATA when given, ids against its
    # documents; the file is replaced atomically, a symbolic link in its place is not followed
    ds, _ = write_marked(tmp_path / "m")  # token i + 1 is document i
    kw = dict(seq_len=16, batch_size=4, seed=2, loss_mask=True)
    N, steps = 3, 10
    ld = numpy_loader(ds, **kw)
    plain = [{k: v.copy() for k, v in next(ld).items()} for _ in range(steps)]
    run = numpy_loader(ds, **kw)
    take_tokens(run, N)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(run.state_dict()))
    seen = sorted({int(d) - 1 for b in plain[N:] for d in np.unique(b["tokens"]) if d > 0})
    gone = seen[::4]
    (tmp_path / "ids.txt").write_text("# takedown list\n" + "\n".join(map(str, gone[1:])) + "\n")
    new = tmp_path / "new.json"
    assert main(["exclude", str(state), "--ids", f"{gone[0]},{gone[0]}", "--from-file", str(tmp_path / "ids.txt"),
                 "--data", str(ds.paths[0]), "-o", str(new)]) == 0
    saved = json.loads(new.read_text())
    assert saved["excluded"] == [[N * 4, 0, gone]]
    assert {k: v for k, v in saved.items() if k != "excluded"} == \
        {k: v for k, v in json.loads(state.read_text()).items() if k != "excluded"}
    resumed = numpy_loader(ds, **kw)
    resumed.load_state_dict(saved)
    for k in range(N, steps):
        b = next(resumed)
        out = np.isin(plain[k]["tokens"].astype(np.int64) - 1, gone)
        assert not np.isin(b["tokens"].astype(np.int64) - 1, gone).any()
        assert np.array_equal(b["tokens"], np.where(out, 0, plain[k]["tokens"]))
        assert np.array_equal(b["loss_mask"].astype(bool), plain[k]["loss_mask"].astype(bool) & ~out[:, 1:])
    # a second takedown adds an entry; in place, through no symbolic link: a link at the state's
    # (or the output's) name is replaced by the new file, what it pointed to is left alone
    shared = tmp_path / "shared.json"
    shared.write_text(new.read_text())
    link = tmp_path / "link.json"
    link.symlink_to(shared)
    assert main(["exclude", str(link), "--ids", "5", "--in-place"]) == 0
    assert not link.is_symlink() and shared.read_text() == new.read_text()
    assert json.loads(link.read_text())["excluded"] == [[N * 4, 0, gone], [N * 4, 0, [5]]]
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    out_link = tmp_path / "out.json"
    out_link.symlink_to(target)
    assert main(["exclude", str(new), "--ids", "6", "-o", str(out_link)]) == 0
    assert target.read_text() == "keep" and not out_link.is_symlink()
    assert json.loads(out_link.read_text())["excluded"][-1] == [N * 4, 0, [6]]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no temporary left behind
    capsys.readouterr()
    # hostile input: each refused with one line naming what is wrong, nothing written
    before = new.read_text()
    for argv, msg in [
        (["--ids", "150", "--data", str(ds.paths[0])], "0 to 149"),  # past the documents
        (["--ids", "-1"], "not a document id"),
        (["--ids", "1.5"], "not a document id"),
        (["--ids", str(1 << 64)], "2**64"),
        (["--ids", "1", "--source", "1"], "reads 1 source"),
        ([], "give the documents"),
        (["--ids", "1", "--data", str(tmp_path / "other")], "other"),
    ]:
        assert main(["exclude", str(new), *argv, "--in-place"]) == 1, argv
        assert msg in capsys.readouterr().err, argv
        assert new.read_text() == before
    # a state whose data differs (another dataset): refused, as a resume refuses it
    other, _ = write_marked(tmp_path / "other", n=140, seed=1)
    assert main(["exclude", str(new), "--ids", "1", "--data", str(other.paths[0]), "-o", str(tmp_path / "x.json")]) == 1
    assert "fingerprint" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    for text, msg in [("{", "not JSON"), ('{"a": 1}', "not a loader state"),
                      (json.dumps(dict(saved, excluded=[[0, 0, [3, 2]]])), "ascending"),
                      (json.dumps(dict(saved, excluded="x")), "not a list"),
                      ('{"config": {}, "position": 0, "position": 1}', "twice")]:
        bad.write_text(text)
        assert main(["exclude", str(bad), "--ids", "1", "-o", str(tmp_path / "x.json")]) == 1
        assert msg in capsys.readouterr().err, text
    assert not (tmp_path / "x.json").exists()
    # past what a state may hold: refused before anything is written
    bad.write_text(json.dumps(dict(saved, excluded=[[0, 0, [1]]] * 4096)))
    assert main(["exclude", str(bad), "--ids", "2", "--in-place"]) == 1
    assert "more takedowns than a state may" in capsys.readouterr().err


def test_convert_parquet_with_meta(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from conftest import tokenizer_json

    texts = [f"document number {i} says hello" for i in range(40)]
    tok = tokenizer_json(tmp_path, texts)
    pq.write_table(pa.table({"text": texts, "lang": [LANGS[i % 5] for i in range(40)],
                             "score": [i / 10 for i in range(40)]}), tmp_path / "in.parquet", row_group_size=16)
    assert main(["convert", str(tmp_path / "in.parquet"), str(tmp_path / "ds"), "--tokenizer", tok,
                 "--meta", "lang,score", "--workers", "1"]) == 0
    ds = tokenfeed.open(tmp_path / "ds")
    assert ds.columns().values("score", [0, 39]) == [0.0, 3.9]
    assert ds.filter("lang == 'de'").document_ids.tolist() == [i for i in range(40) if i % 5 == 1]
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "in.parquet"), str(tmp_path / "ds2"), "--tokenizer", tok, "--meta", "nope",
                 "--workers", "1"]) == 1
    assert "no column 'nope' for --meta" in capsys.readouterr().err


def test_columns_of_a_megatron_pair_live_beside_its_prefix_however_it_is_named(tmp_path):
    """The pair is named by its prefix, its .bin or its .idx: its columns are PREFIX.columns each
    time, where the open found the pair, and a view opened by another name reads them."""
    docs = [np.arange(1 + k, 5 + k, dtype=np.uint16) for k in range(6)]
    prefix = tmp_path / "mg"
    write_megatron(prefix, docs)
    for name in ("mg", "mg.bin", "mg.idx"):
        ds = tokenfeed.open(tmp_path / name)
        assert ds.format == "megatron" and ds.columns_path == f"{prefix}.columns", name
    tokenfeed.open(tmp_path / "mg.idx").attach_columns([{"doc_index": k, "keep": k % 2} for k in range(6)])
    assert os.path.exists(f"{prefix}.columns") and not os.path.exists(f"{prefix}.idx.columns")
    for name in ("mg", "mg.bin"):
        assert tokenfeed.open(tmp_path / name).filter("keep == 1").document_ids.tolist() == [1, 3, 5]


def test_columns_beside_a_bin_whose_idx_is_not_megatrons_are_the_files_own(tmp_path):
    """x.idx beside x.bin that is not Megatron's (another magic, a directory, a FIFO) leaves x.bin
    the file it is: its columns are x.bin.columns, as the open read x.bin, never x.columns; and a
    pair opened as another format (format="raw") is the file it was given."""
    write_llmc(tmp_path / "f.bin", np.arange(7, 17, dtype=np.uint16))
    (tmp_path / "f.idx").write_bytes(b"a sidecar of some other tool, not MMIDIDX")
    ds = tokenfeed.open(tmp_path / "f.bin")
    assert ds.format == "llm.c" and ds.columns_path == f"{tmp_path}/f.bin.columns"
    ds.attach_columns([{"doc_index": 0, "tag": "a"}])
    assert tokenfeed.open(tmp_path / "f.bin").columns().values("tag", [0]) == ["a"]
    os.unlink(tmp_path / "f.idx")
    os.mkdir(tmp_path / "f.idx")  # a directory named like the companion
    assert tokenfeed.open(tmp_path / "f.bin").columns_path == f"{tmp_path}/f.bin.columns"
    write_megatron(tmp_path / "mg", [np.arange(1, 9, dtype=np.uint16)])
    raw = tokenfeed.open(tmp_path / "mg.bin", format="raw", dtype="uint16")
    assert raw.format == "raw" and raw.columns_path == f"{tmp_path}/mg.bin.columns"
    # a FIFO named like the companion is never opened for its bytes: a child, so a hang fails
    os.rmdir(tmp_path / "f.idx")
    os.mkfifo(tmp_path / "f.idx")
    code = f"import tokenfeed; print(tokenfeed.open({str(tmp_path / 'f.bin')!r}).columns_path)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TOKENFEED_CATALOG_DIR": "off"})
    assert r.returncode == 0 and r.stdout.strip() == f"{tmp_path}/f.bin.columns", r.stdout + r.stderr


def test_columns_path_of_links_files_beside_pairs_urls_and_missing_names(tmp_path):
    """A linked pair's columns sit beside the names given (the links), as its files are read
    there; a file named like the prefix beside a pair is that file; a URL or a name with nothing
    there yet keeps its name's rule."""
    write_megatron(tmp_path / "real", [np.arange(1, 9, dtype=np.uint16)])
    os.symlink(tmp_path / "real.bin", tmp_path / "link.bin")
    os.symlink(tmp_path / "real.idx", tmp_path / "link.idx")
    for name in ("link", "link.bin", "link.idx"):
        assert tokenfeed.open(tmp_path / name).columns_path == f"{tmp_path}/link.columns", name
    write_megatron(tmp_path / "x", [np.arange(1, 9, dtype=np.uint16)])
    write_llmc(tmp_path / "x", np.arange(7, 17, dtype=np.uint16))  # a file of its own beside x.bin/x.idx
    ds = tokenfeed.open(tmp_path / "x")
    assert ds.format == "llm.c" and ds.columns_path == f"{tmp_path}/x.columns"
    assert _views.columns_path([str(tmp_path / "nothing.bin")]) == f"{tmp_path}/nothing.bin.columns"
    assert _views.columns_path(["s3://bucket/mg.bin"]) == "s3://bucket/mg.bin.columns"
    assert _views.columns_path([str(tmp_path / "real.idx")]) == f"{tmp_path}/real.columns"

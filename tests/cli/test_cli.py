"""The ``tokenfeed`` command line: convert (text and token formats), inspect, verify.

Text conversion uses a BPE tokenizer trained here, offline, on the generated corpus.
Megatron and llm.c inputs are written following their published layouts
(megatron/core/datasets/indexed_dataset.py, llm.c dev/data/data_common.py).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from typing import Any, List, Sequence

import numpy as np
import pytest

import tokenfeed
from conftest import assert_docs_equal, bpe_tokenizer, documents, tokenizer_json, write_llmc, write_megatron
from tokenfeed.cli import main

tokenizers = pytest.importorskip("tokenizers")

WORDS = ("the quick brown fox jumps over a lazy dog while data loaders feed tokens to hungry gpus "
         "every epoch shuffles samples and resume restores the exact stream").split()


def corpus(n: int, seed: int = 0) -> List[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        k = int(rng.integers(1, 120))
        docs.append(" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=k)) + ".")
    return docs


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> str:
    return tokenizer_json(tmp_path_factory.mktemp("tok"), corpus(500, seed=1))


def vocab_of(tok_path: str) -> int:
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(tok_path).get_vocab_size(with_added_tokens=True))


def run_cli(args: Sequence[str], capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def expected_docs(tok_path: str, texts: Sequence[str], eod: int | None) -> List[np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    out = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        out.append(np.array(ids + ([eod] if eod is not None else []), dtype=np.int64))
    return out


def write_jsonl(path, texts: Sequence[str], field: str = "text") -> None:
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"id": 0, field: t}) + "\n")


# --------------------------------------------------------------------------- convert text


def test_convert_jsonl_inspect_verify(tmp_path, tok_path, capsys):
    texts = corpus(1200)
    write_jsonl(tmp_path / "a.jsonl", texts[:700])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:  # .gz is read too
        for t in texts[700:]:
            f.write(json.dumps({"text": t}) + "\n")
    out = tmp_path / "ds"
    # --chunk-mb 0.01 cuts a.jsonl into many byte-range chunks; 2 workers exercise the pool
    rc, stdout, err = run_cli(["convert", tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", out, "--tokenizer",
                               tok_path, "--workers", "2", "--shard-tokens", "20000", "--chunk-mb", "0.01"], capsys)
    assert rc == 0, err
    assert "<|endoftext|>" in err and "wrote" in stdout
    ds = tokenfeed.open(out)
    eod = 1
    assert ds.vocab_size == vocab_of(tok_path) and ds.dtype == np.uint16 and ds.num_files > 1
    assert_docs_equal(documents(ds), expected_docs(tok_path, texts, eod))
    assert not os.path.exists(out / ".tokenfeed-convert")

    rc, stdout, err = run_cli(["inspect", out, "--seq-len", "64"], capsys)
    assert rc == 0, err
    for s in ("format        tokenfeed", f"documents     {len(texts):,}", "uint16", ds.fingerprint,
              "packing (concat, seq_len 64)", "samples per epoch", "|"):
        assert s in stdout
    rc, stdout, err = run_cli(["inspect", out, "--seq-len", "64", "--json"], capsys)
    info = json.loads(stdout)
    assert info["num_tokens"] == ds.num_tokens and info["vocab_size"] == ds.vocab_size
    assert sum(h["documents"] for h in info["document_length"]["histogram"]) == len(texts)
    assert sum(h["tokens"] for h in info["document_length"]["histogram"]) == ds.num_tokens
    pk = info["packing"]
    assert pk["samples_per_epoch"] == (ds.num_tokens - 1) // 64
    assert pk["tokens_used"] + pk["tokens_dropped"] == ds.num_tokens
    assert pk["tokens_dropped"] == ds.num_tokens - (pk["samples_per_epoch"] * 64 + 1)
    lens = np.array([len(d) for d in documents(ds)])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    split = (starts // 64) != ((starts + lens - 1) // 64)
    assert abs(pk["documents_split"] - split.mean()) < 0.05  # the library counts the shared label token too
    for mode in ("best_fit", "document"):
        rc, stdout, err = run_cli(["inspect", out, "--seq-len", "64", "--packing", mode, "--json"], capsys)
        if rc == 1 and "not available" in err:
            continue
        assert rc == 0, err
        pk = json.loads(stdout)["packing"]
        assert pk["mode"] == mode and pk["samples_per_epoch"] > 0
        assert pk["tokens_used"] + pk["tokens_dropped"] == ds.num_tokens

    rc, stdout, err = run_cli(["verify", out, "--threads", "2"], capsys)
    assert rc == 0 and stdout.startswith("OK"), err


def test_convert_output_independent_of_workers_and_chunks(tmp_path, tok_path, capsys):
    texts = corpus(600, seed=3)
    write_jsonl(tmp_path / "in.jsonl", texts)
    fps = []
    for i, extra in enumerate([["--workers", "1"], ["--workers", "3", "--chunk-mb", "0.01"]]):
        rc, _, err = run_cli(["convert", tmp_path / "in.jsonl", tmp_path / f"o{i}", "--tokenizer", tok_path,
                              *extra], capsys)
        assert rc == 0, err
        fps.append(tokenfeed.open(tmp_path / f"o{i}").fingerprint)
    assert fps[0] == fps[1]


def test_convert_text_options(tmp_path, tok_path, capsys):
    texts = corpus(30, seed=5)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.txt").write_text("\n\n".join(texts[:10]) + "\n")
    (tmp_path / "docs" / "two.txt").write_text("\n\n\n".join(texts[10:]))
    rc, _, err = run_cli(["convert", tmp_path / "docs", tmp_path / "paras", "--tokenizer", tok_path,
                          "--paragraphs", "--eod-id", "0"], capsys)
    assert rc == 0, err
    assert_docs_equal(documents(tokenfeed.open(tmp_path / "paras")), expected_docs(tok_path, texts, 0))
    rc, _, err = run_cli(["convert", tmp_path / "docs", tmp_path / "files", "--tokenizer", tok_path, "--no-eod"],
                         capsys)
    assert rc == 0, err
    ds = tokenfeed.open(tmp_path / "files")
    assert ds.num_documents == 2
    assert_docs_equal(documents(ds), expected_docs(tok_path, ["\n\n".join(texts[:10]) + "\n",
                                                              "\n\n\n".join(texts[10:])], None))
    # another text field; empty and null texts are skipped (and counted)
    with open(tmp_path / "f.jsonl", "w") as f:
        for t in texts[:5] + ["", None] + texts[5:8]:
            f.write(json.dumps({"content": t}) + "\n")
    rc, _, err = run_cli(["convert", tmp_path / "f.jsonl", tmp_path / "field", "--tokenizer", tok_path,
                          "--text-field", "content"], capsys)
    assert rc == 0, err
    assert "skipped 2" in err
    assert_docs_equal(documents(tokenfeed.open(tmp_path / "field")), expected_docs(tok_path, texts[:8], 1))


def test_convert_parquet(tmp_path, tok_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = corpus(250, seed=7)
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet", row_group_size=60)
    rc, _, err = run_cli(["convert", tmp_path / "c.parquet", tmp_path / "pq", "--tokenizer", tok_path,
                          "--workers", "2"], capsys)
    assert rc == 0, err
    assert_docs_equal(documents(tokenfeed.open(tmp_path / "pq")), expected_docs(tok_path, texts, 1))


def test_convert_text_errors(tmp_path, tok_path, capsys):
    write_jsonl(tmp_path / "x.jsonl", ["hello"], field="body")
    rc, _, err = run_cli(["convert", tmp_path / "x.jsonl", tmp_path / "o", "--tokenizer", tok_path], capsys)
    assert rc == 1 and "no field 'text'" in err and "--text-field" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "o" / "tokenfeed.manifest")
    rc, _, err = run_cli(["convert", tmp_path / "x.jsonl", tmp_path / "o2", "--tokenizer", tmp_path / "nope.json"],
                         capsys)
    assert rc == 1 and "nope.json" in err
    rc, _, err = run_cli(["convert", tmp_path / "x.jsonl", tmp_path / "o3", "--tokenizer", tok_path,
                          "--text-field", "body", "--eod-id", str(vocab_of(tok_path))], capsys)
    assert rc == 1 and "outside the vocabulary" in err
    (tmp_path / "x.csv").write_text("a,b\n")
    rc, _, err = run_cli(["convert", tmp_path / "x.csv", tmp_path / "o4", "--tokenizer", tok_path], capsys)
    assert rc == 1 and "--input-format" in err


def test_eod_required_when_tokenizer_has_none(tmp_path, capsys):
    bpe_tokenizer(corpus(50), vocab_size=120, special_tokens=["[UNK]"], byte_level=False).save(str(tmp_path / "t.json"))
    write_jsonl(tmp_path / "x.jsonl", corpus(5))
    rc, _, err = run_cli(["convert", tmp_path / "x.jsonl", tmp_path / "o", "--tokenizer", tmp_path / "t.json"],
                         capsys)
    assert rc == 1 and "--eod-id" in err and "--no-eod" in err


def test_dtype_follows_vocab_size(tmp_path, tok_path, capsys):
    texts = corpus(20)
    write_jsonl(tmp_path / "x.jsonl", texts)
    # a vocabulary past 65536 must not be squeezed into uint16
    rc, _, err = run_cli(["convert", tmp_path / "x.jsonl", tmp_path / "big", "--tokenizer", tok_path,
                          "--vocab-size", "70000"], capsys)
    assert rc == 0, err
    ds = tokenfeed.open(tmp_path / "big")
    assert ds.dtype == np.uint32 and ds.vocab_size == 70000
    rc, _, err = run_cli(["convert", tmp_path / "x.jsonl", tmp_path / "exact", "--tokenizer", tok_path,
                          "--vocab-size", "65536"], capsys)
    assert rc == 0 and tokenfeed.open(tmp_path / "exact").dtype == np.uint16


def test_resume_after_crash(tmp_path, tok_path, capsys):
    """A conversion killed mid-way leaves nothing that opens; --resume reuses finished chunks."""
    texts = corpus(900, seed=11)
    write_jsonl(tmp_path / "a.jsonl", texts[:450])
    write_jsonl(tmp_path / "b.jsonl", texts[450:])
    out = tmp_path / "out"
    # run the conversion in a child and kill it after the first chunk is done
    code = f"""
import os, signal, tokenfeed.cli as cli, tokenfeed.sources._convert as conv
real = conv._tokenize_chunk
def crash_after_first(args):
    r = real(args)
    if args[0].seq == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return r
conv._tokenize_chunk = crash_after_first
cli.main(["convert", {str(tmp_path / 'a.jsonl')!r}, {str(tmp_path / 'b.jsonl')!r}, {str(out)!r},
          "--tokenizer", {tok_path!r}, "--workers", "1", "--chunk-mb", "0.01"])
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == -9, p.stderr
    assert os.path.isdir(out / ".tokenfeed-convert")
    assert not os.path.exists(out / "tokenfeed.manifest")
    with pytest.raises(tokenfeed.FormatError):
        tokenfeed.open(out)
    parts = sorted(os.listdir(out / ".tokenfeed-convert"))
    assert "part-000000" in parts and "part-000001" in parts
    done_mtime = os.stat(out / ".tokenfeed-convert" / "part-000000" / "done").st_mtime_ns

    # without --resume: refuse, say how to continue
    rc, _, err = run_cli(["convert", tmp_path / "a.jsonl", tmp_path / "b.jsonl", out, "--tokenizer", tok_path],
                         capsys)
    assert rc == 1 and "--resume" in err
    # changed options: refuse to mix
    rc, _, err = run_cli(["convert", tmp_path / "a.jsonl", tmp_path / "b.jsonl", out, "--tokenizer", tok_path,
                          "--resume", "--no-eod", "--chunk-mb", "0.01"], capsys)
    assert rc == 1 and "eod_id" in err
    rc, _, err = run_cli(["convert", tmp_path / "a.jsonl", tmp_path / "b.jsonl", out, "--tokenizer", tok_path,
                          "--resume", "--chunk-mb", "0.01"], capsys)
    assert rc == 0, err
    assert "resuming: 2 of" in err
    ds = tokenfeed.open(out)
    assert_docs_equal(documents(ds), expected_docs(tok_path, texts, 1))
    assert sorted(os.listdir(out)) == sorted(f["path"].rsplit("/", 1)[1] for f in ds.files()) + ["tokenfeed.catalog", "tokenfeed.manifest"]
    assert done_mtime  # the first chunk was not redone (its part dir is gone with the work dir now)


def test_existing_dataset_needs_overwrite(tmp_path, tok_path, capsys):
    write_jsonl(tmp_path / "x.jsonl", corpus(10))
    args = ["convert", tmp_path / "x.jsonl", tmp_path / "o", "--tokenizer", tok_path]
    assert run_cli(args, capsys)[0] == 0
    rc, _, err = run_cli(args, capsys)
    assert rc == 1 and "--overwrite" in err
    assert run_cli(args + ["--overwrite"], capsys)[0] == 0


# --------------------------------------------------------------------------- convert tokens


def test_convert_megatron_to_native(tmp_path, capsys):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50257, size=int(n)) for n in rng.integers(0, 300, size=400)]
    prefix = str(tmp_path / "my_text_document")
    write_megatron(prefix, docs)
    rc, out, err = run_cli(["convert", prefix, tmp_path / "nat", "--vocab-size", "50257", "--compression", "zstd",
                            "--level", "5"], capsys)
    assert rc == 0, err
    src, ds = tokenfeed.open(prefix), tokenfeed.open(tmp_path / "nat")
    assert ds.vocab_size == 50257 and ds.dtype == np.uint16 and all(f["compressed"] for f in ds.files())
    assert ds.num_documents == len(docs) and ds.num_tokens == src.num_tokens
    assert_docs_equal(documents(ds), [d.astype(np.int64) for d in docs])
    assert np.array_equal(ds.tokens(0, ds.num_tokens), src.tokens(0, src.num_tokens))
    assert run_cli(["verify", tmp_path / "nat"], capsys)[0] == 0


def test_convert_llmc_to_native(tmp_path, capsys):
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 50257, size=5000), rng.integers(0, 50257, size=3000)
    write_llmc(str(tmp_path / "train_000.bin"), a)
    write_llmc(str(tmp_path / "train_001.bin"), b)
    # llm.c records no vocabulary: computed as max id + 1, with a note
    rc, out, err = run_cli(["convert", tmp_path / "train_000.bin", tmp_path / "train_001.bin", tmp_path / "nat"],
                           capsys)
    assert rc == 0, err
    assert "max id + 1" in err
    ds = tokenfeed.open(tmp_path / "nat")
    assert ds.vocab_size == int(max(a.max(), b.max())) + 1
    assert ds.num_documents == 2  # one document per llm.c file
    assert np.array_equal(ds.tokens(0, ds.num_tokens).astype(np.int64), np.concatenate([a, b]))
    # version 7 (uint32, Llama 3 vocabulary) -> uint32 native
    big = rng.integers(0, 128256, size=2000)
    write_llmc(str(tmp_path / "l3.bin"), big, version=7)
    rc, _, err = run_cli(["convert", tmp_path / "l3.bin", tmp_path / "nat3", "--vocab-size", "128256"], capsys)
    assert rc == 0, err
    ds3 = tokenfeed.open(tmp_path / "nat3")
    assert ds3.dtype == np.uint32 and np.array_equal(ds3.tokens(0, 2000).astype(np.int64), big)


def test_convert_raw_and_npy(tmp_path, capsys):
    rng = np.random.default_rng(2)
    t = rng.integers(0, 1000, size=4096).astype(np.uint16)
    t.tofile(tmp_path / "tokens.bin")
    np.save(tmp_path / "t.npy", t.astype(np.int32))
    rc, _, err = run_cli(["convert", tmp_path / "tokens.bin", tmp_path / "raw", "--dtype", "uint16",
                          "--vocab-size", "1000"], capsys)
    assert rc == 0, err
    assert np.array_equal(tokenfeed.open(tmp_path / "raw").tokens(0, 4096), t)
    rc, _, err = run_cli(["convert", tmp_path / "t.npy", tmp_path / "npy", "--vocab-size", "1000"], capsys)
    assert rc == 0, err
    assert tokenfeed.open(tmp_path / "npy").fingerprint == tokenfeed.open(tmp_path / "raw").fingerprint
    # ids past --vocab-size are refused, and nothing that opens is left behind
    rc, _, err = run_cli(["convert", tmp_path / "t.npy", tmp_path / "bad", "--vocab-size", "10"], capsys)
    assert rc == 1 and "Traceback" not in err
    assert not os.path.exists(tmp_path / "bad" / "tokenfeed.manifest")
    # a raw file without --dtype: one clear line
    rc, _, err = run_cli(["convert", tmp_path / "tokens.bin", tmp_path / "o"], capsys)
    assert rc == 1 and err.count("\n") == 1 and "dtype" in err


# --------------------------------------------------------------------------- verify / inspect


def test_verify_names_the_corrupt_shard(tmp_path, make_dataset, capsys):
    ds = make_dataset(n_docs=200, vocab=1000, shard_tokens=10_000)
    files = [f["path"] for f in ds.files()]
    assert len(files) >= 3
    victim = files[1]
    with open(victim, "r+b") as f:  # flip one payload byte (the token section starts at 4096)
        f.seek(4096 + 123)
        b = f.read(1)
        f.seek(4096 + 123)
        f.write(bytes([b[0] ^ 0x40]))
    rc, out, err = run_cli(["verify", os.path.dirname(victim)], capsys)
    assert rc != 0
    assert os.path.basename(victim) in err and "FAILED" in err
    assert "OK" not in out


def test_verify_and_inspect_errors(tmp_path, capsys):
    rc, _, err = run_cli(["verify", tmp_path / "missing"], capsys)
    assert rc == 1 and "missing" in err and "Traceback" not in err
    (tmp_path / "junk.bin").write_bytes(b"\x01" * 100)
    rc, _, err = run_cli(["inspect", tmp_path / "junk.bin"], capsys)
    assert rc == 1 and err.startswith("tokenfeed: error:") and err.count("\n") == 1


def test_inspect_foreign_and_seq_len_too_long(tmp_path, capsys):
    write_llmc(str(tmp_path / "s.bin"), np.arange(100))
    rc, out, err = run_cli(["inspect", tmp_path / "s.bin"], capsys)
    assert rc == 0 and "llm.c" in out and "unknown" in out
    rc, out, err = run_cli(["inspect", tmp_path / "s.bin", "--seq-len", "1000"], capsys)
    assert rc == 1 and "seq_len" in err


def test_debug_shows_traceback(tmp_path, capsys):
    with pytest.raises(Exception):
        main(["--debug", "verify", str(tmp_path / "missing")])


# --------------------------------------------------------------------------- entry points


COMMANDS = ["convert", "merge", "inspect", "verify", "cache", "explain", "where", "index", "meta", "exclude", "bench", "build-info"]


def test_python_m_tokenfeed_help():
    p = subprocess.run([sys.executable, "-m", "tokenfeed", "--help"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    listed = [m.group(1) for m in re.finditer(r"^ {4}(\S+)", p.stdout, re.M)]
    assert listed == COMMANDS  # every command, in the order a user meets them
    for args in (["convert"], ["merge"], ["inspect"], ["verify"], ["cache"], ["cache", "show"], ["cache", "prune"],
                 ["explain"], ["where"], ["index"], ["meta"], ["meta", "attach"], ["meta", "show"], ["build-info"],
                 ["bench"]):
        p = subprocess.run([sys.executable, "-m", "tokenfeed", *args, "--help"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert f"usage: tokenfeed {' '.join(args)}" in p.stdout
    p = subprocess.run([sys.executable, "-m", "tokenfeed"], capture_output=True, text=True)
    assert p.returncode == 2 and "convert" in p.stdout


@pytest.mark.parametrize("args, says", [
    (["inspect", "{tmp}/missing"], "no such file"),
    (["verify", "{tmp}/missing"], "no such file"),
    (["merge", "{tmp}"], "nothing to merge"),
    (["convert", "{tmp}/missing.bin", "{tmp}/out"], "no such file"),
    (["cache", "show", "{tmp}/no-cache"], "cache directory"),
    (["cache", "prune", "{tmp}"], "--keep SIZE or --all"),
    (["cache", "prune", "{tmp}", "--keep", "5XB"], "cannot read '5XB' as a size"),
    (["inspect", "{tmp}", "--seq-len", "0"], "--seq-len"),
])
def test_errors_are_one_line(tmp_path, capsys, args, says):
    rc, out, err = run_cli([a.format(tmp=tmp_path) for a in args], capsys)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("tokenfeed: error: ") and says in err, err


def test_bench_delegates(monkeypatch, capsys):
    import types

    seen: List[Any] = []
    fake = types.ModuleType("tokenfeed_bench")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tokenfeed_bench", fake)
    assert main(["bench", "--seq-len", "8", "x"]) == 0
    assert seen == [["--seq-len", "8", "x"]]
    monkeypatch.setitem(sys.modules, "tokenfeed_bench", None)  # as if the package did not exist
    rc = main(["bench"])
    assert rc == 2 and "not available" in capsys.readouterr().err

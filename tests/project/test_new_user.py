"""What a new user meets first: files that are not tokens named as such, advice that can
be followed where it is shown (CLI flags in CLI messages, install hints without an
index), and no silent traps (an exhausted loader, a ramp inside one mixing window, heavy
padding, zstd blocks too large for a full shuffle)."""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

import tokenfeed
from tokenfeed.cli import cli_words, main


def run_cli(args, capsys):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def small(path, n_docs=50, doc_len=100, vocab=1000, **kw):
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, overwrite=True, **kw) as w:
        for i in range(n_docs):
            w.add_document((np.arange(doc_len) + i) % vocab)
    return str(path)


# ----------------------------------------------------------------------------- files


def test_an_empty_file_is_called_empty(tmp_path, capsys):
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(tokenfeed.FormatError, match=r"empty: the file is empty \(0 bytes\)"):
        tokenfeed.open(tmp_path / "empty")
    rc, _, err = run_cli(["inspect", tmp_path / "empty"], capsys)
    assert rc == 1 and "the file is empty" in err and err.count("\n") == 1


def test_text_and_images_are_named(tmp_path):
    (tmp_path / "notes.txt").write_text("These are licence terms.\nNot tokens at all.\n")
    with pytest.raises(tokenfeed.FormatError, match="the file is text, not tokens.*--tokenizer"):
        tokenfeed.open(tmp_path / "notes.txt")
    jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)) * 8
    (tmp_path / "cat.jpg").write_bytes(jpeg[:2048])
    with pytest.raises(tokenfeed.FormatError, match="the file is a JPEG image"):
        tokenfeed.open(tmp_path / "cat.jpg")
    # opened with a dtype, as asked, but not silently
    with pytest.warns(UserWarning, match="cat.jpg: opened as headerless tokens, but the file is a JPEG image"):
        ds = tokenfeed.open(tmp_path / "cat.jpg", dtype="uint16")
    assert ds.num_tokens == 1024
    with pytest.warns(UserWarning, match="the file is text"):
        tokenfeed.open(tmp_path / "notes.txt", dtype="uint8")
    raw = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(raw)  # real tokens: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenfeed.open(raw, dtype="uint16")


def test_a_dataset_with_no_documents_names_its_path(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "nothing", vocab_size=100):
        pass
    with pytest.raises(tokenfeed.FormatError, match=r"nothing: num_tokens: .*no token files"):
        tokenfeed.open(tmp_path / "nothing")


def test_convert_on_a_directory_of_licences_lists_formats_and_flags(tmp_path):
    from tokenfeed.sources._text import ConvertError, expand_inputs

    d = tmp_path / "licences"
    d.mkdir()
    (d / "LICENSE").write_text("MIT\n")
    (d / "COPYING.LGPL").write_text("LGPL\n")
    with pytest.raises(ConvertError) as e:
        expand_inputs([str(d)], None)
    for needle in ("--input-format text", "--input-format jsonl", "--input-format parquet", ".md", "LICENSE"):
        assert needle in str(e.value), needle
    assert expand_inputs([str(d)], "text") == [str(d / "COPYING.LGPL"), str(d / "LICENSE")]


def test_cache_show_on_a_fresh_machine(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENFEED_CACHE_DIR", str(tmp_path / "never-made"))
    rc, out, err = run_cli(["cache", "show"], capsys)
    assert rc == 0 and "nothing cached yet" in out and err == ""
    assert not (tmp_path / "never-made").exists()


# ----------------------------------------------------------------------------- advice


def test_cli_advice_names_cli_flags(tmp_path, capsys):
    raw = tmp_path / "train.bin"
    np.arange(5000, dtype=np.uint16).tofile(raw)
    (tmp_path / "noheader.bin").write_bytes(np.arange(5000, dtype=np.uint16).tobytes()[1:1001] + b"\x00")
    rc, _, err = run_cli(["inspect", tmp_path / "noheader.bin"], capsys)
    assert rc == 1 and "--dtype" in err and "dtype=" not in err, err
    rc, out, _ = run_cli(["inspect", raw, "--dtype", "uint16"], capsys)
    assert rc == 0
    assert cli_words('pass dtype= (e.g. dtype="uint16"); pass format= for others') == \
        "pass --dtype (e.g. --dtype uint16); pass --format for others"
    assert cli_words("mydtype=3, block_tokens <= 4096") == "mydtype=3, block_tokens <= 4096"


def test_debug_governs_tracebacks_for_every_command(tmp_path, capsys, monkeypatch):
    import tokenfeed.cli._build_info as cli

    def boom(a):
        raise RuntimeError("an unexpected failure")

    monkeypatch.setattr(cli, "cmd_build_info", boom)
    rc, _, err = run_cli(["build-info"], capsys)
    assert rc == 1 and err == "tokenfeed: error: RuntimeError: an unexpected failure (rerun with --debug for " \
                              "the traceback)\n"
    with pytest.raises(RuntimeError):
        main(["build-info", "--debug"])  # after the command too
    with pytest.raises(Exception):
        main(["verify", str(tmp_path / "missing"), "--debug"])


def test_install_hints_work_without_an_index():
    import tomllib

    from tokenfeed.common._extras import EXTRAS, pip_hint

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    for name, reqs in EXTRAS.items():
        assert list(reqs) == extras[name], name
    assert pip_hint("remote") == "pip install 'obstore>=0.6'"
    assert "tokenfeed[" not in pip_hint("datatrove")


def test_inspect_prints_the_maximum_id_and_warns_at_the_limits(tmp_path, capsys):
    ds = small(tmp_path / "d", vocab=1000)
    rc, out, err = run_cli(["inspect", ds], capsys)
    assert rc == 0 and "max token id  148" in out and "warning" not in err
    raw = tmp_path / "cut.bin"
    np.array([1, 2, 65535, 7] * 10, dtype=np.uint16).tofile(raw)
    rc, out, err = run_cli(["inspect", raw, "--dtype", "uint16"], capsys)
    assert rc == 0 and "max token id  65,535" in out and "largest uint16 value" in err
    rc, out, _ = run_cli(["inspect", raw, "--dtype", "uint16", "--json"], capsys)
    import json

    info = json.loads(out)
    assert info["max_token_id"] == 65535 and info["warnings"]


def _data_warnings(path, dtype):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tokenfeed.open(path, dtype=dtype)
    return [str(w.message) for w in seen if issubclass(w.category, tokenfeed.DataWarning)]


@pytest.fixture
def token_files(tmp_path):
    """The same GPT-2-sized ids written as uint16 and as uint32, and character ids as uint8."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 50257, size=60_000)
    paths = {w: str(tmp_path / f"{w}.bin") for w in ("uint8", "uint16", "uint32")}
    ids.astype(np.uint16).tofile(paths["uint16"])
    ids.astype(np.uint32).tofile(paths["uint32"])
    rng.integers(0, 65, size=60_000).astype(np.uint8).tofile(paths["uint8"])
    return paths


@pytest.mark.parametrize("written,given", [("uint32", "uint16"), ("uint32", "uint8"), ("uint16", "uint8"),
                                           ("uint16", "uint32")])
def test_a_wrong_dtype_on_a_headerless_file_is_named(token_files, written, given, capsys):
    """A headerless file read with the wrong dtype warns at open (DataWarning) and in inspect,
    naming the dtype the bytes look like, instead of handing out garbage ids silently."""
    (msg,) = _data_warnings(token_files[written], given)
    assert token_files[written] in msg and f"read as {given}" in msg and f'dtype="{written}"' in msg, msg
    rc, _, err = run_cli(["inspect", token_files[written], "--dtype", given], capsys)
    assert rc == 0 and f"--dtype {written}" in err and err.count(f"read as {given}, the bytes look like") == 1, err


def test_the_right_dtype_on_a_headerless_file_is_quiet(token_files, tmp_path):
    """The sample check stays quiet on honest data: the files above with their own dtype, the
    ids of the suite's generated datasets, and a native dataset (its header gives the dtype)."""
    for w, p in token_files.items():
        assert _data_warnings(p, w) == [], w
    ds = tokenfeed.open(small(tmp_path / "d", n_docs=400, doc_len=300, vocab=50257))
    np.asarray(ds.tokens(0, ds.num_tokens)).tofile(tmp_path / "suite.bin")
    assert _data_warnings(tmp_path / "suite.bin", ds.dtype.name) == []
    zipf = np.minimum(np.random.default_rng(1).zipf(1.2, size=50_000), 50256).astype(np.uint16)
    zipf.tofile(tmp_path / "zipf.bin")
    assert _data_warnings(tmp_path / "zipf.bin", "uint16") == []


def test_a_dtype_that_an_npy_header_contradicts_is_refused(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.arange(5000, dtype=np.uint16))
    with pytest.raises(ValueError) as ei:
        tokenfeed.open(p, dtype="uint32")
    assert str(p) in str(ei.value) and "uint16" in str(ei.value) and "uint32" in str(ei.value)
    assert tokenfeed.open(p, dtype="uint16").dtype == np.uint16
    assert tokenfeed.open(p).dtype == np.uint16
    # a set of them: refused when listed, and again when opened from the catalog the first open kept
    d = tmp_path / "set"
    d.mkdir()
    for i in range(3):
        np.save(d / f"part-{i}.npy", np.arange(3000, dtype=np.uint16))
    for _ in range(2):
        with pytest.raises(ValueError, match="header says uint16"):
            tokenfeed.open(d, dtype="uint32")


def test_inspect_blames_the_dtype_passed_for_a_uint8_maximum(token_files, capsys):
    rc, _, err = run_cli(["inspect", token_files["uint16"], "--dtype", "uint8"], capsys)
    assert rc == 0 and "largest uint8 value" in err and "need uint16" in err and "--dtype uint8" in err, err
    assert "need uint32" not in err


def test_convert_with_a_wrong_dtype_names_the_flag(token_files, tmp_path, capsys):
    """convert --dtype uint32 on uint16 tokens: without --vocab-size it does not record a vocabulary
    of billions; with one, the id error names --dtype."""
    rc, _, err = run_cli(["convert", token_files["uint16"], tmp_path / "o1", "--dtype", "uint32"], capsys)
    assert rc != 0 and "--dtype uint16" in err and not os.path.exists(tmp_path / "o1" / "tokenfeed.manifest"), err
    rc, _, err = run_cli(["convert", token_files["uint16"], tmp_path / "o2", "--dtype", "uint32", "--vocab-size",
                          "50257"], capsys)
    assert rc != 0 and "--dtype uint32" in err and "vocab_size" in err, err
    rc, out, err = run_cli(["convert", token_files["uint16"], tmp_path / "o3", "--dtype", "uint16"], capsys)
    assert rc == 0 and "dtype uint16" in out, err


def test_a_whole_checkpoint_given_to_load_state_dict_says_where_the_state_is(tmp_path):
    """The loader's entry of a training checkpoint is named (as `tokenfeed explain --state` finds
    it), instead of "not a tokenfeed loader state"."""
    l = tokenfeed.Loader(small(tmp_path / "d"), seq_len=16, batch_size=2, output="numpy")
    next(l)
    for key in ("loader", "train_dataloader"):
        ckpt = {"model": {"w": [1.0]}, "step": 7, key: l.state_dict()}
        with pytest.raises(tokenfeed.StateError) as ei:
            tokenfeed.Loader(small(tmp_path / "d"), seq_len=16, batch_size=2).load_state_dict(ckpt)
        assert f"checkpoint[{key!r}]" in str(ei.value), str(ei.value)
    with pytest.raises(tokenfeed.StateError, match="not a tokenfeed loader state"):
        l.load_state_dict({"model": {"w": [1.0]}})


# ----------------------------------------------------------------------------- compressed data


def test_zstd_blocks_default_to_a_full_shuffle_size_and_convert_sets_them(tmp_path, capsys):
    ds = tokenfeed.open(small(tmp_path / "z", n_docs=100, doc_len=300, compression="zstd"))
    assert [f["compressed"] for f in ds.files()] == [True]
    def block_tokens(path):  # the block size is in the shard header (docs/format.md)
        shard = next(os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".tfs") or "shard" in f)
        with open(shard, "rb") as fh:
            head = fh.read(104)
        return int.from_bytes(head[96:104], "little")

    assert block_tokens(str(tmp_path / "z")) == 2048
    rc, out, _ = run_cli(["convert", tmp_path / "z", tmp_path / "z512", "--compression", "zstd",
                          "--block-tokens", "512"], capsys)
    assert rc == 0, out
    assert block_tokens(str(tmp_path / "z512")) == 512
    a, b = tokenfeed.open(tmp_path / "z"), tokenfeed.open(tmp_path / "z512")
    assert np.array_equal(a.tokens(0, a.num_tokens), b.tokens(0, b.num_tokens))
    rc, _, err = run_cli(["convert", tmp_path / "z", tmp_path / "z2", "--block-tokens", "512"], capsys)
    assert rc == 1 and "--compression zstd" in err
    rc, _, err = run_cli(["convert", tmp_path / "z", tmp_path / "z3", "--compression", "zstd",
                          "--block-tokens", "0"], capsys)
    assert rc == 1 and "--block-tokens 0" in err


def test_zstd_advice_can_be_followed_from_where_it_is_shown(tmp_path):
    z = small(tmp_path / "z", n_docs=400, doc_len=300, compression="zstd", block_tokens=4096)
    with pytest.warns(tokenfeed.PerformanceWarning) as rec:
        ld = tokenfeed.Loader(z, seq_len=15, batch_size=4, output="numpy", zstd_cache_bytes=4 * 4096 * 2)
    msg = str(rec[0].message)
    assert "shuffle='block'" in msg and "tokenfeed convert DIR NEW --compression zstd --block-tokens 30" in msg
    ld.close()


# ----------------------------------------------------------------------------- silent traps


def test_an_exhausted_loader_is_not_silently_empty(tmp_path):
    ld = tokenfeed.Loader(small(tmp_path / "d"), seq_len=64, batch_size=4, epochs=1, output="numpy")
    first = sum(1 for _ in ld)
    assert first > 0
    with pytest.warns(UserWarning, match=r"exhausted.*epochs=E.*itertools.islice") as rec:
        second = sum(1 for _ in ld)
    assert second == 0 and rec[0].filename == __file__
    fresh = tokenfeed.Loader(small(tmp_path / "d"), seq_len=64, batch_size=4, epochs=1, output="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a loader with batches left says nothing
        next(iter(fresh))
        iter(fresh)
    fresh.close()


def test_a_linear_ramp_inside_the_mixing_window_warns(tmp_path):
    a, b = small(tmp_path / "a"), small(tmp_path / "b")
    ramp = tokenfeed.WeightSchedule([(0, [0.9, 0.1]), (100, [0.2, 0.8])], interpolation="linear")
    with pytest.warns(UserWarning, match=r"ramp from step 0 to 100 covers 400 positions.*mix_window=1000.*"
                                         r"Pass mix_window=50 or less") as rec:
        tokenfeed.Loader([a, b], weights=ramp, seq_len=16, batch_size=4, output="numpy")
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenfeed.Loader([a, b], weights=ramp, seq_len=16, batch_size=4, output="numpy", mix_window=50)
        steps = tokenfeed.WeightSchedule([(0, [0.9, 0.1]), (100, [0.2, 0.8])])  # constant: nothing to flatten
        tokenfeed.Loader([a, b], weights=steps, seq_len=16, batch_size=4, output="numpy")


def test_heavy_padding_warns_and_stats_say_how_much(tmp_path):
    d = small(tmp_path / "d", doc_len=100)
    with pytest.warns(UserWarning, match=r"packing='document' at seq_len=4096 pads 98% .*average 100 tokens"):
        ld = tokenfeed.Loader(d, seq_len=4096, batch_size=2, packing="document", output="numpy")
    assert ld.packing_stats()["padding_fraction"] > 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenfeed.Loader(d, seq_len=64, batch_size=2, packing="best_fit", output="numpy")


def test_convert_text_with_block_tokens(tmp_path, capsys):
    from conftest import tokenizer_json

    texts = [f"document {i} says the quick brown fox jumps over the lazy dog {i * 7}" for i in range(300)]
    tok = tokenizer_json(tmp_path, texts)
    (tmp_path / "corpus.jsonl").write_text("".join('{"text": "%s"}\n' % t for t in texts))
    rc, out, err = run_cli(["convert", tmp_path / "corpus.jsonl", tmp_path / "out", "--tokenizer", tok,
                            "--compression", "zstd", "--block-tokens", "64", "--workers", "1"], capsys)
    assert rc == 0, err
    ds = tokenfeed.open(tmp_path / "out")
    shard = ds.files()[0]["path"]
    with open(shard, "rb") as fh:
        assert int.from_bytes(fh.read(104)[96:104], "little") == 64


def test_an_open_with_dtype_of_a_headerless_set_does_not_list_its_files(tmp_path, monkeypatch):
    """dtype= is checked against headers only where a file has one: a set of headerless files
    (opened from a catalog at start-up, perhaps 10^6 of them) makes no per-file list for it."""
    for i in range(3):
        np.arange(1000, dtype=np.uint16).tofile(tmp_path / f"s{i}.bin")
    calls = []
    files = tokenfeed.Dataset.files
    monkeypatch.setattr(tokenfeed.Dataset, "files", lambda self: calls.append(1) or files(self))
    ds = tokenfeed.open(str(tmp_path / "*.bin"), dtype="uint16")
    assert ds.num_files == 3 and calls == []

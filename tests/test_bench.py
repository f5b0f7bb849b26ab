"""The benchmark's plumbing: arguments, dataset generation and reuse, JSON shape, peers reported.

Never asserts on timings: only that figures exist, are positive and are wired together.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tokenfeed
from tokenfeed import bench

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def test_parse_defaults_and_quick() -> None:
    a = bench.parse_args([])
    assert (a.seq_len, a.batch_size, a.tokens) == (2048, 8, 500_000_000)
    assert a.doc_length.startswith("lognormal")
    q = bench.parse_args(["--quick"])
    assert q.quick and q.tokens < a.tokens and q.seconds < a.seconds
    assert {"tokenfeed", "ceiling", "baselines", "peers"} <= q.groups


def test_parse_counts_groups_and_errors(capsys: pytest.CaptureFixture) -> None:
    a = bench.parse_args(["--tokens", "2M", "--only", "tokenfeed,ceiling", "--no-peers"])
    assert a.tokens == 2_000_000 and a.groups == {"tokenfeed", "ceiling"}
    assert bench.parse_args(["--tokens", "1e6", "--skip", "peers,scaling"]).groups.isdisjoint({"peers", "scaling"})
    for bad in (["--only", "nonsense"], ["--doc-length", "gamma:1"], ["--seq-len", "0"], ["--tokens", "100"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert "--doc-length" in capsys.readouterr().err or True


def test_doc_length_specs() -> None:
    assert bench._parse_doc_length("fixed:100") == ("fixed", 100)
    assert bench._parse_doc_length("uniform:1:9") == ("uniform", 1, 9)
    rng = np.random.default_rng(0)
    x = bench._doc_lengths(rng, 1000, bench._parse_doc_length("lognormal:5:1"))
    assert x.min() >= 1 and 50 < np.median(x) < 400


def test_generate_is_reused_and_identical_three_ways(tmp_path) -> None:
    kw = dict(tokens=200_000, vocab_size=1000, doc_length="lognormal:4:1", zipf=1.1, seed=3, log=lambda m: None)
    m1 = bench.generate_dataset(str(tmp_path / "g"), **kw)
    assert not m1["reused"]
    m2 = bench.generate_dataset(str(tmp_path / "g"), **kw)
    assert m2["reused"]
    ds, zs = tokenfeed.open(m1["native"]), tokenfeed.open(m1["zstd"])
    raw = np.fromfile(m1["raw"], dtype=m1["dtype"])
    assert ds.num_tokens == zs.num_tokens == len(raw) == 200_000
    assert np.array_equal(ds.tokens(0, ds.num_tokens), raw)
    assert np.array_equal(zs.tokens(1000, 5000), raw[1000:5000])
    assert ds.num_documents == m1["documents"] > 10
    assert int(raw.max()) < 1000
    # a different spec regenerates
    m3 = bench.generate_dataset(str(tmp_path / "g"), **dict(kw, seed=4))
    assert not m3["reused"]


def test_sparse_llmc_shards_open(tmp_path) -> None:
    names = bench.make_sparse_llmc(str(tmp_path / "s"), 10**7, 4)
    ds = tokenfeed.open(names)
    assert ds.num_tokens == 10**7 and ds.num_files == 4
    assert all(os.path.getsize(n) == 1024 + 2 * 25 * 10**5 for n in names)


def test_drop_cache_is_harmless(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 10000)
    assert bench.drop_cache([str(p), str(tmp_path / "missing")]) == 1
    assert p.read_bytes() == b"x" * 10000


def test_plot_message_without_matplotlib_or_rows(tmp_path) -> None:
    err = bench.write_plot({"results": []}, str(tmp_path / "x.png"))
    assert isinstance(err, str)  # either "matplotlib is not installed" or "nothing to plot"


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("bench")
    out = d / "out.json"
    argv = ["--tokens", "400000", "--seq-len", "128", "--batch-size", "4", "--seconds", "0.05", "--warmup", "2",
            "--cache-dir", str(d / "cache"), "--json", str(out), "--skip", "scaling", "-q"]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--plot", str(d / "chart.png")]
    # through the thin script, as a user runs it
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_tokens.py")
    p = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(out.read_text())
    rep["_stdout"] = p.stdout
    rep["_dir"] = str(d)
    return rep


def test_tiny_run_json_shape(tiny_report: dict) -> None:
    r = tiny_report
    assert r["schema"] == bench.SCHEMA_VERSION
    for k in ("cpu_model", "cores", "memory_gib", "kernel", "python"):
        assert k in r["machine"]
    assert r["config"]["seq_len"] == 128 and r["config"]["batch_size"] == 4
    assert r["dataset"]["generated"] and r["dataset"]["tokens"] == 400000
    names = {x["name"]: x for x in r["results"]}
    ref = names["tokenfeed"]
    assert ref["status"] == "ok" and ref["ratio_to_tokenfeed"] == pytest.approx(1.0)
    for row in r["results"]:
        assert row["status"] in ("ok", "skipped", "failed", "not installed"), row
        if row["status"] == "ok":
            for k in ("tokens_per_s", "batches_per_s", "p50_ms", "p99_ms", "cpu_s_per_btok", "peak_rss_mb"):
                assert row[k] >= 0, (row["name"], k)
            assert row["tokens_per_s"] > 0 and row["batches"] >= 1
        else:
            assert row["reason"], row  # never silently dropped
    assert set(r["goals"]) == {"warm_vs_ceiling", "warm_vs_nanogpt", "cold_io_uring_vs_mmap"}
    assert any(x["cache"] == "cold" for x in r["results"])
    assert "zstd" in r and r["zstd"]["status"] == "ok" and r["zstd"]["ratio"] > 0
    assert r["restore"] and any(x.get("loader") == "tokenfeed" and x["status"] == "ok" for x in r["restore"])
    assert "tokens/s" in r["_stdout"]


@pytest.mark.skipif(not HAVE_TORCH, reason="the torch baselines need torch")
def test_tiny_run_has_three_baselines(tiny_report: dict) -> None:
    assert len(tiny_report["baselines_ok"]) >= 3, tiny_report["baselines_ok"]
    names = set(tiny_report["baselines_ok"])
    assert "nanoGPT get_batch" in names and "DataLoader workers=0" in names
    dl = [x for x in tiny_report["results"] if x["name"].startswith("DataLoader")]
    assert {x["config"]["workers"] for x in dl} == {0, 2, 4}
    assert any("no-op without CUDA" in x["note"] for x in dl if x["config"]["pin_memory"]) or \
        tiny_report["machine"]["build_info"]["cuda"]["usable"]


def test_every_peer_is_reported(tiny_report: dict) -> None:
    peers = [x for x in tiny_report["results"] if x["group"] == "peer"]
    assert len(peers) == len(bench.PEERS)
    for p in peers:
        assert p["status"] == "ok" or p["reason"]
        if p["status"] == "ok":
            assert p["note"]  # the recommended configuration it ran with


def test_ceiling_reported(tiny_report: dict) -> None:
    rows = [x for x in tiny_report["results"] if x["group"] == "ceiling"]
    assert len(rows) == 2
    for x in rows:
        assert x["status"] == "ok" or "compil" in x["reason"] or "compiler" in x["reason"]


def test_plot_written(tiny_report: dict) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib not installed")
    assert os.path.getsize(os.path.join(tiny_report["_dir"], "chart.png")) > 1000


def test_data_option_reads_existing_raw(tmp_path) -> None:
    raw = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 500, 300_000, dtype=np.uint16).tofile(raw)
    out = tmp_path / "o.json"
    rc = bench.main(["--data", str(raw), "--dtype", "uint16", "--seq-len", "64", "--batch-size", "2",
                     "--seconds", "0.05", "--warmup", "1", "--only", "tokenfeed,ceiling", "-q",
                     "--cache-dir", str(tmp_path / "c"), "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert not r["dataset"]["generated"] and r["dataset"]["tokens"] == 300_000
    assert {"tokenfeed"} <= {x["name"] for x in r["results"] if x["status"] == "ok"}
    z = [x for x in r["results"] if x["name"] == "tokenfeed zstd data"][0]
    assert z["status"] == "skipped" and z["reason"]

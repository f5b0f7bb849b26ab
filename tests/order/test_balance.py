"""Balanced rows across data-parallel ranks (docs/balance.md): every step holds the same rows
as without balancing, the rule is computed from the step alone (so every rank agrees without
talking), the busiest rank's cost falls close to the mean, and resume and elastic resume stay
exact with balancing on."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core
from remote_util import bucket, moto  # noqa: F401  (fixtures)

L = 256
G = 16
MODES = {"tokens": _core.BALANCE_TOKENS, "attention": _core.BALANCE_ATTENTION}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """Long-tailed documents (log-normal, capped at 5 x seq_len) as best-fit packing sees them."""
    rng = np.random.default_rng(7)
    lens = np.minimum(5 * L, np.maximum(1, rng.lognormal(np.log(60), 1.5, size=1500).astype(np.int64)))
    path = tmp_path_factory.mktemp("bal") / "ds"
    with tokenfeed.DatasetWriter(path, vocab_size=5000) as w:
        for n in lens:
            w.add_document(rng.integers(1, 5000, size=int(n)))
    return tokenfeed.open(path)


def loader(ds, R, r, **kw):
    kw.setdefault("packing", "best_fit")
    kw.setdefault("seq_len", L)
    return tokenfeed.Loader(ds, batch_size=G // R, rank=r, world_size=R, output="numpy", num_threads=1, pad_id=0,
                            **kw)


def take(l, n, key="tokens"):
    return [next(l)[key].copy() for _ in range(n)]


def ranks(ds, R, n, start=0, **kw):
    """n batches of every rank, from position start: out[r][k]."""
    out = []
    for r in range(R):
        l = loader(ds, R, r, **kw)
        if start:
            l.load_state_dict({**l.state_dict(), "position": start})
        out.append(take(l, n))
        l.close()
    return out


def rows(batches):
    return sorted(bytes(x) for b in batches for x in b)


@pytest.mark.parametrize("mode", ["attention", "tokens"])
def test_each_step_holds_the_same_rows(ds, mode):
    plain, bal = ranks(ds, 8, 6), ranks(ds, 8, 6, balance=mode)
    moved = 0
    for k in range(6):
        assert rows(p[k] for p in plain) == rows(b[k] for b in bal)
        moved += any(not np.array_equal(plain[r][k], bal[r][k]) for r in range(8))
    assert moved  # balancing did give some rows to other ranks


def test_micro_batches_hold_the_same_rows_per_step(ds):
    M = 3
    plain, bal = ranks(ds, 4, 2 * M), ranks(ds, 4, 2 * M, balance="attention", balance_micro_batches=M)
    for s in range(2):
        step = range(s * M, (s + 1) * M)
        assert rows(p[k] for p in plain for k in step) == rows(b[k] for b in bal for k in step)


def test_rule_is_a_partition_of_the_step(ds):
    l = loader(ds, 1, 0)
    o = l._order
    for mode in (_core.BALANCE_NONE, _core.BALANCE_TOKENS, _core.BALANCE_ATTENTION):
        for M in (1, 2):
            out = o.balance(M * G * 5, 4, M, mode)
            assert sorted(out.tolist()) == list(range(M * G * 5, M * G * 6))
            bins = out.reshape(-1, G // 4)
            assert all((np.diff(b) > 0).all() for b in bins)  # a bin's rows in position order
            assert np.array_equal(out, o.balance(M * G * 5, 4, M, mode))  # a pure function
    assert np.array_equal(o.balance(G, 4, 1, _core.BALANCE_NONE), np.arange(G, 2 * G))
    with pytest.raises(ValueError, match="does not divide"):
        o.balance(0, 3, 1, _core.BALANCE_ATTENTION)
    with pytest.raises(ValueError, match="multiple"):
        o.balance(G, 4, 2, _core.BALANCE_ATTENTION)


def imbalance(costs, bins):
    load = costs[bins].sum(1).astype(float)
    return load.max() / load.mean()


@pytest.mark.parametrize("mode", ["attention", "tokens"])
def test_busiest_rank_close_to_mean(ds, mode):
    """8 ranks x 4 rows: the busiest rank's cost, step after step."""
    g = 32
    o = tokenfeed.Loader(ds, seq_len=L, batch_size=g, packing="best_fit", output="numpy")._order
    code = MODES[mode]
    steps = 40
    before, after = [], []
    for s in range(steps):
        costs = o.row_costs(s * g, g, code)
        plain = np.arange(g).reshape(8, -1)
        bal = o.balance(s * g, 8, 1, code).reshape(8, -1) - s * g
        before.append(imbalance(costs, plain))
        after.append(imbalance(costs, bal))
    assert np.mean(after) <= np.mean(before), (np.mean(after), np.mean(before))
    assert max(a - b for a, b in zip(after, before)) <= 1e-12  # never worse than the plain slices
    assert np.mean(after) <= (1.05 if mode == "attention" else 1.02), (np.mean(after), np.mean(before))


def test_costs_follow_cu_seqlens(ds):
    l = loader(ds, 1, 0, cu_seqlens=True)
    b = next(l)
    o = l._order
    att, tok = o.row_costs(0, G, MODES["attention"]), o.row_costs(0, G, MODES["tokens"])
    for j in range(G):
        cu = b["cu_seqlens"][j][: int(np.ravel(b["num_seqs"][j])[0]) + 1].astype(np.int64)
        assert att[j] == int((np.diff(cu) ** 2).sum())
        assert tok[j] == int((b["tokens"][j][:L] != 0).sum())  # pad_id 0, documents use 1..4999


@pytest.mark.parametrize("M", [1, 3])
def test_resume_exact_at_every_step(ds, M):
    n = 7
    kw = dict(balance="attention", balance_micro_batches=M)
    for r in (0, 3):
        whole = take(loader(ds, 4, r, **kw), n)
        for k in range(n):
            l = loader(ds, 4, r, **kw)
            take(l, k)
            st = l.state_dict()
            l.close()
            l2 = loader(ds, 4, r, **kw)
            l2.load_state_dict(st)
            rest = take(l2, n - k)
            assert all(np.array_equal(a, b) for a, b in zip(rest, whole[k:])), (r, k)


@pytest.mark.parametrize("M", [1, 2])
def test_elastic_resume(ds, M):
    """A state saved on 8 ranks resumes on 1, 2 and 4: each new rank gets what an uninterrupted
    run on that many ranks gets, and every step holds the same rows."""
    k, n = 2 * M, 2 * M
    kw = dict(balance="attention", balance_micro_batches=M)
    saved = []
    for r in range(8):
        l = loader(ds, 8, r, **kw)
        take(l, k)
        saved.append(l.state_dict())
        l.close()
    assert len({s["position"] for s in saved}) == 1
    eight = ranks(ds, 8, n, start=k * G, **kw)
    for R in (1, 2, 4):
        got = []
        for r in range(R):
            l = loader(ds, R, r, **kw)
            l.load_state_dict(saved[0])
            got.append(take(l, n))
            l.close()
        assert all(np.array_equal(a, b) for g, w in zip(got, ranks(ds, R, n, start=k * G, **kw)) for a, b in zip(g, w))
        for s in range(n // M):
            step = range(s * M, (s + 1) * M)
            assert rows(g[i] for g in got for i in step) == rows(e[i] for e in eight for i in step)


def test_state_and_fingerprint_do_not_depend_on_balance(ds):
    a, b = loader(ds, 4, 1), loader(ds, 4, 1, balance="attention", balance_micro_batches=2)
    take(a, 2)
    take(b, 2)
    assert a.state_dict() == b.state_dict()
    b.load_state_dict(a.state_dict())  # accepted either way


def test_end_of_a_finite_stream_in_a_partial_step(ds):
    """The last step of a finite stream may hold fewer than M global batches: they are balanced
    among themselves, and the epoch is still delivered whole."""
    kw = dict(balance="attention", balance_micro_batches=4, epochs=1)
    R = 4
    plain, bal = [], []
    for r in range(R):
        plain += [x for b in loader(ds, R, r, epochs=1) for x in b["tokens"]]
        bal += [x for b in loader(ds, R, r, **kw) for x in b["tokens"]]
    assert sorted(map(bytes, plain)) == sorted(map(bytes, bal))


def test_context_parallel_ranks_share_the_balanced_rows(ds):
    kw = dict(balance="attention", seq_len=L)
    whole = take(loader(ds, 4, 2, **kw), 3)
    for cp in range(2):
        l = loader(ds, 4, 2, cp_rank=cp, cp_size=2, **kw)
        got = take(l, 3, "input_ids")
        c = L // 4
        for a, w in zip(got, whole):
            chunks = (cp, 3 - cp)
            want = np.concatenate([w[:, i * c:(i + 1) * c] for i in chunks], axis=1)
            assert np.array_equal(a, want)


def test_bad_settings_are_refused(ds):
    with pytest.raises(ValueError, match="balance"):
        loader(ds, 2, 0, balance="flops")
    with pytest.raises(ValueError, match="balance_micro_batches"):
        loader(ds, 2, 0, balance="attention", balance_micro_batches=0)
    with pytest.raises(TypeError):
        loader(ds, 2, 0, balance="attention", balance_micro_batches=1.5)


def test_remote_data_streams_the_same_balanced_rows(ds, moto, bucket, tmp_path):
    """From object storage the chunk scheduler reads ahead the rows the rank is given; the bytes
    are those of the local copy."""
    root = ds.paths[0]  # the dataset directory
    moto.upload_dir(bucket, "bal", root)
    url = f"s3://{bucket}/bal/"
    remote = tokenfeed.open(url, cache_dir=str(tmp_path / "cache"), endpoint_url=moto.endpoint, chunk_size=64 << 10)
    kw = dict(balance="attention", balance_micro_batches=2, shuffle="full", seed=3)
    for r in (0, 3):
        want = take(loader(ds, 4, r, **kw), 6)
        got = take(loader(remote, 4, r, **kw), 6)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_mixture_balanced_steps_and_per_source_counts(ds, make_dataset):
    """A mixture balances the same way; what each source delivered over all ranks is unchanged."""
    other = make_dataset(n_docs=400, vocab=5000, mean_len=100, seed=9)
    kw = dict(weights=[0.6, 0.4], seq_len=L)

    def run(**extra):
        out, per = [], []
        for r in range(4):
            l = tokenfeed.Loader([ds, other], batch_size=G // 4, rank=r, world_size=4, output="numpy", num_threads=1,
                                 packing="best_fit", pad_id=0, **kw, **extra)
            out.append(take(l, 4))
            per.append([s["samples"] for s in l.stats()["sources"]])
        return out, np.sum(per, axis=0)

    (plain, n0), (bal, n1) = run(), run(balance="attention")
    assert list(n0) == list(n1)
    for k in range(4):
        assert rows(p[k] for p in plain) == rows(b[k] for b in bal)


def test_benchmark_script_runs(tmp_path):
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "balance_bench.py"), "--seq-len", "256",
                        "--steps", "4", "--micro-batches", "1", "2", "--dists", "lognormal:4:1.5:2000",
                        "--json", str(out), "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert [r["micro_batches"] for r in res["results"]] == [1, 2]
    for r in res["results"]:
        assert r["attention"]["attention_imbalance_mean"] <= r["none"]["attention_imbalance_mean"] + 1e-9

"""Real DeviceMeshes over 4 processes (torchrun, gloo, CPU), given to the Loader as
device_mesh=: tensor-parallel peers receive identical batches, data-parallel ranks disjoint
slices that together are the one-process stream with the same global batch; the CP ranks of
a (dp=2, cp=2) mesh receive pieces that reassemble into the one-process samples, with
position ids, and with cu_seqlens the THD layout; a state saved at dp=4 resumes at
(dp=2, tp=2).

torchrun is started by the test on a free port of 127.0.0.1 (gloo on the loopback
interface) with a time limit; the ranks write what they received to files that the test
compares.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import tokenfeed

import cp_reference as ref

pytest.importorskip("torch.distributed")
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helper scripts are
NPROC, SEQ_LEN, G, STEPS = 4, 32, 8, 6


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(script: str, args: list, nproc: int, unset: tuple = (), timeout: int = 300) -> None:
    """Run tests/``script`` on ``nproc`` gloo ranks on 127.0.0.1 (a free port); fail with its output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1",
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") + tuple(unset):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           os.path.join(HERE, script)] + [str(a) for a in args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    root = tmp_path_factory.mktemp("mesh")
    data = root / "data"
    rng = np.random.default_rng(3)
    with tokenfeed.DatasetWriter(data, vocab_size=5000, shard_tokens=3000) as w:
        for n in np.maximum(1, rng.lognormal(np.log(40), 1.0, size=300).astype(int)):
            w.add_document(rng.integers(0, 5000, size=int(n)))
    out = root / "out"
    out.mkdir()
    torchrun("mesh_worker.py", [data, out, SEQ_LEN, G, STEPS], NPROC, unset=("TOKENFEED_BACKEND",), timeout=420)

    def load(name):
        files = [np.load(out / f"{name}.{r}.npz") for r in range(NPROC)]
        return [({k: f[k] for k in f.files if k != "meta"}, json.loads(str(f["meta"]))) for f in files]

    return tokenfeed.open(data), load


def one_process(ds, steps, start=0):
    """The same configuration in one process: rank 0 of 1 with the whole global batch."""
    l = tokenfeed.Loader(ds, seq_len=SEQ_LEN, batch_size=G, seed=7, rank=0, world_size=1, output="numpy",
                         num_threads=1, position_ids=True, loss_mask=True, cu_seqlens=True)
    if start:
        st = l.state_dict()
        st["position"] = start
        l.load_state_dict(st)
    out = [next(l) for _ in range(steps)]
    l.close()
    return {k: np.stack([b[k] for b in out]) for k in out[0]}


def test_dp2_tp2_tp_peers_identical_dp_disjoint_and_complete(run):
    ds, load = run
    ranks = load("dp2tp2")
    by_dp = {}
    for arrays, meta in ranks:
        assert meta["dp_size"] == 2 and meta["dp_rank"] == meta["coord"][0]
        by_dp.setdefault(meta["dp_rank"], []).append(arrays)
    assert sorted(by_dp) == [0, 1] and all(len(v) == 2 for v in by_dp.values())
    for peers in by_dp.values():   # the two tp ranks of a dp rank: identical batches, every array
        assert peers[0].keys() == peers[1].keys()
        for k in peers[0]:
            assert np.array_equal(peers[0][k], peers[1][k]), k
    whole = one_process(ds, STEPS)
    B = G // 2
    for k in ("tokens", "position_ids", "loss_mask"):
        got = np.concatenate([by_dp[0][0][k], by_dp[1][0][k]], axis=1)   # dp slices side by side, batch by batch
        assert np.array_equal(got, whole[k]), k
    # disjoint: no sample appears twice within a global batch (random tokens make collisions impossible)
    rows = whole["tokens"].reshape(-1, SEQ_LEN + 1)
    assert len({r.tobytes() for r in rows}) == len(rows)
    assert by_dp[0][0]["tokens"].shape == (STEPS, B, SEQ_LEN + 1)


def test_hsdp_dp_rank_is_devicemesh_flattening(run):
    _, load = run
    for _, meta in load("hsdp"):
        assert (meta["dp_rank"], meta["dp_size"]) == (meta["flat_rank"], meta["flat_size"])


def test_state_saved_at_dp4_resumes_at_dp2_tp2_on_the_same_stream(run):
    ds, load = run
    before, after = load("resume_before"), load("resume_after")
    whole = one_process(ds, 2 * STEPS)
    got_before = np.concatenate([before[r][0]["tokens"] for r in sorted(range(NPROC), key=lambda r: before[r][1]["dp_rank"])], axis=1)
    assert np.array_equal(got_before, whole["tokens"][:STEPS])
    assert after[0][1]["position"] == STEPS * G
    by_dp = {}
    for arrays, meta in after:
        by_dp.setdefault(meta["dp_rank"], []).append(arrays["tokens"])
    for peers in by_dp.values():
        assert np.array_equal(peers[0], peers[1])
    got_after = np.concatenate([by_dp[0][0], by_dp[1][0]], axis=1)
    assert np.array_equal(got_after, whole["tokens"][STEPS:])


def test_dp2_cp2_pieces_reassemble_into_the_samples(run):
    ds, load = run
    whole = one_process(ds, STEPS)
    B = G // 2
    groups = {}
    for arrays, meta in load("dp2cp2"):
        assert meta["cp_size"] == 2 and "tokens" not in arrays
        groups.setdefault(meta["dp_rank"], {})[meta["cp_rank"]] = arrays
    assert sorted(groups) == [0, 1] and all(sorted(g) == [0, 1] for g in groups.values())
    for d, g in groups.items():
        rows = slice(d * B, (d + 1) * B)
        for i in range(STEPS):
            for k, full in (("input_ids", whole["tokens"][i, rows, :-1]), ("labels", whole["tokens"][i, rows, 1:]),
                            ("position_ids", whole["position_ids"][i, rows]),
                            ("loss_mask", whole["loss_mask"][i, rows])):
                assert np.array_equal(ref.megatron_cp_unsplit([g[0][k][i], g[1][k][i]]), full), (d, i, k)
                assert np.array_equal(g[1][k][i], ref.megatron_cp_split(full, 2, 1)), (d, i, k)


def test_dp2_cp2_thd_layout(run):
    ds, load = run
    whole = one_process(ds, STEPS)
    B = G // 2
    for arrays, meta in load("dp2cp2_thd"):
        d, r = meta["dp_rank"], meta["cp_rank"]
        for i in range(STEPS):
            rows = slice(d * B, (d + 1) * B)
            batch = {k: whole[k][i, rows] for k in ("tokens", "cu_seqlens", "num_seqs", "loss_mask")}
            want = ref.thd_layout(batch, 2, r, pad_id=0)
            for k in ("input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens", "cu_seqlens_padded"):
                assert np.array_equal(arrays[f"{k}.{i}"], want[k]), (d, r, i, k)
            assert meta["ints"][i]["max_seqlen"] == int(want["max_seqlen"][0])

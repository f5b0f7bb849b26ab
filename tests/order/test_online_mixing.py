"""Live mixture weights: Loader.set_weights takes effect at the next batch, each source
continues from where it was, and the state (weights_history) resumes the same stream on the
same or another world size, through JSON and torch.distributed.checkpoint, also after the
process was killed with SIGKILL."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np
import pytest

import tokenfeed
from conftest import ROOT, kill_when_logged, numpy_loader, take_tokens

WORKER = os.path.join(ROOT, "tests", "online_mix_worker.py")


@pytest.fixture
def sources(make_dataset):
    """Three sources whose tokens say where they come from: [0, 500), [700, 1200), [1400, 1900)."""
    rng = np.random.default_rng(0)
    out = []
    for i, cnt in enumerate((150, 300, 200)):
        lens = np.maximum(1, rng.lognormal(np.log(30), 1.0, size=cnt).astype(int))
        out.append(make_dataset(docs=[rng.integers(700 * i, 700 * i + 500, n) for n in lens], vocab=2000,
                                shard_tokens=5000))
    return out


def source_of(rows: np.ndarray) -> np.ndarray:
    return rows[:, 0] // 700


BASE: Dict[str, Any] = dict(seq_len=10, batch_size=4, seed=3, mix_window=20, source_ids=True)


def per_source(rows: np.ndarray, k: int) -> List[np.ndarray]:
    s = source_of(rows)
    return [rows[s == i] for i in range(k)]


def test_set_weights_applies_at_the_next_batch_and_keeps_each_source_cursor(sources):
    whole = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    uninterrupted = np.concatenate(take_tokens(whole, 60))
    ld = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    before = [next(ld) for _ in range(5)]
    ld.set_weights([0.0, 0.25, 0.75])
    after = [next(ld) for _ in range(40)]
    assert ld.weights == [0.0, 0.25, 0.75]
    for b in before + after:  # source_ids: one per row, the source the row was cut from
        assert b["source_ids"].dtype == np.int32 and np.array_equal(b["source_ids"], source_of(b["tokens"]))
    src_after = np.concatenate([b["source_ids"] for b in after])
    assert not (src_after == 0).any()  # from the very next batch
    assert abs((src_after == 2).mean() - 0.75) < 0.05
    # within each source, the samples delivered are a prefix of that source's own stream
    got = per_source(np.concatenate([b["tokens"] for b in before + after]), 3)
    want = per_source(uninterrupted, 3)
    more = per_source(np.concatenate(take_tokens(numpy_loader(sources, weights=[0.2, 0.2, 0.6], **BASE), 200)), 3)
    for s in range(3):
        ref = want[s] if len(want[s]) >= len(got[s]) else more[s]
        assert len(ref) >= len(got[s]) and np.array_equal(got[s], ref[:len(got[s])]), s
    st = ld.state_dict()
    assert st["weights_history"] == [[20, [0.0, 0.25, 0.75]]] and st["mix_anchor"][0] == 20


def test_weights_history_grows_with_changes_not_with_calls(sources, monkeypatch):
    import tokenfeed.engine._loader as loader_mod

    ld = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    take_tokens(ld, 3)
    ld.set_weights([0.2, 0.3, 0.5])
    one = ld.state_dict()
    # 3,000 calls at one position: only the last took effect, and the state says just that
    for i in range(3000):
        ld.set_weights([0.1 + (i % 7) / 10, 0.3, 0.5])
    ld.set_weights([0.2, 0.3, 0.5])
    many = ld.state_dict()
    assert many["weights_history"] == one["weights_history"] == [[12, [0.2, 0.3, 0.5]]]
    assert len(json.dumps(many)) == len(json.dumps(one)) and many == one
    # the same stream as after the one call, and so on resume
    ref = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    take_tokens(ref, 3)
    ref.set_weights([0.2, 0.3, 0.5])
    assert all(np.array_equal(a, b) for a, b in zip(take_tokens(ld, 5), take_tokens(ref, 5)))
    # changes at distinct positions: one entry each, oldest first
    for k in range(40):
        ld.set_weights([0.2 + k / 100, 0.3, 0.5])
        next(ld)
    hist = ld.state_dict()["weights_history"]
    assert len(hist) == 41 and [p for p, _ in hist] == [12] + [32 + 4 * k for k in range(40)]
    # a call neither writes nor reads back a state, whatever the history holds: counted
    calls = {"dumps": 0, "loads": 0}

    class Counting:
        def __getattr__(self, name: str) -> Any:
            if name in calls:
                calls[name] += 1
            return getattr(json, name)

    monkeypatch.setattr(loader_mod, "json", Counting())
    for k in range(100):
        ld.set_weights([0.5, 0.3 + k / 1000, 0.2])
    assert calls == {"dumps": 0, "loads": 0}
    monkeypatch.undo()
    resumed = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    resumed.load_state_dict(json.loads(json.dumps(ld.state_dict())))
    assert resumed.state_dict()["weights_history"] == ld.state_dict()["weights_history"]
    assert len(resumed.state_dict()["weights_history"]) == 42
    assert all(np.array_equal(a, b) for a, b in zip(take_tokens(ld, 5), take_tokens(resumed, 5)))


def test_repeated_changes_resume_on_another_world_size(sources):
    """Four ranks change the weights twice; rank 0's state resumes on two ranks (and on four)
    with exactly the global batches the four would have delivered."""
    def ranks(n: int) -> List[tokenfeed.Loader]:
        return [numpy_loader(sources, weights=[0.5, 0.3, 0.2], **{**BASE, "batch_size": 8 // n},
                             dp_rank=r, dp_size=n) for r in range(n)]

    def step(lds: List[tokenfeed.Loader]) -> np.ndarray:
        return np.concatenate([next(ld)["tokens"] for ld in lds])

    four = ranks(4)
    for i in range(9):
        if i in (3, 6):
            for ld in four:
                ld.set_weights([0.1, 0.1, 0.8] if i == 3 else [0.6, 0.4, 0.0])
        step(four)
    state = json.loads(json.dumps(four[0].state_dict()))
    assert [p for p, _ in state["weights_history"]] == [24, 48]
    want = [step(four) for _ in range(10)]
    for n in (2, 4):
        lds = ranks(n)
        for ld in lds:
            ld.load_state_dict(state)
        assert lds[0].weights == [0.6, 0.4, 0.0]
        got = [step(lds) for _ in range(10)]
        assert all(np.array_equal(x, y) for x, y in zip(want, got)), n
        assert lds[0].state_dict()["weights_history"] == state["weights_history"]


def test_set_weights_refuses_what_it_cannot_do(sources):
    ld = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    with pytest.raises(ValueError, match="3 sources, 2 weights"):
        ld.set_weights([0.5, 0.5])
    with pytest.raises(ValueError):
        ld.set_weights([0.0, 0.0, 0.0])
    one = numpy_loader(sources[0], seq_len=10, batch_size=4)
    with pytest.raises(ValueError, match="needs a mixture"):
        one.set_weights([1.0])
    with pytest.raises(ValueError, match="source_ids=True needs a mixture"):
        numpy_loader(sources[0], seq_len=10, batch_size=4, source_ids=True)


def test_a_pickled_loader_keeps_its_live_weights(sources):
    import pickle

    ld = numpy_loader(sources, weights=[0.5, 0.3, 0.2], **BASE)
    take_tokens(ld, 3)
    ld.set_weights([0.2, 0.2, 0.6])
    take_tokens(ld, 2)
    copy = pickle.loads(pickle.dumps(ld))
    assert copy.state_dict() == ld.state_dict()
    assert all(np.array_equal(x, y) for x, y in zip(take_tokens(ld, 5), take_tokens(copy, 5)))


def write_sources(root: Any) -> List[str]:
    rng = np.random.default_rng(1)
    paths = []
    for i, n in enumerate((200, 300, 250)):
        p = os.path.join(str(root), f"src{i}")
        with tokenfeed.DatasetWriter(p, vocab_size=4000) as w:
            for _ in range(n):
                w.add_document(rng.integers(1000 * i, 1000 * i + 900, size=int(rng.integers(1, 50))))
        paths.append(p)
    return paths


def run_worker(out: Any, data: List[str], ranks: int, ckpt: str, sleep: float = 0.0) -> "subprocess.Popen[bytes]":
    return subprocess.Popen([sys.executable, WORKER, "--data", *data, "--out", str(out), "--ranks", str(ranks),
                             "--ckpt", ckpt, "--sleep", str(sleep)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def log_of(out: Any) -> Dict[int, str]:
    """The last hash logged for each step (steps after the checkpoint are logged again on resume)."""
    got: Dict[int, str] = {}
    with open(os.path.join(str(out), "log.jsonl")) as f:
        for line in f:
            if line.endswith("\n"):
                e = json.loads(line)
                got[e["step"]] = e["hash"]
    return got


@pytest.mark.parametrize("ckpt,resume_ranks", [("json", 4), ("json", 2), ("dcp", 4), ("dcp", 2)])
def test_sigkill_after_set_weights_resumes_the_same_stream(tmp_path, ckpt, resume_ranks):
    if ckpt == "dcp":
        pytest.importorskip("torch")
    data = write_sources(tmp_path)
    ref = run_worker(tmp_path / "ref", data, 4, ckpt)
    out, err = ref.communicate(timeout=600)
    assert ref.returncode == 0, err.decode()
    want = log_of(tmp_path / "ref")
    assert sorted(want) == list(range(96))
    killed = tmp_path / "killed"
    p = run_worker(killed, data, 4, ckpt, sleep=0.02)
    kill_when_logged(p, killed / "log.jsonl", 30)
    assert 30 <= len(log_of(killed)) < 96
    r = run_worker(killed, data, resume_ranks, ckpt)
    out, err = r.communicate(timeout=600)
    assert r.returncode == 0, err.decode()
    assert b"resumed at step" in out
    assert log_of(killed) == want  # every step, before and after the kill, as the uninterrupted run

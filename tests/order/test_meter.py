"""The data-wait meter: against a consumer that works a known time per step and an engine
slowed by a known amount, the fraction of wall time reported waiting matches the truth
(bounds wide enough for a loaded machine: the truths are far apart), and meter_all_ranks
names the slow rank over a gloo process group."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import tokenfeed
from conftest import numpy_loader
from test_device import cuda_double  # noqa: F401  (the fixture)


@pytest.fixture
def ds(make_dataset):
    return make_dataset(n_docs=200, vocab=500, seed=1, mean_len=40)


def consume(loader, steps, work_s):
    for _ in range(steps):
        next(loader)
        if work_s:
            time.sleep(work_s)


def test_fast_engine_busy_consumer_waits_nothing(ds):
    l = numpy_loader(ds, seq_len=32, batch_size=2, num_threads=1)
    consume(l, 14, 0.03)
    m = l.meter(10)
    assert m["batches"] == 10 and m["total_batches"] == 14
    # truth: ~0 % (every batch is assembled while the consumer works)
    assert m["wait_fraction"] < 0.25, m
    assert m["window_seconds"] >= 10 * 0.03
    assert m["ready_ahead_mean"] >= 0.5
    assert tokenfeed.meter_verdict(m).startswith("data is not the bottleneck") or m["wait_fraction"] >= 0.02


def slowed(ds, monkeypatch, delay_ms, work_s):
    """The meter over the last 6 of 8 batches of an engine slowed by ``delay_ms`` per batch,
    consumed by a loop that works ``work_s`` per step."""
    monkeypatch.setenv("TOKENFEED_FAULT_DELAY_MS", str(delay_ms))
    l = numpy_loader(ds, seq_len=32, batch_size=2, num_threads=1, prefetch=1)
    consume(l, 8, work_s)
    return l.meter(6)


@pytest.mark.test_hooks
def test_slow_engine_idle_consumer_waits_all(ds, monkeypatch):
    m = slowed(ds, monkeypatch, 60, 0.0)
    # truth: ~100 % (the consumer does nothing but wait for 60 ms batches)
    assert m["wait_fraction"] > 0.75, m
    assert m["wait_p50_seconds"] >= 0.05 and m["wait_p99_seconds"] >= m["wait_p50_seconds"]
    assert m["ready_ahead_min"] == 0
    v = tokenfeed.meter_verdict(m, rank=3)
    assert v.startswith("rank 3 waits") and "num_threads" in v


@pytest.mark.test_hooks
def test_half_and_half(ds, monkeypatch):
    """Engine 160 ms per batch, consumer 80 ms per step: the consumer waits about half of its time."""
    m = slowed(ds, monkeypatch, 160, 0.08)
    assert 0.2 < m["wait_fraction"] < 0.8, m
    assert abs(m["wait_percent"] - 100 * m["wait_fraction"]) < 1e-9


def test_meter_dict_is_flat_numbers(ds):
    l = numpy_loader(ds, seq_len=32, batch_size=2)
    assert l.meter()["batches"] == 0
    assert tokenfeed.meter_verdict(l.meter()).startswith("no batch")
    consume(l, 3, 0)
    m = l.meter(prefix="data/")
    assert m and all(k.startswith("data/") and isinstance(v, (int, float)) and not isinstance(v, bool)
                     for k, v in m.items())
    with pytest.raises(ValueError):
        l.meter(-1)
    # a seek does not disturb the meter; a resumed loader starts its own
    l.load_state_dict(l.state_dict())
    consume(l, 2, 0)
    assert l.meter()["total_batches"] == 5


@pytest.mark.test_hooks
def test_the_first_batch_is_start_up_reported_apart(ds, monkeypatch):
    """The first batch waits for the engine to start: the meter reports that wait as
    startup_seconds and judges the steady state without it, so a short window does not flip
    its verdict on whether it still holds the first batch. Counts, not timings: the window
    holds every batch but the first, and its waits are the later batches' own."""
    monkeypatch.setenv("TOKENFEED_FAULT_DELAY_MS", "50")  # every batch takes its time: none is instant
    l = numpy_loader(ds, seq_len=32, batch_size=2, num_threads=1, prefetch=1)
    assert l.meter()["startup_seconds"] == 0.0
    consume(l, 1, 0)
    m = l.meter()
    assert m["batches"] == 0 and m["total_batches"] == 1 and m["startup_seconds"] > 0, m
    assert tokenfeed.meter_verdict(m).startswith("only the first batch"), tokenfeed.meter_verdict(m)
    consume(l, 5, 0)
    m = l.meter()
    assert m["batches"] == 5 and m["total_batches"] == 6, m
    assert m["startup_seconds"] == l.meter(1)["startup_seconds"] and l.meter(1)["batches"] == 1
    assert "start-up" in tokenfeed.meter_verdict(m), tokenfeed.meter_verdict(m)


def test_meter_all_ranks_without_a_process_group_says_what_to_do(ds):
    """Outside a torch.distributed job the error says what meter_all_ranks needs and what to use
    instead, not torch's own error about a default process group."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    l = numpy_loader(ds, seq_len=32, batch_size=2)
    consume(l, 2, 0)
    with pytest.raises(RuntimeError) as ei:
        tokenfeed.meter_all_ranks(l)
    msg = str(ei.value)
    assert "meter_all_ranks" in msg and "init_process_group" in msg and "meter()" in msg, msg


@pytest.mark.test_hooks
def test_meter_all_ranks_names_the_slow_rank(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    from test_mesh_torchrun import torchrun

    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    with tokenfeed.DatasetWriter(data, vocab_size=500) as w:
        for _ in range(200):
            w.add_document(rng.integers(0, 500, size=int(rng.integers(1, 80))))
    out = tmp_path / "out"
    out.mkdir()
    torchrun("meter_worker.py", [data, out], 2, unset=("TOKENFEED_FAULT_DELAY_MS",))
    reports = [json.loads((out / f"meter.{r}.json").read_text()) for r in range(2)]
    assert reports[0] == reports[1]
    rep = reports[0]
    assert rep["slowest_rank"] == 1
    assert rep["ranks"][0]["wait_fraction"] < 0.35 < 0.45 < rep["ranks"][1]["wait_fraction"], rep
    assert rep["wait_fraction_max"] == rep["ranks"][1]["wait_fraction"]
    assert rep["verdict"].startswith("rank 1 waits"), rep["verdict"]


@pytest.mark.test_hooks
def test_device_meter_through_the_cuda_double(cuda_double, tmp_path):
    """With device="cuda" the meter times the consumer's wait in the device stage's next():
    a slow engine and an idle consumer wait nearly all the time; a busy consumer hardly."""
    from test_device import run_py

    r = run_py("""
        import json
        ds = make_dataset(os.path.join(os.environ["TF_TMP"], "ds"))
        out = {}
        for delay, work in ((60, 0.0), (0, 0.03)):
            os.environ["TOKENFEED_FAULT_DELAY_MS"] = str(delay)
            l = tokenfeed.Loader(ds, seq_len=32, batch_size=2, device="cuda", output="numpy", num_threads=1,
                                 prefetch=1)
            for _ in range(8):
                b = next(l)
                del b
                time.sleep(work)
            out[str(delay)] = l.meter(6)
            l.close()
        print(json.dumps(out))
    """, tmp_path, env={"TOKENFEED_CUDART": cuda_double})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["60"]["wait_fraction"] > 0.75, out
    assert out["0"]["wait_fraction"] < 0.25, out
    assert out["0"]["batches"] == 6 and out["0"]["prefetch"] >= 1
